// Log-likelihood requests through the model, batched as lm-evaluation-harness's HFLM batches
// them, and multiple choice through a shared KV cache: see loom/run/eval.hpp.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "loom/autograd.hpp"
#include "loom/error.hpp"
#include "loom/model_support.hpp"
#include "loom/run/eval.hpp"

namespace loom::eval {

namespace {

// The logits of one forward pass, readable on the host.
struct HostLogits {
  std::vector<float> copy;
  const float* data = nullptr;
  std::int64_t vocab = 0;

  explicit HostLogits(const Tensor& logits) : vocab(logits.size(-1)) {
    if (logits.dtype() == DType::f32 && logits.is_host_visible() && logits.is_contiguous()) {
      data = logits.data<float>();
    } else {
      copy = logits.to_vector();
      data = copy.data();
    }
  }
  const float* row(std::int64_t index) const { return data + index * vocab; }
};

// log_softmax(row)[token] in double, and whether token is the row's argmax (the first maximum,
// as torch's argmax picks it).
std::pair<double, bool> token_logprob(const float* row, std::int64_t vocab, std::int32_t token) {
  if (token < 0 || token >= vocab)
    throw UserError("token id " + std::to_string(token) + " is outside the model's vocabulary of " +
                    std::to_string(vocab));
  std::int64_t best = 0;
  for (std::int64_t v = 1; v < vocab; ++v)
    if (row[v] > row[best]) best = v;
  const double max_logit = row[best];
  double total = 0;
  for (std::int64_t v = 0; v < vocab; ++v) total += std::exp(static_cast<double>(row[v]) - max_logit);
  return {static_cast<double>(row[token]) - max_logit - std::log(total), best == token};
}

// (encode_task names a task's file and line for the continuations this refuses.)
void check_request(const TokenRequest& r, std::int64_t max_len) {
  if (r.context.empty()) throw InternalError("a request without context (the prefix token stands for an empty one)");
  if (static_cast<std::int64_t>(r.continuation.size()) > max_len)
    throw UserError("a continuation of " + std::to_string(r.continuation.size()) +
                    " tokens is longer than the model's context of " + std::to_string(max_len));
}

// Rows of logits one forward pass may hold: 256 MiB of them, and at least one row.
std::int64_t rows_in_budget(std::int64_t seq, std::int64_t vocab, std::int64_t batch_size) {
  const std::int64_t budget = (std::int64_t{256} << 20) / 4;
  return std::clamp<std::int64_t>(budget / std::max<std::int64_t>(1, seq * vocab), 1, batch_size);
}

}  // namespace

KvCacheUse parse_kv_cache_use(const std::string& text, const std::string& option) {
  if (text == "auto") return KvCacheUse::automatic;
  if (text == "always") return KvCacheUse::always;
  if (text == "never") return KvCacheUse::never;
  throw UserError(option + " '" + text + "': auto, always or never");
}

Scorer::Scorer(Model& model, Backend& backend, ScorerOptions options)
    : model_(model), backend_(backend), options_(options) {
  if (options_.batch_size < 1)
    throw UserError("--batch-size must be at least 1, got " + std::to_string(options_.batch_size));
}

std::vector<Scored> Scorer::score(std::span<const TokenRequest> requests) {
  const std::int64_t max_len = model_.max_seq_len();
  // Each request's input: (context + continuation) without its last token, its last max_len
  // tokens. Identical inputs (single-token choices after one context) run once.
  std::map<std::vector<std::int32_t>, std::vector<std::size_t>> by_input;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const TokenRequest& r = requests[i];
    check_request(r, max_len);
    // No token to score (merged into the context's last one): log-likelihood 0, greedy, as the
    // harness's logits cache gives it.
    if (r.continuation.empty()) continue;
    std::vector<std::int32_t> whole(r.context);
    whole.insert(whole.end(), r.continuation.begin(), r.continuation.end());
    whole.pop_back();
    if (static_cast<std::int64_t>(whole.size()) > max_len) whole.erase(whole.begin(), whole.end() - max_len);
    by_input[std::move(whole)].push_back(i);
  }
  // Longest first, then by tokens: the harness's order (the first batch shows the memory peak).
  std::vector<const std::pair<const std::vector<std::int32_t>, std::vector<std::size_t>>*> rows;
  for (const auto& entry : by_input) rows.push_back(&entry);
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto* a, const auto* b) { return a->first.size() > b->first.size(); });

  std::vector<Scored> out(requests.size(), Scored{0.0, true});
  Tape tape;
  tape.set_enabled(false);
  Ops ops(backend_, &tape);
  ops.set_training(false);
  const std::int64_t vocab = model_.vocab_size();
  auto* causal = dynamic_cast<models::CausalLm*>(&model_);
  for (std::size_t begin = 0; begin < rows.size();) {
    const auto seq = static_cast<std::int64_t>(rows[begin]->first.size());
    const std::int64_t n = std::min<std::int64_t>(rows_in_budget(seq, vocab, options_.batch_size),
                                                  static_cast<std::int64_t>(rows.size() - begin));
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(n * seq), 0);
    for (std::int64_t b = 0; b < n; ++b) {
      const auto& input = rows[begin + static_cast<std::size_t>(b)]->first;
      std::copy(input.begin(), input.end(), tokens.begin() + b * seq);
    }
    // In the backend's memory (one explicit copy to a device backend's); the logits come back
    // through HostLogits.
    const Tensor input_tensor =
        Tensor::from(std::span<const std::int32_t>(tokens), Shape{n, seq}).to(backend_.device());
    // Where the model can (CausalLm), the logits of the positions that predict a continuation's
    // tokens alone: the output projection is most of a small model's work over a long context.
    // row_of[b * seq + t]: the logits' row of position t of sequence b.
    std::vector<std::int64_t> row_of;
    Tensor logits;
    if (causal) {
      std::vector<std::int64_t> positions;
      row_of.assign(static_cast<std::size_t>(n * seq), -1);
      for (std::int64_t b = 0; b < n; ++b) {
        const auto& [input, members] = *rows[begin + static_cast<std::size_t>(b)];
        for (const std::size_t i : members)
          for (auto t = static_cast<std::int64_t>(input.size() - requests[i].continuation.size());
               t < static_cast<std::int64_t>(input.size()); ++t)
            if (row_of[static_cast<std::size_t>(b * seq + t)] < 0) {
              row_of[static_cast<std::size_t>(b * seq + t)] = static_cast<std::int64_t>(positions.size());
              positions.push_back(b * seq + t);
            }
      }
      logits = causal->logits_at(ops, input_tensor, positions);
    } else {
      logits = model_.logits(ops, input_tensor, Tensor());
    }
    const HostLogits host(logits);
    auto row = [&](std::int64_t position) {
      return host.row(causal ? row_of[static_cast<std::size_t>(position)] : position);
    };
    ++stats_.forward_passes;
    stats_.tokens_run += n * seq;
    for (std::int64_t b = 0; b < n; ++b) {
      const auto& [input, members] = *rows[begin + static_cast<std::size_t>(b)];
      for (const std::size_t i : members) {
        const auto& cont = requests[i].continuation;
        const auto first = static_cast<std::int64_t>(input.size() - cont.size());
        Scored s{0.0, true};
        for (std::size_t j = 0; j < cont.size(); ++j) {
          const auto [lp, greedy] =
              token_logprob(row(b * seq + first + static_cast<std::int64_t>(j)), host.vocab, cont[j]);
          s.logprob += lp;
          s.greedy = s.greedy && greedy;
        }
        out[i] = s;
      }
    }
    begin += static_cast<std::size_t>(n);
  }
  stats_.requests += static_cast<std::int64_t>(requests.size());
  return out;
}

