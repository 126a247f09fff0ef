// Autograd: parameters, the tape, and the operations a model composes.
//
// A model (a plugin) builds its forward pass from the operations of loom::Ops. When the Ops has
// a recording Tape and an input requires a gradient, each operation records one node on the
// tape with its hand-written backward; Tape::backward then walks the nodes in reverse and
// accumulates gradients into the Parameters. A model never writes a backward pass.
//
//   loom::Tape tape;
//   loom::Ops ops(backend, &tape);
//   Tensor h = ops.embedding(wte.tensor(), tokens);
//   h = ops.linear(h, w.tensor(), b.tensor(), {.activation = loom::Activation::gelu_tanh});
//   Tensor loss = ops.linear_cross_entropy(h, wte.tensor(), targets);
//   tape.backward(loss);              // w.grad(), b.grad(), wte.grad() now hold d loss / d param
//
// Gradients of parameters accumulate across backward passes until Parameter::zero_grad(), which
// is how gradient accumulation over micro-batches works. Gradients of intermediate tensors are
// freed as soon as the backward pass is past them.
//
// Cost model. Recording an operation places one node in the tape's arena and takes no heap
// allocation once the tape has been through one step; tensors come from the caching allocator.
// Backward kernels write a gradient buffer's first contribution in place (no zero-fill) and add
// later ones, and a gradient that passes through unchanged (a residual add) is handed on without
// a copy.
//
// Devices. An Ops computes on one backend, in that backend's memory (Backend::buffer_type(): the
// host for cpu and reference). Every tensor an operation takes must be there, parameters
// included, and its outputs and gradients are allocated there; a tensor from another device is
// refused (InternalError naming the operation and both devices): move data with Tensor::to.
// Ids, targets and positions are checked on the host, through a copy when they are on a device.
// An operation whose kernels the backend does not support for the data's dtype
// (Backend::supports_op) is refused with a UserError naming the operation, backend and dtype.
//
// Threads: a Tape and an Ops belong to one thread (the one running the step).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "loom/kinds/attention.hpp"
#include "loom/kinds/backend.hpp"
#include "loom/quantization.hpp"
#include "loom/tensor.hpp"

namespace loom {

// A trainable tensor and its gradient. Not copyable or movable: tensors refer to it by address,
// so keep parameters in stable storage (members, std::deque, unique_ptr).
class Parameter {
 public:
  // `value` must be a defined, contiguous f32 tensor; it may be a view into a larger buffer. The
  // gradient is allocated on the value's device.
  Parameter(std::string name, Tensor value);
  Parameter(const Parameter&) = delete;
  Parameter& operator=(const Parameter&) = delete;
  ~Parameter();

  const std::string& name() const { return name_; }
  // The value, to use in operations: it carries this parameter's autograd identity.
  const Tensor& tensor() const { return value_; }
  // The value without autograd identity, for the optimizer to update in place.
  Tensor data() const { return value_.detach(); }
  const Shape& shape() const { return value_.shape(); }

  // The accumulated gradient, same shape as the value; undefined until a backward pass has
  // produced one, and after zero_grad().
  Tensor grad() const { return has_grad_ ? grad_.detach() : Tensor(); }
  bool has_grad() const { return has_grad_; }
  // Forgets the gradient without touching memory: the next backward writes it afresh.
  void zero_grad() { has_grad_ = false; }
  // Uses `buffer` (same shape and device, contiguous f32; may be a view into a flat buffer that
  // an optimizer updates in one pass) as the gradient's storage from now on.
  void set_grad_buffer(Tensor buffer);
  // Declares that the gradient buffer holds a gradient written outside the tape: a data-parallel
  // reduction gives a parameter that no micro-batch of this process reached its peers' sum.
  void mark_grad_written() { has_grad_ = grad_.defined(); }

  // Parameters with requires_grad false are constants to the tape (frozen weights).
  bool requires_grad() const { return requires_grad_; }
  void set_requires_grad(bool v) { requires_grad_ = v; }

