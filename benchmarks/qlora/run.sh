#!/usr/bin/env bash
# issue 22's workload: a LoRA run (rank 16 on q, k, v, o, gate, up, down; batch 1 x 512; remat)
# from a random-weight Hugging Face directory of Llama 3 8B's or Qwen 2.5 7B's shapes (bf16
# safetensors in save_pretrained's shards, written by make_hf_model.py when absent), with the
# frozen base in bf16, int8 and nf4, and float32, which the start-up estimate should refuse.
# Prints a Markdown table: the estimate, the peak RSS (/usr/bin/time), the load time (start to
# the first step) and the tokens/s of the steps after the first.
#   benchmarks/qlora/run.sh llama3-8b|qwen2.5-7b [WORK_DIR] [FORMATS...]
#     (WORK_DIR default /tmp/loom-qlora: about 16 GB for the directory; FORMATS default
#      "f32 nf4 int8 bf16"; BUILD=build directory, default build)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${BUILD:-$root/build}" && pwd)
model=${1:?usage: run.sh llama3-8b|qwen2.5-7b [WORK_DIR] [FORMATS...]}
work=${2:-/tmp/loom-qlora}
shift $(( $# >= 2 ? 2 : 1 ))
formats=("$@")
[ ${#formats[@]} -gt 0 ] || formats=(f32 nf4 int8 bf16)
python=${PYTHON:-$HOME/.cache/loom/python-env/bin/python}
hf="$work/$model"
mkdir -p "$work"
if [ ! -f "$hf/model.safetensors.index.json" ]; then
  echo "writing $hf (about 16 GB; df -h says what is free: $(df -h --output=avail "$work" | tail -1))" >&2
  "$python" "$root/benchmarks/qlora/make_hf_model.py" "$model" "$hf" >&2
fi
echo "| $model base | estimate (GiB) | peak RSS (GiB) | load and setup (s) | tokens/s | |"
echo "|---|---:|---:|---:|---:|---|"
for format in "${formats[@]}"; do
  dir="$work/run-$model-$format"
  rm -rf "$dir"
  mkdir -p "$dir"
  status=0
  /usr/bin/time -f "peak_rss_kib %M wall_s %e" "$build/bin/loom" train "$root/benchmarks/qlora/$model-lora.yaml" \
    "trainer.init_from=$hf" "lora.base_dtype=$format" "trainer.run_dir=$dir/run" >"$dir/log" 2>&1 || status=$?
  estimate=$(grep -o 'memory estimate per rank: [0-9.]* [MG]iB' "$dir/log" | head -1 |
             awk '{v=$5; if ($6=="MiB") v/=1024; printf "%.2f", v}')
  rss=$(awk '/peak_rss_kib/ {printf "%.2f", $2/1024/1024}' "$dir/log")
  if [ "$status" -ne 0 ]; then
    why=$(grep -m1 -o 'error: .\{0,160\}' "$dir/log" || tail -1 "$dir/log")
    echo "| $format | ${estimate:--} | ${rss:--} | | | refused or failed (exit $status): ${why//|/\\|} |"
    continue
  fi
  # tokens/s: the mean of the steps after the first; load: the wall time less the step loop's.
  read -r tps loop < <(python3 -c "
import json
r=[json.loads(l) for l in open('$dir/run/metrics.jsonl')]
r=[x for x in r if 'throughput/tokens_per_second' in x]
v=[x['throughput/tokens_per_second'] for x in r[1:]] or [x['throughput/tokens_per_second'] for x in r]
print('%.1f %.1f' % (sum(v)/len(v), r[-1]['throughput/elapsed_seconds']))")
  wall=$(awk '/peak_rss_kib/ {print $4}' "$dir/log")
  load=$(awk -v w="$wall" -v l="$loop" 'BEGIN {printf "%.0f", w - l}')
  echo "| $format | $estimate | $rss | ${load:--} | $tps | |"
done
