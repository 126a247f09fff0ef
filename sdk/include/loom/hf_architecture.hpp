// The Hugging Face architectures a model plugin reads: the config.json `model_type`s it claims,
// and the mapping from such a config.json to the loom `model` section that builds the model it
// describes. (The other way, from a built model to its config.json, is HfModel::hf_config in
// hf_interop.hpp.)
//
// The mapping runs before any model exists: `loom eval HF_DIR` reads the directory's
// config.json, asks the registry which plugin claims its model_type, and calls that plugin's
// mapping; the run layer then creates the model from the section, and the model's own check of
// the file (HfModel::hf_config_mismatches) compares the two. So the run layer holds no list of
// architectures: a plugin that claims a model_type is all a new architecture needs.
//
//   loom::HfModelSection tiny_section(const loom::HfConfigFields& f, const std::string& model_type) {
//     loom::HfModelSection s;
//     s.model.set("type", "tiny");
//     const std::int64_t hidden = f.size("hidden_size", 768);  // transformers' default when absent
//     s.model.set("hidden_dim", hidden);
//     ...
//     s.hidden_size = {"hidden_size", hidden};                  // and vocab_size, num_layers, ...
//     return s;
//   }
//
//   void register_components(loom::Registrar& registrar) {
//     registrar.add<loom::Model>({.name = "tiny", ...}, factory);
//     registrar.add_hf_architectures({.model = "tiny", .model_types = {"tiny"}, .model_section = tiny_section});
//   }
//
// The mapping is called from one thread, with a config.json the run layer has parsed; it throws
// UserError for a field it cannot read (HfConfigFields' readers throw those with the file and the
// field named) and for a value loom's model has no counterpart for. The absent fields take the
// defaults of transformers' config class, the ones the model's hf_config_mismatches assumes.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/component.hpp"
#include "loom/value.hpp"

namespace loom {

// config.json's fields with a default for an absent (or null) one; a present field of the wrong
// type is a UserError naming the file and the field, with its value as JSON:
//   "'/models/x/config.json': n_embd is \"wide\", expected an integer"
// Implemented in libloom_core.so. Holds a reference to `json`, which must outlive it.
class HfConfigFields {
 public:
  // `file` names config.json in the messages; `prefix` an object inside it ("rope_scaling.").
  HfConfigFields(const Value& json, std::string file, std::string prefix = "");

  bool has(std::string_view key) const;
  bool is_null(std::string_view key) const;  // present and null
  std::int64_t integer(std::string_view key, std::int64_t fallback) const;
  double number(std::string_view key, double fallback) const;  // an integer or a number
  bool boolean(std::string_view key, bool fallback) const;
  std::string string(std::string_view key, const std::string& fallback) const;
  // A size of the model (a width, a count of layers, heads or tokens): a positive integer that
  // fits a tensor dimension (at most 2^31 - 1), so that no size read from the file overflows or
  // asks for more than any machine has before the model is even described.
  std::int64_t size(std::string_view key, std::int64_t fallback) const;
  // A number, or null (off, given as 0) when the field is null; `fallback` when absent.
  double number_or_off(std::string_view key, double fallback) const;
  // A count of positions, or null (off, 0): at most 2^31 - 1, so that it converts to an integer.
  std::int64_t positions_or_off(std::string_view key, double fallback) const;
  // The object `key`, read with the same checks (its fields named "key.field"), or nullopt when
  // absent or null; another type is an error.
  std::optional<HfConfigFields> object(std::string_view key) const;
  // "'FILE': PREFIXKEY is VALUE, expected WANTED".
  [[noreturn]] void wrong(std::string_view key, std::string_view wanted) const;
  const std::string& file() const { return file_; }

