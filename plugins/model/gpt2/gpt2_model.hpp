// The `gpt2` model: GPT-2 (Radford et al. 2019) as Levanter's Gpt2Config describes it. Learned
// position embeddings, pre-LayerNorm blocks, GELU (tanh form) MLP, tied input and output
// embeddings. Parameter names and layouts follow the Hugging Face / OpenAI checkpoints
// ("h.0.attn.c_attn.weight" is [hidden, 3 * hidden]: Conv1D's [in, out]), so the Hugging Face
// mapping (loom::HfModel) is the names under transformers' "transformer." prefix, unchanged.
//
// The model, shared by gpt2_model.cpp (its options and registration) and gpt2_interop.cpp (its
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
#include <span>
#include <string>
#include <tuple>
#include <vector>

namespace loom::gpt2 {

using loom::Ops;
using loom::Parameter;
using loom::ParameterRole;
using loom::Shape;
using loom::Tensor;

struct Gpt2Options : loom::models::DecoderOptions {
  std::int64_t mlp_scale;
  double embed_pdrop, resid_pdrop, attn_pdrop;
  bool scale_attn_by_inverse_layer_idx, use_bias;
};

// One block: LayerNorm, attention, LayerNorm, MLP.
struct Block {
  Parameter *ln_1_weight = nullptr, *ln_1_bias = nullptr;
  loom::models::AttentionBlock attn;
  Parameter *ln_2_weight = nullptr, *ln_2_bias = nullptr;
  loom::models::MlpBlock mlp;
};

using loom::models::tensor_or_none;

class Gpt2Model final : public loom::models::TransformerLm {
 public:
  Gpt2Model(const Gpt2Options& o, loom::Handle<loom::AttentionKernel> kernel, loom::ExecutionContext& execution)
      : TransformerLm(o.path, {"gpt2"}, "GPT-2"),
        o_(o),
        kernel_(std::move(kernel)),
        execution_(&execution),
        head_dim_(o.hidden_dim / o.num_heads) {}

  void build(const loom::ModelSetup& setup) override {
    begin_build(o_.vocab_size, setup);
    const std::int64_t c = o_.hidden_dim;
    const bool bias = o_.use_bias;
    store_.declare("wte.weight", Shape{vocab_, c}, ParameterRole::embedding, &wte_, vocab_parallel());
    store_.declare("wpe.weight", Shape{o_.seq_len, c}, ParameterRole::embedding, &wpe_);
    blocks_.resize(static_cast<std::size_t>(o_.num_layers));
    for (std::int64_t l = 0; l < o_.num_layers; ++l) {
      Block& b = blocks_[static_cast<std::size_t>(l)];
      const std::string p = "h." + std::to_string(l) + ".";
      store_.declare(p + "ln_1.weight", Shape{c}, ParameterRole::norm, &b.ln_1_weight);
      if (bias) store_.declare(p + "ln_1.bias", Shape{c}, ParameterRole::norm, &b.ln_1_bias);
      b.attn.declare(store_, p + "attn.", attention_config(l));
      b.attn.set_kernel(*kernel_);
      store_.declare(p + "ln_2.weight", Shape{c}, ParameterRole::norm, &b.ln_2_weight);
      if (bias) store_.declare(p + "ln_2.bias", Shape{c}, ParameterRole::norm, &b.ln_2_bias);
      // Conv1D's [in, out] weights: "mlp.c_fc" widens, "mlp.c_proj" narrows.
      b.mlp.declare(store_, p + "mlp.",
                    {.hidden_dim = c,
                     .intermediate_dim = o_.hidden_dim * o_.mlp_scale,
                     .kind = loom::models::MlpKind::gelu,
                     .bias = bias,
                     .weight_in_out = true,
                     .up_name = "c_fc",
                     .down_name = "c_proj"});
    }
    store_.declare("ln_f.weight", Shape{c}, ParameterRole::norm, &ln_f_weight_);
    if (bias) store_.declare("ln_f.bias", Shape{c}, ParameterRole::norm, &ln_f_bias_);
    if (!o_.tie_word_embeddings)
      store_.declare("lm_head.weight", Shape{vocab_, c}, ParameterRole::weight, &lm_head_, vocab_parallel());
    finish_build(setup);
  }

  void initialize(std::uint64_t seed) override {
    require_built("initialize");
    // GPT-2's initialisation: normal(0, initializer_range) for every matrix and embedding, the
    // two projections that write into the residual stream scaled down by 1/sqrt(2 * layers),
    // biases 0, LayerNorm weights 1.
    const double std = o_.initializer_range;
    const double residual_std = std / std::sqrt(2.0 * static_cast<double>(o_.num_layers));
    const auto& params = store_.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      Parameter* p = params[i].parameter;
      const std::uint64_t key = loom::stream_key(seed, 1, i);
      if (params[i].role == ParameterRole::norm) {
        const bool is_weight = p->name().ends_with(".weight");
        loom::models::fill_constant(p->data(), is_weight ? 1.0f : 0.0f, init_backend());
      } else if (params[i].role == ParameterRole::bias) {
        loom::models::fill_constant(p->data(), 0.0f, init_backend());
      } else {
        const bool residual = p->name().ends_with("c_proj.weight");
        loom::models::fill_normal(store_, i, key, residual ? residual_std : std, *execution_, init_backend());
      }
    }
  }

  std::int64_t max_seq_len() const override { return o_.seq_len; }

  // ---- Hugging Face (transformers' GPT2LMHeadModel, GPT2Config) ----

  loom::Value hf_config() const override;
  loom::HfTensorLayout hf_tensors() const override;

 private:
  loom::RematPolicy remat_policy() const override { return o_.remat; }

