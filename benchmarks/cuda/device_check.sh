#!/bin/bash
# The CUDA backend's check on a machine with a GPU: one prepared script for one call of a device
# lease (docs/cuda.md), about 8 minutes, logs under $OUT and a short table printed last.
#
# Prepare here (no GPU needed), then carry build-device with the call:
#   cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON && cmake --build build
#   benchmarks/cuda/pack.sh build build-device
# On the device machine, from the repository root (the device tool: carry ["build-device"]):
#   benchmarks/cuda/device_check.sh [PACK_DIR]        (default: build-device; a build directory
#                                                      made there works too)
#
# Steps, each under its own time limit (the sum stays under 8 minutes; a step that runs out is
# reported as such, and the rest still run):
#   1. the machine: nvidia-smi, the CUDA libraries found, `loom plugins` (the cuda backend listed)
#   2. `loom conformance libloom-backend-cuda.so`: every operation against `reference`, the kernel
#      contract, determinism (the attention cases run on cuda-flash, the attention kernel of cuda:0)
#   3. `loom train` of the quickstart recipe on cuda against reference, 20 steps (`auto` picks
#      cuda-flash; float32 products, so its float32 path), then the memory check reading the GPU's
#      free memory
#   4. `loom bench gemm` on cuda, f32 and bf16, GPT-2 small's shapes at 8192 tokens, and PyTorch's
#      matmul (cuBLAS) on the same shapes and dtypes as the library baseline
#   5. the GPU attention kernel: `loom conformance libloom-attention-cuda-flash.so` (every problem
#      of the attention suite against `naive`, float32 and bf16, on copies in GPU memory), then
#      loom_cuda_attention_bench (forward and forward+backward at 1k-8k tokens, causal, batch 4,
#      16 heads of 64 and of 128, bf16 and float32) against PyTorch's
#      scaled_dot_product_attention on the same shapes (benchmarks/cuda/sdpa_bench.py), and `loom
#      bench attention --kernels cuda-flash,flash` (the GPU kernel by name beside the host's)
# Nothing here changes the GPU's settings.
set -u
pack=${1:-build-device}
out=${OUT:-/tmp/loom-device-check}
mkdir -p "$out"
here=$(pwd)
start=$(date +%s)
declare -a rows

row() { rows+=("$(printf '%-34s %-10s %s' "$1" "$2" "$3")"); }
elapsed() { echo $(( $(date +%s) - start )); }

# The packed build (pack.sh's loom-device.tar.xz), unpacked outside the tree; or a build
# directory made on this machine.
if [ -f "$pack/loom-device.tar.xz" ]; then
  rm -rf /tmp/loom-device
  tar -C /tmp -xJf "$pack/loom-device.tar.xz" || { echo "device_check.sh: cannot unpack $pack/loom-device.tar.xz" >&2; exit 2; }
  pack=/tmp/loom-device
fi
if [ ! -x "$pack/bin/loom" ]; then
  echo "device_check.sh: no $pack/bin/loom: pack a build with benchmarks/cuda/pack.sh and carry it" >&2
  exit 2
fi
pack=$(cd "$pack" && pwd)

# ---- 1. The machine and the libraries.
cuda_libs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in sorted(os.listdir(p))))' 2>/dev/null); do
  d=$(readlink -f "$d" 2>/dev/null) || continue
  case ":$cuda_libs:" in *":$d:"*) continue ;; esac
  if ls "$d"/libcublasLt.so* >/dev/null 2>&1 || ls "$d"/libcudart.so* >/dev/null 2>&1; then cuda_libs="$cuda_libs:$d"; fi
done
export LD_LIBRARY_PATH="$pack/lib:$pack/deps${cuda_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LOOM_PLUGIN_PATH=
loom="$pack/bin/loom"
{
  date -u
  nvidia-smi
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ldd "$pack/lib/loom/plugins/cuda-backend-kernels.so"
  "$loom" --version
  "$loom" plugins
} > "$out/machine.log" 2>&1
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
if grep -q "libloom-backend-cuda.so" "$out/machine.log"; then row "plugin listed" ok "${gpu:-no nvidia-smi}"; else row "plugin listed" FAILED "see machine.log"; fi
if ldd "$pack/lib/loom/plugins/cuda-backend-kernels.so" | grep -q "not found"; then
  row "CUDA libraries" FAILED "$(ldd "$pack/lib/loom/plugins/cuda-backend-kernels.so" | grep 'not found' | head -2 | tr '\n' ' ')"
