// What the optimizer plugins (adamw, lion, sgd) share around their update arithmetic: the checks
// of init() and step(), the walk over the parameters that have a gradient, the parallel chunking
// of the elementwise update, and matching a checkpoint's named state tensors to the live ones.
// The arithmetic itself (and its rounding, which each plugin pins with -ffp-contract=off) stays in
// the plugins; nothing here touches a float.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/error.hpp"
#include "loom/execution.hpp"
#include "loom/kinds/optimizer.hpp"
#include "loom/options.hpp"
#include "loom/tensor.hpp"

namespace loom::optimizer_state {

// Elements per parallel chunk: up to 4 arrays x 32 Ki floats = 512 KiB touched per chunk, large
// enough that scheduling a chunk costs far less than streaming it.
inline constexpr std::int64_t kGrain = std::int64_t{1} << 15;

// The `max_grad_norm` option every optimizer declares (last), and its value (null: 0, no clip).
inline void declare_max_grad_norm(OptionSchema& schema) {
  schema
      .number("max_grad_norm", 1.0,
              "Global gradient-norm clip applied by the trainer before the update; 0 or null: none.")
      .min(0.0)
      .nullable();
}
inline double read_max_grad_norm(const Options& options) {
  return options.get_optional<double>("max_grad_norm").value_or(0.0);
}

// init()'s preconditions: called once, no null parameter, and no two parameters with one name
// (state is saved by parameter name, so they would share a slot). InternalErrors: these are bugs
// of the caller, not of the user's config.
inline void check_init(std::string_view optimizer, bool initialised,
                       const std::vector<OptimizerParameter>& parameters) {
  const std::string o(optimizer);
  if (initialised) throw InternalError(o + ": init() called twice");
  std::set<std::string> names;
  for (const auto& op : parameters) {
    if (op.parameter == nullptr) throw InternalError(o + ": init() got a null parameter");
    if (!names.insert(op.parameter->name()).second)
      throw InternalError(o + ": two parameters are named '" + op.parameter->name() +
                          "'; optimizer state is keyed by name");
  }
}

// step()'s preconditions: after init(), a learning rate >= 0 (not NaN) and a step >= 0.
inline void check_step(std::string_view optimizer, bool initialised, double lr, std::int64_t step) {
  const std::string o(optimizer);
  if (!initialised) throw InternalError(o + ": step() before init()");
  if (!(lr >= 0.0) || step < 0)
    throw InternalError(o + ": step(lr = " + std::to_string(lr) + ", step = " + std::to_string(step) +
                        "): the learning rate must be >= 0 and the step >= 0");
}

// Calls update(slot, grad) for each slot (anything with a `Parameter* parameter` member) whose
// parameter has a gradient, which must be contiguous; parameters without one are skipped.
template <class Slot, class Update>
void for_each_gradient(std::string_view optimizer, std::vector<Slot>& slots, Update&& update) {
  for (Slot& slot : slots) {
    if (!slot.parameter->has_grad()) continue;
    const Tensor grad = slot.parameter->grad();
    if (!grad.is_contiguous())
      throw InternalError(std::string(optimizer) + ": the gradient of '" + slot.parameter->name() +
                          "' is not contiguous");
    update(slot, grad);
  }
}

// Runs chunk(begin, end) over [0, n) in parallel pieces of kGrain elements. Only for elementwise
// passes, whose result does not depend on how the range is split.
template <class Chunk>
void parallel_chunks(ExecutionContext& execution, std::int64_t n, Chunk&& chunk) {
  execution.parallel_for(n, kGrain, std::forward<Chunk>(chunk));
}

// The name of a parameter's state tensor in a checkpoint: "<what>/<parameter>" ("exp_avg/wte").
inline std::string key(std::string_view what, const Parameter& parameter) {
  return std::string(what) + "/" + parameter.name();
}

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
// The live state tensors by checkpoint name.
using StateMap = std::map<std::string, const Tensor*, std::less<>>;

// Matches the saved `state` to the live tensors of `expected` and returns {live, saved} pairs,
// copying nothing, so that a bad checkpoint can be refused before anything changes. UserErrors: a
// name that is not expected (`expected_names` says what names look like: "'exp_avg/<parameter>'"),
// a name given twice, a tensor that is not f32 of the live tensor's shape, and (when
// `require_all`) an expected name that is missing. `on_known(name)`, when given, runs on each
// name once it is known to be expected, before the other checks, for a plugin's own refusals.
inline std::vector<std::pair<const Tensor*, const Tensor*>> match_state(
    std::string_view optimizer, const StateMap& expected, const NamedTensors& state, std::string_view expected_names,
    bool require_all, const std::function<void(const std::string&)>& on_known = {}) {
  const std::string o(optimizer);
  std::vector<std::pair<const Tensor*, const Tensor*>> matches;  // {live, saved}
  std::set<std::string, std::less<>> seen;
  for (const auto& [name, tensor] : state) {
    const auto it = expected.find(name);
    if (it == expected.end())
      throw UserError(o + ": the saved optimizer state has '" + name +
                      "', which belongs to no parameter of this model (expected " + std::string(expected_names) +
                      "); was the checkpoint written for another model?");
    if (on_known) on_known(name);
    if (!seen.insert(name).second) throw UserError(o + ": the saved optimizer state has '" + name + "' twice");
    const Tensor& mine = *it->second;
    if (!tensor.defined() || tensor.dtype() != DType::f32 || !(tensor.shape() == mine.shape()))
      throw UserError(o + ": the saved optimizer state '" + name + "' is " + tensor.str() + ", expected " + mine.str());
    matches.emplace_back(&mine, &tensor);
  }
  if (require_all)
    for (const auto& [name, tensor] : expected)
      if (!seen.contains(name)) throw UserError(o + ": the saved optimizer state lacks '" + name + "'");
  return matches;
}

// load_state() for an optimizer whose every parameter has state: checks everything, then copies.
inline void load_all(std::string_view optimizer, bool initialised, const StateMap& expected, const NamedTensors& state,
                     std::string_view expected_names) {
  if (!initialised) throw InternalError(std::string(optimizer) + ": load_state() before init()");
  for (const auto& [live, saved] : match_state(optimizer, expected, state, expected_names, true))
    live->copy_from(*saved);
}

}  // namespace loom::optimizer_state
