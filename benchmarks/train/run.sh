#!/bin/sh
# End-to-end training benchmarks, each reported from its own run in this one invocation:
#   * nanoGPT's character-level Shakespeare recipe (configs/shakespeare-char.yaml): wall time,
#     ms/step, final train and validation loss (target: validation <= 1.92);
#   * GPT-2 small (124M) at batch 4 x 64 and 4 x 256 tokens with the cpu backend, AdamW step
#     included: ms/step, tokens/s and MFU against the roof loom's start-up GEMM probe measures in
#     the run's own precision (targets: MFU >= 0.50 and 0.60); LOOM_PEAK_FLOPS=200e9 (say) pins it.
# Steady-state figures leave out the first steps (allocator and cache warm-up). Every run computes
# its matrix products in float32 (backend.matmul_precision=f32, the series these figures have
# been recorded in; the cpu backend's default computes them in bf16 where the CPU has
# AVX512-BF16) unless LOOM_MATMUL_PRECISION says otherwise (auto, bf16; benchmarks/bf16/run.sh
# compares the two).
#
#   benchmarks/train/run.sh [BUILD_DIR] [--skip-shakespeare]
# Run from the repository root (shakespeare-char reads configs/data/tinyshakespeare.txt).
set -e
build=${1:-build}
# The roof MFU is measured against: the start-up probe's (trainer.peak_flops 0) unless given.
peak=${LOOM_PEAK_FLOPS:-0}
precision=${LOOM_MATMUL_PRECISION:-f32}
skip_shakespeare=no
for arg in "$@"; do [ "$arg" = "--skip-shakespeare" ] && skip_shakespeare=yes; done
loom="$build/bin/loom"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

steady() {  # metrics.jsonl -> "ms/step tokens/s mfu" averaged over steps after the first $2
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
path, skip, tokens_per_step = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
rows = [json.loads(l) for l in open(path) if l.strip()]
rows = [r for r in rows if "throughput/tokens_per_second" in r and r["step"] > skip]
tps = sum(r["throughput/tokens_per_second"] for r in rows) / len(rows)
mfu = sum(r["throughput/mfu"] for r in rows) / len(rows)
print("%.1f %.0f %.3f" % (1000.0 * tokens_per_step / tps, tps, mfu))
PY
}

echo "matmul precision: $precision"
printf '%-34s %10s %12s %8s\n' "benchmark" "ms/step" "tokens/s" "MFU"
for shape in 64 256; do
  run="$out/gpt2-$shape"
  "$loom" train benchmarks/train/gpt2-small-synthetic.yaml model.seq_len=$shape trainer.run_dir="$run" trainer.peak_flops=$peak \
    backend.matmul_precision=$precision >"$run.log" 2>&1 \
    || { cat "$run.log"; exit 1; }
  set -- $(steady "$run/metrics.jsonl" 2 $((4 * shape)))
  printf '%-34s %10s %12s %8s\n' "gpt2-small 4 x $shape" "$1" "$2" "$3"

done

[ "$skip_shakespeare" = yes ] && exit 0
run="$out/shakespeare"
start=$(date +%s.%N)
"$loom" train configs/shakespeare-char.yaml trainer.run_dir="$run" backend.matmul_precision=$precision >"$run.log" 2>&1 || { cat "$run.log"; exit 1; }
end=$(date +%s.%N)
python3 - "$run/metrics.jsonl" "$start" "$end" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
train = [r for r in rows if "train/loss" in r]
evals = [r for r in rows if "eval/loss" in r]
wall = float(sys.argv[3]) - float(sys.argv[2])
steps = train[-1]["step"]
train_seconds = sum(12 * 64 * 100 / r["throughput/tokens_per_second"] for r in train if r["step"] % 100 == 0)
print("shakespeare-char (2000 steps)      wall %.1f s, %.1f ms/step in steps, final train loss %.4f, "
      "validation loss %.4f (target <= 1.92)" % (wall, 1000 * train_seconds / steps, train[-1]["train/loss"], evals[-1]["eval/loss"]))
PY
