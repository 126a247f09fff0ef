// The gemma3 model's Hugging Face mapping: transformers' Gemma3ForCausalLM (model_type
// "gemma3_text", transformers 4.50's configuration_gemma3.py Gemma3TextConfig and
// modeling_gemma3.py). The text model only: Gemma3ForConditionalGeneration (model_type "gemma3",
// the 4B+ checkpoints with their vision tower) is another architecture.
#include "gemma3_interop.hpp"

#include <cmath>
#include <fstream>
#include <limits>
#include <loom/error.hpp>
#include <loom/transformer_blocks.hpp>
#include <nlohmann/json.hpp>
#include <string>

namespace loom::gemma3 {

namespace {

// Gemma3TextConfig's defaults (transformers 4.50), for fields config.json leaves out.
constexpr std::int64_t default_vocab = 262208, default_hidden = 2304, default_intermediate = 9216;
constexpr std::int64_t default_layers = 26, default_heads = 8, default_kv_heads = 4, default_head_dim = 256;
constexpr std::int64_t default_positions = 131072, default_window = 4096, default_pattern = 6;
constexpr double default_query_scalar = 256.0, default_theta = 1e6, default_local_theta = 1e4, default_eps = 1e-6;

// config.json's fields with the checks a description needs: a wrong type, or a size that is not a
// positive 32-bit integer, is a UserError naming the file and the field.
class Fields {
 public:
  Fields(const Value& config, std::string file, std::string prefix = "")
      : c_(config), file_(std::move(file)), prefix_(std::move(prefix)) {}

  const Value* get(const char* key) const {
    const Value* v = c_.is_map() ? c_.find(key) : nullptr;
    return v && !v->is_null() ? v : nullptr;
  }
  bool is_null(const char* key) const {
    const Value* v = c_.is_map() ? c_.find(key) : nullptr;
    return v && v->is_null();
  }
  std::int64_t size(const char* key, std::int64_t fallback) const {
    const Value* v = get(key);
    if (!v) return fallback;
    if (!v->is_int() || v->as_int() < 1 || v->as_int() > std::numeric_limits<std::int32_t>::max())
      wrong(key, *v, "a positive integer of at most 2147483647 (2^31 - 1)");
    return v->as_int();
  }
  double number(const char* key, double fallback) const {
    const Value* v = get(key);
    if (!v) return fallback;
    if (!v->is_number() || !std::isfinite(v->as_double())) wrong(key, *v, "a number");
    return v->as_double();
  }
  bool boolean(const char* key, bool fallback) const {
    const Value* v = get(key);
    if (!v) return fallback;
    if (!v->is_bool()) wrong(key, *v, "true or false");
    return v->as_bool();
  }
  std::string string(const char* key, const std::string& fallback) const {
    const Value* v = get(key);
    if (!v) return fallback;
    if (!v->is_string()) wrong(key, *v, "a string");
    return v->as_string();
  }
  [[noreturn]] void wrong(const char* key, const Value& v, const std::string& wanted) const {
    throw UserError("'" + file_ + "': " + prefix_ + key + " is " + v.describe() + ", expected " + wanted);
  }
  const std::string& file() const { return file_; }