  // A frozen [rows, cols] weight stored in fewer bits (lora.base_dtype; quantization.hpp). Ops
  // linear, linear_cross_entropy and embedding read such a weight from stored(), dequantizing a
  // panel of rows at a time as they multiply or gather; every other operation refuses it.
  // set_stored gives the float32 value's memory back to the system (madvise: the whole pages
  // inside it; the tensor keeps its shape and address and reads zeros from then on) and freezes
  // the parameter. The value must be a host-visible matrix of the stored one's shape. Null (the
  // default): the value is the weight.
  const quant::StoredMatrix* stored() const { return stored_.get(); }
  void set_stored(std::shared_ptr<const quant::StoredMatrix> stored);

 private:
  friend struct detail::TensorAccess;
  std::string name_;
  Tensor value_;
  Tensor grad_;  // storage kept across zero_grad, so steps allocate no gradient buffers
  bool has_grad_ = false;
  bool requires_grad_ = true;
  std::uint32_t noted_epoch_ = 0;
  std::shared_ptr<const quant::StoredMatrix> stored_;  // the tape epoch that last noted this parameter's first use
};

namespace detail {
class TapeState;
struct CheckpointNode;
}  // namespace detail

// The record of one forward pass: nodes in an arena, replayed in reverse by backward.
class Tape {
 public:
  Tape();
  ~Tape();
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  // Whether operations record (true unless disabled or inside a NoGradGuard).
  bool recording() const;
  void set_enabled(bool enabled);

  // Back-propagates from `root`, a one-element tensor recorded on this tape (the loss), with
  // seed gradient `grad`, accumulating into every parameter reached; then clears the tape.
  void backward(const Tensor& root, float grad = 1.0f);
  // The same with a seed gradient of root's shape, for a non-scalar root. The seed is copied;
  // pass it as an rvalue (std::move) to let the backward pass use its buffer, and overwrite
  // it, when no other tensor refers to it.
  void backward(const Tensor& root, const Tensor& seed);
  void backward(const Tensor& root, Tensor&& seed);
  // Several roots at once, roots[i] seeded with seeds[i] (same shape): the gradients of all of
  // them are summed, in one pass over the tape.
  void backward(std::span<const Tensor> roots, std::span<const Tensor> seeds);
  // Called during the next backward() for each parameter the recorded operations used, as soon
  // as no operation left in the pass can add to its gradient (whether or not one reached it): a
  // data-parallel trainer starts reducing a bucket of gradients while the earlier layers' are
  // still being computed. Called on the thread running backward(); cleared with the tape. While
  // on_parameter_needed is set, it is called for the frozen parameters used too (no operation
  // left in the pass takes them).
  void on_gradient_ready(std::function<void(Parameter&)> callback);
  // Called during the next backward() for each parameter a recorded operation took (frozen ones
  // included), before the backward of each operation that took it, latest first, with whether
  // that operation's backward reads the parameter's values (false: it only writes the gradient,
  // as linear_cross_entropy's, which computed it in the forward pass, and embedding's): the run
  // layer's fully sharded data parallelism gathers a unit's weights again just before a backward
  // pass reads them, and gives its gradients memory. Set it before the forward pass: the uses
  // are noted while recording only when it is set. Called on the thread running backward();
  // cleared with the tape.
  void on_parameter_needed(std::function<void(Parameter& parameter, bool values)> callback);
  // Drops the recorded graph (and the activations it kept) without a backward pass. Tensors
  // recorded before a clear lose their identity: using one in a recorded operation afterwards
  // is an error.
  void clear();

  // Nodes recorded since the last clear.
  std::size_t size() const;

  detail::TapeState& state() { return *state_; }

