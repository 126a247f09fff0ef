// Core-internal: the tape's state, its nodes, and the backward pass as nodes see it.
//
// Recording an operation:
//   if (TapeState* rec = recording_state(tape, {&x, &w})) {
//     auto* node = rec->record<LinearNode>(backend);   // placement-new in the tape's arena
//     node->x = x;                                       // saved tensors (keep storage alive)
//     node->dx = rec->target(x);                         // where x's gradient goes
//     rec->add_output(*node, y);                         // y now carries the node's identity
//   }
// Backward: the tape calls node->backward(pass) in reverse order of recording, for nodes with
// at least one output gradient, then destroys the node (releasing what it saved).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <new>
#include <span>
#include <utility>
#include <vector>

#include "loom/autograd.hpp"

namespace loom::detail {

struct TensorAccess {
  static std::uint64_t var(const Tensor& t) { return t.var_; }
  static void set_var(Tensor& t, std::uint64_t v) { t.var_ = v; }
  static Parameter* param(const Tensor& t) { return t.param_; }
  static void set_param(Tensor& t, Parameter* p) { t.param_ = p; }
  static Storage* storage(const Tensor& t) { return t.storage_; }
  // A tensor over `like`'s storage with the given geometry and no autograd identity.
  static Tensor view_of(const Tensor& like, std::int64_t offset, const Shape& shape, const Strides& strides);
  static Tensor& param_grad(Parameter& p) { return p.grad_; }
  static bool& param_has_grad(Parameter& p) { return p.has_grad_; }
  static std::uint32_t& param_noted_epoch(Parameter& p) { return p.noted_epoch_; }
  static const Tensor& param_value(const Parameter& p) { return p.value_; }
  static Tensor& param_value_mut(Parameter& p) { return p.value_; }
};

// Where an input's gradient goes: a parameter or a tape variable (the base), and the input's
// geometry relative to that base.
struct GradTarget {
  Parameter* param = nullptr;
  std::uint32_t var = 0;  // 0: none
  std::int64_t offset = 0;
  Shape shape;
  Strides strides{};
  bool covers_base = false;  // the whole base, contiguous: a first gradient may be written in place
  bool active() const { return param != nullptr || var != 0; }
  // Whether both gradients land in one buffer.
  bool same_base(const GradTarget& o) const { return active() && param == o.param && var == o.var; }
};

class BackwardPass;

class Node {
 public:
  explicit Node(Backend& backend) : backend(&backend) {}
  virtual ~Node() = default;
  virtual void backward(BackwardPass& pass) = 0;
  virtual const char* name() const = 0;

  Backend* backend;
  std::uint32_t first_output = 0;
  std::uint32_t num_outputs = 0;
};

// A bump allocator whose chunks survive clear(), so a tape allocates only in its first step.
class Arena {
 public:
  void* allocate(std::size_t bytes, std::size_t alignment);
  void reset();
  std::size_t chunks() const { return chunks_.size(); }

 private:
  static constexpr std::size_t chunk_bytes = 64 * 1024;
  struct Chunk {
    std::unique_ptr<std::byte[]> data;
    std::size_t size;
  };
  std::vector<Chunk> chunks_;
  std::size_t current_ = 0;  // chunk being filled
  std::size_t used_ = 0;     // bytes used in it
};

struct Variable {
  Tensor grad;  // contiguous, `shape`; undefined until a gradient arrives
  Shape shape;
  std::int64_t base_offset = 0;
  BufferType* type = nullptr;  // the output's memory, where its gradient goes too
  Backend* backend = nullptr;  // the backend of the node that made it
};

class TapeState {
 public:
  TapeState();
  ~TapeState();

  bool enabled = true;

  std::uint32_t epoch() const { return epoch_; }
  // Whether `t` takes part in recording: an active parameter or a live variable of this tape.
  // A variable of an older epoch is an error (InternalError naming `op`).
  bool requires_grad(const Tensor& t, const char* op) const;
  GradTarget target(const Tensor& t) const;

