#!/bin/sh
# Fully sharded data parallelism against data parallelism on 2 ranks, each figure from its own run
# in this one invocation (docs/distributed.md, "Measured"):
#   * tokens/s of fsdp 2 against data 2 (the ratio; the issue aims at >= 0.85), for GPT-2 small and
#     a ~124M Llama (benchmarks/train/llama-124m-synthetic.yaml), global batch 8 x 256;
#   * the share of the step waiting on communication with and without prefetch
#     (trainer.fsdp.prefetch), and the bytes each rank's gathers and reductions move per step;
#   * the peak resident memory per rank (/usr/bin/time) of data 2, ZeRO-1, fsdp 2 and fsdp 2
#     without resharding, against the start-up estimate each run printed.
# Steady-state figures leave out the first two steps.
#
#   benchmarks/distributed/fsdp.sh [BUILD_DIR] [STEPS]
# Run from the repository root, with OpenMPI (mpirun) and GNU time (/usr/bin/time) installed.
set -e
build=${1:-build}
steps=${2:-6}
loom="$build/bin/loom"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
[ -x /usr/bin/time ] || { echo "fsdp.sh needs GNU time (/usr/bin/time; Debian: apt-get install time)" >&2; exit 2; }
common="model.seq_len=256 trainer.train_batch_size=8 trainer.num_train_steps=$steps trainer.peak_flops=1e11 trainer.checkpoint.save_every_minutes=0 trainer.max_eval_batches=0"

steady() {  # metrics.jsonl -> "tokens/s communication-share bytes-per-step"
  python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "throughput/tokens_per_second" in r and r["step"] > 2]
mean = lambda k: sum(r[k] for r in rows) / len(rows) if rows and k in rows[0] else float("nan")
print("%.1f %.3f %.0f" % (mean("throughput/tokens_per_second"), mean("throughput/communication_share"),
                          mean("throughput/fsdp_bytes_per_step") / 2**20))
PY
}
run() {  # NAME CONFIG OVERRIDES... -> runs 2 ranks, prints "tokens/s share MiB/step peak-per-rank estimate"
  name=$1; config=$2; shift 2
  LOOM_NUM_THREADS=1 mpirun -np 2 /usr/bin/time -f "peak_kib %M" "$loom" train "$config" $common "$@" \
    trainer.run_dir="$out/$name" >"$out/$name.log" 2>&1 || { cat "$out/$name.log"; exit 1; }
  peaks=$(sed -n 's/^peak_kib \([0-9]*\)$/\1/p' "$out/$name.log" | awk '{ printf "%s%d", (NR > 1 ? "," : ""), ($1 + 512) / 1024 }')
  estimate=$(sed -n 's/^memory estimate per rank: \([0-9.]* [KMG]i*B\).*/\1/p' "$out/$name.log" | head -1 | tr -d ' ')
  echo "$(steady "$out/$name/metrics.jsonl") $peaks $estimate"
}

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores)"
for model in gpt2-small llama-124m; do
  config="benchmarks/train/$model-synthetic.yaml"
  echo "$model, AdamW, global batch 8 x 256, 2 ranks ($steps steps; tokens/s, waiting share, MiB moved per step per rank, peak MiB per rank, estimate)"
  set -- $(run "$model-data2" "$config"); d_tps=$1
  printf '  data 2                    %8.1f tokens/s  wait %s                 peak %s  estimate %s\n' "$1" "$2" "$4" "$5"
  set -- $(run "$model-zero1" "$config" trainer.shard_optimizer_state=true)
  printf '  data 2, ZeRO-1            %8.1f tokens/s  wait %s                 peak %s  estimate %s\n' "$1" "$2" "$4" "$5"
  set -- $(run "$model-fsdp2" "$config" trainer.mesh.fsdp=2); f_tps=$1
  printf '  fsdp 2                    %8.1f tokens/s  wait %s  %6s MiB/step  peak %s  estimate %s   fsdp/data %s\n' \
    "$1" "$2" "$3" "$4" "$5" "$(awk -v a="$f_tps" -v b="$d_tps" 'BEGIN { printf "%.2f", a / b }')"
  set -- $(run "$model-fsdp2-noprefetch" "$config" trainer.mesh.fsdp=2 trainer.fsdp.prefetch=false)
  printf '  fsdp 2, no prefetch       %8.1f tokens/s  wait %s  %6s MiB/step  peak %s  estimate %s\n' "$1" "$2" "$3" "$4" "$5"
  set -- $(run "$model-fsdp2-keep" "$config" trainer.mesh.fsdp=2 trainer.fsdp.reshard_after_forward=false)
  printf '  fsdp 2, no resharding     %8.1f tokens/s  wait %s  %6s MiB/step  peak %s  estimate %s\n' "$1" "$2" "$3" "$4" "$5"
done
