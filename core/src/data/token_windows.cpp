#include "loom/token_windows.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <limits>

#include "loom/error.hpp"
#include "loom/random.hpp"

namespace loom {

namespace {

// The data-order stream of loom's random streams (1 = init, 2 = data, 3 = dropout).
constexpr std::uint64_t data_stream = 2;

std::uint64_t epoch_key(std::uint64_t key, std::int64_t epoch) {
  return hash_u64(key ^ hash_u64(static_cast<std::uint64_t>(epoch) + 1));
}

template <class T>
void copy_row(const T* tokens, std::int64_t n, std::int32_t* inputs, std::int32_t* targets) {
  for (std::int64_t i = 0; i < n; ++i) inputs[i] = static_cast<std::int32_t>(tokens[i]);
  for (std::int64_t i = 0; i < n; ++i) targets[i] = static_cast<std::int32_t>(tokens[i + 1]);
}

}  // namespace

// ---- sequences ----

TokenSequence TokenSequence::slice(std::int64_t begin, std::int64_t end) const {
  if (begin < 0 || end < begin || end > size)
    throw InternalError("TokenSequence::slice(" + std::to_string(begin) + ", " + std::to_string(end) +
                        ") of a sequence of " + std::to_string(size));
  TokenSequence s = *this;
  s.tokens = static_cast<const std::byte*>(tokens) + begin * static_cast<std::int64_t>(token_bytes);
  s.size = end - begin;
  s.document_base = document_base + begin;
  // Only the ends inside the slice matter: the first one past `begin` up to the first at or past
  // `end` (which closes the slice's last document).
  const auto first = std::upper_bound(document_ends.begin(), document_ends.end(), s.document_base);
  auto last = std::lower_bound(first, document_ends.end(), s.document_base + s.size);
  if (last != document_ends.end()) ++last;
  s.document_ends = document_ends.subspan(static_cast<std::size_t>(first - document_ends.begin()),
                                          static_cast<std::size_t>(last - first));
  return s;
}

void PackedTokens::add_document(std::span<const std::int32_t> ids, std::span<const std::int32_t> separator) {
  if (ids.empty()) return;
  if (!tokens.empty()) {
    tokens.insert(tokens.end(), separator.begin(), separator.end());
    document_ends.back() = static_cast<std::int64_t>(tokens.size());
    for (const std::int32_t id : separator) max_token_id = std::max(max_token_id, id);
  }
  tokens.insert(tokens.end(), ids.begin(), ids.end());
  document_ends.push_back(static_cast<std::int64_t>(tokens.size()));
  for (const std::int32_t id : ids) max_token_id = std::max(max_token_id, id);
}

TokenSequence PackedTokens::view(std::string name) const {
  TokenSequence s;
  s.tokens = tokens.data();
  s.token_bytes = 4;
  s.size = static_cast<std::int64_t>(tokens.size());
  s.document_ends = document_ends;
  s.name = std::move(name);
  return s;
}

std::vector<std::int32_t> document_separator(const Tokenizer& tokenizer) {
  if (const auto eot = tokenizer.end_of_text()) return {*eot};
  return tokenizer.encode("\n");
}

PackedTokens pack_documents(const Tokenizer& tokenizer, std::span<const std::string> documents,
                            const ExecutionContext* execution) {
  std::vector<std::vector<std::int32_t>> encoded(documents.size());
  auto encode = [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) encoded[i] = tokenizer.encode(documents[i]);
  };
  const auto n = static_cast<std::int64_t>(documents.size());
  if (execution) {
    execution->parallel_for(n, 1, encode);
  } else {
    encode(0, n);
  }
  std::size_t total = 0, non_empty = 0;
  for (const auto& e : encoded) {
    total += e.size();
    non_empty += e.empty() ? 0 : 1;
  }
  // Only when it is needed: a fitted vocabulary need not hold "\n" if there is one document.
  const std::vector<std::int32_t> separator =
      non_empty > 1 ? document_separator(tokenizer) : std::vector<std::int32_t>{};
  PackedTokens packed;
  packed.tokens.reserve(total + non_empty * separator.size());
  packed.document_ends.reserve(documents.size());
  for (auto& e : encoded) {
    if (!separator.empty() && !packed.separator_inside_documents)
      packed.separator_inside_documents =
          std::search(e.begin(), e.end(), separator.begin(), separator.end()) != e.end();
    packed.add_document(e, separator);
    std::vector<std::int32_t>().swap(e);
  }
  return packed;
}

