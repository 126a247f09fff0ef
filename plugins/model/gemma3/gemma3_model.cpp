// The `gemma3` model: the text decoder of Gemma 3 (Gemma Team 2025) as transformers'
// Gemma3ForCausalLM computes it (model_type "gemma3_text"). What differs from Gemma 2 (the gemma
// model): RMSNorms of each query and key head (with Gemma's (1 + weight) scale) before RoPE, in
// place of Gemma 2's attention soft-cap; five sliding-window layers to one global one
// (sliding_window_pattern 6: layer l is global when (l + 1) % 6 == 0); a RoPE base of its own for
// the sliding layers (rope_local_base_freq, 10000) and for the global ones (rope_theta, 1e6),
// with the global layers' linear position scaling (rope_scaling, factor 8 in the 4B and larger
// models). Shared with Gemma 2: the embedding scaled by sqrt(hidden_dim), (1 + weight) RMSNorms
// before and after attention and the MLP, the GeGLU MLP (tanh GELU), queries scaled by
// query_pre_attn_scalar^-1/2, an optional final logit soft-cap, tied embeddings.
//
// Parameter names are transformers' under "model." except q, k and v, which come from one fused
// projection (self_attn.qkv_proj, rows [q heads | k heads | v heads]) that the Hugging Face
// mapping (gemma3_interop.cpp) splits into q_proj, k_proj and v_proj.
#include <cmath>
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

#include "gemma3_interop.hpp"
#include "gemma3_options.hpp"

namespace loom::gemma3 {

namespace {

// Gemma's RMSNorm scale, 1 + weight: `ones` is a tensor of 1 of the weight's shape.
Tensor one_plus(Ops& ops, const Tensor& ones, const Parameter* weight) {
  return ops.add(ones, weight->tensor());
}

// One decoder layer: attention and MLP, each between a norm before and a norm after.
struct Layer {
  Parameter* input_norm = nullptr;
  models::AttentionBlock attention;
  Parameter *post_attention_norm = nullptr, *pre_feedforward_norm = nullptr;
  models::MlpBlock mlp;
  Parameter* post_feedforward_norm = nullptr;
};

class Gemma3Model final : public models::TransformerLm {
 public:
  Gemma3Model(const ModelOptions& o, Handle<AttentionKernel> kernel, ExecutionContext& execution)
      : TransformerLm(o.path, hf_model_types, hf_family), o_(o), kernel_(std::move(kernel)), execution_(&execution) {}

  void build(const ModelSetup& setup) override {
    begin_build(o_.vocab_size, setup);
    const std::int64_t c = o_.hidden_dim;
    store_.declare("embed_tokens.weight", Shape{vocab_, c}, ParameterRole::embedding, &embed_, vocab_parallel());
    layers_.resize(static_cast<std::size_t>(o_.num_layers));
    for (std::int64_t l = 0; l < o_.num_layers; ++l) {
      Layer& y = layers_[static_cast<std::size_t>(l)];
      const std::string p = "layers." + std::to_string(l) + ".";
      store_.declare(p + "input_layernorm.weight", Shape{c}, ParameterRole::norm, &y.input_norm);
      AttentionParams params;
      params.causal = true;
      params.scale = static_cast<float>(1.0 / std::sqrt(o_.query_pre_attn_scalar));
      params.window = o_.is_sliding(l) ? o_.sliding_window : 0;
      y.attention.declare(store_, p + "self_attn.",
                          {.hidden_dim = c,
                           .num_heads = o_.num_heads,
                           .num_kv_heads = o_.num_kv_heads,
                           .head_dim = o_.head_dim,
                           .qk_norm = true,
                           .qk_norm_scale = models::QkNormScale::one_plus_weight,
                           .norm_eps = static_cast<float>(o_.layer_norm_epsilon),
                           .params = params,
                           .model = "model (gemma3)"});
      y.attention.set_kernel(*kernel_);
      store_.declare(p + "post_attention_layernorm.weight", Shape{c}, ParameterRole::norm, &y.post_attention_norm);
      store_.declare(p + "pre_feedforward_layernorm.weight", Shape{c}, ParameterRole::norm, &y.pre_feedforward_norm);
      y.mlp.declare(store_, p + "mlp.",
                    {.hidden_dim = c, .intermediate_dim = o_.intermediate_dim, .kind = models::MlpKind::geglu});
      store_.declare(p + "post_feedforward_layernorm.weight", Shape{c}, ParameterRole::norm, &y.post_feedforward_norm);
    }
    store_.declare("norm.weight", Shape{c}, ParameterRole::norm, &norm_);
    if (!o_.tie_word_embeddings)
      store_.declare("lm_head.weight", Shape{vocab_, c}, ParameterRole::weight, &lm_head_, vocab_parallel());
    if (!finish_build(setup)) return;
    const auto ones = [&](std::int64_t n) {
      Tensor t = setup.backend ? Tensor::zeros(Shape{n}, DType::f32, setup.backend->device()) : Tensor::zeros(Shape{n});
      models::fill_constant(t, 1.0f, setup.backend);
      return t;
    };
    ones_ = ones(c);
    head_ones_ = ones(o_.head_dim);
    for (Layer& y : layers_) y.attention.set_qk_norm_ones(head_ones_);
    // The sliding layers' RoPE: base rope_local_base_freq, unscaled. The global layers': base
    // rope_theta, positions divided by the linear factor (transformers' "linear" rope_type).
    RopeConfig local;
    local.base = o_.rope_local_base_freq;
    local_rope_.emplace(local, o_.head_dim, o_.seq_len);
    RopeConfig global;
    global.base = o_.rope_theta;
    if (o_.rope_scaling_factor > 0 && o_.rope_scaling_factor != 1.0)
      global = models::linear_rope(o_.rope_theta, o_.rope_scaling_factor);
    global_rope_.emplace(global, o_.head_dim, o_.seq_len);
  }

