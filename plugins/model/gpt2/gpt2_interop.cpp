// The `gpt2` model's Hugging Face mapping (gpt2): config.json from the built model
// (HfModel::hf_config), the tensor layout, the check of a directory's config.json against the
// model (check_hf_config, under HfModel::hf_config_mismatches), and the other way, config.json to
// the loom `model` section before any model exists (HfArchitectures, for `loom eval HF_DIR`).
#include <loom/hf_architecture.hpp>
#include <loom/hf_interop.hpp>
#include <string>
#include <vector>

#include "gpt2_model.hpp"

namespace loom::gpt2 {

loom::Value Gpt2Model::hf_config() const {
  require_built("hf_config");
  if (!o_.use_bias)
    throw loom::UserError(o_.path +
                          ".use_bias is false, and Hugging Face's GPT-2 has biases in every linear layer and "
                          "LayerNorm; only a model with use_bias: true can be exported");
  loom::Value c = loom::Value::map();
  c.set("architectures", loom::Value::List{loom::Value("GPT2LMHeadModel")});
  c.set("model_type", "gpt2");
  c.set("vocab_size", vocab_);
  c.set("n_positions", o_.seq_len);
  c.set("n_embd", o_.hidden_dim);
  c.set("n_layer", o_.num_layers);
  c.set("n_head", o_.num_heads);
  c.set("n_inner", o_.hidden_dim * o_.mlp_scale);
  c.set("activation_function", "gelu_new");  // GELU's tanh form, as loom's gpt2 computes it
  c.set("resid_pdrop", o_.resid_pdrop);
  c.set("embd_pdrop", o_.embed_pdrop);
  c.set("attn_pdrop", 0.0);
  c.set("layer_norm_epsilon", o_.layer_norm_epsilon);
  c.set("initializer_range", o_.initializer_range);
  c.set("scale_attn_weights", true);
  c.set("scale_attn_by_inverse_layer_idx", o_.scale_attn_by_inverse_layer_idx);
  c.set("reorder_and_upcast_attn", false);
  c.set("tie_word_embeddings", o_.tie_word_embeddings);
  return c;
}

loom::HfTensorLayout Gpt2Model::hf_tensors() const {
  require_built("hf_tensors");
  loom::HfTensorLayout layout;
  layout.base_model_prefix = "transformer";
  const auto& params = store_.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {  // whole tensors: export assembles the shards
    const std::string& name = params[i].parameter->name();
    layout.tensors.push_back(
        {name == "lm_head.weight" ? name : "transformer." + name, name, 0, store_.whole_shape(i)[0]});
  }
  // OpenAI's files and older transformers keep each layer's causal mask ("attn.bias") and
  // masked-score constant ("attn.masked_bias") as tensors; transformers rebuilds both.
  layout.ignored_suffixes = {".attn.bias", ".attn.masked_bias"};
  if (o_.tie_word_embeddings) layout.ignored_suffixes.push_back("lm_head.weight");
  return layout;
}

void Gpt2Model::check_hf_config(loom::HfConfigCheck& check, const std::string&, const loom::Value&) const {
  // GPT2Config's defaults stand in for absent fields.
  check.expect_integer("vocab_size", 50257, vocab_, "vocab_size");
  check.expect_integer("n_positions", 1024, o_.seq_len, "seq_len");
  check.expect_integer("n_embd", 768, o_.hidden_dim, "hidden_dim");
  check.expect_integer("n_layer", 12, o_.num_layers, "num_layers");
  check.expect_integer("n_head", 12, o_.num_heads, "num_heads");
  const std::int64_t n_embd = check.integer("n_embd", 768);
  const std::int64_t inner = check.integer("n_inner", 4 * n_embd);
  if (inner != o_.hidden_dim * o_.mlp_scale)
    check.mismatch("n_inner is " + std::to_string(inner) + ", " + o_.path + ".hidden_dim * " + o_.path +
                   ".mlp_scale is " + std::to_string(o_.hidden_dim * o_.mlp_scale));
  const std::string act = check.string("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    check.mismatch("activation_function is " + loom::Value(act).describe() +
                   "; loom's gpt2 computes GELU's tanh form (\"gelu_new\")");
  check.expect_number("layer_norm_epsilon", 1e-5, o_.layer_norm_epsilon, "layer_norm_epsilon");
  if (!check.boolean("scale_attn_weights", true))
    check.mismatch("scale_attn_weights is false; loom's gpt2 divides attention scores by sqrt(head_dim)");
  check.expect_boolean("scale_attn_by_inverse_layer_idx", false, o_.scale_attn_by_inverse_layer_idx,
                       "scale_attn_by_inverse_layer_idx");
  check.expect_boolean("tie_word_embeddings", true, o_.tie_word_embeddings, "tie_word_embeddings");
  if (!o_.use_bias)
    check.mismatch(o_.path +
                   ".use_bias is false, and GPT-2 checkpoints have biases in every linear layer and "
                   "LayerNorm");
}

namespace {

// GPT2Config's fields; absent ones take its defaults (transformers 4.46.3).
HfModelSection gpt2_section(const HfConfigFields& f, const std::string&) {
  HfModelSection section;
  Value& m = section.model;
  m.set("type", "gpt2");
  const std::int64_t hidden = f.size("n_embd", 768);
  const std::int64_t inner = f.size("n_inner", 4 * hidden);
  if (hidden <= 0 || inner % hidden != 0)
    throw UserError("'" + f.file() + "': n_inner (" + std::to_string(inner) + ") is not a multiple of n_embd (" +
                    std::to_string(hidden) + "); loom's gpt2 has an MLP of mlp_scale x hidden_dim");
  m.set("seq_len", f.size("n_positions", 1024));
  m.set("hidden_dim", hidden);
  m.set("num_layers", f.size("n_layer", 12));
  m.set("num_heads", f.size("n_head", 12));
  m.set("mlp_scale", inner / hidden);
  m.set("layer_norm_epsilon", f.number("layer_norm_epsilon", 1e-5));
  m.set("initializer_range", f.number("initializer_range", 0.02));
  m.set("scale_attn_by_inverse_layer_idx", f.boolean("scale_attn_by_inverse_layer_idx", false));
  m.set("tie_word_embeddings", f.boolean("tie_word_embeddings", true));
  m.set("vocab_size", f.size("vocab_size", 50257));
  section.vocab_size = {"vocab_size", m.find("vocab_size")->as_int()};
  section.hidden_size = {"n_embd", hidden};
  section.num_layers = {"n_layer", m.find("num_layers")->as_int()};
  section.intermediate_size = {"n_inner", inner};
  return section;
}

}  // namespace

HfArchitectures hf_architectures() {
  return {.model = "gpt2", .model_types = {"gpt2"}, .model_section = gpt2_section};
}

HfTokenizerClass hf_tokenizer_class() {
  // transformers 4.46's GPT2Tokenizer: <|endoftext|> is its BOS and its EOS.
  return {.name = "GPT2Tokenizer", .bos_token = "<|endoftext|>", .eos_token = "<|endoftext|>", .model_types = {"gpt2"}};
}

}  // namespace loom::gpt2
