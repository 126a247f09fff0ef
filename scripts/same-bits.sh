#!/bin/sh
# Runs a fixed set of short trainings with one `loom` binary and writes, per run, its metrics
# (every key but the timing ones: throughput/*, seconds and memory figures), its sample and the
# SHA-256 of its final weights (model.safetensors's tensors and header, less the metadata that
# names the run) to OUT_DIR/<run>.txt. Two builds give the same bits when `diff -r` of their
# OUT_DIRs is empty: what a change to the run layer that means to change nothing must show
# (docs/contributing.md, "Changing the trainer").
#
#   scripts/same-bits.sh LOOM_BINARY OUT_DIR
#
# The runs: the quickstart, gemma2-tiny, mixtral-tiny, sft-tiny, dpo-tiny (also with a checkpoint),
# and llama-tiny on two ranks under mpirun: mesh fsdp=2, tensor=2, and data=2 with ZeRO-1.
#
# The checkpoints. The runs under mpirun also save a checkpoint half way and at their end (a
# checkpoint does not change a step, so their metrics and weights are those without one), and
# llama-tiny on four ranks (mesh fsdp=2 x tensor=2) saves them too; dpo-tiny-ckpt's (one process)
# are recorded as well. OUT_DIR/<run>.checkpoint.txt
# holds a digest of each file of each checkpoint: the SHA-256 of every tensor file (model and
# optimizer, whole or a rank's part; the runs are named by trainer.run_id=same-bits, so their
# metadata holds no time), of generation.json and tokenizer.state, of config.yaml with the run's
# temporary directory replaced by WORK, of state.json less its clock (saved_at, clock) and its
# config_hash (the config names the temporary directory), and of manifest.json with the sizes and
# CRC-32Cs of state.json and config.yaml removed (the same reasons). Then each resumes from its
# half-way checkpoint in a new run directory and trains to the end: OUT_DIR/<run>-resume.txt holds
# its metrics, final weights and checkpoint, as above.
#
# An OUT_DIR written before the checkpoint files were added compares with `diff -r -x
# '*.checkpoint.txt' -x '*-resume.txt'`.
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
# The tensors and their header; the header's __metadata__ names the run (its id has the time).
with open(os.path.join(d, "model.safetensors"), "rb") as f:
    blob = f.read()
n = int.from_bytes(blob[:8], "little")
header = json.loads(blob[8:8 + n])
header.pop("__metadata__", None)
h = hashlib.sha256(json.dumps(header, sort_keys=True).encode())
h.update(blob[8 + n:])
print("model.safetensors", h.hexdigest())
PY
}

# The digest of every checkpoint of run directory $1 into OUT_DIR/$2.checkpoint.txt.
checkpoint_digest() {  # run_dir name
  python3 - "$1" "$work" > "$out/$2.checkpoint.txt" <<'PY'
import hashlib, json, sys, os
d, work = sys.argv[1], sys.argv[2]
root = os.path.join(d, "checkpoints")
steps = sorted((n for n in os.listdir(root) if n.startswith("step-")), key=lambda n: int(n[5:]))
if not steps:
    sys.exit("no checkpoint in " + root)
for step in steps:
    for name in sorted(os.listdir(os.path.join(root, step))):
        with open(os.path.join(root, step, name), "rb") as f:
            blob = f.read()
        if name == "state.json":
            record = json.loads(blob)
            for key in ("saved_at", "clock", "config_hash"):
                record.pop(key, None)
            blob = json.dumps(record, sort_keys=True).encode()
        elif name == "manifest.json":
            manifest = json.loads(blob)
            for entry in manifest.get("files", []):
                if entry.get("name") in ("state.json", "config.yaml"):
                    entry.pop("size", None)
                    entry.pop("crc32c", None)
            blob = json.dumps(manifest, sort_keys=True).encode()
        elif name == "config.yaml":
            blob = blob.replace(work.encode(), b"WORK")
        print(step, name, hashlib.sha256(blob).hexdigest())
PY
}

