// Operations the model families past GPT-2 and Llama compose: the elementwise product (GeGLU),
// soft-capping (Gemma 2's logits), and for mixtures of experts softmax and log-sum-exp over the
// last dimension (the router and its z-loss), concatenation along the first dimension (the
// experts' outputs) and the sum of all elements (auxiliary losses). They are computed by the core on the host: their
// tensors must be host-visible (a device backend's operands are refused with the operation's name).
#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "numerics/ops_support.hpp"

namespace loom {

using detail::BackwardPass;
using detail::GradTarget;
using detail::Node;
using detail::op_error;

namespace {

void require_host(const Tensor& t, const char* op, const char* what) {
  if (!t.is_host_visible())
    op_error(op,
             std::string(what) + " is in " + t.device().str() + " memory; this operation computes on the host only");
}

const float* host_ptr(const Tensor& t) {
  return t.data<float>();
}

// Writes (or adds, per the buffer) f(i) into a gradient buffer of n elements.
template <class F>
void write_grad(const BackwardPass::Buffer& b, std::int64_t n, F f) {
  float* out = b.tensor.data<float>();
  if (b.accumulate) {
    for (std::int64_t i = 0; i < n; ++i) out[i] += f(i);
  } else {
    for (std::int64_t i = 0; i < n; ++i) out[i] = f(i);
  }
}

struct MulNode final : Node {
  using Node::Node;
  const char* name() const override { return "mul"; }
  Tensor a, b;
  GradTarget da, db;
  void backward(BackwardPass& pass) override {
    const Tensor& g = pass.output_grad(*this, 0);
    const float* dy = host_ptr(g);
    const float *pa = host_ptr(a), *pb = host_ptr(b);
    const bool shared = da.same_base(db);
    const std::int64_t n = a.numel();
    if (da.active()) write_grad(pass.grad(da, shared), n, [&](std::int64_t i) { return dy[i] * pb[i]; });
    if (db.active()) write_grad(pass.grad(db, shared), n, [&](std::int64_t i) { return dy[i] * pa[i]; });
  }
};

struct SoftcapNode final : Node {
  using Node::Node;
  const char* name() const override { return "softcap"; }
  Tensor y;
  float cap = 0.0f;
  GradTarget dx;
  void backward(BackwardPass& pass) override {
    const float* dy = host_ptr(pass.output_grad(*this, 0));
    const float* py = host_ptr(y);
    const float inv = 1.0f / cap;
    write_grad(pass.grad(dx), y.numel(), [&](std::int64_t i) {
      const float t = py[i] * inv;
      return dy[i] * (1.0f - t * t);
    });
  }
};

struct SoftmaxNode final : Node {
  using Node::Node;
  const char* name() const override { return "softmax"; }
  Tensor y;
  GradTarget dx;
  void backward(BackwardPass& pass) override {
    const float* dy = host_ptr(pass.output_grad(*this, 0));
    const float* py = host_ptr(y);
    const std::int64_t cols = y.shape().back(), rows = y.numel() / std::max<std::int64_t>(cols, 1);
    std::vector<float> dots(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (std::int64_t c = 0; c < cols; ++c) s += static_cast<double>(dy[r * cols + c]) * py[r * cols + c];
      dots[static_cast<std::size_t>(r)] = static_cast<float>(s);
    }
    write_grad(pass.grad(dx), y.numel(),
               [&](std::int64_t i) { return py[i] * (dy[i] - dots[static_cast<std::size_t>(i / cols)]); });
  }
};

struct LogsumexpNode final : Node {
  using Node::Node;
  const char* name() const override { return "logsumexp"; }
  Tensor x, y;
  GradTarget dx;
  void backward(BackwardPass& pass) override {
    const float* dy = host_ptr(pass.output_grad(*this, 0));
    const float *px = host_ptr(x), *py = host_ptr(y);
    const std::int64_t cols = x.shape().back();
    write_grad(pass.grad(dx), x.numel(), [&](std::int64_t i) {
      const std::int64_t r = i / cols;
      return dy[r] * std::exp(px[i] - py[r]);
    });
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
    const float dy = host_ptr(pass.output_grad(*this, 0))[0];
    write_grad(pass.grad(dx), n, [&](std::int64_t) { return dy; });
  }
};

}  // namespace

Tensor Ops::logsumexp(const Tensor& x_in) {
  observe({&x_in});
  constexpr const char* op = "logsumexp";
  detail::require_f32(*this, x_in, op, "x");
  if (x_in.rank() < 1 || x_in.shape().back() == 0) op_error(op, "x needs a non-empty last dimension");
  require_host(x_in, op, "x");
  const Tensor x = contiguous(x_in);
  const std::int64_t cols = x.shape().back(), rows = x.numel() / cols;
  std::vector<std::int64_t> dims(x.shape().begin(), x.shape().end() - 1);
  Tensor y = detail::empty(*this, Shape(std::span<const std::int64_t>(dims)));
  const float* px = host_ptr(x);
  float* py = y.data<float>();
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = px + r * cols;
    const float m = *std::max_element(xr, xr + cols);
    double s = 0;
    for (std::int64_t c = 0; c < cols; ++c) s += std::exp(static_cast<double>(xr[c] - m));
    py[r] = m + static_cast<float>(std::log(s));
  }
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
    require_host(p, op, "part");
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
  const std::int64_t row = parts_in[0].numel() / std::max<std::int64_t>(parts_in[0].size(0), 1);
  float* py = y.data<float>();
  for (std::size_t i = 0; i < parts.size(); ++i)
    std::copy_n(host_ptr(parts[i]), parts[i].numel(), py + begins[i] * row);
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
  require_host(x_in, op, "x");
  const Tensor x = contiguous(x_in);
  double s = 0;
  const float* px = host_ptr(x);
  for (std::int64_t i = 0; i < x.numel(); ++i) s += px[i];
  Tensor y = detail::empty(*this, Shape{});
  y.data<float>()[0] = static_cast<float>(s);
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
  require_host(a_in, op, "a");
  require_host(b_in, op, "b");
  const Tensor a = contiguous(a_in), b = contiguous(b_in);
  Tensor y = detail::empty(*this, a.shape());
  const float *pa = host_ptr(a), *pb = host_ptr(b);
  float* py = y.data<float>();
  for (std::int64_t i = 0; i < a.numel(); ++i) py[i] = pa[i] * pb[i];
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
  require_host(x_in, op, "x");
  const Tensor x = contiguous(x_in);
  Tensor y = detail::empty(*this, x.shape());
  const float* px = host_ptr(x);
  float* py = y.data<float>();
  for (std::int64_t i = 0; i < x.numel(); ++i) py[i] = cap * std::tanh(px[i] / cap);
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
  require_host(x_in, op, "x");
  const Tensor x = contiguous(x_in);
  Tensor y = detail::empty(*this, x.shape());
  const std::int64_t cols = x.shape().back(), rows = x.numel() / cols;
  const float* px = host_ptr(x);
  float* py = y.data<float>();
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = px + r * cols;
    float* yr = py + r * cols;
    const float m = *std::max_element(xr, xr + cols);
    double s = 0;
    for (std::int64_t c = 0; c < cols; ++c) s += (yr[c] = std::exp(xr[c] - m));
    const auto inv = static_cast<float>(1.0 / s);
    for (std::int64_t c = 0; c < cols; ++c) yr[c] *= inv;
  }
  if (auto* rec = detail::recording_state(tape_, {&x}, op)) {
    auto* node = rec->record<SoftmaxNode>(*backend_);
    node->y = y.detach();
    node->dx = rec->target(x);
    rec->add_output(*node, y);
  }
  return y;
}

}  // namespace loom
