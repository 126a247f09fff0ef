// The host arithmetic of the elementwise update rules (training_kernels.hpp), in one place:
// Backend's fallback of the optimizer kernel group and ElementwiseOptimizer's default host pass,
// compiled like the optimizer plugins (-ffp-contract=off -fno-math-errno, set in CMakeLists.txt)
// so that host and device updates give the same bits.
#include "loom/elementwise_optimizer.hpp"
#include "loom/error.hpp"
#include "loom/kinds/backend.hpp"
#include "loom/training_kernels.hpp"

namespace loom {

void Backend::elementwise_update(const ElementwiseUpdate& update, float* parameter, const float* grad,
                                 const std::array<float*, 4>& slots, std::int64_t n) {
  apply_elementwise_update(update, parameter, grad, slots, n);
}

void ElementwiseOptimizer::update_chunk(const Chunk& c) const {
  const std::optional<ElementwiseUpdate> rule = update_rule(c.weight_decay, c.first);
  if (!rule)
    throw InternalError(optimizer_name() + ": an elementwise optimizer needs an update rule or its own update_chunk");
  apply_elementwise_update(*rule, c.parameter, c.grad, c.slots, c.size);
}

}  // namespace loom
