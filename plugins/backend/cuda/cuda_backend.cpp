// backend/cuda: the Backend (kinds/backend.hpp) over the context (context.hpp), the buffer type
// (buffer_type.hpp), cuBLASLt (gemm.hpp) and the kernels (kernels.hpp), and the entry point of
// cuda-backend-kernels.so. Every kernel is queued on the context's stream; the host waits only in
// the copies that it reads (the buffer type's) and in fill_normal's rare host fix-ups.
#include <algorithm>
#include <loom/error.hpp>
#include <loom/kinds/backend.hpp>
#include <loom/random.hpp>
#include <vector>

#include "buffer_type.hpp"
#include "context.hpp"
#include "cuda_options.hpp"
#include "gemm.hpp"
#include "kernel_math.hpp"
#include "kernels.hpp"

namespace loom::cuda {

namespace {

int act_code(Activation act) {
  return static_cast<int>(act);
}
static_assert(static_cast<int>(Activation::none) == math::act_none &&
                  static_cast<int>(Activation::gelu_tanh) == math::act_gelu_tanh &&
                  static_cast<int>(Activation::silu) == math::act_silu,
              "kernel_math.hpp's activation codes are loom::Activation's");

class CudaBackend final : public Backend {
 public:
  CudaBackend(Context& context, MatmulPrecision precision)
      : c_(context), type_(CudaBufferType::of(context)), gemm_(context), precision_(precision) {}

  std::string_view name() const override { return "cuda"; }
  BufferType& buffer_type() const override { return type_; }
  bool supports_op(BackendOp op, DType dtype) const override {
    return dtype == DType::f32 || (op == BackendOp::gemm && dtype == DType::bf16);
  }
  DType matmul_dtype() const override { return precision_ == MatmulPrecision::bf16 ? DType::bf16 : DType::f32; }

  // ---- Products.
  void gemm(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
            const float* b, int64_t ldb, float beta, float* c, int64_t ldc) override {
    product(ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1, nullptr, precision_);
  }
  void gemm_batched(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t lda, int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b, float beta, float* c,
                    int64_t ldc, int64_t stride_c, int64_t batch) override {
    product(ta, tb, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c, ldc, stride_c, batch, nullptr,
            precision_);
  }
  void gemm_bf16(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float beta, float* c, int64_t ldc) override {
    product(ta, tb, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, ldc, 0, 1, nullptr, MatmulPrecision::bf16);
  }
  void linear_forward(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                      const float* b, int64_t ldb, float* pre, const float* bias, float* out, Activation act) override {
    // The bias in cuBLASLt's epilogue (k > 0), the activation by its kernel.
    const bool fused_bias = bias != nullptr && k > 0;
    product(ta, tb, m, n, k, 1.0f, a, lda, 0, b, ldb, 0, 0.0f, pre, n, 0, 1, fused_bias ? bias : nullptr, precision_);
    if ((bias && !fused_bias) || act != Activation::none)
      launch_bias_activation_forward(c_.stream, pre, fused_bias ? nullptr : bias, out, m, n, act_code(act));
  }
  void bias_activation_forward(float* pre, const float* bias, float* out, int64_t rows, int64_t cols,
                               Activation act) override {
    launch_bias_activation_forward(c_.stream, pre, bias, out, rows, cols, act_code(act));
  }
  void bias_activation_backward(const float* pre, const float* dout, float* dpre, float* dbias, bool accumulate_dbias,
                                int64_t rows, int64_t cols, Activation act) override {
    launch_bias_activation_backward(c_.stream, pre, dout, dpre, dbias, accumulate_dbias, rows, cols, act_code(act));
  }

