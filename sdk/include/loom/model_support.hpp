// Building blocks that transformer model plugins share (header-only; kinds/model.hpp is the
// contract, this is help for implementing it):
//   * ParameterStore: every parameter a view into one flat, aligned buffer, with its role;
//   * fill_normal / fill_constant: deterministic, counter-based initialisation (random.hpp);
//   * check_batch: the UserErrors a model gives for bad token, target and segment tensors;
//   * LayerKvCache: per-layer key and value buffers for generation;
//   * TransformerShape and training_flops_per_token: the FLOPs formula of docs/models.md;
//   * CausalLm: loss, logits and generation around a model's forward pass;
//   * TransformerLm: a CausalLm whose parameters live in a ParameterStore, with the parameter and
//     FLOPs counts and the Hugging Face model_type check written once.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loom/autograd.hpp"
#include "loom/error.hpp"
#include "loom/execution.hpp"
#include "loom/hf_interop.hpp"
#include "loom/kinds/model.hpp"
#include "loom/parallel_plan.hpp"
#include "loom/random.hpp"

namespace loom::models {

// The largest extents the built-in transformer models accept (their options' maxima): far above
// any model trained today, and small enough that a shape's element count fits in 64 bits.
inline constexpr std::int64_t max_model_width = std::int64_t{1} << 20;       // hidden, MLP and head widths
inline constexpr std::int64_t max_model_layers = std::int64_t{1} << 14;      // layers (blocks)
inline constexpr std::int64_t max_model_heads = std::int64_t{1} << 14;       // query or key/value heads
inline constexpr std::int64_t max_model_seq_len = std::int64_t{1} << 24;     // positions
inline constexpr std::int64_t max_model_vocab_size = std::int64_t{1} << 24;  // vocabulary entries
inline constexpr std::int64_t max_model_experts = std::int64_t{1} << 12;     // experts per layer
// The most values a model may declare in all (2^56: 256 PiB in float32).
inline constexpr std::int64_t max_model_values = std::int64_t{1} << 56;

// Declares parameters, then allocates them all at once as views into one buffer, each starting
// on a 64-byte boundary (one cache line, one AVX-512 vector). One buffer makes a whole-model
// pass (an optimizer step, a checkpoint) one sweep over memory. Under tensor parallelism
// (set_tensor_split) each parameter is declared whole with its placement (parallel_plan.hpp) and
// only this member's shard is allocated.
class ParameterStore {
 public:
  // This process is member `rank` of `size` that split the split parameters; before declare.
  void set_tensor_split(int rank, int size) {
    if (!specs_.empty()) throw InternalError("ParameterStore::set_tensor_split after declare");
    if (size < 1 || rank < 0 || rank >= size)
      throw InternalError("ParameterStore: tensor rank " + std::to_string(rank) + " of " + std::to_string(size));
    tensor_rank_ = rank;
    tensor_size_ = size;
  }
  int tensor_rank() const { return tensor_rank_; }
  int tensor_size() const { return tensor_size_; }

  // Declares a parameter of whole shape `shape`; after allocate(), *slot points to it (this
  // member's shard of it when `placement` splits it). Order of declaration is the order of
  // parameters() and of the initialisation streams.
  void declare(std::string name, Shape shape, ParameterRole role, Parameter** slot,
               TensorPlacement placement = TensorPlacement::replicated()) {
    if (allocated()) throw InternalError("ParameterStore::declare after allocate");
    // The count in 128 bits: shapes from absurd options are refused, not wrapped around.
    __extension__ typedef __int128 Count;
    Count values = 1;
    for (int i = 0; i < shape.rank(); ++i) values *= std::max<std::int64_t>(shape[i], 0);
    declared_values_ += values < max_model_values ? static_cast<std::int64_t>(values) : max_model_values;
    if (values >= max_model_values || declared_values_ >= max_model_values)
      throw UserError("the model would have more than 2^56 parameter values (its parameter '" + name + "' is " +
                      shape.str() +
                      "): its options (model.hidden_dim, model.num_layers, the vocabulary ...) describe a model "
                      "far larger than any machine holds");
    const Shape local = tensor_plan::shard_shape(shape, placement, tensor_rank_, tensor_size_);
    specs_.push_back({std::move(name), local, role, slot, shape, std::move(placement)});
  }

  // The buffer is zeroed, in host memory or in `device`'s (a device backend's: the parameters
  // are then initialised through its kernels, fill_normal and fill_constant with the backend).
  void allocate(const Device& device = Device::host()) {
    if (allocated()) throw InternalError("ParameterStore::allocate called twice");
    constexpr std::int64_t align = 16;  // floats
    std::int64_t total = 0;
    std::vector<std::int64_t> offsets;
    for (const auto& s : specs_) {
      offsets.push_back(total);
      total += (s.shape.numel() + align - 1) / align * align;
    }
    const Shape shape{std::max<std::int64_t>(total, 1)};
    buffer_ = device.is_host() ? Tensor::zeros(shape) : Tensor::zeros(shape, DType::f32, device);
    for (std::size_t i = 0; i < specs_.size(); ++i) {
      const auto& s = specs_[i];
      Tensor view = buffer_.slice(0, offsets[i], offsets[i] + s.shape.numel()).view(s.shape);
      Parameter& p = storage_.emplace_back(s.name, std::move(view));
      *s.slot = &p;
      list_.push_back({&p, s.role});
    }
  }

