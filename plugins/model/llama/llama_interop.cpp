// The `llama` model's Hugging Face mapping (llama, mistral, qwen2, qwen3, mixtral): config.json from the built model
// (HfModel::hf_config), the tensor layout, the check of a directory's config.json against the
// model (check_hf_config, under HfModel::hf_config_mismatches), and the other way, config.json to
// the loom `model` section before any model exists (HfArchitectures, for `loom eval HF_DIR`).
#include <loom/hf_architecture.hpp>
#include <loom/hf_interop.hpp>
#include <string>
#include <vector>

#include "llama_model.hpp"

namespace loom::llama {

loom::Value LlamaModel::hf_config() const {
  require_built("hf_config");
  const std::string type = hf_model_type();
  loom::Value c = loom::Value::map();
  const char* architecture = type == "llama"     ? "LlamaForCausalLM"
                             : type == "mistral" ? "MistralForCausalLM"
                             : type == "mixtral" ? "MixtralForCausalLM"
                             : type == "qwen2"   ? "Qwen2ForCausalLM"
                                                 : "Qwen3ForCausalLM";
  c.set("architectures", loom::Value::List{loom::Value(architecture)});
  c.set("model_type", type);
  c.set("vocab_size", vocab_);
  c.set("hidden_size", o_.hidden_dim);
  c.set("intermediate_size", o_.intermediate_dim);
  c.set("num_hidden_layers", o_.num_layers);
  c.set("num_attention_heads", o_.num_heads);
  c.set("num_key_value_heads", o_.num_kv_heads);
  if (type != "qwen2" && type != "mixtral") c.set("head_dim", o_.head_dim);  // those two derive it
  c.set("hidden_act", "silu");
  c.set("max_position_embeddings", o_.seq_len);
  c.set("initializer_range", o_.initializer_range);
  c.set("rms_norm_eps", o_.layer_norm_epsilon);
  c.set("rope_theta", o_.rope_options.theta);
  if (type != "mistral" && type != "mixtral") c.set("rope_scaling", hf_rope_scaling());
  c.set("tie_word_embeddings", o_.tie_word_embeddings);
  c.set("attention_dropout", 0.0);
  if (type == "llama") {
    c.set("attention_bias", o_.use_bias);
    c.set("mlp_bias", o_.use_bias);
    c.set("pretraining_tp", 1);
  } else if (type == "mistral") {
    c.set("sliding_window", o_.sliding_window);
  } else if (type == "mixtral") {
    c.set("sliding_window", o_.sliding_window > 0 ? loom::Value(o_.sliding_window) : loom::Value());
    c.set("num_local_experts", o_.moe.num_experts);
    c.set("num_experts_per_tok", o_.moe.experts_per_token);
    c.set("router_aux_loss_coef", o_.moe.aux_loss_coef);
    c.set("output_router_logits", false);
    c.set("router_jitter_noise", 0.0);
  } else {
    // Qwen3's attention_bias would put biases on q, k, v and o; loom exports Qwen3 without.
    if (type == "qwen3") c.set("attention_bias", false);
    // Qwen2Config and Qwen3Config: layers with index >= max_window_layers use the window when
    // use_sliding_window.
    c.set("use_sliding_window", o_.sliding_window > 0);
    if (o_.sliding_window > 0) {
      c.set("sliding_window", o_.sliding_window);
      c.set("max_window_layers", o_.max_window_layers);
    }
  }
  return c;
}

loom::HfTensorLayout LlamaModel::hf_tensors() const {
  require_built("hf_tensors");
  loom::HfTensorLayout layout =
      loom::models::llama_layout(store_, vocab_, o_.num_heads, o_.num_kv_heads, o_.head_dim, o_.moe.num_experts);
  // Older transformers saved each layer's RoPE frequencies; they are recomputed from rope_theta.
  layout.ignored_suffixes = {".rotary_emb.inv_freq"};
  if (o_.tie_word_embeddings) layout.ignored_suffixes.push_back("lm_head.weight");
  return layout;
}

void LlamaModel::check_hf_config(loom::HfConfigCheck& check, const std::string& type, const loom::Value& config) const {
  const std::string& at = o_.path;
  if (type == "mixtral") return check_mixtral_config(check, config);
  if (o_.moe.num_experts > 0)
    check.mismatch(at + ".moe.num_experts is " + std::to_string(o_.moe.num_experts) + ", and " + type +
                   " checkpoints have a dense MLP (a Mixtral checkpoint has model_type \"mixtral\")");
  // An absent field takes its config class's default, as transformers 4.46.3 reads it
  // (LlamaConfig, MistralConfig, Qwen2Config; Qwen3Config as 4.51 reads it: they agree on those
  // checked here unless noted); tests/interop/hf_config_defaults_test.cpp checks each against
  // transformers.
  const bool qwen = type == "qwen2" || type == "qwen3";
  check.expect_integer("vocab_size", qwen ? 151936 : 32000, vocab_, "vocab_size");
  check.expect_integer("hidden_size", 4096, o_.hidden_dim, "hidden_dim");
  check.expect_integer("intermediate_size",
                       type == "mistral" ? 14336
                       : qwen            ? 22016
                                         : 11008,
                       o_.intermediate_dim, "intermediate_dim");
  check.expect_integer("num_hidden_layers", 32, o_.num_layers, "num_layers");
  const std::int64_t heads = check.integer("num_attention_heads", 32);
  check.expect_integer("num_attention_heads", 32, o_.num_heads, "num_heads");
  // Absent: LlamaConfig's None (as many as the query heads), MistralConfig's 8, Qwen2Config's
  // and Qwen3Config's 32; an explicit null is as many as the query heads in all of them.
  check.expect_integer("num_key_value_heads",
                       present(config, "num_key_value_heads") ? heads
                       : type == "mistral"                    ? 8
                       : qwen                                 ? 32
                                                              : heads,
                       o_.num_kv_heads, "num_kv_heads");
  const std::int64_t hidden = check.integer("hidden_size", 4096);
  const std::int64_t derived_head_dim = heads > 0 ? hidden / heads : 0;
  if (type == "qwen2") {
    if (o_.head_dim != derived_head_dim)
      check.mismatch("Qwen2's head width is hidden_size / num_attention_heads = " + std::to_string(derived_head_dim) +
                     ", " + at + ".head_dim is " + std::to_string(o_.head_dim));
  } else if (type == "qwen3") {
    check.expect_integer("head_dim", 128, o_.head_dim, "head_dim");  // Qwen3Config's default, not derived
  } else if (type == "mistral" && check.integer("head_dim", derived_head_dim) == 0) {
    // MistralConfig: `head_dim or hidden_size // num_attention_heads`, so 0 derives it too.
    if (o_.head_dim != derived_head_dim)
      check.differ("head_dim", std::to_string(derived_head_dim), "head_dim", std::to_string(o_.head_dim));
  } else {
    check.expect_integer("head_dim", derived_head_dim, o_.head_dim, "head_dim");
  }
  const std::string act = check.string("hidden_act", "silu");
  if (act != "silu")
    check.mismatch("hidden_act is " + loom::Value(act).describe() + "; loom's llama uses SiLU (SwiGLU)");
  check.expect_number("rms_norm_eps", 1e-6, o_.layer_norm_epsilon, "layer_norm_epsilon");
  check.expect_number("rope_theta", 10000.0, o_.rope_options.theta, "rope.theta");
  check_rope_scaling(check, type);
  check.expect_boolean("tie_word_embeddings", false, o_.tie_word_embeddings, "tie_word_embeddings");
  if (type == "qwen3" && !o_.use_qk_norm)
    check.mismatch(at + ".use_qk_norm is false, and Qwen3 checkpoints have q/k norms (self_attn.q_norm, k_norm)");
  if (type != "qwen3" && o_.use_qk_norm)
    check.mismatch(at + ".use_qk_norm is true, and " + type + " checkpoints have no q/k norms");

  // Biases: Llama's attention_bias (q, k, v, o) and mlp_bias; Mistral has none; Qwen2 has them
  // on q, k and v only; Qwen3's attention_bias (q, k, v, o, never the MLP) has no loom
  // counterpart, so only its default, none, is read.
  const bool qkv = o_.use_bias || o_.qkv_bias;
  if (type == "llama") {
    check.expect_boolean("attention_bias", false, o_.use_bias, "use_bias");
    check.expect_boolean("mlp_bias", false, o_.use_bias, "use_bias");
    if (o_.qkv_bias && !o_.use_bias)
      check.mismatch(at +
                     ".qkv_bias is true, and Llama checkpoints have biases on q, k, v and o together "
                     "(attention_bias) or none");
  } else if (type == "mistral") {
    if (qkv)
      check.mismatch(std::string("Mistral checkpoints have no biases, ") + at + "." +
                     (o_.use_bias ? "use_bias" : "qkv_bias") + " is true");
  } else if (type == "qwen3") {
    if (check.boolean("attention_bias", false))
      check.mismatch(
          "attention_bias is true (biases on q, k, v and o without the MLP's); loom's llama has biases on q, k and "
          "v (qkv_bias) or on every projection (use_bias)");
    if (qkv)
      check.mismatch(std::string("Qwen3 checkpoints without attention_bias have no biases, ") + at + "." +
                     (o_.use_bias ? "use_bias" : "qkv_bias") + " is true");
  } else {
    if (!o_.qkv_bias || o_.use_bias)
      check.mismatch("Qwen2 checkpoints have biases on q, k and v only; set " + at + ".qkv_bias: true and " + at +
                     ".use_bias: false");
  }

  // Sliding window: Mistral's on every layer (null: none), none in Llama, Qwen2's and Qwen3's on
  // the layers from max_window_layers on when use_sliding_window.
  std::int64_t window = 0;
  if (type == "mistral") {
    // MistralConfig's default is 4096; an explicit null is no window.
    const loom::Value* given = config.is_map() ? config.find("sliding_window") : nullptr;
    window = given && given->is_null() ? 0 : check.integer("sliding_window", 4096);
  } else if (qwen && check.boolean("use_sliding_window", false)) {
    // Qwen2Config's and Qwen3Config's defaults: 4096 and 28; a null window is none.
    const loom::Value* given = config.is_map() ? config.find("sliding_window") : nullptr;
    window = given && given->is_null() ? 0 : check.integer("sliding_window", 4096);
    if (window > 0) check.expect_integer("max_window_layers", 28, o_.max_window_layers, "max_window_layers");
  }
  if (type == "mistral") check_window_on_every_layer(check, type);
  if (window != o_.sliding_window)
    check.mismatch("sliding_window is " + (window > 0 ? std::to_string(window) : std::string("null")) + ", " + at +
                   ".sliding_window is " +
                   (o_.sliding_window > 0 ? std::to_string(o_.sliding_window) : std::string("null")));
}

// Whether config.json has `key`, null or not: transformers' config classes give an absent field
// their default and some give a null one another value.
bool LlamaModel::present(const loom::Value& config, const char* key) {
  return config.is_map() && config.find(key) != nullptr;
}

// The Hugging Face architecture that computes what this model computes.
std::string LlamaModel::hf_model_type() const {
  const std::string& at = o_.path;
  if (o_.moe.num_experts > 0) {
    if (o_.use_qk_norm || o_.use_bias || o_.qkv_bias)
      throw loom::UserError(at + ".moe with biases or qk-norm has no Hugging Face architecture (Mixtral has neither)");
    if (!o_.moe.softmax_after_top_k)
      throw loom::UserError(at + ".moe.router_softmax is before_top_k; Mixtral's router is after_top_k");
    if (o_.rope_options.type != "default" || o_.rope_options.factor != 1.0)
      throw loom::UserError(at + ".rope scaling with " + at + ".moe has no Hugging Face architecture");
    if (o_.sliding_window > 0 && o_.max_window_layers > 0)
      throw loom::UserError(at + ".max_window_layers with " + at +
                            ".moe has no Hugging Face architecture (Mixtral windows every layer)");
    if (o_.head_dim * o_.num_heads != o_.hidden_dim)
      throw loom::UserError(at + ".head_dim (" + std::to_string(o_.head_dim) +
                            ") must be hidden_dim / num_heads to export a mixture of experts as Mixtral");
    return "mixtral";
  }
  if (o_.use_qk_norm) {
    // Qwen3: q/k norms, any head width, no biases (its attention_bias would also bias o, and never
    // the MLP: neither loom's qkv_bias nor its use_bias).
    if (o_.use_bias || o_.qkv_bias)
      throw loom::UserError(at + ".use_qk_norm with " + at + "." + (o_.use_bias ? "use_bias" : "qkv_bias") +
                            " has no Hugging Face architecture (Qwen3, the one with q/k norms, has no biases)");
    return "qwen3";
  }
  if (o_.qkv_bias && !o_.use_bias) {
    if (o_.head_dim * o_.num_heads != o_.hidden_dim)
      throw loom::UserError(at + ".head_dim (" + std::to_string(o_.head_dim) +
                            ") must be hidden_dim / num_heads to export qkv_bias as Qwen2, which derives it");
    return "qwen2";
  }
  if (o_.sliding_window > 0) {
    if (o_.max_window_layers > 0)
      throw loom::UserError(at + ".max_window_layers without " + at +
                            ".qkv_bias has no Hugging Face architecture (Qwen2 has both, Mistral windows every "
                            "layer)");
    if (o_.use_bias)
      throw loom::UserError(at + ".use_bias with " + at +
                            ".sliding_window has no Hugging Face architecture (Mistral has no biases)");
    if (o_.rope_options.type != "default" || o_.rope_options.factor != 1.0)
      throw loom::UserError(at + ".rope scaling with " + at +
                            ".sliding_window has no Hugging Face architecture (Mistral's RoPE is unscaled)");
    return "mistral";
  }
  return "llama";
}

void LlamaModel::check_mixtral_config(loom::HfConfigCheck& check, const loom::Value& config) const {
  const std::string& at = o_.path;
  check.expect_integer("vocab_size", 32000, vocab_, "vocab_size");
  check.expect_integer("hidden_size", 4096, o_.hidden_dim, "hidden_dim");
  check.expect_integer("intermediate_size", 14336, o_.intermediate_dim, "intermediate_dim");
  check.expect_integer("num_hidden_layers", 32, o_.num_layers, "num_layers");
  const std::int64_t heads = check.integer("num_attention_heads", 32);
  check.expect_integer("num_attention_heads", 32, o_.num_heads, "num_heads");
  // MixtralConfig: 8 when absent, as many as the query heads when null.
  check.expect_integer("num_key_value_heads", present(config, "num_key_value_heads") ? heads : 8, o_.num_kv_heads,
                       "num_kv_heads");
  if (heads > 0 && o_.head_dim != check.integer("hidden_size", 4096) / heads)
    check.mismatch("Mixtral's head width is hidden_size / num_attention_heads, " + at + ".head_dim is " +
                   std::to_string(o_.head_dim));
  check.expect_integer("num_local_experts", 8, o_.moe.num_experts, "moe.num_experts");
  check.expect_integer("num_experts_per_tok", 2, o_.moe.experts_per_token, "moe.experts_per_token");
  const std::string act = check.string("hidden_act", "silu");
  if (act != "silu")
    check.mismatch("hidden_act is " + loom::Value(act).describe() + "; loom's experts use SiLU (SwiGLU)");
  check.expect_number("rms_norm_eps", 1e-5, o_.layer_norm_epsilon, "layer_norm_epsilon");
  check.expect_number("rope_theta", 1e6, o_.rope_options.theta, "rope.theta");
  check.expect_boolean("tie_word_embeddings", false, o_.tie_word_embeddings, "tie_word_embeddings");
  if (o_.use_bias || o_.qkv_bias || o_.use_qk_norm)
    check.mismatch("Mixtral checkpoints have no biases and no q/k norms; " + at + " has them");
  if (!o_.moe.softmax_after_top_k)
    check.mismatch(at + ".moe.router_softmax is before_top_k; Mixtral's router is after_top_k");
  if (o_.rope_options.type != "default" || o_.rope_options.factor != 1.0)
    check.mismatch(at + ".rope is scaled; Mixtral's RoPE is not");
  const loom::Value* given = config.is_map() ? config.find("sliding_window") : nullptr;
  const std::int64_t window = !given || given->is_null() ? 0 : check.integer("sliding_window", 0);
  check_window_on_every_layer(check, "mixtral");
  if (window != o_.sliding_window)
    check.mismatch("sliding_window is " + (window > 0 ? std::to_string(window) : std::string("null")) + ", " + at +
                   ".sliding_window is " +
                   (o_.sliding_window > 0 ? std::to_string(o_.sliding_window) : std::string("null")));
}

// Mistral's and Mixtral's window covers every layer; Qwen2's max_window_layers has no
// counterpart there.
void LlamaModel::check_window_on_every_layer(loom::HfConfigCheck& check, const std::string& type) const {
  if (o_.sliding_window > 0 && o_.max_window_layers > 0)
    check.mismatch(o_.path + ".max_window_layers is " + std::to_string(o_.max_window_layers) + ", and " + type +
                   " checkpoints use their window on every layer");
}

// transformers' rope_scaling: null, {"rope_type": "linear", "factor"} or the llama3 rule.
loom::Value LlamaModel::hf_rope_scaling() const {
  const RopeOptions& r = o_.rope_options;
  if (r.type == "default" && r.factor == 1.0) return loom::Value();
  loom::Value s = loom::Value::map();
  s.set("rope_type", r.type == "llama3" ? "llama3" : "linear");
  s.set("factor", r.factor);
  if (r.type == "llama3") {
    s.set("low_freq_factor", r.low_freq_factor);
    s.set("high_freq_factor", r.high_freq_factor);
    s.set("original_max_position_embeddings", r.original_max_position_embeddings);
  }
  return s;
}

void LlamaModel::check_rope_scaling(loom::HfConfigCheck& check, const std::string& type) const {
  const RopeOptions& r = o_.rope_options;
  const std::string& at = o_.path;
  const loom::Value none;
  const loom::Value& scaling = check.field("rope_scaling", none);
  const bool scaled = !(r.type == "default" && r.factor == 1.0);
  if (scaling.is_null() || type == "mistral") {  // Mistral ignores rope_scaling
    if (scaled)
      check.mismatch("rope_scaling is null, " + at + ".rope is " + r.type + " with factor " +
                     loom::Value(r.factor).describe());
    return;
  }
  if (!scaling.is_map()) {
    check.mismatch("rope_scaling is " + scaling.describe() + ", expected null or a map");
    return;
  }
  loom::HfConfigCheck inner(scaling, at + ".rope");
  const std::string kind = inner.string("rope_type", inner.string("type", ""));
  if (kind == "linear") {
    if (r.type != "default") check.mismatch("rope_scaling.rope_type is \"linear\", " + at + ".rope.type is " + r.type);
    inner.expect_number("factor", 1.0, r.factor, "factor");
  } else if (kind == "llama3") {
    if (r.type != "llama3") check.mismatch("rope_scaling.rope_type is \"llama3\", " + at + ".rope.type is " + r.type);
    inner.expect_number("factor", 8.0, r.factor, "factor");
    inner.expect_number("low_freq_factor", 1.0, r.low_freq_factor, "low_freq_factor");
    inner.expect_number("high_freq_factor", 4.0, r.high_freq_factor, "high_freq_factor");
    inner.expect_integer("original_max_position_embeddings", 8192, r.original_max_position_embeddings,
                         "original_max_position_embeddings");
  } else if (kind == "default") {
    if (scaled) check.mismatch("rope_scaling.rope_type is \"default\", " + at + ".rope is " + r.type + " scaling");
  } else {
    check.mismatch("rope_scaling.rope_type is " + loom::Value(kind).describe() +
                   "; loom's llama computes default, linear and llama3 RoPE");
  }
  for (auto& line : inner.take()) check.mismatch("rope_scaling." + line);
}

namespace {

// LlamaConfig's, MistralConfig's, Qwen2Config's, Qwen3Config's and MixtralConfig's fields; absent ones
// take their defaults (transformers 4.46.3; Qwen3Config as 4.51 reads it).
HfModelSection llama_section(const HfConfigFields& f, const std::string& type) {
  HfModelSection section;
  Value& m = section.model;
  m.set("type", "llama");
  const bool mixtral = type == "mixtral", mistral = type == "mistral", qwen3 = type == "qwen3";
  const bool qwen = type == "qwen2" || qwen3;  // Qwen3Config's defaults are Qwen2Config's unless noted
  const std::int64_t hidden = f.size("hidden_size", 4096);
  const std::int64_t heads = f.size("num_attention_heads", 32);
  m.set("seq_len", f.size("max_position_embeddings", mixtral || mistral ? 4096 * 32 : qwen ? 32768 : 2048));
  m.set("hidden_dim", hidden);
  m.set("intermediate_dim", f.size("intermediate_size", mixtral || mistral ? 14336 : qwen ? 22016 : 11008));
  m.set("num_layers", f.size("num_hidden_layers", 32));
  m.set("num_heads", heads);
  // Absent: LlamaConfig's None (as many as the query heads), Mistral's and Mixtral's 8, Qwen2's
  // and Qwen3's 32; null: as many as the query heads.
  m.set("num_kv_heads", f.size("num_key_value_heads", f.has("num_key_value_heads") ? heads
                                                      : mistral || mixtral         ? 8
                                                      : qwen                       ? 32
                                                                                   : heads));
  // Qwen2 and Mixtral derive the head width; Mistral's 0 or null derives it too; Qwen3's is 128
  // when absent.
  const std::int64_t head_dim = qwen3                          ? f.size("head_dim", 128)
                                : qwen || mixtral              ? 0
                                : f.integer("head_dim", 0) > 0 ? f.size("head_dim", 0)
                                                               : 0;
  m.set("head_dim", positive_or_null(head_dim));
  m.set("layer_norm_epsilon", f.number("rms_norm_eps", mixtral ? 1e-5 : 1e-6));
  m.set("initializer_range", f.number("initializer_range", 0.02));
  m.set("tie_word_embeddings", f.boolean("tie_word_embeddings", false));
  m.set("vocab_size", f.size("vocab_size", qwen ? 151936 : 32000));

  Value rope = Value::map();
  rope.set("type", "default");
  rope.set("theta", f.number("rope_theta", mixtral ? 1e6 : 10000.0));
  if (!mistral && !mixtral) {
    // transformers' rope_scaling: {"rope_type" (or the older "type"): "linear" | "llama3" | "default", "factor", ...}
    const std::optional<HfConfigFields> s = f.object("rope_scaling");
    const std::string kind = s ? s->string("rope_type", s->string("type", "default")) : "default";
    if (kind == "linear") {
      rope.set("factor", s->number("factor", 1.0));
    } else if (kind == "llama3") {
      rope.set("type", "llama3");
      rope.set("factor", s->number("factor", 8.0));
      rope.set("low_freq_factor", s->number("low_freq_factor", 1.0));
      rope.set("high_freq_factor", s->number("high_freq_factor", 4.0));
      rope.set("original_max_position_embeddings", s->size("original_max_position_embeddings", 8192));
    } else if (kind != "default") {
      throw UserError("rope_scaling.rope_type is " + Value(kind).describe() +
                      "; loom's llama computes default, linear and llama3 RoPE");
    }
  }
  m.set("rope", rope);

  if (type == "llama") {
    m.set("use_bias", f.boolean("attention_bias", false));
  } else if (qwen3) {
    // Per-head RMSNorm of q and k; no biases (an attention_bias of true is what the plugin's check
    // of config.json then names: loom has no biases on q, k, v and o alone).
    m.set("use_qk_norm", true);
  } else if (qwen) {
    m.set("qkv_bias", true);  // Qwen2's q, k and v projections have biases, the others none
  }

  std::int64_t window = 0;
  if (mistral) {
    window = f.is_null("sliding_window") ? 0 : f.integer("sliding_window", 4096);
  } else if (mixtral) {
    window = f.integer("sliding_window", 0);
  } else if (qwen && f.boolean("use_sliding_window", false)) {
    window = f.is_null("sliding_window") ? 0 : f.integer("sliding_window", 4096);
    if (window > 0) m.set("max_window_layers", f.integer("max_window_layers", 28));
  }
  m.set("sliding_window", positive_or_null(window));

  if (mixtral) {
    Value moe = Value::map();
    moe.set("num_experts", f.size("num_local_experts", 8));
    moe.set("experts_per_token", f.size("num_experts_per_tok", 2));
    moe.set("router_softmax", "after_top_k");
    moe.set("router_aux_loss_coef", f.number("router_aux_loss_coef", 0.001));
    m.set("moe", moe);
  }
  auto size = [&](const char* field, const char* option) { return HfSizeField{field, m.find(option)->as_int()}; };
  section.vocab_size = size("vocab_size", "vocab_size");
  section.hidden_size = size("hidden_size", "hidden_dim");
  section.num_layers = size("num_hidden_layers", "num_layers");
  section.intermediate_size = size("intermediate_size", "intermediate_dim");
  return section;
}

}  // namespace

HfArchitectures hf_architectures() {
  return {.model = "llama",
          .model_types = {"llama", "mistral", "qwen2", "qwen3", "mixtral"},
          .model_section = llama_section};
}

std::vector<HfTokenizerClass> hf_tokenizer_classes() {
  // transformers 4.46's defaults (LlamaTokenizer's and CodeLlamaTokenizer's bos/eos, Qwen2Tokenizer's
  // eos and no bos) and AutoTokenizer's class of each model_type (qwen2_moe's too, which loom's
  // llama does not map).
  return {{.name = "LlamaTokenizer",
           .also = {"CodeLlamaTokenizer"},
           .bos_token = "<s>",
           .eos_token = "</s>",
           .model_types = {"llama", "mistral", "mixtral"}},
          {.name = "Qwen2Tokenizer",
           .bos_token = std::nullopt,
           .eos_token = "<|endoftext|>",
           .model_types = {"qwen2", "qwen3", "qwen2_moe"}}};
}

}  // namespace loom::llama
