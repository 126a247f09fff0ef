// Ops: construction, linear (GEMM + fused bias/activation epilogue), batched matmul, contiguous.
#include "numerics/ops_support.hpp"

namespace loom {

using detail::BackwardPass;
using detail::GradTarget;
using detail::Node;
using detail::op_error;
using detail::ptr;

namespace {
thread_local const LinearAdapters* scoped_adapters = nullptr;
}  // namespace

LinearAdaptersScope::LinearAdaptersScope(const LinearAdapters* adapters) : previous_(scoped_adapters) {
  scoped_adapters = adapters;
}
LinearAdaptersScope::~LinearAdaptersScope() {
  scoped_adapters = previous_;
}

Ops::Ops(Backend& backend, Tape* tape)
    : adapters_(scoped_adapters), backend_(&backend), buffers_(&backend.buffer_type()), tape_(tape) {}

void Ops::observe_parameters(std::initializer_list<const Tensor*> inputs) const {
  for (const Tensor* t : inputs)
    if (t && t->defined())
      if (Parameter* p = t->parameter()) parameter_observer_(*p);
}

void Ops::observe_parameters(std::span<const Tensor> inputs) const {
  for (const Tensor& t : inputs)
    if (t.defined())
      if (Parameter* p = t.parameter()) parameter_observer_(*p);
}

bool Ops::recording() const {
  return tape_ && tape_->recording();
}

namespace {

Transpose tr(bool t) {
  return t ? Transpose::yes : Transpose::no;
}

// y = act(x W^T + b) (or x W when the weight is [in, out]).
struct LinearNode final : Node {
  using Node::Node;
  const char* name() const override { return "linear"; }

  Tensor x, weight, pre;                        // x when the weight needs a gradient, weight when x does, pre for act
  const quant::StoredMatrix* stored = nullptr;  // the weight's stored form (Parameter::stored)
  GradTarget dx, dweight, dbias;
  bool weight_in_out = false;
  Activation act = Activation::none;
  std::int64_t m = 0, n = 0, k = 0;

  void backward(BackwardPass& pass) override {
    Backend& be = pass.backend();
    const Tensor& g = pass.output_grad(*this, 0);
    Tensor dpre_owned;
    const float* dpre = ptr(g);
    float* dbias_ptr = nullptr;
    bool dbias_acc = false;
    BackwardPass::Buffer bb;
    if (dbias.active()) {
      bb = pass.grad(dbias);
      dbias_ptr = ptr(bb.tensor);
      dbias_acc = bb.accumulate;
    }
    if (act != Activation::none) {
      dpre_owned = pass.empty(Shape{m, n});
      be.bias_activation_backward(ptr(pre), ptr(g), ptr(dpre_owned), dbias_ptr, dbias_acc, m, n, act);
      dpre = ptr(dpre_owned);
    } else if (dbias_ptr) {
      be.bias_activation_backward(nullptr, ptr(g), ptr(g), dbias_ptr, dbias_acc, m, n, Activation::none);
    }
    if (dx.active()) {
      auto b = pass.grad(dx);
      const detail::Matrix gx = detail::as_matrix(b.tensor);
      const detail::Matrix w = stored ? detail::Matrix{} : detail::as_matrix(weight);
      // dx[m, k] = dpre[m, n] * W[n, k]  (or * W^T when the weight is [k, n])
      detail::gemm_weight(be, stored, w.data, w.ld, weight_in_out, m, k, n, dpre, n, b.accumulate ? 1.0f : 0.0f,
                          gx.data, gx.ld);
    }
    if (dweight.active()) {
      auto b = pass.grad(dweight);
      const detail::Matrix gw = detail::as_matrix(b.tensor);
      const detail::Matrix xm = detail::as_matrix(x);
      const float beta = b.accumulate ? 1.0f : 0.0f;
      if (weight_in_out)  // dW[k, n] = x^T[k, m] * dpre[m, n]
        be.gemm(Transpose::yes, Transpose::no, k, n, m, 1.0f, xm.data, xm.ld, dpre, n, beta, gw.data, gw.ld);
      else  // dW[n, k] = dpre^T[n, m] * x[m, k]
        be.gemm(Transpose::yes, Transpose::no, n, k, m, 1.0f, dpre, n, xm.data, xm.ld, beta, gw.data, gw.ld);
    }
  }
};

struct MatmulNode final : Node {
  using Node::Node;
  const char* name() const override { return "matmul"; }

