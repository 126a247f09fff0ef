#!/usr/bin/python3
"""Independent PyTorch implementations of tiny GPT-2 and Llama models, for loom's agreement test.

Usage: reference_models.py OUT_DIR

For each case it draws random float32 weights and a batch, runs the forward and backward pass in
PyTorch, and writes two safetensors files (plain struct + json, no `safetensors` package):

  OUT_DIR/<case>.weights.safetensors  the weights under loom's parameter names, and in
                                      __metadata__ the loom model options as JSON ("model")
  OUT_DIR/<case>.data.safetensors     input.tokens, input.targets (-1 = ignored), input.segments
                                      (packed cases), expected.loss, expected.logits and
                                      grad.<parameter> for every parameter

The C++ side (torch_agreement_test.cpp) loads the weights into loom's model and compares. Nothing
here calls loom: the models are written from the papers' equations (GPT-2: Radford et al. 2019;
Llama: Touvron et al. 2023, with Hugging Face's rotate-half RoPE layout and Llama 3.1's frequency
rescaling; Qwen3's per-head qk RMSNorm; Mistral's sliding window).
"""

import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F


# ---------------------------------------------------------------------------------------------
# safetensors, by hand


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, torch tensor of dtype float32 or int32)."""
    codes = {torch.float32: "F32", torch.int32: "I32"}
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    blobs = []
    offset = 0
    for name, t in tensors:
        t = t.detach().contiguous().cpu()
        data = t.numpy().tobytes()
        header[name] = {"dtype": codes[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode("utf-8")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------------------------------------
# Shared pieces


def attention(q, k, v, scale, segments=None, window=0):
    """q [B, Hq, T, D], k and v [B, Hq, T, D] (already repeated for GQA). Causal."""
    T = q.shape[2]
    i = torch.arange(T).view(T, 1)
    j = torch.arange(T).view(1, T)
    visible = j <= i
    if window:
        visible = visible & (i - j < window)
    visible = visible.view(1, 1, T, T)
    if segments is not None:
        visible = visible & (segments[:, None, :, None] == segments[:, None, None, :])
    scores = (q @ k.transpose(-2, -1)) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def loss_of(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1).long(), ignore_index=-1)


def normal(shape, std, gen):
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * std).float()


# ---------------------------------------------------------------------------------------------
# GPT-2


def gpt2_weights(cfg, vocab, gen):
    C, L, S = cfg["hidden_dim"], cfg["num_layers"], cfg["seq_len"]
    M = C * cfg.get("mlp_scale", 4)
    bias = cfg.get("use_bias", True)
    w = {"wte.weight": normal((vocab, C), 0.3, gen), "wpe.weight": normal((S, C), 0.3, gen)}
    for l in range(L):
        p = f"h.{l}."
        w[p + "ln_1.weight"] = 1 + normal((C,), 0.2, gen)
        if bias:
            w[p + "ln_1.bias"] = normal((C,), 0.2, gen)
        w[p + "attn.c_attn.weight"] = normal((C, 3 * C), 0.3, gen)  # Conv1D: [in, out]
        if bias:
            w[p + "attn.c_attn.bias"] = normal((3 * C,), 0.2, gen)
        w[p + "attn.c_proj.weight"] = normal((C, C), 0.2, gen)
        if bias:
            w[p + "attn.c_proj.bias"] = normal((C,), 0.2, gen)
        w[p + "ln_2.weight"] = 1 + normal((C,), 0.2, gen)
        if bias:
            w[p + "ln_2.bias"] = normal((C,), 0.2, gen)
        w[p + "mlp.c_fc.weight"] = normal((C, M), 0.3, gen)
        if bias:
            w[p + "mlp.c_fc.bias"] = normal((M,), 0.2, gen)
        w[p + "mlp.c_proj.weight"] = normal((M, C), 0.2, gen)
        if bias:
            w[p + "mlp.c_proj.bias"] = normal((C,), 0.2, gen)
    w["ln_f.weight"] = 1 + normal((C,), 0.2, gen)
    if bias:
        w["ln_f.bias"] = normal((C,), 0.2, gen)
    if not cfg.get("tie_word_embeddings", True):
        w["lm_head.weight"] = normal((vocab, C), 0.3, gen)
    return w


def gpt2_logits(w, cfg, tokens, segments):
    C, L, H = cfg["hidden_dim"], cfg["num_layers"], cfg["num_heads"]
    D = C // H
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    B, T = tokens.shape
    get = w.get

    def ln(x, name):
        return F.layer_norm(x, (C,), w[name + ".weight"], get(name + ".bias"), eps)

    def lin(x, name):  # Conv1D
        y = x @ w[name + ".weight"]
        return y + w[name + ".bias"] if name + ".bias" in w else y

    h = w["wte.weight"][tokens.long()] + w["wpe.weight"][:T][None]
    for l in range(L):
        p = f"h.{l}."
        qkv = lin(ln(h, p + "ln_1"), p + "attn.c_attn")
        q, k, v = (t.reshape(B, T, H, D).transpose(1, 2) for t in qkv.split(C, dim=-1))
        scale = 1.0 / math.sqrt(D)
        if cfg.get("scale_attn_by_inverse_layer_idx", False):
            scale /= l + 1
        y = attention(q, k, v, scale, segments).transpose(1, 2).reshape(B, T, C)
        h = h + lin(y, p + "attn.c_proj")
        m = F.gelu(lin(ln(h, p + "ln_2"), p + "mlp.c_fc"), approximate="tanh")
        h = h + lin(m, p + "mlp.c_proj")
    x = ln(h, "ln_f")
    head = w["wte.weight"] if cfg.get("tie_word_embeddings", True) else w["lm_head.weight"]
    return x @ head.t()


# ---------------------------------------------------------------------------------------------
# Llama


def rope_inverse_frequencies(cfg, D):
    rope = cfg.get("rope", {})
    kind = rope.get("type", "default")
    theta = rope.get("theta") or (500000.0 if kind == "llama3" else 10000.0)
    factor = rope.get("factor") or (8.0 if kind == "llama3" else 1.0)
    inv = [1.0 / theta ** (2 * i / D) for i in range(D // 2)]
    if kind == "default":
        return [f / factor for f in inv]  # linear scaling (position interpolation)
    # Llama 3.1 (transformers' _compute_llama3_parameters)
    low, high = rope.get("low_freq_factor", 1.0), rope.get("high_freq_factor", 4.0)
    old = rope.get("original_max_position_embeddings", 8192)
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(f)
        elif wavelen > old / low:
            out.append(f / factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return out


def apply_rope(x, cos, sin):
    """x [B, H, T, D]; cos, sin [T, D/2]. Hugging Face's rotate-half layout: pairs (i, i + D/2)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def llama_dims(cfg):
    C, H, KV = cfg["hidden_dim"], cfg["num_heads"], cfg["num_kv_heads"]
    D = cfg.get("head_dim") or C // H
    return C, H, KV, D


