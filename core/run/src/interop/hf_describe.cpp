// The loom sections that describe a Hugging Face model directory (config.json and its tokenizer
// files), so that `loom eval HF_DIR` needs no config. The mapping mirrors the model plugins'
// hf_config(): absent fields take the defaults of transformers' config classes (4.46.3), the ones
// the plugins' hf_config_mismatches assume, so that the plugin's own check of the directory, which
// import_hf runs next, finds nothing to object to. A field read wrongly here is caught there.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "json_value.hpp"
#include "loom/error.hpp"
#include "loom/run/hf_interop.hpp"
#include "loom/utf8.hpp"

namespace fs = std::filesystem;

namespace loom {

namespace {

using Json = nlohmann::ordered_json;

Json read_json_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("cannot read '" + path.string() + "'");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return Json::parse(text.str());
  } catch (const nlohmann::json::parse_error& e) {
    throw UserError("'" + path.string() + "' is not valid JSON: " + json_parse_error(e.what(), e.byte, text.str()));
  }
}

// A JSON value as a message shows it: its text, cut short.
std::string shown(const Json& value) {
  std::string text = value.dump();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

// config.json's fields, with a default for an absent one; a present field of the wrong type is
// an error naming the file and the field. `prefix` names an object inside the file
// ("rope_scaling.") in the messages.
class Fields {
 public:
  Fields(const Json& json, fs::path file, std::string prefix = "")
      : json_(json), file_(std::move(file)), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return json_.contains(key); }
  bool is_null(const char* key) const { return json_.contains(key) && json_[key].is_null(); }
  std::int64_t integer(const char* key, std::int64_t fallback) const {
    if (!has(key) || json_[key].is_null()) return fallback;
    if (!json_[key].is_number_integer()) wrong(key, "an integer");
    return json_[key].get<std::int64_t>();
  }
  double number(const char* key, double fallback) const {
    if (!has(key) || json_[key].is_null()) return fallback;
    if (!json_[key].is_number()) wrong(key, "a number");
    return json_[key].get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key) || json_[key].is_null()) return fallback;
    if (!json_[key].is_boolean()) wrong(key, "true or false");
    return json_[key].get<bool>();
  }
  std::string string(const char* key, const std::string& fallback) const {
    if (!has(key) || json_[key].is_null()) return fallback;
    if (!json_[key].is_string()) wrong(key, "a string");
    return json_[key].get<std::string>();
  }
  // A size of the model (a width, a count of layers, heads or tokens): a positive integer that
  // fits a tensor dimension, so that no size read from the file overflows or asks for more
  // than any machine has before the model is even described.
  std::int64_t size(const char* key, std::int64_t fallback) const {
    const std::int64_t n = integer(key, fallback);
    if (n < 1 || n > std::numeric_limits<std::int32_t>::max())
      wrong(key, "a positive integer of at most 2147483647 (2^31 - 1)");
    return n;
  }
  // A number, or null (off, given as 0) when the field is null; `fallback` when absent.
  double number_or_off(const char* key, double fallback) const { return is_null(key) ? 0.0 : number(key, fallback); }
  // A count of positions, or null (off, 0): at most 2^31 - 1, so that it converts to an integer.
  std::int64_t positions_or_off(const char* key, double fallback) const {
    const double n = number_or_off(key, fallback);
    if (!(n >= 0 && n <= std::numeric_limits<std::int32_t>::max()))
      wrong(key, "null or a number of positions from 0 to 2147483647");
    return static_cast<std::int64_t>(n);
  }
  const Json& raw(const char* key) const { return json_[key]; }
  // The object `key`, read with the same checks, or null when absent or null; another type is an error.
  std::optional<Fields> object(const char* key) const {
    if (!has(key) || json_[key].is_null()) return std::nullopt;
    if (!json_[key].is_object()) wrong(key, "an object");
    return Fields(json_[key], file_, prefix_ + key + ".");
  }
  const fs::path& file() const { return file_; }

 private:
  [[noreturn]] void wrong(const char* key, const char* wanted) const {
    throw UserError("'" + file_.string() + "': " + prefix_ + key + " is " + shown(json_[key]) + ", expected " + wanted);
  }
  const Json& json_;
  fs::path file_;
  std::string prefix_;
};

Value optional_positive(double x) {
  return x > 0 ? Value(x) : Value();
}
Value optional_positive(std::int64_t x) {
  return x > 0 ? Value(x) : Value();
}

