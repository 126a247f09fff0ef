#!/bin/sh
# Runs a fixed set of short trainings with one `loom` binary and writes, per run, its metrics
# (every key except the timing ones: throughput/*, and the memory figures), its sample and the
# SHA-256 of its final weights (model.safetensors) into OUT_DIR/<run>.txt. Two builds give the
# same bits when `diff -r` of their OUT_DIRs is empty: what a refactoring of the run layer must
# show (docs/contributing.md, "Changing the trainer").
#
#   scripts/same-bits.sh LOOM_BINARY OUT_DIR
#
# The runs: the quickstart, gemma2-tiny, mixtral-tiny, sft-tiny, dpo-tiny (with a checkpoint
# and a resume), and llama-tiny on two ranks under mpirun with mesh fsdp=2 and with tensor=2.
set -e
loom=$1
out=$2
[ -x "$loom" ] && [ -n "$out" ] || { echo "usage: $0 LOOM_BINARY OUT_DIR" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

digest() {  # run_dir name
  python3 - "$1" > "$out/$2.txt" <<'PY'
import hashlib, json, sys, os
d = sys.argv[1]
for line in open(os.path.join(d, "metrics.jsonl")):
    if not line.strip():
        continue
    row = json.loads(line)
    row = {k: v for k, v in row.items()
           if not k.startswith("throughput/") and "memory" not in k and "seconds" not in k}
    print(json.dumps(row, sort_keys=True))
with open(os.path.join(d, "model.safetensors"), "rb") as f:
    print("model.safetensors", hashlib.sha256(f.read()).hexdigest())
PY
}

run() {  # name config overrides...
  name=$1; config=$2; shift 2
  (cd "$root" && "$loom" train "$config" trainer.run_dir="$work/$name" trainer.peak_flops=1e15 "$@") \
    > "$work/$name.log" 2>&1 || { cat "$work/$name.log" >&2; echo "$name failed" >&2; exit 1; }
  digest "$work/$name" "$name"
  echo "$name: $(tail -1 "$out/$name.txt")"
}

mpi() {  # name ranks config overrides...
  name=$1; ranks=$2; config=$3; shift 3
  (cd "$root" && timeout 600 mpirun -np "$ranks" "$loom" train "$config" \
      trainer.run_dir="$work/$name" trainer.peak_flops=1e15 "$@") \
    > "$work/$name.log" 2>&1 || { cat "$work/$name.log" >&2; echo "$name failed" >&2; exit 1; }
  digest "$work/$name" "$name"
  echo "$name: $(tail -1 "$out/$name.txt")"
}

run quickstart configs/quickstart.yaml trainer.num_train_steps=80 trainer.steps_per_eval=40 trainer.log_every=10
run gemma2-tiny configs/gemma2-tiny.yaml trainer.num_train_steps=40 trainer.steps_per_eval=20 trainer.log_every=5
run mixtral-tiny configs/mixtral-tiny.yaml trainer.num_train_steps=40 trainer.steps_per_eval=20 trainer.log_every=5
run sft-tiny configs/sft-tiny.yaml trainer.num_train_steps=40 trainer.steps_per_eval=20 trainer.log_every=5
# dpo-tiny again with a checkpoint at step 20 (the save path must not perturb a step).
run dpo-tiny configs/dpo-tiny.yaml trainer.num_train_steps=40 trainer.steps_per_eval=20 trainer.log_every=5
run dpo-tiny-ckpt configs/dpo-tiny.yaml trainer.num_train_steps=40 trainer.steps_per_eval=20 \
  trainer.log_every=5 trainer.checkpoint.save_every_steps=20
mpi llama-fsdp2 2 configs/llama-tiny.yaml trainer.num_train_steps=30 trainer.steps_per_eval=15 \
  trainer.log_every=5 trainer.mesh.fsdp=2 trainer.mesh.data=1
mpi llama-tensor2 2 configs/llama-tiny.yaml trainer.num_train_steps=30 trainer.steps_per_eval=15 \
  trainer.log_every=5 trainer.mesh.tensor=2 trainer.mesh.data=1
mpi llama-data2-zero1 2 configs/llama-tiny.yaml trainer.num_train_steps=30 trainer.steps_per_eval=15 \
  trainer.log_every=5 trainer.mesh.data=2 trainer.shard_optimizer_state=true
