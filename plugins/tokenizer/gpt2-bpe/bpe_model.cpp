#include "bpe_model.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <loom/error.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "byte_level.hpp"
#include "loom/utf8.hpp"

namespace loom::gpt2_bpe {

void MergeTable::build(const std::vector<Merge>& merges) {
  std::size_t capacity = 2;
  while (capacity < 2 * merges.size()) capacity *= 2;  // at most half full: short probe chains
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  shift_ = 64 - std::countr_zero(capacity);
  size_ = 0;
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const Merge& m = merges[rank];
    const std::uint64_t key = pack(m.left, m.right);
    std::size_t i = slot_of(key);
    while (slots_[i].key != kEmptyKey && slots_[i].key != key) i = (i + 1) & mask_;
    if (slots_[i].key == kEmptyKey) ++size_;
    slots_[i].key = key;
    slots_[i].value = (static_cast<std::uint64_t>(rank) << 32) | static_cast<std::uint32_t>(m.merged);
  }
}

namespace {

using json = nlohmann::json;

// Ids above this are refused rather than allocated: the largest vocabularies in use are a few
// hundred thousand entries, and a corrupt id must not become a multi-gigabyte allocation.
constexpr std::int64_t kMaxId = (1 << 24) - 1;

std::string code_point_name(char32_t cp) {
  char hex[16];
  std::snprintf(hex, sizeof hex, "U+%04X", static_cast<unsigned>(cp));
  return hex;
}

std::string relative_note(const std::filesystem::path& p) {
  if (!p.is_relative()) return "";
  std::error_code ec;
  const auto cwd = std::filesystem::current_path(ec);
  return " (relative paths are relative to the current directory" + (ec ? std::string() : ", " + cwd.string()) + ")";
}

json parse_json(const std::string& text, const std::string& what) {
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw UserError("gpt2-bpe: " + what + " is not valid JSON: " + json_parse_error(e.what(), e.byte, text));
  }
}

// A string as JSON writes it, quoted and escaped (invalid UTF-8 shown as U+FFFD): token text in
// messages, where a raw "\n" or a lone byte would garble the line.
std::string json_quoted(std::string_view s) {
  return json(std::string(s)).dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

std::string read_file(const std::string& path, const std::string& what) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  std::error_code ec;
  if (!fs::exists(p, ec)) throw UserError("gpt2-bpe: " + what + " does not exist" + relative_note(p));
  if (fs::is_directory(p, ec)) throw UserError("gpt2-bpe: " + what + " is a directory, not a file");
  std::ifstream in(p, std::ios::binary);
  if (!in) throw UserError("gpt2-bpe: " + what + " cannot be opened: " + std::strerror(errno));
  std::string data;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (size > 0) {
    data.resize(static_cast<std::size_t>(size));
    in.read(data.data(), size);
  }
  if (!in) throw UserError("gpt2-bpe: " + what + " could not be read: " + std::strerror(errno));
  return data;
}

// Fills a BpeModel from whichever file format, with the checks both formats share.
class VocabularyBuilder {
 public:
  VocabularyBuilder(BpeModel& model, std::string what) : model_(model), what_(std::move(what)) {}

  [[noreturn]] void fail(const std::string& why) const { throw UserError("gpt2-bpe: " + what_ + ": " + why); }

  std::int32_t checked_id(const json& id, const std::string& entry) const {
    if (!id.is_number_integer()) fail(entry + " has id " + id.dump() + ", which is not an integer");
    const auto value = id.get<std::int64_t>();
    if (value < 0 || value > kMaxId)
      fail(entry + " has id " + std::to_string(value) + ", outside [0, " + std::to_string(kMaxId) + "]");
    return static_cast<std::int32_t>(value);
  }

  // A token given by its raw bytes. An added token (`alias`) may have the bytes of a vocabulary
  // entry under an id of its own, as Hugging Face gives it when the entry is written in byte
  // symbols ("cafÃ©") and the added token in text ("café"); find() keeps the entry's id.
  void add(std::string bytes, std::int32_t id, const std::string& entry, bool alias = false) {
    const auto index = static_cast<std::size_t>(id);
    if (index >= model_.tokens_.size()) {
      model_.tokens_.resize(index + 1);
      model_.present_.resize(index + 1, 0);
    }
    if (model_.present_[index]) {
      if (model_.tokens_[index] == bytes) return;  // the same token again (a vocabulary entry that is also added)
      fail(entry + " has id " + std::to_string(id) + ", which " + json_quoted(model_.tokens_[index]) + " already has");
    }
    const auto [it, inserted] = model_.ids_.emplace(bytes, id);
    if (!inserted && it->second != id && !alias)
      fail(entry + " has id " + std::to_string(id) + ", but the same token already has id " +
           std::to_string(it->second));
    model_.tokens_[index] = std::move(bytes);
    model_.present_[index] = 1;
  }

