"""Writes a random-weight Hugging Face model directory of Llama 3 8B's or Qwen 2.5 7B's exact shapes
(issue 22: the QLoRA workload), as save_pretrained writes it: config.json, bf16 safetensors shards
of at most 5 GB (model-00001-of-0000N.safetensors) and model.safetensors.index.json.

    make_hf_model.py llama3-8b|qwen2.5-7b OUT_DIR

Weights are normal(0, 0.02) (norms 1, biases 0), seeded: runs cut at random offsets from 2^26
values drawn once, so the script holds about 1 GB and writes at the disk's speed. NumPy only (no torch): safetensors'
layout is an 8-byte header length, a JSON header, then each tensor's little-endian bytes.
"""

import json
import os
import struct
import sys

import numpy as np

SHAPES = {
    "llama3-8b": dict(
        architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
        max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=8192, rope_type="llama3"),
        hidden_act="silu", attention_bias=False, mlp_bias=False, tie_word_embeddings=False,
        bos_token_id=128000, eos_token_id=128001, initializer_range=0.02, torch_dtype="bfloat16"),
    "qwen2.5-7b": dict(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=3584, intermediate_size=18944,
        num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0, rope_scaling=None,
        hidden_act="silu", tie_word_embeddings=False, use_sliding_window=False, sliding_window=None,
        max_window_layers=28, bos_token_id=151643, eos_token_id=151643, initializer_range=0.02,
        torch_dtype="bfloat16"),
}
MAX_SHARD = 5_000_000_000  # save_pretrained's default max_shard_size


def tensors(c):
    """(name, shape, kind) in save_pretrained's (state_dict) order."""
    h, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    d = c.get("head_dim", h // c["num_attention_heads"])
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    bias = c["model_type"] == "qwen2"
    out = [("model.embed_tokens.weight", (v, h), "normal")]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.append((p + "self_attn.q_proj.weight", (q, h), "normal"))
        if bias:
            out.append((p + "self_attn.q_proj.bias", (q,), "zeros"))
        out.append((p + "self_attn.k_proj.weight", (kv, h), "normal"))
        if bias:
            out.append((p + "self_attn.k_proj.bias", (kv,), "zeros"))
        out.append((p + "self_attn.v_proj.weight", (kv, h), "normal"))
        if bias:
            out.append((p + "self_attn.v_proj.bias", (kv,), "zeros"))
        out.append((p + "self_attn.o_proj.weight", (h, q), "normal"))
        out.append((p + "mlp.gate_proj.weight", (f, h), "normal"))
        out.append((p + "mlp.up_proj.weight", (f, h), "normal"))
        out.append((p + "mlp.down_proj.weight", (h, f), "normal"))
        out.append((p + "input_layernorm.weight", (h,), "ones"))
        out.append((p + "post_attention_layernorm.weight", (h,), "ones"))
    out.append(("model.norm.weight", (h,), "ones"))
    out.append(("lm_head.weight", (v, h), "normal"))
    return out


def bf16(x):
    u = x.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


POOL = 1 << 26  # normal values drawn once (128 MiB of bf16); tensors are cut from it


def write_tensor(out, shape, kind, pool, rng):
    n = int(np.prod(shape))
    if kind != "normal":
        out.write(bf16(np.full(n, 1.0 if kind == "ones" else 0.0, np.float32)).tobytes())
        return
    # Drawing 8 billion normal values takes longer than writing them: each tensor is runs of the
    # pool from random offsets (the codecs and the GEMMs see normal(0, 0.02) values all the same).
    written = 0
    while written < n:
        start = int(rng.integers(0, POOL))
        m = min(n - written, POOL - start)
        out.write(pool[start:start + m].tobytes())
        written += m


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in SHAPES:
        sys.exit(f"usage: {sys.argv[0]} {'|'.join(SHAPES)} OUT_DIR")
    config, out_dir = SHAPES[sys.argv[1]], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    entries = tensors(config)
    shards, size = [[]], 0
    for e in entries:
        nbytes = int(np.prod(e[1])) * 2
        if shards[-1] and size + nbytes > MAX_SHARD:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += nbytes
    rng = np.random.default_rng(22)
    pool = bf16(rng.standard_normal(POOL, dtype=np.float32) * np.float32(0.02))
    weight_map, total = {}, 0
    for s, shard in enumerate(shards):
        name = f"model-{s + 1:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for tname, shape, _ in shard:
            nbytes = int(np.prod(shape)) * 2
            header[tname] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            weight_map[tname] = name
        total += offset
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        with open(os.path.join(out_dir, name), "wb") as out:
            out.write(struct.pack("<Q", len(text)))
            out.write(text)
            for _, shape, kind in shard:
                write_tensor(out, shape, kind, pool, rng)
        print(f"wrote {name}", flush=True)
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    print(f"{out_dir}: {len(entries)} tensors, {total / 1e9:.2f} GB in {len(shards)} shards")


if __name__ == "__main__":
    main()