 private:
  std::unique_ptr<detail::TapeState> state_;
};

// Disables recording on `tape` for its lifetime (evaluation, generation).
class NoGradGuard {
 public:
  explicit NoGradGuard(Tape& tape) : tape_(tape), previous_(tape.recording()) { tape_.set_enabled(false); }
  ~NoGradGuard() { tape_.set_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  Tape& tape_;
  bool previous_;
};

// A low-rank adapter (LoRA, Hu et al. 2021) on the weight of a linear operation: Ops::linear with
// that weight adds scale * dropout(x) A^T B^T to x W^T (before the bias's activation), whatever
// the weight's layout, and so does Ops::linear_cross_entropy to the logits of an adapted output
// head. The model does not know: the run layer attaches adapters to an Ops. An adapter may cover
// some of the output's features only, [rows_begin, rows_end): B then has rows_end - rows_begin
// rows and adds to those features alone (PEFT's q_proj adapter on a fused qkv weight).
struct LinearAdapter {
  Parameter* a = nullptr;       // [rank, in]
  Parameter* b = nullptr;       // [rows_end - rows_begin, rank]
  float scale = 1.0f;           // alpha / rank
  float dropout = 0.0f;         // on the adapter's input, from the Ops' dropout stream
  std::int64_t rows_begin = 0;  // the output features it adds to; rows_end 0: all of them
  std::int64_t rows_end = 0;
};
// Adapters by the parameter whose whole value is the weight (several on one weight add up).
using LinearAdapters = std::unordered_map<const Parameter*, std::vector<LinearAdapter>>;

// For its lifetime, every Ops constructed on this thread starts with `adapters` as its linear
// adapters (Ops::set_linear_adapters): how a LoRA run whose base weights are stored in fewer bits
// evaluates and samples through code that makes its own Ops (the adapters cannot be merged into a
// quantized weight). Scopes nest; the innermost wins.
class LinearAdaptersScope {
 public:
  explicit LinearAdaptersScope(const LinearAdapters* adapters);
  ~LinearAdaptersScope();
  LinearAdaptersScope(const LinearAdaptersScope&) = delete;
  LinearAdaptersScope& operator=(const LinearAdaptersScope&) = delete;

 private:
  const LinearAdapters* previous_;
};

struct LinearOptions {
  // false: weight is [out, in] (PyTorch nn.Linear, y = x W^T); true: weight is [in, out] (y = x W).
  bool weight_in_out = false;
  // Fused into the GEMM epilogue together with the bias.
  Activation activation = Activation::none;
};

// Rotary embedding frequencies. theta_i = base^(-2i / head_dim), optionally rescaled as Llama 3.1
// does: wavelengths longer than original_max_positions / low_freq_factor are divided by
// `factor`, shorter than original_max_positions / high_freq_factor kept, and interpolated
// smoothly in between.
struct RopeConfig {
  double base = 10000.0;
  bool interleaved = false;  // pairs (2i, 2i+1) instead of (i, i + head_dim/2)
  bool llama3_scaling = false;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_positions = 8192.0;
};

// cos and sin of position * theta_i for positions [0, max_positions): build once per model.
class RopeTable {
 public:
  RopeTable(const RopeConfig& config, std::int64_t head_dim, std::int64_t max_positions);
  const RopeConfig& config() const { return config_; }
  std::int64_t head_dim() const { return head_dim_; }
  std::int64_t max_positions() const { return max_positions_; }
  const Tensor& cos() const { return cos_; }  // [max_positions, head_dim / 2], on the host
  const Tensor& sin() const { return sin_; }
  // {cos, sin} in `type`'s memory: the host tables themselves for the host; for a device, a copy
  // made on first use and kept (for the last device asked). Used by one thread, like Ops.
  std::pair<Tensor, Tensor> tables_on(BufferType& type) const;
  // The (possibly rescaled) inverse frequencies theta_i, head_dim / 2 of them.
  const std::vector<double>& inverse_frequencies() const { return inv_freq_; }

