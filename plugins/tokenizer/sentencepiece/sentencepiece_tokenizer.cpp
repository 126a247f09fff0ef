// The `sentencepiece` tokenizer: a SentencePiece model file (`tokenizer.model`, as Llama 2,
// Mistral and Gemma ship it) read from a local path and run by Google's own library
// (Debian's libsentencepiece-dev), so ids are exactly those of the `sentencepiece` Python
// package: unigram or BPE, with the model's normalizer and byte fallback. encode adds no BOS or
// EOS; end_of_text is the model's EOS piece when it has one.
//
// Its Hugging Face form (`loom export`): the model file as tokenizer.model, with the
// tokenizer_config.json, special_tokens_map.json, tokenizer.json and added_tokens.json that sit
// beside it (a Hugging Face directory's, as trainer.init_from reads it), verbatim; without a
// tokenizer_config.json there, one naming transformers' LlamaTokenizer and the model's pieces.
#include <sentencepiece_processor.h>

#include <filesystem>
#include <fstream>
#include <loom/hf_interop.hpp>
#include <loom/kinds/tokenizer.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace {

class SentencePieceTokenizer final : public loom::Tokenizer, public loom::HfTokenizer {
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

  std::vector<loom::HfFile> hf_tokenizer_files(std::int64_t model_max_length) const override {
    auto read = [](const std::filesystem::path& file) {
      std::ifstream in(file, std::ios::binary);
      std::ostringstream bytes;
      bytes << in.rdbuf();
      if (!in) throw loom::UserError("cannot read '" + file.string() + "' (the tokenizer's Hugging Face files)");
      return bytes.str();
    };
    const std::filesystem::path model(path_);
    std::vector<loom::HfFile> files{{"tokenizer.model", read(model)}};
    bool has_config = false;
    for (const char* name :
         {"tokenizer_config.json", "special_tokens_map.json", "tokenizer.json", "added_tokens.json"}) {
      std::error_code ec;
      const std::filesystem::path beside = model.parent_path() / name;
      if (!std::filesystem::is_regular_file(beside, ec)) continue;
      files.push_back({name, read(beside)});
      has_config = has_config || std::string(name) == "tokenizer_config.json";
    }
    if (!has_config) {
      nlohmann::ordered_json config = {{"tokenizer_class", "LlamaTokenizer"},
                                       {"model_max_length", model_max_length},
                                       {"add_bos_token", processor_.bos_id() >= 0},
                                       {"add_eos_token", false}};
      auto piece = [&](const char* key, int id) {
        if (id >= 0) config[key] = processor_.IdToPiece(id);
      };
      piece("bos_token", processor_.bos_id());
      piece("eos_token", processor_.eos_id());
      piece("unk_token", processor_.unk_id());
      piece("pad_token", processor_.pad_id());
      files.push_back({"tokenizer_config.json", config.dump(2) + "\n"});
    }
    return files;
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
      {.name = "sentencepiece",
       .description = "a SentencePiece model file (Llama 2, Mistral, Gemma), by Google's sentencepiece library",
       .version = "1.0.0",
       .options = schema()},
      [](const loom::Options& options, const loom::CreateContext&) {
        return std::make_unique<SentencePieceTokenizer>(options.get<std::string>("model_file"));
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
