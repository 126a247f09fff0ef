// Backend's host fallback of the optimizer kernel group: the same arithmetic as the optimizer
// plugins' host passes (training_kernels.hpp), compiled like them (-ffp-contract=off
// -fno-math-errno, set in CMakeLists.txt) so that the two give the same bits.
#include "loom/kinds/backend.hpp"
#include "loom/training_kernels.hpp"

namespace loom {

void Backend::elementwise_update(const ElementwiseUpdate& update, float* parameter, const float* grad,
                                 const std::array<float*, 4>& slots, std::int64_t n) {
  apply_elementwise_update(update, parameter, grad, slots, n);
}

}  // namespace loom
