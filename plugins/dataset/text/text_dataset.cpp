// The `text` dataset: plain-text files, each one document, tokenized, packed and cut into
// seq_len + 1 windows (loom/token_windows.hpp), with a validation split by fraction (the last
// part of the token stream, as nanoGPT's shakespeare_char) or by file.
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
        execution_(&execution) {}

  void prepare(const loom::DatasetSetup& setup) override {
    if (!setup.tokenizer)
      throw loom::UserError(path_ + ": the text dataset needs a tokenizer (the `tokenizer` section)");
    const auto files = loom::expand_paths(paths_, path_ + ".paths");
    const auto validation_files = validation_paths_.empty()
                                      ? std::vector<std::filesystem::path>{}
                                      : loom::expand_paths(validation_paths_, path_ + ".validation_paths");
    std::vector<std::string> train_text, validation_text;
    for (const auto& f : files) train_text.push_back(loom::read_text_file(f));
    for (const auto& f : validation_files) validation_text.push_back(loom::read_text_file(f));

    loom::Tokenizer& tokenizer = *setup.tokenizer;
    if (tokenizer.needs_fit()) {
      // On all the text, validation files included: nanoGPT builds its character set from the
      // whole file, and a vocabulary that cannot encode the validation text is of no use.
      std::string all;
      for (const auto* texts : {&train_text, &validation_text})
        for (const auto& t : *texts) {
          if (!all.empty()) all += '\n';
          all += t;
        }
      tokenizer.fit(all);
    }

    const std::string what = loom::describe_files(files);
    const loom::PackedTokens train = loom::pack_documents(tokenizer, train_text, execution_);
    if (train.tokens.empty()) throw loom::UserError(path_ + ": the corpus is empty: " + what + " holds no text");
    loom::check_vocabulary(train.max_token_id, setup, path_ + ": " + what);
    std::optional<loom::PackedTokens> validation;
    if (!validation_files.empty()) {
      validation = loom::pack_documents(tokenizer, validation_text, execution_);
      const std::string vwhat = loom::describe_files(validation_files);
      if (validation->tokens.empty())
        throw loom::UserError(path_ + ": the validation files are empty: " + vwhat + " holds no text");
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
  std::vector<std::string> paths_, validation_paths_;
  double validation_fraction_;
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
  registrar.add<loom::Dataset>(
      {"text", "plain-text files, tokenized and packed into seq_len + 1 windows", "1.0.0", options()},
      [](const loom::Options& o, const loom::CreateContext& c) {
        return std::make_unique<TextDataset>(o, c.execution());
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