  // ---- Elementwise.
  void activation_forward(Activation act, const float* x, float* y, int64_t n) override {
    launch_activation_forward(c_.stream, act_code(act), x, y, n);
  }
  void activation_backward(Activation act, const float* x, const float* dy, float* dx, int64_t n,
                           bool accumulate) override {
    launch_activation_backward(c_.stream, act_code(act), x, dy, dx, n, accumulate);
  }
  void swiglu_forward(const float* gate, const float* up, float* y, int64_t n) override {
    launch_swiglu_forward(c_.stream, gate, up, y, n);
  }
  void swiglu_backward(const float* gate, const float* up, const float* dy, float* dgate, bool accumulate_dgate,
                       float* dup, bool accumulate_dup, int64_t n) override {
    launch_swiglu_backward(c_.stream, gate, up, dy, dgate, accumulate_dgate, dup, accumulate_dup, n);
  }
  void add(const float* a, const float* b, float* y, int64_t n) override { launch_add(c_.stream, a, b, y, n); }
  void scale(const float* x, float alpha, float* y, int64_t n, bool accumulate) override {
    launch_scale(c_.stream, x, alpha, y, n, accumulate);
  }
  void fill(float* y, float value, int64_t n) override { launch_fill(c_.stream, y, value, n); }
  void dropout(const float* x, float* y, int64_t n, float p, std::uint64_t key, bool accumulate) override {
    launch_dropout(c_.stream, x, y, n, p, key, accumulate);
  }
  void mul(const float* a, const float* b, float* y, int64_t n, bool accumulate) override {
    launch_mul(c_.stream, a, b, y, n, accumulate);
  }
  void softcap_forward(const float* x, float* y, float* tanh_out, int64_t n, float cap) override {
    launch_softcap_forward(c_.stream, x, y, tanh_out, n, cap);
  }
  void softcap_backward(const float* h, float h_scale, const float* dy, float* dx, int64_t n,
                        bool accumulate) override {
    launch_softcap_backward(c_.stream, h, h_scale, dy, dx, n, accumulate);
  }

  // ---- Normalisations.
  void layer_norm_forward(const float* x, const float* weight, const float* bias, float* y, float* mean, float* rstd,
                          int64_t rows, int64_t cols, float eps) override {
    launch_layer_norm_forward(c_.stream, x, weight, bias, y, mean, rstd, rows, cols, eps);
  }
  void layer_norm_backward(const float* x, const float* weight, const float* mean, const float* rstd, const float* dy,
                           float* dx, bool accumulate_dx, float* dweight, bool accumulate_dweight, float* dbias,
                           bool accumulate_dbias, int64_t rows, int64_t cols) override {
    launch_layer_norm_backward(c_, x, weight, mean, rstd, dy, dx, accumulate_dx, dweight, accumulate_dweight, dbias,
                               accumulate_dbias, rows, cols);
  }
  void add_layer_norm_forward(const float* a, const float* b, float* sum, const float* weight, const float* bias,
                              float* y, float* mean, float* rstd, int64_t rows, int64_t cols, float eps) override {
    launch_add(c_.stream, a, b, sum, rows * cols);
    launch_layer_norm_forward(c_.stream, sum, weight, bias, y, mean, rstd, rows, cols, eps);
  }
  void rms_norm_forward(const float* x, const float* weight, float* y, float* rstd, int64_t rows, int64_t cols,
                        float eps) override {
    launch_rms_norm_forward(c_.stream, x, weight, y, rstd, rows, cols, eps);
  }
  void rms_norm_backward(const float* x, const float* weight, const float* rstd, const float* dy, float* dx,
                         bool accumulate_dx, float* dweight, bool accumulate_dweight, int64_t rows,
                         int64_t cols) override {
    launch_rms_norm_backward(c_, x, weight, rstd, dy, dx, accumulate_dx, dweight, accumulate_dweight, rows, cols);
  }
  void add_rms_norm_forward(const float* a, const float* b, float* sum, const float* weight, float* y, float* rstd,
                            int64_t rows, int64_t cols, float eps) override {
    launch_add(c_.stream, a, b, sum, rows * cols);
    launch_rms_norm_forward(c_.stream, sum, weight, y, rstd, rows, cols, eps);
  }

