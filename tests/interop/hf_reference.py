"""Hugging Face transformers' side of loom's export/import test (hf_interop_test.cpp).

    hf_reference.py WORK_DIR

1. Every directory under WORK_DIR/export (written by `loom export --format hf`) is loaded with
   AutoModelForCausalLM.from_pretrained; its logits on seeded random tokens go to
   WORK_DIR/export_results/NAME.safetensors ("tokens", "logits"), what from_pretrained reported
   (missing, unexpected, mismatched keys) to NAME.json. Where the export has tokenizer files,
   AutoTokenizer's ids of a fixed text go to the same file ("tokenizer_ids").
2. Models with seeded random weights (GPT-2, Llama, Mistral, Qwen2, Qwen3) are saved with save_pretrained
   into WORK_DIR/import/NAME (one sharded, one rewritten the way OpenAI's hub GPT-2 file is: no
   "transformer." prefix, with the attn.bias / attn.masked_bias buffers), with their logits in
   NAME.expected.safetensors and the loom model options that describe them in NAME.loom.json.

Qwen3 (model_type "qwen3") arrived in transformers 4.51. With an older transformers (the reference
environment's 4.46.3) a Qwen3 directory is read, and the Qwen3 import case written, by Qwen3Reference
below: Qwen3ForCausalLM's forward as transformers 4.51's modeling_qwen3.py computes it, written out
over the directory's config.json (Qwen3Config's defaults for absent fields) and tensors, whose names
and shapes must be exactly the ones Qwen3ForCausalLM declares. The report's "implementation" says
which read each directory.

Exits 77 when transformers cannot be imported.
"""

import json
import math
import os
import sys

try:
    import torch
    import transformers
    from safetensors.torch import load_file, save_file
except ImportError as e:  # the test skips, saying why
    print(f"transformers is not available: {e}", file=sys.stderr)
    sys.exit(77)

TEXT = "Hello world, this is loom's export.<|endoftext|> Again: 42 tokens\n\tand   spaces."


def seeded_tokens(vocab, seq, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (2, seq), generator=g, dtype=torch.int64)


def logits_of(model, tokens):
    model.eval()
    with torch.no_grad():
        return model(input_ids=tokens).logits.float().contiguous()