 private:
  const Value& c_;
  std::string file_, prefix_;
};

// rope_scaling's linear factor (0: none): null, {"rope_type": "default"} or {"rope_type":
// "linear", "factor": F} ("type" is the older spelling). Another kind is a UserError naming it.
double rope_scaling_factor(const Fields& f, const Value& config) {
  const Value* s = config.is_map() ? config.find("rope_scaling") : nullptr;
  if (!s || s->is_null()) return 0.0;
  if (!s->is_map()) f.wrong("rope_scaling", *s, "null or an object");
  const Fields r(*s, f.file(), "rope_scaling.");
  const std::string kind = r.string("rope_type", r.string("type", "default"));
  if (kind == "default") return 0.0;
  if (kind != "linear")
    throw UserError("'" + f.file() + "': rope_scaling.rope_type is " + Value(kind).describe() +
                    "; loom's gemma3 computes the global layers' RoPE unscaled or with linear scaling "
                    "(rope_type \"linear\", Gemma 3 4B and larger)");
  const double factor = r.number("factor", 1.0);
  if (!(factor > 0.0)) r.wrong("factor", Value(factor), "a positive number");
  return factor;
}

// The smallest pattern p (1 <= p <= layers + 1) whose rule, layer l global when (l + 1) % p == 0,
// gives `sliding` (each layer: whether it uses the window); 0 when none does.
std::int64_t pattern_of(const std::vector<bool>& sliding) {
  const auto n = static_cast<std::int64_t>(sliding.size());
  for (std::int64_t p = 1; p <= n + 1; ++p) {
    bool fits = true;
    for (std::int64_t l = 0; l < n && fits; ++l) fits = sliding[static_cast<std::size_t>(l)] == ((l + 1) % p != 0);
    if (fits) return p;
  }
  return 0;
}

std::string describe_windows(const std::vector<std::int64_t>& windows) {
  std::string s = "[";
  for (std::size_t i = 0; i < windows.size(); ++i)
    s += (i ? ", " : "") + (windows[i] > 0 ? std::to_string(windows[i]) : std::string("global"));
  return s + "]";
}

std::vector<std::int64_t> loom_layer_windows(const ModelOptions& o) {
  std::vector<std::int64_t> w;
  for (std::int64_t l = 0; l < o.num_layers; ++l) w.push_back(o.is_sliding(l) ? o.sliding_window : 0);
  return w;
}

}  // namespace

std::vector<std::int64_t> hf_layer_windows(const Value& config, const std::string& file) {
  const Fields f(config, file);
  const std::int64_t layers = f.size("num_hidden_layers", default_layers);
  // HF's sliding_window null leaves the sliding layers without a window: global.
  const std::int64_t window = f.is_null("sliding_window") ? 0 : f.size("sliding_window", default_window);
  std::vector<std::int64_t> out;
  if (const Value* types = f.get("layer_types")) {
    // transformers 4.53 and later: one "sliding_attention" or "full_attention" per layer.
    if (!types->is_list() || static_cast<std::int64_t>(types->as_list().size()) != layers)
      f.wrong("layer_types", *types,
              "a list of " + std::to_string(layers) +
                  " (num_hidden_layers) \"sliding_attention\" or "
                  "\"full_attention\"");
    for (const Value& t : types->as_list()) {
      if (!t.is_string() || (t.as_string() != "sliding_attention" && t.as_string() != "full_attention"))
        f.wrong("layer_types", *types, "a list of \"sliding_attention\" or \"full_attention\"");
      out.push_back(t.as_string() == "sliding_attention" ? window : 0);
    }
    return out;
  }
  const std::int64_t pattern = f.size("sliding_window_pattern", default_pattern);
  for (std::int64_t l = 0; l < layers; ++l) out.push_back((l + 1) % pattern != 0 ? window : 0);
  return out;
}

Value hf_config(const ModelOptions& o, std::int64_t vocab) {
  Value c = Value::map();
  c.set("architectures", Value::List{Value("Gemma3ForCausalLM")});
  c.set("model_type", "gemma3_text");
  c.set("vocab_size", vocab);
  c.set("hidden_size", o.hidden_dim);
  c.set("intermediate_size", o.intermediate_dim);
  c.set("num_hidden_layers", o.num_layers);
  c.set("num_attention_heads", o.num_heads);
  c.set("num_key_value_heads", o.num_kv_heads);
  c.set("head_dim", o.head_dim);
  c.set("hidden_activation", "gelu_pytorch_tanh");
  c.set("max_position_embeddings", o.seq_len);
  c.set("initializer_range", o.initializer_range);
  c.set("rms_norm_eps", o.layer_norm_epsilon);
  c.set("rope_theta", o.rope_theta);
  c.set("rope_local_base_freq", o.rope_local_base_freq);
  if (o.rope_scaling_factor > 0) {
    Value s = Value::map();
    s.set("rope_type", "linear");
    s.set("factor", o.rope_scaling_factor);
    c.set("rope_scaling", s);
  } else {
    c.set("rope_scaling", Value());
  }
  c.set("attention_bias", false);
  c.set("attention_dropout", 0.0);
  c.set("query_pre_attn_scalar", o.query_pre_attn_scalar);
  // Without a window every layer is global: pattern 1 (transformers 4.50 needs a window on any
  // sliding layer, so none is left sliding).
  c.set("sliding_window", o.sliding_window > 0 ? Value(o.sliding_window) : Value());
  c.set("sliding_window_pattern", o.sliding_window > 0 ? o.sliding_window_pattern : std::int64_t{1});
  // The same layers as transformers 4.53 and later spell them (4.50 keeps the field unread).
  Value::List types;
  for (std::int64_t l = 0; l < o.num_layers; ++l)
    types.emplace_back(o.is_sliding(l) ? "sliding_attention" : "full_attention");
  c.set("layer_types", Value(std::move(types)));
  c.set("final_logit_softcapping", o.final_logit_softcapping > 0 ? Value(o.final_logit_softcapping) : Value());
  c.set("attn_logit_softcapping", Value());
  c.set("tie_word_embeddings", o.tie_word_embeddings);
  return c;
}

void check_hf_config(HfConfigCheck& check, const Value& config, const ModelOptions& o, std::int64_t vocab) {
  check.expect_integer("vocab_size", default_vocab, vocab, "vocab_size");
  check.expect_integer("hidden_size", default_hidden, o.hidden_dim, "hidden_dim");
  check.expect_integer("intermediate_size", default_intermediate, o.intermediate_dim, "intermediate_dim");
  check.expect_integer("num_hidden_layers", default_layers, o.num_layers, "num_layers");
  check.expect_integer("num_attention_heads", default_heads, o.num_heads, "num_heads");
  check.expect_integer("num_key_value_heads", default_kv_heads, o.num_kv_heads, "num_kv_heads");
  check.expect_integer("head_dim", default_head_dim, o.head_dim, "head_dim");
  check.expect_number("rms_norm_eps", default_eps, o.layer_norm_epsilon, "layer_norm_epsilon");
  check.expect_number("rope_theta", default_theta, o.rope_theta, "rope_theta");
  check.expect_number("rope_local_base_freq", default_local_theta, o.rope_local_base_freq, "rope_local_base_freq");
  check.expect_number("query_pre_attn_scalar", default_query_scalar, o.query_pre_attn_scalar, "query_pre_attn_scalar");
  check.expect_boolean("tie_word_embeddings", true, o.tie_word_embeddings, "tie_word_embeddings");
  if (check.boolean("attention_bias", false)) check.mismatch("attention_bias is true; loom's gemma3 has no biases");
  if (check.boolean("use_bidirectional_attention", false))
    check.mismatch("use_bidirectional_attention is true; loom's gemma3 is a causal language model");
  const std::string act = check.string("hidden_activation", "gelu_pytorch_tanh");
  if (act != "gelu_pytorch_tanh")
    check.mismatch("hidden_activation is " + Value(act).describe() +
                   "; loom's gemma3 uses the tanh GELU (gelu_pytorch_tanh)");
  // attn_logit_softcapping is not read: transformers' Gemma 3 attention never applies it.
  const Value* cap = config.is_map() ? config.find("final_logit_softcapping") : nullptr;
  const double theirs = cap && !cap->is_null() ? check.number("final_logit_softcapping", 0.0) : 0.0;
  if (theirs != o.final_logit_softcapping)
    check.mismatch("final_logit_softcapping is " + (theirs > 0 ? Value(theirs).describe() : "null") + ", " +
                   check.options_path() + ".final_logit_softcapping is " +
                   (o.final_logit_softcapping > 0 ? Value(o.final_logit_softcapping).describe() : "null"));
  // The RoPE scaling and the layers' windows, compared as what they compute; a malformed field
  // is one mismatch.
  try {
    const double factor = rope_scaling_factor(Fields(config, "config.json"), config);
    // A linear factor of 1 is no scaling.
    const auto normal = [](double f) { return f == 1.0 ? 0.0 : f; };
    if (normal(factor) != normal(o.rope_scaling_factor))
      check.mismatch("rope_scaling is " +
                     (factor > 0 ? "linear with factor " + Value(factor).describe() : std::string("none")) + ", " +
                     check.options_path() + ".rope_scaling_factor is " +
                     (o.rope_scaling_factor > 0 ? Value(o.rope_scaling_factor).describe() : "null"));
    if (static_cast<std::int64_t>(check.integer("num_hidden_layers", default_layers)) == o.num_layers) {
      const std::vector<std::int64_t> theirs_w = hf_layer_windows(config, "config.json");
      const std::vector<std::int64_t> ours_w = loom_layer_windows(o);
      if (theirs_w != ours_w)
        check.mismatch("the layers' attention windows are " + describe_windows(theirs_w) +
                       " (sliding_window, sliding_window_pattern or layer_types), " + check.options_path() +
                       ".sliding_window and sliding_window_pattern give " + describe_windows(ours_w));
    }
  } catch (const UserError& e) {
    check.mismatch(e.what());
  }
}

HfTensorLayout hf_tensors(const models::ParameterStore& store, const ModelOptions& o, std::int64_t vocab) {
  HfTensorLayout layout = models::llama_layout(store, vocab, o.num_heads, o.num_kv_heads, o.head_dim);
  if (o.tie_word_embeddings) layout.ignored_suffixes.push_back("lm_head.weight");
  return layout;
}

Value model_section(const Value& config, const std::string& file) {
  const Fields f(config, file);
  if (!config.is_map()) throw UserError("'" + file + "' is " + config.describe() + ", expected a JSON object");
  const std::string type = f.string("model_type", "");
  if (type != "gemma3_text")
    throw UserError("'" + file + "': model_type is " + Value(type).describe() +
                    "; the gemma3 model reads Gemma 3 text checkpoints (model_type \"gemma3_text\")");
  if (f.boolean("attention_bias", false))
    throw UserError("'" + file + "': attention_bias is true; loom's gemma3 has no biases");
  if (f.boolean("use_bidirectional_attention", false))
    throw UserError("'" + file + "': use_bidirectional_attention is true; loom's gemma3 is a causal language model");
  const std::string act = f.string("hidden_activation", "gelu_pytorch_tanh");
  if (act != "gelu_pytorch_tanh")
    throw UserError("'" + file + "': hidden_activation is " + Value(act).describe() +
                    "; loom's gemma3 uses the tanh GELU (gelu_pytorch_tanh)");
  Value m = Value::map();
  m.set("type", "gemma3");
  m.set("seq_len", f.size("max_position_embeddings", default_positions));
  m.set("hidden_dim", f.size("hidden_size", default_hidden));
  m.set("intermediate_dim", f.size("intermediate_size", default_intermediate));
  const std::int64_t layers = f.size("num_hidden_layers", default_layers);
  m.set("num_layers", layers);
  m.set("num_heads", f.size("num_attention_heads", default_heads));
  m.set("num_kv_heads", f.size("num_key_value_heads", default_kv_heads));
  m.set("head_dim", f.size("head_dim", default_head_dim));
  m.set("query_pre_attn_scalar", f.number("query_pre_attn_scalar", default_query_scalar));
  // The windows: the pattern that gives config.json's layers (layer_types, or its own pattern).
  const std::vector<std::int64_t> windows = hf_layer_windows(config, file);
  std::vector<bool> sliding;
  std::int64_t window = 0;
  for (const std::int64_t w : windows) {
    sliding.push_back(w > 0);
    if (w > 0) window = w;
  }
  if (window == 0) {
    m.set("sliding_window", Value());
    m.set("sliding_window_pattern", default_pattern);
  } else {
    const std::int64_t pattern = pattern_of(sliding);
    if (pattern == 0)
      throw UserError("'" + file + "': layer_types make the layers' windows " + describe_windows(windows) +
                      ", which follow no pattern of every Nth layer global; loom's gemma3 places its global "
                      "layers by sliding_window_pattern");
    m.set("sliding_window", window);
    m.set("sliding_window_pattern", pattern);
  }
  m.set("rope_theta", f.number("rope_theta", default_theta));
  m.set("rope_local_base_freq", f.number("rope_local_base_freq", default_local_theta));
  const double factor = rope_scaling_factor(f, config);
  m.set("rope_scaling_factor", factor > 0 ? Value(factor) : Value());
  const double cap = f.number("final_logit_softcapping", 0.0);
  m.set("final_logit_softcapping", cap > 0 ? Value(cap) : Value());
  m.set("layer_norm_epsilon", f.number("rms_norm_eps", default_eps));
  m.set("initializer_range", f.number("initializer_range", 0.02));
  m.set("tie_word_embeddings", f.boolean("tie_word_embeddings", true));
  m.set("vocab_size", f.size("vocab_size", default_vocab));
  return m;
}

namespace {

Value to_value(const nlohmann::json& j) {
  if (j.is_boolean()) return Value(j.get<bool>());
  if (j.is_number_integer()) return Value(j.get<std::int64_t>());
  if (j.is_number()) return Value(j.get<double>());
  if (j.is_string()) return Value(j.get<std::string>());
  if (j.is_array()) {
    Value::List list;
    for (const auto& e : j) list.push_back(to_value(e));
    return Value(std::move(list));
  }
  if (j.is_object()) {
    Value m = Value::map();
    for (auto it = j.begin(); it != j.end(); ++it) m.set(it.key(), to_value(it.value()));
    return m;
  }
  return Value();
}

// config.json as model_section reads it, from the run layer's HfConfigFields: each field through
// the reader of its type (a wrong type is HfConfigFields' error, naming the file and the field),
// rope_scaling through object(). HfConfigFields reads no lists, so layer_types (transformers
// 4.53 and later) is read from the file it names.
Value config_of(const HfConfigFields& f) {
  Value c = Value::map();
  const auto copy = [&](const char* key, auto read) {
    if (f.is_null(key))
      c.set(key, Value());
    else if (f.has(key))
      c.set(key, read(key));
  };
  const auto integer = [&](const char* key) { return Value(f.integer(key, 0)); };
  const auto number = [&](const char* key) { return Value(f.number(key, 0.0)); };
  const auto boolean = [&](const char* key) { return Value(f.boolean(key, false)); };
  const auto string = [&](const char* key) { return Value(f.string(key, "")); };
  for (const char* key :
       {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window", "sliding_window_pattern"})
    copy(key, integer);
  for (const char* key : {"query_pre_attn_scalar", "rope_theta", "rope_local_base_freq", "final_logit_softcapping",
                          "rms_norm_eps", "initializer_range"})
    copy(key, number);
  for (const char* key : {"attention_bias", "use_bidirectional_attention", "tie_word_embeddings"}) copy(key, boolean);
  for (const char* key : {"model_type", "hidden_activation"}) copy(key, string);
  if (f.is_null("rope_scaling")) c.set("rope_scaling", Value());
  if (const std::optional<HfConfigFields> r = f.object("rope_scaling")) {
    Value s = Value::map();
    for (const char* key : {"rope_type", "type"})
      if (r->has(key)) s.set(key, r->string(key, ""));
    if (r->has("factor")) s.set("factor", r->number("factor", 1.0));
    c.set("rope_scaling", s);
  }
  if (f.has("layer_types") && !f.is_null("layer_types")) {
    std::ifstream in(f.file(), std::ios::binary);
    const nlohmann::json file = nlohmann::json::parse(in, nullptr, false);
    if (!in || !file.is_object() || !file.contains("layer_types"))
      throw UserError("'" + f.file() + "': cannot read layer_types from the file");
    c.set("layer_types", to_value(file["layer_types"]));
  }
  return c;
}

HfModelSection section_of(const HfConfigFields& f, const std::string&) {
  HfModelSection out;
  out.model = model_section(config_of(f), f.file());
  const auto size = [&](const char* field, const char* option) {
    return HfSizeField{field, out.model.find(option)->as_int()};
  };
  out.vocab_size = size("vocab_size", "vocab_size");
  out.hidden_size = size("hidden_size", "hidden_dim");
  out.num_layers = size("num_hidden_layers", "num_layers");
  out.intermediate_size = size("intermediate_size", "intermediate_dim");
  return out;
}

}  // namespace

HfArchitectures hf_architectures() {
  return {.model = "gemma3", .model_types = hf_model_types, .model_section = section_of};
}

HfTokenizerClass hf_tokenizer_class() {
  // transformers' Gemma 3 (4.50 and later) reads its tokenizer with GemmaTokenizer, whose defaults
  // are Gemma's and Gemma 2's; the gemma plugin declares that class too, with the same tokens.
  return {.name = "GemmaTokenizer", .bos_token = "<bos>", .eos_token = "<eos>", .model_types = hf_model_types};
}

}  // namespace loom::gemma3
