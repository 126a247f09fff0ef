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
//
// The model, shared by llama_model.cpp (its options and registration) and llama_interop.cpp (its
// Hugging Face mapping: config.json both ways, the tensor layout, the check of a directory).
#pragma once

#include <loom/decoder_options.hpp>
#include <loom/hf_architecture.hpp>
#include <loom/hf_interop.hpp>
#include <loom/kinds/attention.hpp>
#include <loom/kinds/model.hpp>
#include <loom/model_support.hpp>
#include <loom/transformer_blocks.hpp>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace loom::llama {

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

  loom::Value hf_config() const override;
  loom::HfTensorLayout hf_tensors() const override;

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

  // The check of a config.json against the model (llama_interop.cpp).
  void check_hf_config(loom::HfConfigCheck& check, const std::string& type, const loom::Value& config) const override;
  static bool present(const loom::Value& config, const char* key);
  std::string hf_model_type() const;
  void check_mixtral_config(loom::HfConfigCheck& check, const loom::Value& config) const;
  void check_window_on_every_layer(loom::HfConfigCheck& check, const std::string& type) const;
  loom::Value hf_rope_scaling() const;
  void check_rope_scaling(loom::HfConfigCheck& check, const std::string& type) const;

  // The attention window of layer `l`: 0 (none) below max_window_layers, sliding_window above.
  std::int64_t window_of(std::int64_t l) const { return l >= o_.max_window_layers ? o_.sliding_window : 0; }

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

// The Hugging Face model_types the plugin reads (llama, mistral, qwen2, qwen3, mixtral) and how a config.json of
// one maps to the loom `model` section (llama_interop.cpp), for Registrar::add_hf_architectures.
loom::HfArchitectures hf_architectures();
// The tokenizer classes of those model_types (LlamaTokenizer, Qwen2Tokenizer) and their default
// special tokens, for Registrar::add_hf_tokenizer_class.
std::vector<loom::HfTokenizerClass> hf_tokenizer_classes();

}  // namespace loom::llama