else
  row "CUDA libraries" ok "${cuda_libs#:}"
fi

# ---- 2. The conformance suites (every case: a few thousand small ones).
timeout 240 "$loom" conformance "$pack/lib/loom/plugins/libloom-backend-cuda.so" > "$out/conformance.log" 2>&1
rc=$?
passed=$(grep -c '^\[       OK \]' "$out/conformance.log")
failed=$(grep -c '^\[  FAILED  \] Registered\|^\[  FAILED  \] Operations' "$out/conformance.log")
skipped=$(grep -c '^\[  SKIPPED \] Registered\|^\[  SKIPPED \] Operations' "$out/conformance.log")
if [ $rc -eq 124 ]; then status=TIMEOUT; elif [ $rc -eq 0 ]; then status=ok; else status=FAILED; fi
row "conformance (rc $rc)" "$status" "$passed passed, $failed failed, $skipped skipped ($(elapsed) s)"
grep '^\[  FAILED  \]' "$out/conformance.log" | sort -u | head -20 > "$out/conformance_failures.txt"

# ---- 3. Training on the GPU against reference.
train_args=(train "$here/configs/quickstart.yaml" trainer.num_train_steps=20 trainer.log_every=1
  trainer.train_batch_size=4 trainer.microbatch_size=0 trainer.steps_per_eval=10 trainer.max_eval_batches=1
  trainer.sample_length=0 trainer.trackers=[jsonl] model.seq_len=32 model.num_layers=2)
rm -rf /tmp/loom-dc-ref /tmp/loom-dc-cuda /tmp/loom-dc-mem
timeout 60 "$loom" "${train_args[@]}" backend.type=reference model.attention=naive trainer.run_dir=/tmp/loom-dc-ref \
  > "$out/train_reference.log" 2>&1
ref_rc=$?
timeout 90 "$loom" "${train_args[@]}" backend.type=cuda backend.matmul_precision=f32 trainer.run_dir=/tmp/loom-dc-cuda \
  > "$out/train_cuda.log" 2>&1
cuda_rc=$?
if [ $cuda_rc -eq 0 ] && [ $ref_rc -eq 0 ]; then
  cp /tmp/loom-dc-cuda/metrics.jsonl "$out/metrics_cuda.jsonl" 2>/dev/null
  worst=$(python3 - <<'EOF' 2>&1
import json
def losses(path):
    return [json.loads(l)["train/loss"] for l in open(path) if '"train/loss"' in l]
a, b = losses("/tmp/loom-dc-cuda/metrics.jsonl"), losses("/tmp/loom-dc-ref/metrics.jsonl")
print("%d steps, max |loss - reference| %.2e" % (len(a), max(abs(x - y) for x, y in zip(a, b)) if a and len(a) == len(b) else float("nan")))
EOF
)
  row "train quickstart, cuda vs ref" ok "$worst"
else
  row "train quickstart, cuda vs ref" "rc $cuda_rc" "$(grep -m1 -i 'error' "$out/train_cuda.log" | cut -c1-150)"
fi
# The memory check reads the GPU's free memory: a run far too large for 141 GB is refused, naming it.
timeout 60 "$loom" "${train_args[@]}" backend.type=cuda model.hidden_dim=65536 model.num_heads=64 \
  trainer.run_dir=/tmp/loom-dc-mem > "$out/memory_check.log" 2>&1
mem_rc=$?
if grep -q "cuda:0 free memory" "$out/memory_check.log"; then
  row "memory check reads the GPU" ok "$(grep -o 'is available (cuda:0 free memory [^)]*)' "$out/memory_check.log" | head -1)"
else
  row "memory check reads the GPU" "rc $mem_rc" "$(grep -m1 -i 'error' "$out/memory_check.log" | cut -c1-150)"