 private:
  RopeConfig config_;
  std::int64_t head_dim_, max_positions_;
  std::vector<double> inv_freq_;
  Tensor cos_, sin_;
  mutable Tensor device_cos_, device_sin_;
};

// mean: one scalar, over the targets not ignored; sum: one scalar, their sum; none: one loss per
// target, shaped like the targets (0 where ignored), so that a caller can weigh rows (a
// sequence's summed log-probability, DPO) and seed the backward pass with a gradient per target.
enum class Reduction : std::uint8_t { mean, sum, none };

struct CrossEntropyOptions {
  std::int32_t ignore_index = -100;  // targets equal to it contribute nothing
  Reduction reduction = Reduction::mean;
  // linear_cross_entropy only: tokens per chunk of logits; 0 chooses so that one chunk of
  // logits takes at most 256 MiB.
  std::int64_t chunk_tokens = 0;
  // linear_cross_entropy only: when > 0, the logits are soft-capped (cap * tanh(logit / cap),
  // Gemma 2's final_logit_softcapping) before the softmax; the backward pass includes the cap.
  // Computed by the backend's softcap kernels.
  float logit_softcap = 0.0f;
  // linear_cross_entropy only, vocabulary parallelism (Ops::tensor_group): when vocab_size > 0,
  // the weight holds rows [vocab_begin, vocab_begin + rows) of a whole output layer of
  // vocab_size rows split over the tensor group, and targets index the whole vocabulary. Each
  // member computes its own logits only; the log-sum-exp and the targets' logits are combined
  // by all-reduces of a few values per token, so the whole logits never exist anywhere, and the
  // loss is the same on every member. x's gradient is this member's part: put x through
  // Ops::tensor_copy, whose backward pass sums the parts. 0: the weight is the whole vocabulary.
  std::int64_t vocab_size = 0;
  std::int64_t vocab_begin = 0;
};

// Activation checkpointing (remat): what a checkpointed segment keeps for its backward pass.
enum class RematPolicy : std::uint8_t {
  none,       // everything, as without checkpointing
  full,       // its inputs only; the whole segment runs again in the backward pass
  save_dots,  // its inputs and the outputs of its matrix products (linear, matmul); the rest
              // (norms, activations, attention) runs again, the products are not recomputed
};

// A mixture of experts' routing decision (Ops::route_top_k, Backend::route_top_k), i32 tensors in
// the backend's memory, none of them recorded.
struct TopKRouting {
  Tensor chosen;  // [tokens, k]: t experts + e, the chosen logits' flat indices
  Tensor slots;   // [tokens, k]: each choice's row in the member's experts' outputs
  Tensor sorted;  // [tokens k]: the tokens, expert after expert, each's in token order
  Tensor counts;  // [experts]: the tokens each expert got
};

class Ops;
class CollectiveGroup;
// A segment of a forward pass for Ops::checkpoint: its outputs from its inputs.
using Segment = std::function<std::vector<Tensor>(Ops& ops, std::span<const Tensor> inputs)>;

// The operations. Each validates its inputs (an InternalError names the operation and the
// mismatch), computes with the backend, and records a node when the tape is recording and an
// input requires a gradient. Outputs are new contiguous tensors in the backend's memory.
class Ops {
 public:
  explicit Ops(Backend& backend, Tape* tape = nullptr);

  Backend& backend() const { return *backend_; }
  // Where the operations' inputs must be and their outputs are: the backend's buffer type.
  BufferType& buffer_type() const { return *buffers_; }
  Device device() const { return buffers_->device(); }
  Tape* tape() const { return tape_; }
  bool recording() const;

