// The `byte` tokenizer: one symbol per byte, ids 0..255. Any byte string, valid UTF-8 or not,
// encodes and decodes back unchanged, and it needs no vocabulary file or fitting.
#include <loom/kinds/tokenizer.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <string>

namespace {

class ByteTokenizer final : public loom::Tokenizer {
 public:
  std::int64_t vocab_size() const override { return 256; }

  std::vector<std::int32_t> encode(std::string_view text) const override {
    std::vector<std::int32_t> ids(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }

  std::string decode(std::span<const std::int32_t> ids) const override {
    std::string text(ids.size(), '\0');
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] > 255)
        throw loom::UserError("byte tokenizer: token id " + std::to_string(ids[i]) + " at position " +
                              std::to_string(i) + " is outside the vocabulary [0, 256)");
      text[i] = static_cast<char>(static_cast<unsigned char>(ids[i]));
    }
    return text;
  }
};

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Tokenizer>(
      {.name = "byte", .description = "one token per byte (256 symbols); round-trips any bytes", .version = "1.0.0"},
      [](const loom::Options&, const loom::CreateContext&) { return std::make_unique<ByteTokenizer>(); });
}

}  // namespace

LOOM_PLUGIN(register_components)
