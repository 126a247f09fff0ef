// The `tokenizer` kind: text to token ids and back.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/component.hpp"

namespace loom {

class Tokenizer : public Component {
 public:
  static constexpr std::string_view kind = "tokenizer";
  ~Tokenizer() override;

  // Number of distinct ids; every id encode returns is below it. Valid after fit() for
  // tokenizers that need one.
  virtual std::int64_t vocab_size() const = 0;
  // Deterministic; safe to call concurrently on a const tokenizer.
  virtual std::vector<std::int32_t> encode(std::string_view text) const = 0;
  // Throws UserError for an id outside [0, vocab_size()).
  virtual std::string decode(std::span<const std::int32_t> ids) const = 0;
  // The id that separates documents, if the vocabulary has one (GPT-2's <|endoftext|>).
  virtual std::optional<std::int32_t> end_of_text() const { return std::nullopt; }

  // Tokenizers that learn their vocabulary from the training text (`char`) return true and
  // build it in fit(); the dataset calls fit() with its training text before encoding. Others
  // ignore both.
  virtual bool needs_fit() const { return false; }
  virtual void fit(std::string_view /*training_text*/) {}

  // Everything needed to rebuild this tokenizer exactly (a fitted vocabulary), as text that a run
  // directory or checkpoint stores; "" when the options alone rebuild it. load_state(state())
  // on a freshly created tokenizer of the same options restores it.
  virtual std::string state() const { return ""; }
  virtual void load_state(std::string_view /*state*/) {}
};

}  // namespace loom
