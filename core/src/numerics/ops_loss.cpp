// Softmax cross-entropy over the vocabulary: on given logits, and fused with the output
// projection so that the logits of all tokens never exist at once.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "loom/kinds/collective.hpp"
#include "numerics/ops_support.hpp"

namespace loom {

using detail::BackwardPass;
using detail::GradTarget;
using detail::Node;
using detail::op_error;
using detail::ptr;

namespace {

// Rows of logits per chunk when the backward pass must build the gradient in a scratch buffer.
constexpr std::int64_t scratch_rows = 64;

// Checks the targets and counts those not ignored (on the host, through a copy for a device).
std::int64_t count_targets(const Tensor& targets, std::int64_t vocab, std::int32_t ignore, const char* op) {
  const Tensor host_targets = detail::host_readable(targets);
  const std::int32_t* t = host_targets.data<std::int32_t>();
  std::int64_t count = 0;
  for (std::int64_t i = 0; i < targets.numel(); ++i) {
    if (t[i] == ignore) continue;
    if (t[i] < 0 || t[i] >= vocab)
      op_error(op, "target " + std::to_string(t[i]) + " at position " + std::to_string(i) + " is outside [0, " +
                       std::to_string(vocab) + ") and is not ignore_index " + std::to_string(ignore));
    ++count;
  }
  return count;
}

// The factor that turns per-row losses into the reduced loss.
float reduction_scale(Reduction r, std::int64_t count) {
  return r != Reduction::mean ? 1.0f : count > 0 ? 1.0f / static_cast<float>(count) : 0.0f;
}

// The reduced loss (the per-row losses summed in row order in float64, times `scale`, plus the
// z-loss term) as a scalar in the backend's memory: the loss kernel computes it where the losses
// are, deterministically and with no copy to the host.
Tensor loss_value(Backend& be, BufferType& buffers, const Tensor& losses, const Tensor& lse,
                  const std::int32_t* targets, std::int64_t rows, std::int32_t ignore, float scale,
                  float z_loss_weight) {
  Tensor value = detail::empty(buffers, Shape{});
  be.loss_reduce(ptr(losses), ptr(lse), targets, rows, ignore, scale, z_loss_weight, ptr(value));
  return value;
}

// Rows holding g (softmax - onehot) (cross_entropy_backward's output) into the gradient of the
// loss plus z-loss (Backend::z_loss_backward); nothing without z-loss.
void add_z_loss_gradient(Backend& be, float* rows, std::int64_t ld, const std::int32_t* targets, const float* lse,
                         float g, float w, std::int64_t n, std::int64_t cols, std::int32_t ignore) {
  if (w != 0.0f) be.z_loss_backward(rows, ld, targets, lse, g, w, n, cols, ignore);
}

// Reduction::none: the per-target losses (shaped like `targets`), each with its z-loss term.
Tensor per_target_losses(Backend& be, const Tensor& losses, const Tensor& lse, const std::int32_t* targets,
                         std::int64_t rows, std::int32_t ignore, float z_loss_weight, const Shape& shape) {
  if (z_loss_weight != 0.0f) be.z_loss_forward(ptr(losses), ptr(lse), targets, rows, ignore, z_loss_weight);
  return losses.view(shape);
}

// The seed of each row of a Reduction::none loss, on the host (zeros when none reached it).
std::vector<float> row_seeds(const Tensor& grad, std::int64_t rows) {
  if (!grad.defined()) return std::vector<float>(static_cast<std::size_t>(rows), 0.0f);
  return detail::host_readable(grad).to_vector();
}

struct CrossEntropyNode final : Node {
  using Node::Node;
  const char* name() const override { return "cross_entropy"; }
  Tensor logits, targets, lse;
  GradTarget dlogits;
  float scale = 1.0f;
  float z_loss_weight = 0.0f;
  std::int32_t ignore = -100;
  bool per_row = false;  // Reduction::none