void check_vocabulary(std::int64_t max_token_id, const DatasetSetup& setup, const std::string& what) {
  if (setup.vocab_size <= 0 || max_token_id < setup.vocab_size) return;
  std::string hint;
  if (setup.tokenizer)
    hint = "; the tokenizer has " + std::to_string(setup.tokenizer->vocab_size()) +
           " ids: set the model's vocab_size to at least that";
  throw UserError(what + " holds token id " + std::to_string(max_token_id) + ", outside the model's vocabulary of " +
                  std::to_string(setup.vocab_size) + " ids" + hint);
}

// ---- options ----

void declare_window_options(OptionSchema& schema) {
  schema.boolean("shuffle", true, "Visit the windows in a seeded order, a new one each epoch (false: in file order).");
  schema.boolean("random_offsets", true,
                 "Shift the training window grid by a seeded offset in [0, seq_len) each epoch, so that later "
                 "epochs see new windows.");
}

WindowOrder read_window_options(const Options& options) {
  return {options.get<bool>("shuffle"), options.get<bool>("random_offsets")};
}

// ---- permutation ----

std::uint64_t permute_index(std::uint64_t index, std::uint64_t n, std::uint64_t key) {
  if (n <= 1) return 0;
  // A balanced Feistel network on the smallest even number of bits covering n, cycle-walked
  // back into [0, n): a bijection of [0, n) whatever the key, in fewer than 4 rounds of walking
  // on average since 2^bits < 4n.
  int bits = std::bit_width(n - 1);
  bits = std::max(bits + (bits & 1), 2);
  const int half = bits / 2;
  const std::uint64_t mask = (std::uint64_t{1} << half) - 1;
  std::uint64_t round_keys[4];
  for (int r = 0; r < 4; ++r) round_keys[r] = hash_u64(key + 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(r + 1));
  std::uint64_t x = index;
  do {
    std::uint64_t left = x >> half, right = x & mask;
    for (const std::uint64_t k : round_keys) {
      const std::uint64_t next = left ^ (hash_u64(right ^ k) & mask);
      left = right;
      right = next;
    }
    x = (left << half) | right;
  } while (x >= n);
  return x;
}

// ---- windows ----

TokenWindows::TokenWindows(std::vector<TokenSequence> sequences, std::int64_t seq_len, std::uint64_t seed, Split split,
                           WindowOrder order, const std::string& what)
    : sequences_(std::move(sequences)),
      seq_len_(seq_len),
      key_(stream_key(seed, data_stream, split == Split::train ? 0 : 1)),
      order_(order) {
  if (seq_len <= 0) throw InternalError("TokenWindows: seq_len must be positive, not " + std::to_string(seq_len));
  std::int64_t longest = 0;
  first_window_.reserve(sequences_.size() + 1);
  first_window_.push_back(0);
  for (const auto& s : sequences_) {
    Layout l;
    if (s.size > seq_len) {
      l.windows = (s.size - 1) / seq_len;
      std::int64_t slack = s.size - 1 - l.windows * seq_len;
      if (order.random_offsets) {
        // Giving up one window leaves room for every offset in [0, seq_len).
        if (l.windows >= 2 && slack < seq_len - 1) {
          --l.windows;
          slack += seq_len;
        }
        l.max_offset = std::min(seq_len - 1, slack);
      }
    }
    layout_.push_back(l);
    windows_ += l.windows;
    first_window_.push_back(windows_);
    num_tokens_ += s.size;
    longest = std::max(longest, s.size);
  }
  if (windows_ == 0) {
    std::string sizes = std::to_string(num_tokens_) + " tokens";
    if (sequences_.size() > 1)
      sizes += " in " + std::to_string(sequences_.size()) + " files (the longest has " + std::to_string(longest) + ")";
    throw UserError(what + " has " + sizes + ", but one sequence of seq_len " + std::to_string(seq_len) + " needs " +
                    std::to_string(seq_len + 1) + " tokens" + (sequences_.size() > 1 ? " in one file" : "") +
                    ": add data or lower seq_len");
  }
}

TokenWindows::Position TokenWindows::position(std::int64_t sample) const {
  if (windows_ == 0) throw InternalError("TokenWindows::position on an empty split");
  if (sample < 0) throw InternalError("TokenWindows::position(" + std::to_string(sample) + ")");
  const std::int64_t epoch = sample / windows_;
  const std::uint64_t key = epoch_key(key_, epoch);
  auto window = static_cast<std::uint64_t>(sample % windows_);
  if (order_.shuffle) window = permute_index(window, static_cast<std::uint64_t>(windows_), key);
  const auto it = std::upper_bound(first_window_.begin(), first_window_.end(), static_cast<std::int64_t>(window));
  Position p;
  p.sequence = (it - first_window_.begin()) - 1;
  const Layout& l = layout_[static_cast<std::size_t>(p.sequence)];
  std::int64_t offset = 0;
  if (l.max_offset > 0)
    offset =
        static_cast<std::int64_t>(hash_u64(key ^ (0xd1b54a32d192ed03ull * static_cast<std::uint64_t>(p.sequence + 1))) %
                                  static_cast<std::uint64_t>(l.max_offset + 1));
  p.start =
      offset + (static_cast<std::int64_t>(window) - first_window_[static_cast<std::size_t>(p.sequence)]) * seq_len_;
  return p;
}

