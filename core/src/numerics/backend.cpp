// The backend kind's helpers that live in the core: kernel group names, the host-memory check and
// the default (round, then float32 gemm) bf16 GEMM.
#include "loom/kinds/backend.hpp"

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

void require_host_memory(const Backend& backend, std::string_view user) {
  const BufferType& type = backend.buffer_type();
  if (type.host_visible()) return;
  throw UserError("backend '" + std::string(backend.name()) + "' computes in " + type.device().str() +
                  " memory, which the host cannot read or write, but " + std::string(user) +
                  " keeps parameters and optimizer state in host memory (models initialise them and optimizers "
                  "update them there); choose a backend whose memory is the host's, such as cpu or reference");
}

}  // namespace loom
