#!/bin/sh
# Peak resident memory per rank of a data-parallel run, with and without ZeRO-1
# (trainer.shard_optimizer_state), each figure from its own run in this one invocation:
# GPT-2 small at global batch 8 x 256 with AdamW, N = 2 and 4 ranks, 2 steps. Each rank's peak
# comes from /usr/bin/time (maximum resident set size); the optimizer state per rank from the
# run's header. Sharding should lower each rank's peak by about the state it no longer holds.
#
#   benchmarks/distributed/memory.sh [BUILD_DIR] [STEPS]
# Run from the repository root, with OpenMPI (mpirun) and GNU time (/usr/bin/time) installed.
set -e
build=${1:-build}
steps=${2:-2}
loom="$build/bin/loom"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
[ -x /usr/bin/time ] || { echo "memory.sh needs GNU time (/usr/bin/time; Debian: apt-get install time)" >&2; exit 2; }
config="benchmarks/train/gpt2-small-synthetic.yaml model.seq_len=256 trainer.train_batch_size=8 trainer.num_train_steps=$steps trainer.peak_flops=1e11"

echo "CPU: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores)"
echo "gpt2-small, AdamW, global batch 8 x 256, $steps steps: peak resident memory per rank (MiB)"
for n in 2 4; do
  for shard in false true; do
    LOOM_NUM_THREADS=1 mpirun -np $n /usr/bin/time -f "peak_kib %M" "$loom" train $config \
      trainer.shard_optimizer_state=$shard trainer.run_dir="$out/run-$n-$shard" >"$out/log-$n-$shard" 2>&1 \
      || { cat "$out/log-$n-$shard"; exit 1; }
    peaks=$(sed -n 's/^peak_kib \([0-9]*\)$/\1/p' "$out/log-$n-$shard" | awk '{ printf "%s%d", (NR > 1 ? " " : ""), ($1 + 512) / 1024 }')
    state=$(sed -n 's/.*optimizer state \([0-9.]*\) MiB per rank.*/\1/p' "$out/log-$n-$shard" | head -1)
    largest=$(echo "$peaks" | tr ' ' '\n' | sort -n | tail -1)
    eval "largest_${n}_$shard=$largest state_${n}_$shard=$state"
    printf '  N=%d sharded=%-5s  optimizer state %7s MiB   peak per rank: %s\n' $n $shard "$state" "$peaks"
  done
  eval "a=\$largest_${n}_false b=\$largest_${n}_true sa=\$state_${n}_false sb=\$state_${n}_true"
  awk -v n=$n -v a="$a" -v b="$b" -v sa="$sa" -v sb="$sb" 'BEGIN {
    printf "  N=%d: largest peak %d -> %d MiB (x%.2f), %d MiB lower; optimizer state %.1f MiB lower\n",
      n, a, b, b / a, a - b, sa - sb }'
done
