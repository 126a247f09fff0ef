// The `llama` model: Llama (Touvron et al. 2023; Llama 3, Dubey et al. 2024) as Levanter's
// LlamaConfig describes it. RMSNorm pre-norm blocks, rotary position embeddings (optionally with
// Llama 3.1's frequency rescaling), SwiGLU MLP, grouped-query attention; `sliding_window` gives
// Mistral's local attention (with `max_window_layers`, Qwen2's on the upper layers only), `qkv_bias`
// Qwen2's biases on q, k and v, `use_qk_norm` Qwen3's
// per-head RMSNorm of queries and keys (before RoPE), and `moe` Mixtral's sparse mixture of SwiGLU experts in
// place of the MLP (top-k routing, dropless, grouped matrix products over each expert's tokens,
// load-balancing and z auxiliary losses). q, k and v come from one fused projection (qkv_proj, rows
// [q heads | k heads | v heads]); the Hugging Face mapping (loom::HfModel) splits it into
// q_proj, k_proj and v_proj and otherwise keeps transformers' names under "model.".
#include <algorithm>
#include <cmath>
#include <loom/hf_interop.hpp>
#include <loom/kinds/attention.hpp>
#include <loom/kinds/model.hpp>
#include <loom/model_support.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace {

using loom::Ops;
using loom::Parameter;
using loom::ParameterRole;
using loom::Shape;
using loom::Tensor;

// The `rope` options as given (RopeConfig below is what they compute).
struct RopeOptions {
  std::string type;
  double theta, factor, low_freq_factor, high_freq_factor;
  std::int64_t original_max_position_embeddings;
};

// The `moe` options: a sparse mixture of experts in place of each layer's MLP (num_experts > 0).
struct MoeOptions {
  std::int64_t num_experts = 0, experts_per_token = 2;
  bool softmax_after_top_k = true;  // Mixtral; false: DeepSeek's probabilities of the full softmax
  double aux_loss_coef = 0.0, z_loss_coef = 0.0;
};

struct LlamaOptions {
  std::int64_t seq_len, hidden_dim, intermediate_dim, num_layers, num_heads, num_kv_heads, head_dim;
  double initializer_range, layer_norm_epsilon;
  bool tie_word_embeddings, use_bias, qkv_bias, use_qk_norm;
  std::int64_t sliding_window;     // 0: none
  std::int64_t max_window_layers;  // layers below this index attend to everything (Qwen2)
  RopeOptions rope_options;
  loom::RopeConfig rope;
  MoeOptions moe;
  loom::RematPolicy remat = loom::RematPolicy::none;
  std::int64_t vocab_size;  // 0: from the tokenizer
  std::string path;         // of the options in the config ("model"), for messages
};

struct Layer {
  Parameter* input_norm = nullptr;
  Parameter *qkv_weight = nullptr, *qkv_bias = nullptr;
  Parameter *q_norm = nullptr, *k_norm = nullptr;
  Parameter *o_weight = nullptr, *o_bias = nullptr;
  Parameter* post_attention_norm = nullptr;
  Parameter *gate_weight = nullptr, *gate_bias = nullptr;
  Parameter *up_weight = nullptr, *up_bias = nullptr;
  Parameter *down_weight = nullptr, *down_bias = nullptr;
  // Mixture of experts: the router [experts, hidden] and every expert's w1 (gate), w3 (up) and w2
  // (down) stacked along rows: [experts * intermediate, hidden] and [experts * hidden, intermediate].
  Parameter *router = nullptr, *w1 = nullptr, *w3 = nullptr, *w2 = nullptr;
};

// What one layer's router decided in the last forward pass, for the auxiliary losses.
struct RouterRecord {
  Tensor logits, probs;                // [tokens, experts], recorded
  std::vector<std::int64_t> selected;  // tokens * experts_per_token expert ids
};

Tensor value(const Parameter* p) {
  return p ? p->tensor() : Tensor();
}

class LlamaModel final : public loom::models::TransformerLm {
 public:
  LlamaModel(const LlamaOptions& o, loom::Handle<loom::AttentionKernel> kernel, loom::ExecutionContext& execution)
      : TransformerLm(o.path, {"llama", "mistral", "mixtral", "qwen2", "qwen3"},
                      "Llama, Mistral, Mixtral, Qwen2 and Qwen3"),
        o_(o),
        kernel_(std::move(kernel)),
        execution_(&execution) {}

