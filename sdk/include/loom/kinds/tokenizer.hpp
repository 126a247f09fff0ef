// The `tokenizer` kind: text to token ids and back.
#pragma once

#include <cstdint>
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

  // Number of distinct ids; every id encode returns is below it.
  virtual std::int64_t vocab_size() const = 0;
  // Deterministic; safe to call concurrently on a const tokenizer.
  virtual std::vector<std::int32_t> encode(std::string_view text) const = 0;
  // Throws UserError for an id outside [0, vocab_size()).
  virtual std::string decode(std::span<const std::int32_t> ids) const = 0;
};

}  // namespace loom
