// The `char` tokenizer: one token per Unicode character of the training text, as nanoGPT's
// shakespeare_char recipe builds it (`chars = sorted(list(set(data)))`): the vocabulary is the
// sorted set of distinct code points, id = rank. Text is UTF-8; a multi-byte character is one
// symbol. The vocabulary is learned by fit() and saved by state(), so a resumed run or a later
// `loom generate` decodes with exactly the vocabulary the model was trained on.
#include <algorithm>
#include <array>
#include <cstdio>
#include <loom/kinds/tokenizer.hpp>
#include <loom/plugin.hpp>
#include <loom/utf8.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

constexpr char32_t kMaxCodePoint = 0x10FFFF;
constexpr int kStateVersion = 1;

bool is_scalar_value(std::int64_t cp) {
  return cp >= 0 && cp <= kMaxCodePoint && !(cp >= 0xD800 && cp <= 0xDFFF);
}

std::string encode_utf8(char32_t cp) {
  std::string s;
  loom::append_utf8(s, cp);
  return s;
}

std::string code_point_name(char32_t cp) {
  char hex[16];
  std::snprintf(hex, sizeof hex, "U+%04X", static_cast<unsigned>(cp));
  // Control and space characters are named only by number: printed, they would be invisible or
  // break the message.
  if (cp < 0x21 || (cp >= 0x7F && cp <= 0xA0)) return hex;
  return "'" + encode_utf8(cp) + "' (" + hex + ")";
}

// "byte offset 120 (line 3, column 7)": where a problem is, in terms an editor shows.
std::string position_of(std::string_view text, std::size_t offset) {
  std::size_t line = 1, column = 1;
  for (std::size_t i = 0; i < offset;) {
    if (text[i] == '\n') {
      ++line, column = 1, ++i;
      continue;
    }
    const loom::Utf8Char d = loom::decode_utf8(text, i);
    i += d.length ? d.length : 1;
    ++column;
  }
  return "byte offset " + std::to_string(offset) + " (line " + std::to_string(line) + ", column " +
         std::to_string(column) + ")";
}

[[noreturn]] void invalid_utf8(std::string_view text, std::size_t offset, std::string_view what) {
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02X", static_cast<unsigned>(static_cast<unsigned char>(text[offset])));
  throw loom::UserError("char tokenizer: " + std::string(what) + " is not valid UTF-8 at " + position_of(text, offset) +
                        " (byte " + hex + "); the char tokenizer reads UTF-8 text only");
}

class CharTokenizer final : public loom::Tokenizer {
 public:
  explicit CharTokenizer(const loom::Options& options) : skip_unknown_(options.get<std::string>("unknown") == "skip") {}

  std::int64_t vocab_size() const override {
    require_fitted("vocab_size");
    return static_cast<std::int64_t>(chars_.size());
  }

  std::vector<std::int32_t> encode(std::string_view text) const override {
    require_fitted("encode");
    std::vector<std::int32_t> ids;
    ids.reserve(text.size());
    for (std::size_t i = 0; i < text.size();) {
      const auto b = static_cast<unsigned char>(text[i]);
      std::int32_t id;
      char32_t cp;
      std::size_t length;
      if (b < 0x80) {
        cp = b, length = 1, id = ascii_[b];
      } else {
        const loom::Utf8Char d = loom::decode_utf8(text, i);
        if (d.length == 0) invalid_utf8(text, i, "the text to encode");
        cp = d.code_point, length = d.length;
        const auto it = other_.find(cp);
        id = it == other_.end() ? -1 : it->second;
      }
      if (id >= 0) {
        ids.push_back(id);
      } else if (!skip_unknown_) {
        throw loom::UserError("char tokenizer: character " + code_point_name(cp) + " at " + position_of(text, i) +
                              " is not in the vocabulary of " + std::to_string(chars_.size()) +
                              " characters built from the training text; fit the tokenizer on text that contains "
                              "it, or set `unknown: skip` to drop such characters");
      }
      i += length;
    }
    return ids;
  }

  std::string decode(std::span<const std::int32_t> ids) const override {
    require_fitted("decode");
    std::string text;
    text.reserve(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const std::int32_t id = ids[i];
      if (id < 0 || static_cast<std::size_t>(id) >= chars_.size())
        throw loom::UserError("char tokenizer: token id " + std::to_string(id) + " at position " + std::to_string(i) +
                              " is outside the vocabulary [0, " + std::to_string(chars_.size()) + ")");
      text += utf8_[static_cast<std::size_t>(id)];
    }
    return text;
  }