  void build(const loom::ModelSetup& setup) override {
    begin_build(o_.vocab_size, setup);
    const std::int64_t c = o_.hidden_dim, d = o_.head_dim, q = o_.num_heads * d, kv = o_.num_kv_heads * d;
    const std::int64_t mlp = o_.intermediate_dim;
    const bool bias = o_.use_bias;
    store_.declare("embed_tokens.weight", Shape{vocab_, c}, ParameterRole::embedding, &embed_);
    layers_.resize(static_cast<std::size_t>(o_.num_layers));
    for (std::int64_t l = 0; l < o_.num_layers; ++l) {
      Layer& y = layers_[static_cast<std::size_t>(l)];
      const std::string p = "layers." + std::to_string(l) + ".";
      store_.declare(p + "input_layernorm.weight", Shape{c}, ParameterRole::norm, &y.input_norm);
      store_.declare(p + "self_attn.qkv_proj.weight", Shape{q + 2 * kv, c}, ParameterRole::weight, &y.qkv_weight);
      if (bias || o_.qkv_bias)
        store_.declare(p + "self_attn.qkv_proj.bias", Shape{q + 2 * kv}, ParameterRole::bias, &y.qkv_bias);
      if (o_.use_qk_norm) {
        store_.declare(p + "self_attn.q_norm.weight", Shape{d}, ParameterRole::norm, &y.q_norm);
        store_.declare(p + "self_attn.k_norm.weight", Shape{d}, ParameterRole::norm, &y.k_norm);
      }
      store_.declare(p + "self_attn.o_proj.weight", Shape{c, q}, ParameterRole::weight, &y.o_weight);
      if (bias) store_.declare(p + "self_attn.o_proj.bias", Shape{c}, ParameterRole::bias, &y.o_bias);
      store_.declare(p + "post_attention_layernorm.weight", Shape{c}, ParameterRole::norm, &y.post_attention_norm);
      if (o_.moe.num_experts > 0) {
        const std::int64_t e = o_.moe.num_experts;
        const std::string m = p + "block_sparse_moe.";
        store_.declare(m + "gate.weight", Shape{e, c}, ParameterRole::weight, &y.router);
        store_.declare(m + "experts.w1.weight", Shape{e * mlp, c}, ParameterRole::weight, &y.w1);
        store_.declare(m + "experts.w3.weight", Shape{e * mlp, c}, ParameterRole::weight, &y.w3);
        store_.declare(m + "experts.w2.weight", Shape{e * c, mlp}, ParameterRole::weight, &y.w2);
        continue;
      }
      store_.declare(p + "mlp.gate_proj.weight", Shape{mlp, c}, ParameterRole::weight, &y.gate_weight);
      if (bias) store_.declare(p + "mlp.gate_proj.bias", Shape{mlp}, ParameterRole::bias, &y.gate_bias);
      store_.declare(p + "mlp.up_proj.weight", Shape{mlp, c}, ParameterRole::weight, &y.up_weight);
      if (bias) store_.declare(p + "mlp.up_proj.bias", Shape{mlp}, ParameterRole::bias, &y.up_bias);
      store_.declare(p + "mlp.down_proj.weight", Shape{c, mlp}, ParameterRole::weight, &y.down_weight);
      if (bias) store_.declare(p + "mlp.down_proj.bias", Shape{c}, ParameterRole::bias, &y.down_bias);
    }
    store_.declare("norm.weight", Shape{c}, ParameterRole::norm, &norm_);
    if (!o_.tie_word_embeddings) store_.declare("lm_head.weight", Shape{vocab_, c}, ParameterRole::weight, &lm_head_);
    if (!finish_build(setup)) return;
    rope_.emplace(o_.rope, d, o_.seq_len);
  }

