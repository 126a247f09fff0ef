// What the dataset plugins that hold whole documents in memory (text, jsonl) share once each has
// read its documents: fitting the tokenizer on all the text, packing, the vocabulary checks, the
// train/validation split (loom/token_windows.hpp) and serving batches. A plugin keeps one
// DocumentCorpus and says only how it reads documents.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loom/error.hpp"
#include "loom/execution.hpp"
#include "loom/kinds/dataset.hpp"
#include "loom/text_corpus.hpp"
#include "loom/token_windows.hpp"

namespace loom {

class DocumentCorpus {
 public:
  // The documents of one split and the files they came from (for messages).
  struct Documents {
    std::vector<std::filesystem::path> files;
    std::vector<std::string> texts;
  };

  // `path`: the dataset's config path, which starts every message.
  explicit DocumentCorpus(std::string path) : path_(std::move(path)) {}

  // Fits setup.tokenizer when it needs it (on all the text, validation included, joined by the
  // "\n" that separates documents when the tokenizer has no end-of-text token: nanoGPT builds its
  // character set from the whole file, and a vocabulary that cannot encode the validation text is
  // of no use), packs both splits and cuts them into windows. `validation.files` empty: the last
  // `validation_fraction` of the training tokens is the validation split. An empty split is a
  // UserError saying the files hold no `train_holds` / `validation_holds` ("text").
  void prepare(const DatasetSetup& setup, const Documents& train, const Documents& validation,
               double validation_fraction, WindowOrder order, const ExecutionContext* execution,
               const std::string& train_holds, const std::string& validation_holds) {
    Tokenizer& tokenizer = *setup.tokenizer;
    if (tokenizer.needs_fit()) {
      std::string all;
      for (const auto* docs : {&train.texts, &validation.texts})
        for (const auto& d : *docs) {
          if (!all.empty()) all += '\n';
          all += d;
        }
      tokenizer.fit(all);
    }

    const std::string what = describe_files(train.files);
    PackedTokens train_tokens = pack_documents(tokenizer, train.texts, execution);
    if (train_tokens.tokens.empty())
      throw UserError(path_ + ": the corpus is empty: " + what + " holds no " + train_holds);
    check_vocabulary(train_tokens.max_token_id, setup, path_ + ": " + what);
    std::optional<PackedTokens> validation_tokens;
    if (!validation.files.empty()) {
      validation_tokens = pack_documents(tokenizer, validation.texts, execution);
      const std::string vwhat = describe_files(validation.files);
      if (validation_tokens->tokens.empty())
        throw UserError(path_ + ": the validation files are empty: " + vwhat + " holds no " + validation_holds);
      check_vocabulary(validation_tokens->max_token_id, setup, path_ + ": " + vwhat);
    }
    train_ = std::move(train_tokens);
    validation_ = std::move(validation_tokens);
    splits_ = split_corpus(*train_, validation_ ? &*validation_ : nullptr, validation_fraction, setup, order,
                           path_ + ": " + what);
    batch_size_ = setup.batch_size;
  }

  void batch(Split split, std::int64_t index, Batch& out) const {
    const TokenWindows& w = split == Split::train ? splits_.train : splits_.validation;
    if (w.empty())
      throw UserError(split == Split::train ? path_ + ": batch() before prepare()"
                                            : path_ +
                                                  ": there is no validation split (validation_fraction is 0 and no "
                                                  "validation_paths are given)");
    w.fill(index, batch_size_, out);
  }

  std::int64_t num_tokens(Split split) const {
    return (split == Split::train ? splits_.train : splits_.validation).num_tokens();
  }

  // Dataset::separator_ends_documents, over both splits.
  bool separator_ends_documents() const {
    return train_ && train_->separator_ends_documents() && !(validation_ && validation_->separator_inside_documents);
  }

 private:
  std::string path_;
  // The token windows point into these, so they live as long as the splits.
  std::optional<PackedTokens> train_, validation_;
  CorpusSplits splits_;
  std::int64_t batch_size_ = 0;
};

}  // namespace loom
