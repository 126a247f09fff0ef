#!/bin/sh
# What checkpointing costs the step loop (issue 9.4): GPT-2 small (124M) at batch 4 x 64 on the
# cpu backend, trainer.checkpoint.save_every_steps: 10, three runs in this one invocation:
#   none   no checkpoints (save_every_steps 0, save_every_minutes 0)
#   async  checkpoints written by the background thread from a snapshot (the default)
#   sync   the step loop waits for each write (async: false)
# ms/step is wall time between the logged elapsed_seconds of steps 10 and N (so it includes the
# snapshots of steps 10, 20, ...), which is what a checkpoint costs a run; the overhead is the
# ratio to `none`. The checkpoint's size and its write time come from the run's log.
#
#   benchmarks/checkpoint/async_overhead.sh [BUILD_DIR] [STEPS]
# Run from the repository root. Needs about 6 GB of disk under $TMPDIR.
set -e
build=${1:-build}
steps=${2:-40}
loom="$build/bin/loom"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() {  # name, overrides...
  name=$1
  shift
  "$loom" train benchmarks/train/gpt2-small-synthetic.yaml model.seq_len=64 trainer.train_batch_size=4 \
    trainer.num_train_steps="$steps" trainer.log_every=1 trainer.peak_flops=200e9 trainer.run_dir="$out/$name" \
    "$@" >"$out/$name.log" 2>&1 || { cat "$out/$name.log"; exit 1; }
}

ms_per_step() {  # metrics.jsonl -> ms/step from step 10 to the last
  python3 - "$1" <<'PY'
import json, sys
rows = {r["step"]: r for r in map(json.loads, open(sys.argv[1])) if "throughput/elapsed_seconds" in r}
last = max(rows)
print("%.1f" % (1000 * (rows[last]["throughput/elapsed_seconds"] - rows[10]["throughput/elapsed_seconds"]) / (last - 10)))
PY
}

run none trainer.checkpoint.save_every_steps=0 trainer.checkpoint.save_every_minutes=0
run async trainer.checkpoint.save_every_steps=10 trainer.checkpoint.async=true
run sync trainer.checkpoint.save_every_steps=10 trainer.checkpoint.async=false

none=$(ms_per_step "$out/none/metrics.jsonl")
printf '%-42s %10s %10s\n' "gpt2-small 4 x 64, $steps steps" "ms/step" "overhead"
for name in none async sync; do
  ms=$(ms_per_step "$out/$name/metrics.jsonl")
  printf '%-42s %10s %9s%%\n' "$name" "$ms" "$(python3 -c "print('%.1f' % (100 * ($ms / $none - 1)))")"
done
echo "checkpoint writes (async: snapshot in the step loop, then the write on the background thread):"
grep '^checkpoint ' "$out/async.log" | sed 's/^/  async /'
grep '^checkpoint ' "$out/sync.log" | sed 's/^/  sync  /'
du -sh "$out/async/checkpoints/step-$steps" | awk '{print "checkpoint size on disk: " $1}'
