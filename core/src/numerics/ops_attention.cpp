// Attention: validated here, computed by the configured attention kernel (kinds/attention.hpp).
#include <cmath>

#include "numerics/ops_support.hpp"

namespace loom {

using detail::BackwardPass;
using detail::GradTarget;
using detail::Node;
using detail::op_error;

namespace {

AttentionOperand operand(const Tensor& t) {
  return {t.device_data<float>(), t.stride(0), t.stride(1)};
}

struct AttentionNode final : Node {
  using Node::Node;
  const char* name() const override { return "attention"; }
  AttentionKernel* kernel = nullptr;
  Tensor q, k, v, out, lse, q_segments, kv_segments;
  AttentionForwardArgs args;
  GradTarget dq, dk, dv;

  void backward(BackwardPass& pass) override {
    AttentionBackwardArgs b;
    b.forward = &args;
    const Tensor& g = pass.output_grad(*this, 0);
    b.dout = g.device_data<float>();
    // Keep the buffers alive for the duration of the call.
    BackwardPass::Buffer bq, bk, bv;
    auto resolve = [&](const GradTarget& t, BackwardPass::Buffer& buf, AttentionGradient& grad) {
      if (!t.active()) return;
      const int sharing = int(t.same_base(dq)) + int(t.same_base(dk)) + int(t.same_base(dv));
      buf = pass.grad(t, sharing > 1);
      grad = {buf.tensor.device_data<float>(), buf.tensor.stride(0), buf.tensor.stride(1), buf.accumulate};
    };
    // One at a time: q, k and v may be views of one buffer (fused qkv), and resolving the first
    // zero-fills it for the others.
    resolve(dq, bq, b.dq);
    resolve(dk, bk, b.dk);
    resolve(dv, bv, b.dv);
    kernel->backward(b);
  }
};

// Heads contiguous within a token, elements contiguous within a head.
bool attention_layout(const Tensor& t) {
  return t.stride(3) == 1 && (t.size(2) == 1 || t.stride(2) == t.size(3));
}

}  // namespace

Tensor Ops::attention(AttentionKernel& kernel, const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                      const AttentionParams& params, const Tensor& q_segments, const Tensor& kv_segments) {
  observe({&q_in, &k_in, &v_in});
  constexpr const char* op = "attention";
  detail::require_f32(*this, q_in, op, "q");
  detail::require_f32(*this, k_in, op, "k");
  detail::require_f32(*this, v_in, op, "v");
  if (!(kernel.device() == device()))
    op_error(op, "the attention kernel computes on " + kernel.device().str() + " but backend '" +
                     std::string(backend_->name()) + "' on " + device().str() +
                     "; configure an attention kernel for the backend's device");
  if (q_in.rank() != 4 || k_in.rank() != 4 || v_in.rank() != 4)
    op_error(op,
             "q, k and v must be [batch, len, heads, head_dim]: " + q_in.str() + ", " + k_in.str() + ", " + v_in.str());
  const std::int64_t batch = q_in.size(0), q_len = q_in.size(1), q_heads = q_in.size(2), head_dim = q_in.size(3);
  const std::int64_t kv_len = k_in.size(1), kv_heads = k_in.size(2);
  if (!(k_in.shape() == v_in.shape()))
    op_error(op, "k " + k_in.shape().str() + " and v " + v_in.shape().str() + " differ");
  if (k_in.size(0) != batch || k_in.size(3) != head_dim)
    op_error(op, "k " + k_in.shape().str() + " does not match q " + q_in.shape().str());
  if (kv_heads <= 0 || q_heads % kv_heads != 0)
    op_error(op, std::to_string(q_heads) + " query heads are not a multiple of " + std::to_string(kv_heads) +
                     " key/value heads");
  if (kv_len < q_len)
    op_error(op, "fewer keys (" + std::to_string(kv_len) + ") than queries (" + std::to_string(q_len) + ")");
  if (params.window < 0) op_error(op, "window must be >= 0");
  if (!(params.softcap >= 0.0f)) op_error(op, "softcap must be >= 0");
  if (!(params.scale >= 0.0f)) op_error(op, "scale must be >= 0");
  if (q_segments.defined() != kv_segments.defined()) op_error(op, "give both q_segments and kv_segments, or neither");
  if (q_segments.defined()) {
    detail::require_i32(*this, q_segments, op, "q_segments");
    detail::require_i32(*this, kv_segments, op, "kv_segments");
    if (!(q_segments.shape() == Shape{batch, q_len}) || !(kv_segments.shape() == Shape{batch, kv_len}))
      op_error(op, "segment ids must be [batch, q_len] and [batch, kv_len], not " + q_segments.shape().str() + " and " +
                       kv_segments.shape().str());
  }
  const Tensor q = attention_layout(q_in) ? q_in : contiguous(q_in);
  const Tensor k = attention_layout(k_in) ? k_in : contiguous(k_in);
  const Tensor v = attention_layout(v_in) ? v_in : contiguous(v_in);

  Tensor out = detail::empty(*this, Shape{batch, q_len, q_heads, head_dim});
  Tensor lse = detail::empty(*this, Shape{batch, q_heads, q_len});
  AttentionForwardArgs a;
  a.batch = batch;
  a.q_len = q_len;
  a.kv_len = kv_len;
  a.q_heads = q_heads;
  a.kv_heads = kv_heads;
  a.head_dim = head_dim;
  a.q = operand(q);
  a.k = operand(k);
  a.v = operand(v);
  a.q_segments = detail::ids_ptr(q_segments);
  a.kv_segments = detail::ids_ptr(kv_segments);
  a.params = params;
  if (a.params.scale == 0.0f) a.params.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  a.out = out.device_data<float>();
  a.lse = lse.device_data<float>();
  a.compute = backend_->matmul_dtype();
  kernel.forward(a);

  if (auto* rec = detail::recording_state(tape_, {&q, &k, &v}, op)) {
    auto* node = rec->record<AttentionNode>(*backend_);
    node->kernel = &kernel;
    node->q = q;
    node->k = k;
    node->v = v;
    node->out = out.detach();
    node->lse = lse;
    node->q_segments = q_segments;
    node->kv_segments = kv_segments;
    node->args = a;
    node->dq = rec->target(q);
    node->dk = rec->target(k);
    node->dv = rec->target(v);
    rec->add_output(*node, out);
  }
  return out;
}

}  // namespace loom
