"""transformers' side of loom's model agreement test (hf_agreement_test.cpp).

    hf_agreement.py WORK_DIR

For each case, a transformers model (Qwen2ForCausalLM, Gemma2ForCausalLM, MixtralForCausalLM)
with a small config and seeded random weights is saved with save_pretrained into WORK_DIR/NAME,
the loom model options that describe it go to NAME.loom.json, and a batch with the reference
results to NAME.expected.safetensors: "tokens", "targets" (-1: ignored), "logits", "loss" (mean
cross-entropy of the targets given the logits, plus the router's auxiliary loss times its
coefficient where the model has one) and "grad.<name>", the gradient of that loss with respect
to every parameter under transformers' names. Float32, eager attention.

Exits 77 when transformers cannot be imported.
"""

import json
import os
import sys

try:
    import torch
    import torch.nn.functional as F
    import transformers
    from safetensors.torch import save_file
except ImportError as e:  # the test skips, saying why
    print(f"transformers is not available: {e}", file=sys.stderr)
    sys.exit(77)

VOCAB = 300


def randomize(model, seed):
    # Every parameter away from its initialisation, so a tensor mapped to the wrong place shows.
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5) if "norm" in name else p.normal_(0.0, 0.2)
            else:
                p.normal_(0.0, 0.3)


def full_causal_mask(forward):
    # The attention of a layer below max_window_layers: the model's (windowed) additive mask
    # replaced by the plain causal one.
    def patched(*args, attention_mask=None, **kwargs):
        if attention_mask is not None:
            n = attention_mask.shape[-1]
            causal = torch.full((n, n), torch.finfo(attention_mask.dtype).min).triu(1)
            attention_mask = causal.expand_as(attention_mask).to(attention_mask.dtype)
        return forward(*args, attention_mask=attention_mask, **kwargs)
    return patched


def batch(seed, batch_size=2, seq=13):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (batch_size, seq), generator=g)
    targets = torch.randint(0, VOCAB, (batch_size, seq), generator=g)
    targets[0, 3] = -1
    targets[1, 0] = -1
    return tokens, targets


def run_case(work, name, model, loom_options, seed, aux_coef=0.0):
    model.eval()  # no dropout (every probability is 0 anyway)
    randomize(model, seed)
    directory = os.path.join(work, name)
    model.save_pretrained(directory, safe_serialization=True)
    tokens, targets = batch(seed + 100)
    kwargs = {}
    if aux_coef:
        kwargs["output_router_logits"] = True
    out = model(input_ids=tokens, attention_mask=torch.ones_like(tokens), use_cache=False, **kwargs)
    logits = out.logits.float()
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
    if aux_coef:
        loss = loss + aux_coef * out.aux_loss
    model.zero_grad()
    loss.backward()
    tensors = {
        "tokens": tokens.to(torch.int32).contiguous(),
        "targets": targets.to(torch.int32).contiguous(),
        "logits": logits.detach().contiguous(),
        "loss": loss.detach().reshape(1).contiguous(),
    }
    for pname, p in model.named_parameters():
        tensors["grad." + pname] = p.grad.detach().float().contiguous()
    save_file(tensors, os.path.join(work, name + ".expected.safetensors"))
    with open(os.path.join(work, name + ".loom.json"), "w") as f:
        json.dump(loom_options, f)


def main():
    work = sys.argv[1]
    os.makedirs(work, exist_ok=True)
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    eager = {"attn_implementation": "eager"}
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")

    config = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                      rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, **eager)
    loom = {"type": "llama", "seq_len": 32, "hidden_dim": 32, "intermediate_dim": 64, "num_layers": 2,
            "num_heads": 4, "num_kv_heads": 2, "qkv_bias": True, "rope": {"theta": 1000000.0},
            "layer_norm_epsilon": 1e-6, "tie_word_embeddings": True, "vocab_size": VOCAB}
    run_case(work, "qwen2", transformers.Qwen2ForCausalLM(config), loom, 1)

    # Qwen2's sliding window (window 4 over 13 positions). transformers 4.46.3's eager attention
    # builds one windowed mask for every layer (it warns that max_window_layers is honoured by
    # flash_attention_2 only), so max_window_layers 0 is plain transformers; for max_window_layers 2
    # of 3, layers 0 and 1 are given the full causal mask, which is the rule of its
    # flash_attention_2 path (layer_idx >= max_window_layers uses the window).
    for name, max_window_layers, seed in (("qwen2_window", 0, 4), ("qwen2_window_layers", 2, 5)):
        config = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                          rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                                          use_sliding_window=True, sliding_window=4,
                                          max_window_layers=max_window_layers, **eager)
        model = transformers.Qwen2ForCausalLM(config)
        for layer in model.model.layers[:max_window_layers]:
            layer.self_attn.forward = full_causal_mask(layer.self_attn.forward)
        loom = {"type": "llama", "seq_len": 32, "hidden_dim": 32, "intermediate_dim": 64, "num_layers": 3,
                "num_heads": 4, "num_kv_heads": 2, "qkv_bias": True, "rope": {"theta": 1000000.0},
                "layer_norm_epsilon": 1e-6, "tie_word_embeddings": True, "vocab_size": VOCAB,
                "sliding_window": 4, "max_window_layers": max_window_layers}
        run_case(work, name, model, loom, seed)

    # Sliding window 4 on layers 0 and 2; soft-caps small enough to bend the scores and logits.
    config = transformers.Gemma2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                       query_pre_attn_scalar=24, attn_logit_softcapping=5.0,
                                       final_logit_softcapping=8.0, sliding_window=4, max_position_embeddings=32,
                                       **eager)
    loom = {"type": "gemma", "seq_len": 32, "hidden_dim": 32, "intermediate_dim": 64, "num_layers": 3,
            "num_heads": 4, "num_kv_heads": 2, "head_dim": 16, "query_pre_attn_scalar": 24,
            "attn_logit_softcapping": 5.0, "final_logit_softcapping": 8.0, "sliding_window": 4,
            "vocab_size": VOCAB}
    run_case(work, "gemma2", transformers.Gemma2ForCausalLM(config), loom, 2)

    if True:
        config = transformers.MixtralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=24,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.05,
                                            max_position_embeddings=32, sliding_window=None, rms_norm_eps=1e-5,
                                            **eager)
        loom = {"type": "llama", "seq_len": 32, "hidden_dim": 32, "intermediate_dim": 24, "num_layers": 2,
                "num_heads": 4, "num_kv_heads": 2, "rope": {"theta": 1000000.0}, "layer_norm_epsilon": 1e-5,
                "vocab_size": VOCAB,
                "moe": {"num_experts": 4, "experts_per_token": 2, "router_softmax": "after_top_k",
                        "router_aux_loss_coef": 0.05}}
        run_case(work, "mixtral", transformers.MixtralForCausalLM(config), loom, 3, aux_coef=0.05)


if __name__ == "__main__":
    main()
