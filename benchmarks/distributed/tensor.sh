#!/bin/sh
# Tensor parallelism on this machine (docs/distributed.md, "Tensor parallelism: measured"), each
# figure from its own run in this one invocation:
#   * tokens/s of tensor 2 against data 2 and fsdp 2 for a ~124M Llama
#     (benchmarks/train/llama-124m-synthetic.yaml), global batch 8 x 256, AdamW; steady state
#     (the first two steps left out);
#   * the bytes the tensor group's collectives move per step (throughput/tensor_bytes_per_step)
#     against Megatron's count: per layer 4 all-reduces of B x T x C floats (2 forward, 2
#     backward), plus the embedding's forward all-reduce and the output layer's backward one,
#     B x T x C each, and the loss's 20 bytes per token (a float maximum, two double sums);
#   * a mixture of experts (Mixtral's blocks, 8 experts, top 2) at tensor 2, each rank holding 4
#     whole experts (expert parallelism), against data 2;
#   * the peak resident memory per rank (/usr/bin/time) of Llama 1B's shapes (configs/llama-1b.yaml,
#     LLAMA1B_LAYERS layers, default 4, sequence 256, micro-batch 1) at tensor 1, 2 and 4, 2 steps,
#     against the start-up estimate; the weights per rank from the run's header. Without the final
#     save (trainer.save_final: false), whose whole weights rank 0 alone holds while it writes them.
#
#   benchmarks/distributed/tensor.sh [BUILD_DIR] [STEPS]      (TENSOR_SECTIONS="dense moe memory")
# Run from the repository root, with OpenMPI (mpirun) and GNU time (/usr/bin/time) installed.
set -e
build=${1:-build}
steps=${2:-6}
layers=${LLAMA1B_LAYERS:-4}
loom="$build/bin/loom"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
[ -x /usr/bin/time ] || { echo "tensor.sh needs GNU time (/usr/bin/time; Debian: apt-get install time)" >&2; exit 2; }
common="model.seq_len=256 trainer.train_batch_size=8 trainer.peak_flops=1e11 trainer.checkpoint.save_every_minutes=0 trainer.max_eval_batches=0 trainer.steps_per_eval=0 trainer.sample_length=0"

steady() {  # metrics.jsonl -> "tokens/s communication-share tensor-MiB-per-step"
  python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "throughput/tokens_per_second" in r and r["step"] > 2]
mean = lambda k: sum(r[k] for r in rows) / len(rows) if rows and k in rows[0] else float("nan")
print("%.1f %.3f %.2f" % (mean("throughput/tokens_per_second"), mean("throughput/communication_share"),
                          mean("throughput/tensor_bytes_per_step") / 2**20))