  template <class N, class... Args>
  N* record(Args&&... args) {
    void* memory = arena_.allocate(sizeof(N), alignof(N));
    N* node = new (memory) N(std::forward<Args>(args)...);
    nodes_.push_back(node);
    node->first_output = static_cast<std::uint32_t>(vars_.size());
    return node;
  }
  // Gives `out` (a fresh, contiguous tensor) the identity of the next output of `node`.
  void add_output(Node& node, Tensor& out);

  // Seeds each root with its gradient (seeds[i], or a tensor of scalar_seed when seeds is
  // empty), runs every node backward in reverse order, then clears the tape. With adopt_seeds,
  // a seed nobody else refers to becomes the root's gradient buffer without a copy.
  void backward(std::span<const Tensor> roots, std::span<Tensor> seeds, float scalar_seed, bool adopt_seeds);
  void clear();
  std::size_t size() const { return nodes_.size(); }
  std::vector<Variable>& variables() { return vars_; }

  // Notes the parameters among an operation's inputs before its node is recorded: a parameter's
  // gradient is complete once the backward pass has gone past the first node that used it.
  void note_inputs(std::span<const Tensor* const> inputs);
  std::function<void(Parameter&)> on_gradient_ready;
  // While set, every parameter an operation takes is noted in uses_ (Tape::on_parameter_needed).
  std::function<void(Parameter&, bool)> on_parameter_needed;
  // After recording a node: its backward pass does not read `t`'s values (a gradient computed in
  // the forward pass, an embedding's scatter-add), only writes its gradient.
  void values_not_needed(const Tensor& t);
  // While set (by Ops::checkpoint, with recording disabled), the parameters that operations
  // take (frozen ones too) are collected here instead of recorded: the checkpoint's node is
  // their first use and their last.
  std::vector<Parameter*>* parameter_collector = nullptr;

 private:
  std::uint32_t epoch_;
  std::vector<std::pair<std::uint32_t, Parameter*>> first_uses_;  // in recording order
  struct Use {
    std::uint32_t node;
    Parameter* parameter;
    bool values;  // whether the node's backward reads the parameter's values
  };
  std::vector<Use> uses_;  // every use, in recording order
  Arena arena_;
  std::vector<Node*> nodes_;
  std::vector<Variable> vars_;  // index 0 unused
};

// The tape's state when operations on `inputs` must be recorded, else nullptr.
TapeState* recording_state(Tape* tape, std::initializer_list<const Tensor*> inputs, const char* op);
TapeState* recording_state(Tape* tape, std::span<const Tensor* const> inputs, const char* op);

// Gradient plumbing for Node::backward.
class BackwardPass {
 public:
  BackwardPass(TapeState& state, Backend& backend) : state_(state), backend_(backend) {}

  // The gradient of output i (undefined when no gradient reached it: treat as zero).
  const Tensor& output_grad(const Node& node, int i) const;
  // The same, moved out of the tape: the node may hand it on with give().
  Tensor take_output_grad(const Node& node, int i);

  // The buffer for `target`'s gradient, shaped like the input: write it with
  // accumulate = `accumulate` (false: the first contribution, written in place). `shared` says
  // that one kernel call writes this gradient together with another of the same base (a
  // kernel with two gradient outputs applied to one tensor twice): a first contribution is
  // then zero-filled and accumulated, since the kernel's write order is unspecified.
  struct Buffer {
    Tensor tensor;
    bool accumulate = false;
  };
  Buffer grad(const GradTarget& target, bool shared = false);

  // Adds `g` (shaped like the input) to the target's gradient; never keeps a reference to g.
  void accumulate(const GradTarget& target, const Tensor& g, float alpha = 1.0f);
  // Adds `g` to the target's gradient, adopting g's buffer as the gradient when this is the
  // first contribution to a whole variable (no copy). g must not be used by the caller after.
  void give(const GradTarget& target, Tensor&& g);

  Backend& backend() { return backend_; }
  // A new contiguous f32 tensor in the backend's memory, for scratch and gradients a node builds.
  Tensor empty(const Shape& shape) { return Tensor::empty(shape, DType::f32, backend_.buffer_type()); }

 private:
  TapeState& state_;
  Backend& backend_;
};

}  // namespace loom::detail