  void initialize(std::uint64_t seed) override {
    require_built("initialize");
    // transformers' Gemma 3 initialisation: normal(0, initializer_range) for every matrix and the
    // embedding; the norms' weights (the q/k norms' too) 0, a scale of 1 + 0.
    const auto& params = store_.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      const Tensor t = params[i].parameter->data();
      if (params[i].role == ParameterRole::norm)
        models::fill_constant(t, 0.0f, init_backend());
      else
        models::fill_normal(store_, i, stream_key(seed, 1, i), o_.initializer_range, *execution_, init_backend());
    }
  }

  std::int64_t max_seq_len() const override { return o_.seq_len; }

  // ---- Hugging Face (gemma3_interop.cpp) ----
  Value hf_config() const override {
    require_built("hf_config");
    return gemma3::hf_config(o_, vocab_);
  }
  HfTensorLayout hf_tensors() const override {
    require_built("hf_tensors");
    return gemma3::hf_tensors(store_, o_, vocab_);
  }

 private:
  void check_hf_config(HfConfigCheck& check, const std::string&, const Value& config) const override {
    gemma3::check_hf_config(check, config, o_, vocab_);
  }

  RematPolicy remat_policy() const override { return o_.remat; }
  models::TransformerShape transformer_shape() const override {
    models::TransformerShape s;
    s.num_layers = o_.num_layers;
    s.hidden_dim = o_.hidden_dim;
    s.num_heads = o_.num_heads;
    s.num_kv_heads = o_.num_kv_heads;
    s.head_dim = o_.head_dim;
    s.intermediate_dim = o_.intermediate_dim;
    s.glu = true;
    s.vocab_size = vocab_;
    // The window on sliding layers, the whole prefix on the global ones.
    for (std::int64_t l = 0; l < o_.num_layers; ++l)
      s.layer_windows.push_back(o_.is_sliding(l) ? o_.sliding_window : 0);
    return s;
  }

  const char* name() const override { return "gemma3"; }
  CacheShape cache_shape() const override {
    return {o_.num_layers, layers_.front().attention.local_kv_heads(), o_.head_dim};
  }
  Tensor head() const override { return o_.tie_word_embeddings ? embed_->tensor() : lm_head_->tensor(); }
  float final_logit_softcap() const override { return static_cast<float>(o_.final_logit_softcapping); }

  Tensor forward(Ops& ops, const Tensor& tokens, const Tensor& segments, models::LayerKvCache* cache) override {
    const std::int64_t seq = tokens.size(1);
    const auto eps = static_cast<float>(o_.layer_norm_epsilon);
    const models::AttentionInput input{.batch = tokens.size(0),
                                       .seq = seq,
                                       .offset = cache ? cache->length() : 0,
                                       .segments = segments,
                                       .cache = cache};

    Tensor h = ops.scale(embed(ops, embed_->tensor(), tokens), static_cast<float>(std::sqrt(o_.hidden_dim)));
    Tensor x = ops.rms_norm(h, one_plus(ops, ones_, layers_.front().input_norm), eps);
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      std::tie(h, x) =
          models::run_layer(ops, cache ? RematPolicy::none : o_.remat, h, x, [=, this](Ops& ops, Tensor h, Tensor x) {
            const Layer& y = layers_[l];
            models::AttentionInput in = input;
            in.layer = static_cast<std::int64_t>(l);
            in.rope = o_.is_sliding(static_cast<std::int64_t>(l)) ? &*local_rope_ : &*global_rope_;
            const Tensor attn_out =
                ops.rms_norm(y.attention.forward(ops, x, in), one_plus(ops, ones_, y.post_attention_norm), eps);
            std::tie(h, x) = ops.add_rms_norm(h, attn_out, one_plus(ops, ones_, y.pre_feedforward_norm), eps);
            const Tensor mlp_out =
                ops.rms_norm(y.mlp.forward(ops, x), one_plus(ops, ones_, y.post_feedforward_norm), eps);
            const Parameter* next = l + 1 < layers_.size() ? layers_[l + 1].input_norm : norm_;
            return ops.add_rms_norm(h, mlp_out, one_plus(ops, ones_, next), eps);
          });
    }
    if (cache) cache->advance(seq);
    return x;
  }

