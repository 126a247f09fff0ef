// The `llama` model's options and registration. The model is llama_model.hpp; its Hugging Face
// mapping, llama_interop.cpp.
#include "llama_model.hpp"

#include <loom/plugin.hpp>

namespace {

using loom::llama::LlamaModel;
using loom::llama::LlamaOptions;

loom::OptionSchema rope_schema() {
  loom::OptionSchema s;
  s.string("type", "default", "default: plain RoPE; llama3: Llama 3.1's rescaled frequencies.")
      .one_of({"default", "llama3"});
  // Null unless given: the type decides.
  s.number("theta", std::nullopt, "Base of the frequencies; null: 10000 (default) or 500000 (llama3).").min(0.0, false);
  s.number("factor", std::nullopt,
           "Scaling factor; null: 1 (default) or 8 (llama3). For default, every frequency is divided by it "
           "(linear position interpolation).")
      .min(0.0, false);
  s.number("low_freq_factor", 1.0, "llama3: wavelengths above original_max_position_embeddings / this are scaled.")
      .min(0.0, false);
  s.number("high_freq_factor", 4.0, "llama3: wavelengths below original_max_position_embeddings / this are kept.")
      .min(0.0, false);
  s.integer("original_max_position_embeddings", 8192, "llama3: the context length the model was trained at.").min(1);
  return s;
}

loom::OptionSchema llama_schema() {
  loom::OptionSchema s;
  s.integer("seq_len", 2048, "Longest sequence (the RoPE table's length).")
      .min(1)
      .max(static_cast<double>(loom::models::max_model_seq_len));
  s.integer("hidden_dim", 4096, "Width of the residual stream.")
      .min(1)
      .max(static_cast<double>(loom::models::max_model_width));
  s.integer("intermediate_dim", 11008, "Width of the SwiGLU MLP.")
      .min(1)
      .max(static_cast<double>(loom::models::max_model_width));
  s.integer("num_layers", 32, "Decoder layers.").min(1).max(static_cast<double>(loom::models::max_model_layers));
  s.integer("num_heads", 32, "Query heads.").min(1).max(static_cast<double>(loom::models::max_model_heads));
  s.integer("num_kv_heads", 32, "Key/value heads (grouped-query attention; 1 is multi-query); divides num_heads.")
      .min(1)
      .max(static_cast<double>(loom::models::max_model_heads));
  s.integer("head_dim", std::nullopt, "Width of one head (even); null: hidden_dim / num_heads.")
      .min(2)
      .max(static_cast<double>(loom::models::max_model_width));
  s.object("rope", rope_schema(), "Rotary position embedding.");
  s.number("initializer_range", 0.02, "Standard deviation of the normal initialisation.").min(0.0);
  s.number("layer_norm_epsilon", 1e-5, "RMSNorm epsilon.").min(0.0);
  s.boolean("tie_word_embeddings", false, "Use the token embedding as the output projection.");
  s.boolean("use_bias", false, "Biases in every linear projection (q, k, v, o and the MLP).");
  s.boolean("qkv_bias", false, "Biases in the q, k and v projections only (Qwen2); use_bias includes them.");
  s.integer("sliding_window", std::nullopt, "Attend to the last this many positions only (Mistral); null: all.").min(1);
  s.integer("max_window_layers", 0,
            "With sliding_window: layers numbered below this attend to every position, the others use the window "
            "(Qwen2's max_window_layers); 0: every layer uses it.")
      .min(0);
  s.boolean("use_qk_norm", false, "RMSNorm over each query and key head before RoPE (Qwen3).");
  s.object("moe", loom::models::moe_schema(), "Sparse mixture of SwiGLU experts in place of the MLP (Mixtral).");
  s.string("remat", "none", loom::models::remat_doc).one_of({"none", "full", "save_dots"});
  s.integer("vocab_size", std::nullopt, "Vocabulary size; null takes the tokenizer's.")
      .min(1)
      .max(static_cast<double>(loom::models::max_model_vocab_size));
  s.component("attention", "attention", "auto",
              "The attention kernel, by name or {type: NAME, ...}; auto: the one the backend's device prefers "
              "(flash on the host; docs/attention-kernels.md#auto).");
  return s;
}

LlamaOptions read_options(const loom::Options& options) {
  const std::string at = loom::models::options_path(options);
  LlamaOptions o;
  o.seq_len = options.get<std::int64_t>("seq_len");
  o.hidden_dim = options.get<std::int64_t>("hidden_dim");
  o.intermediate_dim = options.get<std::int64_t>("intermediate_dim");
  o.num_layers = options.get<std::int64_t>("num_layers");
  o.num_heads = options.get<std::int64_t>("num_heads");
  o.num_kv_heads = options.get<std::int64_t>("num_kv_heads");
  o.initializer_range = options.get<double>("initializer_range");
  o.layer_norm_epsilon = options.get<double>("layer_norm_epsilon");
  o.tie_word_embeddings = options.get<bool>("tie_word_embeddings");
  o.use_bias = options.get<bool>("use_bias");
  o.qkv_bias = options.get<bool>("qkv_bias");
  o.path = at;
  o.use_qk_norm = options.get<bool>("use_qk_norm");
  o.sliding_window = options.get_optional<std::int64_t>("sliding_window").value_or(0);
  o.max_window_layers = options.get<std::int64_t>("max_window_layers");
  if (o.max_window_layers > 0 && o.sliding_window == 0)
    throw loom::UserError(at + ".max_window_layers is " + std::to_string(o.max_window_layers) + " but " + at +
                          ".sliding_window is null; max_window_layers says which layers use the window, so set both "
                          "(or leave max_window_layers at 0)");
  o.vocab_size = options.get_optional<std::int64_t>("vocab_size").value_or(0);
  loom::models::check_kv_heads(at, o.num_heads, o.num_kv_heads);
  if (const auto head_dim = options.get_optional<std::int64_t>("head_dim")) {
    o.head_dim = *head_dim;
  } else {
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
  o.remat = loom::models::parse_remat(options.get<std::string>("remat"));
  if (o.moe.num_experts > 0 && o.use_bias)
    throw loom::UserError(at + ".use_bias with " + at +
                          ".moe: the experts have no biases; use qkv_bias for attention biases");

  const loom::Options rope = options.object("rope");
  const bool llama3 = rope.get<std::string>("type") == "llama3";
  o.rope.base = rope.get_optional<double>("theta").value_or(llama3 ? 500000.0 : 10000.0);
  const double factor = rope.get_optional<double>("factor").value_or(llama3 ? 8.0 : 1.0);
  o.rope_options = {rope.get<std::string>("type"),
                    o.rope.base,
                    factor,
                    rope.get<double>("low_freq_factor"),
                    rope.get<double>("high_freq_factor"),
                    rope.get<std::int64_t>("original_max_position_embeddings")};
  if (llama3) {
    o.rope.llama3_scaling = true;
    o.rope.factor = factor;
    o.rope.low_freq_factor = rope.get<double>("low_freq_factor");
    o.rope.high_freq_factor = rope.get<double>("high_freq_factor");
    o.rope.original_max_positions = static_cast<double>(rope.get<std::int64_t>("original_max_position_embeddings"));
    if (!(o.rope.high_freq_factor > o.rope.low_freq_factor))
      throw loom::UserError(at + ".rope: high_freq_factor (" + std::to_string(o.rope.high_freq_factor) +
                            ") must exceed low_freq_factor (" + std::to_string(o.rope.low_freq_factor) + ")");
  } else if (factor != 1.0) {
    // Linear scaling divides every frequency by `factor`. RopeTable's Llama 3 rule divides every
    // wavelength longer than original_max_positions / low_freq_factor by it; with a limit far
    // below the shortest wavelength (2 pi) that is every frequency, which is exactly this.
    o.rope.llama3_scaling = true;
    o.rope.factor = factor;
    o.rope.low_freq_factor = 1.0;
    o.rope.high_freq_factor = 2.0;
    o.rope.original_max_positions = 1e-6;
  }
  return o;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Model>(
      {.name = "llama",
       .description = "Llama: RMSNorm, RoPE, SwiGLU, grouped-query attention; sliding window and qk-norm variants",
       .version = "1.0.0",
       .options = llama_schema()},
      [](const loom::Options& options, const loom::CreateContext& ctx) {
        const LlamaOptions o = read_options(options);
        auto kernel = ctx.create<loom::AttentionKernel>(options.component("attention"));
        return std::make_unique<LlamaModel>(o, std::move(kernel), ctx.execution());
      });
  registrar.add_hf_architectures(loom::llama::hf_architectures());
}

}  // namespace

LOOM_PLUGIN(register_components)