  void backward(BackwardPass& pass) override {
    Backend& be = pass.backend();
    const detail::Matrix l = detail::as_matrix(logits);
    const std::int32_t* t = detail::ids_ptr(targets);
    // Reduction::none: each row has its own seed; otherwise one scalar for every row.
    const std::vector<float> seeds = per_row ? row_seeds(pass.output_grad(*this, 0), l.rows) : std::vector<float>();
    const float g = per_row ? 0.0f : pass.output_grad(*this, 0).item() * scale;
    // Rows [r0, r0 + n) of the logits, held at `rows` with stride ld, into their gradient.
    auto to_gradient = [&](float* rows, std::int64_t ld, std::int64_t r0, std::int64_t n) {
      if (!per_row) {
        be.cross_entropy_backward(rows, ld, t + r0, ptr(lse) + r0, g, n, l.cols, ignore);
        add_z_loss_gradient(be, rows, ld, t + r0, ptr(lse) + r0, g, z_loss_weight, n, l.cols, ignore);
        return;
      }
      for (std::int64_t r = 0; r < n; ++r) {
        const float gr = seeds[static_cast<std::size_t>(r0 + r)];
        be.cross_entropy_backward(rows + r * ld, ld, t + r0 + r, ptr(lse) + r0 + r, gr, 1, l.cols, ignore);
        add_z_loss_gradient(be, rows + r * ld, ld, t + r0 + r, ptr(lse) + r0 + r, gr, z_loss_weight, 1, l.cols, ignore);
      }
    };
    if (logits.storage_use_count() == 1) {
      // Nobody else can see the logits: they become their own gradient.
      to_gradient(l.data, l.ld, 0, l.rows);
      if (l.ld == l.cols)
        pass.give(dlogits, std::move(logits));
      else
        pass.accumulate(dlogits, logits);
      return;
    }
    // The logits are still in use elsewhere: build the gradient a few rows at a time.
    auto b = pass.grad(dlogits);
    const detail::Matrix d = detail::as_matrix(b.tensor);
    const std::int64_t chunk = std::min(scratch_rows, l.rows);
    Tensor scratch = pass.empty(Shape{chunk, l.cols});
    float* s = ptr(scratch);
    for (std::int64_t r0 = 0; r0 < l.rows; r0 += chunk) {
      const std::int64_t n = std::min(chunk, l.rows - r0);
      if (logits.is_host_visible()) {
        for (std::int64_t r = 0; r < n; ++r)
          std::memcpy(s + r * l.cols, l.data + (r0 + r) * l.ld, static_cast<std::size_t>(l.cols) * sizeof(float));
      } else {
        // Rows r0 .. r0 + n of the logits (row stride ld) into the scratch, on the device.
        const Tensor rows =
            detail::TensorAccess::view_of(logits, logits.offset() + r0 * l.ld, Shape{n, l.cols}, Strides{l.ld, 1});
        scratch.slice(0, 0, n).copy_from(rows);
      }
      to_gradient(s, l.cols, r0, n);
      for (std::int64_t r = 0; r < n; ++r)
        be.scale(s + r * l.cols, 1.0f, d.data + (r0 + r) * d.ld, l.cols, b.accumulate);
    }
  }
};

struct LinearCrossEntropyNode final : Node {
  using Node::Node;
  const char* name() const override { return "linear_cross_entropy"; }
  Tensor dx, dweight;  // gradients for a seed of 1, computed in the forward pass
  GradTarget tx, tweight;

  void backward(BackwardPass& pass) override {
    const float g = pass.output_grad(*this, 0).item();
    if (g == 1.0f) {
      pass.give(tx, std::move(dx));
      pass.give(tweight, std::move(dweight));
    } else {
      pass.accumulate(tx, dx, g);
      pass.accumulate(tweight, dweight, g);
    }
  }
};

// linear_cross_entropy with Reduction::none: the gradient depends on each target's seed, so the
// backward pass projects the chunks again and applies the seeds row by row.
// One chunk's share of the projection's gradients from its logits' gradient l [n, cols] (rows
// r0 .. r0 + n of x): dx's rows = l W, and dW (+)= l^T x (the first chunk starts it). The fused
// losses' forward and backward passes, whole vocabulary or a member's rows of it, all end so.
void chunk_gradients(Backend& be, const quant::StoredMatrix* stored, const detail::Matrix& wm, const detail::Matrix& xm,
                     std::int64_t r0, std::int64_t n, std::int64_t cols, const float* l, const Tensor& dx,
                     const Tensor& dweight) {
  const std::int64_t dim = xm.cols;
  if (dx.defined())  // dx[n, dim] = dlogits[n, cols] * W[cols, dim]
    detail::gemm_weight(be, stored, wm.data, wm.ld, false, n, dim, cols, l, cols, 0.0f, ptr(dx) + r0 * dim, dim);
  if (dweight.defined())  // dW[cols, dim] += dlogits^T[cols, n] * x[n, dim]
    be.gemm(Transpose::yes, Transpose::no, cols, dim, n, 1.0f, l, cols, xm.data + r0 * xm.ld, xm.ld,
            r0 == 0 ? 0.0f : 1.0f, ptr(dweight), dim);
}

// What the backward pass of linear_cross_entropy with Reduction::none keeps to project the
// chunks again (whole vocabulary, or a member's rows of it).
struct RowsLossNode : Node {
  using Node::Node;
  Tensor x, weight, targets, lse;
  const quant::StoredMatrix* stored = nullptr;  // the weight's stored form (Parameter::stored)
  GradTarget tx, tweight;
  std::int64_t chunk = 1;
  float cap = 0.0f;
  float z_loss_weight = 0.0f;
  std::int32_t ignore = -100;