  ModelOptions o_;
  Handle<AttentionKernel> kernel_;
  ExecutionContext* execution_;
  Parameter *embed_ = nullptr, *norm_ = nullptr, *lm_head_ = nullptr;
  std::vector<Layer> layers_;
  Tensor ones_, head_ones_;  // [hidden_dim] and [head_dim] of 1: the norms scale by 1 + weight
  std::optional<RopeTable> local_rope_, global_rope_;
};

void register_components(Registrar& registrar) {
  const auto options = model_options();
  registrar.add<Model>(
      {.name = "gemma3",
       .description = "Gemma 3 (text): q/k RMSNorms, five sliding-window layers to one global, separate RoPE bases "
                      "for local and global layers (the global ones linearly scaled), (1 + w) RMSNorm before and "
                      "after attention and MLP, GeGLU, tied embeddings",
       .version = "1.0.0",
       .options = options.schema()},
      [options](const loom::Options& given, const CreateContext& ctx) {
        const ModelOptions o = options.read(given);
        auto kernel = ctx.create<AttentionKernel>(o.attention);
        return std::make_unique<Gemma3Model>(o, std::move(kernel), ctx.execution());
      });
  registrar.add_hf_architectures(hf_architectures());
  registrar.add_hf_tokenizer_class(hf_tokenizer_class());
}

}  // namespace

models::DecoderSchema<ModelOptions> model_options() {
  using O = ModelOptions;
  models::DecoderSchema<O> s;
  s.seq_len(32768, "Longest sequence (the RoPE tables' length).");
  s.hidden_dim(2304, "Width of the residual stream.");
  s.intermediate_dim(9216, "Width of the GeGLU MLP.");
  s.num_layers(26, "Decoder layers.");
  s.num_heads(8, "Query heads.");
  s.num_kv_heads(4, "Key/value heads (grouped-query attention); divides num_heads.");
  s.head_dim(256, "Width of one head (even).");
  s.field("query_pre_attn_scalar", &O::query_pre_attn_scalar, 256.0, "Attention scores are scaled by this^-1/2.")
      .min(0.0, false);
  s.sliding_window(4096, "Window of the sliding (local) layers; null: every layer global.").nullable();
  s.field("sliding_window_pattern", &O::sliding_window_pattern, 6,
          "Layer l is global when (l + 1) % sliding_window_pattern == 0, sliding otherwise (6: five local "
          "layers to one global; 1: every layer global).")
      .min(1)
      .max(static_cast<double>(models::max_model_layers) + 1);
  s.field("rope_theta", &O::rope_theta, 1e6, "RoPE base of the global layers.").min(0.0, false);
  s.field("rope_local_base_freq", &O::rope_local_base_freq, 1e4, "RoPE base of the sliding layers.").min(0.0, false);
  s.field("rope_scaling_factor", &O::rope_scaling_factor, std::nullopt,
          "Linear RoPE scaling of the global layers (positions divided by it; Gemma 3 4B and larger: 8); null: "
          "none.")
      .nullable()
      .min(0.0, false)
      .null_as(0.0);
  s.field("final_logit_softcapping", &O::final_logit_softcapping, std::nullopt,
          "Soft-cap of the output logits; null: none (Gemma 3's).")
      .nullable()
      .min(0.0, false)
      .null_as(0.0);
  s.initializer_range();
  s.layer_norm_epsilon(1e-6, "RMSNorm epsilon (every norm, the q/k norms too).");
  s.tie_word_embeddings(true, "Use the token embedding as the output projection (Gemma always does).");
  s.vocab_size();
  s.remat();
  s.attention();
  s.then([](O& o, const loom::Options&) {
    models::check_kv_heads(o.path, o.num_heads, o.num_kv_heads);
    models::check_rotary_head_dim(o.path, o.head_dim);
  });
  return s;
}

}  // namespace loom::gemma3

LOOM_PLUGIN(loom::gemma3::register_components)