  bool allocated() const { return buffer_.defined(); }
  // The declared parameters' names and element counts (this member's), allocated or not, in
  // declaration order.
  std::vector<std::pair<std::string, std::int64_t>> declared() const {
    std::vector<std::pair<std::string, std::int64_t>> out;
    for (const auto& s : specs_) out.emplace_back(s.name, s.shape.numel());
    return out;
  }
  const std::vector<ModelParameter>& parameters() const { return list_; }
  // Elements of every whole parameter (padding excluded): the model's size, split or not.
  std::int64_t num_elements() const {
    std::int64_t n = 0;
    for (const auto& s : specs_) n += s.whole.numel();
    return n;
  }
  // Parameter i's whole shape and placement (declaration order).
  const Shape& whole_shape(std::size_t i) const { return specs_.at(i).whole; }
  const TensorPlacement& placement(std::size_t i) const { return specs_.at(i).placement; }
  // The parallel plan (Model::parallel_plan): every allocated parameter with its whole shape and
  // placement.
  std::vector<PlannedParameter> plan() const {
    std::vector<PlannedParameter> out;
    for (std::size_t i = 0; i < list_.size(); ++i)
      out.push_back({list_[i].parameter, specs_[i].whole, specs_[i].placement});
    return out;
  }

 private:
  struct Spec {
    std::string name;
    Shape shape;
    ParameterRole role;
    Parameter** slot;
    Shape whole;
    TensorPlacement placement;
  };
  int tensor_rank_ = 0, tensor_size_ = 1;
  std::vector<Spec> specs_;
  std::int64_t declared_values_ = 0;  // capped at max_model_values
  Tensor buffer_;
  std::deque<Parameter> storage_;  // stable addresses
  std::vector<ModelParameter> list_;
};

namespace detail {
// The backend that initialises `t` when the host cannot write it (a device backend's memory).
inline Backend& initialising_backend(const Tensor& t, Backend* backend, const char* what) {
  if (!backend)
    throw InternalError(std::string(what) + ": the tensor is in " + t.device().str() +
                        " memory, which the host cannot write, and no backend was given to initialise it");
  return *backend;
}
}  // namespace detail

// Fills `t` (contiguous f32) with normal(0, stddev) values: element i is random_normal(key, i),
// so the result does not depend on the thread count. In host memory on the pool; in a device's
// memory through `backend`'s fill_normal kernel (the same values, bit for bit).
inline void fill_normal(const Tensor& t, std::uint64_t key, double stddev, const ExecutionContext& execution,
                        Backend* backend = nullptr) {
  const auto scale = static_cast<float>(stddev);
  if (!t.is_host_visible()) {
    detail::initialising_backend(t, backend, "fill_normal")
        .fill_normal(t.device_data<float>(), t.numel(), key, 0, scale);
    return;
  }
  float* data = t.data<float>();
  execution.parallel_for(t.numel(), 1 << 16, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) data[i] = scale * random_normal(key, static_cast<std::uint32_t>(i));
  });
}

// Fills parameter i of `store` as fill_normal fills the whole parameter: each element of this
// member's shard gets the value of its index in the whole tensor, so the shards of a split model
// hold the one-process initialisation (on a device: one fill_normal kernel per run of the shard).
inline void fill_normal(const ParameterStore& store, std::size_t i, std::uint64_t key, double stddev,
                        const ExecutionContext& execution, Backend* backend = nullptr) {
  const Tensor t = store.parameters().at(i).parameter->data();
  const TensorPlacement& placement = store.placement(i);
  if (store.tensor_size() == 1 || !placement.is_split()) return fill_normal(t, key, stddev, execution, backend);
  const auto scale = static_cast<float>(stddev);
  if (!t.is_host_visible()) {
    Backend& b = detail::initialising_backend(t, backend, "fill_normal");
    float* data = t.device_data<float>();
    tensor_plan::for_each_run(store.whole_shape(i), placement, store.tensor_rank(), store.tensor_size(),
                              [&](std::int64_t whole, std::int64_t local, std::int64_t n) {
                                b.fill_normal(data + local, n, key, whole, scale);
                              });
    return;
  }
  float* data = t.data<float>();
  tensor_plan::for_each_run(store.whole_shape(i), placement, store.tensor_rank(), store.tensor_size(),
                            [&](std::int64_t whole, std::int64_t local, std::int64_t n) {
                              for (std::int64_t k = 0; k < n; ++k)
                                data[local + k] = scale * random_normal(key, static_cast<std::uint32_t>(whole + k));
                            });
}

// Fills `t` (contiguous f32) with `value`: on the host, or through `backend`'s fill kernel when
// the tensor is in a device's memory.
inline void fill_constant(const Tensor& t, float value, Backend* backend = nullptr) {
  if (!t.is_host_visible()) {
    detail::initialising_backend(t, backend, "fill_constant").fill(t.device_data<float>(), value, t.numel());
    return;
  }
  std::fill_n(t.data<float>(), t.numel(), value);
}

// The vocabulary size a model uses: its own option when set (it may exceed the tokenizer's, never
// fall short of it), else the tokenizer's.
inline std::int64_t resolve_vocab_size(std::int64_t option, const ModelSetup& setup, const std::string& model) {
  if (option > 0) {
    if (setup.vocab_size > option)
      throw UserError(model + ": the tokenizer has " + std::to_string(setup.vocab_size) + " tokens but vocab_size is " +
                      std::to_string(option) + "; raise vocab_size or leave it null to take the tokenizer's");
    return option;
  }
  if (setup.vocab_size <= 0)
    throw UserError(model + ": vocab_size is null and no tokenizer gives one; set " + model +
                    ".vocab_size or configure a tokenizer");
  return setup.vocab_size;
}