bool Scorer::score_with_cache(std::span<const TokenRequest> group, std::span<Scored> out) {
  auto* causal = dynamic_cast<models::CausalLm*>(&model_);
  if (!causal || group.size() < 2) return false;
  const std::vector<std::int32_t>& context = group.front().context;
  std::size_t longest = 0;
  for (const TokenRequest& r : group) {
    if (r.context != context || r.continuation.empty()) return false;
    check_request(r, model_.max_seq_len());
    longest = std::max(longest, r.continuation.size());
  }
  // Without truncation only: a request longer than the context is cut at its start, as score() does.
  if (static_cast<std::int64_t>(context.size() + longest - 1) > model_.max_seq_len()) return false;
  // Choices that differ only in their last token (mmlu's " A", " B"...) have one input, which
  // score() runs once without a cache.
  const auto input_tail = [](const TokenRequest& r) {
    return std::vector<std::int32_t>(r.continuation.begin(), r.continuation.end() - 1);
  };
  bool one_input = true;
  std::size_t choice_tokens = 0;
  for (const TokenRequest& r : group) {
    one_input = one_input && input_tail(r) == input_tail(group.front());
    choice_tokens += r.continuation.size();
  }
  if (one_input) return false;
  if (options_.kv_cache == KvCacheUse::automatic) {
    // Each pass costs a fixed overhead beside its positions: on two cores the cache's two small
    // passes per document pay off only for a long context that most of the rows' positions repeat.
    const std::size_t rows = group.size() * context.size() + choice_tokens;
    const std::size_t cached = context.size() + choice_tokens;
    if (context.size() < 64 || 2 * cached > rows) return false;
  }

  Tape tape;
  tape.set_enabled(false);
  Ops ops(backend_, &tape);
  ops.set_training(false);
  const auto m = static_cast<std::int64_t>(context.size());
  auto shared = model_.new_cache(1, m);
  const Tensor last = model_.next_logits(
      ops, Tensor::from(std::span<const std::int32_t>(context), Shape{1, m}).to(backend_.device()), *shared);
  const HostLogits first(last);
  ++stats_.forward_passes;
  stats_.tokens_run += m;
  const auto n = static_cast<std::int64_t>(group.size());
  const auto k = static_cast<std::int64_t>(longest) - 1;  // continuation tokens that are inputs
  std::optional<HostLogits> rest;
  if (k > 0) {
    auto cache = model_.new_cache(n, m + k);
    auto* layer_cache = dynamic_cast<models::LayerKvCache*>(cache.get());
    auto* shared_layers = dynamic_cast<models::LayerKvCache*>(shared.get());
    if (!layer_cache || !shared_layers) return false;
    layer_cache->fill_from(*shared_layers, m);
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(n * k), 0);
    for (std::int64_t b = 0; b < n; ++b) {
      const auto& cont = group[static_cast<std::size_t>(b)].continuation;
      std::copy(cont.begin(), cont.end() - 1, tokens.begin() + b * k);
    }
    rest.emplace(causal->cached_logits(
        ops, Tensor::from(std::span<const std::int32_t>(tokens), Shape{n, k}).to(backend_.device()), *cache));
    ++stats_.forward_passes;
    stats_.tokens_run += n * k;
  }
  for (std::int64_t b = 0; b < n; ++b) {
    const auto& cont = group[static_cast<std::size_t>(b)].continuation;
    Scored s{0.0, true};
    for (std::size_t j = 0; j < cont.size(); ++j) {
      const float* row = j == 0 ? first.row(0) : rest->row(b * k + static_cast<std::int64_t>(j) - 1);
      const auto [lp, greedy] = token_logprob(row, first.vocab, cont[j]);
      s.logprob += lp;
      s.greedy = s.greedy && greedy;
    }
    out[static_cast<std::size_t>(b)] = s;
  }
  stats_.requests += n;
  return true;
}

std::vector<Scored> Scorer::score_grouped(std::span<const TokenRequest> requests,
                                          std::span<const std::size_t> group_sizes) {
  if (std::accumulate(group_sizes.begin(), group_sizes.end(), std::size_t{0}) != requests.size())
    throw InternalError("Scorer::score_grouped: the groups do not add up to the requests");
  if (options_.kv_cache == KvCacheUse::never) return score(requests);
  std::vector<Scored> out(requests.size());
  // What the cache cannot take (one choice, different contexts, truncation) goes through score().
  std::vector<TokenRequest> others;
  std::vector<std::size_t> other_index;
  std::size_t begin = 0;
  for (const std::size_t size : group_sizes) {
    const auto group = requests.subspan(begin, size);
    if (!score_with_cache(group, std::span<Scored>(out).subspan(begin, size)))
      for (std::size_t i = 0; i < size; ++i) {
        others.push_back(group[i]);
        other_index.push_back(begin + i);
      }
    begin += size;
  }
  if (!others.empty()) {
    const std::vector<Scored> scored = score(others);
    for (std::size_t i = 0; i < scored.size(); ++i) out[other_index[i]] = scored[i];
  }
  return out;
}

}  // namespace loom::eval
