// Operations the model families past GPT-2 and Llama compose: the elementwise product (GeGLU),
// soft-capping (Gemma 2's logits), and for mixtures of experts softmax and log-sum-exp over the
// last dimension (the router and its z-loss), concatenation along the first dimension (the
// experts' outputs) and the sum of all elements (auxiliary losses). Each computes through the
// backend's kernels (BackendOp::mul, softcap, softmax, logsumexp, sum; concat through the buffer
// type's copies), so its tensors may live in a device's memory.
#include <algorithm>
#include <span>
#include <vector>

#include "numerics/ops_support.hpp"

namespace loom {

using detail::BackwardPass;
using detail::GradTarget;
using detail::Node;
using detail::op_error;
using detail::ptr;

namespace {

struct MulNode final : Node {
  using Node::Node;
  const char* name() const override { return "mul"; }
  Tensor a, b;
  GradTarget da, db;
  void backward(BackwardPass& pass) override {
    const float* dy = ptr(pass.output_grad(*this, 0));
    const bool shared = da.same_base(db);
    const std::int64_t n = a.numel();
    if (da.active()) {
      auto g = pass.grad(da, shared);
      pass.backend().mul(dy, ptr(b), ptr(g.tensor), n, g.accumulate);
    }
    if (db.active()) {
      auto g = pass.grad(db, shared);
      pass.backend().mul(dy, ptr(a), ptr(g.tensor), n, g.accumulate);
    }
  }
};

struct SoftcapNode final : Node {
  using Node::Node;
  const char* name() const override { return "softcap"; }
  Tensor y;
  float cap = 0.0f;
  GradTarget dx;
  void backward(BackwardPass& pass) override {
    const float* dy = ptr(pass.output_grad(*this, 0));
    auto g = pass.grad(dx);
    pass.backend().softcap_backward(ptr(y), 1.0f / cap, dy, ptr(g.tensor), y.numel(), g.accumulate);
  }
};

struct SoftmaxNode final : Node {
  using Node::Node;
  const char* name() const override { return "softmax"; }
  Tensor y;
  GradTarget dx;
  void backward(BackwardPass& pass) override {
    const float* dy = ptr(pass.output_grad(*this, 0));
    const std::int64_t cols = y.shape().back(), rows = y.numel() / std::max<std::int64_t>(cols, 1);
    auto g = pass.grad(dx);
    pass.backend().softmax_backward(ptr(y), dy, ptr(g.tensor), rows, cols, g.accumulate);
  }
};

struct LogsumexpNode final : Node {
  using Node::Node;
  const char* name() const override { return "logsumexp"; }
  Tensor x, y;
  GradTarget dx;
  void backward(BackwardPass& pass) override {
    const float* dy = ptr(pass.output_grad(*this, 0));
    const std::int64_t cols = x.shape().back(), rows = x.numel() / cols;
    auto g = pass.grad(dx);
    pass.backend().logsumexp_backward(ptr(x), ptr(y), dy, ptr(g.tensor), rows, cols, g.accumulate);
  }
};

struct ConcatNode final : Node {
  using Node::Node;
  const char* name() const override { return "concat"; }
  std::vector<GradTarget> parts;
  std::vector<std::int64_t> begins;  // first row of each part in the output
  void backward(BackwardPass& pass) override {
    const Tensor& g = pass.output_grad(*this, 0);
    for (std::size_t i = 0; i < parts.size(); ++i)
      if (parts[i].active()) pass.accumulate(parts[i], g.slice(0, begins[i], begins[i + 1]));
  }
};

struct SumNode final : Node {
  using Node::Node;
  const char* name() const override { return "sum"; }
  std::int64_t n = 0;
  GradTarget dx;
  void backward(BackwardPass& pass) override {
    const float* dy = ptr(pass.output_grad(*this, 0));
    auto g = pass.grad(dx);
    pass.backend().sum_backward(dy, ptr(g.tensor), n, g.accumulate);
  }
};

}  // namespace

Tensor Ops::logsumexp(const Tensor& x_in) {
  observe({&x_in});
  constexpr const char* op = "logsumexp";
  detail::require_f32(*this, x_in, op, "x");
  if (x_in.rank() < 1 || x_in.shape().back() == 0) op_error(op, "x needs a non-empty last dimension");
  detail::require_op(*this, BackendOp::logsumexp, DType::f32, op);
  const Tensor x = contiguous(x_in);
  const std::int64_t cols = x.shape().back(), rows = x.numel() / cols;
  std::vector<std::int64_t> dims(x.shape().begin(), x.shape().end() - 1);
  Tensor y = detail::empty(*this, Shape(std::span<const std::int64_t>(dims)));
  backend_->logsumexp_forward(ptr(x), ptr(y), rows, cols);
  if (auto* rec = detail::recording_state(tape_, {&x}, op)) {
    auto* node = rec->record<LogsumexpNode>(*backend_);
    node->x = x.detach();
    node->y = y.detach();
    node->dx = rec->target(x);
    rec->add_output(*node, y);
  }
  return y;
}

Tensor Ops::concat(std::span<const Tensor> parts_in) {
  if (parameter_observer_) observe_parameters(parts_in);
  constexpr const char* op = "concat";
  if (parts_in.empty()) op_error(op, "nothing to concatenate");
  std::vector<Tensor> parts;
  std::vector<std::int64_t> begins{0};
  for (const Tensor& p : parts_in) {
    detail::require_f32(*this, p, op, "part");
    if (p.rank() < 1 || p.rank() != parts_in[0].rank()) op_error(op, "parts must have equal ranks >= 1");
    for (int d = 1; d < p.rank(); ++d)
      if (p.size(d) != parts_in[0].size(d))
        op_error(op, "part " + p.shape().str() + " does not match " + parts_in[0].shape().str() +
                         " past the first dimension");
    parts.push_back(contiguous(p));
    begins.push_back(begins.back() + p.size(0));
  }
  Shape shape = parts_in[0].shape();
  shape[0] = begins.back();
  Tensor y = detail::empty(*this, shape);
  // The buffer type's copies: a memmove on the host, the device's own copy elsewhere.
  for (std::size_t i = 0; i < parts.size(); ++i) y.slice(0, begins[i], begins[i + 1]).copy_from(parts[i]);
  std::vector<const Tensor*> inputs;
  for (const Tensor& p : parts) inputs.push_back(&p);
  if (auto* rec = detail::recording_state(tape_, std::span<const Tensor* const>(inputs), op)) {
    auto* node = rec->record<ConcatNode>(*backend_);
    for (const Tensor& p : parts) node->parts.push_back(rec->target(p));
    node->begins = std::move(begins);
    rec->add_output(*node, y);
  }
  return y;
}

Tensor Ops::sum(const Tensor& x_in) {
  observe({&x_in});
  constexpr const char* op = "sum";
  detail::require_f32(*this, x_in, op, "x");
  detail::require_op(*this, BackendOp::sum, DType::f32, op);
  const Tensor x = contiguous(x_in);
  Tensor y = detail::empty(*this, Shape{});
  backend_->sum_forward(ptr(x), ptr(y), x.numel());
  if (auto* rec = detail::recording_state(tape_, {&x}, op)) {
    auto* node = rec->record<SumNode>(*backend_);
    node->n = x.numel();
    node->dx = rec->target(x);
    rec->add_output(*node, y);
  }
  return y;
}

Tensor Ops::mul(const Tensor& a_in, const Tensor& b_in) {
  observe({&a_in, &b_in});
  constexpr const char* op = "mul";
  detail::require_f32(*this, a_in, op, "a");
  detail::require_f32(*this, b_in, op, "b");
  detail::require_same_shape(a_in, b_in, op, "a", "b");
  detail::require_op(*this, BackendOp::mul, DType::f32, op);
  const Tensor a = contiguous(a_in), b = contiguous(b_in);
  Tensor y = detail::empty(*this, a.shape());
  backend_->mul(ptr(a), ptr(b), ptr(y), a.numel(), false);
  if (auto* rec = detail::recording_state(tape_, {&a, &b}, op)) {
    auto* node = rec->record<MulNode>(*backend_);
    node->a = a.detach();
    node->b = b.detach();
    node->da = rec->target(a);
    node->db = rec->target(b);
    rec->add_output(*node, y);
  }
  return y;
}

Tensor Ops::softcap(const Tensor& x_in, float cap) {
  observe({&x_in});
  constexpr const char* op = "softcap";
  detail::require_f32(*this, x_in, op, "x");
  if (!(cap > 0.0f)) op_error(op, "cap must be > 0, not " + std::to_string(cap));
  detail::require_op(*this, BackendOp::softcap, DType::f32, op);
  const Tensor x = contiguous(x_in);
  Tensor y = detail::empty(*this, x.shape());
  backend_->softcap_forward(ptr(x), ptr(y), nullptr, x.numel(), cap);
  if (auto* rec = detail::recording_state(tape_, {&x}, op)) {
    auto* node = rec->record<SoftcapNode>(*backend_);
    node->y = y.detach();
    node->cap = cap;
    node->dx = rec->target(x);
    rec->add_output(*node, y);
  }
  return y;
}

Tensor Ops::softmax(const Tensor& x_in) {
  observe({&x_in});
  constexpr const char* op = "softmax";
  detail::require_f32(*this, x_in, op, "x");
  if (x_in.rank() < 1 || x_in.shape().back() == 0) op_error(op, "x needs a non-empty last dimension");
  detail::require_op(*this, BackendOp::softmax, DType::f32, op);
  const Tensor x = contiguous(x_in);
  Tensor y = detail::empty(*this, x.shape());
  const std::int64_t cols = x.shape().back(), rows = x.numel() / cols;
  backend_->softmax_forward(ptr(x), ptr(y), rows, cols);
  if (auto* rec = detail::recording_state(tape_, {&x}, op)) {
    auto* node = rec->record<SoftmaxNode>(*backend_);
    node->y = y.detach();
    node->dx = rec->target(x);
    rec->add_output(*node, y);
  }
  return y;
}

}  // namespace loom