namespace detail {
inline void check_ids(const Tensor& t, const char* what, std::int64_t batch, std::int64_t seq, bool allow_ignore,
                      std::int64_t vocab, const std::string& model) {
  if (!t.defined()) throw UserError(model + ": " + what + " are missing");
  if (t.dtype() != DType::i32 || !t.is_contiguous() || t.rank() != 2)
    throw UserError(model + ": " + what + " must be a contiguous i32 [batch, seq] tensor, not " + t.str());
  if (t.size(0) != batch || t.size(1) != seq)
    throw UserError(model + ": " + what + " " + t.shape().str() + " do not match the tokens [" + std::to_string(batch) +
                    ", " + std::to_string(seq) + "]");
  if (vocab <= 0) return;
  // Ids in a device's memory are validated from an explicit copy (the batch came in from the
  // host: this is its way back, once per micro-batch).
  std::vector<std::int32_t> copied;
  if (!t.is_host_visible()) copied = t.to_int_vector();
  const std::int32_t* id = t.is_host_visible() ? t.data<std::int32_t>() : copied.data();
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    if ((id[i] >= 0 && id[i] < vocab) || (allow_ignore && id[i] == -1)) continue;
    throw UserError(model + ": " + what + " [" + std::to_string(i / seq) + ", " + std::to_string(i % seq) + "] is " +
                    std::to_string(id[i]) + ", outside the model's vocabulary [0, " + std::to_string(vocab) + ")" +
                    (allow_ignore ? " (and not -1, which means ignore)" : ""));
  }
}
}  // namespace detail

// Validates a batch: tokens i32 [batch, seq] with ids in [0, vocab) and 0 < seq <= max_seq_len;
// targets (when defined) the same shape with ids in [0, vocab) or -1; segments undefined or
// i32 of the same shape. Throws UserError naming `model` and what is wrong.
inline void check_batch(const Tensor& tokens, const Tensor& targets, const Tensor& segments, std::int64_t vocab,
                        std::int64_t max_seq_len, const std::string& model, bool need_targets) {
  if (!tokens.defined() || tokens.rank() != 2)
    throw UserError(model + ": tokens must be an i32 [batch, seq] tensor, not " +
                    (tokens.defined() ? tokens.str() : std::string("undefined")));
  const std::int64_t batch = tokens.size(0), seq = tokens.size(1);
  if (batch <= 0 || seq <= 0) throw UserError(model + ": empty batch " + tokens.shape().str());
  if (seq > max_seq_len)
    throw UserError(model + ": sequences of " + std::to_string(seq) + " tokens exceed the model's seq_len of " +
                    std::to_string(max_seq_len));
  detail::check_ids(tokens, "tokens", batch, seq, false, vocab, model);
  if (need_targets) detail::check_ids(targets, "targets", batch, seq, true, vocab, model);
  if (segments.defined()) detail::check_ids(segments, "segments", batch, seq, false, 0, model);
}

// Keys and values of every layer for `batch` sequences of up to `max_len` positions:
// [batch, max_len, kv_heads, head_dim] per layer, filled from position 0 on, in `device`'s memory
// (the model's: a device backend's cache never leaves it).
class LayerKvCache final : public KvCache {
 public:
  LayerKvCache(const void* owner, std::int64_t layers, std::int64_t batch, std::int64_t max_len, std::int64_t kv_heads,
               std::int64_t head_dim, const Device& device = Device::host())
      : owner_(owner), batch_(batch), max_len_(max_len) {
    const Shape shape{batch, max_len, kv_heads, head_dim};
    for (std::int64_t l = 0; l < layers; ++l) {
      keys_.push_back(device.is_host() ? Tensor::zeros(shape) : Tensor::zeros(shape, DType::f32, device));
      values_.push_back(device.is_host() ? Tensor::zeros(shape) : Tensor::zeros(shape, DType::f32, device));
    }
  }

  std::int64_t length() const override { return length_; }
  void reset() override { length_ = 0; }

  const void* owner() const { return owner_; }
  std::int64_t batch() const { return batch_; }
  std::int64_t max_len() const { return max_len_; }

  // Writes the keys and values of positions [length, length + n) of `layer` (k, v:
  // [batch, n, kv_heads, head_dim], any token stride) and returns views of positions
  // [0, length + n). The length itself advances once every layer has been written (advance).
  std::pair<Tensor, Tensor> append(std::int64_t layer, const Tensor& k, const Tensor& v) {
    const std::int64_t n = k.size(1);
    const auto l = static_cast<std::size_t>(layer);
    keys_[l].slice(1, length_, length_ + n).copy_from(k.detach());
    values_[l].slice(1, length_, length_ + n).copy_from(v.detach());
    return {keys_[l].slice(1, 0, length_ + n), values_[l].slice(1, 0, length_ + n)};
  }
  void advance(std::int64_t n) { length_ += n; }

  // Puts positions [0, length) of `source`'s first sequence into every sequence of this cache,
  // which then holds `length` positions: one context run once, continued by several sequences
  // (`loom eval`'s multiple choice). Both caches come from the same model.
  void fill_from(const LayerKvCache& source, std::int64_t length) {
    if (length > source.length_ || length > max_len_ || keys_.size() != source.keys_.size())
      throw InternalError("LayerKvCache::fill_from: " + std::to_string(length) + " positions of a cache holding " +
                          std::to_string(source.length_) + " into one of at most " + std::to_string(max_len_));
    for (std::size_t l = 0; l < keys_.size(); ++l)
      for (std::int64_t b = 0; b < batch_; ++b) {
        keys_[l].select(0, b).slice(0, 0, length).copy_from(source.keys_[l].select(0, 0).slice(0, 0, length));
        values_[l].select(0, b).slice(0, 0, length).copy_from(source.values_[l].select(0, 0).slice(0, 0, length));
      }
    length_ = length;
  }

