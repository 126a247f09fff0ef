// The `gemma` model's options and registration. The model is gemma_model.hpp; its Hugging Face
// mapping, gemma_interop.cpp.
#include "gemma_model.hpp"

#include <loom/plugin.hpp>

namespace {

using loom::gemma::GemmaModel;
using loom::gemma::GemmaOptions;

loom::models::DecoderSchema<GemmaOptions> gemma_options() {
  using O = GemmaOptions;
  loom::models::DecoderSchema<O> s;
  s.seq_len(8192, "Longest sequence (the RoPE table's length).");
  s.hidden_dim(2304, "Width of the residual stream.");
  s.intermediate_dim(9216, "Width of the GeGLU MLP.");
  s.num_layers(26, "Decoder layers; the even ones (0, 2, ...) use the sliding window.");
  s.num_heads(8, "Query heads.");
  s.num_kv_heads(4, "Key/value heads (grouped-query attention); divides num_heads.");
  s.head_dim(256, "Width of one head (even).");
  s.field("query_pre_attn_scalar", &O::query_pre_attn_scalar, std::nullopt,
          "Attention scores are scaled by this^-1/2; null: head_dim.")
      .min(0.0, false)
      .null_as([](const O& o) { return static_cast<double>(o.head_dim); });
  s.field("attn_logit_softcapping", &O::attn_logit_softcapping, 50.0,
          "Soft-cap of the attention scores (cap * tanh(s / cap)); null: none.")
      .nullable()
      .min(0.0, false)
      .null_as(0.0);
  s.field("final_logit_softcapping", &O::final_logit_softcapping, 30.0, "Soft-cap of the output logits; null: none.")
      .nullable()
      .min(0.0, false)
      .null_as(0.0);
  s.sliding_window(4096, "Window of the even layers' local attention; null: every layer global.").nullable();
  s.field("rope_theta", &O::rope_theta, 10000.0, "Base of the rotary embedding's frequencies.").min(0.0, false);
  s.initializer_range();
  s.layer_norm_epsilon(1e-6, "RMSNorm epsilon.");
  s.tie_word_embeddings(true, "Use the token embedding as the output projection (Gemma always does).");
  s.vocab_size();
  s.remat();
  s.attention();
  s.then([](O& o, const loom::Options&) {
    loom::models::check_kv_heads(o.path, o.num_heads, o.num_kv_heads);
    loom::models::check_rotary_head_dim(o.path, o.head_dim);
  });
  return s;
}

void register_components(loom::Registrar& registrar) {
  const auto options = gemma_options();
  registrar.add<loom::Model>(
      {.name = "gemma",
       .description =
           "Gemma 2: (1 + w) RMSNorm before and after attention and MLP, GeGLU, soft-capped attention and logits, "
           "alternating sliding-window and global layers",
       .version = "1.0.0",
       .options = options.schema()},
      [options](const loom::Options& given, const loom::CreateContext& ctx) {
        const GemmaOptions o = options.read(given);
        auto kernel = ctx.create<loom::AttentionKernel>(o.attention);
        return std::make_unique<GemmaModel>(o, std::move(kernel), ctx.execution());
      });
  registrar.add_hf_architectures(loom::gemma::hf_architectures());
  registrar.add_hf_tokenizer_class(loom::gemma::hf_tokenizer_class());
}

}  // namespace

LOOM_PLUGIN(register_components)
