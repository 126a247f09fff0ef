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
#include <loom/decoder_options.hpp>
#include <loom/hf_interop.hpp>
#include <loom/kinds/attention.hpp>
#include <loom/kinds/model.hpp>
#include <loom/model_support.hpp>
#include <loom/plugin.hpp>
#include <loom/transformer_blocks.hpp>
#include <memory>
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

struct LlamaOptions : loom::models::RotaryDecoderOptions {
  bool use_bias, qkv_bias, use_qk_norm;
  std::int64_t max_window_layers;  // layers below this index attend to everything (Qwen2)
  RopeOptions rope_options;
  loom::RopeConfig rope;
  loom::models::MoeConfig moe;
};

// One decoder layer: pre-norm attention, then pre-norm MLP or mixture of experts.
struct Layer {
  Parameter* input_norm = nullptr;
  loom::models::AttentionBlock attention;
  Parameter* post_attention_norm = nullptr;
  loom::models::MlpBlock mlp;
  std::optional<loom::models::MoeBlock> moe;  // in place of the MLP
};

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
    const std::int64_t c = o_.hidden_dim;
    store_.declare("embed_tokens.weight", Shape{vocab_, c}, ParameterRole::embedding, &embed_, vocab_parallel());
    layers_.resize(static_cast<std::size_t>(o_.num_layers));
    for (std::int64_t l = 0; l < o_.num_layers; ++l) {
      Layer& y = layers_[static_cast<std::size_t>(l)];
      const std::string p = "layers." + std::to_string(l) + ".";
      store_.declare(p + "input_layernorm.weight", Shape{c}, ParameterRole::norm, &y.input_norm);
      y.attention.declare(store_, p + "self_attn.", attention_config(l));
      y.attention.set_kernel(*kernel_);
      store_.declare(p + "post_attention_layernorm.weight", Shape{c}, ParameterRole::norm, &y.post_attention_norm);
      if (o_.moe.num_experts > 0) {
        y.moe.emplace().declare(store_, p + "block_sparse_moe.", o_.moe);
        continue;
      }
      y.mlp.declare(store_, p + "mlp.",
                    {.hidden_dim = c,
                     .intermediate_dim = o_.intermediate_dim,
                     .kind = loom::models::MlpKind::swiglu,
                     .bias = o_.use_bias});
    }
    store_.declare("norm.weight", Shape{c}, ParameterRole::norm, &norm_);
    if (!o_.tie_word_embeddings)
      store_.declare("lm_head.weight", Shape{vocab_, c}, ParameterRole::weight, &lm_head_, vocab_parallel());
    if (!finish_build(setup)) return;
    rope_.emplace(o_.rope, o_.head_dim, o_.seq_len);
  }

  // Layer l's attention: grouped-query, RoPE (the table is forward's), Qwen3's q/k norms, Qwen2's
  // q/k/v biases, the layer's window.
  loom::models::AttentionConfig attention_config(std::int64_t l) const {
    loom::models::AttentionConfig a;
    a.hidden_dim = o_.hidden_dim;
    a.num_heads = o_.num_heads;
    a.num_kv_heads = o_.num_kv_heads;
    a.head_dim = o_.head_dim;
    a.qkv_bias = o_.use_bias || o_.qkv_bias;
    a.out_bias = o_.use_bias;
    a.qk_norm = o_.use_qk_norm;
    a.norm_eps = static_cast<float>(o_.layer_norm_epsilon);
    a.params.causal = true;
    a.params.window = window_of(l);
    a.model = "model (llama)";
    return a;
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
          loom::models::fill_constant(t, 1.0f, init_backend());
          break;
        case ParameterRole::bias:
          loom::models::fill_constant(t, 0.0f, init_backend());
          break;
        default:
          loom::models::fill_normal(store_, i, loom::stream_key(seed, 1, i), o_.initializer_range, *execution_,
                                    init_backend());
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
    loom::HfTensorLayout layout =
        loom::models::llama_layout(store_, vocab_, o_.num_heads, o_.num_kv_heads, o_.head_dim, o_.moe.num_experts);
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
    s.experts_per_token = moe ? o_.moe.experts_per_token : 0;
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
  CacheShape cache_shape() const override {
    return {o_.num_layers, layers_.front().attention.local_kv_heads(), o_.head_dim};
  }

  Tensor head() const override { return o_.tie_word_embeddings ? embed_->tensor() : lm_head_->tensor(); }

  // The final hidden states (after the last RMSNorm) of `tokens` [batch, seq]; with a cache, the
  // tokens follow the cached positions and their keys and values are appended to it.
  Tensor forward(Ops& ops, const Tensor& tokens, const Tensor& segments, loom::models::LayerKvCache* cache) override {
    const std::int64_t seq = tokens.size(1);
    const auto eps = static_cast<float>(o_.layer_norm_epsilon);
    const loom::models::AttentionInput input{.batch = tokens.size(0),
                                             .seq = seq,
                                             .offset = cache ? cache->length() : 0,
                                             .segments = segments,
                                             .cache = cache,
                                             .rope = &*rope_};

    routers_.clear();
    Tensor h = embed(ops, embed_->tensor(), tokens);
    Tensor x = ops.rms_norm(h, layers_.front().input_norm->tensor(), eps);
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      const loom::models::LayerBody body = [=, this](Ops& ops, Tensor h, Tensor x) {
        const Layer& y = layers_[l];
        loom::models::AttentionInput in = input;
        in.layer = static_cast<std::int64_t>(l);
        std::tie(h, x) = ops.add_rms_norm(h, y.attention.forward(ops, x, in), y.post_attention_norm->tensor(), eps);
        const Tensor mlp_out = y.moe ? y.moe->forward(ops, x, routers_) : y.mlp.forward(ops, x);
        // The residual add fused with the next norm: the next layer's input norm, or the final one.
        const Parameter* next = l + 1 < layers_.size() ? layers_[l + 1].input_norm : norm_;
        return ops.add_rms_norm(h, mlp_out, next->tensor(), eps);
      };
      const loom::RematPolicy policy = cache ? loom::RematPolicy::none : o_.remat;
      std::tie(h, x) = layers_[l].moe ? loom::models::run_moe_layer(ops, policy, h, x, body, routers_)
                                      : loom::models::run_layer(ops, policy, h, x, body);
    }
    if (cache) cache->advance(seq);
    return x;
  }

  // The routers' auxiliary losses of the last forward pass (moe_auxiliary_loss).
  Tensor auxiliary_loss(Ops& ops) override { return loom::models::moe_auxiliary_loss(ops, o_.moe, routers_, metrics_); }

 public:
  // Read from the backend's memory here, when the trainer logs them, not in every step.
  std::vector<std::pair<std::string, double>> metrics() const override { return metrics_.read(); }

 private:
  LlamaOptions o_;
  loom::Handle<loom::AttentionKernel> kernel_;
  loom::ExecutionContext* execution_;
  Parameter *embed_ = nullptr, *norm_ = nullptr, *lm_head_ = nullptr;
  std::vector<Layer> layers_;
  std::optional<loom::RopeTable> rope_;
  std::vector<loom::models::RouterRecord> routers_;  // of the last forward pass, for auxiliary_loss
  loom::models::MoeMetrics metrics_;
};

