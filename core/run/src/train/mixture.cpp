#include "train/mixture.hpp"

#include <algorithm>
#include <map>
#include <numeric>

#include "loom/core/config.hpp"
#include "loom/error.hpp"
#include "loom/random.hpp"
#include "loom/token_windows.hpp"

namespace loom::training {

namespace {

constexpr std::int64_t kCheckpointEvery = 256;
constexpr std::uint64_t kMixtureStream = 21;  // of the data seed: row sources and their order

std::string at(const Value& v) {
  return v.location().known() ? v.location().str() + ": " : "";
}

// `weights` (a map NAME: number) as one weight per dataset of `names`, validated.
Value validate_weights(const Value& weights, const std::vector<std::string>& names, const std::string& path) {
  if (!weights.is_map())
    throw UserError(at(weights) + path + ": expected a map of dataset name to weight ({" + names.front() +
                    ": 1, ...}), got " + weights.describe());
  Value out = Value::map();
  double sum = 0;
  for (const auto& [name, w] : weights.as_map()) {
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      const std::string guess = closest_match(name, names);
      throw UserError(at(w) + path + "." + name + ": no dataset '" + name + "' in data.mixture" +
                      (guess.empty() ? "" : "; did you mean '" + guess + "'?"));
    }
    if (!w.is_number() || !(w.as_double() >= 0) || !std::isfinite(w.as_double()))
      throw UserError(at(w) + path + "." + name + ": expected a weight >= 0, got " + w.describe());
    sum += w.as_double();
  }
  for (const auto& name : names) {
    const Value* w = weights.find(name);
    if (!w)
      throw UserError(at(weights) + path + ": no weight for dataset '" + name +
                      "' (give every dataset of data.mixture a weight; 0 leaves it out)");
    out.set(name, Value(w->as_double()));
  }
  if (!(sum > 0)) throw UserError(at(weights) + path + ": the weights add up to 0: at least one must be positive");
  out.set_location(weights.location());
  return out;
}

std::vector<double> normalised(const Value& weights, const std::vector<std::string>& names) {
  std::vector<double> w;
  for (const auto& n : names) w.push_back(weights.find(n)->as_double());
  const double sum = std::accumulate(w.begin(), w.end(), 0.0);
  for (auto& x : w) x /= sum;
  return w;
}

// Systematic sampling: row r of `rows` goes to the dataset whose cumulative weight interval holds
// (r + offset) / rows, so each dataset gets the floor or the ceiling of weight * rows.
std::vector<std::int32_t> systematic(const std::vector<double>& weights, std::int64_t rows, double offset) {
  std::vector<std::int32_t> out(static_cast<std::size_t>(rows));
  std::size_t d = 0;
  double upper = weights[0];
  for (std::int64_t r = 0; r < rows; ++r) {
    const double x = (static_cast<double>(r) + offset) / static_cast<double>(rows);
    while (x >= upper && d + 1 < weights.size()) upper += weights[++d];
    // Rounding can leave x at the very top: the last dataset with a weight takes it.
    while (weights[d] == 0 && d > 0) --d;
    out[static_cast<std::size_t>(r)] = static_cast<std::int32_t>(d);
  }
  return out;
}

}  // namespace

bool is_mixture(const Value& data) {
  return data.is_map() && data.find("mixture") != nullptr;
}

