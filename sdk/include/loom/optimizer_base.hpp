// What every optimizer plugin would otherwise write again around its arithmetic: the state
// tensors of each parameter ("slots"), their checkpoint names, state() and load_state() with
// their checks, the preconditions of init() and step(), the walk over the parameters that have a
// gradient, and parallel chunks whose boundaries do not depend on the thread count.
//
// A plugin derives from OptimizerBase when its update looks at a parameter as a whole (Muon's
// orthogonalised matrices, Adafactor's row and column statistics), or from ElementwiseOptimizer
// (elementwise_optimizer.hpp) when every element is updated on its own (AdamW, SGD, Lion): then
// it writes its options and a per-chunk update, and nothing else.
//
// Threads: init(), step(), state() and load_state() are called from one thread at a time. A
// plugin's update() runs on that thread and may fan out through parallel_chunks() or execution().
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/execution.hpp"
#include "loom/kinds/optimizer.hpp"
#include "loom/tensor.hpp"

namespace loom {

// One state tensor of one parameter, as a plugin declares it.
struct StateTensorSpec {
  std::string name;  // "exp_avg": saved as "exp_avg/<parameter>"
  Shape shape;       // zeroed at init()
};

class OptimizerBase : public Optimizer {
 public:
  ~OptimizerBase() override;

  // Checks the preconditions (called once, no null parameter, no two parameters of one name:
  // InternalError; parameters in memory the host cannot read while updates_device_memory() is
  // false: UserError), then allocates the tensors state_tensors() declares, zeroed, in the
  // parameter's memory (its device).
  void init(const OptimizerSetup& setup) final;
  // Checks the preconditions (after init(), lr >= 0 and not NaN, step >= 0: InternalError), calls
  // begin_step(), then update() for each parameter that has a gradient (contiguous), in order.
  void step(double lr, std::int64_t step) final;
  // The live state tensors, not copies, as "<slot>/<parameter>" in parameter then slot order: write
  // them out before the next step(). With lazy state, a parameter not yet updated has none.
  std::vector<std::pair<std::string, Tensor>> state() const final;
  // Checks everything, then copies; a refused state (UserError) leaves the optimizer unchanged.
  // Refused: a name of no state tensor (with the plugin's hint when it has one), a name given
  // twice, a tensor that is not f32 of the live tensor's shape, a missing tensor (with lazy state:
  // a parameter given some of its tensors but not all). InternalError before init().
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state) final;

 protected:
  // Elements per chunk of parallel_chunks(): up to 4 arrays x 32 Ki floats = 512 KiB touched per
  // chunk, large enough that scheduling a chunk costs far less than streaming it.
  static constexpr std::int64_t kChunk = std::int64_t{1} << 15;

  // One parameter and its state.
  struct ParameterState {
    Parameter* parameter = nullptr;
    bool weight_decay = true;
    ParameterRole role = ParameterRole::weight;
    std::vector<Tensor> tensors;  // as state_tensors() declared them for this parameter
    // With lazy state: whether the parameter has been updated since init() or had its tensors in
    // the loaded state. Without lazy state a checkpoint does not record it: do not rely on it.
    bool started = false;
  };

  // `name` is the optimizer's, for messages ("adamw"). With `lazy_state` (PyTorch's SGD momentum
  // buffer) a parameter's tensors exist only from its first update: state() leaves them out
  // before it, and a saved state may lack them (the parameter then starts afresh).
  OptimizerBase(std::string name, ExecutionContext& execution, bool lazy_state = false);

  // The state tensors `parameter` gets (none is fine). Called by init(), once per parameter.
  virtual std::vector<StateTensorSpec> state_tensors(const OptimizerParameter& parameter) const = 0;
  // Called by step() once its checks passed, before any update(): per-step constants go here.
  virtual void begin_step(double lr, std::int64_t step);
  // Updates one parameter from `grad` (contiguous, f32, of the parameter's shape).
  // `state.started` is false on the parameter's first update; the base sets it afterwards.
  virtual void update(ParameterState& state, const Tensor& grad) = 0;
  // Whether update() works on parameters in a device backend's memory (through backend kernels).
  // Default false: init() then refuses such parameters with a UserError (Muon, SOAP, Adafactor
  // today). ElementwiseOptimizer says true when its plugin gives an update rule.
  virtual bool updates_device_memory() const;
  // For a saved name that matches no state tensor: a plugin's explanation ("this optimizer has
  // momentum 0; ..."), or "" for the generic message.
  virtual std::string unexpected_state_hint(std::string_view name) const;

  // Runs chunk(begin, end) over [0, n) in chunks of kChunk elements (the last one shorter) on the
  // pool. The boundaries depend on n only, so a per-chunk reduction gives the same bits on any
  // number of threads. Bodies run concurrently: each must write only its own chunk's memory.
  void parallel_chunks(std::int64_t n, FunctionRef<void(std::int64_t, std::int64_t)> chunk) const;

  const std::string& optimizer_name() const { return name_; }
  ExecutionContext& execution() const { return execution_; }
  // The backend init() was given; InternalError when it was given none.
  Backend& backend() const;
  std::vector<ParameterState>& parameter_states() { return parameters_; }
  const std::vector<ParameterState>& parameter_states() const { return parameters_; }

 private:
  std::string name_;
  ExecutionContext& execution_;
  bool lazy_state_;
  bool initialised_ = false;
  Backend* backend_ = nullptr;
  std::vector<ParameterState> parameters_;
  std::vector<std::vector<std::string>> tensor_names_;  // [parameter][tensor]: checkpoint names
};

}  // namespace loom
