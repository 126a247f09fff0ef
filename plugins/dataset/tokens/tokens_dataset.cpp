// The `tokens` dataset: pre-tokenized shards (loom/token_shard.hpp, written by `loom tokenize`),
// memory-mapped and cut into seq_len + 1 windows in place (loom/token_windows.hpp): nothing is
// read until a batch needs it, and a batch is a copy of its windows' ids.
#include <algorithm>
#include <cstdio>
#include <loom/kinds/dataset.hpp>
#include <loom/plugin.hpp>
#include <loom/text_corpus.hpp>
#include <loom/token_shard.hpp>
#include <loom/token_windows.hpp>
#include <memory>

namespace {

class TokensDataset final : public loom::Dataset {
 public:
  explicit TokensDataset(const loom::Options& options)
      : paths_(options.get<std::vector<std::string>>("paths")),
        validation_paths_(options.get<std::vector<std::string>>("validation_paths")),
        validation_fraction_(options.get<double>("validation_fraction")),
        tokenizer_state_(options.get<std::string>("tokenizer_state")),
        verify_(options.get<bool>("verify")),
        order_(loom::read_window_options(options)),
        path_(options.path()) {}

  void prepare(const loom::DatasetSetup& setup) override {
    if (setup.seq_len <= 0) throw loom::UserError("seq_len must be positive, not " + std::to_string(setup.seq_len));
    const auto files = loom::expand_paths(paths_, path_ + ".paths");
    const auto validation_files = validation_paths_.empty()
                                      ? std::vector<std::filesystem::path>{}
                                      : loom::expand_paths(validation_paths_, path_ + ".validation_paths");
    train_.clear();
    validation_.clear();
    for (const auto& f : files) train_.push_back(open(f));
    for (const auto& f : validation_files) validation_.push_back(open(f));
    if (setup.tokenizer) match_tokenizer(*setup.tokenizer, files.front());
    for (const auto* shards : {&train_, &validation_})
      for (const auto& s : *shards)
        loom::check_vocabulary(s.info().max_token_id, setup, path_ + ": token shard " + s.path().string());

    const std::string what = path_ + ": " + loom::describe_files(files);
    std::vector<loom::TokenSequence> train, validation;
    std::int64_t total = 0;
    for (const auto& s : train_) {
      train.push_back(sequence(s));
      total += s.info().num_tokens;
    }
    if (total == 0) throw loom::UserError(what + ": the corpus is empty: the shards hold no tokens");
    std::string validation_what = path_ + ": the validation shards " + loom::describe_files(validation_files);
    if (!validation_.empty()) {
      std::int64_t n = 0;
      for (const auto& s : validation_) {
        validation.push_back(sequence(s));
        n += s.info().num_tokens;
      }
      if (n == 0) throw loom::UserError(validation_what + " hold no tokens");
    } else if (validation_fraction_ > 0) {
      validation = split_tail(train, total);
      char percent[32];
      std::snprintf(percent, sizeof percent, "%g%%", validation_fraction_ * 100);
      validation_what = "the validation split (the last " + std::string(percent) + " of " + what + ")";
    }
    train_windows_ = loom::TokenWindows(std::move(train), setup.seq_len, setup.seed, loom::Split::train, order_,
                                        validation.empty() ? what : "the training split of " + what);
    if (!validation.empty())
      validation_windows_ = loom::TokenWindows(std::move(validation), setup.seq_len, setup.seed,
                                               loom::Split::validation, {order_.shuffle, false}, validation_what);
    batch_size_ = setup.batch_size;
    separator_ends_documents_ = setup.tokenizer && separator_only_between_documents(*setup.tokenizer);
  }

  void batch(loom::Split split, std::int64_t index, loom::Batch& out) const override {
    const loom::TokenWindows& w = split == loom::Split::train ? train_windows_ : validation_windows_;
    if (w.empty())
      throw loom::UserError(split == loom::Split::train
                                ? path_ + ": batch() before prepare()"
                                : path_ +
                                      ": there is no validation split (validation_fraction is 0 and no "
                                      "validation_paths are given)");
    w.fill(index, batch_size_, out);
  }

  std::int64_t num_tokens(loom::Split split) const override {
    return (split == loom::Split::train ? train_windows_ : validation_windows_).num_tokens();
  }
  bool separator_ends_documents() const override { return separator_ends_documents_; }

 private:
  loom::TokenShard open(const std::filesystem::path& file) const {
    return loom::with_context("while reading " + path_, [&] { return loom::TokenShard::open(file, verify_); });
  }

  static loom::TokenSequence sequence(const loom::TokenShard& s) {
    loom::TokenSequence q;
    q.tokens = s.tokens();
    q.token_bytes = s.info().token_bytes;
    q.size = s.info().num_tokens;
    q.document_ends = s.document_ends();
    q.name = s.path().string();
    return q;
  }