 private:
  const void* owner_;
  std::int64_t batch_, max_len_;
  std::int64_t length_ = 0;
  std::vector<Tensor> keys_, values_;
};

// Validates a next_logits call against `cache` and returns it as a LayerKvCache.
inline LayerKvCache& check_cache(KvCache& cache, const void* owner, const Tensor& tokens, std::int64_t vocab,
                                 const std::string& model) {
  auto* c = dynamic_cast<LayerKvCache*>(&cache);
  if (!c || c->owner() != owner) throw UserError(model + ": the KV cache was not made by this model (new_cache)");
  if (!tokens.defined() || tokens.rank() != 2 || tokens.size(0) != c->batch())
    throw UserError(model + ": next_logits needs i32 tokens [" + std::to_string(c->batch()) +
                    ", new] for this cache, not " + (tokens.defined() ? tokens.str() : std::string("undefined")));
  if (c->length() + tokens.size(1) > c->max_len())
    throw UserError(model + ": the KV cache holds " + std::to_string(c->length()) + " of at most " +
                    std::to_string(c->max_len()) + " positions; " + std::to_string(tokens.size(1)) +
                    " more do not fit");
  detail::check_ids(tokens, "tokens", c->batch(), tokens.size(1), false, vocab, model);
  return *c;
}

// Runs the model without recording and without dropout for as long as it lives (generation).
class InferenceScope {
 public:
  explicit InferenceScope(Ops& ops) : ops_(ops), training_(ops.training()) {
    if (ops.tape()) guard_.emplace(*ops.tape());
    ops_.set_training(false);
  }
  ~InferenceScope() { ops_.set_training(training_); }
  InferenceScope(const InferenceScope&) = delete;
  InferenceScope& operator=(const InferenceScope&) = delete;

 private:
  Ops& ops_;
  bool training_;
  std::optional<NoGradGuard> guard_;
};

// What every decoder-only language model shares around its own forward pass: the loss, the
// logits, and generation through a LayerKvCache. A model derives from it and supplies the
// forward pass (final hidden states, after the last norm), the output projection and the shape
// of its cache; the plumbing and its checks are written once.
class CausalLm : public Model {
 public:
  Tensor loss(Ops& ops, const Tensor& tokens, const Tensor& targets, const Tensor& segments) final {
    require_built("loss");
    check_batch(tokens, targets, segments, vocab_size(), max_seq_len(), label(), true);
    const Tensor x = forward(ops, tokens, segments, nullptr);
    CrossEntropyOptions ce;
    ce.ignore_index = -1;
    ce.logit_softcap = final_logit_softcap();
    const Tensor loss = ops.linear_cross_entropy(head_input(ops, x, ce), head(), targets, ce);
    const Tensor extra = auxiliary_loss(ops);
    return extra.defined() ? ops.add(loss, extra.view(loss.shape())) : loss;
  }

  Tensor token_losses(Ops& ops, const Tensor& tokens, const Tensor& targets, const Tensor& segments) final {
    require_built("token_losses");
    check_batch(tokens, targets, segments, vocab_size(), max_seq_len(), label(), true);
    const Tensor x = forward(ops, tokens, segments, nullptr);
    CrossEntropyOptions ce;
    ce.ignore_index = -1;
    ce.logit_softcap = final_logit_softcap();
    ce.reduction = Reduction::none;
    const Tensor losses = ops.linear_cross_entropy(head_input(ops, x, ce), head(), targets, ce);
    {
      // The forward pass's auxiliary state is consumed (its metrics kept), its losses not added.
      std::optional<NoGradGuard> guard;
      if (ops.tape()) guard.emplace(*ops.tape());
      auxiliary_loss(ops);
    }
    return losses;
  }

  Tensor logits(Ops& ops, const Tensor& tokens, const Tensor& segments) final {
    require_built("logits");
    check_batch(tokens, Tensor(), segments, vocab_size(), max_seq_len(), label(), false);
    return cap_logits(ops, project(ops, forward(ops, tokens, segments, nullptr)));
  }

  std::unique_ptr<KvCache> new_cache(std::int64_t batch, std::int64_t max_len) final {
    require_built("new_cache");
    if (batch <= 0 || max_len <= 0 || max_len > max_seq_len())
      throw UserError(label() + ": a KV cache needs batch >= 1 and 1 <= max_len <= seq_len (" +
                      std::to_string(max_seq_len()) + "), not batch " + std::to_string(batch) + " and max_len " +
                      std::to_string(max_len));
    const CacheShape shape = cache_shape();
    // Where the model's weights are (a device backend's memory, ModelSetup::backend).
    return std::make_unique<LayerKvCache>(this, shape.layers, batch, max_len, shape.kv_heads, shape.head_dim,
                                          head().device());
  }

  Tensor next_logits(Ops& ops, const Tensor& tokens, KvCache& cache) final {
    require_built("next_logits");
    LayerKvCache& c = check_cache(cache, this, tokens, vocab_size(), label());
    Tensor logits;
    {
      InferenceScope scope(ops);
      const Tensor x = forward(ops, tokens, Tensor(), &c);
      logits = project(ops, x.select(1, x.size(1) - 1));
    }
    return cap_logits(ops, logits);  // nothing to record: the logits carry no gradient
  }

