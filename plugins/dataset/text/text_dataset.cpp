// The `text` dataset: plain-text files, each one document, tokenized, packed and cut into
// seq_len + 1 windows (loom/token_windows.hpp), with a validation split by fraction (the last
// part of the token stream, as nanoGPT's shakespeare_char) or by file.
#include <loom/document_corpus.hpp>
#include <loom/kinds/dataset.hpp>
#include <loom/plugin.hpp>
#include <loom/text_corpus.hpp>
#include <loom/token_windows.hpp>
#include <memory>
#include <optional>

namespace {

class TextDataset final : public loom::Dataset {
 public:
  TextDataset(const loom::Options& options, const loom::ExecutionContext& execution)
      : paths_(options.get<std::vector<std::string>>("paths")),
        validation_paths_(options.get<std::vector<std::string>>("validation_paths")),
        validation_fraction_(options.get<double>("validation_fraction")),
        order_(loom::read_window_options(options)),
        path_(options.path()),
        execution_(&execution),
        corpus_(path_) {}

  void prepare(const loom::DatasetSetup& setup) override {
    if (!setup.tokenizer)
      throw loom::UserError(path_ + ": the text dataset needs a tokenizer (the `tokenizer` section)");
    const auto files = loom::expand_paths(paths_, path_ + ".paths");
    const auto validation_files = validation_paths_.empty()
                                      ? std::vector<std::filesystem::path>{}
                                      : loom::expand_paths(validation_paths_, path_ + ".validation_paths");
    loom::DocumentCorpus::Documents train{files, {}}, validation{validation_files, {}};
    for (const auto& f : files) train.texts.push_back(loom::read_text_file(f));
    for (const auto& f : validation_files) validation.texts.push_back(loom::read_text_file(f));
    corpus_.prepare(setup, train, validation, validation_fraction_, order_, execution_, "text", "text");
  }

  void batch(loom::Split split, std::int64_t index, loom::Batch& out) const override {
    corpus_.batch(split, index, out);
  }
  std::int64_t num_tokens(loom::Split split) const override { return corpus_.num_tokens(split); }
  bool separator_ends_documents() const override { return corpus_.separator_ends_documents(); }

 private:
  std::vector<std::string> paths_, validation_paths_;
  double validation_fraction_;
  loom::WindowOrder order_;
  std::string path_;
  const loom::ExecutionContext* execution_;
  loom::DocumentCorpus corpus_;
};

loom::OptionSchema options() {
  loom::OptionSchema s;
  s.list("paths", loom::OptionType::string, {},
         "Text files, directories or globs (`data/*.txt`), relative to the current directory; each file is one "
         "document.")
      .required()
      .length(1, static_cast<std::size_t>(-1));
  s.list("validation_paths", loom::OptionType::string, {},
         "Files for the validation split; when empty, the last validation_fraction of the tokens is held out.");
  s.number("validation_fraction", 0.1,
           "Last fraction of the token stream held out for validation when validation_paths is empty (0: no "
           "validation split).")
      .min(0.0)
      .max(1.0, false);
  loom::declare_window_options(s);
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Dataset>({.name = "text",
                                .description = "plain-text files, tokenized and packed into seq_len + 1 windows",
                                .version = "1.0.0",
                                .options = options()},
                               [](const loom::Options& o, const loom::CreateContext& c) {
                                 return std::make_unique<TextDataset>(o, c.execution());
                               });
}

}  // namespace

LOOM_PLUGIN(register_components)