  // Whether the shards hold several documents and the separator `loom tokenize` writes between
  // them nowhere else. An end-of-text token is taken to be only a separator; a "\n" separator is
  // looked for inside the documents, which reads every token, so only when the shards were read
  // anyway (verify).
  bool separator_only_between_documents(const loom::Tokenizer& tokenizer) const {
    std::int64_t documents = 0;
    for (const auto* shards : {&train_, &validation_})
      for (const auto& s : *shards) documents += static_cast<std::int64_t>(s.document_ends().size());
    if (documents < 2) return false;
    if (tokenizer.end_of_text()) return true;
    if (!verify_) return false;
    std::vector<std::int32_t> separator;
    try {
      separator = loom::document_separator(tokenizer);
    } catch (const loom::UserError&) {
      return false;  // a vocabulary without "\n": nothing separated the documents
    }
    if (separator.empty()) return false;
    std::vector<std::int32_t> document;
    for (const auto* shards : {&train_, &validation_})
      for (const auto& s : *shards) {
        std::int64_t start = 0;
        for (const std::int64_t end : s.document_ends()) {
          document.resize(static_cast<std::size_t>(end - start));
          for (std::int64_t i = start; i < end; ++i)
            document[static_cast<std::size_t>(i - start)] =
                s.info().token_bytes == 2 ? static_cast<std::int32_t>(static_cast<const std::uint16_t*>(s.tokens())[i])
                                          : static_cast<std::int32_t>(static_cast<const std::uint32_t*>(s.tokens())[i]);
          // The separator that ends the document is its last tokens (not after a stream's last).
          auto body_end = document.end();
          if (document.size() >= separator.size() &&
              std::equal(separator.begin(), separator.end(),
                         document.end() - static_cast<std::ptrdiff_t>(separator.size())))
            body_end -= static_cast<std::ptrdiff_t>(separator.size());
          if (std::search(document.begin(), body_end, separator.begin(), separator.end()) != body_end) return false;
          start = end;
        }
      }
    return true;
  }

  // The last validation_fraction of the training stream, as the text datasets split theirs.
  std::vector<loom::TokenSequence> split_tail(std::vector<loom::TokenSequence>& train, std::int64_t total) const {
    const auto keep = static_cast<std::int64_t>(static_cast<double>(total) * (1.0 - validation_fraction_));
    if (keep >= total)
      throw loom::UserError(path_ + ": validation_fraction " + std::to_string(validation_fraction_) + " of " +
                            std::to_string(total) + " tokens leaves no validation tokens: raise it, or set it to 0");
    std::vector<loom::TokenSequence> kept, tail;
    std::int64_t start = 0;
    for (const auto& s : train) {
      const std::int64_t end = start + s.size;
      if (end <= keep) {
        kept.push_back(s);
      } else if (start >= keep) {
        tail.push_back(s);
      } else {
        kept.push_back(s.slice(0, keep - start));
        tail.push_back(s.slice(keep - start, s.size));
      }
      start = end;
    }
    train = std::move(kept);
    return tail;
  }

  // A tokenizer that learns its vocabulary gets the state `loom tokenize` saved; any tokenizer
  // must have the vocabulary the shards were written with.
  void match_tokenizer(loom::Tokenizer& tokenizer, const std::filesystem::path& first_shard) const {
    if (tokenizer.needs_fit()) {
      const std::filesystem::path state = tokenizer_state_.empty() ? first_shard.parent_path() / "tokenizer.state"
                                                                   : std::filesystem::path(tokenizer_state_);
      if (!std::filesystem::exists(state))
        throw loom::UserError(path_ +
                              ": the tokenizer learns its vocabulary from text, which token shards do not "
                              "hold; " +
                              (tokenizer_state_.empty()
                                   ? "expected the tokenizer.state that `loom tokenize` writes beside the shards, "
                                     "at " +
                                         state.string() + ", or set " + path_ + ".tokenizer_state"
                                   : "no such file: " + state.string() + " (" + path_ + ".tokenizer_state)"));
      tokenizer.load_state(loom::read_text_file(state));
    }
    for (const auto* shards : {&train_, &validation_})
      for (const auto& s : *shards)
        if (s.info().vocab_size != tokenizer.vocab_size())
          throw loom::UserError(path_ + ": token shard " + s.path().string() + " was written by a tokenizer of " +
                                std::to_string(s.info().vocab_size) + " ids, but the configured tokenizer has " +
                                std::to_string(tokenizer.vocab_size()) +
                                ": configure the tokenizer the shards were made with, or tokenize again");
  }

  std::vector<std::string> paths_, validation_paths_;
  double validation_fraction_;
  std::string tokenizer_state_;
  bool verify_;
  loom::WindowOrder order_;
  std::string path_;
  std::vector<loom::TokenShard> train_, validation_;
  loom::TokenWindows train_windows_, validation_windows_;
  std::int64_t batch_size_ = 0;
  bool separator_ends_documents_ = false;
};

loom::OptionSchema options() {
  loom::OptionSchema s;
  s.list("paths", loom::OptionType::string, {},
         "Token shards (files, directories or globs such as `data/train-*.bin`) written by `loom tokenize`.")
      .required()
      .length(1, static_cast<std::size_t>(-1));
  s.list("validation_paths", loom::OptionType::string, {},
         "Shards of the validation split (`data/validation-*.bin`); when empty, the last validation_fraction of "
         "the tokens is held out.");
  s.number("validation_fraction", 0.1,
           "Last fraction of the token stream held out for validation when validation_paths is empty (0: no "
           "validation split).")
      .min(0.0)
      .max(1.0, false);
  s.string("tokenizer_state", "",
           "For a tokenizer that learns its vocabulary (char): the state file `loom tokenize` wrote; \"\": "
           "tokenizer.state beside the first shard.");
  s.boolean("verify", true,
            "Read every shard once at start-up to check its checksum and token ids (false: trust the headers).");
  loom::declare_window_options(s);
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Dataset>(
      {.name = "tokens",
       .description = "pre-tokenized shards from `loom tokenize`, memory-mapped",
       .version = "1.0.0",
       .options = options()},
      [](const loom::Options& o, const loom::CreateContext&) { return std::make_unique<TokensDataset>(o); });
}

}  // namespace

LOOM_PLUGIN(register_components)