  // Dropout is active only in training mode (the default).
  void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }
  // Starts the dropout stream of one step: the n-th dropout call after this uses
  // stream_key(seed, 3, step) mixed with n, so a step's masks depend only on seed and step.
  void set_dropout_seed(std::uint64_t seed, std::uint64_t step);
  // z-loss (PaLM; MaxText's z_loss_multiplier): cross_entropy and linear_cross_entropy add
  // weight * lse^2 per counted target to the loss they return (lse = log sum exp of the row's
  // logits), with its gradient, pushing log Z towards 0. 0 (the default): none. The trainer sets
  // trainer.z_loss_weight. Computed by the backend's loss kernels (BackendOp::loss).
  void set_z_loss_weight(float weight) { z_loss_weight_ = weight; }
  float z_loss_weight() const { return z_loss_weight_; }

  // Low-rank adapters: linear() and linear_cross_entropy() with a weight that is a whole parameter
  // listed in `adapters` add its adapters' products (linear_cross_entropy then computes the
  // logits whole, not in chunks). The table must outlive this Ops; null (the default): none.
  void set_linear_adapters(const LinearAdapters* adapters) { adapters_ = adapters; }
  // Called by linear() for each weight that is a whole parameter, with its layout: how the run
  // layer finds the weights a model multiplies (the targets of adapters) without the model's help.
  // (linear_cross_entropy does not call it: a model's loss() shows the weights inside the model,
  // its logits() the output head too.)
  void set_linear_observer(std::function<void(Parameter& weight, bool weight_in_out)> observer) {
    linear_observer_ = std::move(observer);
  }
  // Called at the start of every operation, before it reads them, for each parameter among its
  // tensor inputs (views of one included): the run layer's fully sharded data parallelism gathers
  // a unit's weights when the model first takes one of them, so that a model declares its units
  // (Model::sharding_units) and never communicates. Carried into the recomputation of
  // checkpointed segments. Null (the default): none.
  void set_parameter_observer(std::function<void(Parameter&)> observer) { parameter_observer_ = std::move(observer); }
  const std::function<void(Parameter&)>& parameter_observer() const { return parameter_observer_; }

  // ---- Linear algebra
  // x [..., in] (any row stride), weight per options, bias [out] or undefined -> [..., out].
  Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, const LinearOptions& options = {});
  // a [..., m, k] (or [..., k, m] when transpose_a), b [..., k, n] (or [..., n, k]) with equal
  // leading (batch) dimensions, or b of rank 2 shared by every batch -> [..., m, n].
  Tensor matmul(const Tensor& a, const Tensor& b, bool transpose_a = false, bool transpose_b = false);

  // ---- Lookup
  // table [vocab, dim], ids i32 of any shape -> [ids..., dim]. Ids out of range: InternalError.
  Tensor embedding(const Tensor& table, const Tensor& ids);
  // embedding of ids an operation's contract puts in [0, vocab) (route_top_k's token lists and
  // slots): not range-checked, because checking ids in a device's memory costs a copy to the
  // host per lookup (a mixture of experts makes several per layer).
  Tensor embedding_of_valid_ids(const Tensor& table, const Tensor& ids);

