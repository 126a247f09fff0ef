// The base of an optimizer whose update treats every element on its own (AdamW, SGD, Lion): each
// parameter has the same named slots, shaped like it ("exp_avg", "exp_avg_sq"), and the update
// is one pass over a chunk of the parameter, its gradient and its slots. The plugin writes its
// options, its per-step constants (begin_step) and its arithmetic: an update rule the SDK knows
// (update_rule(), below) or its own update_chunk(); OptimizerBase does the rest.
//
// Parameters in a device backend's memory (backend.hpp, BackendOp::optimizer): the update then
// runs as the backend's elementwise_update kernel, which takes the arithmetic as a rule and its
// constants (training_kernels.hpp: adamw, sgd, lion). A plugin whose update is one of those rules
// says so in update_rule() and needs no update_chunk(): the default one runs that rule on the
// host (apply_elementwise_update), so that host and device run one arithmetic. A plugin without a
// rule writes update_chunk() and updates host memory only: on a device backend its init() throws a
// UserError naming the optimizer and the backend.
//
//   class Sgd final : public loom::ElementwiseOptimizer {
//    public:
//     Sgd(const loom::Options& o, loom::ExecutionContext& e)
//         : ElementwiseOptimizer("sgd", e, {"momentum_buffer"}), ... {}
//    private:
//     void begin_step(double lr, std::int64_t) override { lr_ = static_cast<float>(lr); }
//     void update_chunk(const Chunk& c) const override { /* c.parameter[i], c.grad[i], c.slots[0][i] */ }
//   };
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loom/optimizer_base.hpp"
#include "loom/training_kernels.hpp"

namespace loom {

class ElementwiseOptimizer : public OptimizerBase {
 public:
  static constexpr std::size_t kMaxSlots = 4;
  ~ElementwiseOptimizer() override;
  // One float32 per slot.
  double state_bytes_per_parameter() const override { return 4.0 * static_cast<double>(slots_.size()); }
  bool elementwise() const final { return true; }

 protected:
  // Elements [0, size) of one chunk of one parameter.
  struct Chunk {
    float* parameter;
    const float* grad;
    std::array<float*, kMaxSlots> slots;  // in the order the constructor named them; unused: null
    std::int64_t size;
    bool weight_decay;  // the parameter's weight-decay mask
    bool first;         // the parameter's first update (see ParameterState::started)
  };

  // `slots`: the names of each parameter's state tensors (at most kMaxSlots), each shaped like the
  // parameter; `lazy_state` as in OptimizerBase.
  ElementwiseOptimizer(std::string name, ExecutionContext& execution, std::vector<std::string> slots,
                       bool lazy_state = false);

  // Updates the chunk's elements in place. Called concurrently for disjoint chunks of a parameter
  // (boundaries independent of the thread count), after begin_step(): read members, write only
  // the chunk. The default applies update_rule(chunk.weight_decay, chunk.first) (compiled with the
  // optimizer kernels' host fallback, so with its roundings); a plugin without a rule overrides it.
  virtual void update_chunk(const Chunk& chunk) const;

  // The update of a parameter with this weight-decay mask on its first update (`first`) or a
  // later one, as a rule a backend kernel runs (called after begin_step(), from step()'s thread);
  // the default, no rule, keeps the optimizer on host memory.
  virtual std::optional<ElementwiseUpdate> update_rule(bool weight_decay, bool first) const;

 private:
  std::vector<StateTensorSpec> state_tensors(const OptimizerParameter& parameter) const final;
  bool updates_device_memory() const final;
  void update(ParameterState& state, const Tensor& grad) final;

  std::vector<std::string> slots_;
};

}  // namespace loom
