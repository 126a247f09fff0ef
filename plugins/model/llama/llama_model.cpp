// The `llama` model's options and registration. The model is llama_model.hpp; its Hugging Face
// mapping, llama_interop.cpp.
#include "llama_model.hpp"

#include <loom/plugin.hpp>

namespace {

using loom::llama::LlamaModel;
using loom::llama::LlamaOptions;
using loom::llama::RopeOptions;

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
void finish_options(LlamaOptions& o, const loom::Options&) {
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

  loom::models::check_moe_options(o.moe, at);
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
    o.rope = loom::models::linear_rope(r.theta, r.factor);  // every frequency divided by `factor`
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
  // The SDK's binding of the experts' options; finish_options checks them and fills in the widths.
  s.object("moe", &O::moe, loom::models::moe_options(),
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
  registrar.add_hf_architectures(loom::llama::hf_architectures());
  for (const auto& c : loom::llama::hf_tokenizer_classes()) registrar.add_hf_tokenizer_class(c);
}

}  // namespace

LOOM_PLUGIN(register_components)
