// The `jsonl` dataset: JSON-lines files whose `text_field` holds one document per line,
// tokenized, packed with the tokenizer's end of text between documents (kept apart by segment
// ids) and cut into seq_len + 1 windows (loom/token_windows.hpp). Validation by fraction (the
// last part of the token stream) or by file.
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
        execution_(&execution) {}

  void prepare(const loom::DatasetSetup& setup) override {
    if (!setup.tokenizer)
      throw loom::UserError(path_ + ": the jsonl dataset needs a tokenizer (the `tokenizer` section)");
    const auto files = loom::expand_paths(paths_, path_ + ".paths");
    const auto validation_files = validation_paths_.empty()
                                      ? std::vector<std::filesystem::path>{}
                                      : loom::expand_paths(validation_paths_, path_ + ".validation_paths");
    const std::vector<std::string> train_docs = read_documents(files);
    const std::vector<std::string> validation_docs = read_documents(validation_files);

    loom::Tokenizer& tokenizer = *setup.tokenizer;
    if (tokenizer.needs_fit()) {
      // On all the text, validation included, joined by the "\n" that separates documents when
      // the tokenizer has no end-of-text token.
      std::string all;
      for (const auto* docs : {&train_docs, &validation_docs})
        for (const auto& d : *docs) {
          if (!all.empty()) all += '\n';
          all += d;
        }
      tokenizer.fit(all);
    }

    const std::string what = loom::describe_files(files);
    loom::PackedTokens train = loom::pack_documents(tokenizer, train_docs, execution_);
    if (train.tokens.empty())
      throw loom::UserError(path_ + ": the corpus is empty: " + what + " holds no document with text in \"" +
                            text_field_ + "\"");
    loom::check_vocabulary(train.max_token_id, setup, path_ + ": " + what);
    std::optional<loom::PackedTokens> validation;
    if (!validation_files.empty()) {
      validation = loom::pack_documents(tokenizer, validation_docs, execution_);
      const std::string vwhat = loom::describe_files(validation_files);
      if (validation->tokens.empty())
        throw loom::UserError(path_ + ": the validation files are empty: " + vwhat + " holds no document");
      loom::check_vocabulary(validation->max_token_id, setup, path_ + ": " + vwhat);
    }
    train_ = std::move(train);
    validation_ = std::move(validation);
    splits_ = loom::split_corpus(*train_, validation_ ? &*validation_ : nullptr, validation_fraction_, setup, order_,
                                 path_ + ": " + what);
    batch_size_ = setup.batch_size;
  }

  void batch(loom::Split split, std::int64_t index, loom::Batch& out) const override {
    const loom::TokenWindows& w = split == loom::Split::train ? splits_.train : splits_.validation;
    if (w.empty())
      throw loom::UserError(split == loom::Split::train
                                ? path_ + ": batch() before prepare()"
                                : path_ +
                                      ": there is no validation split (validation_fraction is 0 and no "
                                      "validation_paths are given)");
    w.fill(index, batch_size_, out);
  }

  std::int64_t num_tokens(loom::Split split) const override {
    return (split == loom::Split::train ? splits_.train : splits_.validation).num_tokens();
  }

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
  std::optional<loom::PackedTokens> train_, validation_;
  loom::CorpusSplits splits_;
  std::int64_t batch_size_ = 0;
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
      {"jsonl", "one document per JSON line (its text_field), packed with end-of-text separators", "1.0.0", options()},
      [](const loom::Options& o, const loom::CreateContext& c) {
        return std::make_unique<JsonlDataset>(o, c.execution());
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
