#!/bin/sh
# The model families' speed on this machine, reported from one invocation:
#   1. tokens/s of every tiny preset in configs/ (*-tiny.yaml), trained by `loom train` (forward,
#      backward, AdamW step, data loading) for a few steps; steady state (steps after the 10th).
#      The machine is shared and noisy, so the presets run in alternating rounds (every preset
#      once per round, ROUNDS rounds, default 3) and each figure is the median over the rounds;
#   2. loom_bench_moe: the share of a mixture-of-experts step spent routing and in the experts'
#      matrix products, against a dense llama of the same active parameter count (differential
#      timing, alternating rounds; see moe_benchmark.cpp).
#
#   benchmarks/moe/run.sh [BUILD_DIR]        (ROUNDS=5 benchmarks/moe/run.sh for more rounds)
# Run from the repository root. llama-tiny and mistral-tiny are model sections only: they get the
# synthetic corpus, AdamW and batch 4 x 512 (2048 tokens per step, as the others' 16 x 128).
set -e
build=${1:-build}
rounds=${ROUNDS:-3}
loom="$build/bin/loom"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

presets=""
for f in configs/*-tiny.yaml; do presets="$presets $(basename "$f" .yaml)"; done
echo "$(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $rounds alternating rounds"
r=1
while [ "$r" -le "$rounds" ]; do
  for p in $presets; do
    run="$out/$p-$r"
    extra=""
    grep -q '^data:' "configs/$p.yaml" || extra="data.type=synthetic optimizer.type=adamw trainer.train_batch_size=4"
    # shellcheck disable=SC2086
    "$loom" train "configs/$p.yaml" trainer.run_dir="$run" trainer.num_train_steps=30 trainer.log_every=5 \
      trainer.steps_per_eval=0 trainer.max_eval_batches=0 trainer.sample_length=0 trainer.save_final=false \
      "trainer.trackers=[jsonl]" $extra >"$run.log" 2>&1 || { cat "$run.log"; exit 1; }
  done
  r=$((r + 1))
done

python3 - "$out" $presets <<'PY'
import glob, json, os, statistics, sys
out, presets = sys.argv[1], sys.argv[2:]
print("%-14s %12s   %s" % ("preset", "tokens/s", "per round"))
for p in presets:
    per_round = []
    for path in sorted(glob.glob(os.path.join(out, p + "-*", "metrics.jsonl"))):
        rows = [json.loads(l) for l in open(path) if l.strip()]
        rows = [r for r in rows if "throughput/tokens_per_second" in r and r["step"] > 10]
        if rows:
            per_round.append(statistics.mean(r["throughput/tokens_per_second"] for r in rows))
    if per_round:
        print("%-14s %12.0f   %s" % (p, statistics.median(per_round), " ".join("%.0f" % x for x in per_round)))
PY
echo
"$build/bin/loom_bench_moe" --rounds 21