  Tensor a, b;
  GradTarget da, db;
  bool ta = false, tb = false, shared_b = false;
  std::int64_t m = 0, n = 0, k = 0, batch = 0;

  void backward(BackwardPass& pass) override {
    Backend& be = pass.backend();
    const Tensor& g = pass.output_grad(*this, 0);
    const float* dc = ptr(g);
    const std::int64_t lda = ta ? m : k, ldb = tb ? k : n;
    const std::int64_t sa = m * k, sb = shared_b ? 0 : k * n, sc = m * n;
    if (da.active()) {
      auto buf = pass.grad(da);
      const float beta = buf.accumulate ? 1.0f : 0.0f;
      if (!ta)  // dA[m, k] = dC[m, n] * op(B)^T
        be.gemm_batched(Transpose::no, tr(!tb), m, k, n, 1.0f, dc, n, sc, ptr(b), ldb, sb, beta, ptr(buf.tensor), k, sa,
                        batch);
      else  // A is stored [k, m]: dA = op(B)[k, n] * dC^T[n, m]
        be.gemm_batched(tr(tb), Transpose::yes, k, m, n, 1.0f, ptr(b), ldb, sb, dc, n, sc, beta, ptr(buf.tensor), m, sa,
                        batch);
    }
    if (db.active()) {
      auto buf = pass.grad(db);
      const float* pa = ptr(a);
      float* pdb = ptr(buf.tensor);
      // A shared B sums its gradient over the batch: one GEMM per batch, accumulating.
      const std::int64_t calls = shared_b ? batch : 1;
      const std::int64_t per_call = shared_b ? 1 : batch;
      for (std::int64_t i = 0; i < calls; ++i) {
        const float beta = (buf.accumulate || i > 0) ? 1.0f : 0.0f;
        const float* ai = pa + i * sa;
        const float* ci = dc + i * sc;
        if (!tb)  // dB[k, n] = op(A)^T[k, m] * dC[m, n]
          be.gemm_batched(tr(!ta), Transpose::no, k, n, m, 1.0f, ai, lda, sa, ci, n, sc, beta, pdb, n, k * n, per_call);
        else  // B is stored [n, k]: dB = dC^T[n, m] * op(A)[m, k]
          be.gemm_batched(Transpose::yes, tr(ta), n, k, m, 1.0f, ci, n, sc, ai, lda, sa, beta, pdb, k, k * n, per_call);
      }
    }
  }
};

struct ContiguousNode final : Node {
  using Node::Node;
  const char* name() const override { return "contiguous"; }
  GradTarget dx;
  void backward(BackwardPass& pass) override { pass.accumulate(dx, pass.output_grad(*this, 0)); }
};

}  // namespace

Tensor Ops::contiguous(const Tensor& x) {
  observe({&x});
  if (!x.defined()) op_error("contiguous", "undefined tensor");
  detail::require_device(*this, x, "contiguous", "x");
  if (x.is_contiguous()) return x;
  Tensor y = Tensor::empty(x.shape(), x.dtype(), *buffers_);
  y.copy_from(x);
  if (auto* rec = detail::recording_state(tape_, {&x}, "contiguous")) {
    auto* node = rec->record<ContiguousNode>(*backend_);
    node->dx = rec->target(x);
    rec->add_output(*node, y);
  }
  return y;
}

Tensor Ops::linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const LinearOptions& options) {
  observe({&x, &weight, &bias});
  if (adapters_ || linear_observer_) {
    // Only a weight that is a whole parameter (not a slice of one, such as an expert's rows).
    Parameter* p = weight.parameter();
    if (p && weight.dtype() == DType::f32 && weight.shape() == p->shape() &&
        weight.device_data<float>() == p->tensor().device_data<float>()) {
      if (linear_observer_) linear_observer_(*p, options.weight_in_out);
      if (adapters_)
        if (const auto it = adapters_->find(p); it != adapters_->end() && !it->second.empty())
          return adapted_linear(it->second, x, weight, bias, options);
    }
  }
  return linear_product(x, weight, bias, options);
}

