// The `sentencepiece` tokenizer: a SentencePiece model file (`tokenizer.model`, as Llama 2,
// Mistral and Gemma ship it) read from a local path and run by Google's own library
// (Debian's libsentencepiece-dev), so ids are exactly those of the `sentencepiece` Python
// package: unigram or BPE, with the model's normalizer and byte fallback. encode adds no BOS or
// EOS; end_of_text is the model's EOS piece when it has one.
#include <sentencepiece_processor.h>

#include <filesystem>
#include <loom/kinds/tokenizer.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <string>

namespace {

class SentencePieceTokenizer final : public loom::Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) : path_(path) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec))
      throw loom::UserError("tokenizer.model_file: " + path +
                            " is not a file; give the path of a SentencePiece model (tokenizer.model)");
    const auto status = processor_.Load(path);
    if (!status.ok())
      throw loom::UserError("tokenizer.model_file: " + path + " is not a SentencePiece model (" + status.ToString() +
                            ")");
  }

  std::int64_t vocab_size() const override { return processor_.GetPieceSize(); }

  std::vector<std::int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    const auto status = processor_.Encode(text, &ids);
    if (!status.ok()) throw loom::UserError("sentencepiece tokenizer: cannot encode: " + status.ToString());
    return {ids.begin(), ids.end()};
  }

  std::string decode(std::span<const std::int32_t> ids) const override {
    const std::int32_t n = processor_.GetPieceSize();
    for (std::size_t i = 0; i < ids.size(); ++i)
      if (ids[i] < 0 || ids[i] >= n)
        throw loom::UserError("sentencepiece tokenizer: token id " + std::to_string(ids[i]) + " at position " +
                              std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(n) + ") of " +
                              path_);
    std::string text;
    const auto status = processor_.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
    if (!status.ok()) throw loom::UserError("sentencepiece tokenizer: cannot decode: " + status.ToString());
    return text;
  }

  std::optional<std::int32_t> end_of_text() const override {
    const int eos = processor_.eos_id();
    return eos >= 0 ? std::optional<std::int32_t>(eos) : std::nullopt;
  }

 private:
  std::string path_;
  sentencepiece::SentencePieceProcessor processor_;
};

loom::OptionSchema schema() {
  loom::OptionSchema s;
  s.string("model_file", "", "Path of the SentencePiece model (tokenizer.model).").required();
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Tokenizer>(
      {"sentencepiece", "a SentencePiece model file (Llama 2, Mistral, Gemma), by Google's sentencepiece library",
       "1.0.0", schema()},
      [](const loom::Options& options, const loom::CreateContext&) {
        return std::make_unique<SentencePieceTokenizer>(options.get<std::string>("model_file"));
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
