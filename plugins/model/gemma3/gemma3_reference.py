"""Gemma 3's text model in plain PyTorch: the reference of loom's gemma3 agreement test.

transformers 4.46.3 (the reference environment's, scripts/setup-python-env.sh) predates Gemma 3,
so this is a port of transformers 4.50.0's Gemma 3 text forward pass to the environment's torch
(1.13), written to compute what the original computes, operation for operation, in float32 with
eager attention:
  * transformers/models/gemma3/modeling_gemma3.py (v4.50.0): Gemma3TextScaledWordEmbedding,
    Gemma3RMSNorm, Gemma3MLP, Gemma3RotaryEmbedding, rotate_half, apply_rotary_pos_emb,
    repeat_kv, eager_attention_forward, Gemma3Attention, Gemma3DecoderLayer (its sliding-window
    mask), Gemma3TextModel (the causal mask of _prepare_4d_causal_attention_mask_with_cache_position,
    the local RoPE with rope_local_base_freq and no scaling) and Gemma3ForCausalLM (the final
    logit soft-cap);
  * transformers/modeling_rope_utils.py (v4.50.0): _compute_default_rope_parameters and
    _compute_linear_scaling_rope_parameters;
  * transformers/models/gemma3/configuration_gemma3.py (v4.50.0): Gemma3TextConfig's defaults.
Left out, as the test never uses them: the KV cache (HybridCache), padding masks, dropout
(attention_dropout is 0), flash/SDPA attention, the vision tower (Gemma3ForConditionalGeneration).
Parameter names are the original's (state_dict keys "model.layers.0.self_attn.q_proj.weight"),
so a directory transformers' save_pretrained writes loads here and the other way round.

    gemma3_reference.py forward HF_DIR BATCH OUT
        Loads HF_DIR (config.json and model.safetensors, e.g. what `loom export --format hf`
        writes), runs the batch of BATCH (a safetensors file with i32 "tokens" and "targets",
        -1 ignored) and writes to OUT "logits", "loss" (mean cross-entropy of the targets) and
        "grad.<name>", the loss's gradient for every parameter under transformers' names.
    gemma3_reference.py make HF_DIR SEED
        Writes a small Gemma 3 with random weights as save_pretrained would (config.json,
        model.safetensors without the tied lm_head.weight): the import direction's source.

Exits 77 when torch or safetensors cannot be imported.
"""

import json
import math
import os
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from safetensors.torch import load_file, save_file
except ImportError as e:  # the test skips, saying why
    print(f"torch is not available: torch or safetensors cannot be imported: {e}", file=sys.stderr)
    sys.exit(77)


# configuration_gemma3.py, Gemma3TextConfig.__init__'s defaults (the fields the forward pass reads).
DEFAULTS = {
    "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131072, "initializer_range": 0.02, "rms_norm_eps": 1e-6, "pad_token_id": 0,
    "tie_word_embeddings": True, "rope_theta": 1000000.0, "attention_bias": False, "attention_dropout": 0.0,
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "final_logit_softcapping": None,
    "attn_logit_softcapping": None, "rope_scaling": None, "rope_local_base_freq": 10000.0,
    "sliding_window_pattern": 6,
}


class Config:
    def __init__(self, fields):
        merged = dict(DEFAULTS)
        merged.update(fields)
        self.__dict__.update(merged)
        if self.hidden_activation != "gelu_pytorch_tanh":
            raise ValueError(f"this port computes gelu_pytorch_tanh only, not {self.hidden_activation}")


class Gemma3TextScaledWordEmbedding(nn.Embedding):
    def __init__(self, num_embeddings, embedding_dim, padding_idx, embed_scale=1.0):
        super().__init__(num_embeddings, embedding_dim, padding_idx)
        self.embed_scale = embed_scale

    def forward(self, input_ids):
        return super().forward(input_ids) * self.embed_scale


class Gemma3MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        # ACT2FN["gelu_pytorch_tanh"] is activations.PytorchGELUTanh: gelu(x, approximate="tanh").
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class Gemma3RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        output = self._norm(x.float())
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)


def rope_inverse_frequencies(config, base, rope_scaling):
    # modeling_rope_utils._compute_default_rope_parameters, then (rope_type "linear")
    # _compute_linear_scaling_rope_parameters's inv_freq /= factor.
    dim = config.head_dim
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    kind = "default"
    if rope_scaling is not None:
        kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
    if kind == "linear":
        inv_freq /= rope_scaling["factor"]
    elif kind != "default":
        raise ValueError(f"this port computes default and linear RoPE only, not {kind}")
    return inv_freq


