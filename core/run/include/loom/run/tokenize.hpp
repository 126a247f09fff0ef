// `loom tokenize`: text or JSON-lines corpora to token shards (loom/token_shard.hpp) that the
// `tokens` dataset reads. docs/datasets.md describes the command and the format.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "loom/core/runtime.hpp"
#include "loom/execution.hpp"
#include "loom/kinds/tokenizer.hpp"

namespace loom {

enum class CorpusFormat {
  automatic,  // by extension: .jsonl, .ndjson and .json are JSON lines, anything else text
  text,       // each file is one document
  jsonl,      // each line is a document: a JSON object whose `text_field` holds the text
};

struct TokenizeRequest {
  std::vector<std::string> inputs;             // files, directories or globs: the training split
  std::vector<std::string> validation_inputs;  // the validation split, by file (optional)
  double validation_fraction = 0;              // or: the last fraction of the training tokens
  CorpusFormat format = CorpusFormat::automatic;
  std::string text_field = "text";
  std::filesystem::path output_dir;
  std::int64_t shard_tokens = 100'000'000;  // at most this many tokens per shard
  std::uint32_t token_bytes = 0;            // 0: 2 when the vocabulary fits in uint16, else 4
  bool overwrite = false;                   // replace shards already in output_dir
};

struct TokenizeProgress {
  std::int64_t bytes_done = 0;
  std::int64_t bytes_total = 0;
  std::int64_t tokens = 0;
  std::int64_t documents = 0;
  std::string file;      // the file being read
  bool fitting = false;  // reading the text to fit the tokenizer, before tokenizing
};

struct TokenizeSummary {
  std::vector<std::filesystem::path> train_shards, validation_shards;
  std::int64_t train_tokens = 0, validation_tokens = 0;
  std::int64_t documents = 0;
  std::int64_t bytes = 0;
  std::int64_t vocab_size = 0;
  std::uint32_t token_bytes = 0;
  std::optional<std::filesystem::path> tokenizer_state;  // written when the tokenizer has one
};

// Reads the inputs, tokenizes every document (in parallel on `execution` when given; the shards
// do not depend on it), and writes `train-NNNNN.bin` and `validation-NNNNN.bin` shards into
// request.output_dir, documents separated by the tokenizer's end of text (or "\n" when it has
// none), as the text and jsonl datasets pack them. A tokenizer that needs fitting is fitted
// first on all the text, and its state is written to `tokenizer.state`, which the `tokens`
// dataset loads. `progress` is called after every batch of documents. Bad inputs are
// UserErrors: missing files, bad JSON lines (file:line), an empty corpus, shards already in the
// output directory (unless overwrite).
TokenizeSummary tokenize_corpus(Tokenizer& tokenizer, const TokenizeRequest& request, const ExecutionContext* execution,
                                const std::function<void(const TokenizeProgress&)>& progress = {});

// `loom tokenize CONFIG`: the tokenizer of the config's `tokenizer` section and the inputs of its
// `data` section, which must be a `text` or `jsonl` dataset (its paths, validation_paths,
// validation_fraction and text_field). output_dir is left empty.
struct ConfiguredTokenize {
  Handle<Tokenizer> tokenizer;
  TokenizeRequest request;
};
ConfiguredTokenize tokenize_request_from_config(const Runtime& runtime);

}  // namespace loom