  // The logits of chosen positions of `tokens` [batch, seq] alone, [positions, vocab]: position p
  // is row p / seq, column p % seq. `loom eval` scores continuations after long contexts without
  // projecting every context position onto the vocabulary. Not virtual, as cached_logits.
  Tensor logits_at(Ops& ops, const Tensor& tokens, std::span<const std::int64_t> positions) {
    require_built("logits_at");
    check_batch(tokens, Tensor(), Tensor(), vocab_size(), max_seq_len(), label(), false);
    const Tensor x = hidden_states(ops, tokens);
    const std::int64_t seq = x.size(1);
    const Tensor picked =
        Tensor::zeros(Shape{static_cast<std::int64_t>(positions.size()), x.size(2)}, x.dtype(), x.device());
    for (std::size_t i = 0; i < positions.size(); ++i)
      picked.select(0, static_cast<std::int64_t>(i))
          .copy_from(x.select(0, positions[i] / seq).select(0, positions[i] % seq));
    Tensor logits;
    {
      InferenceScope scope(ops);
      logits = project(ops, picked);
    }
    return cap_logits(ops, logits);
  }

  // As next_logits, but the logits of every new position, [batch, new, vocab]: a continuation
  // scored after a cached context (`loom eval`). Not virtual: callers reach it through a
  // dynamic_cast to CausalLm, and a model that is not one is scored without a cache.
  Tensor cached_logits(Ops& ops, const Tensor& tokens, KvCache& cache) {
    require_built("cached_logits");
    LayerKvCache& c = check_cache(cache, this, tokens, vocab_size(), label());
    Tensor logits;
    {
      InferenceScope scope(ops);
      logits = project(ops, forward(ops, tokens, Tensor(), &c));
    }
    return cap_logits(ops, logits);
  }

 protected:
  struct CacheShape {
    std::int64_t layers = 0, kv_heads = 0, head_dim = 0;
  };

  // The component's name ("gpt2"), for messages.
  virtual const char* name() const = 0;
  // Whether build() has allocated the parameters.
  virtual bool built() const = 0;
  // The output projection's weight, [vocab, hidden] (the embedding table when tied).
  virtual Tensor head() const = 0;
  virtual CacheShape cache_shape() const = 0;
  // The model's weighted auxiliary losses of the forward pass loss() just ran (a scalar, added to
  // the cross-entropy), or undefined: none. A mixture of experts' load-balancing and z-losses.
  virtual Tensor auxiliary_loss(Ops& ops) {
    (void)ops;
    return Tensor();
  }
  // When > 0, the logits are soft-capped: cap * tanh(logit / cap) (Gemma 2).
  virtual float final_logit_softcap() const { return 0.0f; }
  // Under vocabulary parallelism: head() holds rows [begin, begin + rows) of an output layer of
  // `whole` rows, split over Ops::tensor_group. whole 0 (the default): head() is all of it.
  struct VocabShard {
    std::int64_t begin = 0, whole = 0;
  };
  virtual VocabShard vocab_shard() const { return {}; }
  // The final hidden states of `tokens` [batch, seq]. With a cache, the tokens follow the cached
  // positions and their keys and values are appended to it.
  virtual Tensor forward(Ops& ops, const Tensor& tokens, const Tensor& segments, LayerKvCache* cache) = 0;

  void require_built(const char* what) const {
    if (!built()) throw InternalError(std::string(name()) + ": " + what + " before build");
  }

 private:
  Tensor hidden_states(Ops& ops, const Tensor& tokens) {
    InferenceScope scope(ops);
    return forward(ops, tokens, Tensor(), nullptr);
  }
  // The cross-entropy's input: the final hidden states, and under vocabulary parallelism their
  // f (tensor_copy: each member's gradient is its vocabulary rows' part) with ce's vocabulary.
  Tensor head_input(Ops& ops, const Tensor& x, CrossEntropyOptions& ce) const {
    const VocabShard shard = vocab_shard();
    if (shard.whole == 0) return x;
    ce.vocab_size = shard.whole;
    ce.vocab_begin = shard.begin;
    return ops.tensor_copy(x);
  }
  // The logits of x [..., hidden], [..., vocab]. Under vocabulary parallelism each member
  // projects onto its rows and the members' logits are gathered (evaluation and generation; not
  // recorded: training's loss never gathers them).
  Tensor project(Ops& ops, const Tensor& x) const {
    const VocabShard shard = vocab_shard();
    if (shard.whole == 0) return ops.linear(x, head());
    std::optional<NoGradGuard> guard;
    if (ops.tape()) guard.emplace(*ops.tape());
    const Tensor local = ops.linear(x, head());
    const std::int64_t n = local.size(local.rank() - 1), rows = local.numel() / std::max<std::int64_t>(n, 1);
    const int size = ops.tensor_size();
    const std::int64_t width = (shard.whole + size - 1) / size;  // every member's padded to the widest
    const Tensor padded = Tensor::zeros(Shape{rows, width}, local.dtype(), local.device());
    padded.slice(1, 0, n).copy_from(local.view(Shape{rows, n}));
    const Tensor all = ops.tensor_all_gather(padded, 1);  // [rows, size * width]
    Shape shape = local.shape();
    shape[local.rank() - 1] = shard.whole;
    const Tensor out = Tensor::zeros(Shape{rows, shard.whole}, local.dtype(), local.device());
    for (int r = 0; r < size; ++r) {
      const std::int64_t b = tensor_plan::split_begin(shard.whole, r, size);
      const std::int64_t e = tensor_plan::split_begin(shard.whole, r + 1, size);
      out.slice(1, b, e).copy_from(all.slice(1, r * width, r * width + e - b));
    }
    return out.view(shape);
  }
  Tensor cap_logits(Ops& ops, const Tensor& logits) const {
    const float cap = final_logit_softcap();
    return cap > 0.0f ? ops.softcap(logits, cap) : logits;
  }
  std::string label() const { return "model (" + std::string(name()) + ")"; }
};