def llama_weights(cfg, vocab, gen):
    C, H, KV, D = llama_dims(cfg)
    L, M = cfg["num_layers"], cfg["intermediate_dim"]
    bias = cfg.get("use_bias", False)
    w = {"embed_tokens.weight": normal((vocab, C), 0.5, gen)}
    for l in range(L):
        p = f"layers.{l}."
        w[p + "input_layernorm.weight"] = 1 + normal((C,), 0.2, gen)
        # Separate q, k and v here; loom's fused qkv_proj is their concatenation (see below).
        w[p + "q"] = normal((H * D, C), 0.3, gen)
        w[p + "k"] = normal((KV * D, C), 0.3, gen)
        w[p + "v"] = normal((KV * D, C), 0.3, gen)
        if bias:
            w[p + "qb"] = normal((H * D,), 0.2, gen)
            w[p + "kb"] = normal((KV * D,), 0.2, gen)
            w[p + "vb"] = normal((KV * D,), 0.2, gen)
        if cfg.get("use_qk_norm", False):
            w[p + "self_attn.q_norm.weight"] = 1 + normal((D,), 0.2, gen)
            w[p + "self_attn.k_norm.weight"] = 1 + normal((D,), 0.2, gen)
        w[p + "self_attn.o_proj.weight"] = normal((C, H * D), 0.2, gen)
        w[p + "post_attention_layernorm.weight"] = 1 + normal((C,), 0.2, gen)
        w[p + "mlp.gate_proj.weight"] = normal((M, C), 0.3, gen)
        w[p + "mlp.up_proj.weight"] = normal((M, C), 0.3, gen)
        w[p + "mlp.down_proj.weight"] = normal((C, M), 0.2, gen)
        if bias:
            w[p + "self_attn.o_proj.bias"] = normal((C,), 0.2, gen)
            w[p + "mlp.gate_proj.bias"] = normal((M,), 0.2, gen)
            w[p + "mlp.up_proj.bias"] = normal((M,), 0.2, gen)
            w[p + "mlp.down_proj.bias"] = normal((C,), 0.2, gen)
    w["norm.weight"] = 1 + normal((C,), 0.2, gen)
    if not cfg.get("tie_word_embeddings", False):
        w["lm_head.weight"] = normal((vocab, C), 0.3, gen)
    return w


