#!/bin/sh
# What checkpointing costs the step loop (issue 9.4): GPT-2 small (124M) at batch 4 x 64 on the
# cpu backend, trainer.checkpoint.save_every_steps: 10, three kinds of run:
#   none   no checkpoints (save_every_steps 0, save_every_minutes 0)
#   async  checkpoints written by the background thread from a snapshot (the default)
#   sync   the step loop waits for each write (async: false)
# run ROUNDS times in turn (none, async, sync, none, ...), so that a change in the machine's load
# falls on all three alike. ms/step is the wall time between the logged elapsed_seconds of steps
# 10 and STEPS divided by the steps (it includes the snapshots of steps 10, 20, ...: what a
# checkpoint costs a run), averaged over the rounds; the overhead is the ratio to `none`. The
# checkpoint's size and write time come from the runs' logs.
#
#   benchmarks/checkpoint/async_overhead.sh [BUILD_DIR] [STEPS] [ROUNDS]
# Run from the repository root. Needs about 4 GB of disk under $TMPDIR.
set -e
build=${1:-build}
steps=${2:-30}
rounds=${3:-2}
loom="$build/bin/loom"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() {  # kind, round, overrides...
  kind=$1
  round=$2
  shift 2
  dir="$out/$kind-$round"
  "$loom" train benchmarks/train/gpt2-small-synthetic.yaml model.seq_len=64 trainer.train_batch_size=4 \
    trainer.num_train_steps="$steps" trainer.log_every=1 trainer.peak_flops=200e9 trainer.run_dir="$dir" \
    "$@" >"$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
  python3 - "$dir/metrics.jsonl" >>"$out/$kind.ms" <<'PY'
import json, sys
rows = {r["step"]: r for r in map(json.loads, open(sys.argv[1])) if "throughput/elapsed_seconds" in r}
last = max(rows)
print("%.1f" % (1000 * (rows[last]["throughput/elapsed_seconds"] - rows[10]["throughput/elapsed_seconds"]) / (last - 10)))
PY
  grep '^checkpoint ' "$dir.log" | sed "s|$out/||; s/^/  $kind /" >>"$out/writes" || true
  [ "$kind" = async ] && du -sb "$dir/checkpoints/step-$steps" | cut -f1 >"$out/size"
  rm -rf "$dir"
}

i=1
while [ $i -le "$rounds" ]; do
  run none $i trainer.checkpoint.save_every_steps=0 trainer.checkpoint.save_every_minutes=0
  run async $i trainer.checkpoint.save_every_steps=10 trainer.checkpoint.async=true
  run sync $i trainer.checkpoint.save_every_steps=10 trainer.checkpoint.async=false
  i=$((i + 1))
done

python3 - "$out" "$steps" "$rounds" <<'PY'
import sys
out, steps, rounds = sys.argv[1], sys.argv[2], sys.argv[3]
ms = {k: [float(x) for x in open("%s/%s.ms" % (out, k))] for k in ("none", "async", "sync")}
mean = {k: sum(v) / len(v) for k, v in ms.items()}
print("gpt2-small 4 x 64, save_every_steps 10, steps 10..%s, %s rounds" % (steps, rounds))
print("%-8s %10s %10s   %s" % ("", "ms/step", "overhead", "per round"))
for k in ("none", "async", "sync"):
    print("%-8s %10.1f %9.1f%%   %s" % (k, mean[k], 100 * (mean[k] / mean["none"] - 1), " ".join("%.1f" % x for x in ms[k])))
print("checkpoint size: %.2f GB" % (int(open(out + "/size").read()) / 1e9))
PY
echo "checkpoint writes (async: the snapshot in the step loop, then the write on the background thread):"
cat "$out/writes"
