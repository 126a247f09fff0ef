// The `optimizer` kind: updates parameters from their gradients.
//
// The trainer computes gradients (accumulated over micro-batches), clips them to the global
// norm, then calls step() with the scheduled learning rate. The optimizer updates each
// parameter's data in place (Parameter::data()) and keeps its own state (moments) in tensors
// from the core's allocator. Calls come from the thread running the step; an optimizer may
// parallelise through the ExecutionContext it was created with, and compute through the backend
// init() hands it.
//
// The peak learning rate and the gradient clip are options of every optimizer section
// (`optimizer.learning_rate`, `optimizer.max_grad_norm`), but they belong to the run layer: the
// schedule shapes the rate and the trainer clips. An optimizer plugin neither declares nor reads
// them; it receives the scheduled rate in step(), and may suggest its own default peak rate with
// OptionSchema::section_default("learning_rate", ...) (Lion wants a smaller one than AdamW).
//
// Most optimizers derive from loom::OptimizerBase or loom::ElementwiseOptimizer
// (optimizer_base.hpp, elementwise_optimizer.hpp), which implement this interface's checks,
// state naming and checkpoint matching once.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/autograd.hpp"
#include "loom/component.hpp"
#include "loom/kinds/backend.hpp"
#include "loom/kinds/model.hpp"

namespace loom {

struct OptimizerParameter {
  Parameter* parameter = nullptr;
  bool weight_decay = true;                    // false for norms, biases and embeddings unless configured
  ParameterRole role = ParameterRole::weight;  // as the model declared it (Muon treats embeddings apart)
};

// What init() receives.
struct OptimizerSetup {
  std::vector<OptimizerParameter> parameters;
  // The run's backend, for optimizers that compute more than elementwise updates (Muon's
  // Newton-Schulz products go through its GEMM). Not owned; outlives the optimizer's use of it.
  Backend* backend = nullptr;
};

class Optimizer : public Component {
 public:
  static constexpr std::string_view kind = "optimizer";
  ~Optimizer() override;

  // Takes the parameters it will update and allocates its state (zeroed). Called once.
  virtual void init(const OptimizerSetup& setup) = 0;
  // Applies one update with learning rate `lr`. `step` counts the updates applied before this
  // one (0 for the first), for bias corrections. Parameters without a gradient are skipped.
  virtual void step(double lr, std::int64_t step) = 0;

  // The state, as named tensors ("exp_avg/h.0.attn.c_attn.weight"), for checkpoints.
  // load_state() of what state() returned restores the optimizer bit for bit; a state it refuses
  // (UserError: a name of no parameter, a wrong shape) leaves the optimizer unchanged.
  virtual std::vector<std::pair<std::string, Tensor>> state() const = 0;
  virtual void load_state(const std::vector<std::pair<std::string, Tensor>>& state) = 0;

  // The bytes of state it keeps per trained parameter value, for the trainer's start-up memory
  // estimate (asked before init(), on the options alone). Default 8: two float32 moments, as AdamW.
  // An optimizer whose state depends on shapes (SOAP's preconditioners) gives its typical figure.
  virtual double state_bytes_per_parameter() const { return 8.0; }
  // Whether every element of a parameter is updated from its own gradient and state alone (AdamW,
  // SGD, Lion: ElementwiseOptimizer). Then fully sharded data parallelism hands the optimizer each
  // rank's flat slices of the parameters as parameters of their own; otherwise (Muon, SOAP,
  // Adafactor) it hands each parameter whole to one rank (docs/distributed.md).
  virtual bool elementwise() const { return false; }
};

}  // namespace loom