// The `remat` option every built-in model has: "none", "full" or "save_dots" (RematPolicy).
inline RematPolicy parse_remat(const std::string& value) {
  if (value == "full") return RematPolicy::full;
  if (value == "save_dots") return RematPolicy::save_dots;
  return RematPolicy::none;
}
inline constexpr const char* remat_doc =
    "Activation checkpointing per layer: none keeps every activation; full keeps each layer's inputs and recomputes "
    "the layer in the backward pass; save_dots also keeps the outputs of its matrix products and recomputes the rest "
    "(norms, activations, attention). Gradients are identical.";

// One decoder layer, (residual stream h, normed input x) -> (h, x) for the next, run under
// `policy` (Ops::checkpoint). `body` is kept until the backward pass: it must capture by value
// (and the model by pointer), never a local by reference.
using LayerBody = std::function<std::pair<Tensor, Tensor>(Ops& ops, const Tensor& h, const Tensor& x)>;
inline std::pair<Tensor, Tensor> run_layer(Ops& ops, RematPolicy policy, const Tensor& h, const Tensor& x,
                                           LayerBody body) {
  if (policy == RematPolicy::none) return body(ops, h, x);
  const Tensor inputs[2] = {h, x};
  const auto out = ops.checkpoint(
      inputs,
      [body = std::move(body)](Ops& o, std::span<const Tensor> in) {
        auto [h2, x2] = body(o, in[0], in[1]);
        return std::vector<Tensor>{std::move(h2), std::move(x2)};
      },
      policy);
  return {out[0], out[1]};
}

// What the FLOPs formula needs to know about a decoder-only transformer.
struct TransformerShape {
  std::int64_t num_layers = 0;
  std::int64_t hidden_dim = 0;
  std::int64_t num_heads = 0;
  std::int64_t num_kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t intermediate_dim = 0;
  bool glu = false;  // gated MLP (three matrices) instead of two
  // A mixture of experts' top-k (0: a dense MLP; intermediate_dim is then the k experts' width):
  // the memory estimate counts its dispatch copies (each token's input gathered for, output of,
  // and output gathered from each of its k experts).
  std::int64_t experts_per_token = 0;
  std::int64_t vocab_size = 0;
  std::int64_t sliding_window = 0;  // 0: every query sees the whole prefix
  // When not empty: each layer's window (0: none), in place of sliding_window (Gemma 2's
  // alternating layers, Qwen2's max_window_layers).
  std::vector<std::int64_t> layer_windows;
};

// Weights that take part in a matrix product per token: the q, k, v and output projections,
// the MLP and the output (LM head) projection. Embedding lookups, position tables, norms and
// biases are not matrix products and are not counted.
inline double matmul_weights(const TransformerShape& s) {
  const double attn = static_cast<double>(s.hidden_dim) * static_cast<double>(s.head_dim) *
                      static_cast<double>(2 * s.num_heads + 2 * s.num_kv_heads);
  const double mlp = static_cast<double>(s.hidden_dim) * static_cast<double>(s.intermediate_dim) * (s.glu ? 3.0 : 2.0);
  return static_cast<double>(s.num_layers) * (attn + mlp) +
         static_cast<double>(s.hidden_dim) * static_cast<double>(s.vocab_size);
}

// Training FLOPs per token at sequence length `seq_len` (docs/models.md):
//   6 * matmul_weights + 12 * layers * heads * head_dim * keys
// where keys = seq_len, or min(seq_len, sliding_window): the forward pass costs 2 FLOPs per weight
// and 4 * heads * head_dim per (query, key) pair (Q K^T and P V), the backward pass twice that.
// Every query is charged for all `keys` positions, as PaLM, nanoGPT and Levanter count (no causal
// halving; MaxText halves). With layer_windows, `layers * keys` is the sum of each layer's keys.
inline double training_flops_per_token(const TransformerShape& s, std::int64_t seq_len) {
  if (!s.layer_windows.empty()) {
    double keys = 0;
    for (const std::int64_t window : s.layer_windows)
      keys += static_cast<double>(window > 0 ? std::min(seq_len, window) : seq_len);
    return 6.0 * matmul_weights(s) + 12.0 * static_cast<double>(s.num_heads) * static_cast<double>(s.head_dim) * keys;
  }
  const std::int64_t keys = s.sliding_window > 0 ? std::min(seq_len, s.sliding_window) : seq_len;
  return 6.0 * matmul_weights(s) + 12.0 * static_cast<double>(s.num_layers) * static_cast<double>(s.num_heads) *
                                       static_cast<double>(s.head_dim) * static_cast<double>(keys);
}

// The memory of a decoder-only transformer for a micro-batch of [batch, seq] (docs/training.md,
// "Memory estimate"), fitted to the peak RSS of gpt2 and llama runs. Per token and layer the
// backward pass keeps about
//   9 hidden + 3 kv + 1.5 MLP-wide (two matrices) or 3.5 (gated) float32 values, and a mixture of
//   experts' 3 k hidden (its dispatch copies);
// remat keeps each layer's two inputs and about 1.25 layers' values at a time (the layer whose
// forward runs again and its gradients). Besides, with or without remat: one chunk of logits
// (Ops::linear_cross_entropy's, at most 256 MiB) and the output projection's whole gradient
// [vocab, hidden], which the backward pass computes before it is added to the parameter's.
// In 128 bits, each figure capped at 2^58 bytes (256 PiB), so that absurd shapes give an absurd
// estimate instead of one wrapped around to negative.
namespace detail {
__extension__ typedef __int128 MemoryCount;
inline std::int64_t capped_memory(MemoryCount v) {
  constexpr std::int64_t cap = std::int64_t{1} << 58;
  return v < 0 ? 0 : v > cap ? cap : static_cast<std::int64_t>(v);
}
}  // namespace detail