// y = act(x W^T + b + sum over the adapters of scale * dropout(x) A^T B^T), composed from recorded
// operations: the backward pass is theirs. The scale applies to the rank-wide intermediate (the
// cheap side). An adapter on some of the output features has B padded with zero rows to all of
// them (concat: the zeros are constants, B's gradient is its own rows').
Tensor Ops::adapted_linear(const std::vector<LinearAdapter>& adapters, const Tensor& x, const Tensor& weight,
                           const Tensor& bias, const LinearOptions& options) {
  LinearOptions plain = options;
  plain.activation = Activation::none;
  Tensor sum = linear_product(x, weight, bias, plain);
  const std::int64_t n = options.weight_in_out ? weight.size(1) : weight.size(0);
  for (const LinearAdapter& adapter : adapters) {
    const Tensor h = adapter.dropout > 0.0f ? dropout(x, adapter.dropout) : x;
    const Tensor low = scale(linear_product(h, adapter.a->tensor(), Tensor(), {}), adapter.scale);
    Tensor b = adapter.b->tensor();
    const std::int64_t begin = adapter.rows_begin, end = adapter.rows_end == 0 ? n : adapter.rows_end;
    if (begin < 0 || end > n || end - begin != b.size(0))
      op_error("linear", "an adapter of " + std::to_string(b.size(0)) + " rows on output features [" +
                             std::to_string(begin) + ", " + std::to_string(end) + ") of a weight with " +
                             std::to_string(n));
    if (end - begin != n) {
      const std::int64_t rank = b.size(1);
      std::vector<Tensor> parts;
      if (begin > 0) parts.push_back(Tensor::zeros(Shape{begin, rank}, DType::f32, device()));
      parts.push_back(b);
      if (end < n) parts.push_back(Tensor::zeros(Shape{n - end, rank}, DType::f32, device()));
      b = concat(parts);
    }
    sum = add(sum, linear_product(low, b, Tensor(), {}));
  }
  switch (options.activation) {
    case Activation::none:
      return sum;
    case Activation::gelu_tanh:
      return gelu(sum);
    case Activation::silu:
      return silu(sum);
  }
  op_error("linear", "unknown activation");
}

Tensor Ops::linear_product(const Tensor& x_in, const Tensor& weight, const Tensor& bias, const LinearOptions& options) {
  constexpr const char* op = "linear";
  detail::require_f32(*this, x_in, op, "x");
  const quant::StoredMatrix* stored = detail::stored_weight(*this, weight, op, "weight");
  if (!stored) detail::require_f32(*this, weight, op, "weight");
  if (x_in.rank() < 1) op_error(op, "x must have at least one dimension");
  if (weight.rank() != 2 || !weight.is_row_strided())
    op_error(op, "weight must be a row-strided matrix, not " + weight.str());
  const std::int64_t k = x_in.shape().back();
  const std::int64_t wk = options.weight_in_out ? weight.size(0) : weight.size(1);
  const std::int64_t n = options.weight_in_out ? weight.size(1) : weight.size(0);
  if (wk != k)
    op_error(op, "x has " + std::to_string(k) + " features but weight " + weight.shape().str() + " expects " +
                     std::to_string(wk) + (options.weight_in_out ? " ([in, out] layout)" : " ([out, in] layout)"));
  detail::require_vector(*this, bias, n, op, "bias");
  detail::require_op(*this, BackendOp::linear, DType::f32, op);
  detail::require_op(*this, BackendOp::gemm, DType::f32, op);
  const Tensor x = x_in.is_row_strided() ? x_in : contiguous(x_in);
  const detail::Matrix xm = detail::as_matrix(x);
  const detail::Matrix wm = stored ? detail::Matrix{} : detail::as_matrix(weight);
  const std::int64_t m = xm.rows;

  Tensor pre, out;
  if (remat_replay_) {  // recomputing a save_dots segment: the product was kept
    pre = (*remat_replay_).at(remat_next_++);
    out = options.activation == Activation::none ? pre : (*remat_replay_).at(remat_next_++);
  } else {
    pre = detail::empty(*this, x.shape().with_back(n));
    out = options.activation == Activation::none ? pre : detail::empty(*this, pre.shape());
    float* act_out = options.activation == Activation::none ? nullptr : ptr(out);
    if (stored) {
      detail::gemm_weight(*backend_, stored, nullptr, 0, !options.weight_in_out, m, n, k, xm.data, xm.ld, 0.0f,
                          ptr(pre), n);
      if (bias.defined() || act_out)
        backend_->bias_activation_forward(ptr(pre), detail::data_or_null(bias), act_out, m, n, options.activation);
    } else {
      backend_->linear_forward(Transpose::no, tr(!options.weight_in_out), m, n, k, xm.data, xm.ld, wm.data, wm.ld,
                               ptr(pre), detail::data_or_null(bias), act_out, options.activation);
    }
    if (remat_save_) {
      remat_save_->push_back(pre);
      if (options.activation != Activation::none) remat_save_->push_back(out);
    }
  }

  if (auto* rec = detail::recording_state(tape_, {&x, &weight, &bias}, op)) {
    auto* node = rec->record<LinearNode>(*backend_);
    node->dx = rec->target(x);
    node->dweight = rec->target(weight);
    if (bias.defined()) node->dbias = rec->target(bias);
    if (node->dweight.active()) node->x = x;
    if (node->dx.active()) node->weight = weight;
    node->stored = stored;
    if (options.activation != Activation::none) node->pre = pre;
    node->weight_in_out = options.weight_in_out;
    node->act = options.activation;
    node->m = m;
    node->n = n;
    node->k = k;
    rec->add_output(*node, out);
  }
  return out;
}