  // Block l's attention: as many key/value heads as query heads, no rotary embedding; q, k and v
  // from one Conv1D "attn.c_attn" [hidden, 3 * hidden], the output "attn.c_proj".
  loom::models::AttentionConfig attention_config(std::int64_t l) const {
    loom::models::AttentionConfig a;
    a.hidden_dim = o_.hidden_dim;
    a.num_heads = a.num_kv_heads = o_.num_heads;
    a.head_dim = head_dim_;
    a.weight_in_out = true;
    a.qkv_bias = a.out_bias = o_.use_bias;
    a.params.causal = true;
    if (o_.scale_attn_by_inverse_layer_idx)
      a.params.scale = 1.0f / (std::sqrt(static_cast<float>(head_dim_)) * static_cast<float>(l + 1));
    a.qkv_name = "c_attn";
    a.out_name = "c_proj";
    a.model = "model (gpt2)";
    return a;
  }
  loom::models::TransformerShape transformer_shape() const override {
    loom::models::TransformerShape s;
    s.num_layers = o_.num_layers;
    s.hidden_dim = o_.hidden_dim;
    s.num_heads = s.num_kv_heads = o_.num_heads;
    s.head_dim = head_dim_;
    s.intermediate_dim = o_.hidden_dim * o_.mlp_scale;
    s.vocab_size = vocab_;
    return s;
  }

  // The check of a config.json against the model (gpt2_interop.cpp).
  void check_hf_config(loom::HfConfigCheck& check, const std::string&, const loom::Value&) const override;

  const char* name() const override { return "gpt2"; }
  CacheShape cache_shape() const override { return {o_.num_layers, blocks_.front().attn.local_kv_heads(), head_dim_}; }

  Tensor head() const override { return o_.tie_word_embeddings ? wte_->tensor() : lm_head_->tensor(); }

  // The final hidden states (after ln_f) of `tokens` [batch, seq]. With a cache, the tokens
  // follow the cached positions, and their keys and values are appended to it.
  Tensor forward(Ops& ops, const Tensor& tokens, const Tensor& segments, loom::models::LayerKvCache* cache) override {
    const std::int64_t batch = tokens.size(0), seq = tokens.size(1);
    const std::int64_t offset = cache ? cache->length() : 0;
    std::vector<std::int32_t> pos(static_cast<std::size_t>(batch * seq));
    for (std::int64_t i = 0; i < batch * seq; ++i)
      pos[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(offset + i % seq);
    // Made on the host, copied to a device backend's memory explicitly (a no-op on the host).
    const Tensor positions =
        Tensor::from(std::span<const std::int32_t>(pos), Shape{batch, seq}).to(ops.backend().device());

    const Tensor tok = embed(ops, wte_->tensor(), tokens);
    const Tensor pe = ops.embedding(wpe_->tensor(), positions);
    const Block& first = blocks_.front();
    Tensor h, x;
    const auto eps = static_cast<float>(o_.layer_norm_epsilon);
    const auto resid_pdrop = static_cast<float>(o_.resid_pdrop);
    if (o_.embed_pdrop > 0.0 && ops.training()) {
      h = ops.dropout(ops.add(tok, pe), static_cast<float>(o_.embed_pdrop));
      x = ops.layer_norm(h, tensor_or_none(first.ln_1_weight), tensor_or_none(first.ln_1_bias), eps);
    } else {
      std::tie(h, x) =
          ops.add_layer_norm(tok, pe, tensor_or_none(first.ln_1_weight), tensor_or_none(first.ln_1_bias), eps);
    }

    const loom::models::AttentionInput input{
        .batch = batch, .seq = seq, .offset = offset, .segments = segments, .cache = cache};
    for (std::size_t l = 0; l < blocks_.size(); ++l) {
      std::tie(h, x) = loom::models::run_layer(
          ops, cache ? loom::RematPolicy::none : o_.remat, h, x, [=, this](Ops& ops, Tensor h, Tensor x) {
            const Block& b = blocks_[l];
            loom::models::AttentionInput in = input;
            in.layer = static_cast<std::int64_t>(l);
            const Tensor attn_out = ops.dropout(b.attn.forward(ops, x, in), resid_pdrop);
            std::tie(h, x) = ops.add_layer_norm(h, attn_out, b.ln_2_weight->tensor(), tensor_or_none(b.ln_2_bias), eps);
            const Tensor mlp_out = ops.dropout(b.mlp.forward(ops, x), resid_pdrop);
            // The residual add fused with the next norm: the next block's ln_1, or ln_f after the last.
            const bool last = l + 1 == blocks_.size();
            const Parameter* norm_w = last ? ln_f_weight_ : blocks_[l + 1].ln_1_weight;
            const Parameter* norm_b = last ? ln_f_bias_ : blocks_[l + 1].ln_1_bias;
            return ops.add_layer_norm(h, mlp_out, norm_w->tensor(), tensor_or_none(norm_b), eps);
          });
    }
    if (cache) cache->advance(seq);
    return x;
  }

  Gpt2Options o_;
  loom::Handle<loom::AttentionKernel> kernel_;
  loom::ExecutionContext* execution_;
  std::int64_t head_dim_;
  Parameter *wte_ = nullptr, *wpe_ = nullptr, *ln_f_weight_ = nullptr, *ln_f_bias_ = nullptr, *lm_head_ = nullptr;
  std::vector<Block> blocks_;
};

// The Hugging Face model_types the plugin reads (gpt2) and how a config.json of
// one maps to the loom `model` section (gpt2_interop.cpp), for Registrar::add_hf_architectures.
loom::HfArchitectures hf_architectures();
// Its tokenizer class (GPT2Tokenizer) and its default special tokens, for
// Registrar::add_hf_tokenizer_class.
loom::HfTokenizerClass hf_tokenizer_class();

}  // namespace loom::gpt2
