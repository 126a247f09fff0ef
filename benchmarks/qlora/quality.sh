#!/usr/bin/env bash
# QLoRA's quality on something this machine trains (issue 22, docs/fine-tuning.md): configs/
# sft-tiny.yaml's model is first trained on tiny Shakespeare (the base), then fine-tuned on
# sft-tiny's chat data by rank-8 adapters on every projection, with the frozen base in f32,
# bf16, int8 and nf4, for each of SEEDS (trainer.seed: the adapters' initialisation, the data
# order, dropout; default "0 1 2"). Prints each format's final evaluation losses and their mean
# against f32's as a Markdown table, and draws the first seed's loss curves (loom report --png)
# into OUT_DIR.
#   benchmarks/qlora/quality.sh [OUT_DIR]     (default /tmp/loom-qlora-quality; BUILD=build dir)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${BUILD:-$root/build}" && pwd)
out=${1:-/tmp/loom-qlora-quality}
loom="$build/bin/loom"
mkdir -p "$out"
cd "$root"
if [ ! -f "$out/base/model.safetensors" ]; then
  "$loom" train configs/sft-tiny.yaml "data={type: text, paths: [configs/data/tinyshakespeare.txt], validation_fraction: 0.1}" \
    trainer.num_train_steps=400 trainer.steps_per_eval=100 trainer.run_dir="$out/base" trainer.trackers=[jsonl] \
    >"$out/base.log" 2>&1
fi
lora=(trainer.init_from="$out/base" lora.rank=8 lora.alpha=16 lora.dropout=0.05
      "lora.target_modules=[c_attn, c_proj, c_fc]" optimizer.weight_decay=0.0 trainer.num_train_steps=300
      trainer.steps_per_eval=25 trainer.max_eval_batches=8 trainer.trackers=[jsonl])
seeds=(${SEEDS:-0 1 2})
runs=()
for seed in "${seeds[@]}"; do
  for format in f32 bf16 int8 nf4; do
    name="lora-$format-seed$seed"
    [ -f "$out/$name.log" ] && grep -q 'final eval' "$out/$name.log" ||
      "$loom" train configs/sft-tiny.yaml "${lora[@]}" lora.base_dtype=$format trainer.seed=$seed \
        trainer.run_dir="$out/$name" trainer.run_id="$name" >"$out/$name.log" 2>&1
    [ "$seed" = "${seeds[0]}" ] && runs+=("$out/$name")
  done
done
loss() { grep -o 'final eval: loss [0-9.]*' "$1" | awk '{print $4}'; }
# Per format: the final evaluation loss of each seed, their mean, and the mean against f32's.
declare -A mean
for format in f32 bf16 int8 nf4; do
  mean[$format]=$(for seed in "${seeds[@]}"; do loss "$out/lora-$format-seed$seed.log"; done |
                  awk '{s+=$1; n++} END {printf "%.4f", s/n}')
done
echo "| lora.base_dtype | final eval loss per seed (${seeds[*]}) | mean | mean against f32 |"
echo "|---|---|---:|---:|"
for format in f32 bf16 int8 nf4; do
  per=$(for seed in "${seeds[@]}"; do loss "$out/lora-$format-seed$seed.log"; done | xargs printf "%.4f " )
  awk -v f="$format" -v p="$per" -v m="${mean[$format]}" -v b="${mean[f32]}" \
    'BEGIN {printf "| %s | %s| %.4f | %+.2f%% |\n", f, p, m, 100 * (m - b) / b}'
done
"$loom" report "${runs[@]}" -o "$out/report.html" --png "$out/png" >/dev/null
echo "charts (seed ${seeds[0]}): $out/png"