class Gemma3RotaryEmbedding(nn.Module):
    def __init__(self, config, base, rope_scaling):
        super().__init__()
        self.register_buffer("inv_freq", rope_inverse_frequencies(config, base, rope_scaling), persistent=False)
        self.attention_scaling = 1.0  # default and linear RoPE

    @torch.no_grad()
    def forward(self, x, position_ids):
        inv_freq_expanded = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        position_ids_expanded = position_ids[:, None, :].float()
        freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def eager_attention_forward(module, query, key, value, attention_mask, scaling):
    key_states = repeat_kv(key, module.num_key_value_groups)
    value_states = repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    # (softcap is None: Gemma3Attention passes none, whatever attn_logit_softcapping says)
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask[:, :, :, : key_states.shape[-2]]
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_output = torch.matmul(attn_weights, value_states)
    return attn_output.transpose(1, 2).contiguous()


class Gemma3Attention(nn.Module):
    def __init__(self, config, layer_idx, is_sliding):
        super().__init__()
        self.is_sliding = is_sliding
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = config.query_pre_attn_scalar ** -0.5
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=bias)
        self.sliding_window = config.sliding_window if self.is_sliding else None
        self.q_norm = Gemma3RMSNorm(dim=config.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Gemma3RMSNorm(dim=config.head_dim, eps=config.rms_norm_eps)

    def forward(self, hidden_states, position_embeddings, attention_mask):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        query_states = self.q_norm(query_states)
        key_states = self.k_norm(key_states)
        cos, sin = position_embeddings
        query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)
        attn_output = eager_attention_forward(self, query_states, key_states, value_states, attention_mask,
                                              self.scaling)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output)


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, config, layer_idx, is_sliding):
        super().__init__()
        self.sliding_window = config.sliding_window
        self.self_attn = Gemma3Attention(config, layer_idx, is_sliding)
        self.mlp = Gemma3MLP(config)
        self.input_layernorm = Gemma3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Gemma3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.pre_feedforward_layernorm = Gemma3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_feedforward_layernorm = Gemma3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.is_sliding = self.self_attn.is_sliding

    def forward(self, hidden_states, position_embeddings_global, position_embeddings_local, attention_mask,
                cache_position, last_cache_position):
        if self.is_sliding and attention_mask is not None:
            # The original's non-flash branch: positions at sliding_window or more behind masked.
            effective_seq_len = max(cache_position.shape[0], self.sliding_window)
            min_dtype = torch.finfo(attention_mask.dtype).min
            sliding_window_mask = torch.tril(torch.ones_like(attention_mask, dtype=torch.bool),
                                             diagonal=-self.sliding_window)
            attention_mask = torch.where(sliding_window_mask, min_dtype, attention_mask)
            offset = max(0, last_cache_position - effective_seq_len)
            attention_mask = attention_mask[:, :, :, offset: offset + effective_seq_len]
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        position_embeddings = position_embeddings_local if self.self_attn.is_sliding else position_embeddings_global
        hidden_states = self.self_attn(hidden_states, position_embeddings, attention_mask)
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.pre_feedforward_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = self.post_feedforward_layernorm(hidden_states)
        return residual + hidden_states


def layer_is_sliding(config, layer_idx):
    # 4.50: bool((layer_idx + 1) % config.sliding_window_pattern). transformers 4.53 and later
    # read layer_types instead where a file has it: a file whose two disagree would be two models.
    sliding = bool((layer_idx + 1) % config.sliding_window_pattern)
    types = getattr(config, "layer_types", None)
    if types is not None and (types[layer_idx] == "sliding_attention") != sliding:
        raise ValueError(f"layer_types[{layer_idx}] is {types[layer_idx]!r}, but sliding_window_pattern "
                         f"{config.sliding_window_pattern} makes layer {layer_idx} "
                         f"{'sliding' if sliding else 'global'}: transformers 4.50 and 4.53 would differ")
    return sliding


class Gemma3TextModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed_tokens = Gemma3TextScaledWordEmbedding(config.vocab_size, config.hidden_size, config.pad_token_id,
                                                          embed_scale=config.hidden_size ** 0.5)
        self.layers = nn.ModuleList([Gemma3DecoderLayer(config, i, layer_is_sliding(config, i))
                                     for i in range(config.num_hidden_layers)])
        self.norm = Gemma3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Gemma3RotaryEmbedding(config, config.rope_theta, config.rope_scaling)
        # The original's "hack": the local RoPE is the global one with rope_local_base_freq and
        # rope_scaling {"rope_type": "default"}.
        self.rotary_emb_local = Gemma3RotaryEmbedding(config, config.rope_local_base_freq, {"rope_type": "default"})

    def forward(self, input_ids, attention_mask):
        inputs_embeds = self.embed_tokens(input_ids)
        cache_position = torch.arange(0, inputs_embeds.shape[1])
        position_ids = cache_position.unsqueeze(0)
        last_cache_position = attention_mask.shape[-1]
        causal_mask = causal_4d_mask(attention_mask, inputs_embeds.shape[1], attention_mask.shape[-1],
                                     inputs_embeds.dtype, cache_position, inputs_embeds.shape[0])
        hidden_states = inputs_embeds
        position_embeddings_global = self.rotary_emb(hidden_states, position_ids)
        position_embeddings_local = self.rotary_emb_local(hidden_states, position_ids)
        for decoder_layer in self.layers:
            hidden_states = decoder_layer(hidden_states, position_embeddings_global, position_embeddings_local,
                                          causal_mask, cache_position, last_cache_position)
        return self.norm(hidden_states)


