// The `optimizer` kind: updates parameters from their gradients.
//
// The trainer computes gradients (accumulated over micro-batches), clips them to the global
// norm, then calls step() with the scheduled learning rate. The optimizer updates each
// parameter's data in place (Parameter::data()) and keeps its own state (moments) in tensors
// from the core's allocator. Calls come from the thread running the step; an optimizer may
// parallelise through the ExecutionContext it was created with.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/autograd.hpp"
#include "loom/component.hpp"

namespace loom {

struct OptimizerParameter {
  Parameter* parameter = nullptr;
  bool weight_decay = true;  // false for norms, biases and embeddings unless configured
};

class Optimizer : public Component {
 public:
  static constexpr std::string_view kind = "optimizer";
  ~Optimizer() override;

  // The peak learning rate (`learning_rate`), which the schedule shapes.
  virtual double learning_rate() const = 0;
  // The global gradient-norm clip the trainer applies before step() (`max_grad_norm`); 0: none.
  virtual double max_grad_norm() const = 0;

  // Takes the parameters it will update and allocates its state (zeroed). Called once.
  virtual void init(const std::vector<OptimizerParameter>& parameters) = 0;
  // Applies one update with learning rate `lr`. `step` counts the updates applied before this
  // one (0 for the first), for bias corrections. Parameters without a gradient are skipped.
  virtual void step(double lr, std::int64_t step) = 0;

  // The state, as named tensors ("exp_avg/h.0.attn.c_attn.weight"), for checkpoints.
  // load_state() of what state() returned restores the optimizer bit for bit.
  virtual std::vector<std::pair<std::string, Tensor>> state() const = 0;
  virtual void load_state(const std::vector<std::pair<std::string, Tensor>>& state) = 0;
};

}  // namespace loom
