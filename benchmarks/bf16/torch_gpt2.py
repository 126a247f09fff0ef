#!/usr/bin/python3
"""GPT-2 small + AdamW training steps in PyTorch, float32 or bf16 autocast: the baseline that
benchmarks/bf16/run.sh compares loom against.

A hand-written GPT-2 (Radford et al. 2019; the 124M configuration: 12 layers, 12 heads, 768 wide,
50257-token vocabulary, tied embeddings), trained on random tokens with AdamW. bf16 uses
torch.autocast("cpu", dtype=torch.bfloat16): the matrix products in bf16 (oneDNN), parameters,
optimizer state and the loss in float32, which is the precision policy loom's
backend.matmul_precision: bf16 follows.

    OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 benchmarks/bf16/torch_gpt2.py --seq 256 --dtype bf16

Prints one line: "ms_per_step <median ms over the steps after the warm-up> tokens_per_second <...>".
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x, mask):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        att = F.softmax(scores.masked_fill(mask[:t, :t], float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, vocab=50257, seq=1024, d=768, layers=12, heads=12):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1))
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens, targets):
        t = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(t))
        for block in self.blocks:
            x = block(x, self.mask)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied output layer
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--dtype", choices=["f32", "bf16"], default="bf16")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT2()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1)
    gen = torch.Generator().manual_seed(1)
    times = []
    for step in range(args.warmup + args.steps):
        tokens = torch.randint(0, 50257, (args.batch, args.seq + 1), generator=gen)
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            loss = model(tokens[:, :-1], tokens[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    times.sort()
    ms = 1000.0 * times[len(times) // 2]
    print("ms_per_step %.1f tokens_per_second %.1f loss %.4f" % (ms, 1000.0 * args.batch * args.seq / ms, loss.item()))


if __name__ == "__main__":
    main()