Value gpt2_section(const Fields& f, const fs::path& file) {
  Value m = Value::map();
  m.set("type", "gpt2");
  const std::int64_t hidden = f.size("n_embd", 768);
  const std::int64_t inner = f.size("n_inner", 4 * hidden);
  if (hidden <= 0 || inner % hidden != 0)
    throw UserError("'" + file.string() + "': n_inner (" + std::to_string(inner) + ") is not a multiple of n_embd (" +
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
  return m;
}

Value llama_section(const Fields& f, const std::string& type) {
  Value m = Value::map();
  m.set("type", "llama");
  const bool mixtral = type == "mixtral", mistral = type == "mistral", qwen3 = type == "qwen3";
  const bool qwen = type == "qwen2" || qwen3;  // Qwen3Config's defaults are Qwen2Config's unless noted
  const std::int64_t hidden = f.size("hidden_size", 4096);
  const std::int64_t heads = f.size("num_attention_heads", 32);
  m.set("seq_len", f.size("max_position_embeddings", mixtral || mistral ? 4096 * 32 : qwen ? 32768 : 2048));
  m.set("hidden_dim", hidden);
  m.set("intermediate_dim", f.size("intermediate_size", mixtral || mistral ? 14336 : qwen ? 22016 : 11008));
  m.set("num_layers", f.size("num_hidden_layers", 32));
  m.set("num_heads", heads);
  // Absent: LlamaConfig's None (as many as the query heads), Mistral's and Mixtral's 8, Qwen2's
  // and Qwen3's 32; null: as many as the query heads.
  m.set("num_kv_heads", f.size("num_key_value_heads", f.has("num_key_value_heads") ? heads
                                                      : mistral || mixtral         ? 8
                                                      : qwen                       ? 32
                                                                                   : heads));
  // Qwen2 and Mixtral derive the head width; Mistral's 0 or null derives it too; Qwen3's is 128
  // when absent.
  const std::int64_t head_dim = qwen3                          ? f.size("head_dim", 128)
                                : qwen || mixtral              ? 0
                                : f.integer("head_dim", 0) > 0 ? f.size("head_dim", 0)
                                                               : 0;
  m.set("head_dim", optional_positive(head_dim));
  m.set("layer_norm_epsilon", f.number("rms_norm_eps", mixtral ? 1e-5 : 1e-6));
  m.set("initializer_range", f.number("initializer_range", 0.02));
  m.set("tie_word_embeddings", f.boolean("tie_word_embeddings", false));
  m.set("vocab_size", f.size("vocab_size", qwen ? 151936 : 32000));

  Value rope = Value::map();
  rope.set("type", "default");
  rope.set("theta", f.number("rope_theta", mixtral ? 1e6 : 10000.0));
  if (!mistral && !mixtral) {
    // transformers' rope_scaling: {"rope_type" (or the older "type"): "linear" | "llama3" | "default", "factor", ...}
    const std::optional<Fields> s = f.object("rope_scaling");
    const std::string kind = s ? s->string("rope_type", s->string("type", "default")) : "default";
    if (kind == "linear") {
      rope.set("factor", s->number("factor", 1.0));
    } else if (kind == "llama3") {
      rope.set("type", "llama3");
      rope.set("factor", s->number("factor", 8.0));
      rope.set("low_freq_factor", s->number("low_freq_factor", 1.0));
      rope.set("high_freq_factor", s->number("high_freq_factor", 4.0));
      rope.set("original_max_position_embeddings", s->size("original_max_position_embeddings", 8192));
    } else if (kind != "default") {
      throw UserError("rope_scaling.rope_type is " + Value(kind).describe() +
                      "; loom's llama computes default, linear and llama3 RoPE");
    }
  }
  m.set("rope", rope);

  if (type == "llama") {
    m.set("use_bias", f.boolean("attention_bias", false));
  } else if (qwen3) {
    // Per-head RMSNorm of q and k; no biases (an attention_bias of true is what the plugin's check
    // of config.json then names: loom has no biases on q, k, v and o alone).
    m.set("use_qk_norm", true);
  } else if (qwen) {
    m.set("qkv_bias", true);  // Qwen2's q, k and v projections have biases, the others none
  }

  std::int64_t window = 0;
  if (mistral) {
    window = f.is_null("sliding_window") ? 0 : f.integer("sliding_window", 4096);
  } else if (mixtral) {
    window = f.integer("sliding_window", 0);
  } else if (qwen && f.boolean("use_sliding_window", false)) {
    window = f.is_null("sliding_window") ? 0 : f.integer("sliding_window", 4096);
    if (window > 0) m.set("max_window_layers", f.integer("max_window_layers", 28));
  }
  m.set("sliding_window", optional_positive(window));

  if (mixtral) {
    Value moe = Value::map();
    moe.set("num_experts", f.size("num_local_experts", 8));
    moe.set("experts_per_token", f.size("num_experts_per_tok", 2));
    moe.set("router_softmax", "after_top_k");
    moe.set("router_aux_loss_coef", f.number("router_aux_loss_coef", 0.001));
    m.set("moe", moe);
  }
  return m;
}

Value gemma2_section(const Fields& f) {
  Value m = Value::map();
  m.set("type", "gemma");
  m.set("seq_len", f.size("max_position_embeddings", 8192));
  m.set("hidden_dim", f.size("hidden_size", 3072));
  m.set("intermediate_dim", f.size("intermediate_size", 24576));
  m.set("num_layers", f.size("num_hidden_layers", 28));
  m.set("num_heads", f.size("num_attention_heads", 16));
  m.set("num_kv_heads", f.size("num_key_value_heads", 16));
  m.set("head_dim", f.size("head_dim", 256));
  m.set("query_pre_attn_scalar", f.number("query_pre_attn_scalar", 224.0));
  m.set("attn_logit_softcapping", optional_positive(f.number_or_off("attn_logit_softcapping", 50.0)));
  m.set("final_logit_softcapping", optional_positive(f.number_or_off("final_logit_softcapping", 30.0)));
  m.set("sliding_window", optional_positive(f.positions_or_off("sliding_window", 4096.0)));
  m.set("rope_theta", f.number("rope_theta", 10000.0));
  m.set("layer_norm_epsilon", f.number("rms_norm_eps", 1e-6));
  m.set("initializer_range", f.number("initializer_range", 0.02));
  m.set("tie_word_embeddings", f.boolean("tie_word_embeddings", true));
  m.set("vocab_size", f.size("vocab_size", 256000));
  return m;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (bytes >= 1024 && u < 6) {
    bytes /= 1024;
    ++u;
  }
  char text[48];
  std::snprintf(text, sizeof text, bytes < 1e6 ? "%.1f %s" : "%.3g %s", bytes, units[u]);
  return text;
}

// The parameters the described model has at least (its embedding, and each layer's two MLP
// matrices), against this machine's memory: sizes that no model here could have are the file's
// mistake, named with its fields, before the model plugin allocates anything (the weights load
// in float32).
void check_model_fits(const Value& model, const fs::path& file, bool gpt2) {
  auto get = [&](const char* key) { return static_cast<double>(model.find(key)->as_int()); };
  const double vocab = get("vocab_size"), hidden = get("hidden_dim"), layers = get("num_layers");
  const double inner = gpt2 ? get("mlp_scale") * hidden : get("intermediate_dim");
  const double parameters = vocab * hidden + layers * 2 * hidden * inner;
  const double bytes = 4 * parameters;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return;
  const double memory = static_cast<double>(pages) * static_cast<double>(page);
  if (bytes <= memory) return;
  auto n = [](double x) {
    char text[32];
    std::snprintf(text, sizeof text, "%.0f", x);
    return std::string(text);
  };
  char count[32];
  std::snprintf(count, sizeof count, "%.3g", parameters);
  const std::string v = "vocab_size", h = gpt2 ? "n_embd" : "hidden_size", l = gpt2 ? "n_layer" : "num_hidden_layers",
                    i = gpt2 ? "n_inner" : "intermediate_size";
  throw UserError("'" + file.string() + "': " + v + " " + n(vocab) + ", " + h + " " + n(hidden) + ", " + l + " " +
                  n(layers) + " and " + i + " " + n(inner) + " describe a model of at least " + count +
                  " parameters (" + v + " x " + h + " + " + l + " x 2 x " + h + " x " + i + "), " + human_bytes(bytes) +
                  " in float32, more than this machine's " + human_bytes(memory) +
                  " of memory; expected the sizes of the model whose weights are in the directory");
}

// A special token of tokenizer_config.json or special_tokens_map.json: a string or an AddedToken
// written as {"content": ...}.
std::optional<std::string> special_token(const fs::path& dir, const char* role) {
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"}) {
    std::error_code ec;
    if (!fs::exists(dir / name, ec)) continue;
    const Json json = read_json_file(dir / name);
    if (!json.is_object() || !json.contains(role)) continue;
    const Json& token = json[role];
    if (token.is_string()) return token.get<std::string>();
    if (token.is_object() && token.contains("content") && token["content"].is_string())
      return token["content"].get<std::string>();
  }
  return std::nullopt;
}

