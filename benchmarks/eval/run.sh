#!/bin/sh
# `loom eval` against lm-evaluation-harness 0.4.5 itself (its HFLM: transformers 4.46.3 on Debian's
# torch 1.13, CPU, float32, batch 8) on the same model and the same task files: documents per
# second of each task, and the time of the whole. The model: GPT-2's architecture at hidden 256,
# 4 layers, 4 heads, context 256, with GPT-2's BPE (50257 tokens), trained for 2 steps (its
# scores do not matter here), float32 products in loom as in the harness; exported with
# `loom export --format hf` for the harness. The tasks: DOCS generated documents per family in each
# task's format (tests/eval/harness_reference.py runs the harness on them).
#
#   benchmarks/eval/run.sh [BUILD_DIR] [DOCS]      (from the repository root)
#
# loom's seconds are the scoring of each task (its model loaded once); the harness's are its
# simple_evaluate call per task, which also reads the task's file through `datasets` (well under a
# second). Both use the machine's cores (loom's thread pool; torch's intra-op threads).
set -e
build=${1:-build}
docs=${2:-100}
python=${LOOM_PYTHON_ENV:-$HOME/.cache/loom/python-env}/bin/python
loom="$build/bin/loom"
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
gpt2=${LOOM_GPT2_DIR:-$here/../../configs/data/gpt2}
cat >"$out/model.yaml" <<YAML
model: {type: gpt2, seq_len: 256, hidden_dim: 256, num_layers: 4, num_heads: 4, attention: flash}
backend: {type: cpu, matmul_precision: f32}
tokenizer: {type: gpt2-bpe, encoder_json: $gpt2/encoder.json, vocab_bpe: $gpt2/vocab.bpe}
data: {type: synthetic, num_documents: 500}
optimizer: {type: adamw, learning_rate: 1.0e-3}
lr_schedule: constant
trainer: {num_train_steps: 2, train_batch_size: 2, steps_per_eval: 0, max_eval_batches: 0, sample_length: 0,
          trackers: [], peak_flops: 1.0e12}
YAML
"$loom" train "$out/model.yaml" trainer.run_dir="$out/run" >"$out/train.log" 2>&1 || { cat "$out/train.log"; exit 1; }
"$loom" export "$out/run" --format hf "$out/hf" >/dev/null
python3 - "$out/tasks" "$docs" <<'PY'
import json, os, random, sys
out, n = sys.argv[1], int(sys.argv[2])
os.makedirs(out)
rng = random.Random(5)
words = ("the a cat dog sat on mat and ran to house river green small big old man woman saw bird in garden "
         "tree water with of blue red apple book read sun came went home kitchen door slowly quickly").split()
def s(lo, hi):
    return " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))
tasks = {
    "hellaswag": lambda: {"activity_label": s(1, 2), "ctx_a": s(10, 30) + ".", "ctx_b": s(2, 6),
                          "endings": [s(5, 20) + "." for _ in range(4)], "label": str(rng.randrange(4))},
    "arc_easy": lambda: {"question": s(8, 25) + "?", "choices": {"text": [s(1, 6) for _ in range(4)],
                         "label": ["A", "B", "C", "D"]}, "answerKey": rng.choice("ABCD")},
    "piqa": lambda: {"goal": s(5, 15), "sol1": s(5, 30), "sol2": s(5, 30), "label": rng.randrange(2)},
    "winogrande": lambda: {"sentence": s(5, 12) + " _ " + s(4, 10) + ".", "option1": s(1, 2), "option2": s(1, 2),
                           "answer": rng.choice("12")},
    "mmlu": lambda: {"question": s(10, 40) + "?", "subject": "anatomy", "choices": [s(1, 6) for _ in range(4)],
                     "answer": rng.randrange(4)},
    "lambada": lambda: {"text": s(40, 80)},
}
for name, make in tasks.items():
    with open(os.path.join(out, name + ".jsonl"), "w") as f:
        for _ in range(n):
            f.write(json.dumps(make()) + "\n")
PY
list=""
for f in "$out"/tasks/*.jsonl; do list="$list${list:+,}$f"; done
"$loom" eval "$out/run" --tasks "$list" -o "$out/loom.json" >/dev/null 2>"$out/loom.log" || { cat "$out/loom.log"; exit 1; }
"$loom" eval "$out/run" --tasks "$list" --kv-cache always -o "$out/loom_plain.json" >/dev/null 2>"$out/loom_plain.log" ||
  { cat "$out/loom_plain.log"; exit 1; }
"$python" "$here/../../tests/eval/harness_reference.py" "$out/hf" "$out/tasks" "$out/harness.json" \
  --batch-size 8 >"$out/harness.log" 2>&1 || { tail -20 "$out/harness.log"; exit 1; }
python3 - "$out" "$docs" <<'PY'
import json, sys
out, n = sys.argv[1], int(sys.argv[2])
loom = json.load(open(out + "/loom.json"))["results"]
plain = json.load(open(out + "/loom_plain.json"))["results"]
harness = json.load(open(out + "/harness.json"))
print(f"{n} documents per task; documents/s")
print(f"{'task':12s} {'loom':>10s} {'loom --kv-cache always':>24s} {'harness 0.4.5':>15s} {'loom/harness':>13s}")
tl = tp = th = 0
for task in loom:
    l, p, h = loom[task]["seconds"], plain[task]["seconds"], harness[task]["seconds"]
    tl, tp, th = tl + l, tp + p, th + h
    print(f"{task:12s} {n / l:10.1f} {n / p:24.1f} {n / h:15.1f} {h / l:12.2f}x")
k = len(loom) * n
print(f"{'all':12s} {k / tl:10.1f} {k / tp:24.1f} {k / th:15.1f} {th / tl:12.2f}x")
PY