Value validate_mixture(const Value& data, const config::ComponentCatalog& catalog) {
  const std::vector<std::string> keys{"mixture", "weights", "weight_schedule"};
  for (const auto& [key, v] : data.as_map())
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      const std::string guess = closest_match(key, keys);
      throw UserError(at(v) + "data." + key + ": unknown option of a data mixture" +
                      (guess.empty() ? "" : "; did you mean '" + guess + "'?") +
                      " (a mixture takes `mixture` (NAME: dataset section), `weights` (NAME: weight) and "
                      "`weight_schedule` (a list of {step, weights}); `type` and the dataset's options go in each "
                      "dataset's section)");
    }
  const Value& members = *data.find("mixture");
  if (!members.is_map() || members.as_map().empty())
    throw UserError(at(members) + "data.mixture: expected a map of dataset name to dataset section ({web: {type: " +
                    "jsonl, paths: [...]}, ...}), got " + members.describe());
  Value out = Value::map();
  out.set_location(data.location());
  Value parts = Value::map();
  parts.set_location(members.location());
  std::vector<std::string> names;
  for (const auto& [name, node] : members.as_map()) {
    names.push_back(name);
    parts.set(name, config::validate_component("dataset", node, "data.mixture." + name, catalog));
  }
  out.set("mixture", std::move(parts));

  if (const Value* w = data.find("weights"); w && !w->is_null()) {
    out.set("weights", validate_weights(*w, names, "data.weights"));
  } else {
    Value equal = Value::map();
    for (const auto& n : names) equal.set(n, Value(1.0));
    out.set("weights", std::move(equal));
  }

  Value::List schedule;
  if (const Value* s = data.find("weight_schedule"); s && !s->is_null()) {
    if (!s->is_list())
      throw UserError(at(*s) +
                      "data.weight_schedule: expected a list of {step: N, weights: {NAME: weight, ...}}, got " +
                      s->describe());
    std::int64_t last = 0;
    for (std::size_t i = 0; i < s->as_list().size(); ++i) {
      const Value& e = s->as_list()[i];
      const std::string path = "data.weight_schedule[" + std::to_string(i) + "]";
      const Value* step = e.is_map() ? e.find("step") : nullptr;
      const Value* weights = e.is_map() ? e.find("weights") : nullptr;
      if (!step || !weights || e.as_map().size() != 2)
        throw UserError(at(e) + path + ": expected {step: N, weights: {NAME: weight, ...}}, got " + e.describe());
      if (!step->is_int() || step->as_int() <= last)
        throw UserError(at(*step) + path + ".step: expected a step above " + std::to_string(last) +
                        " (the steps of the schedule ascend; `weights` holds the weights of step 0), got " +
                        step->describe());
      last = step->as_int();
      Value entry = Value::map();
      entry.set("step", Value(last));
      entry.set("weights", validate_weights(*weights, names, path + ".weights"));
      schedule.push_back(std::move(entry));
    }
  }
  out.set("weight_schedule", Value(std::move(schedule)));
  return out;
}

MixtureDataset::MixtureDataset(const Registry& registry, const Value& data) {
  std::vector<std::string> names;
  for (const auto& [name, node] : data.find("mixture")->as_map()) {
    names.push_back(name);
    parts_.push_back({name, registry.create<Dataset>(ComponentRef{"dataset", "", node, "data.mixture." + name})});
  }
  schedule_.emplace_back(0, normalised(*data.find("weights"), names));
  for (const auto& e : data.find("weight_schedule")->as_list())
    schedule_.emplace_back(e.find("step")->as_int(), normalised(*e.find("weights"), names));
}

void MixtureDataset::prepare(const DatasetSetup& setup) {
  if (setup.tokenizer && setup.tokenizer->needs_fit())
    throw UserError(
        "data.mixture: the tokenizer learns its vocabulary from the training text (`char`), which a mixture of "
        "datasets cannot share: use a tokenizer with a fixed vocabulary (byte, gpt2-bpe, sentencepiece)");
  batch_size_ = setup.batch_size;
  seq_len_ = setup.seq_len;
  seed_ = setup.seed;
  for (auto& p : parts_) with_context("while preparing data.mixture." + p.name, [&] { p.dataset->prepare(setup); });
  // Validation mixes the datasets that have a validation split, by the weights of step 0.
  validation_weights_.assign(parts_.size(), 0.0);
  double sum = 0;
  for (std::size_t d = 0; d < parts_.size(); ++d)
    if (parts_[d].dataset->num_tokens(Split::validation) > 0) sum += validation_weights_[d] = schedule_[0].second[d];
  if (sum > 0)
    for (auto& w : validation_weights_) w /= sum;
  else
    validation_weights_.clear();
}

const std::vector<double>& MixtureDataset::weights_at(std::int64_t step) const {
  std::size_t i = 0;
  while (i + 1 < schedule_.size() && schedule_[i + 1].first <= step) ++i;
  return schedule_[i].second;
}

std::vector<std::int32_t> MixtureDataset::row_sources(std::int64_t index) const {
  const std::uint64_t key = stream_key(seed_, kMixtureStream, static_cast<std::uint64_t>(index));
  const std::vector<std::int32_t> sorted = systematic(weights_at(index), batch_size_, random_uniform(key, 0));
  std::vector<std::int32_t> out(sorted.size());
  const auto n = static_cast<std::uint64_t>(sorted.size());
  for (std::uint64_t r = 0; r < n; ++r) out[r] = sorted[permute_index(r, n, hash_u64(key))];
  return out;
}