  // A vocabulary entry written in byte symbols ("Ġthe"). `literal` entries (added tokens that
  // also sit in the vocabulary) may be written as plain text instead.
  void add_symbols(const std::string& symbols, const json& id_value,
                   const std::function<bool(const std::string&)>& literal) {
    const std::string entry = "vocabulary entry " + json_quoted(symbols);
    const std::int32_t id = checked_id(id_value, entry);
    std::string bytes;
    char32_t bad = 0;
    if (!symbols_to_bytes(symbols, bytes, bad)) {
      if (!literal(symbols))
        fail(entry + " (id " + std::to_string(id) + ") contains " + code_point_name(bad) +
             ", which is not one of GPT-2's 256 byte symbols; gpt2-bpe reads byte-level BPE vocabularies only");
      bytes = symbols;
    }
    add(std::move(bytes), id, entry);
  }

  // The id of a merge's side, given in byte symbols.
  std::int32_t merge_side(const std::string& symbols, const std::string& merge) const {
    std::string bytes;
    char32_t bad = 0;
    const std::int32_t id = symbols_to_bytes(symbols, bytes, bad) ? model_.find(bytes) : -1;
    if (id < 0) fail(merge + ": " + json_quoted(symbols) + " is not in the vocabulary");
    return id;
  }

  void add_merge(const std::string& left, const std::string& right, const std::string& merge) {
    const std::int32_t l = merge_side(left, merge), r = merge_side(right, merge);
    const std::int32_t merged = model_.find(*model_.token(l) + *model_.token(r));
    if (merged < 0) fail(merge + ": the merged token " + json_quoted(left + right) + " is not in the vocabulary");
    merges_.push_back({l, r, merged});
  }

  void finish(const std::string& end_of_text) {
    for (int b = 0; b < 256; ++b) {
      const std::int32_t id = model_.find(std::string(1, static_cast<char>(b)));
      if (id < 0) {
        std::string symbol;
        append_utf8(symbol, kByteToUnicode[static_cast<std::size_t>(b)]);
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02X", b);
        fail(std::string("the vocabulary has no token for byte ") + hex + " (written " + json_quoted(symbol) +
             "); a byte-level BPE vocabulary has one for each of the 256 bytes");
      }
      model_.byte_ids_[static_cast<std::size_t>(b)] = id;
    }
    model_.merges_.build(merges_);
    if (!end_of_text.empty()) {
      model_.end_of_text_ = model_.find(end_of_text);
      if (model_.end_of_text_ < 0)
        fail("the end_of_text token " + json_quoted(end_of_text) +
             " is not in the vocabulary; set the option `end_of_text` to this vocabulary's end-of-text token, or "
             "to \"\" if it has none");
      bool listed = false;
      for (const auto& a : model_.added_) listed = listed || a.id == model_.end_of_text_;
      if (!listed) model_.added_.push_back({end_of_text, model_.end_of_text_, false, false, true, false});
    }
  }

 private:
  BpeModel& model_;
  std::string what_;
  std::vector<MergeTable::Merge> merges_;
};

namespace {

// One Split of a tokenizer.json pre_tokenizer.
SplitRule read_split(const json& split, const VocabularyBuilder& builder) {
  const std::string where = "its pre_tokenizer's Split " + split.dump().substr(0, 160);
  SplitRule rule;
  const json pattern = split.value("pattern", json());
  if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
    rule.pattern = pattern["Regex"].get<std::string>();
  } else if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
    rule.pattern = pattern["String"].get<std::string>();
    rule.literal = true;
  } else {
    builder.fail(where + " has no pattern {\"Regex\": ...} or {\"String\": ...}");
  }
  if (rule.pattern.empty()) builder.fail(where + " has an empty pattern");
  const std::string behavior = split.value("behavior", "");
  if (behavior == "Isolated")
    rule.behavior = SplitRule::Behavior::isolated;
  else if (behavior == "Removed")
    rule.behavior = SplitRule::Behavior::removed;
  else
    builder.fail(where + " has behavior " + json(behavior).dump() +
                 "; gpt2-bpe implements \"Isolated\" and \"Removed\"");
  const json invert = split.value("invert", json(false));
  if (!invert.is_boolean()) builder.fail(where + ": invert must be true or false");
  rule.invert = invert.get<bool>();
  return rule;
}

