// The `gpt2` model's options and registration. The model is gpt2_model.hpp; its Hugging Face
// mapping, gpt2_interop.cpp.
#include "gpt2_model.hpp"

#include <loom/plugin.hpp>

namespace {

using loom::gpt2::Gpt2Model;
using loom::gpt2::Gpt2Options;

loom::OptionSchema gpt2_schema() {
  loom::OptionSchema s;
  s.integer("seq_len", 1024, "Longest sequence: the number of learned positions.")
      .min(1)
      .max(static_cast<double>(loom::models::max_model_seq_len));
  s.integer("hidden_dim", 768, "Width of the residual stream (n_embd).")
      .min(1)
      .max(static_cast<double>(loom::models::max_model_width));
  s.integer("num_layers", 12, "Transformer blocks (n_layer).")
      .min(1)
      .max(static_cast<double>(loom::models::max_model_layers));
  s.integer("num_heads", 12, "Attention heads; must divide hidden_dim.")
      .min(1)
      .max(static_cast<double>(loom::models::max_model_heads));
  s.integer("mlp_scale", 4, "MLP width as a multiple of hidden_dim.").min(1).max(1024);
  s.number("initializer_range", 0.02, "Standard deviation of the normal initialisation.").min(0.0);
  s.number("embed_pdrop", 0.0, "Dropout on the summed token and position embeddings.").min(0.0).max(1.0, false);
  s.number("resid_pdrop", 0.0, "Dropout on each block's attention and MLP outputs.").min(0.0).max(1.0, false);
  s.number("attn_pdrop", 0.0, "Dropout on attention probabilities: must be 0, loom's attention kernels have none.")
      .min(0.0)
      .max(1.0, false);
  s.number("layer_norm_epsilon", 1e-5, "LayerNorm epsilon.").min(0.0);
  s.boolean("scale_attn_by_inverse_layer_idx", false,
            "Divide attention scores of layer i (from 0) by i + 1 as well as by sqrt(head_dim) (Mistral's tweak).");
  s.boolean("use_bias", true, "Biases in every linear layer and LayerNorm.");
  s.boolean("tie_word_embeddings", true, "Use the token embedding (wte) as the output projection.");
  s.integer("vocab_size", std::nullopt, "Vocabulary size; null takes the tokenizer's.")
      .min(1)
      .max(static_cast<double>(loom::models::max_model_vocab_size));
  s.string("remat", "none", loom::models::remat_doc).one_of({"none", "full", "save_dots"});
  s.component("attention", "attention", "auto",
              "The attention kernel, by name or {type: NAME, ...}; auto: the one the backend's device prefers "
              "(flash on the host; docs/attention-kernels.md#auto).");
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Model>(
      {.name = "gpt2",
       .description = "GPT-2: learned positions, pre-LayerNorm, GELU MLP, tied embeddings",
       .version = "1.0.0",
       .options = gpt2_schema()},
      [](const loom::Options& options, const loom::CreateContext& ctx) {
        Gpt2Options o;
        o.seq_len = options.get<std::int64_t>("seq_len");
        o.hidden_dim = options.get<std::int64_t>("hidden_dim");
        o.num_layers = options.get<std::int64_t>("num_layers");
        o.num_heads = options.get<std::int64_t>("num_heads");
        o.mlp_scale = options.get<std::int64_t>("mlp_scale");
        o.initializer_range = options.get<double>("initializer_range");
        o.embed_pdrop = options.get<double>("embed_pdrop");
        o.resid_pdrop = options.get<double>("resid_pdrop");
        o.layer_norm_epsilon = options.get<double>("layer_norm_epsilon");
        o.scale_attn_by_inverse_layer_idx = options.get<bool>("scale_attn_by_inverse_layer_idx");
        o.use_bias = options.get<bool>("use_bias");
        o.tie_word_embeddings = options.get<bool>("tie_word_embeddings");
        o.vocab_size = options.get_optional<std::int64_t>("vocab_size").value_or(0);
        const std::string at = options.path().empty() ? "model" : options.path();
        o.path = at;
        o.remat = loom::models::parse_remat(options.get<std::string>("remat"));
        if (o.hidden_dim % o.num_heads != 0)
          throw loom::UserError(at + ": num_heads (" + std::to_string(o.num_heads) + ") must divide hidden_dim (" +
                                std::to_string(o.hidden_dim) + ")");
        if (options.get<double>("attn_pdrop") != 0.0)
          throw loom::UserError(at +
                                ".attn_pdrop: must be 0: loom's attention kernels apply no dropout to "
                                "attention probabilities (use resid_pdrop or embed_pdrop)");
        auto kernel = ctx.create<loom::AttentionKernel>(options.component("attention"));
        return std::make_unique<Gpt2Model>(o, std::move(kernel), ctx.execution());
      });
  registrar.add_hf_architectures(loom::gpt2::hf_architectures());
}

}  // namespace

LOOM_PLUGIN(register_components)