inline ModelMemory transformer_memory(const TransformerShape& s, RematPolicy remat, std::int64_t batch,
                                      std::int64_t seq) {
  using W = detail::MemoryCount;
  const W tokens = W{batch} * seq, kv = W{s.num_kv_heads} * s.head_dim, q = W{s.num_heads} * s.head_dim;
  const W hidden = s.hidden_dim, layers = s.num_layers;
  const W layer_floats =
      9 * hidden + 3 * kv + (s.glu ? 7 : 3) * W{s.intermediate_dim} / 2 + 3 * W{s.experts_per_token} * hidden;
  const W per_layer = tokens * 4 * layer_floats;
  const W vocab = std::max<std::int64_t>(s.vocab_size, 1);
  const W chunk = std::max<W>(16, (W{256} << 20) / (vocab * 4) / 16 * 16);
  const W outside = std::min(tokens, chunk) * vocab * 4 + vocab * hidden * 4 + tokens * 4 * 2 * hidden;
  ModelMemory m;
  m.activation_bytes = detail::capped_memory(layers * per_layer + outside);
  m.activation_bytes_remat = detail::capped_memory(layers * tokens * 4 * 2 * hidden + 5 * per_layer / 4 + outside);
  m.remat = remat != RematPolicy::none;
  m.kv_cache_bytes_per_position = detail::capped_memory(2 * layers * kv * 4);
  m.lora_in_out = detail::capped_memory(
      layers * ((hidden + q + 2 * kv) + (q + hidden) + (s.glu ? 3 : 2) * (hidden + W{s.intermediate_dim})));
  return m;
}

// The Hugging Face tensors of one parameter of a Llama-layout model (base_model_prefix "model"):
// a fused "self_attn.qkv_proj.weight" (or ".bias") is rows [q | k | v] of q_proj, k_proj and
// v_proj (q = num_heads * head_dim rows, kv = num_kv_heads * head_dim each for k and v); any
// other parameter is one tensor, "model." + its name, of all its `rows`.
inline void add_llama_layout_tensors(HfTensorLayout& layout, const std::string& name, std::int64_t rows, std::int64_t q,
                                     std::int64_t kv) {
  static const std::string fused_name = "self_attn.qkv_proj";
  const auto fused = name.find(fused_name + ".");
  if (fused == std::string::npos) {
    layout.tensors.push_back({"model." + name, name, 0, rows});
    return;
  }
  const std::string head = "model." + name.substr(0, fused) + "self_attn.";
  const std::string tail = name.substr(fused + fused_name.size());  // ".weight"
  layout.tensors.push_back({head + "q_proj" + tail, name, 0, q});
  layout.tensors.push_back({head + "k_proj" + tail, name, q, q + kv});
  layout.tensors.push_back({head + "v_proj" + tail, name, q + kv, q + 2 * kv});
}

