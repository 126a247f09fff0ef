// The backend kind's helpers that live in the core: kernel group names, the host-memory check and
// the default (round, then float32 gemm) bf16 GEMM.
#include "loom/kinds/backend.hpp"

#include <algorithm>
#include <numeric>
#include <vector>

#include "loom/error.hpp"

namespace loom {

std::string_view backend_op_name(BackendOp op) {
  switch (op) {
    case BackendOp::gemm:
      return "gemm";
    case BackendOp::linear:
      return "linear";
    case BackendOp::activation:
      return "activation";
    case BackendOp::swiglu:
      return "swiglu";
    case BackendOp::add:
      return "add";
    case BackendOp::scale:
      return "scale";
    case BackendOp::fill:
      return "fill";
    case BackendOp::dropout:
      return "dropout";
    case BackendOp::layer_norm:
      return "layer_norm";
    case BackendOp::rms_norm:
      return "rms_norm";
    case BackendOp::embedding:
      return "embedding";
    case BackendOp::rope:
      return "rope";
    case BackendOp::cross_entropy:
      return "cross_entropy";
    case BackendOp::mul:
      return "mul";
    case BackendOp::softcap:
      return "softcap";
    case BackendOp::softmax:
      return "softmax";
    case BackendOp::logsumexp:
      return "logsumexp";
    case BackendOp::sum:
      return "sum";
    case BackendOp::loss:
      return "loss";
    case BackendOp::fill_normal:
      return "fill_normal";
    case BackendOp::optimizer:
      return "optimizer";
    case BackendOp::sum_of_squares:
      return "sum_of_squares";
    case BackendOp::routing:
      return "routing";
  }
  return "unknown";
}

namespace {

// The elements of a rows x cols matrix with row stride ld, rounded to bfloat16 and widened back.
std::vector<float> rounded_to_bf16(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  if (rows <= 0 || cols <= 0) return {};
  std::vector<float> out(static_cast<std::size_t>((rows - 1) * ld + cols), 0.0f);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < cols; ++j)
      out[static_cast<std::size_t>(r * ld + j)] = to_float(to_bfloat16(x[r * ld + j]));
  return out;
}

}  // namespace

void Backend::gemm_bf16(Transpose trans_a, Transpose trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                        float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
                        float* c, std::int64_t ldc) {
  if (m <= 0 || n <= 0 || k <= 0) {
    gemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // The rounded copies are host memory: this default serves backends whose memory the host can
  // read (a device backend overrides gemm_bf16 or declines bf16 in supports_op).
  const bool ta = trans_a == Transpose::yes, tb = trans_b == Transpose::yes;
  const std::vector<float> ra = rounded_to_bf16(a, ta ? k : m, ta ? m : k, lda);
  const std::vector<float> rb = rounded_to_bf16(b, tb ? n : k, tb ? k : n, ldb);
  gemm(trans_a, trans_b, m, n, k, alpha, ra.data(), lda, rb.data(), ldb, beta, c, ldc);
}

void Backend::route_top_k(const float* logits, std::int64_t tokens, std::int64_t experts, std::int64_t k,
                          std::int64_t first, std::int64_t last, std::int32_t* chosen, std::int32_t* slots,
                          std::int32_t* sorted, std::int32_t* counts) {
  // The selection MoeBlock made on the host before this kernel existed, step for step
  // (std::partial_sort with the same order), so that a host backend's choices are unchanged.
  std::fill_n(counts, experts, 0);
  std::vector<std::int64_t> order(static_cast<std::size_t>(experts));
  for (std::int64_t t = 0; t < tokens; ++t) {
    const float* row = logits + t * experts;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](std::int64_t a, std::int64_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t e = order[static_cast<std::size_t>(j)];
      chosen[t * k + j] = static_cast<std::int32_t>(t * experts + e);
      slots[t * k + j] = counts[e]++;  // its index among e's tokens, for now
    }
  }
  // Where each expert's tokens begin in the sorted list (all experts) and in this member's rows.
  std::vector<std::int32_t> begin(static_cast<std::size_t>(experts)), mine(begin);
  std::int32_t all = 0, member = 0;
  for (std::int64_t e = 0; e < experts; ++e) {
    begin[static_cast<std::size_t>(e)] = all;
    mine[static_cast<std::size_t>(e)] = member;
    all += counts[e];
    if (e >= first && e < last) member += counts[e];
  }
  for (std::int64_t t = 0; t < tokens; ++t)
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t tj = t * k + j, e = chosen[tj] - t * experts;
      const auto ue = static_cast<std::size_t>(e);
      sorted[begin[ue] + slots[tj]] = static_cast<std::int32_t>(t);
      slots[tj] = e >= first && e < last ? mine[ue] + slots[tj] : member;
    }
}

void require_host_memory(const Backend& backend, std::string_view user) {
  const BufferType& type = backend.buffer_type();
  if (type.host_visible()) return;
  throw UserError("backend '" + std::string(backend.name()) + "' computes in " + type.device().str() +
                  " memory, which the host cannot read or write, but " + std::string(user) +
                  " keeps parameters and optimizer state in host memory (models initialise them and optimizers "
                  "update them there); choose a backend whose memory is the host's, such as cpu or reference");
}

}  // namespace loom
