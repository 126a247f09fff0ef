"""PyTorch's scaled_dot_product_attention on the shapes of loom_cuda_attention_bench, for
benchmarks/cuda/device_check.sh: forward and forward+backward, median of CUDA-event timings.

    python3 benchmarks/cuda/sdpa_bench.py --seq-lens 1024,2048,4096,8192 --batch 4 --heads 16 \
        --head-dim 64 --dtypes bf16,f32 [--bidirectional] [--repeats 10]

One line per (dtype, seq_len), as loom_cuda_attention_bench prints them (kernel torch-sdpa), with
the SDPA backend PyTorch chose last. Inputs are [batch, heads, seq, head_dim] tensors of the dtype
(loom's kernel reads float32 operands and rounds them itself: it moves twice the bytes of a bf16
SDPA call).
"""
import argparse

import torch
import torch.nn.functional as F


def median_ms(repeats, fn):
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seq-lens", default="1024,2048,4096,8192")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtypes", default="bf16,f32")
    p.add_argument("--bidirectional", action="store_true")
    p.add_argument("--repeats", type=int, default=10)
    a = p.parse_args()
    causal = not a.bidirectional
    torch.backends.cuda.matmul.allow_tf32 = False
    for seq in [int(s) for s in a.seq_lens.split(",") if s]:
        for name in [d for d in a.dtypes.split(",") if d]:
            dtype = torch.bfloat16 if name == "bf16" else torch.float32
            shape = (a.batch, a.heads, seq, a.head_dim)
            q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
            g = torch.randn(shape, device="cuda", dtype=dtype)

            def forward():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal)

            def both():
                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                o.backward(g)

            forward()
            both()
            torch.cuda.synchronize()
            fwd, fb = median_ms(a.repeats, forward), median_ms(a.repeats, both)
            flops = 4.0 * a.batch * a.heads * seq * seq * a.head_dim * (0.5 if causal else 1.0)
            print("kernel torch-sdpa dtype %s seq %d batch %d heads %d/%d head_dim %d causal %d fwd_ms %.3f "
                  "fwdbwd_ms %.3f fwd_tflops %.2f fwdbwd_tflops %.2f" %
                  (name, seq, a.batch, a.heads, a.heads, a.head_dim, int(causal), fwd, fb, flops / fwd / 1e9,
                   3.5 * flops / fb / 1e9), flush=True)
            del q, k, v, g
    print("torch %s, cuda %s, %s" % (torch.__version__, torch.version.cuda, torch.cuda.get_device_name()))


if __name__ == "__main__":
    main()
