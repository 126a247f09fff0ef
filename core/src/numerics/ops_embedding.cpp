// Embedding lookup and rotary position embeddings (with their frequency tables).
#include <cmath>
#include <numbers>

#include "loom/execution.hpp"
#include "numerics/ops_support.hpp"

namespace loom {

using detail::BackwardPass;
using detail::GradTarget;
using detail::Node;
using detail::op_error;
using detail::ptr;

namespace {

struct EmbeddingNode final : Node {
  using Node::Node;
  const char* name() const override { return "embedding"; }
  Tensor ids;
  GradTarget dtable;
  std::int64_t vocab = 0, dim = 0;
  void backward(BackwardPass& pass) override {
    auto b = pass.grad(dtable);
    // The kernel scatters with +=, so a first gradient starts from zero.
    if (!b.accumulate) pass.backend().fill(ptr(b.tensor), 0.0f, b.tensor.numel());
    pass.backend().embedding_backward(detail::ids_ptr(ids), ptr(pass.output_grad(*this, 0)), ptr(b.tensor), ids.numel(),
                                      dim, vocab);
  }
};

struct RopeNode final : Node {
  using Node::Node;
  const char* name() const override { return "rope"; }
  Tensor cos, sin, positions;
  GradTarget dx;
  std::int64_t offset = 0, batch = 0, seq = 0, heads = 0, head_dim = 0;
  bool interleaved = false;
  void backward(BackwardPass& pass) override {
    auto b = pass.grad(dx);
    const std::int64_t token = heads * head_dim;
    pass.backend().rope(ptr(pass.output_grad(*this, 0)), seq * token, token, ptr(b.tensor), b.tensor.stride(0),
                        b.tensor.stride(1), ptr(cos), ptr(sin), detail::ids_ptr(positions), offset, batch, seq, heads,
                        head_dim, interleaved, /*inverse=*/true, b.accumulate);
  }
};

}  // namespace

Tensor Ops::embedding(const Tensor& table, const Tensor& ids) {
  return lookup(table, ids, true);
}

Tensor Ops::embedding_of_valid_ids(const Tensor& table, const Tensor& ids) {
  return lookup(table, ids, false);
}

Tensor Ops::lookup(const Tensor& table, const Tensor& ids, bool check_ids) {
  observe({&table, &ids});
  constexpr const char* op = "embedding";
  const quant::StoredMatrix* stored = detail::stored_weight(*this, table, op, "table");
  if (!stored) detail::require_f32(*this, table, op, "table");
  detail::require_i32(*this, ids, op, "ids");
  if (table.rank() != 2 || !table.is_contiguous())
    op_error(op, "table must be a contiguous [vocab, dim], not " + table.str());
  detail::require_op(*this, BackendOp::embedding, DType::f32, op);
  detail::require_op(*this, BackendOp::fill, DType::f32, op);
  const std::int64_t vocab = table.size(0), dim = table.size(1);
  // Stored tables are dequantized on the host, which reads the ids there whatever the caller says.
  const Tensor host_ids = check_ids || stored ? detail::host_readable(ids) : Tensor();
  const std::int32_t* id = host_ids.defined() ? host_ids.data<std::int32_t>() : nullptr;
  if (check_ids)
    for (std::int64_t i = 0; i < ids.numel(); ++i)
      if (id[i] < 0 || id[i] >= vocab)
        op_error(op, "id " + std::to_string(id[i]) + " at position " + std::to_string(i) + " is outside [0, " +
                         std::to_string(vocab) + ")");
  Shape out_shape = ids.shape();
  if (out_shape.rank() == max_rank) op_error(op, "ids have too many dimensions");
  std::array<std::int64_t, max_rank> dims{};
  for (int i = 0; i < ids.rank(); ++i) dims[static_cast<std::size_t>(i)] = ids.size(i);
  dims[static_cast<std::size_t>(ids.rank())] = dim;
  Tensor out =
      detail::empty(*this, Shape(std::span<const std::int64_t>(dims.data(), static_cast<std::size_t>(ids.rank() + 1))));
  if (stored) {  // each row dequantized straight into the output; a stored table is frozen
    float* o = ptr(out);
    default_execution_context().parallel_for(ids.numel(), 16, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) quant::dequantize(*stored, id[i], 1, 0, dim, o + i * dim, dim);
    });
    return out;
  }
  backend_->embedding_forward(ptr(table), detail::ids_ptr(ids), ptr(out), ids.numel(), dim, vocab);
  if (auto* rec = detail::recording_state(tape_, {&table}, op)) {
    auto* node = rec->record<EmbeddingNode>(*backend_);
    node->ids = ids;
    node->dtable = rec->target(table);
    node->vocab = vocab;
    node->dim = dim;
    rec->add_output(*node, out);
    rec->values_not_needed(table);  // the backward pass scatters into the table's gradient
  }
  return out;
}

