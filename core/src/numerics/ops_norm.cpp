// LayerNorm and RMSNorm, alone and fused with the residual add that precedes them.
#include "numerics/ops_support.hpp"

namespace loom {

using detail::BackwardPass;
using detail::GradTarget;
using detail::Node;
using detail::op_error;
using detail::ptr;

namespace {

// One node for all four operations. The normalised input is x (plain) or the sum (fused); the
// fused form has two outputs (sum, y) and two inputs (residual, x) that both receive d(sum).
struct NormNode final : Node {
  using Node::Node;
  const char* name() const override {
    return fused ? (rms ? "add_rms_norm" : "add_layer_norm") : (rms ? "rms_norm" : "layer_norm");
  }

  bool rms = false, fused = false;
  Tensor x;  // the normalised input (the sum when fused)
  Tensor weight, mean, rstd;
  GradTarget dx, dresidual, dweight, dbias;
  std::int64_t rows = 0, cols = 0;

  void backward(BackwardPass& pass) override {
    Backend& be = pass.backend();
    // The gradient of the normalised input: d(sum) when fused, which starts as the sum's own
    // output gradient and receives the norm's backward on top.
    Tensor dsum = fused ? pass.take_output_grad(*this, 0) : Tensor();
    const Tensor& gy = pass.output_grad(*this, fused ? 1 : 0);
    if (gy.defined()) {
      BackwardPass::Buffer bw, bb;
      if (dweight.active()) bw = pass.grad(dweight);
      if (dbias.active()) bb = pass.grad(dbias);
      float* dinput = nullptr;
      bool acc_input = false;
      BackwardPass::Buffer bx;
      if (fused) {
        acc_input = dsum.defined();
        if (!acc_input) dsum = pass.empty(x.shape());
        dinput = ptr(dsum);
      } else if (dx.active()) {
        bx = pass.grad(dx);
        dinput = ptr(bx.tensor);
        acc_input = bx.accumulate;
      }
      if (rms)
        be.rms_norm_backward(ptr(x), detail::data_or_null(weight), ptr(rstd), ptr(gy), dinput, acc_input,
                             detail::grad_data(bw), bw.accumulate, rows, cols);
      else
        be.layer_norm_backward(ptr(x), detail::data_or_null(weight), ptr(mean), ptr(rstd), ptr(gy), dinput, acc_input,
                               detail::grad_data(bw), bw.accumulate, detail::grad_data(bb), bb.accumulate, rows, cols);
    }
    if (fused && dsum.defined()) {
      if (dresidual.active()) {
        pass.accumulate(dx, dsum);
        pass.give(dresidual, std::move(dsum));
      } else {
        pass.give(dx, std::move(dsum));
      }
    }
  }
};

struct NormArgs {
  const char* op;
  bool rms;
  bool fused;
};

std::pair<Tensor, Tensor> norm(Ops& ops, Tape* tape, const NormArgs& a, const Tensor& residual_in, const Tensor& x_in,
                               const Tensor& weight, const Tensor& bias, float eps) {
  detail::require_f32(ops, x_in, a.op, "x");
  if (x_in.rank() < 1 || x_in.shape().back() == 0)
    op_error(a.op, "x must have a non-empty last dimension: " + x_in.str());
  if (a.fused) {
    detail::require_f32(ops, residual_in, a.op, "residual");
    detail::require_same_shape(residual_in, x_in, a.op, "residual", "x");
  }
  const std::int64_t cols = x_in.shape().back();
  detail::require_vector(ops, weight, cols, a.op, "weight");
  detail::require_vector(ops, bias, cols, a.op, "bias");
  if (!(eps >= 0.0f)) op_error(a.op, "eps must be >= 0");
  detail::require_op(ops, a.rms ? BackendOp::rms_norm : BackendOp::layer_norm, DType::f32, a.op);
  const Tensor x = ops.contiguous(x_in);
  const Tensor residual = a.fused ? ops.contiguous(residual_in) : Tensor();
  const std::int64_t rows = x.shape().rows();
  Backend& be = ops.backend();

  Tensor sum = a.fused ? detail::empty(ops, x.shape()) : Tensor();
  Tensor y = detail::empty(ops, x.shape());
  Tensor mean = a.rms ? Tensor() : detail::empty(ops, Shape{rows});
  Tensor rstd = detail::empty(ops, Shape{rows});
  const float* w = detail::data_or_null(weight);
  if (a.rms && a.fused)
    be.add_rms_norm_forward(ptr(residual), ptr(x), ptr(sum), w, ptr(y), ptr(rstd), rows, cols, eps);
  else if (a.rms)
    be.rms_norm_forward(ptr(x), w, ptr(y), ptr(rstd), rows, cols, eps);
  else if (a.fused)
    be.add_layer_norm_forward(ptr(residual), ptr(x), ptr(sum), w, detail::data_or_null(bias), ptr(y), ptr(mean),
                              ptr(rstd), rows, cols, eps);
  else
    be.layer_norm_forward(ptr(x), w, detail::data_or_null(bias), ptr(y), ptr(mean), ptr(rstd), rows, cols, eps);

  if (auto* rec = detail::recording_state(tape, {&residual, &x, &weight, &bias}, a.op)) {
    auto* node = rec->record<NormNode>(be);
    node->rms = a.rms;
    node->fused = a.fused;
    node->x = a.fused ? sum.detach() : x;
    node->weight = weight;
    node->mean = mean;
    node->rstd = rstd;
    node->dx = rec->target(x);
    if (a.fused) node->dresidual = rec->target(residual);
    if (weight.defined()) node->dweight = rec->target(weight);
    if (bias.defined()) node->dbias = rec->target(bias);
    node->rows = rows;
    node->cols = cols;
    if (a.fused) rec->add_output(*node, sum);
    rec->add_output(*node, y);
  }
  return {sum, y};
}

}  // namespace

Tensor Ops::layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) {
  observe({&x, &weight, &bias});
  return norm(*this, tape_, {"layer_norm", false, false}, Tensor(), x, weight, bias, eps).second;
}

Tensor Ops::rms_norm(const Tensor& x, const Tensor& weight, float eps) {
  observe({&x, &weight});
  return norm(*this, tape_, {"rms_norm", true, false}, Tensor(), x, weight, Tensor(), eps).second;
}

std::pair<Tensor, Tensor> Ops::add_layer_norm(const Tensor& residual, const Tensor& x, const Tensor& weight,
                                              const Tensor& bias, float eps) {
  observe({&residual, &x, &weight, &bias});
  return norm(*this, tape_, {"add_layer_norm", false, true}, residual, x, weight, bias, eps);
}

std::pair<Tensor, Tensor> Ops::add_rms_norm(const Tensor& residual, const Tensor& x, const Tensor& weight, float eps) {
  observe({&residual, &x, &weight});
  return norm(*this, tape_, {"add_rms_norm", true, true}, residual, x, weight, Tensor(), eps);
}

}  // namespace loom
