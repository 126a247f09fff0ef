// Tensor parallelism's operations (Megatron-LM's f and g, all-gather and reduce-scatter along a
// dimension, the vocabulary-parallel embedding): collectives over Ops::tensor_group as autograd
// operations. The vocabulary-parallel cross-entropy is in ops_loss.cpp.
#include <algorithm>
#include <cstring>
#include <span>
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

std::span<float> span_of(const Tensor& t) {
  return {t.data<float>(), static_cast<std::size_t>(t.numel())};
}

// x [outer, extent, inner] around `dim`, as three extents.
struct Around {
  std::int64_t outer = 1, extent = 1, inner = 1;
};
Around around(const Shape& shape, int dim) {
  Around a;
  for (int i = 0; i < dim; ++i) a.outer *= shape[i];
  a.extent = shape[dim];
  for (int i = dim + 1; i < shape.rank(); ++i) a.inner *= shape[i];
  return a;
}

// gathered [size, outer, extent, inner] (the members' buffers in rank order) into
// out [outer, size * extent, inner].
void interleave(const float* gathered, const Around& a, int size, float* out) {
  const std::int64_t block = a.extent * a.inner, chunk = a.outer * block;
  for (int r = 0; r < size; ++r)
    for (std::int64_t o = 0; o < a.outer; ++o)
      std::memcpy(out + (o * size + r) * block, gathered + r * chunk + o * block,
                  static_cast<std::size_t>(block) * sizeof(float));
}
// The inverse: in [outer, size * extent, inner] into [size, outer, extent, inner].
void deinterleave(const float* in, const Around& a, int size, float* out) {
  const std::int64_t block = a.extent * a.inner, chunk = a.outer * block;
  for (int r = 0; r < size; ++r)
    for (std::int64_t o = 0; o < a.outer; ++o)
      std::memcpy(out + r * chunk + o * block, in + (o * size + r) * block,
                  static_cast<std::size_t>(block) * sizeof(float));
}

// The members' x along dim, in rank order: [outer, size * extent, inner].
Tensor gather_along(CollectiveGroup& group, const Tensor& x, int dim, BufferType& type) {
  const int size = group.size();
  Shape out_shape = x.shape();
  out_shape[dim] *= size;
  Tensor out = detail::empty(type, out_shape);
  const Around a = around(x.shape(), dim);
  if (a.outer == 1) {
    group.all_gather(span_of(x), span_of(out));
    return out;
  }
  Tensor gathered = detail::empty(type, Shape{static_cast<std::int64_t>(size) * x.numel()});
  group.all_gather(span_of(x), span_of(gathered));
  interleave(gathered.data<float>(), a, size, out.data<float>());
  return out;
}

// The sum over the members of x [outer, size * extent, inner], this member's [outer, extent, inner].
Tensor reduce_scatter_along(CollectiveGroup& group, const Tensor& x, int dim, BufferType& type) {
  const int size = group.size();
  Shape out_shape = x.shape();
  out_shape[dim] /= size;
  Tensor out = detail::empty(type, out_shape);
  Around a = around(out_shape, dim);
  if (a.outer == 1) {
    group.reduce_scatter(span_of(x), span_of(out));
    return out;
  }
  Tensor chunks = detail::empty(type, Shape{x.numel()});
  deinterleave(x.data<float>(), a, size, chunks.data<float>());
  group.reduce_scatter(span_of(chunks), span_of(out));
  return out;
}

struct TensorCopyNode final : Node {
  using Node::Node;
  const char* name() const override { return "tensor_copy"; }
  CollectiveGroup* group = nullptr;
  GradTarget dx;
  void backward(BackwardPass& pass) override {
    Tensor g = pass.take_output_grad(*this, 0);
    if (g.storage_use_count() != 1 || !g.is_contiguous()) {
      Tensor copy = pass.empty(g.shape());
      copy.copy_from(g);
      g = std::move(copy);
    }
    group->all_reduce(span_of(g));
    pass.give(dx, std::move(g));
  }
};

struct TensorReduceNode final : Node {
  using Node::Node;
  const char* name() const override { return "tensor_reduce"; }
  GradTarget dx;
  void backward(BackwardPass& pass) override { pass.give(dx, pass.take_output_grad(*this, 0)); }
};