  // ---- Embeddings, rotary embeddings.
  void embedding_forward(const float* table, const int32_t* ids, float* out, int64_t n, int64_t dim, int64_t) override {
    launch_embedding_forward(c_.stream, table, ids, out, n, dim);
  }
  void embedding_backward(const int32_t* ids, const float* dout, float* dtable, int64_t n, int64_t dim,
                          int64_t vocab) override {
    launch_embedding_backward(c_, ids, dout, dtable, n, dim, vocab);
  }
  void rope(const float* x, int64_t x_batch_stride, int64_t x_token_stride, float* y, int64_t y_batch_stride,
            int64_t y_token_stride, const float* cos, const float* sin, const int32_t* positions,
            int64_t position_offset, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, bool interleaved,
            bool inverse, bool accumulate) override {
    launch_rope(c_.stream, x, x_batch_stride, x_token_stride, y, y_batch_stride, y_token_stride, cos, sin, positions,
                position_offset, batch, seq, heads, head_dim, interleaved, inverse, accumulate);
  }

  // ---- Losses and reductions.
  void cross_entropy_forward(const float* logits, int64_t ld, const int32_t* targets, float* losses, float* lse,
                             int64_t rows, int64_t vocab, int32_t ignore_index) override {
    launch_cross_entropy_forward(c_.stream, logits, ld, targets, losses, lse, rows, vocab, ignore_index);
  }
  void cross_entropy_backward(float* logits, int64_t ld, const int32_t* targets, const float* lse, float grad_scale,
                              int64_t rows, int64_t vocab, int32_t ignore_index) override {
    launch_cross_entropy_backward(c_.stream, logits, ld, targets, lse, grad_scale, rows, vocab, ignore_index);
  }
  void softmax_forward(const float* x, float* y, int64_t rows, int64_t cols) override {
    launch_softmax_forward(c_.stream, x, y, rows, cols);
  }
  void softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols,
                        bool accumulate) override {
    launch_softmax_backward(c_.stream, y, dy, dx, rows, cols, accumulate);
  }
  void logsumexp_forward(const float* x, float* y, int64_t rows, int64_t cols) override {
    launch_logsumexp_forward(c_.stream, x, y, rows, cols);
  }
  void logsumexp_backward(const float* x, const float* y, const float* dy, float* dx, int64_t rows, int64_t cols,
                          bool accumulate) override {
    launch_logsumexp_backward(c_.stream, x, y, dy, dx, rows, cols, accumulate);
  }
  void sum_forward(const float* x, float* y, int64_t n) override { launch_sum_forward(c_.stream, x, y, n); }
  void sum_backward(const float* dy, float* dx, int64_t n, bool accumulate) override {
    launch_sum_backward(c_.stream, dy, dx, n, accumulate);
  }
  void loss_reduce(const float* losses, const float* lse, const int32_t* targets, int64_t rows, int32_t ignore_index,
                   float scale, float z_loss_weight, float* out) override {
    launch_loss_reduce(c_.stream, losses, lse, targets, rows, ignore_index, scale, z_loss_weight, out);
  }
  void z_loss_forward(float* losses, const float* lse, const int32_t* targets, int64_t rows, int32_t ignore_index,
                      float z_loss_weight) override {
    launch_z_loss_forward(c_.stream, losses, lse, targets, rows, ignore_index, z_loss_weight);
  }
  void z_loss_backward(float* logits, int64_t ld, const int32_t* targets, const float* lse, float grad_scale,
                       float z_loss_weight, int64_t rows, int64_t vocab, int32_t ignore_index) override {
    launch_z_loss_backward(c_.stream, logits, ld, targets, lse, grad_scale, z_loss_weight, rows, vocab, ignore_index);
  }

