// Packing and sampling for `dataset` plugins: token streams cut into windows of seq_len + 1
// tokens, visited in a seeded order that is a pure function of (seed, split, sample index).
//
// Windows. A split is one or more token sequences (a tokenized corpus, or one shard each). Each
// sequence of N tokens is cut into W = floor((N - 1) / seq_len) windows; window k starts at
// offset + k * seq_len and holds seq_len + 1 tokens: the inputs are its first seq_len tokens, the
// targets its last seq_len (the inputs shifted by one). Consecutive windows share one token, so
// an epoch predicts every token once, as nanoGPT's contiguous batches do. Windows never cross
// from one sequence into the next.
//
// Order. Sample s (row r of batch b is sample b * batch_size + r) is window
//   permute(s mod W_total, key(seed, split, epoch = s / W_total))
// where permute is a keyed Feistel permutation of [0, W_total) (cycle-walking on the next even
// power of two), so index -> batch costs O(1), needs no state, and every epoch visits every window
// once in its own order. With `shuffle` off the order is the identity. With `random_offsets`, the
// window grid of each sequence is shifted each epoch by a seeded offset in [0, seq_len), keeping
// W fixed (one window fewer where the sequence leaves too little slack), so that later epochs see
// new windows rather than the same ones again.
//
// Documents. A sequence lists where its documents end. The token that ends a document (the
// separator, when the corpus has one) belongs to that document, and the next token starts a new
// one, as in Levanter's LmExample.causal: segment ids count documents from 0 at the start of
// each row, and targets are always the next token (never -1).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "loom/execution.hpp"
#include "loom/kinds/dataset.hpp"
#include "loom/kinds/tokenizer.hpp"
#include "loom/options.hpp"

namespace loom {

// A read-only view of token ids and their document boundaries. Whoever builds it owns the
// memory, which must outlive every TokenWindows made from it.
struct TokenSequence {
  const void* tokens = nullptr;
  std::uint32_t token_bytes = 4;  // 2: uint16 ids; 4: uint32 (or non-negative int32) ids
  std::int64_t size = 0;
  // Exclusive end offsets of the documents, ascending, each minus `document_base` relative to
  // `tokens`; offsets outside [1, size] are ignored. Empty: one document.
  std::span<const std::int64_t> document_ends;
  std::int64_t document_base = 0;
  std::string name;  // for messages: a file, or "<file> (validation part)"

  // The sub-range [begin, end) as its own sequence.
  TokenSequence slice(std::int64_t begin, std::int64_t end) const;
};

// A tokenized corpus held in memory: what the text, jsonl and synthetic datasets build.
struct PackedTokens {
  std::vector<std::int32_t> tokens;
  std::vector<std::int64_t> document_ends;
  std::int32_t max_token_id = -1;
  // Set by pack_documents: whether a document's own tokens hold the separator (a line break in
  // a document, when "\n" separates them).
  bool separator_inside_documents = false;

  // Several documents, and the separator only between them: Dataset::separator_ends_documents.
  bool separator_ends_documents() const { return document_ends.size() > 1 && !separator_inside_documents; }

  // Appends one document. When it is not the first, `separator` is appended first and ends the
  // previous document. Empty documents are skipped.
  void add_document(std::span<const std::int32_t> ids, std::span<const std::int32_t> separator);
  TokenSequence view(std::string name) const;
};

// What separates documents: the tokenizer's end-of-text id, or the encoding of "\n" when it has
// none. It is also how a document starts for the model, and generation from an empty prompt
// relies on it (docs/training.md, "Generation"): a document's first token is predicted from this
// separator at the end of the previous document's segment, and the document's other tokens never
// see it. A dataset plugin that packs documents differently breaks that: pack with
// PackedTokens or write token shards with `loom tokenize`, which both follow it.
std::vector<std::int32_t> document_separator(const Tokenizer& tokenizer);

// Encodes `documents` (in parallel on `execution` when it is given; the result does not depend on
// it) and packs them, separated by document_separator(tokenizer).
PackedTokens pack_documents(const Tokenizer& tokenizer, std::span<const std::string> documents,
                            const ExecutionContext* execution);

// A UserError when an id of the data is outside the model's vocabulary: `max_token_id` against
// setup.vocab_size (0: unchecked), and against the tokenizer's own vocabulary when it is known.
void check_vocabulary(std::int64_t max_token_id, const DatasetSetup& setup, const std::string& what);

// How a dataset orders its windows. Every dataset plugin declares these options with
// declare_window_options and reads them with read_window_options.
struct WindowOrder {
  bool shuffle = true;
  bool random_offsets = false;
};
void declare_window_options(OptionSchema& schema);
WindowOrder read_window_options(const Options& options);

class TokenWindows {
 public:
  TokenWindows() = default;
  // Throws UserError when no sequence holds seq_len + 1 tokens, naming `what` (a split and its
  // files), its size and what one sequence needs. Validation splits should pass
  // random_offsets = false, so that every evaluation sees the same windows.
  TokenWindows(std::vector<TokenSequence> sequences, std::int64_t seq_len, std::uint64_t seed, Split split,
               WindowOrder order, const std::string& what);

  bool empty() const { return windows_ == 0; }
  std::int64_t seq_len() const { return seq_len_; }
  std::int64_t windows_per_epoch() const { return windows_; }
  std::int64_t num_tokens() const { return num_tokens_; }

  // Where sample `sample` starts: which sequence, at which token.
  struct Position {
    std::int64_t sequence = 0;
    std::int64_t start = 0;
  };
  Position position(std::int64_t sample) const;

  // Fills `out` with batch `index`: rows index * batch_size ... + batch_size - 1. Reuses out's
  // buffers; safe to call from several threads at once.
  void fill(std::int64_t index, std::int64_t batch_size, Batch& out) const;

 private:
  struct Layout {
    std::int64_t windows = 0;     // per epoch
    std::int64_t max_offset = 0;  // random offsets are drawn in [0, max_offset]
  };
  void fill_row(const Position& p, std::int32_t* inputs, std::int32_t* targets, std::int32_t* segments) const;

  std::vector<TokenSequence> sequences_;
  std::vector<Layout> layout_;
  std::vector<std::int64_t> first_window_;  // prefix sums of layout_[i].windows
  std::int64_t seq_len_ = 0;
  std::int64_t windows_ = 0;
  std::int64_t num_tokens_ = 0;
  std::uint64_t key_ = 0;
  WindowOrder order_;
};

// The two splits of an in-memory corpus, as the text, jsonl and synthetic datasets make them.
struct CorpusSplits {
  TokenWindows train;
  TokenWindows validation;  // empty() when the corpus has no validation split
};

// Cuts `train` (and `validation`, when given: the validation split by file) into windows for
// setup.seq_len. Without `validation`, the last `validation_fraction` of train's tokens (by
// position, as nanoGPT's `data[int(n * 0.9):]`) is the validation split; 0 means none. `what`
// names the corpus in messages ("data/x.txt", "2 files (a.txt, b.txt)"). UserErrors: a split
// shorter than one sequence, a fraction that leaves a split empty.
CorpusSplits split_corpus(const PackedTokens& train, const PackedTokens* validation, double validation_fraction,
                          const DatasetSetup& setup, WindowOrder order, const std::string& what);

// The keyed permutation TokenWindows uses: a bijection of [0, n) for each key.
std::uint64_t permute_index(std::uint64_t index, std::uint64_t n, std::uint64_t key);

}  // namespace loom