// tensor_all_gather and tensor_reduce_scatter: each one's backward pass is the other.
struct TensorAlongDimNode final : Node {
  using Node::Node;
  const char* name() const override { return gathered ? "tensor_all_gather" : "tensor_reduce_scatter"; }
  CollectiveGroup* group = nullptr;
  int dim = 0;
  bool gathered = false;  // the forward pass all-gathered
  GradTarget dx;
  void backward(BackwardPass& pass) override {
    const Tensor g = pass.output_grad(*this, 0);
    Tensor c = g.is_contiguous() ? g : pass.empty(g.shape());
    if (!g.is_contiguous()) c.copy_from(g);
    BufferType& type = pass.backend().buffer_type();
    pass.give(dx, gathered ? reduce_scatter_along(*group, c, dim, type) : gather_along(*group, c, dim, type));
  }
};

struct VocabEmbeddingNode final : Node {
  using Node::Node;
  const char* name() const override { return "embedding_vocab_parallel"; }
  Tensor ids;
  GradTarget dtable;
  std::int64_t rows = 0, dim = 0, begin = 0;
  void backward(BackwardPass& pass) override {
    auto b = pass.grad(dtable);
    float* d = ptr(b.tensor);
    if (!b.accumulate) std::fill_n(d, b.tensor.numel(), 0.0f);
    const Tensor g = pass.output_grad(*this, 0);
    const float* gd = g.data<float>();
    const std::int32_t* id = ids.data<std::int32_t>();
    // In token order: the sums into a row are the same on every run.
    for (std::int64_t i = 0; i < ids.numel(); ++i) {
      const std::int64_t local = id[i] - begin;
      if (local < 0 || local >= rows) continue;
      float* row = d + local * dim;
      const float* src = gd + i * dim;
      for (std::int64_t j = 0; j < dim; ++j) row[j] += src[j];
    }
  }
};

// Records tensor_all_gather's or tensor_reduce_scatter's node: y from x along dim.
void record_along_dim(const Ops& ops, const Tensor& x, Tensor& y, int dim, bool gathered, const char* op) {
  auto* rec = detail::recording_state(ops.tape(), {&x}, op);
  if (!rec) return;
  auto* node = rec->record<TensorAlongDimNode>(ops.backend());
  node->group = ops.tensor_group();
  node->dim = dim;
  node->gathered = gathered;
  node->dx = rec->target(x);
  rec->add_output(*node, y);
}

void require_group(const Ops& ops, const Tensor& x, const char* op) {
  if (!x.defined()) op_error(op, "undefined tensor");
  if (!x.is_host_visible())
    op_error(op, "tensor parallelism computes on host-visible memory; x is in " + x.str() +
                     " (use the cpu or reference backend with trainer.mesh.tensor > 1)");
  detail::require_f32(ops, x, op, "x");
}

int checked_dim(const Tensor& x, int dim, const char* op) {
  if (dim < 0) dim += x.rank();
  if (dim < 0 || dim >= x.rank()) op_error(op, "dim " + std::to_string(dim) + " of " + x.str());
  return dim;
}

}  // namespace

int Ops::tensor_rank() const {
  return tensor_group_ ? tensor_group_->rank() : 0;
}
int Ops::tensor_size() const {
  return tensor_group_ ? tensor_group_->size() : 1;
}

Tensor Ops::tensor_copy(const Tensor& x_in) {
  observe({&x_in});
  constexpr const char* op = "tensor_copy";
  if (!tensor_group_ || tensor_group_->size() == 1) return x_in;
  require_group(*this, x_in, op);
  auto* rec = detail::recording_state(tape_, {&x_in}, op);
  if (!rec) return x_in;  // nothing flows back: no copy needed
  Tensor y = detail::empty(*this, x_in.shape());
  y.copy_from(x_in);
  auto* node = rec->record<TensorCopyNode>(*backend_);
  node->group = tensor_group_;
  node->dx = rec->target(x_in);
  rec->add_output(*node, y);
  return y;
}