void TokenWindows::fill_row(const Position& p, std::int32_t* inputs, std::int32_t* targets,
                            std::int32_t* segments) const {
  const TokenSequence& s = sequences_[static_cast<std::size_t>(p.sequence)];
  const std::byte* base = static_cast<const std::byte*>(s.tokens) + p.start * static_cast<std::int64_t>(s.token_bytes);
  if (s.token_bytes == 2) {
    copy_row(reinterpret_cast<const std::uint16_t*>(base), seq_len_, inputs, targets);
  } else {
    copy_row(reinterpret_cast<const std::uint32_t*>(base), seq_len_, inputs, targets);
  }
  // Segment ids: documents counted from the row's first token; a document's last token (its
  // separator) belongs to it, so the id changes after it.
  const std::int64_t first = s.document_base + p.start;
  auto end = std::upper_bound(s.document_ends.begin(), s.document_ends.end(), first);
  std::int32_t segment = 0;
  std::int64_t next_end =
      end == s.document_ends.end() ? std::numeric_limits<std::int64_t>::max() : *end - s.document_base;
  for (std::int64_t i = 0; i < seq_len_; ++i) {
    const std::int64_t position = p.start + i;
    if (position >= next_end) {
      ++segment;
      ++end;
      next_end = end == s.document_ends.end() ? std::numeric_limits<std::int64_t>::max() : *end - s.document_base;
    }
    segments[i] = segment;
  }
}

void TokenWindows::fill(std::int64_t index, std::int64_t batch_size, Batch& out) const {
  if (batch_size <= 0) throw InternalError("TokenWindows::fill: batch_size must be positive");
  if (index < 0) throw UserError("batch index " + std::to_string(index) + " is negative");
  const auto n = static_cast<std::size_t>(batch_size * seq_len_);
  out.batch_size = batch_size;
  out.seq_len = seq_len_;
  out.inputs.resize(n);
  out.targets.resize(n);
  out.segment_ids.resize(n);
  for (std::int64_t r = 0; r < batch_size; ++r) {
    const std::size_t at = static_cast<std::size_t>(r * seq_len_);
    fill_row(position(index * batch_size + r), out.inputs.data() + at, out.targets.data() + at,
             out.segment_ids.data() + at);
  }
}

// ---- splits ----

CorpusSplits split_corpus(const PackedTokens& train, const PackedTokens* validation, double validation_fraction,
                          const DatasetSetup& setup, WindowOrder order, const std::string& what) {
  if (setup.seq_len <= 0) throw UserError("seq_len must be positive, not " + std::to_string(setup.seq_len));
  TokenSequence train_part = train.view(what), validation_part;
  std::string validation_what;
  if (validation) {
    validation_part = validation->view(what + " (validation files)");
    validation_what = "the validation files";
  } else if (validation_fraction > 0) {
    const auto n = static_cast<std::int64_t>(train.tokens.size());
    const auto keep = static_cast<std::int64_t>(static_cast<double>(n) * (1.0 - validation_fraction));
    char percent[32];
    std::snprintf(percent, sizeof percent, "%g%%", validation_fraction * 100);
    if (keep >= n)
      throw UserError("validation_fraction " + std::to_string(validation_fraction) + " of the " + std::to_string(n) +
                      " tokens of " + what +
                      " leaves no validation tokens: raise it, or set it to 0 for no "
                      "validation split");
    validation_part = train_part.slice(keep, n);
    train_part = train_part.slice(0, keep);
    validation_what = "the validation split (the last " + std::string(percent) + " of " + what + ")";
  }
  CorpusSplits s;
  s.train = TokenWindows({train_part}, setup.seq_len, setup.seed, Split::train, order,
                         validation_part.size > 0 ? "the training split of " + what : what);
  if (validation_part.size > 0)
    s.validation = TokenWindows({validation_part}, setup.seq_len, setup.seed, Split::validation,
                                WindowOrder{order.shuffle, false}, validation_what);
  return s;
}

}  // namespace loom