// The pre-tokenizer's stages: GPT-2's ByteLevel (its regex), or a Sequence of Splits ending in a
// ByteLevel (which then maps bytes to symbols and, with use_regex, splits by GPT-2's regex last).
std::vector<SplitRule> read_pre_tokenizer(const json& pre, const VocabularyBuilder& builder) {
  const std::string expected =
      "gpt2-bpe implements GPT-2's {\"type\": \"ByteLevel\", \"add_prefix_space\": false}, or a "
      "{\"type\": \"Sequence\"} of Splits ending in that ByteLevel (Llama 3, Qwen 2)";
  std::vector<json> steps;
  if (pre.is_object() && pre.value("type", "") == "Sequence" && pre.contains("pretokenizers") &&
      pre["pretokenizers"].is_array())
    steps.assign(pre["pretokenizers"].begin(), pre["pretokenizers"].end());
  else
    steps.push_back(pre);
  std::vector<SplitRule> rules;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const json& step = steps[i];
    const std::string type = step.is_object() ? step.value("type", "") : "";
    const bool last = i + 1 == steps.size();
    if (type == "Split" && !last) {
      rules.push_back(read_split(step, builder));
    } else if (type == "ByteLevel" && last) {
      if (step.value("add_prefix_space", false) != false)
        builder.fail("its pre_tokenizer's ByteLevel sets add_prefix_space; " + expected);
      if (step.value("use_regex", true) != false) rules.push_back(gpt2_split_rule());
    } else {
      builder.fail("its pre_tokenizer is " + pre.dump().substr(0, 200) + "; " + expected);
    }
  }
  return rules;
}

// Whether the normalizer is NFC (alone or as a one-element Sequence); anything else is refused.
bool read_normalizer(const json& normalizer, const VocabularyBuilder& builder) {
  const json* n = &normalizer;
  if (n->is_object() && n->value("type", "") == "Sequence" && n->contains("normalizers") &&
      (*n)["normalizers"].is_array() && (*n)["normalizers"].size() == 1)
    n = &(*n)["normalizers"][0];
  if (!n->is_object() || n->value("type", "") != "NFC")
    builder.fail("its normalizer is " + normalizer.dump().substr(0, 120) +
                 "; gpt2-bpe implements none (GPT-2, Llama 3) and {\"type\": \"NFC\"} (Qwen 2)");
  return true;
}

}  // namespace

BpeModel BpeModel::from_openai_files(const std::string& encoder_json, const std::string& vocab_bpe,
                                     const std::string& end_of_text) {
  BpeModel model;
  {
    const std::string what = "encoder_json file '" + encoder_json + "'";
    const json encoder = parse_json(read_file(encoder_json, what), what);
    VocabularyBuilder vocabulary(model, what);
    if (!encoder.is_object() || encoder.empty())
      vocabulary.fail("expected a JSON object mapping each token to its id (OpenAI's encoder.json)");
    for (const auto& [symbols, id] : encoder.items())
      vocabulary.add_symbols(symbols, id, [](const std::string&) { return false; });
  }
  const std::string what = "vocab_bpe file '" + vocab_bpe + "'";
  const std::string text = read_file(vocab_bpe, what);
  VocabularyBuilder merges(model, what);
  std::size_t line_number = 0;
  for (std::size_t begin = 0; begin < text.size();) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string_view line(text.data() + begin, end - begin);
    begin = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);  // written on Windows
    // The version header ("#version: 0.2"), as Hugging Face's reader skips it; blank lines
    // (the file's trailing newline) hold nothing.
    if (line.empty() || (line_number == 1 && line.starts_with("#version"))) continue;
    const std::string where = "line " + std::to_string(line_number) + " " + json_quoted(line);
    const std::size_t space = line.find(' ');
    if (space == std::string_view::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos)
      merges.fail(where + ": expected a merge, two symbols separated by one space (\"\\u0120 t\")");
    merges.add_merge(std::string(line.substr(0, space)), std::string(line.substr(space + 1)), where);
  }
  merges.finish(end_of_text);
  return model;
}