run() {  # name config overrides...
  name=$1; config=$2; shift 2
  (cd "$root" && "$loom" train "$config" trainer.run_dir="$work/$name" trainer.peak_flops=1e15 trainer.checkpoint.save_every_minutes=0 "$@") \
    > "$work/$name.log" 2>&1 || { cat "$work/$name.log" >&2; echo "$name failed" >&2; exit 1; }
  digest "$work/$name" "$name"
  echo "$name: $(tail -1 "$out/$name.txt")"
}

mpi() {  # name ranks config overrides...
  name=$1; ranks=$2; config=$3; shift 3
  (cd "$root" && timeout 600 mpirun -np "$ranks" "$loom" train "$config" \
      trainer.run_dir="$work/$name" trainer.peak_flops=1e15 trainer.checkpoint.save_every_minutes=0 "$@") \
    > "$work/$name.log" 2>&1 || { cat "$work/$name.log" >&2; echo "$name failed" >&2; exit 1; }
  digest "$work/$name" "$name"
  echo "$name: $(tail -1 "$out/$name.txt")"
}

# Under mpirun with checkpoints at step $half and at the end, recorded; then the run resumed from
# step $half in a directory of its own, recorded as <name>-resume.
mpi_checkpointed() {  # name ranks half config overrides...
  # (mpi sets name and ranks: sh has no local variables)
  base=$1; np=$2; half=$3; shift 3
  mpi "$base" "$np" "$@" trainer.run_id=same-bits trainer.checkpoint.save_every_steps="$half"
  checkpoint_digest "$work/$base" "$base"
  mpi "$base-resume" "$np" "$@" trainer.run_id=same-bits trainer.resume="$work/$base/checkpoints/step-$half"
  checkpoint_digest "$work/$base-resume" "$base-resume"
  cat "$out/$base-resume.checkpoint.txt" >> "$out/$base-resume.txt"
  rm "$out/$base-resume.checkpoint.txt"
}

run quickstart configs/quickstart.yaml trainer.num_train_steps=80 trainer.steps_per_eval=40 trainer.log_every=10
run gemma2-tiny configs/gemma2-tiny.yaml trainer.num_train_steps=40 trainer.steps_per_eval=20 trainer.log_every=5
run mixtral-tiny configs/mixtral-tiny.yaml trainer.num_train_steps=40 trainer.steps_per_eval=20 trainer.log_every=5
run sft-tiny configs/sft-tiny.yaml trainer.num_train_steps=40 trainer.steps_per_eval=20 trainer.log_every=5
# dpo-tiny again with a checkpoint at step 20 (the save path must not perturb a step).
run dpo-tiny configs/dpo-tiny.yaml trainer.num_train_steps=40 trainer.steps_per_eval=20 trainer.log_every=5
run dpo-tiny-ckpt configs/dpo-tiny.yaml trainer.num_train_steps=40 trainer.steps_per_eval=20 \
  trainer.log_every=5 trainer.checkpoint.save_every_steps=20 trainer.run_id=same-bits
checkpoint_digest "$work/dpo-tiny-ckpt" dpo-tiny-ckpt
mpi_checkpointed llama-fsdp2 2 15 configs/llama-tiny.yaml data.type=synthetic trainer.num_train_steps=30 trainer.steps_per_eval=15 \
  trainer.log_every=5 trainer.mesh.fsdp=2 trainer.mesh.data=1
mpi_checkpointed llama-tensor2 2 15 configs/llama-tiny.yaml data.type=synthetic trainer.num_train_steps=30 trainer.steps_per_eval=15 \
  trainer.log_every=5 trainer.mesh.tensor=2 trainer.mesh.data=1
mpi_checkpointed llama-data2-zero1 2 15 configs/llama-tiny.yaml data.type=synthetic trainer.num_train_steps=30 trainer.steps_per_eval=15 \
  trainer.log_every=5 trainer.mesh.data=2 trainer.shard_optimizer_state=true
mpi_checkpointed llama-fsdp2-tensor2 4 5 configs/llama-tiny.yaml data.type=synthetic trainer.num_train_steps=10 \
  trainer.steps_per_eval=5 trainer.log_every=5 trainer.mesh.fsdp=2 trainer.mesh.tensor=2 trainer.mesh.data=1
