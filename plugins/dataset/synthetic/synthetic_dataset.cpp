// The `synthetic` dataset: a download-free corpus generated from a seeded probabilistic grammar
// (grammar.hpp), tokenized with the configured tokenizer and packed like the text datasets:
// documents separated by the tokenizer's end of text (or "\n" when it has none) and kept apart
// by segment ids, cut into seq_len + 1 windows (loom/token_windows.hpp), the last
// validation_fraction of the tokens held out.
#include <loom/kinds/dataset.hpp>
#include <loom/plugin.hpp>
#include <loom/token_windows.hpp>
#include <memory>
#include <optional>

#include "grammar.hpp"

namespace {

class SyntheticDataset final : public loom::Dataset {
 public:
  SyntheticDataset(const loom::Options& options, const loom::ExecutionContext& execution)
      : num_documents_(options.get<std::int64_t>("num_documents")),
        max_sentences_(options.get<int>("max_sentences")),
        grammar_seed_(static_cast<std::uint64_t>(options.get<std::int64_t>("grammar_seed"))),
        validation_fraction_(options.get<double>("validation_fraction")),
        order_(loom::read_window_options(options)),
        path_(options.path()),
        execution_(&execution) {}

  void prepare(const loom::DatasetSetup& setup) override {
    if (!setup.tokenizer)
      throw loom::UserError(path_ + ": the synthetic dataset needs a tokenizer (the `tokenizer` section)");
    std::vector<std::string> documents(static_cast<std::size_t>(num_documents_));
    execution_->parallel_for(num_documents_, 256, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i)
        documents[static_cast<std::size_t>(i)] =
            loom::synthetic::document(grammar_seed_, static_cast<std::uint64_t>(i), max_sentences_);
    });
    loom::Tokenizer& tokenizer = *setup.tokenizer;
    if (tokenizer.needs_fit()) {
      std::string all;
      for (const auto& d : documents) {
        if (!all.empty()) all += '\n';
        all += d;
      }
      tokenizer.fit(all);
    }
    corpus_ = loom::pack_documents(tokenizer, documents, execution_);
    const std::string what = path_ + ": the synthetic corpus (" + std::to_string(num_documents_) + " documents)";
    loom::check_vocabulary(corpus_.max_token_id, setup, what);
    splits_ = loom::split_corpus(corpus_, nullptr, validation_fraction_, setup, order_, what);
    batch_size_ = setup.batch_size;
  }

  void batch(loom::Split split, std::int64_t index, loom::Batch& out) const override {
    const loom::TokenWindows& w = split == loom::Split::train ? splits_.train : splits_.validation;
    if (w.empty())
      throw loom::UserError(split == loom::Split::train
                                ? path_ + ": batch() before prepare()"
                                : path_ + ": there is no validation split (validation_fraction is 0)");
    w.fill(index, batch_size_, out);
  }

  std::int64_t num_tokens(loom::Split split) const override {
    return (split == loom::Split::train ? splits_.train : splits_.validation).num_tokens();
  }
  bool separator_ends_documents() const override { return corpus_.separator_ends_documents(); }

 private:
  std::int64_t num_documents_;
  int max_sentences_;
  std::uint64_t grammar_seed_;
  double validation_fraction_;
  loom::WindowOrder order_;
  std::string path_;
  const loom::ExecutionContext* execution_;
  loom::PackedTokens corpus_;
  loom::CorpusSplits splits_;
  std::int64_t batch_size_ = 0;
};

loom::OptionSchema options() {
  loom::OptionSchema s;
  s.integer("num_documents", 20000,
            "Documents in the corpus (about 100 characters each); document i is the same whatever the count.")
      .min(1);
  s.integer("max_sentences", 4, "Each document has 1 to max_sentences sentence templates.").range(1, 64);
  s.integer("grammar_seed", 0, "Seed of the corpus's content (the order of batches follows the run's seed instead).")
      .min(0);
  s.number("validation_fraction", 0.1, "Last fraction of the token stream held out for validation (0: none).")
      .min(0.0)
      .max(1.0, false);
  loom::declare_window_options(s);
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Dataset>(
      {.name = "synthetic",
       .description = "sentences from a seeded grammar: agreement, counting, sums, recall; no download",
       .version = "1.0.0",
       .options = options()},
      [](const loom::Options& o, const loom::CreateContext& c) {
        return std::make_unique<SyntheticDataset>(o, c.execution());
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
