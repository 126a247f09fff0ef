// OptimizerBase and ElementwiseOptimizer: the checks, state naming and checkpoint matching every
// optimizer plugin shares. Nothing here touches a parameter's value: the arithmetic (and its
// rounding, which each plugin pins with -ffp-contract=off) stays in the plugins.
#include "loom/optimizer_base.hpp"

#include <algorithm>
#include <map>
#include <set>

#include "loom/elementwise_optimizer.hpp"
#include "loom/error.hpp"
#include "loom/kinds/backend.hpp"

namespace loom {

OptimizerBase::OptimizerBase(std::string name, ExecutionContext& execution, bool lazy_state)
    : name_(std::move(name)), execution_(execution), lazy_state_(lazy_state) {}

OptimizerBase::~OptimizerBase() = default;

void OptimizerBase::begin_step(double, std::int64_t) {}

bool OptimizerBase::updates_device_memory() const {
  return false;
}

std::string OptimizerBase::unexpected_state_hint(std::string_view) const {
  return "";
}

Backend& OptimizerBase::backend() const {
  if (!backend_) throw InternalError(name_ + ": init() was given no backend, and this optimizer computes through one");
  return *backend_;
}

void OptimizerBase::init(const OptimizerSetup& setup) {
  if (initialised_) throw InternalError(name_ + ": init() called twice");
  std::set<std::string, std::less<>> names;
  for (const auto& op : setup.parameters) {
    if (op.parameter == nullptr) throw InternalError(name_ + ": init() got a null parameter");
    if (!names.insert(op.parameter->name()).second)
      throw InternalError(name_ + ": two parameters are named '" + op.parameter->name() +
                          "'; optimizer state is keyed by name");
  }
  for (const auto& op : setup.parameters)
    if (!op.parameter->tensor().is_host_visible() && !updates_device_memory())
      throw UserError(name_ + ": the parameters are in " + op.parameter->tensor().device().str() + " memory" +
                      (setup.backend ? " (backend '" + std::string(setup.backend->name()) + "')" : std::string()) +
                      ", but this optimizer updates host memory only; choose adamw, sgd or lion, or a backend "
                      "whose memory is the host's, such as cpu");
  std::vector<ParameterState> parameters;
  std::vector<std::vector<std::string>> tensor_names;
  for (const auto& op : setup.parameters) {
    ParameterState state{op.parameter, op.weight_decay, op.role, {}, false};
    std::vector<std::string> keys;
    for (const StateTensorSpec& spec : state_tensors(op)) {
      // In the parameter's memory: a device backend's optimizer state never visits the host.
      const Device device = op.parameter->tensor().device();
      state.tensors.push_back(device.is_host() ? Tensor::zeros(spec.shape)
                                               : Tensor::zeros(spec.shape, DType::f32, device));
      keys.push_back(spec.name + "/" + op.parameter->name());
    }
    parameters.push_back(std::move(state));
    tensor_names.push_back(std::move(keys));
  }
  parameters_ = std::move(parameters);
  tensor_names_ = std::move(tensor_names);
  backend_ = setup.backend;
  initialised_ = true;
}

void OptimizerBase::step(double lr, std::int64_t step) {
  if (!initialised_) throw InternalError(name_ + ": step() before init()");
  if (!(lr >= 0.0) || step < 0)
    throw InternalError(name_ + ": step(lr = " + std::to_string(lr) + ", step = " + std::to_string(step) +
                        "): the learning rate must be >= 0 and the step >= 0");
  begin_step(lr, step);
  for (ParameterState& state : parameters_) {
    if (!state.parameter->has_grad()) continue;
    const Tensor grad = state.parameter->grad();
    if (!grad.is_contiguous())
      throw InternalError(name_ + ": the gradient of '" + state.parameter->name() + "' is not contiguous");
    update(state, grad);
    state.started = true;
  }
}

std::vector<std::pair<std::string, Tensor>> OptimizerBase::state() const {
  std::vector<std::pair<std::string, Tensor>> out;
  for (std::size_t p = 0; p < parameters_.size(); ++p) {
    if (lazy_state_ && !parameters_[p].started) continue;
    for (std::size_t t = 0; t < parameters_[p].tensors.size(); ++t)
      out.emplace_back(tensor_names_[p][t], parameters_[p].tensors[t]);
  }
  return out;
}

void OptimizerBase::load_state(const std::vector<std::pair<std::string, Tensor>>& saved) {
  if (!initialised_) throw InternalError(name_ + ": load_state() before init()");
  // Every check first, copying nothing, so that a refused state leaves everything as it was.
  std::map<std::string, std::pair<std::size_t, std::size_t>, std::less<>> where;  // name -> {parameter, tensor}
  std::set<std::string, std::less<>> slot_names;
  for (std::size_t p = 0; p < parameters_.size(); ++p)
    for (std::size_t t = 0; t < tensor_names_[p].size(); ++t) {
      where.emplace(tensor_names_[p][t], std::pair{p, t});
      slot_names.insert(tensor_names_[p][t].substr(0, tensor_names_[p][t].find('/')));
    }
  std::string expected;
  for (const auto& s : slot_names) expected += (expected.empty() ? "'" : ", '") + s + "/<parameter>'";
  if (expected.empty()) expected = "no state at all";

  std::vector<std::vector<const Tensor*>> sources(parameters_.size());
  for (std::size_t p = 0; p < parameters_.size(); ++p) sources[p].assign(parameters_[p].tensors.size(), nullptr);
  for (const auto& [name, tensor] : saved) {
    const auto it = where.find(name);
    if (it == where.end()) {
      const std::string hint = unexpected_state_hint(name);
      throw UserError(name_ + ": the saved optimizer state has '" + name + "', " +
                      (hint.empty() ? "which belongs to no parameter of this model (expected " + expected +
                                          "); was the checkpoint written for another model or optimizer?"
                                    : hint));
    }
    const auto [p, t] = it->second;
    if (sources[p][t]) throw UserError(name_ + ": the saved optimizer state has '" + name + "' twice");
    const Tensor& mine = parameters_[p].tensors[t];
    if (!tensor.defined() || tensor.dtype() != DType::f32 || !(tensor.shape() == mine.shape()))
      throw UserError(name_ + ": the saved optimizer state '" + name + "' is " + tensor.str() + ", expected " +
                      mine.str());
    sources[p][t] = &tensor;
  }
  for (std::size_t p = 0; p < parameters_.size(); ++p) {
    const auto& s = sources[p];
    const auto given = static_cast<std::size_t>(std::count_if(s.begin(), s.end(), [](auto* x) { return x; }));
    if (given == s.size() || (lazy_state_ && given == 0)) continue;
    for (std::size_t t = 0; t < s.size(); ++t)
      if (!s[t])
        throw UserError(name_ + ": the saved optimizer state lacks '" + tensor_names_[p][t] + "'" +
                        (lazy_state_ ? " (it has the parameter's other state tensors)" : ""));
  }

  for (std::size_t p = 0; p < parameters_.size(); ++p) {
    ParameterState& state = parameters_[p];
    state.started = state.tensors.empty() ? !lazy_state_ : sources[p][0] != nullptr;
    for (std::size_t t = 0; t < state.tensors.size(); ++t)
      if (sources[p][t]) state.tensors[t].copy_from(*sources[p][t]);
  }
}

void OptimizerBase::parallel_chunks(std::int64_t n, FunctionRef<void(std::int64_t, std::int64_t)> chunk) const {
  if (n <= 0) return;
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
  if (chunks == 1) {
    chunk(0, n);
    return;
  }
  execution_.parallel_for(chunks, 1, [&](std::int64_t first, std::int64_t last) {
    for (std::int64_t c = first; c < last; ++c) chunk(c * kChunk, std::min(n, (c + 1) * kChunk));
  });
}

// ---- ElementwiseOptimizer ----

ElementwiseOptimizer::ElementwiseOptimizer(std::string name, ExecutionContext& execution,
                                           std::vector<std::string> slots, bool lazy_state)
    : OptimizerBase(std::move(name), execution, lazy_state), slots_(std::move(slots)) {
  if (slots_.size() > kMaxSlots)
    throw InternalError(optimizer_name() + ": " + std::to_string(slots_.size()) + " slots, at most " +
                        std::to_string(kMaxSlots));
}

ElementwiseOptimizer::~ElementwiseOptimizer() = default;

std::vector<StateTensorSpec> ElementwiseOptimizer::state_tensors(const OptimizerParameter& parameter) const {
  std::vector<StateTensorSpec> out;
  for (const auto& slot : slots_) out.push_back({slot, parameter.parameter->shape()});
  return out;
}

std::optional<ElementwiseUpdate> ElementwiseOptimizer::update_rule(bool, bool) const {
  return std::nullopt;
}

bool ElementwiseOptimizer::updates_device_memory() const {
  return update_rule(true, true).has_value();
}

void ElementwiseOptimizer::update(ParameterState& state, const Tensor& grad) {
  const Tensor value = state.parameter->data();
  if (!value.is_host_visible() || !grad.is_host_visible()) {
    // Device memory: the whole parameter in one backend kernel.
    const std::optional<ElementwiseUpdate> rule = update_rule(state.weight_decay, !state.started);
    Backend& device = backend();
    if (!rule) throw InternalError(optimizer_name() + ": no update rule for a parameter in device memory");
    if (!device.supports_op(BackendOp::optimizer, DType::f32))
      throw UserError(optimizer_name() + ": backend '" + std::string(device.name()) +
                      "' does not support f32 data in its optimizer kernels; choose a backend that does");
    std::array<float*, kMaxSlots> slots{};
    for (std::size_t s = 0; s < state.tensors.size(); ++s) slots[s] = state.tensors[s].device_data<float>();
    device.elementwise_update(*rule, value.device_data<float>(), grad.device_data<float>(), slots, grad.numel());
    return;
  }
  Chunk whole{};
  whole.parameter = state.parameter->data().data<float>();
  whole.grad = grad.data<float>();
  for (std::size_t s = 0; s < state.tensors.size(); ++s) whole.slots[s] = state.tensors[s].data<float>();
  whole.weight_decay = state.weight_decay;
  whole.first = !state.started;
  parallel_chunks(grad.numel(), [&](std::int64_t begin, std::int64_t end) {
    Chunk c = whole;
    c.parameter += begin;
    c.grad += begin;
    for (auto& slot : c.slots)
      if (slot) slot += begin;
    c.size = end - begin;
    update_chunk(c);
  });
}

}  // namespace loom