 private:
  const Value* json_;
  std::string file_;
  std::string prefix_;
};

// `x` when positive, else null: an option that is off (a window, a soft-cap) as a model section
// writes it.
inline Value positive_or_null(double x) {
  return x > 0 ? Value(x) : Value();
}
inline Value positive_or_null(std::int64_t x) {
  return x > 0 ? Value(x) : Value();
}

// One size of the described model and the config.json field it was read from ("n_embd", 768).
struct HfSizeField {
  std::string field;
  std::int64_t value = 0;
};

// What a plugin's mapping gives for one config.json.
struct HfModelSection {
  // The loom `model` section: {type: llama, hidden_dim: 4096, ...}, as a config would give it.
  Value model = Value::map();
  // The sizes that bound the parameters from below: vocab_size x hidden_size + num_layers x 2 x
  // hidden_size x intermediate_size (the embedding and each layer's two MLP matrices), which the
  // run layer checks against this machine's memory before anything is allocated, naming these
  // fields when the file describes a model no machine here could hold. Left empty (no field):
  // not checked.
  HfSizeField vocab_size, hidden_size, num_layers, intermediate_size;
};

using HfModelSectionFunction =
    std::function<HfModelSection(const HfConfigFields& config, const std::string& model_type)>;

// What a model plugin declares about the Hugging Face architectures it reads, written with
// designated initializers (as ComponentDecl):
//   registrar.add_hf_architectures({.model = "llama", .model_types = {"llama", "mistral"}, .model_section = f});
struct HfArchitectures {
  struct DesignatedOnly {
    explicit DesignatedOnly() = default;
  };
  [[no_unique_address]] DesignatedOnly designated_only{};  // never written: see above

  // The model component (of the same plugin) that builds them: "llama".
  std::string model{};
  // transformers' model_type values it reads, in the order messages list them: "llama",
  // "mistral", ... A model_type is claimed by one plugin: a second claim fails that plugin's load.
  std::vector<std::string> model_types{};
  // config.json -> the model section; called with the directory's model_type (one of model_types).
  HfModelSectionFunction model_section{};
};

// A transformers tokenizer class and the special tokens it defaults to, which a plugin declares
// with Registrar::add_hf_tokenizer_class beside the architectures whose tokenizer it is:
//   registrar.add_hf_tokenizer_class({.name = "LlamaTokenizer", .also = {"CodeLlamaTokenizer"},
//                                     .bos_token = "<s>", .eos_token = "</s>",
//                                     .model_types = {"llama", "mistral", "mixtral"}});
//
// `loom eval HF_DIR` puts the tokenizer's BOS (else its EOS) before an empty context, as
// lm-evaluation-harness does. A directory names them in special_tokens_map.json or
// tokenizer_config.json; where it names neither, transformers takes the default of the tokenizer
// class: tokenizer_config.json's `tokenizer_class`, else AutoTokenizer's class for config.json's
// `model_type`. The run layer looks both up here (the class by its name, or by the model_type),
// so it holds no list of tokenizer classes; a directory whose class no plugin declares has none.
struct HfTokenizerClass {
  struct DesignatedOnly {
    explicit DesignatedOnly() = default;
  };
  [[no_unique_address]] DesignatedOnly designated_only{};  // never written: see above

  // The class's name, "LlamaTokenizer"; its fast twin ("LlamaTokenizerFast") is the same class here.
  std::string name{};
  // Other class names with the same defaults ("CodeLlamaTokenizer"), fast twins included likewise.
  std::vector<std::string> also{};
  // What the class defaults to (transformers 4.46): the token's text, or nullopt where the class
  // has none (Qwen2Tokenizer's BOS).
  std::optional<std::string> bos_token{};
  std::optional<std::string> eos_token{};
  // The config.json model_types whose AutoTokenizer class this is (transformers' TOKENIZER_MAPPING),
  // whether or not a plugin maps their config.json: "llama", "mistral", "mixtral". A model_type is
  // declared by one class; a second declaration fails the second plugin's load, as does a class
  // that another plugin declared with other tokens (the same class with the same tokens, from two
  // plugins, is one class: gemma's and gemma3's GemmaTokenizer).
  std::vector<std::string> model_types{};
};

}  // namespace loom