PY
}
run() {  # RANKS NAME CONFIG OVERRIDES... -> "tokens/s share MiB/step peaks estimate"
  ranks=$1; name=$2; config=$3; shift 3
  if [ "$ranks" = 1 ]; then launch=""; else launch="mpirun -np $ranks"; fi
  LOOM_NUM_THREADS=1 $launch /usr/bin/time -f "peak_kib %M" "$loom" train "$config" $common "$@" \
    trainer.run_dir="$out/$name" >"$out/$name.log" 2>&1 || { cat "$out/$name.log"; exit 1; }
  # (mpirun interleaves the ranks' lines: the figure is found anywhere in a line.)
  peaks=$(grep -o 'peak_kib [0-9]*' "$out/$name.log" | awk '{ printf "%s%d", (NR > 1 ? "," : ""), ($2 + 512) / 1024 }')
  estimate=$(sed -n 's/^memory estimate per rank: \([0-9.]* [KMG]i*B\).*/\1/p' "$out/$name.log" | head -1 | tr -d ' ')
  echo "$(steady "$out/$name/metrics.jsonl") $peaks $estimate"
}

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores)"
# TENSOR_SECTIONS picks the parts (default: all): dense moe memory.
sections=${TENSOR_SECTIONS:-"dense moe memory"}
case " $sections " in *" dense "*)
config=benchmarks/train/llama-124m-synthetic.yaml
echo "llama-124m, AdamW, global batch 8 x 256, 2 ranks, $steps steps (tokens/s, waiting share, tensor MiB per step per rank, peak MiB per rank, estimate)"
set -- $(run 2 data2 "$config" trainer.num_train_steps=$steps); d=$1
printf '  data 2     %8.1f tokens/s  wait %s                 peak %s  estimate %s\n' "$1" "$2" "$4" "$5"
set -- $(run 2 fsdp2 "$config" trainer.num_train_steps=$steps trainer.mesh.fsdp=2); f=$1
printf '  fsdp 2     %8.1f tokens/s  wait %s                 peak %s  estimate %s\n' "$1" "$2" "$4" "$5"
set -- $(run 2 tensor2 "$config" trainer.num_train_steps=$steps trainer.mesh.tensor=2); t=$1; mib=$3
printf '  tensor 2   %8.1f tokens/s  wait %s  %6s MiB/step  peak %s  estimate %s\n' "$1" "$2" "$3" "$4" "$5"
awk -v t="$t" -v d="$d" -v f="$f" 'BEGIN { printf "  tensor 2 / data 2 = %.2f, tensor 2 / fsdp 2 = %.2f\n", t / d, t / f }'
# Megatron's count for this shape: 12 layers, B x T = 8 x 256 tokens, C = 768.
awk -v mib="$mib" 'BEGIN { bt = 8 * 256; c = 768; per = 4 * bt * c * 4;
  printf "  formula: 12 layers x 4 x B T C x 4 bytes = %.2f MiB, + embedding and head 2 x B T C = %.2f MiB, + loss 20 bytes per token = %.2f MiB: %.2f MiB; measured %s MiB\n",
    12 * per / 2^20, 2 * bt * c * 4 / 2^20, 20 * bt / 2^20, (12 * per + 2 * bt * c * 4 + 20 * bt) / 2^20, mib }'

;; esac

case " $sections " in *" moe "*)
# Expert parallelism: a mixture of 8 experts (top 2) of a 512-wide Mixtral, each rank of tensor 2
# holding 4 whole experts, against data 2 (every rank all 8).
moe="model.hidden_dim=512 model.intermediate_dim=1024 model.num_layers=4 model.num_heads=8 model.num_kv_heads=4 data.type=synthetic"
echo "mixtral, 8 experts of 512 x 1024, top 2, 4 layers, AdamW, global batch 8 x 256, 2 ranks, $steps steps"
set -- $(run 2 moe-data2 configs/mixtral-tiny.yaml $moe trainer.num_train_steps=$steps); md=$1
printf '  data 2     %8.1f tokens/s  wait %s                 peak %s  estimate %s\n' "$1" "$2" "$4" "$5"
set -- $(run 2 moe-tensor2 configs/mixtral-tiny.yaml $moe trainer.num_train_steps=$steps trainer.mesh.tensor=2); mt=$1
printf '  tensor 2   %8.1f tokens/s  wait %s  %6s MiB/step  peak %s  estimate %s\n' "$1" "$2" "$3" "$4" "$5"
awk -v t="$mt" -v d="$md" 'BEGIN { printf "  tensor 2 (4 experts per rank) / data 2 = %.2f\n", t / d }'

;; esac

case " $sections " in *" memory "*)
echo "llama-1b shapes ($layers layers), AdamW, micro-batch 1 x 256, 2 steps: peak resident MiB per rank, estimate"
for t in 1 2 4; do
  set -- $(run $t "llama1b-tensor$t" configs/llama-1b.yaml model.num_layers=$layers model.seq_len=256 \
    trainer.train_batch_size=1 trainer.microbatch_size=1 trainer.num_train_steps=2 trainer.mesh.tensor=$t \
    data.type=synthetic trainer.memory_check=off trainer.save_final=false)
  weights=$(sed -n 's/.*tensor [0-9]*: .*, \([0-9.]*%\) of the weights on each rank.*/\1/p' "$out/llama1b-tensor$t.log" | head -1)
  printf '  tensor %s  peak %s MiB  estimate %s  weights per rank %s\n' "$t" "$4" "$5" "${weights:-100%}"
done
;; esac