// Whether a tokenizer.json is a byte-level BPE (what the gpt2-bpe tokenizer reads); a
// SentencePiece-style one (Metaspace, byte fallback) is read from its tokenizer.model instead.
bool byte_level_bpe(const fs::path& file) {
  const Json json = read_json_file(file);
  if (!json.is_object())
    throw UserError("'" + file.string() + "' is " + shown(json) + ", expected a JSON object (a tokenizer)");
  const std::optional<Fields> model = Fields(json, file).object("model");
  if (!model || model->string("type", "") != "BPE") return false;
  const Json& pre = json.contains("pre_tokenizer") ? json["pre_tokenizer"] : Json();
  return pre.dump().find("\"ByteLevel\"") != std::string::npos;
}

std::optional<Value> tokenizer_section(const fs::path& dir) {
  std::error_code ec;
  auto exists = [&](const char* name) { return fs::exists(dir / name, ec); };
  auto bpe = [&]() {
    Value t = Value::map();
    t.set("type", "gpt2-bpe");
    // The end-of-text token the directory names; gpt2-bpe's own default (GPT-2's) otherwise.
    if (const auto eos = special_token(dir, "eos_token")) t.set("end_of_text", *eos);
    return t;
  };
  const bool json = exists("tokenizer.json");
  if (json && byte_level_bpe(dir / "tokenizer.json")) {
    Value t = bpe();
    t.set("tokenizer_json", (dir / "tokenizer.json").string());
    return t;
  }
  if (exists("vocab.json") && exists("merges.txt")) {
    Value t = bpe();
    t.set("encoder_json", (dir / "vocab.json").string());
    t.set("vocab_bpe", (dir / "merges.txt").string());
    return t;
  }
  if (exists("tokenizer.model")) {
    Value t = Value::map();
    t.set("type", "sentencepiece");
    t.set("model_file", (dir / "tokenizer.model").string());
    return t;
  }
  if (json) {  // not byte-level: gpt2-bpe's refusal says what in it loom does not read
    Value t = bpe();
    t.set("tokenizer_json", (dir / "tokenizer.json").string());
    return t;
  }
  return std::nullopt;
}

}  // namespace