def llama_to_loom(w, cfg):
    """loom's names: q, k and v rows concatenated into self_attn.qkv_proj."""
    out = {}
    for name, t in w.items():
        stem, _, leaf = name.rpartition(".")
        if leaf in ("q", "k", "v", "qb", "kb", "vb"):
            continue
        out[name] = t
    for l in range(cfg["num_layers"]):
        p = f"layers.{l}."
        out[p + "self_attn.qkv_proj.weight"] = torch.cat([w[p + "q"], w[p + "k"], w[p + "v"]], dim=0)
        if p + "qb" in w:
            out[p + "self_attn.qkv_proj.bias"] = torch.cat([w[p + "qb"], w[p + "kb"], w[p + "vb"]], dim=0)
    return out


def llama_logits(w, cfg, tokens, segments):
    C, H, KV, D = llama_dims(cfg)
    L = cfg["num_layers"]
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    window = cfg.get("sliding_window") or 0
    B, T = tokens.shape

    def rms(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def lin(x, weight, bias=None):
        y = x @ weight.t()
        return y if bias is None else y + bias

    inv = torch.tensor(rope_inverse_frequencies(cfg, D), dtype=torch.float64)
    angles = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = angles.cos().float(), angles.sin().float()

    h = w["embed_tokens.weight"][tokens.long()]
    for l in range(L):
        p = f"layers.{l}."
        x = rms(h, w[p + "input_layernorm.weight"])
        q = lin(x, w[p + "q"], w.get(p + "qb")).view(B, T, H, D)
        k = lin(x, w[p + "k"], w.get(p + "kb")).view(B, T, KV, D)
        v = lin(x, w[p + "v"], w.get(p + "vb")).view(B, T, KV, D)
        if cfg.get("use_qk_norm", False):
            q = rms(q, w[p + "self_attn.q_norm.weight"])
            k = rms(k, w[p + "self_attn.k_norm.weight"])
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k = k.repeat_interleave(H // KV, dim=1)  # query head h reads key/value head h // (H / KV)
        v = v.repeat_interleave(H // KV, dim=1)
        y = attention(q, k, v, 1.0 / math.sqrt(D), segments, window).transpose(1, 2).reshape(B, T, H * D)
        h = h + lin(y, w[p + "self_attn.o_proj.weight"], w.get(p + "self_attn.o_proj.bias"))
        x = rms(h, w[p + "post_attention_layernorm.weight"])
        gate = lin(x, w[p + "mlp.gate_proj.weight"], w.get(p + "mlp.gate_proj.bias"))
        up = lin(x, w[p + "mlp.up_proj.weight"], w.get(p + "mlp.up_proj.bias"))
        h = h + lin(F.silu(gate) * up, w[p + "mlp.down_proj.weight"], w.get(p + "mlp.down_proj.bias"))
    x = rms(h, w["norm.weight"])
    head = w["embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else w["lm_head.weight"]
    return x @ head.t()


# ---------------------------------------------------------------------------------------------
# Cases

VOCAB = 61

CASES = {
    # tied embeddings, biases, a few ignored targets
    "gpt2": dict(type="gpt2", seq_len=16, hidden_dim=32, num_layers=2, num_heads=4, vocab_size=VOCAB),
    # untied, no biases, Mistral's inverse-layer scaling, two documents packed per row
    "gpt2_packed_untied": dict(type="gpt2", seq_len=16, hidden_dim=24, num_layers=3, num_heads=3, mlp_scale=2,
                               use_bias=False, tie_word_embeddings=False, scale_attn_by_inverse_layer_idx=True,
                               layer_norm_epsilon=1e-4, vocab_size=VOCAB),
    # grouped-query attention (4 query heads over 2 key/value heads), plain RoPE
    "llama": dict(type="llama", seq_len=16, hidden_dim=32, intermediate_dim=48, num_layers=2, num_heads=4,
                  num_kv_heads=2, rope=dict(type="default", theta=10000.0), vocab_size=VOCAB),
    # Llama 3.1 RoPE rescaling (short original context so that it bites), Qwen3 qk-norm, biases,
    # tied embeddings, head_dim != hidden_dim / num_heads
    "llama3_qk_norm": dict(type="llama", seq_len=16, hidden_dim=32, intermediate_dim=40, num_layers=2, num_heads=6,
                           num_kv_heads=3, head_dim=8, use_qk_norm=True, use_bias=True, tie_word_embeddings=True,
                           rope=dict(type="llama3", theta=500.0, factor=4.0, low_freq_factor=1.0,
                                     high_freq_factor=4.0, original_max_position_embeddings=16),
                           layer_norm_epsilon=1e-6, vocab_size=VOCAB),
    # Mistral: sliding window of 5, multi-query attention, linear RoPE scaling, packed documents
    "mistral_window": dict(type="llama", seq_len=16, hidden_dim=32, intermediate_dim=48, num_layers=2, num_heads=4,
                           num_kv_heads=1, sliding_window=5, rope=dict(type="default", theta=1000.0, factor=2.0),
                           vocab_size=VOCAB),
}

PACKED = {"gpt2_packed_untied", "mistral_window"}

# Cases also run under torch.autocast("cpu", dtype=torch.bfloat16) (matrix products in bf16,
# parameters and their gradients in float32): the references of loom's matmul_precision: bf16.
BF16 = {"gpt2", "llama"}


def make_batch(name, gen, B=2, T=13):
    tokens = torch.randint(0, VOCAB, (B, T), generator=gen, dtype=torch.int32)
    targets = torch.randint(0, VOCAB, (B, T), generator=gen, dtype=torch.int32)
    targets[0, 3] = -1
    targets[1, T - 1] = -1
    segments = None
    if name in PACKED:
        segments = torch.zeros(B, T, dtype=torch.int32)
        segments[0, 5:] = 1
        segments[1, 2:9] = 1
        segments[1, 9:] = 2
    return tokens, targets, segments


def run_case(name, cfg, out_dir, seed):
    gen = torch.Generator().manual_seed(seed)
    is_gpt2 = cfg["type"] == "gpt2"
    weights = (gpt2_weights if is_gpt2 else llama_weights)(cfg, VOCAB, gen)
    tokens, targets, segments = make_batch(name, gen)
    for t in weights.values():
        t.requires_grad_(True)
    logits = (gpt2_logits if is_gpt2 else llama_logits)(weights, cfg, tokens, segments)
    loss = loss_of(logits, targets)
    loss.backward()

    params = weights if is_gpt2 else llama_to_loom(weights, cfg)
    grads = {n: t.grad for n, t in weights.items()}
    grads = grads if is_gpt2 else llama_to_loom(grads, cfg)
    write_safetensors(os.path.join(out_dir, name + ".weights.safetensors"), sorted(params.items()),
                      {"model": json.dumps(cfg), "case": name})
    data = [("input.tokens", tokens), ("input.targets", targets)]
    if segments is not None:
        data.append(("input.segments", segments))
    data.append(("expected.loss", loss.detach().reshape(())))
    data.append(("expected.logits", logits.detach()))
    data += [("grad." + n, g) for n, g in sorted(grads.items())]
    if name in BF16:
        for t in weights.values():
            t.grad = None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits16 = (gpt2_logits if is_gpt2 else llama_logits)(weights, cfg, tokens, segments)
        loss16 = loss_of(logits16.float(), targets)
        loss16.backward()
        grads16 = {n: t.grad for n, t in weights.items()}
        grads16 = grads16 if is_gpt2 else llama_to_loom(grads16, cfg)
        data.append(("bf16.expected.loss", loss16.detach().reshape(())))
        data.append(("bf16.expected.logits", logits16.detach().float()))
        data += [("bf16.grad." + n, g) for n, g in sorted(grads16.items())]
    write_safetensors(os.path.join(out_dir, name + ".data.safetensors"), data, {"case": name})


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    torch.set_num_threads(1)
    for i, (name, cfg) in enumerate(CASES.items()):
        run_case(name, cfg, out_dir, 1000 + i)


if __name__ == "__main__":
    main()
