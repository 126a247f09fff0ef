// The `gpt2` model's options and registration. The model is gpt2_model.hpp; its Hugging Face
// mapping, gpt2_interop.cpp.
#include "gpt2_model.hpp"

#include <loom/plugin.hpp>

namespace {

using loom::gpt2::Gpt2Model;
using loom::gpt2::Gpt2Options;

loom::models::DecoderSchema<Gpt2Options> gpt2_options() {
  using O = Gpt2Options;
  loom::models::DecoderSchema<O> s;
  s.seq_len(1024, "Longest sequence: the number of learned positions.");
  s.hidden_dim(768, "Width of the residual stream (n_embd).");
  s.num_layers(12, "Transformer blocks (n_layer).");
  s.num_heads(12, "Attention heads; must divide hidden_dim.");
  s.field("mlp_scale", &O::mlp_scale, 4, "MLP width as a multiple of hidden_dim.").min(1).max(1024);
  s.initializer_range();
  s.field("embed_pdrop", &O::embed_pdrop, 0.0, "Dropout on the summed token and position embeddings.")
      .min(0.0)
      .max(1.0, false);
  s.field("resid_pdrop", &O::resid_pdrop, 0.0, "Dropout on each block's attention and MLP outputs.")
      .min(0.0)
      .max(1.0, false);
  s.field("attn_pdrop", &O::attn_pdrop, 0.0,
          "Dropout on attention probabilities: must be 0, loom's attention kernels have none.")
      .min(0.0)
      .max(1.0, false);
  s.layer_norm_epsilon(1e-5, "LayerNorm epsilon.");
  s.field("scale_attn_by_inverse_layer_idx", &O::scale_attn_by_inverse_layer_idx, false,
          "Divide attention scores of layer i (from 0) by i + 1 as well as by sqrt(head_dim) (Mistral's tweak).");
  s.field("use_bias", &O::use_bias, true, "Biases in every linear layer and LayerNorm.");
  s.tie_word_embeddings(true, "Use the token embedding (wte) as the output projection.");
  s.vocab_size();
  s.remat();
  s.attention();
  s.then([](O& o, const loom::Options&) {
    if (o.hidden_dim % o.num_heads != 0)
      throw loom::UserError(o.path + ": num_heads (" + std::to_string(o.num_heads) + ") must divide hidden_dim (" +
                            std::to_string(o.hidden_dim) + ")");
    if (o.attn_pdrop != 0.0)
      throw loom::UserError(o.path +
                            ".attn_pdrop: must be 0: loom's attention kernels apply no dropout to "
                            "attention probabilities (use resid_pdrop or embed_pdrop)");
  });
  return s;
}

void register_components(loom::Registrar& registrar) {
  const auto options = gpt2_options();
  registrar.add<loom::Model>({.name = "gpt2",
                              .description = "GPT-2: learned positions, pre-LayerNorm, GELU MLP, tied embeddings",
                              .version = "1.0.0",
                              .options = options.schema()},
                             [options](const loom::Options& given, const loom::CreateContext& ctx) {
                               const Gpt2Options o = options.read(given);
                               auto kernel = ctx.create<loom::AttentionKernel>(o.attention);
                               return std::make_unique<Gpt2Model>(o, std::move(kernel), ctx.execution());
                             });
  registrar.add_hf_architectures(loom::gpt2::hf_architectures());
  registrar.add_hf_tokenizer_class(loom::gpt2::hf_tokenizer_class());
}

}  // namespace

LOOM_PLUGIN(register_components)