  // Records it as the node of `out` (the per-target losses).
  template <class N>
  static void record(detail::TapeState& rec, Backend& backend, Tensor& out, const Tensor& x, const Tensor& weight,
                     const quant::StoredMatrix* stored, const Tensor& targets, const Tensor& lse, GradTarget tx,
                     GradTarget tweight, std::int64_t chunk, float cap, float z_loss_weight, std::int32_t ignore,
                     const std::function<void(N&)>& more = {}) {
    auto* node = rec.record<N>(backend);
    node->x = x.detach();
    node->weight = weight.detach();
    node->stored = stored;
    node->targets = targets;
    node->lse = lse;
    node->tx = tx;
    node->tweight = tweight;
    node->chunk = chunk;
    node->cap = cap;
    node->z_loss_weight = z_loss_weight;
    node->ignore = ignore;
    if (more) more(*node);
    rec.add_output(*node, out);
  }

  // The end of backward(): the gradients built chunk by chunk, handed on (no rows: dW is zero).
  void hand_on(BackwardPass& pass, std::int64_t rows, Tensor&& dx, Tensor&& dweight) {
    if (rows == 0 && dweight.defined()) pass.backend().fill(ptr(dweight), 0.0f, dweight.numel());
    if (dx.defined()) pass.give(tx, std::move(dx));
    if (dweight.defined()) pass.give(tweight, std::move(dweight));
  }
};

struct LinearCrossEntropyRowsNode final : RowsLossNode {
  using RowsLossNode::RowsLossNode;
  const char* name() const override { return "linear_cross_entropy"; }

