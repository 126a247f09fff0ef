// The `gemma` model's options and registration. The model is gemma_model.hpp; its Hugging Face
// mapping, gemma_interop.cpp.
#include "gemma_model.hpp"

#include <loom/plugin.hpp>

namespace {

using loom::gemma::GemmaModel;
using loom::gemma::GemmaOptions;

loom::OptionSchema gemma_schema() {
  loom::OptionSchema s;
  s.integer("seq_len", 8192, "Longest sequence (the RoPE table's length).")
      .min(1)
      .max(static_cast<double>(loom::models::max_model_seq_len));
  s.integer("hidden_dim", 2304, "Width of the residual stream.")
      .min(1)
      .max(static_cast<double>(loom::models::max_model_width));
  s.integer("intermediate_dim", 9216, "Width of the GeGLU MLP.")
      .min(1)
      .max(static_cast<double>(loom::models::max_model_width));
  s.integer("num_layers", 26, "Decoder layers; the even ones (0, 2, ...) use the sliding window.")
      .min(1)
      .max(static_cast<double>(loom::models::max_model_layers));
  s.integer("num_heads", 8, "Query heads.").min(1).max(static_cast<double>(loom::models::max_model_heads));
  s.integer("num_kv_heads", 4, "Key/value heads (grouped-query attention); divides num_heads.")
      .min(1)
      .max(static_cast<double>(loom::models::max_model_heads));
  s.integer("head_dim", 256, "Width of one head (even).")
      .min(2)
      .max(static_cast<double>(loom::models::max_model_width));
  s.number("query_pre_attn_scalar", std::nullopt, "Attention scores are scaled by this^-1/2; null: head_dim.")
      .min(0.0, false);
  s.number("attn_logit_softcapping", 50.0, "Soft-cap of the attention scores (cap * tanh(s / cap)); null: none.")
      .nullable()
      .min(0.0, false);
  s.number("final_logit_softcapping", 30.0, "Soft-cap of the output logits; null: none.").nullable().min(0.0, false);
  s.integer("sliding_window", 4096, "Window of the even layers' local attention; null: every layer global.")
      .nullable()
      .min(1);
  s.number("rope_theta", 10000.0, "Base of the rotary embedding's frequencies.").min(0.0, false);
  s.number("initializer_range", 0.02, "Standard deviation of the normal initialisation.").min(0.0);
  s.number("layer_norm_epsilon", 1e-6, "RMSNorm epsilon.").min(0.0);
  s.boolean("tie_word_embeddings", true, "Use the token embedding as the output projection (Gemma always does).");
  s.integer("vocab_size", std::nullopt, "Vocabulary size; null takes the tokenizer's.")
      .min(1)
      .max(static_cast<double>(loom::models::max_model_vocab_size));
  s.string("remat", "none", loom::models::remat_doc).one_of({"none", "full", "save_dots"});
  s.component("attention", "attention", "auto",
              "The attention kernel, by name or {type: NAME, ...}; auto: the one the backend's device prefers "
              "(flash on the host; docs/attention-kernels.md#auto).");
  return s;
}

GemmaOptions read_options(const loom::Options& options) {
  const std::string at = loom::models::options_path(options);
  GemmaOptions o;
  o.seq_len = options.get<std::int64_t>("seq_len");
  o.hidden_dim = options.get<std::int64_t>("hidden_dim");
  o.intermediate_dim = options.get<std::int64_t>("intermediate_dim");
  o.num_layers = options.get<std::int64_t>("num_layers");
  o.num_heads = options.get<std::int64_t>("num_heads");
  o.num_kv_heads = options.get<std::int64_t>("num_kv_heads");
  o.head_dim = options.get<std::int64_t>("head_dim");
  o.query_pre_attn_scalar =
      options.get_optional<double>("query_pre_attn_scalar").value_or(static_cast<double>(o.head_dim));
  o.attn_logit_softcapping = options.get_optional<double>("attn_logit_softcapping").value_or(0.0);
  o.final_logit_softcapping = options.get_optional<double>("final_logit_softcapping").value_or(0.0);
  o.sliding_window = options.get_optional<std::int64_t>("sliding_window").value_or(0);
  o.rope_theta = options.get<double>("rope_theta");
  o.initializer_range = options.get<double>("initializer_range");
  o.layer_norm_epsilon = options.get<double>("layer_norm_epsilon");
  o.tie_word_embeddings = options.get<bool>("tie_word_embeddings");
  o.vocab_size = options.get_optional<std::int64_t>("vocab_size").value_or(0);
  o.path = at;
  o.remat = loom::models::parse_remat(options.get<std::string>("remat"));
  loom::models::check_kv_heads(at, o.num_heads, o.num_kv_heads);
  loom::models::check_rotary_head_dim(at, o.head_dim);
  return o;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Model>(
      {.name = "gemma",
       .description =
           "Gemma 2: (1 + w) RMSNorm before and after attention and MLP, GeGLU, soft-capped attention and logits, "
           "alternating sliding-window and global layers",
       .version = "1.0.0",
       .options = gemma_schema()},
      [](const loom::Options& options, const loom::CreateContext& ctx) {
        const GemmaOptions o = read_options(options);
        auto kernel = ctx.create<loom::AttentionKernel>(options.component("attention"));
        return std::make_unique<GemmaModel>(o, std::move(kernel), ctx.execution());
      });
  registrar.add_hf_architectures(loom::gemma::hf_architectures());
}

}  // namespace

LOOM_PLUGIN(register_components)