// What the built-in transformer models (gpt2, llama, gemma) share beyond CausalLm: parameters
// declared in a ParameterStore by build(), the vocabulary size resolved there, the parameter and
// FLOPs counts (from the model's TransformerShape), and the model_type check that starts every
// comparison with a Hugging Face config.json. A model declares its parameters between
// begin_build() and finish_build(), describes its shape, and checks the rest of a config.
class TransformerLm : public CausalLm, public HfModel {
 public:
  std::vector<ModelParameter> parameters() final {
    require_built("parameters");
    return store_.parameters();
  }
  // Every parameter's placement, as its blocks declared it.
  std::optional<std::vector<PlannedParameter>> parallel_plan() override {
    require_built("parallel_plan");
    return store_.plan();
  }
  std::int64_t vocab_size() const final { return vocab_; }
  // One unit per transformer block (the parameters whose name has the block's number as its
  // first numeric component, "h.3.attn.c_attn.weight"), the parameters declared before the
  // first block ("embeddings") and those after the last ("output": the final norm, the head).
  std::vector<ShardingUnit> sharding_units() override {
    require_built("sharding_units");
    std::vector<ShardingUnit> units;
    const std::vector<std::string> names = unit_names();
    const std::vector<ModelParameter>& params = store_.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (units.empty() || units.back().name != names[i]) units.push_back({names[i], {}});
      units.back().parameters.push_back(params[i].parameter);
    }
    return units;
  }
  // Counts the declared parameters, so it works on a model built with ModelSetup::allocate false.
  std::int64_t num_parameters() const final {
    if (!declared_) throw InternalError(std::string(name()) + ": num_parameters before build");
    return store_.num_elements();
  }
  double flops_per_token(std::int64_t seq_len) const final {
    return training_flops_per_token(transformer_shape(), seq_len) + extra_flops_per_token();
  }
  std::optional<ModelMemory> memory(std::int64_t batch, std::int64_t seq) const override {
    ModelMemory m = transformer_memory(transformer_shape(), remat_policy(), batch, seq);
    // The sharding units' sizes, from the declarations (allocated or not).
    const std::vector<std::string> names = unit_names();
    const auto declared = store_.declared();
    std::vector<std::int64_t> sizes;
    for (std::size_t i = 0; i < declared.size(); ++i) {
      if (i == 0 || names[i] != names[i - 1]) sizes.push_back(0);
      sizes.back() += (declared[i].second + 15) / 16 * 16;
    }
    std::sort(sizes.rbegin(), sizes.rend());
    for (std::size_t i = 0; i < 3 && i < sizes.size(); ++i) m.largest_units[i] = sizes[i];
    return m;
  }
  // A config whose model_type is none of hf_model_types is one mismatch, naming the accepted
  // ones; otherwise check_hf_config compares the rest.
  std::vector<std::string> hf_config_mismatches(const Value& config) const final {
    require_built("hf_config_mismatches");
    HfConfigCheck check(config, path_);
    const std::string type = check.string("model_type", "");
    if (std::find(hf_model_types_.begin(), hf_model_types_.end(), type) == hf_model_types_.end()) {
      std::string accepted;
      for (std::size_t i = 0; i < hf_model_types_.size(); ++i)
        accepted += (i == 0                            ? ""
                     : i + 1 == hf_model_types_.size() ? " or "
                                                       : ", ") +
                    Value(hf_model_types_[i]).describe();
      check.mismatch("model_type is " + Value(type).describe() + "; the " + name() + " model loads " + hf_families_ +
                     " checkpoints (model_type " + accepted + ")");
      return check.take();
    }
    check_hf_config(check, type, config);
    return check.take();
  }

 protected:
  // `path`: where the model's options sit in the config ("model"), for messages;
  // `hf_model_types`: the transformers model_type values it loads, described as `hf_families`
  // ("Llama, Mistral, Mixtral and Qwen2").
  TransformerLm(std::string path, std::vector<std::string> hf_model_types, std::string hf_families)
      : path_(std::move(path)), hf_model_types_(std::move(hf_model_types)), hf_families_(std::move(hf_families)) {}

  // The start of build(): refuses a second call and resolves the vocabulary size (the model's
  // `vocab_size` option, 0 when null).
  void begin_build(std::int64_t vocab_option, const ModelSetup& setup) {
    if (declared_) throw InternalError(std::string(name()) + ": build called twice");
    vocab_ = resolve_vocab_size(vocab_option, setup, "model (" + std::string(name()) + ")");
    store_.set_tensor_split(setup.tensor_rank, setup.tensor_size);
  }
  // The end of the declarations: allocates them unless setup.allocate is false. Returns whether
  // it allocated (the model then builds what needs the parameters: tables, constants).
  // The parameters go to setup.backend's memory when it has one (initialise them with
  // init_backend(): fill_normal and fill_constant then run its kernels on a device).
  bool finish_build(const ModelSetup& setup) {
    declared_ = true;
    if (!setup.allocate) return false;
    init_backend_ = setup.backend;
    store_.allocate(setup.backend ? setup.backend->device() : Device::host());
    return true;
  }
  // The backend build() was given (null: host memory), for initialize()'s fills.
  Backend* init_backend() const { return init_backend_; }
  bool built() const final { return store_.allocated(); }

  // The placement of the token embedding and of an untied output layer: split by vocabulary
  // rows over the tensor group.
  static TensorPlacement vocab_parallel() { return TensorPlacement::split_along(0, "vocab"); }
  VocabShard vocab_shard() const override {
    if (store_.tensor_size() == 1) return {};
    return {tensor_plan::split_begin(vocab_, store_.tensor_rank(), store_.tensor_size()), vocab_};
  }
  // The embedding of `tokens` from `table` (declared vocab_parallel()): a lookup, or under
  // tensor parallelism the vocabulary-parallel one.
  Tensor embed(Ops& ops, const Tensor& table, const Tensor& tokens) const {
    if (store_.tensor_size() == 1) return ops.embedding(table, tokens);
    return ops.embedding_vocab_parallel(table, tokens, vocab_shard().begin);
  }

  // The shape the FLOPs formula counts (training_flops_per_token).
  virtual TransformerShape transformer_shape() const = 0;
  // FLOPs per token the formula does not count (a mixture of experts' router).
  virtual double extra_flops_per_token() const { return 0.0; }
  // Its `remat` option, for the memory estimate.
  virtual RematPolicy remat_policy() const { return RematPolicy::none; }
  // Compares everything but model_type (one of hf_model_types, given as `model_type`); records
  // each difference with check.mismatch.
  virtual void check_hf_config(HfConfigCheck& check, const std::string& model_type, const Value& config) const = 0;

  const std::string& path() const { return path_; }

  // The sharding unit of each declared parameter: "layer N" for a name whose first numeric
  // component is N ("h.3.attn.c_attn.weight"), "embeddings" before the first layer, "output" after.
  std::vector<std::string> unit_names() const {
    std::vector<std::string> out;
    bool seen_block = false;
    for (const auto& [name, numel] : store_.declared()) {
      std::string unit;
      for (std::size_t at = 0; at < name.size() && unit.empty();) {
        const std::size_t dot = name.find('.', at);
        const std::string part = name.substr(at, dot == std::string::npos ? std::string::npos : dot - at);
        if (!part.empty() && part.find_first_not_of("0123456789") == std::string::npos) unit = "layer " + part;
        if (dot == std::string::npos) break;
        at = dot + 1;
      }
      if (unit.empty()) unit = seen_block ? "output" : "embeddings";
      seen_block |= unit != "embeddings" && unit != "output";
      out.push_back(unit);
    }
    return out;
  }

  ParameterStore store_;
  std::int64_t vocab_ = 0;

 private:
  std::string path_;
  std::vector<std::string> hf_model_types_;
  std::string hf_families_;
  bool declared_ = false;
  Backend* init_backend_ = nullptr;
};

}  // namespace loom::models