BpeModel BpeModel::from_tokenizer_json(const std::string& tokenizer_json, const std::string& end_of_text) {
  BpeModel model;
  const std::string what = "tokenizer_json file '" + tokenizer_json + "'";
  const json root = parse_json(read_file(tokenizer_json, what), what);
  VocabularyBuilder builder(model, what);
  if (!root.is_object()) builder.fail("expected a JSON object (a Hugging Face tokenizer.json)");

  // gpt2-bpe implements the byte-level pipelines of GPT-2, Llama 3 and Qwen 2; a file that asks
  // for anything else is refused rather than silently tokenized differently.
  const auto absent = [](const json& object, const char* key) {
    return !object.contains(key) || object[key].is_null();
  };
  if (!absent(root, "normalizer")) model.nfc_ = read_normalizer(root["normalizer"], builder);
  // No pre_tokenizer key: GPT-2's. A null one would hand raw text (not byte symbols) to the
  // vocabulary, and is refused with the others.
  if (root.contains("pre_tokenizer")) model.split_rules_ = read_pre_tokenizer(root["pre_tokenizer"], builder);
  if (!root.contains("model") || !root["model"].is_object()) builder.fail("it has no \"model\" object");
  const json& bpe = root["model"];
  if (bpe.contains("type") && bpe["type"] != "BPE")
    builder.fail("its model is of type " + bpe["type"].dump() + "; gpt2-bpe reads BPE models only");
  if (!absent(bpe, "dropout") && !(bpe["dropout"].is_number() && bpe["dropout"].get<double>() == 0.0))
    builder.fail("its model sets dropout " + bpe["dropout"].dump() + "; gpt2-bpe encodes deterministically");
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (!absent(bpe, affix) && bpe[affix] != "")
      builder.fail("its model sets " + std::string(affix) + " " + bpe[affix].dump() +
                   ", which GPT-2's byte-level BPE does not use");
  if (bpe.contains("ignore_merges")) {
    if (!bpe["ignore_merges"].is_boolean()) builder.fail("model.ignore_merges must be true or false");
    model.ignore_merges_ = bpe["ignore_merges"].get<bool>();
  }
  if (bpe.value("byte_fallback", false) == true)
    builder.fail("its model sets byte_fallback, which a byte-level BPE never needs and gpt2-bpe does not implement");

  // Added tokens first: a vocabulary entry that is one may be written as plain text.
  std::vector<AddedToken> added;
  if (!absent(root, "added_tokens")) {
    if (!root["added_tokens"].is_array()) builder.fail("\"added_tokens\" must be a list");
    for (const json& a : root["added_tokens"]) {
      if (!a.is_object() || !a.contains("content") || !a["content"].is_string() || a["content"] == "")
        builder.fail("added_tokens holds " + a.dump() + "; each needs a non-empty \"content\" string and an \"id\"");
      const std::string content = a["content"].get<std::string>();
      const std::string entry = "added token " + json_quoted(content);
      if (!a.contains("id")) builder.fail(entry + " has no id");
      if (a.value("single_word", false)) builder.fail(entry + " sets single_word, which gpt2-bpe does not implement");
      const bool special = a.value("special", false);
      added.push_back({content, builder.checked_id(a["id"], entry), a.value("lstrip", false), a.value("rstrip", false),
                       special, model.nfc_ && a.value("normalized", !special)});
    }
  }
  const auto is_added = [&added](const std::string& content) {
    for (const auto& a : added)
      if (a.content == content) return true;
    return false;
  };

  if (!bpe.contains("vocab") || !bpe["vocab"].is_object() || bpe["vocab"].empty())
    builder.fail("model.vocab must be a non-empty object mapping each token to its id");
  for (const auto& [symbols, id] : bpe["vocab"].items()) builder.add_symbols(symbols, id, is_added);
  for (const auto& a : added) builder.add(a.content, a.id, "added token " + json_quoted(a.content), true);
  model.added_ = std::move(added);

  if (!absent(bpe, "merges")) {
    if (!bpe["merges"].is_array()) builder.fail("model.merges must be a list");
    const json& merges = bpe["merges"];
    for (std::size_t i = 0; i < merges.size(); ++i) {
      const json& m = merges[i];
      const std::string where = "model.merges[" + std::to_string(i) + "] " + m.dump();
      // Older files write "left right", newer ones [left, right] (symbols may then hold spaces).
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const std::size_t space = s.find(' ');
        if (space == std::string::npos || space == 0 || space + 1 == s.size() ||
            s.find(' ', space + 1) != std::string::npos)
          builder.fail(where + ": expected two symbols separated by one space");
        builder.add_merge(s.substr(0, space), s.substr(space + 1), where);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        builder.add_merge(m[0].get<std::string>(), m[1].get<std::string>(), where);
      } else {
        builder.fail(where + ": expected \"left right\" or [\"left\", \"right\"]");
      }
    }
  }
  builder.finish(end_of_text);
  return model;
}

}  // namespace loom::gpt2_bpe