Tensor Ops::tensor_reduce(const Tensor& x_in) {
  observe({&x_in});
  constexpr const char* op = "tensor_reduce";
  if (!tensor_group_ || tensor_group_->size() == 1) return x_in;
  require_group(*this, x_in, op);
  Tensor y = detail::empty(*this, x_in.shape());
  y.copy_from(x_in);
  tensor_group_->all_reduce(span_of(y));
  if (auto* rec = detail::recording_state(tape_, {&x_in}, op)) {
    auto* node = rec->record<TensorReduceNode>(*backend_);
    node->dx = rec->target(x_in);
    rec->add_output(*node, y);
  }
  return y;
}

Tensor Ops::tensor_all_gather(const Tensor& x_in, int dim) {
  observe({&x_in});
  constexpr const char* op = "tensor_all_gather";
  if (!tensor_group_ || tensor_group_->size() == 1) return x_in;
  require_group(*this, x_in, op);
  dim = checked_dim(x_in, dim, op);
  const Tensor x = contiguous(x_in);
  Tensor y = gather_along(*tensor_group_, x, dim, *buffers_);
  record_along_dim(*this, x, y, dim, /*gathered=*/true, op);
  return y;
}

Tensor Ops::tensor_reduce_scatter(const Tensor& x_in, int dim) {
  observe({&x_in});
  constexpr const char* op = "tensor_reduce_scatter";
  if (!tensor_group_ || tensor_group_->size() == 1) return x_in;
  require_group(*this, x_in, op);
  dim = checked_dim(x_in, dim, op);
  if (x_in.size(dim) % tensor_group_->size() != 0)
    op_error(op, "dim " + std::to_string(dim) + " of " + x_in.str() + " is not a multiple of the group's " +
                     std::to_string(tensor_group_->size()) + " members");
  const Tensor x = contiguous(x_in);
  Tensor y = reduce_scatter_along(*tensor_group_, x, dim, *buffers_);
  record_along_dim(*this, x, y, dim, /*gathered=*/false, op);
  return y;
}

Tensor Ops::embedding_vocab_parallel(const Tensor& table, const Tensor& ids, std::int64_t vocab_begin) {
  if (!tensor_group_ || tensor_group_->size() == 1) {
    if (vocab_begin != 0)
      op_error("embedding_vocab_parallel", "vocab_begin " + std::to_string(vocab_begin) + " without a tensor group");
    return embedding(table, ids);
  }
  observe({&table, &ids});
  constexpr const char* op = "embedding_vocab_parallel";
  require_group(*this, table, op);
  detail::require_i32(*this, ids, op, "ids");
  if (table.rank() != 2 || !table.is_contiguous())
    op_error(op, "table must be a contiguous [rows, dim], not " + table.str());
  if (!ids.is_host_visible() || !ids.is_contiguous()) op_error(op, "ids must be contiguous and host-visible");
  const std::int64_t rows = table.size(0), dim = table.size(1);
  Shape out_shape = ids.shape();
  std::vector<std::int64_t> dims(out_shape.begin(), out_shape.end());
  dims.push_back(dim);
  Tensor out = detail::empty(*this, Shape(std::span<const std::int64_t>(dims)));
  const std::int32_t* id = ids.data<std::int32_t>();
  const float* t = table.data<float>();
  float* o = out.data<float>();
  for (std::int64_t i = 0; i < ids.numel(); ++i) {
    if (id[i] < 0) op_error(op, "id " + std::to_string(id[i]) + " at position " + std::to_string(i) + " is negative");
    const std::int64_t local = id[i] - vocab_begin;
    if (local >= 0 && local < rows)
      std::memcpy(o + i * dim, t + local * dim, static_cast<std::size_t>(dim) * sizeof(float));
    else
      std::fill_n(o + i * dim, dim, 0.0f);
  }
  tensor_group_->all_reduce(span_of(out));
  if (auto* rec = detail::recording_state(tape_, {&table}, op)) {
    auto* node = rec->record<VocabEmbeddingNode>(*backend_);
    node->ids = ids;
    node->dtable = rec->target(table);
    node->rows = rows;
    node->dim = dim;
    node->begin = vocab_begin;
    rec->add_output(*node, out);
    rec->values_not_needed(table);
  }
  return out;
}

}  // namespace loom
