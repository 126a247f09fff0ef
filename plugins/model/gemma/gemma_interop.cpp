// The `gemma` model's Hugging Face mapping (gemma2): config.json from the built model
// (HfModel::hf_config), the tensor layout, the check of a directory's config.json against the
// model (check_hf_config, under HfModel::hf_config_mismatches), and the other way, config.json to
// the loom `model` section before any model exists (HfArchitectures, for `loom eval HF_DIR`).
#include <loom/hf_architecture.hpp>
#include <loom/hf_interop.hpp>
#include <string>
#include <vector>

#include "gemma_model.hpp"

namespace loom::gemma {

loom::Value GemmaModel::hf_config() const {
  require_built("hf_config");
  loom::Value c = loom::Value::map();
  c.set("architectures", loom::Value::List{loom::Value("Gemma2ForCausalLM")});
  c.set("model_type", "gemma2");
  c.set("vocab_size", vocab_);
  c.set("hidden_size", o_.hidden_dim);
  c.set("intermediate_size", o_.intermediate_dim);
  c.set("num_hidden_layers", o_.num_layers);
  c.set("num_attention_heads", o_.num_heads);
  c.set("num_key_value_heads", o_.num_kv_heads);
  c.set("head_dim", o_.head_dim);
  c.set("hidden_activation", "gelu_pytorch_tanh");
  c.set("max_position_embeddings", o_.seq_len);
  c.set("initializer_range", o_.initializer_range);
  c.set("rms_norm_eps", o_.layer_norm_epsilon);
  c.set("rope_theta", o_.rope_theta);
  c.set("attention_bias", false);
  c.set("attention_dropout", 0.0);
  c.set("query_pre_attn_scalar", o_.query_pre_attn_scalar);
  c.set("sliding_window", o_.sliding_window > 0 ? loom::Value(o_.sliding_window) : loom::Value());
  c.set("attn_logit_softcapping",
        o_.attn_logit_softcapping > 0 ? loom::Value(o_.attn_logit_softcapping) : loom::Value());
  c.set("final_logit_softcapping",
        o_.final_logit_softcapping > 0 ? loom::Value(o_.final_logit_softcapping) : loom::Value());
  c.set("tie_word_embeddings", o_.tie_word_embeddings);
  return c;
}

loom::HfTensorLayout GemmaModel::hf_tensors() const {
  require_built("hf_tensors");
  loom::HfTensorLayout layout = loom::models::llama_layout(store_, vocab_, o_.num_heads, o_.num_kv_heads, o_.head_dim);
  if (o_.tie_word_embeddings) layout.ignored_suffixes.push_back("lm_head.weight");
  return layout;
}

void GemmaModel::check_hf_config(loom::HfConfigCheck& check, const std::string&, const loom::Value& config) const {
  // An absent field takes Gemma2Config's default (Gemma 2 9B's shapes), as transformers 4.46.3
  // reads it; tests/interop/hf_config_defaults_test.cpp checks each against transformers.
  check.expect_integer("vocab_size", 256000, vocab_, "vocab_size");
  check.expect_integer("hidden_size", 3072, o_.hidden_dim, "hidden_dim");
  check.expect_integer("intermediate_size", 24576, o_.intermediate_dim, "intermediate_dim");
  check.expect_integer("num_hidden_layers", 28, o_.num_layers, "num_layers");
  check.expect_integer("num_attention_heads", 16, o_.num_heads, "num_heads");
  check.expect_integer("num_key_value_heads", 16, o_.num_kv_heads, "num_kv_heads");
  check.expect_integer("head_dim", 256, o_.head_dim, "head_dim");
  check.expect_number("rms_norm_eps", 1e-6, o_.layer_norm_epsilon, "layer_norm_epsilon");
  check.expect_number("rope_theta", 10000.0, o_.rope_theta, "rope_theta");
  check.expect_number("query_pre_attn_scalar", 224.0, o_.query_pre_attn_scalar, "query_pre_attn_scalar");
  check_optional(check, config, "attn_logit_softcapping", 50.0, o_.attn_logit_softcapping);
  check_optional(check, config, "final_logit_softcapping", 30.0, o_.final_logit_softcapping);
  check_optional(check, config, "sliding_window", 4096.0, static_cast<double>(o_.sliding_window));
  check.expect_boolean("tie_word_embeddings", true, o_.tie_word_embeddings, "tie_word_embeddings");
  if (check.boolean("attention_bias", false)) check.mismatch("attention_bias is true; loom's gemma has no biases");
  const std::string act = check.string("hidden_activation", "gelu_pytorch_tanh");
  if (act != "gelu_pytorch_tanh")
    check.mismatch("hidden_activation is " + loom::Value(act).describe() +
                   "; loom's gemma uses the tanh GELU (gelu_pytorch_tanh)");
}

// A field that is a number or null (off); `ours` is 0 when off.
void GemmaModel::check_optional(loom::HfConfigCheck& check, const loom::Value& config, const char* key, double fallback,
                                double ours) const {
  const loom::Value* given = config.is_map() ? config.find(key) : nullptr;
  const double theirs = !given ? fallback : given->is_null() ? 0.0 : check.number(key, fallback);
  if (theirs != ours)
    check.mismatch(std::string(key) + " is " + (theirs > 0 ? loom::Value(theirs).describe() : "null") + ", " + o_.path +
                   "." + key + " is " + (ours > 0 ? loom::Value(ours).describe() : "null"));
}

namespace {

// Gemma2Config's fields; absent ones take its defaults (transformers 4.46.3: Gemma 2 9B's shapes).
HfModelSection gemma2_section(const HfConfigFields& f, const std::string&) {
  HfModelSection section;
  Value& m = section.model;
  m.set("type", "gemma");
  m.set("seq_len", f.size("max_position_embeddings", 8192));
  m.set("hidden_dim", f.size("hidden_size", 3072));
  m.set("intermediate_dim", f.size("intermediate_size", 24576));
  m.set("num_layers", f.size("num_hidden_layers", 28));
  m.set("num_heads", f.size("num_attention_heads", 16));
  m.set("num_kv_heads", f.size("num_key_value_heads", 16));
  m.set("head_dim", f.size("head_dim", 256));
  m.set("query_pre_attn_scalar", f.number("query_pre_attn_scalar", 224.0));
  m.set("attn_logit_softcapping", positive_or_null(f.number_or_off("attn_logit_softcapping", 50.0)));
  m.set("final_logit_softcapping", positive_or_null(f.number_or_off("final_logit_softcapping", 30.0)));
  m.set("sliding_window", positive_or_null(f.positions_or_off("sliding_window", 4096.0)));
  m.set("rope_theta", f.number("rope_theta", 10000.0));
  m.set("layer_norm_epsilon", f.number("rms_norm_eps", 1e-6));
  m.set("initializer_range", f.number("initializer_range", 0.02));
  m.set("tie_word_embeddings", f.boolean("tie_word_embeddings", true));
  m.set("vocab_size", f.size("vocab_size", 256000));
  auto size = [&](const char* field, const char* option) { return HfSizeField{field, m.find(option)->as_int()}; };
  section.vocab_size = size("vocab_size", "vocab_size");
  section.hidden_size = size("hidden_size", "hidden_dim");
  section.num_layers = size("num_hidden_layers", "num_layers");
  section.intermediate_size = size("intermediate_size", "intermediate_dim");
  return section;
}

}  // namespace

HfArchitectures hf_architectures() {
  return {.model = "gemma", .model_types = {"gemma2"}, .model_section = gemma2_section};
}

HfTokenizerClass hf_tokenizer_class() {
  // transformers 4.46's GemmaTokenizer, AutoTokenizer's class of Gemma (which loom's gemma does not
  // map) and of Gemma 2.
  return {.name = "GemmaTokenizer", .bos_token = "<bos>", .eos_token = "<eos>", .model_types = {"gemma", "gemma2"}};
}

}  // namespace loom::gemma
