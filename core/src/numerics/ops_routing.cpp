// A mixture of experts' top-k routing (Ops::route_top_k): the backend's routing kernel, so that
// the choices and the dispatch order stay where the router's logits are.
#include <limits>

#include "numerics/ops_support.hpp"

namespace loom {

using detail::op_error;

TopKRouting Ops::route_top_k(const Tensor& logits_in, std::int64_t k, std::int64_t first, std::int64_t last) {
  observe({&logits_in});
  constexpr const char* op = "route_top_k";
  detail::require_f32(*this, logits_in, op, "logits");
  if (logits_in.rank() != 2) op_error(op, "logits must be [tokens, experts], not " + logits_in.str());
  const std::int64_t tokens = logits_in.size(0), experts = logits_in.size(1);
  if (experts <= 0 || k <= 0 || k > experts)
    op_error(op, "k = " + std::to_string(k) + " choices of " + std::to_string(experts) + " experts");
  if (first < 0 || first > last || last > experts)
    op_error(op, "the member's experts [" + std::to_string(first) + ", " + std::to_string(last) +
                     ") are not within [0, " + std::to_string(experts) + ")");
  if (tokens * experts > std::numeric_limits<std::int32_t>::max())
    op_error(op, std::to_string(tokens) + " tokens x " + std::to_string(experts) + " experts overflow i32 indices");
  detail::require_op(*this, BackendOp::routing, DType::f32, op);
  const Tensor logits = contiguous(logits_in).detach();
  BufferType& type = buffer_type();
  TopKRouting r;
  r.chosen = Tensor::empty(Shape{tokens, k}, DType::i32, type);
  r.slots = Tensor::empty(Shape{tokens, k}, DType::i32, type);
  r.sorted = Tensor::empty(Shape{tokens * k}, DType::i32, type);
  r.counts = Tensor::empty(Shape{experts}, DType::i32, type);
  backend_->route_top_k(logits.device_data<float>(), tokens, experts, k, first, last,
                        r.chosen.device_data<std::int32_t>(), r.slots.device_data<std::int32_t>(),
                        r.sorted.device_data<std::int32_t>(), r.counts.device_data<std::int32_t>());
  return r;
}

}  // namespace loom