  // True until a vocabulary exists: built by fit(), or restored by load_state() on resume (then
  // the saved vocabulary is used as is).
  bool needs_fit() const override { return !fitted_; }

  void fit(std::string_view training_text) override {
    if (training_text.empty())
      throw loom::UserError(
          "char tokenizer: the training text is empty, so there is no character to build a vocabulary from");
    std::vector<bool> seen(kMaxCodePoint + 1, false);
    for (std::size_t i = 0; i < training_text.size();) {
      const loom::Utf8Char d = loom::decode_utf8(training_text, i);
      if (d.length == 0) invalid_utf8(training_text, i, "the training text");
      seen[d.code_point] = true;
      i += d.length;
    }
    std::vector<char32_t> chars;
    for (char32_t cp = 0; cp <= kMaxCodePoint; ++cp)
      if (seen[cp]) chars.push_back(cp);
    set_vocabulary(std::move(chars));
  }

  std::string state() const override {
    if (!fitted_) return "";
    nlohmann::json j;
    j["tokenizer"] = "char";
    j["version"] = kStateVersion;
    j["code_points"] = std::vector<std::uint32_t>(chars_.begin(), chars_.end());
    return j.dump();
  }

  void load_state(std::string_view state) override {
    if (state.empty()) {  // what state() saves before fit(): nothing learned yet
      fitted_ = false;
      chars_.clear();
      other_.clear();
      utf8_.clear();
      return;
    }
    const auto bad = [](const std::string& why) {
      return loom::UserError("char tokenizer: the saved vocabulary is not valid: " + why);
    };
    nlohmann::json j = nlohmann::json::parse(state, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) throw bad("it is not JSON");
    if (!j.is_object() || j.value("tokenizer", "") != "char")
      throw bad("it is not a char tokenizer's state (expected an object with \"tokenizer\": \"char\")");
    if (!j.contains("version") || j["version"] != kStateVersion)
      throw bad("version " + (j.contains("version") ? j["version"].dump() : std::string("(none)")) +
                " is not supported; this loom reads version " + std::to_string(kStateVersion));
    const auto it = j.find("code_points");
    if (it == j.end() || !it->is_array() || it->empty()) throw bad("\"code_points\" must be a non-empty list");
    std::vector<char32_t> chars;
    for (const auto& v : *it) {
      if (!v.is_number_integer() || !is_scalar_value(v.get<std::int64_t>()))
        throw bad("\"code_points\" holds " + v.dump() + ", which is not a Unicode scalar value");
      const auto cp = static_cast<char32_t>(v.get<std::int64_t>());
      if (!chars.empty() && cp <= chars.back()) throw bad("\"code_points\" must be sorted and without duplicates");
      chars.push_back(cp);
    }
    set_vocabulary(std::move(chars));
  }

 private:
  void require_fitted(const char* what) const {
    if (!fitted_)
      throw loom::UserError(std::string("char tokenizer: ") + what +
                            " was called before the vocabulary exists; it is built by fit() from the training "
                            "text (the dataset does this) or restored from a run's saved tokenizer state");
  }

  void set_vocabulary(std::vector<char32_t> chars) {
    chars_ = std::move(chars);
    ascii_.fill(-1);
    other_.clear();
    utf8_.clear();
    for (std::size_t id = 0; id < chars_.size(); ++id) {
      const char32_t cp = chars_[id];
      if (cp < 0x80)
        ascii_[cp] = static_cast<std::int32_t>(id);
      else
        other_.emplace(cp, static_cast<std::int32_t>(id));
      utf8_.push_back(encode_utf8(cp));
    }
    fitted_ = true;
  }

  bool skip_unknown_;
  bool fitted_ = false;
  std::vector<char32_t> chars_;  // id -> code point, ascending
  std::array<std::int32_t, 128> ascii_{};
  std::unordered_map<char32_t, std::int32_t> other_;
  std::vector<std::string> utf8_;  // id -> its UTF-8 bytes, for decode
};

loom::OptionSchema options() {
  loom::OptionSchema s;
  s.string("unknown", "error",
           "What encoding a character absent from the fitted vocabulary does: `error` stops with the character "
           "and its position, `skip` drops it.")
      .one_of({"error", "skip"});
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Tokenizer>(
      {.name = "char",
       .description = "one token per Unicode character of the training text (nanoGPT's shakespeare_char)",
       .version = "1.0.0",
       .options = options()},
      [](const loom::Options& o, const loom::CreateContext&) { return std::make_unique<CharTokenizer>(o); });
}

}  // namespace

LOOM_PLUGIN(register_components)
