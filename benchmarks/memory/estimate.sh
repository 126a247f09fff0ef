#!/usr/bin/env bash
# The start-up memory estimate against the measured peak RSS (docs/training.md, "Memory
# estimate"): a few short runs, each printing the estimate of its header and the peak resident
# set of its process (/usr/bin/time), as a Markdown table.
#   benchmarks/memory/estimate.sh [build-dir]      (default: build)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
loom="$build/bin/loom"
work=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
steps=3
common=(trainer.num_train_steps=$steps trainer.steps_per_eval=1000 trainer.max_eval_batches=1
        trainer.save_final=false trainer.memory_check=off)
# gpt2-small's shapes (configs/quickstart.yaml) on the quickstart's data and optimizer.
small=(model.seq_len=256 model.hidden_dim=768 model.num_layers=12 model.num_heads=12 model.vocab_size=50257
       trainer.train_batch_size=4)

echo "| run | estimate (MiB) | peak RSS (MiB) | estimate / RSS |"
echo "|---|---:|---:|---:|"
# run NAME RANKS CONFIG OVERRIDES...
run() {
  local name=$1 ranks=$2 config=$3
  shift 3
  local dir="$work/$(echo "$name" | tr -c 'a-z0-9' _)"
  mkdir -p "$dir"
  local launch=()
  [ "$ranks" -gt 1 ] && launch=(mpirun -np "$ranks" --oversubscribe)
  (cd "$root" && "${launch[@]}" /usr/bin/time -f "peak_rss_kib %M" "$loom" train "$root/configs/$config" \
     "${common[@]}" "trainer.run_dir=$dir/run" "$@" >"$dir/log" 2>&1) || { echo "| $name | failed: $dir/log |"; return; }
  local estimate rss
  estimate=$(grep -o 'memory estimate per rank: [0-9.]* [MG]iB' "$dir/log" | head -1 |
             awk '{v=$5; if ($6=="GiB") v*=1024; printf "%.0f", v}')
  rss=$(awk '/peak_rss_kib/ {if ($2>m) m=$2} END {printf "%.0f", m/1024}' "$dir/log")
  awk -v n="$name" -v e="$estimate" -v r="$rss" 'BEGIN {printf "| %s | %d | %d | %.2f |\n", n, e, r, e/r}'
}

run "quickstart (16 x 128)" 1 quickstart.yaml
run "gpt2-small 4 x 256" 1 quickstart.yaml "${small[@]}"
run "gpt2-small 4 x 256, remat" 1 quickstart.yaml "${small[@]}" model.remat=full
run "llama-tiny (16 x 512)" 1 quickstart.yaml model.type=llama model.seq_len=512 model.hidden_dim=256 \
  model.intermediate_dim=768 model.num_layers=4 model.num_heads=8 model.num_kv_heads=4
run "gpt2-small 4 x 256, LoRA rank 8" 1 quickstart.yaml "${small[@]}" lora.rank=8
run "gpt2-small 4 x 256, LoRA rank 8, int8 base" 1 quickstart.yaml "${small[@]}" lora.rank=8 lora.base_dtype=int8
run "gpt2-small 4 x 256, LoRA rank 8, nf4 base" 1 quickstart.yaml "${small[@]}" lora.rank=8 lora.base_dtype=nf4
run "gpt2-small 4 x 256, mpirun -np 2" 2 quickstart.yaml "${small[@]}"
run "gpt2-small 4 x 256, mpirun -np 2, ZeRO-1" 2 quickstart.yaml "${small[@]}" trainer.shard_optimizer_state=true