loom::OptionBinding<RopeOptions> rope_options() {
  using R = RopeOptions;
  loom::OptionBinding<R> s;
  s.field("type", &R::type, "default", "default: plain RoPE; llama3: Llama 3.1's rescaled frequencies.")
      .one_of({"default", "llama3"});
  // Null unless given: the type decides.
  s.field("theta", &R::theta, std::nullopt, "Base of the frequencies; null: 10000 (default) or 500000 (llama3).")
      .min(0.0, false)
      .null_as([](const R& r) { return r.type == "llama3" ? 500000.0 : 10000.0; });
  s.field("factor", &R::factor, std::nullopt,
          "Scaling factor; null: 1 (default) or 8 (llama3). For default, every frequency is divided by it "
          "(linear position interpolation).")
      .min(0.0, false)
      .null_as([](const R& r) { return r.type == "llama3" ? 8.0 : 1.0; });
  s.field("low_freq_factor", &R::low_freq_factor, 1.0,
          "llama3: wavelengths above original_max_position_embeddings / this are scaled.")
      .min(0.0, false);
  s.field("high_freq_factor", &R::high_freq_factor, 4.0,
          "llama3: wavelengths below original_max_position_embeddings / this are kept.")
      .min(0.0, false);
  s.field("original_max_position_embeddings", &R::original_max_position_embeddings, 8192,
          "llama3: the context length the model was trained at.")
      .min(1);
  return s;
}

