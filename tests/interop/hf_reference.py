"""Hugging Face transformers' side of loom's export/import test (hf_interop_test.cpp).

    hf_reference.py WORK_DIR

1. Every directory under WORK_DIR/export (written by `loom export --format hf`) is loaded with
   AutoModelForCausalLM.from_pretrained; its logits on seeded random tokens go to
   WORK_DIR/export_results/NAME.safetensors ("tokens", "logits"), what from_pretrained reported
   (missing, unexpected, mismatched keys) to NAME.json. Where the export has tokenizer files,
   AutoTokenizer's ids of a fixed text go to the same file ("tokenizer_ids").
2. Models with seeded random weights (GPT-2, Llama, Mistral, Qwen2) are saved with save_pretrained
   into WORK_DIR/import/NAME (one sharded, one rewritten the way OpenAI's hub GPT-2 file is: no
   "transformer." prefix, with the attn.bias / attn.masked_bias buffers), with their logits in
   NAME.expected.safetensors and the loom model options that describe them in NAME.loom.json.

Exits 77 when transformers cannot be imported.
"""

import json
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


def check_exports(work):
    export_dir = os.path.join(work, "export")
    out_dir = os.path.join(work, "export_results")
    os.makedirs(out_dir, exist_ok=True)
    for name in sorted(os.listdir(export_dir)):
        path = os.path.join(export_dir, name)
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            path, attn_implementation="eager", output_loading_info=True
        )
        config = model.config
        positions = getattr(config, "n_positions", None) or config.max_position_embeddings
        tokens = seeded_tokens(config.vocab_size, min(12, positions), 1234)
        out = {"tokens": tokens.to(torch.int32).contiguous(), "logits": logits_of(model, tokens)}
        if os.path.exists(os.path.join(path, "tokenizer_config.json")):
            tokenizer = transformers.AutoTokenizer.from_pretrained(path)
            out["tokenizer_ids"] = torch.tensor(tokenizer(TEXT)["input_ids"], dtype=torch.int32)
        save_file(out, os.path.join(out_dir, name + ".safetensors"))
        report = {
            "class": type(model).__name__,
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
    tokens = seeded_tokens(model.config.vocab_size, seq, 99)
    save_file(
        {"tokens": tokens.to(torch.int32).contiguous(), "logits": logits_of(model, tokens)},
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


def main():
    work = sys.argv[1]
    transformers.logging.set_verbosity_error()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    check_exports(work)
    make_imports(work)


if __name__ == "__main__":
    main()
