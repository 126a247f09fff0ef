#!/bin/sh
# Mixed precision's quality bar (issue 11), float32 against bf16 with the same seed:
#   * nanoGPT's shakespeare-char recipe (configs/shakespeare-char.yaml, 2000 steps): the final
#     validation losses (bar: within 0.02);
#   * GPT-2 small (124M) + AdamW for 200 steps on the synthetic corpus (batch 4 x --seq tokens,
#     default 64): both loss curves step by step and the largest difference between them.
# Each run keeps its metrics.jsonl and TensorBoard events under OUT_DIR (default
# runs/bf16-quality): `tensorboard --logdir OUT_DIR` overlays the curves.
#
#   benchmarks/bf16/quality.sh [BUILD_DIR] [--out OUT_DIR] [--seq N] [--steps N] [--skip-shakespeare]
# Run from the repository root (shakespeare-char reads configs/data/tinyshakespeare.txt).
set -e
build=build
out=runs/bf16-quality
seq=64
steps=200
skip_shakespeare=no
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --skip-shakespeare) skip_shakespeare=yes; shift ;;
    *) build=$1; shift ;;
  esac
done
loom="$build/bin/loom"
mkdir -p "$out"
echo "$(lscpu | sed -n 's/^Model name: *//p'); load $(cut -d' ' -f1-3 /proc/loadavg)"

for precision in f32 bf16; do
  run="$out/gpt2-small-$precision"
  rm -rf "$run"
  "$loom" train benchmarks/train/gpt2-small-synthetic.yaml model.seq_len="$seq" trainer.num_train_steps="$steps" \
    trainer.trackers='[jsonl, tensorboard]' backend.matmul_precision=$precision trainer.run_dir="$run" \
    >"$run.log" 2>&1 || { cat "$run.log"; exit 1; }
done
python3 - "$out/gpt2-small-f32/metrics.jsonl" "$out/gpt2-small-bf16/metrics.jsonl" "$seq" <<'PY'
import json, sys
def curve(path):
    return {r["step"]: r["train/loss"] for r in map(json.loads, open(path)) if "train/loss" in r}
f32, bf16 = curve(sys.argv[1]), curve(sys.argv[2])
steps = sorted(set(f32) & set(bf16))
diff = [(abs(f32[s] - bf16[s]), s) for s in steps]
worst, at = max(diff)
late = max(d for d, s in diff if s > steps[-1] // 2)
print("gpt2-small 4 x %s, %d steps: final loss f32 %.4f, bf16 %.4f; largest |f32 - bf16| %.4f (step %d), "
      "over the second half %.4f" % (sys.argv[3], steps[-1], f32[steps[-1]], bf16[steps[-1]], worst, at, late))
# One step's loss is that of a few hundred tokens: compare the curves' 20-step moving averages too,
# and say how much one run's loss moves from step to step.
w = 20
def average(c, s):
    return sum(c[t] for t in range(s - w + 1, s + 1)) / w
smooth = max((abs(average(f32, s) - average(bf16, s)), s) for s in steps if s >= w and all(t in f32 for t in range(s - w + 1, s + 1)))
noise = sorted(abs(f32[s] - f32[s - 1]) for s in steps if s - 1 in f32)[len(steps) // 2]
print("  20-step moving averages: largest |f32 - bf16| %.4f (step %d); f32's own step-to-step change, median %.4f"
      % (smooth[0], smooth[1], noise))
for s in steps:
    if s in (1, 2, 5) or s % 25 == 0:
        print("  step %4d  f32 %.4f  bf16 %.4f  diff %+.4f" % (s, f32[s], bf16[s], bf16[s] - f32[s]))
PY

[ "$skip_shakespeare" = yes ] && exit 0
for precision in f32 bf16; do
  run="$out/shakespeare-char-$precision"
  rm -rf "$run"
  "$loom" train configs/shakespeare-char.yaml trainer.trackers='[jsonl, tensorboard]' \
    backend.matmul_precision=$precision trainer.run_dir="$run" >"$run.log" 2>&1 || { cat "$run.log"; exit 1; }
done
python3 - "$out/shakespeare-char-f32/metrics.jsonl" "$out/shakespeare-char-bf16/metrics.jsonl" <<'PY'
import json, sys
def last_eval(path):
    return [r["eval/loss"] for r in map(json.loads, open(path)) if "eval/loss" in r][-1]
f32, bf16 = last_eval(sys.argv[1]), last_eval(sys.argv[2])
print("shakespeare-char: validation loss f32 %.4f, bf16 %.4f, |difference| %.4f (bar: 0.02) %s"
      % (f32, bf16, abs(f32 - bf16), "ok" if abs(f32 - bf16) <= 0.02 else "NOT MET"))
PY