// What the options imply together: their combinations checked, head_dim, the experts and the
// RoPE table's configuration derived.
void finish_options(LlamaOptions& o, const loom::Options& options) {
  const std::string& at = o.path;
  if (o.max_window_layers > 0 && o.sliding_window == 0)
    throw loom::UserError(at + ".max_window_layers is " + std::to_string(o.max_window_layers) + " but " + at +
                          ".sliding_window is null; max_window_layers says which layers use the window, so set both "
                          "(or leave max_window_layers at 0)");
  loom::models::check_kv_heads(at, o.num_heads, o.num_kv_heads);
  if (o.head_dim == 0) {  // null
    if (o.hidden_dim % o.num_heads != 0)
      throw loom::UserError(at + ": num_heads (" + std::to_string(o.num_heads) + ") must divide hidden_dim (" +
                            std::to_string(o.hidden_dim) + ") unless head_dim is set");
    o.head_dim = o.hidden_dim / o.num_heads;
  }
  loom::models::check_rotary_head_dim(at, o.head_dim);

  o.moe = loom::models::read_moe_options(options.object("moe"), at);
  o.moe.hidden_dim = o.hidden_dim;
  o.moe.intermediate_dim = o.intermediate_dim;
  o.moe.model = "model (llama)";
  if (o.moe.num_experts > 0 && o.use_bias)
    throw loom::UserError(at + ".use_bias with " + at +
                          ".moe: the experts have no biases; use qkv_bias for attention biases");

  const RopeOptions& r = o.rope_options;
  o.rope.base = r.theta;
  if (r.type == "llama3") {
    o.rope.llama3_scaling = true;
    o.rope.factor = r.factor;
    o.rope.low_freq_factor = r.low_freq_factor;
    o.rope.high_freq_factor = r.high_freq_factor;
    o.rope.original_max_positions = static_cast<double>(r.original_max_position_embeddings);
    if (!(o.rope.high_freq_factor > o.rope.low_freq_factor))
      throw loom::UserError(at + ".rope: high_freq_factor (" + std::to_string(o.rope.high_freq_factor) +
                            ") must exceed low_freq_factor (" + std::to_string(o.rope.low_freq_factor) + ")");
  } else if (r.factor != 1.0) {
    // Linear scaling divides every frequency by `factor`. RopeTable's Llama 3 rule divides every
    // wavelength longer than original_max_positions / low_freq_factor by it; with a limit far
    // below the shortest wavelength (2 pi) that is every frequency, which is exactly this.
    o.rope.llama3_scaling = true;
    o.rope.factor = r.factor;
    o.rope.low_freq_factor = 1.0;
    o.rope.high_freq_factor = 2.0;
    o.rope.original_max_positions = 1e-6;
  }
}

loom::models::DecoderSchema<LlamaOptions> llama_options() {
  using O = LlamaOptions;
  loom::models::DecoderSchema<O> s;
  s.seq_len(2048, "Longest sequence (the RoPE table's length).");
  s.hidden_dim(4096, "Width of the residual stream.");
  s.intermediate_dim(11008, "Width of the SwiGLU MLP.");
  s.num_layers(32, "Decoder layers.");
  s.num_heads(32, "Query heads.");
  s.num_kv_heads(32, "Key/value heads (grouped-query attention; 1 is multi-query); divides num_heads.");
  s.head_dim(std::nullopt, "Width of one head (even); null: hidden_dim / num_heads.");
  s.object("rope", &O::rope_options, rope_options(), "Rotary position embedding.");
  s.initializer_range();
  s.layer_norm_epsilon(1e-5, "RMSNorm epsilon.");
  s.tie_word_embeddings(false, "Use the token embedding as the output projection.");
  s.field("use_bias", &O::use_bias, false, "Biases in every linear projection (q, k, v, o and the MLP).");
  s.field("qkv_bias", &O::qkv_bias, false,
          "Biases in the q, k and v projections only (Qwen2); use_bias includes them.");
  s.sliding_window(std::nullopt, "Attend to the last this many positions only (Mistral); null: all.");
  s.field("max_window_layers", &O::max_window_layers, 0,
          "With sliding_window: layers numbered below this attend to every position, the others use the window "
          "(Qwen2's max_window_layers); 0: every layer uses it.")
      .min(0);
  s.field("use_qk_norm", &O::use_qk_norm, false, "RMSNorm over each query and key head before RoPE (Qwen3).");
  // Read by finish_options, with the SDK's reader of the experts' options.
  s.schema().object("moe", loom::models::moe_schema(),
                    "Sparse mixture of SwiGLU experts in place of the MLP (Mixtral).");
  s.remat();
  s.vocab_size();
  s.attention();
  s.then(finish_options);
  return s;
}

void register_components(loom::Registrar& registrar) {
  const auto options = llama_options();
  registrar.add<loom::Model>(
      {.name = "llama",
       .description = "Llama: RMSNorm, RoPE, SwiGLU, grouped-query attention; sliding window and qk-norm variants",
       .version = "1.0.0",
       .options = options.schema()},
      [options](const loom::Options& given, const loom::CreateContext& ctx) {
        const LlamaOptions o = options.read(given);
        auto kernel = ctx.create<loom::AttentionKernel>(o.attention);
        return std::make_unique<LlamaModel>(o, std::move(kernel), ctx.execution());
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