fi

# ---- 4. GEMMs: loom's cuBLASLt path, and PyTorch's matmul (cuBLAS) on the same shapes.
timeout 120 "$loom" bench gemm --backends cuda --dtypes f32,bf16 --tokens 8192 --repeats 20 --no-libraries \
  > "$out/bench_gemm.log" 2>&1
rc=$?
row "loom bench gemm (rc $rc)" "$([ $rc -eq 0 ] && echo ok || echo FAILED)" "bench_gemm.log"
timeout 90 python3 - > "$out/torch_gemm.log" 2>&1 <<'EOF'
import torch
torch.backends.cuda.matmul.allow_tf32 = False
t, d, v = 8192, 768, 50257
shapes = {"qkv": (t, 3 * d, d, False, False), "attn_out": (t, d, d, False, False), "mlp_up": (t, 4 * d, d, False, False),
          "mlp_down": (t, d, 4 * d, False, False), "mlp_up_dX": (t, d, 4 * d, False, True),
          "mlp_up_dW": (d, 4 * d, t, True, False), "lm_head": (t, v, d, False, True), "lm_head_dW": (v, d, t, True, False)}
for name, (m, n, k, ta, tb) in shapes.items():
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn((k, m) if ta else (m, k), device="cuda", dtype=dtype)
        b = torch.randn((n, k) if tb else (k, n), device="cuda", dtype=dtype)
        a = a.t() if ta else a
        b = b.t() if tb else b
        for _ in range(3): torch.mm(a, b)
        times = []
        for _ in range(20):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); torch.mm(a, b); e.record(); torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
        ms = sorted(times)[len(times) // 2]
        print("%-11s %-5s %9.3f ms %9.1f GFLOP/s" % (name, "f32" if dtype == torch.float32 else "bf16", ms, 2 * m * n * k / ms / 1e6))
EOF
rc=$?
row "torch.mm baseline (rc $rc)" "$([ $rc -eq 0 ] && echo ok || echo FAILED)" "torch_gemm.log"
# loom vs PyTorch per shape and dtype (loom's table: "  cuda  <dtype>  <ms>  <GFLOP/s> ...").
python3 - "$out/bench_gemm.log" "$out/torch_gemm.log" > "$out/gemm_ratio.txt" 2>&1 <<'EOF'
import re, sys
loom, torch = {}, {}
shape = None
for line in open(sys.argv[1]):
    m = re.match(r"^(\w+)  \(m ", line)
    if m: shape = m.group(1)
    m = re.match(r"^\s+cuda\S*\s+(f32|bf16)\s+([\d.]+)\s+([\d.]+)", line)
    if m and shape: loom[(shape, m.group(1))] = float(m.group(3))
for line in open(sys.argv[2]):
    m = re.match(r"^(\w+)\s+(f32|bf16)\s+[\d.]+ ms\s+([\d.]+) GFLOP/s", line)
    if m: torch[(m.group(1), m.group(2))] = float(m.group(3))
for key in sorted(loom):
    if key in torch:
        print("%-11s %-5s loom %9.1f GFLOP/s, torch %9.1f, ratio %.2f" % (key[0], key[1], loom[key], torch[key], loom[key] / torch[key]))
EOF

# ---- 5. The GPU attention kernel: conformance against naive, then speed against PyTorch's SDPA.
timeout 150 "$loom" conformance "$pack/lib/loom/plugins/libloom-attention-cuda-flash.so" > "$out/attention_conformance.log" 2>&1
rc=$?
passed=$(grep -c '^\[       OK \] AttentionConformance' "$out/attention_conformance.log")
failed=$(grep -c '^\[  FAILED  \] AttentionConformance' "$out/attention_conformance.log")
skipped=$(grep -c '^\[  SKIPPED \] AttentionConformance' "$out/attention_conformance.log")
if [ $rc -eq 124 ]; then status=TIMEOUT; elif [ $rc -eq 0 ]; then status=ok; else status=FAILED; fi
row "attention conformance (rc $rc)" "$status" "$passed passed, $failed failed, $skipped skipped ($(elapsed) s)"
grep -A3 'Failure\|error: ' "$out/attention_conformance.log" | head -60 > "$out/attention_failures.txt"
bench_shapes=(--batch 4 --heads 16 --seq-lens 1024,2048,4096,8192 --repeats 5)
: > "$out/bench_attention.log"
: > "$out/torch_sdpa.log"
for hd in 64 128; do
  timeout 100 "$pack/bin/loom_cuda_attention_bench" --plugin-dir "$pack/lib/loom/plugins" --kernels cuda-flash \
    --dtypes bf16,f32 --head-dim $hd "${bench_shapes[@]}" >> "$out/bench_attention.log" 2>&1
  echo "rc $? (head_dim $hd)" >> "$out/bench_attention.log"
  timeout 60 python3 "$here/benchmarks/cuda/sdpa_bench.py" --dtypes bf16,f32 --head-dim $hd "${bench_shapes[@]}" \
    >> "$out/torch_sdpa.log" 2>&1
  echo "rc $? (head_dim $hd)" >> "$out/torch_sdpa.log"
done
# `loom bench attention` by name, the GPU kernel first (the ratios' baseline), the host's flash after.
timeout 90 "$loom" bench attention --kernels cuda-flash,flash --dtypes bf16 --seq-lens 1024 --batch 4 --heads 16 \
  --repeats 3 > "$out/loom_bench_attention.log" 2>&1
rc=$?
row "loom bench attention (rc $rc)" "$([ $rc -eq 0 ] && grep -q 'cuda-flash on cuda:0' "$out/loom_bench_attention.log" \
  && echo ok || echo FAILED)" "loom_bench_attention.log ($(elapsed) s)"
lines=$(grep -c '^kernel cuda-flash' "$out/bench_attention.log")
row "cuda-flash bench" "$([ "$lines" -eq 16 ] && echo ok || echo "$lines/16")" "bench_attention.log ($(elapsed) s)"
lines=$(grep -c '^kernel torch-sdpa' "$out/torch_sdpa.log")
row "torch SDPA baseline" "$([ "$lines" -eq 16 ] && echo ok || echo "$lines/16")" "torch_sdpa.log"
python3 - "$out/bench_attention.log" "$out/torch_sdpa.log" > "$out/attention_ratio.txt" 2>&1 <<'EOF'
import sys
def read(path):
    rows = {}
    for line in open(path):
        if not line.startswith("kernel "):
            continue
        f = line.split()
        kv = dict(zip(f[0::2], f[1::2]))
        rows[(kv["dtype"], int(kv["head_dim"]), int(kv["seq"]))] = (float(kv["fwd_ms"]), float(kv["fwdbwd_ms"]), float(kv["fwdbwd_tflops"]))
    return rows
loom, torch = read(sys.argv[1]), read(sys.argv[2])
print("%-5s %4s %5s %10s %10s %12s %12s %8s %8s" % ("dtype", "hd", "seq", "loom fwd", "torch fwd", "loom f+b", "torch f+b", "f+b x", "TFLOP/s"))
for key in sorted(loom):
    if key in torch:
        l, t = loom[key], torch[key]
        print("%-5s %4d %5d %8.3fms %8.3fms %10.3fms %10.3fms %8.2f %8.1f" % (key[0], key[1], key[2], l[0], t[0], l[1], t[1], t[1] / l[1], l[2]))
print("f+b x: torch's forward+backward time over loom's (above 1: loom faster); TFLOP/s: loom's forward+backward")
EOF

echo "logs in $out ($(elapsed) s in all)"
echo
echo "loom CUDA device check, $(date -u +%Y-%m-%dT%H:%MZ), $(git -C "$here" rev-parse --short HEAD 2>/dev/null)"
printf '%-34s %-10s %s\n' "check" "result" "detail"
for r in "${rows[@]}"; do echo "$r"; done
echo "--- loom / torch GEMM rate"
cat "$out/gemm_ratio.txt"
echo "--- cuda-flash / torch scaled_dot_product_attention (batch 4, 16 heads, causal)"
cat "$out/attention_ratio.txt"
