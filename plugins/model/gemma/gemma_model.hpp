// The `gemma` model: Gemma 2 (Gemma Team 2024) as transformers' Gemma2ForCausalLM computes it.
// RMSNorm with a (1 + weight) scale, the token embedding scaled by sqrt(hidden_dim), GeGLU MLP
// (tanh GELU), norms before and after both attention and the MLP, soft-capping of the attention
// scores (in the attention kernel) and of the final logits, sliding-window attention on the even
// layers (0, 2, ...) and global attention on the odd ones, queries scaled by
// query_pre_attn_scalar^-1/2, tied embeddings. Parameter names are transformers' under "model."
// except q, k and v, which come from one fused projection (self_attn.qkv_proj, rows [q heads |
// k heads | v heads]) that the Hugging Face mapping splits into q_proj, k_proj and v_proj.
//
// The model, shared by gemma_model.cpp (its options and registration) and gemma_interop.cpp (its
// Hugging Face mapping: config.json both ways, the tensor layout, the check of a directory).
#pragma once

#include <cmath>
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

namespace loom::gemma {

using loom::Ops;
using loom::Parameter;
using loom::ParameterRole;
using loom::Shape;
using loom::Tensor;

struct GemmaOptions : loom::models::RotaryDecoderOptions {
  double query_pre_attn_scalar;
  double attn_logit_softcapping, final_logit_softcapping;  // 0: off
  double rope_theta;
};

// One decoder layer: attention and MLP, each between a norm before and a norm after.
struct Layer {
  Parameter* input_norm = nullptr;
  loom::models::AttentionBlock attention;
  Parameter *post_attention_norm = nullptr, *pre_feedforward_norm = nullptr;
  loom::models::MlpBlock mlp;
  Parameter* post_feedforward_norm = nullptr;
};

class GemmaModel final : public loom::models::TransformerLm {
 public:
  GemmaModel(const GemmaOptions& o, loom::Handle<loom::AttentionKernel> kernel, loom::ExecutionContext& execution)
      : TransformerLm(o.path, {"gemma2"}, "Gemma 2"), o_(o), kernel_(std::move(kernel)), execution_(&execution) {}

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
      store_.declare(p + "pre_feedforward_layernorm.weight", Shape{c}, ParameterRole::norm, &y.pre_feedforward_norm);
      y.mlp.declare(store_, p + "mlp.",
                    {.hidden_dim = c, .intermediate_dim = o_.intermediate_dim, .kind = loom::models::MlpKind::geglu});
      store_.declare(p + "post_feedforward_layernorm.weight", Shape{c}, ParameterRole::norm, &y.post_feedforward_norm);
    }
    store_.declare("norm.weight", Shape{c}, ParameterRole::norm, &norm_);
    if (!o_.tie_word_embeddings)
      store_.declare("lm_head.weight", Shape{vocab_, c}, ParameterRole::weight, &lm_head_, vocab_parallel());
    if (!finish_build(setup)) return;
    ones_ =
        setup.backend ? Tensor::zeros(Shape{c}, loom::DType::f32, setup.backend->device()) : Tensor::zeros(Shape{c});
    loom::models::fill_constant(ones_, 1.0f, setup.backend);
    loom::RopeConfig rope;
    rope.base = o_.rope_theta;
    rope_.emplace(rope, o_.head_dim, o_.seq_len);
  }

  void initialize(std::uint64_t seed) override {
    require_built("initialize");
    // transformers' Gemma 2 initialisation: normal(0, initializer_range) for every matrix and the
    // embedding; the norms' weights 0 (a scale of 1 + 0).
    const auto& params = store_.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const Tensor t = params[i].parameter->data();
      if (params[i].role == ParameterRole::norm)
        loom::models::fill_constant(t, 0.0f, init_backend());
      else
        loom::models::fill_normal(store_, i, loom::stream_key(seed, 1, i), o_.initializer_range, *execution_,
                                  init_backend());
    }
  }

  std::int64_t max_seq_len() const override { return o_.seq_len; }
  // ---- Hugging Face (transformers' Gemma2ForCausalLM) ----

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
    s.intermediate_dim = o_.intermediate_dim;
    s.glu = true;
    s.vocab_size = vocab_;
    // The window on sliding layers, the whole prefix on the others.
    for (std::int64_t l = 0; l < o_.num_layers; ++l) s.layer_windows.push_back(is_sliding(l) ? o_.sliding_window : 0);
    return s;
  }

  // The check of a config.json against the model (gemma_interop.cpp).
  void check_hf_config(loom::HfConfigCheck& check, const std::string&, const loom::Value& config) const override;
  void check_optional(loom::HfConfigCheck& check, const loom::Value& config, const char* key, double fallback,
                      double ours) const;

  bool is_sliding(std::int64_t layer) const { return o_.sliding_window > 0 && layer % 2 == 0; }

  // Layer l's attention: grouped-query, RoPE, soft-capped scores, queries scaled by
  // query_pre_attn_scalar^-1/2, the window on sliding layers.
  loom::models::AttentionConfig attention_config(std::int64_t l) const {
    loom::models::AttentionConfig a;
    a.hidden_dim = o_.hidden_dim;
    a.num_heads = o_.num_heads;
    a.num_kv_heads = o_.num_kv_heads;
    a.head_dim = o_.head_dim;
    a.params.causal = true;
    a.params.softcap = static_cast<float>(o_.attn_logit_softcapping);
    a.params.scale = static_cast<float>(1.0 / std::sqrt(o_.query_pre_attn_scalar));
    a.params.window = is_sliding(l) ? o_.sliding_window : 0;
    a.model = "model (gemma)";
    return a;
  }

  const char* name() const override { return "gemma"; }
  CacheShape cache_shape() const override {
    return {o_.num_layers, layers_.front().attention.local_kv_heads(), o_.head_dim};
  }
  Tensor head() const override { return o_.tie_word_embeddings ? embed_->tensor() : lm_head_->tensor(); }
  float final_logit_softcap() const override { return static_cast<float>(o_.final_logit_softcapping); }

  // Gemma's RMSNorm scale: 1 + weight.
  Tensor scale_of(Ops& ops, const Parameter* p) const { return ops.add(ones_, p->tensor()); }

  Tensor forward(Ops& ops, const Tensor& tokens, const Tensor& segments, loom::models::LayerKvCache* cache) override {
    const std::int64_t seq = tokens.size(1);
    const auto eps = static_cast<float>(o_.layer_norm_epsilon);
    const loom::models::AttentionInput input{.batch = tokens.size(0),
                                             .seq = seq,
                                             .offset = cache ? cache->length() : 0,
                                             .segments = segments,
                                             .cache = cache,
                                             .rope = &*rope_};

    Tensor h = ops.scale(embed(ops, embed_->tensor(), tokens), static_cast<float>(std::sqrt(o_.hidden_dim)));
    Tensor x = ops.rms_norm(h, scale_of(ops, layers_.front().input_norm), eps);
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      std::tie(h, x) = loom::models::run_layer(
          ops, cache ? loom::RematPolicy::none : o_.remat, h, x, [=, this](Ops& ops, Tensor h, Tensor x) {
            const Layer& y = layers_[l];
            loom::models::AttentionInput in = input;
            in.layer = static_cast<std::int64_t>(l);
            const Tensor attn_out =
                ops.rms_norm(y.attention.forward(ops, x, in), scale_of(ops, y.post_attention_norm), eps);
            std::tie(h, x) = ops.add_rms_norm(h, attn_out, scale_of(ops, y.pre_feedforward_norm), eps);
            const Tensor mlp_out = ops.rms_norm(y.mlp.forward(ops, x), scale_of(ops, y.post_feedforward_norm), eps);
            const Parameter* next = l + 1 < layers_.size() ? layers_[l + 1].input_norm : norm_;
            return ops.add_rms_norm(h, mlp_out, scale_of(ops, next), eps);
          });
    }
    if (cache) cache->advance(seq);
    return x;
  }

  GemmaOptions o_;
  loom::Handle<loom::AttentionKernel> kernel_;
  loom::ExecutionContext* execution_;
  Parameter *embed_ = nullptr, *norm_ = nullptr, *lm_head_ = nullptr;
  std::vector<Layer> layers_;
  Tensor ones_;  // [hidden_dim] of 1: the norms scale by ones_ + weight
  std::optional<loom::RopeTable> rope_;
};

// The Hugging Face model_types the plugin reads (gemma2) and how a config.json of
// one maps to the loom `model` section (gemma_interop.cpp), for Registrar::add_hf_architectures.
loom::HfArchitectures hf_architectures();
// Their tokenizer class (GemmaTokenizer) and its default special tokens, for
// Registrar::add_hf_tokenizer_class.
loom::HfTokenizerClass hf_tokenizer_class();

}  // namespace loom::gemma
