// The loom sections that describe a Hugging Face model directory (config.json and its tokenizer
// files), so that `loom eval HF_DIR` needs no config. The `model` section is the mapping of the
// plugin that claims config.json's model_type (Registrar::add_hf_architectures): absent fields
// take the defaults of transformers' config classes (4.46.3), the ones the plugin's
// hf_config_mismatches assumes, so that the plugin's own check of the directory, which import_hf
// runs next, finds nothing to object to. This file names no architecture.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "loom/core/json_value.hpp"
#include "loom/core/registry.hpp"
#include "loom/error.hpp"
#include "loom/hf_architecture.hpp"
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
// matrices, as the plugin's mapping gives their sizes), against this machine's memory: sizes that
// no model here could have are the file's mistake, named with its fields, before the model plugin
// allocates anything (the weights load in float32).
void check_model_fits(const HfModelSection& section, const fs::path& file) {
  const HfSizeField* sizes[] = {&section.vocab_size, &section.hidden_size, &section.num_layers,
                                &section.intermediate_size};
  for (const HfSizeField* s : sizes)
    if (s->field.empty()) return;  // the plugin did not say
  auto get = [](const HfSizeField& s) { return static_cast<double>(s.value); };
  const double vocab = get(section.vocab_size), hidden = get(section.hidden_size), layers = get(section.num_layers);
  const double inner = get(section.intermediate_size);
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
  const std::string &v = section.vocab_size.field, &h = section.hidden_size.field, &l = section.num_layers.field,
                    &i = section.intermediate_size.field;
  throw UserError("'" + file.string() + "': " + v + " " + n(vocab) + ", " + h + " " + n(hidden) + ", " + l + " " +
                  n(layers) + " and " + i + " " + n(inner) + " describe a model of at least " + count +
                  " parameters (" + v + " x " + h + " + " + l + " x 2 x " + h + " x " + i + "), " + human_bytes(bytes) +
                  " in float32, more than this machine's " + human_bytes(memory) +
                  " of memory; expected the sizes of the model whose weights are in the directory");
}

// The model_types the loaded plugins claim, each plugin's after the others' and named by its
// model: "gpt2 (gpt2) and llama, mistral (llama)".
std::string claimed_model_types(const Registry& registry) {
  const std::vector<const HfArchitectureEntry*> claims = registry.hf_architectures();
  if (claims.empty()) return "no Hugging Face model_type: no loaded model plugin claims one";
  std::string out;
  for (std::size_t c = 0; c < claims.size(); ++c) {
    out += c == 0 ? "" : c + 1 == claims.size() ? " and " : ", ";
    const std::vector<std::string>& types = claims[c]->decl.model_types;
    for (std::size_t t = 0; t < types.size(); ++t) out += (t == 0 ? "" : ", ") + types[t];
    out += " (" + claims[c]->decl.model + ")";
  }
  return out;
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
  // model.type, read as config.json's fields are (the rest of the file, its vocabulary, is not
  // needed here).
  const std::string where = "'" + file.string() + "': ";
  const Json* model = json.contains("model") && !json["model"].is_null() ? &json["model"] : nullptr;
  if (model && !model->is_object()) throw UserError(where + "model is " + shown(*model) + ", expected an object");
  const Json* type = model && model->contains("type") && !(*model)["type"].is_null() ? &(*model)["type"] : nullptr;
  if (type && !type->is_string()) throw UserError(where + "model.type is " + shown(*type) + ", expected a string");
  if (!type || type->get<std::string>() != "BPE") return false;
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

HfDirectoryConfig describe_hf_model_dir(const Registry& registry, const fs::path& dir) {
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
  const Value config = interop::to_value(json);
  const HfConfigFields f(config, file.string());
  const std::string type = f.string("model_type", "");
  HfDirectoryConfig out;
  try {
    // The plugin that claims the model_type maps the file (Registrar::add_hf_architectures).
    const HfArchitectureEntry* claim = type.empty() ? nullptr : registry.find_hf_architecture(type);
    if (!claim)
      throw UserError("'" + file.string() + "' has " +
                      (type.empty() ? std::string("no model_type") : "model_type " + Value(type).describe()) +
                      "; loom reads " + claimed_model_types(registry));
    HfModelSection section = claim->decl.model_section(f, type);
    check_model_fits(section, file);
    out.model = std::move(section.model);
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

std::vector<std::string> hf_model_dir_overrides(const Registry& registry, const fs::path& dir) {
  const HfDirectoryConfig config = describe_hf_model_dir(registry, dir);
  // JSON is YAML's flow style: each section is one override, before the user's own.
  return {"model=" + interop::to_json(config.model).dump(), "tokenizer=" + interop::to_json(config.tokenizer).dump()};
}

}  // namespace loom