  void initialize(std::uint64_t seed) override {
    require_built("initialize");
    // Hugging Face's Llama initialisation: normal(0, initializer_range) for every matrix and the
    // embedding, biases 0, RMSNorm weights 1.
    const auto& params = store_.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const Tensor t = params[i].parameter->data();
      switch (params[i].role) {
        case ParameterRole::norm:
          loom::models::fill_constant(t, 1.0f);
          break;
        case ParameterRole::bias:
          loom::models::fill_constant(t, 0.0f);
          break;
        default:
          loom::models::fill_normal(t, loom::stream_key(seed, 1, i), o_.initializer_range, *execution_);
      }
    }
  }

  std::int64_t max_seq_len() const override { return o_.seq_len; }

  // ---- Hugging Face (transformers' LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM,
  // Qwen2ForCausalLM, Qwen3ForCausalLM) ----

  loom::Value hf_config() const override {
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

  loom::HfTensorLayout hf_tensors() const override {
    require_built("hf_tensors");
    loom::HfTensorLayout layout;
    layout.base_model_prefix = "model";
    const std::int64_t q = o_.num_heads * o_.head_dim, kv = o_.num_kv_heads * o_.head_dim;
    for (const auto& p : store_.parameters()) {
      const std::string& name = p.parameter->name();
      if (name == "lm_head.weight") {
        layout.tensors.push_back({name, name, 0, vocab_});
        continue;
      }
      const auto experts = name.find("block_sparse_moe.experts.");
      if (experts != std::string::npos) {
        // Expert e's matrix is rows [e * n, (e + 1) * n) of the stacked parameter.
        const std::string head = "model." + name.substr(0, experts) + "block_sparse_moe.experts.";
        const std::string tail = name.substr(experts + std::string("block_sparse_moe.experts.").size());  // w1.weight
        const std::int64_t n = p.parameter->data().size(0) / o_.moe.num_experts;
        for (std::int64_t e = 0; e < o_.moe.num_experts; ++e)
          layout.tensors.push_back({head + std::to_string(e) + "." + tail, name, e * n, (e + 1) * n});
        continue;
      }
      loom::models::add_llama_layout_tensors(layout, name, p.parameter->data().size(0), q, kv);
    }
    // Older transformers saved each layer's RoPE frequencies; they are recomputed from rope_theta.
    layout.ignored_suffixes = {".rotary_emb.inv_freq"};
    if (o_.tie_word_embeddings) layout.ignored_suffixes.push_back("lm_head.weight");
    return layout;
  }

 private:
  loom::RematPolicy remat_policy() const override { return o_.remat; }
  loom::models::TransformerShape transformer_shape() const override {
    loom::models::TransformerShape s;
    s.num_layers = o_.num_layers;
    s.hidden_dim = o_.hidden_dim;
    s.num_heads = o_.num_heads;
    s.num_kv_heads = o_.num_kv_heads;
    s.head_dim = o_.head_dim;
    // A mixture of experts runs experts_per_token experts per token, and its router.
    const bool moe = o_.moe.num_experts > 0;
    s.intermediate_dim = o_.intermediate_dim * (moe ? o_.moe.experts_per_token : 1);
    s.glu = true;
    s.vocab_size = vocab_;
    s.sliding_window = o_.sliding_window;
    if (o_.sliding_window > 0 && o_.max_window_layers > 0)
      for (std::int64_t l = 0; l < o_.num_layers; ++l) s.layer_windows.push_back(window_of(l));
    return s;
  }
  // The router's matrix product, [hidden] x [hidden, experts] per layer.
  double extra_flops_per_token() const override {
    const bool moe = o_.moe.num_experts > 0;
    return moe ? 6.0 * static_cast<double>(o_.num_layers * o_.moe.num_experts * o_.hidden_dim) : 0.0;
  }

  void check_hf_config(loom::HfConfigCheck& check, const std::string& type, const loom::Value& config) const override {
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
  static bool present(const loom::Value& config, const char* key) {
    return config.is_map() && config.find(key) != nullptr;
  }

  // The Hugging Face architecture that computes what this model computes.
  std::string hf_model_type() const {
    const std::string& at = o_.path;
    if (o_.moe.num_experts > 0) {
      if (o_.use_qk_norm || o_.use_bias || o_.qkv_bias)
        throw loom::UserError(at +
                              ".moe with biases or qk-norm has no Hugging Face architecture (Mixtral has neither)");
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

  void check_mixtral_config(loom::HfConfigCheck& check, const loom::Value& config) const {
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
  void check_window_on_every_layer(loom::HfConfigCheck& check, const std::string& type) const {
    if (o_.sliding_window > 0 && o_.max_window_layers > 0)
      check.mismatch(o_.path + ".max_window_layers is " + std::to_string(o_.max_window_layers) + ", and " + type +
                     " checkpoints use their window on every layer");
  }

  // The attention window of layer `l`: 0 (none) below max_window_layers, sliding_window above.
  std::int64_t window_of(std::int64_t l) const { return l >= o_.max_window_layers ? o_.sliding_window : 0; }

  // The sparse mixture of experts of layer `y` over x [batch, seq, hidden] (normed):
  //   router logits r = x W_r^T [tokens, experts]; each token's experts_per_token largest;
  //   gate weights: softmax over the chosen logits (after_top_k: Mixtral's renormalised top-k)
  //   or the full softmax's probabilities of the chosen (before_top_k: DeepSeek);
  //   out = sum over the chosen experts of gate * w2(silu(w1 x) * w3 x).
  // Dropless: every expert runs on exactly the tokens routed to it, gathered into one matrix
  // (three matrix products per expert over those rows); the outputs are concatenated and each
  // token's k rows combined with its gate weights in one batched product.
  Tensor moe_block(Ops& ops, const Layer& y, const Tensor& x) {
    const std::int64_t c = o_.hidden_dim, f = o_.intermediate_dim, e_count = o_.moe.num_experts;
    const std::int64_t k = o_.moe.experts_per_token;
    const std::int64_t tokens = x.numel() / c;
    const Tensor xf = x.view(Shape{tokens, c});
    const Tensor logits = ops.linear(xf, y.router->tensor());  // [tokens, experts]
    const Tensor host_logits = logits.is_host_visible() ? logits : logits.to(loom::Device::host());
    const float* r = host_logits.data<float>();

    // Top-k per token (ties: the lower expert id), and each expert's tokens in token order.
    RouterRecord record;
    record.selected.resize(static_cast<std::size_t>(tokens * k));
    std::vector<std::vector<std::int32_t>> routed(static_cast<std::size_t>(e_count));
    std::vector<std::int64_t> order(static_cast<std::size_t>(e_count));
    std::vector<std::int32_t> chosen_logit(static_cast<std::size_t>(tokens * k));
    std::vector<std::int32_t> slot_of(static_cast<std::size_t>(tokens * k));  // (t, j) -> position in expert order
    for (std::int64_t t = 0; t < tokens; ++t) {
      const float* row = r + t * e_count;
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(),
                        [&](std::int64_t a, std::int64_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
      for (std::int64_t j = 0; j < k; ++j) {
        const std::int64_t e = order[static_cast<std::size_t>(j)];
        const auto tj = static_cast<std::size_t>(t * k + j);
        record.selected[tj] = e;
        chosen_logit[tj] = static_cast<std::int32_t>(t * e_count + e);
        slot_of[tj] = static_cast<std::int32_t>(routed[static_cast<std::size_t>(e)].size());
        routed[static_cast<std::size_t>(e)].push_back(static_cast<std::int32_t>(t));
      }
    }
    // slot_of counted within each expert; shift by the rows of the experts before it.
    std::vector<std::int32_t> expert_begin(static_cast<std::size_t>(e_count + 1), 0);
    for (std::int64_t e = 0; e < e_count; ++e)
      expert_begin[static_cast<std::size_t>(e + 1)] =
          expert_begin[static_cast<std::size_t>(e)] +
          static_cast<std::int32_t>(routed[static_cast<std::size_t>(e)].size());
    for (std::size_t tj = 0; tj < slot_of.size(); ++tj)
      slot_of[tj] += expert_begin[static_cast<std::size_t>(record.selected[tj])];

    const auto ids = [](const std::vector<std::int32_t>& v, Shape shape) {
      return Tensor::from(std::span<const std::int32_t>(v), shape);
    };
    const Tensor chosen = ids(chosen_logit, Shape{tokens, k});
    const Tensor probs = ops.softmax(logits);
    const Tensor gates =
        o_.moe.softmax_after_top_k
            ? ops.softmax(ops.embedding(logits.view(Shape{tokens * e_count, 1}), chosen).view(Shape{tokens, k}))
            : ops.embedding(probs.view(Shape{tokens * e_count, 1}), chosen).view(Shape{tokens, k});

    std::vector<Tensor> outputs;
    for (std::int64_t e = 0; e < e_count; ++e) {
      const auto& rows = routed[static_cast<std::size_t>(e)];
      if (rows.empty()) continue;
      const auto n = static_cast<std::int64_t>(rows.size());
      const Tensor xe = ops.embedding(xf, ids(rows, Shape{n}));  // [n, hidden]
      const Tensor gate = ops.linear(xe, y.w1->tensor().slice(0, e * f, (e + 1) * f));
      const Tensor up = ops.linear(xe, y.w3->tensor().slice(0, e * f, (e + 1) * f));
      outputs.push_back(ops.linear(ops.swiglu(gate, up), y.w2->tensor().slice(0, e * c, (e + 1) * c)));
    }
    const Tensor expert_out = ops.concat(outputs);                                  // [tokens * k, hidden]
    const Tensor mine = ops.embedding(expert_out, ids(slot_of, Shape{tokens, k}));  // [tokens, k, hidden]
    const Tensor out = ops.matmul(gates.view(Shape{tokens, 1, k}), mine);           // [tokens, 1, hidden]
    record.logits = logits;
    record.probs = probs;
    routers_.push_back(std::move(record));
    return out.view(x.shape());
  }

  // transformers' rope_scaling: null, {"rope_type": "linear", "factor"} or the llama3 rule.
  loom::Value hf_rope_scaling() const {
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

  void check_rope_scaling(loom::HfConfigCheck& check, const std::string& type) const {
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
      if (r.type != "default")
        check.mismatch("rope_scaling.rope_type is \"linear\", " + at + ".rope.type is " + r.type);
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

  const char* name() const override { return "llama"; }
  CacheShape cache_shape() const override { return {o_.num_layers, o_.num_kv_heads, o_.head_dim}; }

  Tensor head() const override { return o_.tie_word_embeddings ? embed_->tensor() : lm_head_->tensor(); }

  // The final hidden states (after the last RMSNorm) of `tokens` [batch, seq]; with a cache, the
  // tokens follow the cached positions and their keys and values are appended to it.
  Tensor forward(Ops& ops, const Tensor& tokens, const Tensor& segments, loom::models::LayerKvCache* cache) override {
    const std::int64_t batch = tokens.size(0), seq = tokens.size(1), d = o_.head_dim;
    const std::int64_t heads = o_.num_heads, kv_heads = o_.num_kv_heads;
    const std::int64_t offset = cache ? cache->length() : 0;
    const auto eps = static_cast<float>(o_.layer_norm_epsilon);
    loom::AttentionParams params;
    params.causal = true;

    routers_.clear();
    Tensor h = ops.embedding(embed_->tensor(), tokens);
    Tensor x = ops.rms_norm(h, layers_.front().input_norm->tensor(), eps);
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      const loom::models::LayerBody body = [=, this](Ops& ops, Tensor h, Tensor x) {
        const Layer& y = layers_[l];
        // One GEMM for q, k and v; rows of qkv_proj are [q heads | k heads | v heads].
        const Tensor qkv =
            ops.linear(x, y.qkv_weight->tensor(), value(y.qkv_bias)).view(Shape{batch, seq, heads + 2 * kv_heads, d});
        Tensor q = qkv.slice(2, 0, heads);
        Tensor k = qkv.slice(2, heads, heads + kv_heads);
        Tensor v = qkv.slice(2, heads + kv_heads, heads + 2 * kv_heads);
        if (o_.use_qk_norm) {
          q = ops.rms_norm(q, y.q_norm->tensor(), eps);
          k = ops.rms_norm(k, y.k_norm->tensor(), eps);
        }
        q = ops.rope(q, *rope_, Tensor(), offset);
        k = ops.rope(k, *rope_, Tensor(), offset);
        if (cache) std::tie(k, v) = cache->append(static_cast<std::int64_t>(l), k, v);
        loom::AttentionParams layer_params = params;
        layer_params.window = window_of(static_cast<std::int64_t>(l));
        const Tensor a =
            ops.attention(*kernel_, q, k, v, layer_params, segments, segments).view(Shape{batch, seq, heads * d});
        const Tensor attn_out = ops.linear(a, y.o_weight->tensor(), value(y.o_bias));
        std::tie(h, x) = ops.add_rms_norm(h, attn_out, y.post_attention_norm->tensor(), eps);
        Tensor mlp_out;
        if (y.router) {
          mlp_out = moe_block(ops, y, x);
        } else {
          const Tensor gate = ops.linear(x, y.gate_weight->tensor(), value(y.gate_bias));
          const Tensor up = ops.linear(x, y.up_weight->tensor(), value(y.up_bias));
          mlp_out = ops.linear(ops.swiglu(gate, up), y.down_weight->tensor(), value(y.down_bias));
        }
        // The residual add fused with the next norm: the next layer's input norm, or the final one.
        const Parameter* next = l + 1 < layers_.size() ? layers_[l + 1].input_norm : norm_;
        return ops.add_rms_norm(h, mlp_out, next->tensor(), eps);
      };
      const loom::RematPolicy policy = cache ? loom::RematPolicy::none : o_.remat;
      if (policy == loom::RematPolicy::none || !layers_[l].router) {
        std::tie(h, x) = loom::models::run_layer(ops, policy, h, x, body);
        continue;
      }
      // A mixture-of-experts layer under remat: the router's logits are an output of the
      // checkpointed segment, so that the auxiliary losses (computed after every layer, from
      // routers_) reach the router through the recomputation. The segment's record keeps the
      // host-side choices; its logits and probabilities are replaced by the recorded output. A
      // recomputation in the backward pass makes the same choices and leaves no record.
      const Tensor inputs[2] = {h, x};
      auto first_run = std::make_shared<bool>(true);
      const auto out = ops.checkpoint(
          inputs,
          [body, first_run, this](Ops& o, std::span<const Tensor> in) {
            auto [h2, x2] = body(o, in[0], in[1]);
            Tensor logits = routers_.back().logits;
            if (!*first_run) routers_.pop_back();
            *first_run = false;
            return std::vector<Tensor>{std::move(h2), std::move(x2), std::move(logits)};
          },
          policy);
      h = out[0];
      x = out[1];
      routers_.back().logits = out[2];
      routers_.back().probs = ops.softmax(out[2]);
    }
    if (cache) cache->advance(seq);
    return x;
  }

  // The routers' auxiliary losses of the last forward pass:
  //   load balancing (Switch; transformers' load_balancing_loss_func over every layer's tokens
  //   together): experts * sum_e f_e * P_e, f_e the share of the (token, choice) pairs routed to
  //   expert e, P_e its mean router probability;
  //   z-loss (ST-MoE): the mean over layers and tokens of logsumexp(router logits)^2.
  Tensor auxiliary_loss(Ops& ops) override {
    metrics_.clear();
    if (routers_.empty()) return Tensor();
    const std::int64_t e_count = o_.moe.num_experts, k = o_.moe.experts_per_token;
    const std::int64_t tokens = routers_.front().probs.size(0);
    const auto all = static_cast<double>(tokens * static_cast<std::int64_t>(routers_.size()));
    // The values, on the host: selections per expert, summed probabilities, squared log-sum-exps.
    std::vector<double> counts(static_cast<std::size_t>(e_count), 0.0), probs(counts);
    double z_value = 0;
    for (const auto& r : routers_) {
      for (const std::int64_t e : r.selected) counts[static_cast<std::size_t>(e)] += 1.0;
      const auto p = r.probs.to_vector(), l = r.logits.to_vector();
      for (std::int64_t t = 0; t < tokens; ++t) {
        double m = -INFINITY, sum = 0;
        for (std::int64_t e = 0; e < e_count; ++e) {
          probs[static_cast<std::size_t>(e)] += p[static_cast<std::size_t>(t * e_count + e)];
          m = std::max(m, static_cast<double>(l[static_cast<std::size_t>(t * e_count + e)]));
        }
        for (std::int64_t e = 0; e < e_count; ++e) sum += std::exp(l[static_cast<std::size_t>(t * e_count + e)] - m);
        const double lse = m + std::log(sum);
        z_value += lse * lse / all;
      }
    }
    double balance_value = 0;
    for (std::int64_t e = 0; e < e_count; ++e)
      balance_value += static_cast<double>(e_count) * counts[static_cast<std::size_t>(e)] / all *
                       probs[static_cast<std::size_t>(e)] / all;
    metrics_.emplace_back("router_aux_loss", balance_value);
    metrics_.emplace_back("router_z_loss", z_value);
    // Per-expert load: the share of (token, choice) pairs routed to each expert (1 / experts when
    // balanced).
    for (std::int64_t e = 0; e < e_count; ++e)
      metrics_.emplace_back("expert_load/" + std::to_string(e),
                            counts[static_cast<std::size_t>(e)] / (all * static_cast<double>(k)));

    // The weighted losses, recorded: the load-balancing loss is linear in the probabilities
    // (the shares f_e are constants), so each layer contributes sum(probs * w) with
    // w[t, e] = coef * experts * count_e / all^2.
    Tensor total;
    const auto add = [&](const Tensor& t) { total = total.defined() ? ops.add(total, t) : t; };
    if (o_.moe.aux_loss_coef > 0.0) {
      std::vector<float> w(static_cast<std::size_t>(tokens * e_count));
      for (std::size_t i = 0; i < w.size(); ++i)
        w[i] = static_cast<float>(o_.moe.aux_loss_coef * static_cast<double>(e_count) *
                                  counts[i % static_cast<std::size_t>(e_count)] / (all * all));
      const Tensor weights = Tensor::from(std::span<const float>(w), Shape{tokens, e_count});
      for (const auto& r : routers_) add(ops.sum(ops.mul(r.probs, weights)));
    }
    if (o_.moe.z_loss_coef > 0.0) {
      for (const auto& r : routers_) {
        const Tensor lse = ops.logsumexp(r.logits);
        add(ops.scale(ops.sum(ops.mul(lse, lse)), static_cast<float>(o_.moe.z_loss_coef / all)));
      }
    }
    routers_.clear();
    return total;
  }

 public:
  std::vector<std::pair<std::string, double>> metrics() const override { return metrics_; }

 private:
  LlamaOptions o_;
  loom::Handle<loom::AttentionKernel> kernel_;
  loom::ExecutionContext* execution_;
  Parameter *embed_ = nullptr, *norm_ = nullptr, *lm_head_ = nullptr;
  std::vector<Layer> layers_;
  std::optional<loom::RopeTable> rope_;
  std::vector<RouterRecord> routers_;  // of the last forward pass, for auxiliary_loss
  std::vector<std::pair<std::string, double>> metrics_;
};

loom::OptionSchema moe_schema() {
  loom::OptionSchema s;
  s.integer("num_experts", 0, "Experts per layer in place of the MLP (Mixtral: 8); 0: a dense MLP.").min(0);
  s.integer("experts_per_token", 2, "Experts each token is routed to (top-k).").min(1);
  s.string("router_softmax", "after_top_k",
           "after_top_k: gate weights are the softmax over the chosen experts' logits (Mixtral, whose softmax then "
           "renormalisation is the same); before_top_k: the full softmax's probabilities of the chosen experts, not "
           "renormalised (DeepSeek).")
      .one_of({"after_top_k", "before_top_k"});
  s.number("router_aux_loss_coef", 0.001,
           "Weight of the load-balancing loss (Switch / transformers' Mixtral, over all layers' tokens).")
      .min(0.0);
  s.number("router_z_loss_coef", 0.0, "Weight of the router z-loss (ST-MoE): mean of logsumexp(logits)^2.").min(0.0);
  return s;
}

loom::OptionSchema rope_schema() {
  loom::OptionSchema s;
  s.string("type", "default", "default: plain RoPE; llama3: Llama 3.1's rescaled frequencies.")
      .one_of({"default", "llama3"});
  // Null unless given: the type decides.
  s.number("theta", std::nullopt, "Base of the frequencies; null: 10000 (default) or 500000 (llama3).").min(0.0, false);
  s.number("factor", std::nullopt,
           "Scaling factor; null: 1 (default) or 8 (llama3). For default, every frequency is divided by it "
           "(linear position interpolation).")
      .min(0.0, false);
  s.number("low_freq_factor", 1.0, "llama3: wavelengths above original_max_position_embeddings / this are scaled.")
      .min(0.0, false);
  s.number("high_freq_factor", 4.0, "llama3: wavelengths below original_max_position_embeddings / this are kept.")
      .min(0.0, false);
  s.integer("original_max_position_embeddings", 8192, "llama3: the context length the model was trained at.").min(1);
  return s;
}

loom::OptionSchema llama_schema() {
  loom::OptionSchema s;
  s.integer("seq_len", 2048, "Longest sequence (the RoPE table's length).").min(1);
  s.integer("hidden_dim", 4096, "Width of the residual stream.").min(1);
  s.integer("intermediate_dim", 11008, "Width of the SwiGLU MLP.").min(1);
  s.integer("num_layers", 32, "Decoder layers.").min(1);
  s.integer("num_heads", 32, "Query heads.").min(1);
  s.integer("num_kv_heads", 32, "Key/value heads (grouped-query attention; 1 is multi-query); divides num_heads.")
      .min(1);
  s.integer("head_dim", std::nullopt, "Width of one head (even); null: hidden_dim / num_heads.").min(2);
  s.object("rope", rope_schema(), "Rotary position embedding.");
  s.number("initializer_range", 0.02, "Standard deviation of the normal initialisation.").min(0.0);
  s.number("layer_norm_epsilon", 1e-5, "RMSNorm epsilon.").min(0.0);
  s.boolean("tie_word_embeddings", false, "Use the token embedding as the output projection.");
  s.boolean("use_bias", false, "Biases in every linear projection (q, k, v, o and the MLP).");
  s.boolean("qkv_bias", false, "Biases in the q, k and v projections only (Qwen2); use_bias includes them.");
  s.integer("sliding_window", std::nullopt, "Attend to the last this many positions only (Mistral); null: all.").min(1);
  s.integer("max_window_layers", 0,
            "With sliding_window: layers numbered below this attend to every position, the others use the window "
            "(Qwen2's max_window_layers); 0: every layer uses it.")
      .min(0);
  s.boolean("use_qk_norm", false, "RMSNorm over each query and key head before RoPE (Qwen3).");
  s.object("moe", moe_schema(), "Sparse mixture of SwiGLU experts in place of the MLP (Mixtral).");
  s.string("remat", "none", loom::models::remat_doc).one_of({"none", "full", "save_dots"});
  s.integer("vocab_size", std::nullopt, "Vocabulary size; null takes the tokenizer's.").min(1);
  s.component("attention", "attention", "flash", "The attention kernel, by name or {type: NAME, ...}.");
  return s;
}

LlamaOptions read_options(const loom::Options& options) {
  const std::string at = options.path().empty() ? "model" : options.path();
  LlamaOptions o;
  o.seq_len = options.get<std::int64_t>("seq_len");
  o.hidden_dim = options.get<std::int64_t>("hidden_dim");
  o.intermediate_dim = options.get<std::int64_t>("intermediate_dim");
  o.num_layers = options.get<std::int64_t>("num_layers");
  o.num_heads = options.get<std::int64_t>("num_heads");
  o.num_kv_heads = options.get<std::int64_t>("num_kv_heads");
  o.initializer_range = options.get<double>("initializer_range");
  o.layer_norm_epsilon = options.get<double>("layer_norm_epsilon");
  o.tie_word_embeddings = options.get<bool>("tie_word_embeddings");
  o.use_bias = options.get<bool>("use_bias");
  o.qkv_bias = options.get<bool>("qkv_bias");
  o.path = at;
  o.use_qk_norm = options.get<bool>("use_qk_norm");
  o.sliding_window = options.get_optional<std::int64_t>("sliding_window").value_or(0);
  o.max_window_layers = options.get<std::int64_t>("max_window_layers");
  if (o.max_window_layers > 0 && o.sliding_window == 0)
    throw loom::UserError(at + ".max_window_layers is " + std::to_string(o.max_window_layers) + " but " + at +
                          ".sliding_window is null; max_window_layers says which layers use the window, so set both "
                          "(or leave max_window_layers at 0)");
  o.vocab_size = options.get_optional<std::int64_t>("vocab_size").value_or(0);
  if (o.num_heads % o.num_kv_heads != 0)
    throw loom::UserError(at + ": num_kv_heads (" + std::to_string(o.num_kv_heads) + ") must divide num_heads (" +
                          std::to_string(o.num_heads) + ")");
  if (const auto head_dim = options.get_optional<std::int64_t>("head_dim")) {
    o.head_dim = *head_dim;
  } else {
    if (o.hidden_dim % o.num_heads != 0)
      throw loom::UserError(at + ": num_heads (" + std::to_string(o.num_heads) + ") must divide hidden_dim (" +
                            std::to_string(o.hidden_dim) + ") unless head_dim is set");
    o.head_dim = o.hidden_dim / o.num_heads;
  }
  if (o.head_dim % 2 != 0)
    throw loom::UserError(at + ": head_dim is " + std::to_string(o.head_dim) +
                          "; rotary embeddings rotate pairs of features, so it must be even");

  const loom::Options moe = options.object("moe");
  o.moe.num_experts = moe.get<std::int64_t>("num_experts");
  o.moe.experts_per_token = moe.get<std::int64_t>("experts_per_token");
  o.moe.softmax_after_top_k = moe.get<std::string>("router_softmax") == "after_top_k";
  o.moe.aux_loss_coef = moe.get<double>("router_aux_loss_coef");
  o.moe.z_loss_coef = moe.get<double>("router_z_loss_coef");
  o.remat = loom::models::parse_remat(options.get<std::string>("remat"));
  if (o.moe.num_experts > 0) {
    if (o.moe.experts_per_token > o.moe.num_experts)
      throw loom::UserError(at + ".moe.experts_per_token (" + std::to_string(o.moe.experts_per_token) +
                            ") exceeds moe.num_experts (" + std::to_string(o.moe.num_experts) + ")");
    if (o.use_bias)
      throw loom::UserError(at + ".use_bias with " + at +
                            ".moe: the experts have no biases; use qkv_bias for attention biases");
  }

  const loom::Options rope = options.object("rope");
  const bool llama3 = rope.get<std::string>("type") == "llama3";
  o.rope.base = rope.get_optional<double>("theta").value_or(llama3 ? 500000.0 : 10000.0);
  const double factor = rope.get_optional<double>("factor").value_or(llama3 ? 8.0 : 1.0);
  o.rope_options = {rope.get<std::string>("type"),
                    o.rope.base,
                    factor,
                    rope.get<double>("low_freq_factor"),
                    rope.get<double>("high_freq_factor"),
                    rope.get<std::int64_t>("original_max_position_embeddings")};
  if (llama3) {
    o.rope.llama3_scaling = true;
    o.rope.factor = factor;
    o.rope.low_freq_factor = rope.get<double>("low_freq_factor");
    o.rope.high_freq_factor = rope.get<double>("high_freq_factor");
    o.rope.original_max_positions = static_cast<double>(rope.get<std::int64_t>("original_max_position_embeddings"));
    if (!(o.rope.high_freq_factor > o.rope.low_freq_factor))
      throw loom::UserError(at + ".rope: high_freq_factor (" + std::to_string(o.rope.high_freq_factor) +
                            ") must exceed low_freq_factor (" + std::to_string(o.rope.low_freq_factor) + ")");
  } else if (factor != 1.0) {
    // Linear scaling divides every frequency by `factor`. RopeTable's Llama 3 rule divides every
    // wavelength longer than original_max_positions / low_freq_factor by it; with a limit far
    // below the shortest wavelength (2 pi) that is every frequency, which is exactly this.
    o.rope.llama3_scaling = true;
    o.rope.factor = factor;
    o.rope.low_freq_factor = 1.0;
    o.rope.high_freq_factor = 2.0;
    o.rope.original_max_positions = 1e-6;
  }
  return o;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Model>(
      {.name = "llama",
       .description = "Llama: RMSNorm, RoPE, SwiGLU, grouped-query attention; sliding window and qk-norm variants",
       .version = "1.0.0",
       .options = llama_schema()},
      [](const loom::Options& options, const loom::CreateContext& ctx) {
        const LlamaOptions o = read_options(options);
        auto kernel = ctx.create<loom::AttentionKernel>(options.component("attention"));
        return std::make_unique<LlamaModel>(o, std::move(kernel), ctx.execution());
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