def causal_4d_mask(attention_mask, sequence_length, target_length, dtype, cache_position, batch_size):
    # Gemma3TextModel._prepare_4d_causal_attention_mask_with_cache_position with a 2D mask.
    min_dtype = torch.finfo(dtype).min
    causal_mask = torch.full((sequence_length, target_length), fill_value=min_dtype, dtype=dtype)
    if sequence_length != 1:
        causal_mask = torch.triu(causal_mask, diagonal=1)
    causal_mask *= torch.arange(target_length) > cache_position.reshape(-1, 1)
    causal_mask = causal_mask[None, None, :, :].expand(batch_size, 1, -1, -1)
    causal_mask = causal_mask.clone()
    mask_length = attention_mask.shape[-1]
    padding_mask = causal_mask[:, :, :, :mask_length] + attention_mask[:, None, None, :]
    padding_mask = padding_mask == 0
    causal_mask[:, :, :, :mask_length] = causal_mask[:, :, :, :mask_length].masked_fill(padding_mask, min_dtype)
    return causal_mask


class Gemma3ForCausalLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model = Gemma3TextModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids, attention_mask):
        hidden_states = self.model(input_ids, attention_mask)
        logits = self.lm_head(hidden_states)
        if self.config.final_logit_softcapping is not None:
            logits = logits / self.config.final_logit_softcapping
            logits = torch.tanh(logits)
            logits = logits * self.config.final_logit_softcapping
        return logits


def load(directory):
    with open(os.path.join(directory, "config.json")) as f:
        fields = json.load(f)
    if fields.get("model_type") != "gemma3_text":
        raise ValueError(f"{directory}: model_type is {fields.get('model_type')!r}, expected 'gemma3_text'")
    config = Config(fields)
    model = Gemma3ForCausalLM(config)
    state = load_file(os.path.join(directory, "model.safetensors"))
    state = {k: v.float() for k, v in state.items()}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{directory}: missing tensors {missing}, unexpected {unexpected}")
    return model


def forward(directory, batch_file, out_file):
    model = load(directory)
    model.eval()
    batch = load_file(batch_file)
    tokens = batch["tokens"].long()
    targets = batch["targets"].long()
    logits = model(tokens, torch.ones_like(tokens)).float()
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
    model.zero_grad()
    loss.backward()
    tensors = {"logits": logits.detach().contiguous(), "loss": loss.detach().reshape(1).contiguous()}
    for name, p in model.named_parameters():  # the tied lm_head is model.embed_tokens (named once)
        tensors["grad." + name] = p.grad.detach().float().contiguous()
    save_file(tensors, out_file)


def make(directory, seed):
    # Shapes that exercise every feature: grouped-query attention, the 5:1 pattern over 7 layers
    # (layer 5 global), a window of 4 over 13 positions, the global layers' linear RoPE scaling.
    fields = {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 300,
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 7, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 32, "initializer_range": 0.02, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "attention_bias": False, "attention_dropout": 0.0, "query_pre_attn_scalar": 24, "sliding_window": 4,
        "sliding_window_pattern": 6, "final_logit_softcapping": None, "attn_logit_softcapping": None,
        "tie_word_embeddings": True, "torch_dtype": "float32", "transformers_version": "4.50.0",
        "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0,
    }
    model = Gemma3ForCausalLM(Config(fields))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Every tensor away from its initialisation (the norms' too), so a misplaced one shows.
            p.normal_(0.0, 0.3) if p.dim() == 2 else p.uniform_(-0.5, 0.5)
    os.makedirs(directory, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(fields, f, indent=2)


def main():
    torch.manual_seed(0)
    if len(sys.argv) == 5 and sys.argv[1] == "forward":
        forward(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 4 and sys.argv[1] == "make":
        make(sys.argv[2], int(sys.argv[3]))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    print(f"torch {torch.__version__}")


if __name__ == "__main__":
    main()