  void backward(BackwardPass& pass) override {
    Backend& be = pass.backend();
    const detail::Matrix xm = detail::as_matrix(x);
    const detail::Matrix wm = stored ? detail::Matrix{} : detail::as_matrix(weight);
    const std::int64_t rows = xm.rows, dim = xm.cols, vocab = stored ? stored->rows : wm.rows;
    const std::vector<float> seeds = row_seeds(pass.output_grad(*this, 0), rows);
    const std::int32_t* t = detail::ids_ptr(targets);
    Tensor logits = pass.empty(Shape{chunk, vocab});
    Tensor capped = cap > 0.0f ? pass.empty(Shape{chunk, vocab}) : Tensor();
    Tensor dx = tx.active() ? pass.empty(x.shape()) : Tensor();
    Tensor dweight = tweight.active() ? pass.empty(weight.shape()) : Tensor();
    float* l = ptr(logits);
    for (std::int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const std::int64_t n = std::min(chunk, rows - r0);
      const float* xr = xm.data + r0 * xm.ld;
      detail::gemm_weight(be, stored, wm.data, wm.ld, true, n, vocab, dim, xr, xm.ld, 0.0f, l, vocab);
      if (cap > 0.0f) be.softcap_forward(l, l, ptr(capped), n * vocab, cap);
      for (std::int64_t r = 0; r < n; ++r) {
        const float g = seeds[static_cast<std::size_t>(r0 + r)];
        be.cross_entropy_backward(l + r * vocab, vocab, t + r0 + r, ptr(lse) + r0 + r, g, 1, vocab, ignore);
        add_z_loss_gradient(be, l + r * vocab, vocab, t + r0 + r, ptr(lse) + r0 + r, g, z_loss_weight, 1, vocab,
                            ignore);
      }
      // The soft-cap's factor 1 - tanh^2, from the tanh the forward kept.
      if (capped.defined()) be.softcap_backward(ptr(capped), 1.0f, l, l, n * vocab, false);
      chunk_gradients(be, stored, wm, xm, r0, n, vocab, l, dx, dweight);
    }
    hand_on(pass, rows, std::move(dx), std::move(dweight));
  }
};

// ---- Vocabulary parallelism (CrossEntropyOptions::vocab_size; Ops::tensor_group) ----

struct VocabShard {
  CollectiveGroup* group = nullptr;
  std::int64_t begin = 0;  // the first whole-vocabulary row this member's weight holds
  std::int64_t rows = 0;   // its rows
};

// Capped logits of rows [r0, r0 + n) of x times this member's weight: l [n, rows]; with a cap,
// th holds tanh(logit / cap) for the backward factor.
void vocab_logits(Backend& be, const quant::StoredMatrix* stored, const detail::Matrix& wm, const detail::Matrix& xm,
                  std::int64_t r0, std::int64_t n, std::int64_t vl, float cap, float* l, float* th) {
  detail::gemm_weight(be, stored, wm.data, wm.ld, true, n, vl, xm.cols, xm.data + r0 * xm.ld, xm.ld, 0.0f, l, vl);
  if (cap > 0.0f)
    for (std::int64_t i = 0; i < n * vl; ++i) {
      const float h = std::tanh(l[i] / cap);
      l[i] = cap * h;
      if (th) th[i] = h;
    }
}

// The log-sum-exp over the whole vocabulary of each of n rows, and each row's loss (lse minus
// its target's logit; 0 where ignored): one all-reduce (max) and one (sum, in double) of the
// members' parts.
void vocab_lse(const VocabShard& v, const float* l, std::int64_t n, const std::int32_t* t, std::int32_t ignore,
               float* lse, float* losses) {
  const std::int64_t vl = v.rows;
  std::vector<float> m(static_cast<std::size_t>(n));
  for (std::int64_t r = 0; r < n; ++r) {
    float mx = -INFINITY;
    for (std::int64_t j = 0; j < vl; ++j) mx = std::max(mx, l[r * vl + j]);
    m[static_cast<std::size_t>(r)] = mx;
  }
  v.group->all_reduce(std::span<float>(m), ReduceOp::max);
  std::vector<double> sums(static_cast<std::size_t>(2 * n), 0.0);  // [sum exp | target logit]
  for (std::int64_t r = 0; r < n; ++r) {
    const float mx = m[static_cast<std::size_t>(r)];
    double s = 0.0;
    for (std::int64_t j = 0; j < vl; ++j) s += std::exp(static_cast<double>(l[r * vl + j] - mx));
    sums[static_cast<std::size_t>(r)] = s;
    const std::int64_t local = static_cast<std::int64_t>(t[r]) - v.begin;
    if (t[r] != ignore && local >= 0 && local < vl) sums[static_cast<std::size_t>(n + r)] = l[r * vl + local];
  }
  v.group->all_reduce(std::span<double>(sums));
  for (std::int64_t r = 0; r < n; ++r) {
    const double z = m[static_cast<std::size_t>(r)] + std::log(sums[static_cast<std::size_t>(r)]);
    lse[r] = static_cast<float>(z);
    losses[r] = t[r] == ignore ? 0.0f : static_cast<float>(z - sums[static_cast<std::size_t>(n + r)]);
  }
}

// Rows l [n, rows] of capped logits into d loss / d (uncapped) logits for seeds g[r] (or one g
// for every row when seeds is null): g (softmax (1 + 2 w lse) - onehot), times 1 - tanh^2 with a
// cap; 0 for ignored rows.
void vocab_gradient(const VocabShard& v, float* l, std::int64_t n, const std::int32_t* t, std::int32_t ignore,
                    const float* lse, const float* seeds, float g, float z_loss_weight, const float* th) {
  const std::int64_t vl = v.rows;
  for (std::int64_t r = 0; r < n; ++r) {
    float* row = l + r * vl;
    const float gr = seeds ? seeds[r] : g;
    if (t[r] == ignore || gr == 0.0f) {
      std::fill_n(row, vl, 0.0f);
      continue;
    }
    const float factor = gr * (1.0f + 2.0f * z_loss_weight * lse[r]);
    for (std::int64_t j = 0; j < vl; ++j) row[j] = factor * std::exp(row[j] - lse[r]);
    const std::int64_t local = static_cast<std::int64_t>(t[r]) - v.begin;
    if (local >= 0 && local < vl) row[local] -= gr;
  }
  if (th)
    for (std::int64_t i = 0; i < n * vl; ++i) l[i] *= 1.0f - th[i] * th[i];
}

// Reduction::none under vocabulary parallelism: the backward pass projects the chunks again and
// applies each row's seed (no communication: the log-sum-exps were kept).
struct VocabCrossEntropyRowsNode final : RowsLossNode {
  using RowsLossNode::RowsLossNode;
  const char* name() const override { return "linear_cross_entropy (vocab parallel)"; }
  VocabShard shard;