HfDirectoryConfig describe_hf_model_dir(const fs::path& dir) {
  // The sections name the tokenizer's files by path, and a config holds text: a path that is not
  // UTF-8 cannot be written into one (nor read back byte for byte).
  const std::string path = dir.string();
  if (const std::size_t bad = valid_utf8_end(path, 0); bad < path.size()) {
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02x", static_cast<unsigned>(static_cast<unsigned char>(path[bad])));
    throw UserError("'" + path + "': the directory's path is not valid UTF-8 (byte " + byte + " at offset " +
                    std::to_string(bad) +
                    "), and the config loom makes from its config.json names the tokenizer's files by their "
                    "paths, which must be text: expected a UTF-8 path; rename the directory (or a link to it)");
  }
  const std::string how =
      "; give a loom config that describes the model and its tokenizer after the directory instead "
      "(`loom eval " +
      dir.string() + " CONFIG --tasks ...`)";
  const fs::path file = dir / "config.json";
  const Json json = read_json_file(file);
  if (!json.is_object()) throw UserError("'" + file.string() + "' is not a JSON object" + how);
  const Fields f(json, file);
  const std::string type = f.string("model_type", "");
  HfDirectoryConfig out;
  try {
    if (type == "gpt2") {
      out.model = gpt2_section(f, file);
      check_model_fits(out.model, file, true);
    } else if (type == "llama" || type == "mistral" || type == "qwen2" || type == "qwen3" || type == "mixtral") {
      out.model = llama_section(f, type);
      check_model_fits(out.model, file, false);
    } else if (type == "gemma2") {
      out.model = gemma2_section(f);
      check_model_fits(out.model, file, false);
    } else {
      throw UserError("'" + file.string() + "' has " +
                      (type.empty() ? std::string("no model_type") : "model_type " + Value(type).describe()) +
                      "; loom reads gpt2 (gpt2), llama, mistral, qwen2, qwen3, mixtral (llama) and gemma2 (gemma)");
    }
  } catch (const UserError& e) {
    throw UserError(std::string(e.what()) + how);
  }
  const std::optional<Value> tokenizer = tokenizer_section(dir);
  if (!tokenizer)
    throw UserError("'" + dir.string() +
                    "' has no tokenizer files loom reads (tokenizer.json with a byte-level BPE, vocab.json with "
                    "merges.txt, or a SentencePiece tokenizer.model)" +
                    how);
  out.tokenizer = *tokenizer;
  return out;
}

std::vector<std::string> hf_model_dir_overrides(const fs::path& dir) {
  const HfDirectoryConfig config = describe_hf_model_dir(dir);
  // JSON is YAML's flow style: each section is one override, before the user's own.
  return {"model=" + interop::to_json(config.model).dump(), "tokenizer=" + interop::to_json(config.tokenizer).dump()};
}

std::optional<std::int64_t> hf_bos_token_id(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir / "config.json", ec)) return std::nullopt;
  const Json json = read_json_file(dir / "config.json");
  if (!json.is_object() || !json.contains("bos_token_id") || !json["bos_token_id"].is_number_integer())
    return std::nullopt;
  return json["bos_token_id"].get<std::int64_t>();
}

}  // namespace loom