  // ---- Normalisation over the last dimension
  Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps = 1e-5f);
  Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps = 1e-6f);
  // {residual + x, layer_norm(residual + x)}: the pre-norm block's residual add and the next
  // norm, fused. Both results may be used (the sum is the new residual stream).
  std::pair<Tensor, Tensor> add_layer_norm(const Tensor& residual, const Tensor& x, const Tensor& weight,
                                           const Tensor& bias, float eps = 1e-5f);
  std::pair<Tensor, Tensor> add_rms_norm(const Tensor& residual, const Tensor& x, const Tensor& weight,
                                         float eps = 1e-6f);

  // ---- Pointwise
  Tensor gelu(const Tensor& x);  // tanh form
  Tensor silu(const Tensor& x);
  Tensor swiglu(const Tensor& gate, const Tensor& up);  // silu(gate) * up
  Tensor add(const Tensor& a, const Tensor& b);         // same shapes: the residual add
  Tensor scale(const Tensor& x, float alpha);
  // a * b elementwise (same shapes): GeGLU's gate times up, a mixture of experts' gate weights.
  Tensor mul(const Tensor& a, const Tensor& b);
  // cap * tanh(x / cap), cap > 0: Gemma 2's soft-capping of logits.
  Tensor softcap(const Tensor& x, float cap);
  // Softmax over the last dimension (a mixture of experts' router).
  Tensor softmax(const Tensor& x);
  // log(sum(exp(x))) over the last dimension: x [..., n] -> [...] (a router's z-loss).
  Tensor logsumexp(const Tensor& x);
  // The parts (equal extents past the first dimension) one after another along the first.
  Tensor concat(std::span<const Tensor> parts);
  // The sum of every element: a scalar (auxiliary losses).
  Tensor sum(const Tensor& x);
  // mul, softcap, softmax, logsumexp and sum compute through the backend's kernel groups of the
  // same names (concat through the buffer type's copies), on whatever device the backend has.
  // Zeroes each element with probability p and scales the rest by 1/(1-p); the identity when
  // not training or p == 0. Deterministic: see set_dropout_seed.
  Tensor dropout(const Tensor& x, float p);

  // ---- Mixture of experts
  // The top-k routing of logits [tokens, experts] (f32) for this member's experts [first, last)
  // (Backend::route_top_k, kernel group routing): which experts each token chose, their
  // expert-sorted order and counts, computed where the logits are. Not differentiable (the
  // gate weights are gathered from the logits by embedding, which is).
  TopKRouting route_top_k(const Tensor& logits, std::int64_t k, std::int64_t first, std::int64_t last);

  // ---- Positions
  // x [batch, seq, heads, head_dim] (tokens may be strided: a slice of a fused qkv) rotated by
  // table; positions i32 [batch, seq] or undefined (then position_offset + t).
  Tensor rope(const Tensor& x, const RopeTable& table, const Tensor& positions = {}, std::int64_t position_offset = 0);

  // ---- Losses (each returns a scalar tensor, or with Reduction::none one loss per target)
  // logits [..., vocab] (row-strided), targets i32 [...]. Softmax and loss in one streaming
  // pass per row; the backward pass writes the gradient into the logits buffer itself when this
  // node holds the only reference to it (drop your own handle to the logits to get that),
  // else into a new buffer.
  Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& options = {});
  // cross_entropy(linear(x, weight), targets) without ever holding all the logits: chunks of
  // tokens are projected, reduced to their loss and, when recording, turned into the input and
  // weight gradients at once (kept for the backward pass). weight is [vocab, dim] (tied
  // embeddings use the embedding table). With Reduction::none the gradients depend on the seed
  // of each target: the backward pass projects the chunks again (one more GEMM than the scalar
  // reductions) instead.
  Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& targets,
                              const CrossEntropyOptions& options = {});

  // ---- Attention, delegated to an attention kernel (kinds/attention.hpp)
  // q [batch, q_len, q_heads, head_dim], k and v [batch, kv_len, kv_heads, head_dim] (token-
  // strided views allowed), segment ids i32 [batch, len] or undefined -> [batch, q_len, q_heads,
  // head_dim]. The kernel's device() must be the backend's.
  Tensor attention(AttentionKernel& kernel, const Tensor& q, const Tensor& k, const Tensor& v,
                   const AttentionParams& params = {}, const Tensor& q_segments = {}, const Tensor& kv_segments = {});

  // ---- Layout
  // A contiguous copy when x is not contiguous (recorded, so gradients flow), else x itself.
  Tensor contiguous(const Tensor& x);

  // ---- Tensor parallelism (trainer.mesh's tensor axis; parallel_plan.hpp, docs/distributed.md)
  // The group of ranks that split the model's matrices between them, set by the run layer before
  // the model runs (the group outlives this Ops); null, the default: none. Every member runs the
  // same operations in the same order on the same rows, so the collectives below line up; each
  // is recorded like any operation (its backward pass communicates too, and a checkpointed
  // segment's recomputation communicates again). Host-visible memory only.
  void set_tensor_group(CollectiveGroup* group) { tensor_group_ = group; }
  CollectiveGroup* tensor_group() const { return tensor_group_; }
  int tensor_rank() const;  // this member's rank in the group; 0 without one
  int tensor_size() const;  // the group's size; 1 without one
  // Megatron's f: a copy of x; backward, the sum over the members of the gradient (all-reduce).
  // Before the column-parallel layers that read an input every member holds whole.
  Tensor tensor_copy(const Tensor& x);
  // Megatron's g: the sum over the members of x (all-reduce); backward, the gradient itself.
  // After a row-parallel layer's partial products.
  Tensor tensor_reduce(const Tensor& x);
  // The members' x (each the same shape) concatenated along `dim` in rank order; backward, the
  // sum over the members of this member's slice of the gradient (reduce-scatter).
  Tensor tensor_all_gather(const Tensor& x, int dim);
  // The sum over the members of x, and of it this member's slice along `dim` (whose extent the
  // group's size divides); backward, the all-gather of the gradient.
  Tensor tensor_reduce_scatter(const Tensor& x, int dim);
  // Vocabulary-parallel embedding: `table` [rows, dim] holds rows [vocab_begin, vocab_begin +
  // rows) of the whole table, split over the group; ids index the whole vocabulary. A member's
  // lookup is zero for the ids outside its rows, and the members' lookups are summed (as
  // tensor_reduce), so every member gets the whole result; the table's gradient is its rows'.
  Tensor embedding_vocab_parallel(const Tensor& table, const Tensor& ids, std::int64_t vocab_begin);

  // ---- Activation checkpointing
  // segment(ops, inputs). With policy full or save_dots while recording, the segment's
  // operations are not recorded: one node keeps its inputs (and with save_dots the outputs of its
  // matrix products), and in the backward pass runs the segment again on a tape of its own, with
  // the same dropout masks, and back-propagates through it. Gradients equal those of the plain
  // run (bit for bit, the operations being deterministic). The segment must compute the same
  // operations each time from its inputs and parameters, and return new tensors (outputs of
  // operations, not its inputs or views of them).
  std::vector<Tensor> checkpoint(std::span<const Tensor> inputs, const Segment& segment, RematPolicy policy);

 private:
  friend struct detail::CheckpointNode;
  Tensor lookup(const Tensor& table, const Tensor& ids, bool check_ids);
  Tensor linear_product(const Tensor& x, const Tensor& weight, const Tensor& bias, const LinearOptions& options);
  Tensor adapted_linear(const std::vector<LinearAdapter>& adapters, const Tensor& x, const Tensor& weight,
                        const Tensor& bias, const LinearOptions& options);
  // The parameter observer's call for an operation's inputs.
  void observe(std::initializer_list<const Tensor*> inputs) const {
    if (parameter_observer_) observe_parameters(inputs);
  }
  void observe_parameters(std::initializer_list<const Tensor*> inputs) const;
  void observe_parameters(std::span<const Tensor> inputs) const;
  const LinearAdapters* adapters_ = nullptr;
  std::function<void(Parameter&, bool)> linear_observer_;
  std::function<void(Parameter&)> parameter_observer_;
  // save_dots: where a checkpointed forward keeps the matrix products' outputs, and where the
  // recomputation takes them from instead of computing them.
  std::vector<Tensor>* remat_save_ = nullptr;
  const std::vector<Tensor>* remat_replay_ = nullptr;
  std::size_t remat_next_ = 0;
  Backend* backend_;
  BufferType* buffers_;
  Tape* tape_;
  bool training_ = true;
  std::uint64_t dropout_seed_ = 0;
  std::uint64_t dropout_step_ = 0;
  std::uint64_t dropout_calls_ = 0;
  float z_loss_weight_ = 0.0f;
  CollectiveGroup* tensor_group_ = nullptr;
};

}  // namespace loom
