// backend/cuda: the kernels' launchers, one .cu file per family (as ggml-cuda). Each queues its
// kernels on `stream` and checks the launch (LOOM_CHECK_LAUNCH); the arguments are the backend
// contract's (kinds/backend.hpp), already validated by the core. Plain C++ declarations: the
// backend (cuda_backend.cpp) is compiled by the C++ compiler, only the .cu files by nvcc.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <loom/training_kernels.hpp>

namespace loom::cuda {

struct Context;
using std::int32_t;
using std::int64_t;

// pointwise.cu
void launch_fill(cudaStream_t s, float* y, float value, int64_t n);
void launch_scale(cudaStream_t s, const float* x, float alpha, float* y, int64_t n, bool accumulate);
void launch_add(cudaStream_t s, const float* a, const float* b, float* y, int64_t n);
void launch_mul(cudaStream_t s, const float* a, const float* b, float* y, int64_t n, bool accumulate);
void launch_activation_forward(cudaStream_t s, int act, const float* x, float* y, int64_t n);
void launch_activation_backward(cudaStream_t s, int act, const float* x, const float* dy, float* dx, int64_t n,
                                bool accumulate);
void launch_swiglu_forward(cudaStream_t s, const float* gate, const float* up, float* y, int64_t n);
void launch_swiglu_backward(cudaStream_t s, const float* gate, const float* up, const float* dy, float* dgate,
                            bool accumulate_dgate, float* dup, bool accumulate_dup, int64_t n);
void launch_bias_activation_forward(cudaStream_t s, float* pre, const float* bias, float* out, int64_t rows,
                                    int64_t cols, int act);
// dpre = dout * act'(pre); dbias (+)= column sums of dpre (float64, rows in order).
void launch_bias_activation_backward(cudaStream_t s, const float* pre, const float* dout, float* dpre, float* dbias,
                                     bool accumulate_dbias, int64_t rows, int64_t cols, int act);
void launch_dropout(cudaStream_t s, const float* x, float* y, int64_t n, float p, std::uint64_t key, bool accumulate);
void launch_softcap_forward(cudaStream_t s, const float* x, float* y, float* tanh_out, int64_t n, float cap);
void launch_softcap_backward(cudaStream_t s, const float* h, float h_scale, const float* dy, float* dx, int64_t n,
                             bool accumulate);
// f32 -> bf16-rounded f32 copy (gemm_bf16's operands), a rows x cols matrix of row stride ld
// into a dense one of the same stride.
void launch_round_bf16(cudaStream_t s, const float* x, std::uint16_t* y, int64_t rows, int64_t cols, int64_t ld);

// norms.cu
void launch_layer_norm_forward(cudaStream_t s, const float* x, const float* weight, const float* bias, float* y,
                               float* mean, float* rstd, int64_t rows, int64_t cols, float eps);
void launch_layer_norm_backward(Context& c, const float* x, const float* weight, const float* mean, const float* rstd,
                                const float* dy, float* dx, bool accumulate_dx, float* dweight, bool accumulate_dweight,
                                float* dbias, bool accumulate_dbias, int64_t rows, int64_t cols);
void launch_rms_norm_forward(cudaStream_t s, const float* x, const float* weight, float* y, float* rstd, int64_t rows,
                             int64_t cols, float eps);
void launch_rms_norm_backward(Context& c, const float* x, const float* weight, const float* rstd, const float* dy,
                              float* dx, bool accumulate_dx, float* dweight, bool accumulate_dweight, int64_t rows,
                              int64_t cols);

// embedding_rope.cu
void launch_embedding_forward(cudaStream_t s, const float* table, const int32_t* ids, float* out, int64_t n,
                              int64_t dim);
// Deterministic: the ids sorted (stable radix sort), then each id's rows summed in float64 in
// increasing i order by one block, and added to dtable once. No atomics.
void launch_embedding_backward(Context& c, const int32_t* ids, const float* dout, float* dtable, int64_t n, int64_t dim,
                               int64_t vocab);
void launch_rope(cudaStream_t s, const float* x, int64_t x_batch_stride, int64_t x_token_stride, float* y,
                 int64_t y_batch_stride, int64_t y_token_stride, const float* cos, const float* sin,
                 const int32_t* positions, int64_t position_offset, int64_t batch, int64_t seq, int64_t heads,
                 int64_t head_dim, bool interleaved, bool inverse, bool accumulate);

// losses.cu: cross-entropy, softmax, logsumexp, sum, the losses' reductions, z-loss.
void launch_cross_entropy_forward(cudaStream_t s, const float* logits, int64_t ld, const int32_t* targets,
                                  float* losses, float* lse, int64_t rows, int64_t vocab, int32_t ignore_index);
void launch_cross_entropy_backward(cudaStream_t s, float* logits, int64_t ld, const int32_t* targets, const float* lse,
                                   float grad_scale, int64_t rows, int64_t vocab, int32_t ignore_index);
void launch_softmax_forward(cudaStream_t s, const float* x, float* y, int64_t rows, int64_t cols);
void launch_softmax_backward(cudaStream_t s, const float* y, const float* dy, float* dx, int64_t rows, int64_t cols,
                             bool accumulate);
void launch_logsumexp_forward(cudaStream_t s, const float* x, float* y, int64_t rows, int64_t cols);
void launch_logsumexp_backward(cudaStream_t s, const float* x, const float* y, const float* dy, float* dx, int64_t rows,
                               int64_t cols, bool accumulate);
void launch_sum_forward(cudaStream_t s, const float* x, float* y, int64_t n);
void launch_sum_backward(cudaStream_t s, const float* dy, float* dx, int64_t n, bool accumulate);
void launch_loss_reduce(cudaStream_t s, const float* losses, const float* lse, const int32_t* targets, int64_t rows,
                        int32_t ignore_index, float scale, float z_loss_weight, float* out);
void launch_z_loss_forward(cudaStream_t s, float* losses, const float* lse, const int32_t* targets, int64_t rows,
                           int32_t ignore_index, float z_loss_weight);
void launch_z_loss_backward(cudaStream_t s, float* logits, int64_t ld, const int32_t* targets, const float* lse,
                            float grad_scale, float z_loss_weight, int64_t rows, int64_t vocab, int32_t ignore_index);

// training.cu (compiled with -fmad=false: the host's roundings)
// y[i] = scale * random_normal(key, first + i); indices whose float64 value lies too close to a
// float rounding boundary for the GPU's log and cos to be trusted to round as the host's are
// listed in `uncertain` (count in uncertain_count, at most `capacity` of them stored).
void launch_fill_normal(cudaStream_t s, float* y, int64_t n, std::uint64_t key, int64_t first_index, float scale,
                        std::uint32_t* uncertain, std::uint32_t* uncertain_count, std::uint32_t capacity);
void launch_elementwise_update(cudaStream_t s, const ElementwiseUpdate& update, float* parameter, const float* grad,
                               const std::array<float*, 4>& slots, int64_t n);
void launch_sum_of_squares(cudaStream_t s, const float* x, int64_t n, int64_t chunk, double* partials);

// routing.cu
void launch_route_top_k(Context& c, const float* logits, int64_t tokens, int64_t experts, int64_t k, int64_t first,
                        int64_t last, int32_t* chosen, int32_t* slots, int32_t* sorted, int32_t* counts);

}  // namespace loom::cuda
