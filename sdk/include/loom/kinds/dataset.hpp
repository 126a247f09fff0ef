// The `dataset` kind: batches of token sequences, indexed by step.
//
// A dataset is deterministic: batch(split, index) depends only on its options, the setup (seed,
// shapes, tokenizer) and the arguments, so a resumed run sees exactly the batches it would have
// seen, and batches can be prepared ahead on another thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "loom/component.hpp"
#include "loom/kinds/tokenizer.hpp"

namespace loom {

enum class Split { train, validation };

// One batch of `batch_size` rows of `seq_len` tokens, row-major.
struct Batch {
  std::int64_t batch_size = 0;
  std::int64_t seq_len = 0;
  std::vector<std::int32_t> inputs;       // batch_size * seq_len token ids
  std::vector<std::int32_t> targets;      // the next token of each input; -1 means "no loss here"
  std::vector<std::int32_t> segment_ids;  // per row, which packed document a token belongs to;
                                          // attention never crosses segments
};

// What a dataset's batches hold beyond windows of tokens, by name: what an objective may need
// (Objective::required_batch_traits). The trainer refuses a run whose dataset does not declare a
// trait its objective requires, naming both. The traits loom's components use:
namespace batch_traits {
// Rows 2i and 2i + 1 of every batch are one preference pair: the same prompt, then the chosen
// response in row 2i and the rejected one in row 2i + 1, with targets -1 on the prompt and the
// padding so that a row's counted targets are its response (the `preference` dataset).
inline constexpr std::string_view preference_pairs = "preference_pairs";
}  // namespace batch_traits

// What the trainer tells a dataset before asking for batches.
struct DatasetSetup {
  Handle<Tokenizer> tokenizer;  // shared with the trainer; the dataset may fit() it
  std::int64_t seq_len = 0;
  std::int64_t batch_size = 0;
  std::uint64_t seed = 0;       // the data-order stream's seed
  std::int64_t vocab_size = 0;  // the model's; every id must be below it (0: unchecked)
};

class Dataset : public Component {
 public:
  static constexpr std::string_view kind = "dataset";
  ~Dataset() override;

  // Reads, tokenizes and indexes the data. Called once, on the main thread, before any batch.
  // Bad data is a UserError naming the file: missing, empty, shorter than one sequence, a token
  // id outside the vocabulary, a truncated shard.
  virtual void prepare(const DatasetSetup& setup) = 0;

  // Fills `out` with batch number `index` of `split` (any index >= 0: the data repeats, in a
  // new order each epoch). Deterministic. May be called concurrently from a prefetch thread;
  // reuses `out`'s buffers.
  virtual void batch(Split split, std::int64_t index, Batch& out) const = 0;

  // Tokens in a split (0 if the dataset has none of that split).
  virtual std::int64_t num_tokens(Split split) const = 0;

  // Whether the data holds several documents and their separator (document_separator in
  // loom/token_windows.hpp) occurs nowhere but between them, so that a generated separator ends
  // a document and what follows starts a new segment, as in training (docs/training.md,
  // "Generation"). False when unknown, or when the separator ("\n" for a tokenizer without an
  // end-of-text token) also occurs inside documents. Valid after prepare().
  virtual bool separator_ends_documents() const { return false; }

  // The traits of its batches (batch_traits above, or names of a plugin's own); none by default:
  // windows of tokens, nothing more promised. Valid after construction, before prepare().
  virtual std::vector<std::string> batch_traits() const { return {}; }
};

}  // namespace loom