RopeTable::RopeTable(const RopeConfig& config, std::int64_t head_dim, std::int64_t max_positions)
    : config_(config), head_dim_(head_dim), max_positions_(max_positions) {
  if (head_dim <= 0 || head_dim % 2 != 0) op_error("RopeTable", "head_dim must be positive and even");
  if (max_positions <= 0) op_error("RopeTable", "max_positions must be positive");
  if (!(config.base > 0.0)) op_error("RopeTable", "base must be positive");
  const std::int64_t half = head_dim / 2;
  inv_freq_.resize(static_cast<std::size_t>(half));
  for (std::int64_t i = 0; i < half; ++i)
    inv_freq_[static_cast<std::size_t>(i)] =
        1.0 / std::pow(config.base, static_cast<double>(2 * i) / static_cast<double>(head_dim));
  if (config.llama3_scaling) {
    // Llama 3.1's rescaling (transformers' _compute_llama3_parameters).
    if (!(config.factor > 0.0) || !(config.high_freq_factor > config.low_freq_factor) ||
        !(config.original_max_positions > 0.0))
      op_error("RopeTable", "invalid llama3 scaling parameters");
    const double low_wavelen = config.original_max_positions / config.low_freq_factor;
    const double high_wavelen = config.original_max_positions / config.high_freq_factor;
    for (double& f : inv_freq_) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen < high_wavelen) continue;
      if (wavelen > low_wavelen) {
        f /= config.factor;
      } else {
        const double smooth = (config.original_max_positions / wavelen - config.low_freq_factor) /
                              (config.high_freq_factor - config.low_freq_factor);
        f = (1.0 - smooth) * f / config.factor + smooth * f;
      }
    }
  }
  cos_ = Tensor::empty(Shape{max_positions, half});  // host tables; tables_on copies them to a device
  sin_ = Tensor::empty(Shape{max_positions, half});
  float* c = cos_.data<float>();
  float* s = sin_.data<float>();
  for (std::int64_t p = 0; p < max_positions; ++p)
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * inv_freq_[static_cast<std::size_t>(i)];
      c[p * half + i] = static_cast<float>(std::cos(angle));
      s[p * half + i] = static_cast<float>(std::sin(angle));
    }
}

std::pair<Tensor, Tensor> RopeTable::tables_on(BufferType& type) const {
  if (&type == &cos_.buffer_type()) return {cos_, sin_};
  if (!device_cos_.defined() || &device_cos_.buffer_type() != &type) {
    device_cos_ = Tensor::empty(cos_.shape(), DType::f32, type);
    device_cos_.copy_from(cos_);
    device_sin_ = Tensor::empty(sin_.shape(), DType::f32, type);
    device_sin_.copy_from(sin_);
  }
  return {device_cos_, device_sin_};
}

Tensor Ops::rope(const Tensor& x_in, const RopeTable& table, const Tensor& positions, std::int64_t position_offset) {
  observe({&x_in});
  constexpr const char* op = "rope";
  detail::require_f32(*this, x_in, op, "x");
  if (x_in.rank() != 4) op_error(op, "x must be [batch, seq, heads, head_dim], not " + x_in.str());
  const std::int64_t batch = x_in.size(0), seq = x_in.size(1), heads = x_in.size(2), head_dim = x_in.size(3);
  if (head_dim != table.head_dim())
    op_error(op, "x has head_dim " + std::to_string(head_dim) + " but the table was built for " +
                     std::to_string(table.head_dim()));
  if (positions.defined()) {
    detail::require_i32(*this, positions, op, "positions");
    if (!(positions.shape() == Shape{batch, seq}))
      op_error(
          op, "positions must be [" + std::to_string(batch) + ", " + std::to_string(seq) + "], not " + positions.str());
    const Tensor host_positions = detail::host_readable(positions);
    const std::int32_t* p = host_positions.data<std::int32_t>();
    for (std::int64_t i = 0; i < positions.numel(); ++i)
      if (p[i] < 0 || p[i] >= table.max_positions())
        op_error(op, "position " + std::to_string(p[i]) + " is outside the table's [0, " +
                         std::to_string(table.max_positions()) + ")");
  } else if (position_offset < 0 || position_offset + seq > table.max_positions()) {
    op_error(op, "positions [" + std::to_string(position_offset) + ", " + std::to_string(position_offset + seq) +
                     ") exceed the table's " + std::to_string(table.max_positions()));
  }
  detail::require_op(*this, BackendOp::rope, DType::f32, op);
  // Heads must be contiguous within a token; tokens and batches may be strided.
  const bool layout_ok = x_in.stride(3) == 1 && (heads == 1 || x_in.stride(2) == head_dim);
  const Tensor x = layout_ok ? x_in : contiguous(x_in);
  Tensor y = detail::empty(*this, x.shape());
  const std::int64_t token = heads * head_dim;
  auto [cos, sin] = table.tables_on(*buffers_);
  backend_->rope(ptr(x), x.stride(0), x.stride(1), ptr(y), seq * token, token, ptr(cos), ptr(sin),
                 detail::ids_ptr(positions), position_offset, batch, seq, heads, head_dim, table.config().interleaved,
                 /*inverse=*/false, /*accumulate=*/false);
  if (auto* rec = detail::recording_state(tape_, {&x}, op)) {
    auto* node = rec->record<RopeNode>(*backend_);
    node->cos = std::move(cos);
    node->sin = std::move(sin);
    node->positions = positions;
    node->dx = rec->target(x);
    node->offset = position_offset;
    node->batch = batch;
    node->seq = seq;
    node->heads = heads;
    node->head_dim = head_dim;
    node->interleaved = table.config().interleaved;
    rec->add_output(*node, y);
  }
  return y;
}

}  // namespace loom