  // ---- The training step's kernels.
  void fill_normal(float* y, int64_t n, std::uint64_t key, int64_t first_index, float scale) override {
    if (n <= 0) return;
    // The GPU's log and cos are not glibc's: the few values too close to a float rounding
    // boundary for both to be known to round alike are listed, and recomputed here with the
    // host's own random_normal (the same source), so that every value is the host's bit for bit.
    constexpr std::uint32_t capacity = 4096;
    Context::Scratch list(c_, sizeof(std::uint32_t) * (capacity + 1));
    auto* count = list.as<std::uint32_t>();
    LOOM_CUDA_CHECK(cudaMemsetAsync(count, 0, sizeof(std::uint32_t), c_.stream));
    launch_fill_normal(c_.stream, y, n, key, first_index, scale, count + 1, count, capacity);
    std::uint32_t uncertain = 0;
    LOOM_CUDA_CHECK(cudaMemcpyAsync(&uncertain, count, sizeof uncertain, cudaMemcpyDeviceToHost, c_.stream));
    c_.synchronize();
    if (uncertain == 0) return;
    if (uncertain > capacity) {
      // Never seen (about one value in 2^22 is listed): the whole run on the host.
      std::vector<float> host(static_cast<std::size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        host[static_cast<std::size_t>(i)] = scale * random_normal(key, static_cast<std::uint32_t>(first_index + i));
      LOOM_CUDA_CHECK(cudaMemcpyAsync(y, host.data(), sizeof(float) * host.size(), cudaMemcpyHostToDevice, c_.stream));
      c_.synchronize();
      return;
    }
    std::vector<std::uint32_t> indices(uncertain);
    LOOM_CUDA_CHECK(cudaMemcpyAsync(indices.data(), count + 1, sizeof(std::uint32_t) * uncertain,
                                    cudaMemcpyDeviceToHost, c_.stream));
    c_.synchronize();
    for (const std::uint32_t i : indices) {
      const float value = scale * random_normal(key, static_cast<std::uint32_t>(first_index + i));
      LOOM_CUDA_CHECK(cudaMemcpyAsync(y + i, &value, sizeof value, cudaMemcpyHostToDevice, c_.stream));
      c_.synchronize();
    }
  }
  void elementwise_update(const ElementwiseUpdate& update, float* parameter, const float* grad,
                          const std::array<float*, 4>& slots, int64_t n) override {
    launch_elementwise_update(c_.stream, update, parameter, grad, slots, n);
  }
  void sum_of_squares(const float* x, int64_t n, int64_t chunk, double* partials) override {
    launch_sum_of_squares(c_.stream, x, n, chunk, partials);
  }
  void route_top_k(const float* logits, int64_t tokens, int64_t experts, int64_t k, int64_t first, int64_t last,
                   int32_t* chosen, int32_t* slots, int32_t* sorted, int32_t* counts) override {
    launch_route_top_k(c_, logits, tokens, experts, k, first, last, chosen, slots, sorted, counts);
  }

 private:
  void product(Transpose ta, Transpose tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
               int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b, float beta, float* c, int64_t ldc,
               int64_t stride_c, int64_t batch, const float* bias, MatmulPrecision precision) {
    GemmCall call;
    call.trans_a = ta == Transpose::yes;
    call.trans_b = tb == Transpose::yes;
    call.m = m;
    call.n = n;
    call.k = k;
    call.alpha = alpha;
    call.beta = beta;
    call.a = a;
    call.lda = lda;
    call.stride_a = stride_a;
    call.b = b;
    call.ldb = ldb;
    call.stride_b = stride_b;
    call.c = c;
    call.ldc = ldc;
    call.stride_c = stride_c;
    call.batch = batch;
    call.bias = bias;
    call.precision = precision;
    gemm_.run(call);
  }

  Context& c_;
  CudaBufferType& type_;
  Gemm gemm_;
  MatmulPrecision precision_;
};

}  // namespace

}  // namespace loom::cuda

extern "C" __attribute__((visibility("default"))) loom::Backend* loom_cuda_backend(const loom::cuda::CudaOptions& o) {
  loom::cuda::Context& context = loom::cuda::context(o.device);
  LOOM_CUDA_CHECK(cudaSetDevice(o.device));
  return new loom::cuda::CudaBackend(context, o.precision);
}

// The context's stream of device `device` (created on first use, with its buffer type registered),
// for loom's other CUDA plugins: attention/cuda-flash queues its kernels here, in order with the
// backend's, and takes its scratch memory from the buffer type (the same stream-ordered pool).
// Throws loom::DeviceUnavailable as context() does.
extern "C" __attribute__((visibility("default"))) void* loom_cuda_stream(int device) {
  loom::cuda::Context& context = loom::cuda::context(device);
  loom::cuda::CudaBufferType::of(context);
  return context.stream;
}