std::vector<std::int64_t> MixtureDataset::train_counts(std::int64_t index) const {
  std::vector<std::int64_t> counts(parts_.size(), 0);
  for (const auto d : row_sources(index)) ++counts[static_cast<std::size_t>(d)];
  return counts;
}

std::vector<std::int64_t> MixtureDataset::train_counts_before(std::int64_t index) const {
  const std::int64_t k = index / kCheckpointEvery;
  std::vector<std::int64_t> counts;
  {
    std::lock_guard lock(mutex_);
    if (checkpoints_.empty()) checkpoints_.emplace_back(parts_.size(), 0);
    while (static_cast<std::int64_t>(checkpoints_.size()) <= k) {
      auto next = checkpoints_.back();
      const std::int64_t first = (static_cast<std::int64_t>(checkpoints_.size()) - 1) * kCheckpointEvery;
      for (std::int64_t b = first; b < first + kCheckpointEvery; ++b) {
        const auto c = train_counts(b);
        for (std::size_t d = 0; d < c.size(); ++d) next[d] += c[d];
      }
      checkpoints_.push_back(std::move(next));
    }
    counts = checkpoints_[static_cast<std::size_t>(k)];
  }
  for (std::int64_t b = k * kCheckpointEvery; b < index; ++b) {
    const auto c = train_counts(b);
    for (std::size_t d = 0; d < c.size(); ++d) counts[d] += c[d];
  }
  return counts;
}

void MixtureDataset::batch(Split split, std::int64_t index, Batch& out) const {
  if (split == Split::train) {
    assemble(split, row_sources(index), train_counts_before(index), out);
    return;
  }
  if (validation_weights_.empty()) throw UserError("data.mixture: none of the datasets has a validation split");
  // The same rows every batch, in dataset order; batch `index` continues where index - 1 ended.
  const std::vector<std::int32_t> sources = systematic(validation_weights_, batch_size_, 0.5);
  std::vector<std::int64_t> before(parts_.size(), 0);
  for (const auto d : sources) before[static_cast<std::size_t>(d)] += index;
  assemble(split, sources, before, out);
}

void MixtureDataset::assemble(Split split, const std::vector<std::int32_t>& sources,
                              const std::vector<std::int64_t>& before, Batch& out) const {
  const auto row_size = static_cast<std::size_t>(seq_len_);
  out.batch_size = batch_size_;
  out.seq_len = seq_len_;
  out.inputs.resize(static_cast<std::size_t>(batch_size_) * row_size);
  out.targets.resize(out.inputs.size());
  out.segment_ids.resize(out.inputs.size());
  std::vector<std::int64_t> next = before;
  std::map<std::pair<std::int32_t, std::int64_t>, Batch> fetched;  // (dataset, its batch): at most two each
  for (std::size_t r = 0; r < sources.size(); ++r) {
    const std::int32_t d = sources[r];
    const std::int64_t k = next[static_cast<std::size_t>(d)]++;
    auto [it, fresh] = fetched.try_emplace({d, k / batch_size_});
    if (fresh) parts_[static_cast<std::size_t>(d)].dataset->batch(split, k / batch_size_, it->second);
    const Batch& from = it->second;
    const auto src = static_cast<std::size_t>(k % batch_size_) * row_size, dst = r * row_size;
    std::copy_n(from.inputs.begin() + static_cast<std::ptrdiff_t>(src), row_size,
                out.inputs.begin() + static_cast<std::ptrdiff_t>(dst));
    std::copy_n(from.targets.begin() + static_cast<std::ptrdiff_t>(src), row_size,
                out.targets.begin() + static_cast<std::ptrdiff_t>(dst));
    if (from.segment_ids.empty())
      std::fill_n(out.segment_ids.begin() + static_cast<std::ptrdiff_t>(dst), row_size, 0);
    else
      std::copy_n(from.segment_ids.begin() + static_cast<std::ptrdiff_t>(src), row_size,
                  out.segment_ids.begin() + static_cast<std::ptrdiff_t>(dst));
  }
}

std::int64_t MixtureDataset::num_tokens(Split split) const {
  std::int64_t n = 0;
  for (const auto& p : parts_) n += p.dataset->num_tokens(split);
  return n;
}

bool MixtureDataset::separator_ends_documents() const {
  return std::all_of(parts_.begin(), parts_.end(), [](const Part& p) { return p.dataset->separator_ends_documents(); });
}

}  // namespace loom::training
