#!/bin/sh
# Data-parallel benchmarks, each figure from its own run in this one invocation:
#   * GPT-2 small at global batch 8 x 256: tokens/s of 1 process x 2 threads against 2 processes
#     x 1 thread (mpirun), the ratio being the data-parallel efficiency on this machine;
#   * the share of the step spent waiting on communication with and without overlap
#     (trainer.overlap_grad_reduce);
#   * optimizer-state bytes per rank at N = 1, 2, 4 with and without trainer.shard_optimizer_state;
#   * the measured all-reduce bandwidth, for the scaling model in docs/distributed.md.
# Steady-state figures leave out the first two steps.
#
#   benchmarks/distributed/run.sh [BUILD_DIR] [STEPS]
# Run from the repository root, with OpenMPI (mpirun) installed. As root it sets
# OMPI_ALLOW_RUN_AS_ROOT itself.
set -e
build=${1:-build}
steps=${2:-6}
loom="$build/bin/loom"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
config="benchmarks/train/gpt2-small-synthetic.yaml model.seq_len=256 trainer.train_batch_size=8 trainer.num_train_steps=$steps trainer.peak_flops=1e11"

steady() {  # metrics.jsonl -> "tokens/s communication-share"
  python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "throughput/tokens_per_second" in r and r["step"] > 2]
tps = sum(r["throughput/tokens_per_second"] for r in rows) / len(rows)
share = [r["throughput/communication_share"] for r in rows if "throughput/communication_share" in r]
print("%.1f %s" % (tps, "%.3f" % (sum(share) / len(share)) if share else "-"))
PY
}
state_mib() {  # a run's log -> optimizer state MiB per rank
  sed -n 's/.*optimizer state \([0-9.]*\) MiB per rank.*/\1/p' "$1" | head -1
}

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores)"
LOOM_NUM_THREADS=2 "$loom" train $config trainer.run_dir="$out/one" >"$out/one.log" 2>&1 || { cat "$out/one.log"; exit 1; }
set -- $(steady "$out/one/metrics.jsonl"); one=$1
LOOM_NUM_THREADS=1 mpirun -np 2 "$loom" train $config trainer.run_dir="$out/two" >"$out/two.log" 2>&1 || { cat "$out/two.log"; exit 1; }
set -- $(steady "$out/two/metrics.jsonl"); two=$1; share_overlap=$2
LOOM_NUM_THREADS=1 mpirun -np 2 "$loom" train $config trainer.overlap_grad_reduce=false trainer.run_dir="$out/two-seq" >"$out/two-seq.log" 2>&1 || { cat "$out/two-seq.log"; exit 1; }
set -- $(steady "$out/two-seq/metrics.jsonl"); two_seq=$1; share_seq=$2
printf 'gpt2-small, global batch 8 x 256\n'
printf '  1 process x 2 threads             %8.1f tokens/s\n' "$one"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
printf '  2 processes x 1 thread (overlap)  %8.1f tokens/s   efficiency %s   waiting on communication %s of the step\n' \
  "$two" "$(ratio "$two" "$one")" "$share_overlap"
printf '  2 processes x 1 thread (after)    %8.1f tokens/s   efficiency %s   waiting on communication %s of the step\n' \
  "$two_seq" "$(ratio "$two_seq" "$one")" "$share_seq"
# The all-reduce without overlap moves 2 (N-1)/N of the gradient bytes per rank in the time it waits.
awk -v tps="$two_seq" -v share="$share_seq" 'BEGIN {
  step = 8 * 256 / tps; wait = share * step; bytes = 124439808 * 4;
  printf "  all-reduce of %.0f MB of gradients: %.3f s, bus bandwidth %.2f GB/s\n", bytes / 1e6, wait, bytes / wait / 1e9 }'

printf 'optimizer state per rank (AdamW, gpt2-small)\n'
for n in 2 4; do
  for shard in false true; do
    LOOM_NUM_THREADS=1 mpirun -np $n "$loom" train $config trainer.num_train_steps=1 trainer.train_batch_size=$n \
      model.seq_len=64 trainer.shard_optimizer_state=$shard trainer.run_dir="$out/state-$n-$shard" >"$out/state.log" 2>&1 \
      || { cat "$out/state.log"; exit 1; }
    printf '  N=%d sharded=%-5s %8s MiB\n' $n $shard "$(state_mib "$out/state.log")"
  done
done
