#!/bin/sh
# Mixed precision, in one run: GPT-2 small (124M) + AdamW at batch 4 x 256 and 4 x 64 tokens,
#   * loom, cpu backend, float32 (backend.matmul_precision: f32),
#   * loom, cpu backend, bf16 products with float32 accumulation (matmul_precision: bf16),
#   * PyTorch (Debian's /usr/bin/python3 and torch) under torch.autocast("cpu", bfloat16), with
#     OMP_WAIT_POLICY=PASSIVE and as many threads as loom (torch_gpt2.py: the same model),
# each timed over the steps after the first two (allocator and cache warm-up); the configurations
# alternate round by round (--rounds, default 2) so that a change of the machine's load hits all
# of them, and the best round of each is kept. Prints ms/step, tokens/s, MFU against the roof of
# the dtype that ran (loom's start-up GEMM probe: the float32 roof for f32, the bf16 one for
# bf16; PyTorch's against the same bf16 roof) and the ratios the issue asks for: loom bf16 over
# PyTorch bf16 and over loom float32.
#
#   benchmarks/bf16/run.sh [BUILD_DIR] [--rounds N] [--steps N] [--shapes "256 64"]
# Run from the repository root. Needs no data files (the corpus is synthetic).
set -e
build=build
rounds=2
steps=8
shapes="256 64"
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --shapes) shapes=$2; shift 2 ;;
    *) build=$1; shift ;;
  esac
done
loom="$build/bin/loom"
threads=${LOOM_NUM_THREADS:-$(nproc)}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
have_torch=yes
/usr/bin/python3 -c 'import torch' 2>/dev/null || { have_torch=no; echo "(PyTorch: /usr/bin/python3 cannot import torch; its rows are skipped)"; }

echo "$(lscpu | sed -n 's/^Model name: *//p'), $threads threads; load $(cut -d' ' -f1-3 /proc/loadavg)"
round=1
while [ "$round" -le "$rounds" ]; do
  for shape in $shapes; do
    for precision in f32 bf16; do
      run="$out/loom-$precision-$shape-$round"
      "$loom" train benchmarks/train/gpt2-small-synthetic.yaml model.seq_len="$shape" trainer.num_train_steps="$steps" \
        backend.matmul_precision=$precision trainer.run_dir="$run" >"$run.log" 2>&1 || { cat "$run.log"; exit 1; }
    done
    if [ "$have_torch" = yes ]; then
      OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=$threads /usr/bin/python3 benchmarks/bf16/torch_gpt2.py \
        --seq "$shape" --steps $((steps - 2)) --warmup 2 --dtype bf16 --threads "$threads" >"$out/torch-bf16-$shape-$round.txt"
    fi
  done
  round=$((round + 1))
done

python3 - "$out" "$shapes" <<'PY'
import glob, json, os, re, sys
out, shapes = sys.argv[1], sys.argv[2].split()

def loom(precision, shape):
    """Best round: (ms/step, tokens/s, mfu, roof GFLOP/s) over the steps after the first two."""
    best = None
    for run in glob.glob(os.path.join(out, "loom-%s-%s-*" % (precision, shape))):
        if not os.path.isdir(run):
            continue
        rows = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if l.strip()]
        rows = [r for r in rows if "throughput/tokens_per_second" in r and r["step"] > 2]
        tps = sum(r["throughput/tokens_per_second"] for r in rows) / len(rows)
        mfu = sum(r["throughput/mfu"] for r in rows) / len(rows)
        log = open(run + ".log").read()
        roof = float(re.search(r"peak ([0-9.]+) GFLOP/s", log).group(1))
        if best is None or tps > best[1]:
            best = (4000.0 * int(shape) / tps, tps, mfu, roof)
    return best

def torch(shape):
    best = None
    for path in glob.glob(os.path.join(out, "torch-bf16-%s-*.txt" % shape)):
        m = re.search(r"ms_per_step ([0-9.]+) tokens_per_second ([0-9.]+)", open(path).read())
        if m and (best is None or float(m.group(2)) > best[1]):
            best = (float(m.group(1)), float(m.group(2)))
    return best

print("%-30s %10s %10s %8s %12s" % ("gpt2-small + AdamW", "ms/step", "tokens/s", "MFU", "roof GFLOP/s"))
ratios = []
for shape in shapes:
    f32, bf16, pt = loom("f32", shape), loom("bf16", shape), torch(shape)
    print("%-30s %10.1f %10.1f %8.3f %12.1f" % ("loom f32   4 x %s" % shape, *f32))
    print("%-30s %10.1f %10.1f %8.3f %12.1f" % ("loom bf16  4 x %s" % shape, *bf16))
    if pt:
        mfu = bf16[2] * pt[1] / bf16[1]  # same FLOPs per token, same bf16 roof
        print("%-30s %10.1f %10.1f %8.3f %12.1f" % ("torch bf16 4 x %s (autocast)" % shape, pt[0], pt[1], mfu, bf16[3]))
    ratios.append("4 x %s: loom bf16 / loom f32 %.2fx" % (shape, bf16[1] / f32[1]) +
                  (", loom bf16 / torch bf16 %.2fx" % (bf16[1] / pt[1]) if pt else ""))
print("\n".join(ratios))
PY