Tensor Ops::matmul(const Tensor& a_in, const Tensor& b_in, bool transpose_a, bool transpose_b) {
  observe({&a_in, &b_in});
  constexpr const char* op = "matmul";
  detail::require_f32(*this, a_in, op, "a");
  detail::require_f32(*this, b_in, op, "b");
  detail::require_op(*this, BackendOp::gemm, DType::f32, op);
  if (a_in.rank() < 2 || b_in.rank() < 2)
    op_error(op, "operands must have rank >= 2: " + a_in.str() + ", " + b_in.str());
  const bool shared_b = b_in.rank() == 2 && a_in.rank() > 2;
  if (!shared_b && a_in.rank() != b_in.rank())
    op_error(op, "batch dimensions differ: " + a_in.shape().str() + " and " + b_in.shape().str());
  std::int64_t batch = 1;
  for (int d = 0; d < a_in.rank() - 2; ++d) {
    if (!shared_b && a_in.size(d) != b_in.size(d))
      op_error(op, "batch dimensions differ: " + a_in.shape().str() + " and " + b_in.shape().str());
    batch *= a_in.size(d);
  }
  const std::int64_t m = transpose_a ? a_in.size(-1) : a_in.size(-2);
  const std::int64_t k = transpose_a ? a_in.size(-2) : a_in.size(-1);
  const std::int64_t bk = transpose_b ? b_in.size(-1) : b_in.size(-2);
  const std::int64_t n = transpose_b ? b_in.size(-2) : b_in.size(-1);
  if (k != bk)
    op_error(op, "inner dimensions differ: " + a_in.shape().str() + (transpose_a ? "^T" : "") + " x " +
                     b_in.shape().str() + (transpose_b ? "^T" : ""));
  const Tensor a = contiguous(a_in);
  const Tensor b = contiguous(b_in);
  Shape out_shape = a.shape();
  out_shape[a.rank() - 2] = m;
  out_shape[a.rank() - 1] = n;
  Tensor out;
  if (remat_replay_) {  // recomputing a save_dots segment: the product was kept
    out = (*remat_replay_).at(remat_next_++);
  } else {
    out = detail::empty(*this, out_shape);
    backend_->gemm_batched(tr(transpose_a), tr(transpose_b), m, n, k, 1.0f, ptr(a), transpose_a ? m : k, m * k, ptr(b),
                           transpose_b ? k : n, shared_b ? 0 : k * n, 0.0f, ptr(out), n, m * n, batch);
    if (remat_save_) remat_save_->push_back(out);
  }
  if (auto* rec = detail::recording_state(tape_, {&a, &b}, op)) {
    auto* node = rec->record<MatmulNode>(*backend_);
    node->da = rec->target(a);
    node->db = rec->target(b);
    if (node->db.active()) node->a = a;
    if (node->da.active()) node->b = b;
    node->ta = transpose_a;
    node->tb = transpose_b;
    node->shared_b = shared_b;
    node->m = m;
    node->n = n;
    node->k = k;
    node->batch = batch;
    rec->add_output(*node, out);
  }
  return out;
}

}  // namespace loom
