#!/bin/sh
# LoRA against full fine-tuning on GPT-2 small (124M), cpu backend, AdamW: optimizer-state memory
# (the trainer's "optimizer state" line: full training names every parameter trainable to get
# it), peak resident memory of the process, and ms/step (steady state: steps
# after the second), each ratio measured in this one invocation. Full and LoRA runs alternate,
# ROUNDS times each, so that a load shared with other work falls on both alike; the load average
# is printed before and after.
#
#   benchmarks/lora/run.sh [BUILD_DIR] [ROUNDS]      (from the repository root)
# LoRA: rank 8, alpha 16, on c_attn, c_proj and c_fc (every attention and MLP projection).
set -e
build=${1:-build}
rounds=${2:-2}
seq=${LOOM_LORA_BENCH_SEQ:-128}
loom="$build/bin/loom"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common="model.seq_len=$seq trainer.peak_flops=1e12 trainer.num_train_steps=8"
lora="lora.rank=8 lora.alpha=16 lora.target_modules=[c_attn,c_proj,c_fc]"

one() {  # name, extra overrides -> "ms/step optimizer_MiB peak_rss_MiB"
  run="$out/$1-$2"
  shift 2
  /usr/bin/time -f "%M" -o "$run.rss" "$loom" train benchmarks/train/gpt2-small-synthetic.yaml $common \
    trainer.run_dir="$run" "$@" >"$run.log" 2>&1 || { cat "$run.log"; exit 1; }
  python3 - "$run/metrics.jsonl" "$run.log" "$run.rss" "$seq" <<'PY'
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "throughput/tokens_per_second" in r and r["step"] > 2]
tokens = 4 * int(sys.argv[4])
ms = sum(1000.0 * tokens / r["throughput/tokens_per_second"] for r in rows) / len(rows)
state = float(re.search(r"optimizer state ([0-9.]+) MiB", open(sys.argv[2]).read()).group(1))
rss = int(open(sys.argv[3]).read().split()[-1]) / 1024.0
print("%.1f %.1f %.0f" % (ms, state, rss))
PY
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-8s %6s %10s %18s %14s\n' "run" "round" "ms/step" "optimizer MiB" "peak RSS MiB"
results="$out/results"
: >"$results"
i=1
while [ "$i" -le "$rounds" ]; do
  set -- $(one full "$i" "trainer.trainable=['*']")
  printf '%-8s %6s %10s %18s %14s\n' full "$i" "$1" "$2" "$3"
  echo "full $*" >>"$results"
  set -- $(one lora "$i" $lora)
  printf '%-8s %6s %10s %18s %14s\n' lora "$i" "$1" "$2" "$3"
  echo "lora $*" >>"$results"
  i=$((i + 1))
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$results" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
def mean(kind, col):
    v = [float(r[col]) for r in rows if r[0] == kind]
    return sum(v) / len(v)
print("lora / full: step time %.2f, optimizer state %.4f (%.1f vs %.1f MiB), peak RSS %.2f"
      % (mean("lora", 1) / mean("full", 1), mean("lora", 2) / mean("full", 2), mean("lora", 2), mean("full", 2),
         mean("lora", 3) / mean("full", 3)))
PY
