// Pointwise operations: GELU, SiLU, SwiGLU, residual add, scale, dropout.
#include "loom/random.hpp"
#include "numerics/ops_support.hpp"

namespace loom {

using detail::BackwardPass;
using detail::GradTarget;
using detail::Node;
using detail::op_error;
using detail::ptr;

namespace {

struct ActivationNode final : Node {
  using Node::Node;
  const char* name() const override { return act == Activation::silu ? "silu" : "gelu"; }
  Activation act = Activation::none;
  Tensor x;
  GradTarget dx;
  void backward(BackwardPass& pass) override {
    auto b = pass.grad(dx);
    pass.backend().activation_backward(act, ptr(x), ptr(pass.output_grad(*this, 0)), ptr(b.tensor), x.numel(),
                                       b.accumulate);
  }
};

struct SwigluNode final : Node {
  using Node::Node;
  const char* name() const override { return "swiglu"; }
  Tensor gate, up;
  GradTarget dgate, dup;
  void backward(BackwardPass& pass) override {
    BackwardPass::Buffer bg, bu;
    const bool shared = dgate.same_base(dup);
    if (dgate.active()) bg = pass.grad(dgate, shared);
    if (dup.active()) bu = pass.grad(dup, shared);
    pass.backend().swiglu_backward(ptr(gate), ptr(up), ptr(pass.output_grad(*this, 0)), detail::grad_data(bg),
                                   bg.accumulate, detail::grad_data(bu), bu.accumulate, gate.numel());
  }
};

struct AddNode final : Node {
  using Node::Node;
  const char* name() const override { return "add"; }
  GradTarget da, db;
  void backward(BackwardPass& pass) override {
    // The gradient passes through unchanged: b gets a copy (or a sum), a adopts the buffer.
    Tensor g = pass.take_output_grad(*this, 0);
    if (db.active()) pass.accumulate(db, g);
    pass.give(da, std::move(g));
  }
};

struct ScaleNode final : Node {
  using Node::Node;
  const char* name() const override { return "scale"; }
  float alpha = 1.0f;
  GradTarget dx;
  void backward(BackwardPass& pass) override {
    Tensor g = pass.take_output_grad(*this, 0);
    if (dx.covers_base && g.storage_use_count() == 1) {
      // Scale in place and hand the buffer on.
      pass.backend().scale(ptr(g), alpha, ptr(g), g.numel(), false);
      pass.give(dx, std::move(g));
    } else {
      pass.accumulate(dx, g, alpha);
    }
  }
};

struct DropoutNode final : Node {
  using Node::Node;
  const char* name() const override { return "dropout"; }
  float p = 0.0f;
  std::uint64_t key = 0;
  std::int64_t n = 0;
  GradTarget dx;
  void backward(BackwardPass& pass) override {
    auto b = pass.grad(dx);
    pass.backend().dropout(ptr(pass.output_grad(*this, 0)), ptr(b.tensor), n, p, key, b.accumulate);
  }
};

Tensor activation(Ops& ops, Tape* tape, Activation act, const char* op, const Tensor& x_in) {
  detail::require_f32(ops, x_in, op, "x");
  detail::require_op(ops, BackendOp::activation, DType::f32, op);
  const Tensor x = ops.contiguous(x_in);
  Tensor y = detail::empty(ops, x.shape());
  ops.backend().activation_forward(act, ptr(x), ptr(y), x.numel());
  if (auto* rec = detail::recording_state(tape, {&x}, op)) {
    auto* node = rec->record<ActivationNode>(ops.backend());
    node->act = act;
    node->x = x;
    node->dx = rec->target(x);
    rec->add_output(*node, y);
  }
  return y;
}

}  // namespace

Tensor Ops::gelu(const Tensor& x) {
  observe({&x});
  return activation(*this, tape_, Activation::gelu_tanh, "gelu", x);
}
Tensor Ops::silu(const Tensor& x) {
  observe({&x});
  return activation(*this, tape_, Activation::silu, "silu", x);
}

Tensor Ops::swiglu(const Tensor& gate_in, const Tensor& up_in) {
  observe({&gate_in, &up_in});
  constexpr const char* op = "swiglu";
  detail::require_f32(*this, gate_in, op, "gate");
  detail::require_f32(*this, up_in, op, "up");
  detail::require_same_shape(gate_in, up_in, op, "gate", "up");
  detail::require_op(*this, BackendOp::swiglu, DType::f32, op);
  const Tensor gate = contiguous(gate_in), up = contiguous(up_in);
  Tensor y = detail::empty(*this, gate.shape());
  backend_->swiglu_forward(ptr(gate), ptr(up), ptr(y), gate.numel());
  if (auto* rec = detail::recording_state(tape_, {&gate, &up}, op)) {
    auto* node = rec->record<SwigluNode>(*backend_);
    node->gate = gate;
    node->up = up;
    node->dgate = rec->target(gate);
    node->dup = rec->target(up);
    rec->add_output(*node, y);
  }
  return y;
}

Tensor Ops::add(const Tensor& a_in, const Tensor& b_in) {
  observe({&a_in, &b_in});
  constexpr const char* op = "add";
  detail::require_f32(*this, a_in, op, "a");
  detail::require_f32(*this, b_in, op, "b");
  detail::require_same_shape(a_in, b_in, op, "a", "b");
  detail::require_op(*this, BackendOp::add, DType::f32, op);
  const Tensor a = contiguous(a_in), b = contiguous(b_in);
  Tensor y = detail::empty(*this, a.shape());
  backend_->add(ptr(a), ptr(b), ptr(y), a.numel());
  if (auto* rec = detail::recording_state(tape_, {&a, &b}, op)) {
    auto* node = rec->record<AddNode>(*backend_);
    node->da = rec->target(a);
    node->db = rec->target(b);
    rec->add_output(*node, y);
  }
  return y;
}

Tensor Ops::scale(const Tensor& x_in, float alpha) {
  observe({&x_in});
  constexpr const char* op = "scale";
  detail::require_f32(*this, x_in, op, "x");
  detail::require_op(*this, BackendOp::scale, DType::f32, op);
  const Tensor x = contiguous(x_in);
  Tensor y = detail::empty(*this, x.shape());
  backend_->scale(ptr(x), alpha, ptr(y), x.numel(), false);
  if (auto* rec = detail::recording_state(tape_, {&x}, op)) {
    auto* node = rec->record<ScaleNode>(*backend_);
    node->alpha = alpha;
    node->dx = rec->target(x);
    rec->add_output(*node, y);
  }
  return y;
}

void Ops::set_dropout_seed(std::uint64_t seed, std::uint64_t step) {
  dropout_seed_ = seed;
  dropout_step_ = step;
  dropout_calls_ = 0;
}

Tensor Ops::dropout(const Tensor& x_in, float p) {
  observe({&x_in});
  constexpr const char* op = "dropout";
  detail::require_f32(*this, x_in, op, "x");
  if (!(p >= 0.0f && p <= 1.0f)) op_error(op, "p must be in [0, 1], not " + std::to_string(p));
  if (!training_ || p == 0.0f) return x_in;
  detail::require_op(*this, BackendOp::dropout, DType::f32, op);
  if (x_in.numel() > 0xffffffffll) op_error(op, "more than 2^32 elements");
  const Tensor x = contiguous(x_in);
  const std::uint64_t key = hash_u64(stream_key(dropout_seed_, 3, dropout_step_) + dropout_calls_++);
  Tensor y = detail::empty(*this, x.shape());
  backend_->dropout(ptr(x), ptr(y), x.numel(), p, key, false);
  if (auto* rec = detail::recording_state(tape_, {&x}, op)) {
    auto* node = rec->record<DropoutNode>(*backend_);
    node->p = p;
    node->key = key;
    node->n = x.numel();
    node->dx = rec->target(x);
    rec->add_output(*node, y);
  }
  return y;
}

}  // namespace loom