  void backward(BackwardPass& pass) override {
    Backend& be = pass.backend();
    const detail::Matrix xm = detail::as_matrix(x);
    const detail::Matrix wm = stored ? detail::Matrix{} : detail::as_matrix(weight);
    const std::int64_t rows = xm.rows, vl = shard.rows;
    const std::vector<float> seeds = row_seeds(pass.output_grad(*this, 0), rows);
    const std::int32_t* t = detail::ids_ptr(targets);
    Tensor logits = pass.empty(Shape{chunk, vl});
    Tensor th = cap > 0.0f ? pass.empty(Shape{chunk, vl}) : Tensor();
    Tensor dx = tx.active() ? pass.empty(x.shape()) : Tensor();
    Tensor dweight = tweight.active() ? pass.empty(weight.shape()) : Tensor();
    float* l = ptr(logits);
    for (std::int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const std::int64_t n = std::min(chunk, rows - r0);
      vocab_logits(be, stored, wm, xm, r0, n, vl, cap, l, th.defined() ? ptr(th) : nullptr);
      vocab_gradient(shard, l, n, t + r0, ignore, ptr(lse) + r0, seeds.data() + r0, 0.0f, z_loss_weight,
                     th.defined() ? ptr(th) : nullptr);
      chunk_gradients(be, stored, wm, xm, r0, n, vl, l, dx, dweight);
    }
    hand_on(pass, rows, std::move(dx), std::move(dweight));
  }
};

// linear_cross_entropy's vocabulary-parallel form (CrossEntropyOptions::vocab_size > 0).
Tensor vocab_parallel_cross_entropy(Ops& ops, Tape* tape, const Tensor& x, const Tensor& weight,
                                    const quant::StoredMatrix* stored, const Tensor& targets,
                                    const CrossEntropyOptions& options, float z_loss_weight) {
  constexpr const char* op = "linear_cross_entropy";
  CollectiveGroup* group = ops.tensor_group();
  const std::int64_t vl = stored ? stored->rows : weight.size(0);
  if (!group)
    op_error(op,
             "vocab_size " + std::to_string(options.vocab_size) + " (vocabulary parallelism) without a tensor group");
  if (!(x.is_host_visible() && weight.is_host_visible() && targets.is_host_visible()))
    op_error(op, "vocabulary parallelism computes on host-visible memory");
  if (options.vocab_begin < 0 || options.vocab_begin + vl > options.vocab_size)
    op_error(op, "rows [" + std::to_string(options.vocab_begin) + ", " + std::to_string(options.vocab_begin + vl) +
                     ") of a vocabulary of " + std::to_string(options.vocab_size));
  Backend& be = ops.backend();
  const VocabShard shard{group, options.vocab_begin, vl};
  const detail::Matrix xm = detail::as_matrix(x);
  const detail::Matrix wm = stored ? detail::Matrix{} : detail::as_matrix(weight);
  const std::int64_t rows = xm.rows;
  const std::int64_t count = count_targets(targets, options.vocab_size, options.ignore_index, op);
  const float scale = reduction_scale(options.reduction, count);
  const float cap = options.logit_softcap;
  const std::int32_t* t = detail::ids_ptr(targets);
  std::int64_t chunk = options.chunk_tokens;
  if (chunk == 0)
    chunk = std::max<std::int64_t>(16, (std::int64_t{256} << 20) / (std::max<std::int64_t>(vl, 1) * 4) / 16 * 16);
  chunk = std::max<std::int64_t>(1, std::min(chunk, rows));

  auto* rec = detail::recording_state(tape, {&x, &weight}, op);
  GradTarget tx, tw;
  if (rec) {
    tx = rec->target(x);
    tw = rec->target(weight);
  }
  Tensor losses = detail::empty(ops, Shape{rows});
  Tensor lse = detail::empty(ops, Shape{rows});
  Tensor logits = detail::empty(ops, Shape{chunk, vl});
  float* l = ptr(logits);
  const bool per_row = options.reduction == Reduction::none;
  // Mean and sum: the gradients for a seed of 1 are computed here, chunk by chunk, as
  // LinearCrossEntropyNode's; none: the backward pass projects again.
  const bool grads_now = rec && !per_row;
  Tensor th = cap > 0.0f && grads_now ? detail::empty(ops, Shape{chunk, vl}) : Tensor();
  Tensor dx = grads_now && tx.active() ? detail::empty(ops, x.shape()) : Tensor();
  Tensor dweight = grads_now && tw.active() ? detail::empty(ops, weight.shape()) : Tensor();
  for (std::int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const std::int64_t n = std::min(chunk, rows - r0);
    vocab_logits(be, stored, wm, xm, r0, n, vl, cap, l, th.defined() ? ptr(th) : nullptr);
    vocab_lse(shard, l, n, t + r0, options.ignore_index, ptr(lse) + r0, ptr(losses) + r0);
    if (!grads_now) continue;
    vocab_gradient(shard, l, n, t + r0, options.ignore_index, ptr(lse) + r0, nullptr, scale, z_loss_weight,
                   th.defined() ? ptr(th) : nullptr);
    chunk_gradients(be, stored, wm, xm, r0, n, vl, l, dx, dweight);
  }
  logits.reset();
  th.reset();
  if (rows == 0 && dweight.defined()) be.fill(ptr(dweight), 0.0f, dweight.numel());
  if (per_row) {
    Tensor out = per_target_losses(be, losses, lse, t, rows, options.ignore_index, z_loss_weight, targets.shape());
    if (rec)
      RowsLossNode::record<VocabCrossEntropyRowsNode>(*rec, be, out, x, weight, stored, targets, lse, tx, tw, chunk,
                                                      cap, z_loss_weight, options.ignore_index,
                                                      [&](VocabCrossEntropyRowsNode& node) { node.shard = shard; });
    return out;
  }
  Tensor loss = loss_value(be, ops.buffer_type(), losses, lse, t, rows, options.ignore_index, scale, z_loss_weight);
  if (rec) {
    auto* node = rec->record<LinearCrossEntropyNode>(be);
    node->tx = tx;
    node->tweight = tw;
    node->dx = std::move(dx);
    node->dweight = std::move(dweight);
    rec->add_output(*node, loss);
    rec->values_not_needed(weight);
  }
  return loss;
}

}  // namespace

Tensor Ops::cross_entropy(const Tensor& logits_in, const Tensor& targets, const CrossEntropyOptions& options) {
  observe({&logits_in});
  constexpr const char* op = "cross_entropy";
  detail::require_f32(*this, logits_in, op, "logits");
  detail::require_i32(*this, targets, op, "targets");
  if (logits_in.rank() < 1 || logits_in.shape().back() == 0) op_error(op, "logits need a vocabulary dimension");
  if (options.logit_softcap != 0.0f) op_error(op, "logit_softcap is for linear_cross_entropy (use Ops::softcap here)");
  detail::require_op(*this, BackendOp::cross_entropy, DType::f32, op);
  detail::require_op(*this, BackendOp::loss, DType::f32, op);
  const std::int64_t vocab = logits_in.shape().back();
  if (targets.numel() != logits_in.shape().rows())
    op_error(op, "targets " + targets.shape().str() + " do not match logits " + logits_in.shape().str());
  const Tensor logits = logits_in.is_row_strided() ? logits_in : contiguous(logits_in);
  const detail::Matrix l = detail::as_matrix(logits);
  const std::int64_t count = count_targets(targets, vocab, options.ignore_index, op);
  const float scale = reduction_scale(options.reduction, count);

  Tensor losses = detail::empty(*this, Shape{l.rows});
  Tensor lse = detail::empty(*this, Shape{l.rows});
  backend_->cross_entropy_forward(l.data, l.ld, detail::ids_ptr(targets), ptr(losses), ptr(lse), l.rows, vocab,
                                  options.ignore_index);
  const bool per_row = options.reduction == Reduction::none;
  if (per_row) {
    Tensor out = per_target_losses(*backend_, losses, lse, detail::ids_ptr(targets), l.rows, options.ignore_index,
                                   z_loss_weight_, targets.shape());
    if (auto* rec = detail::recording_state(tape_, {&logits}, op)) {
      auto* node = rec->record<CrossEntropyNode>(*backend_);
      node->logits = logits.detach();
      node->targets = targets;
      node->lse = lse;
      node->dlogits = rec->target(logits);
      node->z_loss_weight = z_loss_weight_;
      node->ignore = options.ignore_index;
      node->per_row = true;
      rec->add_output(*node, out);
    }
    return out;
  }
  Tensor loss = loss_value(*backend_, *buffers_, losses, lse, detail::ids_ptr(targets), l.rows, options.ignore_index,
                           scale, z_loss_weight_);
  if (auto* rec = detail::recording_state(tape_, {&logits}, op)) {
    auto* node = rec->record<CrossEntropyNode>(*backend_);
    node->logits = logits.detach();
    node->targets = targets;
    node->lse = lse;
    node->dlogits = rec->target(logits);
    node->scale = scale;
    node->z_loss_weight = z_loss_weight_;
    node->ignore = options.ignore_index;
    rec->add_output(*node, loss);
  }
  return loss;
}

Tensor Ops::linear_cross_entropy(const Tensor& x_in, const Tensor& weight, const Tensor& targets,
                                 const CrossEntropyOptions& options) {
  observe({&x_in, &weight});
  constexpr const char* op = "linear_cross_entropy";
  detail::require_f32(*this, x_in, op, "x");
  const quant::StoredMatrix* stored = detail::stored_weight(*this, weight, op, "weight");
  if (!stored) detail::require_f32(*this, weight, op, "weight");
  detail::require_i32(*this, targets, op, "targets");
  if (weight.rank() != 2 || !weight.is_row_strided())
    op_error(op, "weight must be a row-strided [vocab, dim], not " + weight.str());
  detail::require_op(*this, BackendOp::gemm, DType::f32, op);
  detail::require_op(*this, BackendOp::cross_entropy, DType::f32, op);
  detail::require_op(*this, BackendOp::loss, DType::f32, op);
  if (x_in.rank() < 1 || x_in.shape().back() != weight.size(1))
    op_error(op, "x " + x_in.shape().str() + " does not match weight " + weight.shape().str());
  if (targets.numel() != x_in.shape().rows())
    op_error(op, "targets " + targets.shape().str() + " do not match x " + x_in.shape().str());
  if (options.chunk_tokens < 0) op_error(op, "chunk_tokens must be >= 0");
  const float cap = options.logit_softcap;
  if (!(cap >= 0.0f)) op_error(op, "logit_softcap must be >= 0");
  if (cap > 0.0f) detail::require_op(*this, BackendOp::softcap, DType::f32, op);
  if (adapters_) {
    // An adapted output head (LoRA on lm_head): the logits whole, through linear's adapters, then
    // the plain cross-entropy; the chunked path below has no place for the adapters' products.
    const Parameter* p = weight.parameter();
    if (p && weight.shape() == p->shape() && weight.device_data<float>() == p->tensor().device_data<float>())
      if (const auto it = adapters_->find(p); it != adapters_->end() && !it->second.empty()) {
        if (options.vocab_size > 0)
          op_error(op, "low-rank adapters on a vocabulary-parallel output layer are not supported");
        Tensor logits = adapted_linear(it->second, x_in, weight, Tensor(), {});
        if (cap > 0.0f) logits = softcap(logits, cap);
        CrossEntropyOptions whole = options;
        whole.chunk_tokens = 0;
        whole.logit_softcap = 0.0f;
        return cross_entropy(logits, targets, whole);
      }
  }
  const Tensor x = x_in.is_row_strided() ? x_in : contiguous(x_in);
  if (options.vocab_size > 0) {
    return vocab_parallel_cross_entropy(*this, tape_, x, weight, stored, targets, options, z_loss_weight_);
  }
  const detail::Matrix xm = detail::as_matrix(x);
  const detail::Matrix wm = stored ? detail::Matrix{} : detail::as_matrix(weight);
  const std::int64_t rows = xm.rows, dim = xm.cols, vocab = weight.size(0);
  const std::int64_t count = count_targets(targets, vocab, options.ignore_index, op);
  const float scale = reduction_scale(options.reduction, count);

  auto* rec = detail::recording_state(tape_, {&x, &weight}, op);
  GradTarget tx, tw;
  if (rec) {
    tx = rec->target(x);
    tw = rec->target(weight);
  }
  std::int64_t chunk = options.chunk_tokens;
  if (chunk == 0) chunk = std::max<std::int64_t>(16, (std::int64_t{256} << 20) / (vocab * 4) / 16 * 16);
  chunk = std::max<std::int64_t>(1, std::min(chunk, rows));

  Tensor losses = detail::empty(*this, Shape{rows});
  Tensor lse = detail::empty(*this, Shape{rows});
  Tensor logits = detail::empty(*this, Shape{chunk, vocab});
  if (options.reduction == Reduction::none) {
    // The losses alone now; the backward pass (LinearCrossEntropyRowsNode) projects again.
    const std::int32_t* t = detail::ids_ptr(targets);
    float* l = ptr(logits);
    for (std::int64_t r0 = 0; r0 < rows; r0 += chunk) {
      const std::int64_t n = std::min(chunk, rows - r0);
      detail::gemm_weight(*backend_, stored, wm.data, wm.ld, true, n, vocab, dim, xm.data + r0 * xm.ld, xm.ld, 0.0f, l,
                          vocab);
      if (cap > 0.0f) backend_->softcap_forward(l, l, nullptr, n * vocab, cap);
      backend_->cross_entropy_forward(l, vocab, t + r0, ptr(losses) + r0, ptr(lse) + r0, n, vocab,
                                      options.ignore_index);
    }
    Tensor out =
        per_target_losses(*backend_, losses, lse, t, rows, options.ignore_index, z_loss_weight_, targets.shape());
    if (rec)
      RowsLossNode::record<LinearCrossEntropyRowsNode>(*rec, *backend_, out, x, weight, stored, targets, lse, tx, tw,
                                                       chunk, cap, z_loss_weight_, options.ignore_index);
    return out;
  }
  // With soft-capping: tanh(logit / cap) of the chunk, for the backward factor 1 - tanh^2.
  Tensor capped = cap > 0.0f && rec ? detail::empty(*this, Shape{chunk, vocab}) : Tensor();
  Tensor dx = tx.active() ? detail::empty(*this, x.shape()) : Tensor();
  Tensor dweight = tw.active() ? detail::empty(*this, weight.shape()) : Tensor();
  const std::int32_t* t = detail::ids_ptr(targets);
  float* l = ptr(logits);
  for (std::int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const std::int64_t n = std::min(chunk, rows - r0);
    const float* xr = xm.data + r0 * xm.ld;
    detail::gemm_weight(*backend_, stored, wm.data, wm.ld, true, n, vocab, dim, xr, xm.ld, 0.0f, l, vocab);
    if (cap > 0.0f) backend_->softcap_forward(l, l, capped.defined() ? ptr(capped) : nullptr, n * vocab, cap);
    backend_->cross_entropy_forward(l, vocab, t + r0, ptr(losses) + r0, ptr(lse) + r0, n, vocab, options.ignore_index);
    if (!rec) continue;
    backend_->cross_entropy_backward(l, vocab, t + r0, ptr(lse) + r0, scale, n, vocab, options.ignore_index);
    // The z-loss term's gradient is with respect to the (capped) logits the loss saw: it joins
    // before the soft-capping factor.
    add_z_loss_gradient(*backend_, l, vocab, t + r0, ptr(lse) + r0, scale, z_loss_weight_, n, vocab,
                        options.ignore_index);
    // The soft-cap's factor 1 - tanh^2, from the tanh kept above.
    if (capped.defined()) backend_->softcap_backward(ptr(capped), 1.0f, l, l, n * vocab, false);
    chunk_gradients(*backend_, stored, wm, xm, r0, n, vocab, l, dx, dweight);
  }
  logits.reset();
  capped.reset();
  if (rows == 0 && dweight.defined()) backend_->fill(ptr(dweight), 0.0f, dweight.numel());
  Tensor loss = loss_value(*backend_, *buffers_, losses, lse, t, rows, options.ignore_index, scale, z_loss_weight_);
  if (rec) {
    auto* node = rec->record<LinearCrossEntropyNode>(*backend_);
    node->tx = tx;
    node->tweight = tw;
    // dx was computed contiguous; it adopts x's geometry only when x is contiguous.
    node->dx = std::move(dx);
    node->dweight = std::move(dweight);
    rec->add_output(*node, loss);
    rec->values_not_needed(weight);  // the gradients were computed above
  }
  return loss;
}

}  // namespace loom
