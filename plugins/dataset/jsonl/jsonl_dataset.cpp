// The `jsonl` dataset: JSON-lines files whose `text_field` holds one document per line,
// tokenized, packed with the tokenizer's end of text between documents (kept apart by segment
// ids) and cut into seq_len + 1 windows (loom/token_windows.hpp). Validation by fraction (the
// last part of the token stream) or by file.
#include <loom/document_corpus.hpp>
#include <loom/kinds/dataset.hpp>
#include <loom/plugin.hpp>
#include <loom/text_corpus.hpp>
#include <loom/token_windows.hpp>
#include <memory>
#include <optional>

namespace {

class JsonlDataset final : public loom::Dataset {
 public:
  JsonlDataset(const loom::Options& options, const loom::ExecutionContext& execution)
      : paths_(options.get<std::vector<std::string>>("paths")),
        validation_paths_(options.get<std::vector<std::string>>("validation_paths")),
        validation_fraction_(options.get<double>("validation_fraction")),
        text_field_(options.get<std::string>("text_field")),
        order_(loom::read_window_options(options)),
        path_(options.path()),
        execution_(&execution),
        corpus_(path_) {}

  void prepare(const loom::DatasetSetup& setup) override {
    if (!setup.tokenizer)
      throw loom::UserError(path_ + ": the jsonl dataset needs a tokenizer (the `tokenizer` section)");
    const auto files = loom::expand_paths(paths_, path_ + ".paths");
    const auto validation_files = validation_paths_.empty()
                                      ? std::vector<std::filesystem::path>{}
                                      : loom::expand_paths(validation_paths_, path_ + ".validation_paths");
    const loom::DocumentCorpus::Documents train{files, read_documents(files)};
    const loom::DocumentCorpus::Documents validation{validation_files, read_documents(validation_files)};
    corpus_.prepare(setup, train, validation, validation_fraction_, order_, execution_,
                    "document with text in \"" + text_field_ + "\"", "document");
  }

  void batch(loom::Split split, std::int64_t index, loom::Batch& out) const override {
    corpus_.batch(split, index, out);
  }
  std::int64_t num_tokens(loom::Split split) const override { return corpus_.num_tokens(split); }
  bool separator_ends_documents() const override { return corpus_.separator_ends_documents(); }

 private:
  std::vector<std::string> read_documents(const std::vector<std::filesystem::path>& files) const {
    std::vector<std::string> docs;
    for (const auto& f : files)
      loom::read_jsonl(f, text_field_, [&](loom::JsonlDocument&& d) { docs.push_back(std::move(d.text)); });
    return docs;
  }

  std::vector<std::string> paths_, validation_paths_;
  double validation_fraction_;
  std::string text_field_;
  loom::WindowOrder order_;
  std::string path_;
  const loom::ExecutionContext* execution_;
  loom::DocumentCorpus corpus_;
};

loom::OptionSchema options() {
  loom::OptionSchema s;
  s.list("paths", loom::OptionType::string, {},
         "JSON-lines files, directories or globs (`data/*.jsonl`), relative to the current directory; each line "
         "is one document.")
      .required()
      .length(1, static_cast<std::size_t>(-1));
  s.string("text_field", "text", "The field of each line's JSON object that holds the document's text.");
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
  registrar.add<loom::Dataset>(
      {.name = "jsonl",
       .description = "one document per JSON line (its text_field), packed with end-of-text separators",
       .version = "1.0.0",
       .options = options()},
      [](const loom::Options& o, const loom::CreateContext& c) {
        return std::make_unique<JsonlDataset>(o, c.execution());
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