class Qwen3Reference:
    """Qwen3ForCausalLM (transformers 4.51, modeling_qwen3.py) in plain PyTorch, float32, eager
    attention, for a transformers that predates it. Each layer: RMSNorm; q, k, v projections
    (no biases); RMSNorm over each head of q and of k (q_norm, k_norm: [head_dim]) before
    rotate-half RoPE; grouped-query causal attention scaled by head_dim^-1/2; o projection;
    residual; RMSNorm; SwiGLU MLP; residual. A final RMSNorm and the head (the embedding when
    tied). No RoPE scaling and no sliding window (refused)."""

    # Qwen3Config.__init__'s defaults (transformers 4.51).
    DEFAULTS = dict(vocab_size=151936, hidden_size=4096, intermediate_size=22016, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=32, head_dim=128, hidden_act="silu",
                    max_position_embeddings=32768, initializer_range=0.02, rms_norm_eps=1e-6,
                    tie_word_embeddings=False, rope_theta=10000.0, rope_scaling=None, attention_bias=False,
                    use_sliding_window=False, sliding_window=4096, max_window_layers=28, attention_dropout=0.0)

    def __init__(self, config, state=None):
        self.config = dict(self.DEFAULTS, **config)
        c = self.config
        if c["num_key_value_heads"] is None:
            c["num_key_value_heads"] = c["num_attention_heads"]
        if c["rope_scaling"] is not None or c["use_sliding_window"] or c["attention_bias"] or c["hidden_act"] != "silu":
            raise ValueError("Qwen3Reference computes unscaled RoPE, no window, no biases, SiLU only")
        self.state = state if state is not None else {}

    def shapes(self):
        """The tensors Qwen3ForCausalLM declares, with their shapes (its state_dict)."""
        c = self.config
        hidden, heads, kv, d = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        out = {"model.embed_tokens.weight": (c["vocab_size"], hidden), "model.norm.weight": (hidden,)}
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            out.update({p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
                        p + "self_attn.q_proj.weight": (heads * d, hidden),
                        p + "self_attn.k_proj.weight": (kv * d, hidden),
                        p + "self_attn.v_proj.weight": (kv * d, hidden),
                        p + "self_attn.o_proj.weight": (hidden, heads * d),
                        p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
                        p + "mlp.gate_proj.weight": (c["intermediate_size"], hidden),
                        p + "mlp.up_proj.weight": (c["intermediate_size"], hidden),
                        p + "mlp.down_proj.weight": (hidden, c["intermediate_size"])})
        if not c["tie_word_embeddings"]:
            out["lm_head.weight"] = (c["vocab_size"], hidden)
        return out

    @classmethod
    def from_pretrained(cls, path):
        """The model of a directory, and from_pretrained's report: missing, unexpected and
        mis-shaped tensors."""
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
        index = os.path.join(path, "model.safetensors.index.json")
        state = {}
        if os.path.exists(index):
            with open(index) as f:
                for file in sorted(set(json.load(f)["weight_map"].values())):
                    state.update(load_file(os.path.join(path, file)))
        else:
            state = load_file(os.path.join(path, "model.safetensors"))
        model = cls(config, {k: v.float() for k, v in state.items()})
        shapes = model.shapes()
        info = {"missing_keys": sorted(set(shapes) - set(state)),
                "unexpected_keys": sorted(set(state) - set(shapes)),
                "mismatched_keys": sorted(k for k in set(shapes) & set(state) if tuple(state[k].shape) != shapes[k])}
        return model, info

    def randomize(self, seed):
        # As randomize() below: norms in [0.5, 1.5], matrices normal(0, 0.3).
        torch.manual_seed(seed)
        self.state = {}
        for name, shape in self.shapes().items():
            self.state[name] = (torch.empty(shape).uniform_(0.5, 1.5) if len(shape) == 1
                                else torch.empty(shape).normal_(0.0, 0.3))

    def save_pretrained(self, directory):
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "config.json"), "w") as f:
            json.dump(dict(self.config, model_type="qwen3", architectures=["Qwen3ForCausalLM"], torch_dtype="float32"),
                      f, indent=2)
        save_file({k: v.contiguous() for k, v in self.state.items()}, os.path.join(directory, "model.safetensors"),
                  metadata={"format": "pt"})

    def logits(self, tokens):
        c, w = self.config, self.state
        heads, kv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        eps = c["rms_norm_eps"]
        batch, seq = tokens.shape

        def rms(x, weight):  # Qwen3RMSNorm: in float32, weight times the normalised input
            return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

        def rotate_half(x):
            return torch.cat((-x[..., d // 2:], x[..., : d // 2]), dim=-1)

        inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        freqs = torch.arange(seq).float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        causal = torch.full((seq, seq), float("-inf")).triu(1)

        h = w["model.embed_tokens.weight"][tokens]
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            x = rms(h, w[p + "input_layernorm.weight"])
            q = rms((x @ w[p + "self_attn.q_proj.weight"].T).view(batch, seq, heads, d), w[p + "self_attn.q_norm.weight"])
            k = rms((x @ w[p + "self_attn.k_proj.weight"].T).view(batch, seq, kv, d), w[p + "self_attn.k_norm.weight"])
            v = (x @ w[p + "self_attn.v_proj.weight"].T).view(batch, seq, kv, d)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            k, v = (t.repeat_interleave(heads // kv, dim=1) for t in (k, v))  # repeat_kv
            scores = q @ k.transpose(2, 3) / math.sqrt(d) + causal
            a = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(batch, seq, heads * d)
            h = h + a @ w[p + "self_attn.o_proj.weight"].T
            x = rms(h, w[p + "post_attention_layernorm.weight"])
            gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
            h = h + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
        head = w["model.embed_tokens.weight"] if c["tie_word_embeddings"] else w["lm_head.weight"]
        return (rms(h, w["model.norm.weight"]) @ head.T).contiguous()


def has_qwen3():
    return hasattr(transformers, "Qwen3ForCausalLM")


def check_exports(work):
    export_dir = os.path.join(work, "export")
    out_dir = os.path.join(work, "export_results")
    os.makedirs(out_dir, exist_ok=True)
    for name in sorted(os.listdir(export_dir)):
        path = os.path.join(export_dir, name)
        with open(os.path.join(path, "config.json")) as f:
            model_type = json.load(f).get("model_type")
        if model_type == "qwen3" and not has_qwen3():
            model, info = Qwen3Reference.from_pretrained(path)
            class_name, implementation = "Qwen3ForCausalLM", "Qwen3Reference (hf_reference.py)"
            tokens = seeded_tokens(model.config["vocab_size"], min(12, model.config["max_position_embeddings"]), 1234)
            with torch.no_grad():
                logits = model.logits(tokens)
        else:
            model, info = transformers.AutoModelForCausalLM.from_pretrained(
                path, attn_implementation="eager", output_loading_info=True
            )
            class_name, implementation = type(model).__name__, f"transformers {transformers.__version__}"
            config = model.config
            positions = getattr(config, "n_positions", None) or config.max_position_embeddings
            tokens = seeded_tokens(config.vocab_size, min(12, positions), 1234)
            logits = logits_of(model, tokens)
        out = {"tokens": tokens.to(torch.int32).contiguous(), "logits": logits}
        if os.path.exists(os.path.join(path, "tokenizer_config.json")):
            tokenizer = transformers.AutoTokenizer.from_pretrained(path)
            out["tokenizer_ids"] = torch.tensor(tokenizer(TEXT)["input_ids"], dtype=torch.int32)
        save_file(out, os.path.join(out_dir, name + ".safetensors"))
        report = {
            "class": class_name,
            "implementation": implementation,
            "missing": list(info["missing_keys"]),
            "unexpected": list(info["unexpected_keys"]),
            "mismatched": [str(m) for m in info["mismatched_keys"]],
        }
        with open(os.path.join(out_dir, name + ".json"), "w") as f:
            json.dump(report, f)


def randomize(model, seed):
    # Every parameter away from its initialisation (norm weights off 1, biases off 0), so that a
    # tensor mapped to the wrong place cannot go unnoticed.
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5) if "norm" in name or "ln_" in name else p.normal_(0.0, 0.2)
            else:
                p.normal_(0.0, 0.3)


def save_case(work, name, model, loom_options, seq, **save_args):
    directory = os.path.join(work, "import", name)
    model.save_pretrained(directory, **save_args)
    if isinstance(model, Qwen3Reference):
        tokens = seeded_tokens(model.config["vocab_size"], seq, 99)
        with torch.no_grad():
            logits = model.logits(tokens)
    else:
        tokens = seeded_tokens(model.config.vocab_size, seq, 99)
        logits = logits_of(model, tokens)
    save_file(
        {"tokens": tokens.to(torch.int32).contiguous(), "logits": logits},
        os.path.join(work, "import", name + ".expected.safetensors"),
    )
    with open(os.path.join(work, "import", name + ".loom.json"), "w") as f:
        json.dump(loom_options, f)
    return directory


def as_hub_gpt2(directory, layers, positions):
    # OpenAI's GPT-2 on the hub: names without "transformer.", causal masks saved as tensors.
    state = load_file(os.path.join(directory, "model.safetensors"))
    hub = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in state.items()}
    for i in range(layers):
        hub[f"h.{i}.attn.bias"] = torch.tril(torch.ones(positions, positions)).view(1, 1, positions, positions)
        hub[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(hub, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})


def make_imports(work):
    os.makedirs(os.path.join(work, "import"), exist_ok=True)
    eager = {"attn_implementation": "eager"}
    vocab = 300

    config = transformers.GPT2Config(
        vocab_size=vocab, n_positions=16, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0
    )
    model = transformers.GPT2LMHeadModel(config)
    randomize(model, 1)
    loom = {"type": "gpt2", "seq_len": 16, "hidden_dim": 32, "num_layers": 2, "num_heads": 4, "vocab_size": vocab}
    as_hub_gpt2(save_case(work, "gpt2_hub", model, loom, 12), 2, 16)

    config = transformers.GPT2Config(
        vocab_size=vocab, n_positions=16, n_embd=32, n_layer=2, n_head=4, n_inner=64, resid_pdrop=0, embd_pdrop=0,
        attn_pdrop=0, scale_attn_by_inverse_layer_idx=True, tie_word_embeddings=False, layer_norm_epsilon=1e-6
    )
    model = transformers.GPT2LMHeadModel(config)
    randomize(model, 2)
    loom = {"type": "gpt2", "seq_len": 16, "hidden_dim": 32, "num_layers": 2, "num_heads": 4, "mlp_scale": 2,
            "vocab_size": vocab, "scale_attn_by_inverse_layer_idx": True, "tie_word_embeddings": False,
            "layer_norm_epsilon": 1e-6}
    save_case(work, "gpt2_untied", model, loom, 16)

    shape = {"vocab_size": vocab, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "max_position_embeddings": 32}
    loom_shape = {"type": "llama", "seq_len": 32, "hidden_dim": 32, "intermediate_dim": 64, "num_layers": 2,
                  "num_heads": 4, "vocab_size": vocab}

    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8}
    config = transformers.LlamaConfig(**shape, num_key_value_heads=2, rope_theta=500000.0, rope_scaling=rope,
                                      rms_norm_eps=1e-5, **eager)
    model = transformers.LlamaForCausalLM(config)
    randomize(model, 3)
    loom = dict(loom_shape, num_kv_heads=2, layer_norm_epsilon=1e-5,
                rope={"type": "llama3", "theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8})
    save_case(work, "llama_sharded", model, loom, 20, max_shard_size="20KB")

    config = transformers.LlamaConfig(**shape, num_key_value_heads=4, head_dim=16, attention_bias=True, mlp_bias=True,
                                      tie_word_embeddings=True, rope_scaling={"rope_type": "linear", "factor": 2.0},
                                      **eager)
    model = transformers.LlamaForCausalLM(config)
    randomize(model, 4)
    loom = dict(loom_shape, num_kv_heads=4, head_dim=16, use_bias=True, tie_word_embeddings=True,
                layer_norm_epsilon=1e-6, rope={"factor": 2.0})
    save_case(work, "llama_bias_tied", model, loom, 16)

    config = transformers.MistralConfig(**shape, num_key_value_heads=1, sliding_window=4, **eager)
    model = transformers.MistralForCausalLM(config)
    randomize(model, 5)
    loom = dict(loom_shape, num_kv_heads=1, sliding_window=4, layer_norm_epsilon=1e-6)
    save_case(work, "mistral_window", model, loom, 12)

    config = transformers.Qwen2Config(**shape, num_key_value_heads=2, tie_word_embeddings=True, **eager)
    model = transformers.Qwen2ForCausalLM(config)
    randomize(model, 6)
    loom = dict(loom_shape, num_kv_heads=2, qkv_bias=True, tie_word_embeddings=True, layer_norm_epsilon=1e-6)
    save_case(work, "qwen2_tied", model, loom, 12)

    # Qwen3: a head width (16) other than hidden / heads (8), q/k norms, tied, RoPE base 1e6.
    qwen3 = dict(shape, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, rope_theta=1e6)
    if has_qwen3():
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**qwen3, **eager))
        randomize(model, 7)
    else:
        model = Qwen3Reference(qwen3)
        model.randomize(7)
    loom = dict(loom_shape, num_kv_heads=2, head_dim=16, use_qk_norm=True, tie_word_embeddings=True,
                layer_norm_epsilon=1e-6, rope={"theta": 1e6})
    save_case(work, "qwen3_tied", model, loom, 12)


def main():
    work = sys.argv[1]
    transformers.logging.set_verbosity_error()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; Qwen3 read by "
          + ("transformers" if has_qwen3() else "Qwen3Reference (this transformers predates Qwen3)"))
    check_exports(work)
    make_imports(work)


if __name__ == "__main__":
    main()
