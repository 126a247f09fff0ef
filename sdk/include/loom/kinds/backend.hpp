// The `backend` kind: the kernels that loom's tensor operations call.
//
// The autograd operations (autograd.hpp, implemented in the core) validate shapes, allocate
// outputs, record the tape and then call these kernels; a backend only computes. Two backends
// ship with loom: `reference` (plain loops, float64 accumulation: the oracle) and `cpu`
// (OpenBLAS GEMMs, vectorised and parallel elementwise kernels). docs/writing-a-backend.md
// explains how to add one; tests/conformance runs every registered backend against `reference`.
//
// Memory. A backend allocates from its buffer type (device.hpp, buffer_type() below): the host's
// caching allocator for backends that compute on the CPU (the default), its own device memory
// otherwise. The operations allocate every tensor they hand a backend from that buffer type and
// refuse tensors from any other device, so every pointer a kernel receives is an address in its
// own buffer type's memory (for a host backend, a plain host pointer; for a device backend, a
// device address the host never dereferences).
//
// Contract for every kernel:
//  * Data are float32 (token ids int32), dense and row-major unless a leading dimension (`ld*`)
//    is given. Sizes are element counts. The core has validated the arguments (shapes, id
//    ranges, aliasing); a kernel may assume them. A size of zero is valid and does nothing.
//  * Input and output arrays do not overlap unless the kernel says they may.
//  * `accumulate` flags: false means overwrite the output (its previous contents may be
//    uninitialised, even NaN, and must not be read); true means add to it. Backward kernels take
//    one per gradient they write, because the tape writes a gradient buffer's first contribution
//    in place and adds the later ones.
//  * Nullable pointers are documented per kernel (an absent bias, a gradient nobody needs).
//  * Kernels run on the thread that calls them and may parallelise through the
//    ExecutionContext the backend was created with (CreateContext::execution()); they never
//    start threads and call BLAS only single-threaded (execution.hpp, "BLAS policy").
//  * A backend object is used by one thread at a time (the one running the step). It may keep
//    scratch buffers between calls.
//  * Deterministic: the same inputs and thread count give bit-identical outputs. Reductions
//    combine partial results in a fixed order, never in completion order.
//  * Accuracy: within float32 rounding of the float64 reference, as the conformance suite
//    checks (relative to the scale of the result, see tests/conformance).
//  * Kernels do not throw for valid arguments; they need not check arguments.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "loom/component.hpp"
#include "loom/device.hpp"
#include "loom/tensor.hpp"
#include "loom/training_kernels.hpp"

namespace loom {

// The kernel groups of this header, as the operations use them and Backend::supports_op asks
// about them. Each group is its forward and backward kernels.
enum class BackendOp : std::uint8_t {
  gemm,           // gemm, gemm_batched: matmul, and the backward of linear and of the fused loss
  linear,         // linear_forward, bias_activation_forward, bias_activation_backward
  activation,     // activation_forward, activation_backward: gelu, silu
  swiglu,         // swiglu_forward, swiglu_backward
  add,            // add: the residual add
  scale,          // scale: Ops::scale, and how the tape sums every gradient (required)
  fill,           // fill: how the tape zero-fills a gradient (required)
  dropout,        // dropout
  layer_norm,     // layer_norm_forward, layer_norm_backward, add_layer_norm_forward
  rms_norm,       // rms_norm_forward, rms_norm_backward, add_rms_norm_forward
  embedding,      // embedding_forward, embedding_backward
  rope,           // rope
  cross_entropy,  // cross_entropy_forward, cross_entropy_backward
  // ---- Issue 25, slice 1: the operations that computed on the host before.
  mul,        // mul: Ops::mul, forward and backward
  softcap,    // softcap_forward, softcap_backward: Ops::softcap and linear_cross_entropy's logit cap
  softmax,    // softmax_forward, softmax_backward
  logsumexp,  // logsumexp_forward, logsumexp_backward
  sum,        // sum_forward, sum_backward: Ops::sum
  loss,       // loss_reduce, z_loss_forward, z_loss_backward: the losses' reductions and z-loss
  // Training step around the model (issue 25, slice 2): defaults are host loops, see below.
  fill_normal,     // fill_normal: parameter initialisation
  optimizer,       // elementwise_update: AdamW, SGD, Lion
  sum_of_squares,  // sum_of_squares: the gradient norm
  // A mixture of experts' router on the device (issue 25): default a host loop, see below.
  routing,  // route_top_k: Ops::route_top_k
};
inline constexpr int backend_op_count = 23;
// "gemm", "layer_norm", ...
std::string_view backend_op_name(BackendOp op);

enum class Transpose : std::uint8_t { no, yes };

// Pointwise activations that the linear operation can fuse into its GEMM epilogue.
enum class Activation : std::uint8_t {
  none,
  gelu_tanh,  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): GPT-2's GELU
  silu,       // x * sigmoid(x)
};

class Backend : public Component {
 public:
  static constexpr std::string_view kind = "backend";
  ~Backend() override;

  // ---------------------------------------------------------------------------------------------
  // Identity, memory and capabilities.

  // The name the backend is registered under ("cpu"), for messages.
  virtual std::string_view name() const = 0;
  // The memory every kernel argument points into. Host backends keep this default (the core's
  // caching allocator, so tensors are plain host memory and nothing in the data path changes);
  // a device backend returns its own buffer type, registered with register_buffer_type.
  virtual BufferType& buffer_type() const { return host_buffer_type(); }
  Device device() const { return buffer_type().device(); }
  // Whether the kernels of group `op` compute on `dtype` data (the element type of the
  // operation's floating-point tensors; index tensors are always i32). The operations ask
  // before computing and refuse what a backend does not support with a UserError naming the
  // operation, the backend and the dtype. Every kernel is mandatory for f32, so the default
  // says f32 for all; a backend may decline a group it cannot run (its kernels are then never
  // called), and will list the dtypes it adds (bf16: for BackendOp::gemm, gemm_bf16 below).
  virtual bool supports_op(BackendOp op, DType dtype) const {
    (void)op;
    return dtype == DType::f32;
  }

  // The dtype this backend computes its matrix products in for float32 operands: f32, or bf16
  // when it runs mixed precision (every gemm, gemm_batched and linear_forward a gemm_bf16; the
  // cpu backend's matmul_precision, whose default, auto, is bf16 on a CPU with AVX512-BF16). The
  // operations pass it on to the attention kernels (AttentionForwardArgs::compute) so that their
  // tile products follow the same policy, and the trainer's start-up probe measures the roof of
  // this dtype. A backend whose default is bf16 declares a string option `matmul_precision`
  // accepting "f32": the conformance suite's float32 cases set it.
  virtual DType matmul_dtype() const { return DType::f32; }

  // ---------------------------------------------------------------------------------------------
  // Matrix products (row-major, BLAS semantics).

  // C[m, n] = alpha * op(A)[m, k] * op(B)[k, n] + beta * C. op(A) is A, or A^T when trans_a is
  // yes (A is then stored k x m). lda, ldb, ldc are row strides (>= the stored row length).
  // beta == 0 must not read C (it may hold NaN). k == 0 scales C by beta.
  virtual void gemm(Transpose trans_a, Transpose trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                    const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                    std::int64_t ldc) = 0;

  // `batch` independent gemms; matrix i starts at a + i * stride_a (likewise b and c).
  virtual void gemm_batched(Transpose trans_a, Transpose trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                            float alpha, const float* a, std::int64_t lda, std::int64_t stride_a, const float* b,
                            std::int64_t ldb, std::int64_t stride_b, float beta, float* c, std::int64_t ldc,
                            std::int64_t stride_c, std::int64_t batch) = 0;

  // Mixed precision: bfloat16 products with float32 accumulation. C[m, n] = alpha * op(A) op(B) +
  // beta * C with gemm's semantics (transposes, strides, beta == 0 not reading C, k == 0),
  // except that every element of A and B is first rounded to bfloat16 (to_bfloat16 in tensor.hpp:
  // nearest, ties to even). A and B stay float32 in memory (the float32 master weights and
  // activations); where a backend rounds them (typically while packing them for its kernel) is
  // its business. The product of two bfloat16 values is exact in float32 (8-bit significands),
  // and the sums are float32: the result is within float32 summation rounding of the float64
  // product of the rounded inputs, the same bound as gemm (tests/conformance checks 1e-5 relative
  // to the result's scale), and about 2^-8 relative per input away from the unrounded product.
  // Denormal inputs may be flushed to zero (the x86 bf16 instructions do).
  // A backend whose kernels compute it with bf16 units says supports_op(BackendOp::gemm,
  // DType::bf16). This default rounds copies of A and B and calls gemm: the same mathematical
  // product (the oracle on `reference`, and the float32-speed fallback elsewhere).
  virtual void gemm_bf16(Transpose trans_a, Transpose trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                         float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta,
                         float* c, std::int64_t ldc);

  // ---------------------------------------------------------------------------------------------
  // GEMM epilogues: the bias and activation of a linear layer, fused into one pass.

  // For every row r and column j of a rows x cols matrix:
  //   pre[r, j] += bias[j]               (bias nullable: nothing added)
  //   out[r, j]  = act(pre[r, j])        (only when act != none; out is then non-null, distinct)
  virtual void bias_activation_forward(float* pre, const float* bias, float* out, std::int64_t rows, std::int64_t cols,
                                       Activation act) = 0;

  // The linear layer's forward in one call: pre = op(A) op(B) (pre is m x n, row stride n), then
  // bias_activation_forward(pre, bias, out, m, n, act). A backend may fuse the two so that the
  // epilogue runs on each block of `pre` while it is still in cache; this default calls them in
  // turn.
  virtual void linear_forward(Transpose trans_a, Transpose trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                              const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float* pre,
                              const float* bias, float* out, Activation act) {
    gemm(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, pre, n);
    if (bias || act != Activation::none) bias_activation_forward(pre, bias, out, m, n, act);
  }

  // dpre[r, j] = dout[r, j] * act'(pre[r, j])  (dpre = dout when act == none; pre may then be
  //                                            null), always overwritten;
  // dbias[j] (+)= sum_r dpre[r, j]             (dbias nullable; accumulate_dbias as documented).
  // dpre may be the same array as dout.
  virtual void bias_activation_backward(const float* pre, const float* dout, float* dpre, float* dbias,
                                        bool accumulate_dbias, std::int64_t rows, std::int64_t cols,
                                        Activation act) = 0;

  // ---------------------------------------------------------------------------------------------
  // Elementwise kernels over n contiguous elements.

  // y = act(x); act != none.
  virtual void activation_forward(Activation act, const float* x, float* y, std::int64_t n) = 0;
  // dx (+)= dy * act'(x).
  virtual void activation_backward(Activation act, const float* x, const float* dy, float* dx, std::int64_t n,
                                   bool accumulate) = 0;

  // SwiGLU: y = silu(gate) * up.
  virtual void swiglu_forward(const float* gate, const float* up, float* y, std::int64_t n) = 0;
  // dgate (+)= dy * up * silu'(gate); dup (+)= dy * silu(gate). Either output may be null.
  virtual void swiglu_backward(const float* gate, const float* up, const float* dy, float* dgate, bool accumulate_dgate,
                               float* dup, bool accumulate_dup, std::int64_t n) = 0;

  // y = a + b. y may be the same array as a or b.
  virtual void add(const float* a, const float* b, float* y, std::int64_t n) = 0;
  // y (+)= alpha * x. With accumulate, y may not alias x; without, it may (in-place scaling).
  virtual void scale(const float* x, float alpha, float* y, std::int64_t n, bool accumulate) = 0;
  // y = value.
  virtual void fill(float* y, float value, std::int64_t n) = 0;

  // Dropout with the counter-based mask of random.hpp:
  //   y[i] (+)= dropout_keep(key, i, dropout_threshold(p)) ? x[i] * dropout_scale(p) : 0
  // The backward pass calls it again with the same key on the output gradient.
  virtual void dropout(const float* x, float* y, std::int64_t n, float p, std::uint64_t key, bool accumulate) = 0;

  // ---------------------------------------------------------------------------------------------
  // Normalisations over the last dimension of a rows x cols matrix (cols > 0).

  // mean[r] = mean of row r; rstd[r] = 1 / sqrt(var[r] + eps) (biased variance);
  // y = (x - mean) * rstd * weight + bias. weight and bias nullable (1 and 0).
  virtual void layer_norm_forward(const float* x, const float* weight, const float* bias, float* y, float* mean,
                                  float* rstd, std::int64_t rows, std::int64_t cols, float eps) = 0;
  // From the forward's x, weight, mean and rstd and the output gradient dy:
  //   dx (+)= d/dx, dweight (+)= sum_r dy * xhat, dbias (+)= sum_r dy.
  // dx, dweight, dbias nullable (not wanted); weight nullable as in the forward.
  virtual void layer_norm_backward(const float* x, const float* weight, const float* mean, const float* rstd,
                                   const float* dy, float* dx, bool accumulate_dx, float* dweight,
                                   bool accumulate_dweight, float* dbias, bool accumulate_dbias, std::int64_t rows,
                                   std::int64_t cols) = 0;
  // Residual add fused with layer_norm_forward: sum = a + b, then layer_norm_forward(sum, ...).
  virtual void add_layer_norm_forward(const float* a, const float* b, float* sum, const float* weight,
                                      const float* bias, float* y, float* mean, float* rstd, std::int64_t rows,
                                      std::int64_t cols, float eps) = 0;

  // rstd[r] = 1 / sqrt(mean(x[r]^2) + eps); y = x * rstd * weight (weight nullable).
  virtual void rms_norm_forward(const float* x, const float* weight, float* y, float* rstd, std::int64_t rows,
                                std::int64_t cols, float eps) = 0;
  virtual void rms_norm_backward(const float* x, const float* weight, const float* rstd, const float* dy, float* dx,
                                 bool accumulate_dx, float* dweight, bool accumulate_dweight, std::int64_t rows,
                                 std::int64_t cols) = 0;
  // sum = a + b, then rms_norm_forward(sum, ...).
  virtual void add_rms_norm_forward(const float* a, const float* b, float* sum, const float* weight, float* y,
                                    float* rstd, std::int64_t rows, std::int64_t cols, float eps) = 0;

  // ---------------------------------------------------------------------------------------------
  // Embedding lookup. table is vocab x dim; every id is in [0, vocab).

  // out[i, :] = table[ids[i], :] for i < n.
  virtual void embedding_forward(const float* table, const std::int32_t* ids, float* out, std::int64_t n,
                                 std::int64_t dim, std::int64_t vocab) = 0;
  // dtable[ids[i], :] += dout[i, :] for every i, always accumulating. Repeated ids must be
  // summed in increasing i order (that keeps it deterministic).
  virtual void embedding_backward(const std::int32_t* ids, const float* dout, float* dtable, std::int64_t n,
                                  std::int64_t dim, std::int64_t vocab) = 0;

  // ---------------------------------------------------------------------------------------------
  // Rotary position embedding.
  //
  // x and y are [batch, seq, heads, head_dim]; heads are contiguous within a token (head stride
  // head_dim), tokens are `*_token_stride` elements apart and batches `*_batch_stride` apart.
  // cos and sin are [max_position, head_dim / 2] tables. The position of token t of sequence b is
  // positions[b * seq + t] when positions is non-null, else position_offset + t.
  // Pairs: (i, i + head_dim/2) for i < head_dim/2 (GPT-NeoX / Llama-HF layout) or (2i, 2i + 1)
  // when interleaved (original Llama / GPT-J layout); pair i rotates by angle theta_i(pos):
  //   y_a = x_a cos - x_b sin, y_b = x_a sin + x_b cos     (inverse: the rotation by -theta,
  //                                                         which is the backward pass)
  // y is written (+)= as `accumulate` says. x and y do not overlap.
  virtual void rope(const float* x, std::int64_t x_batch_stride, std::int64_t x_token_stride, float* y,
                    std::int64_t y_batch_stride, std::int64_t y_token_stride, const float* cos, const float* sin,
                    const std::int32_t* positions, std::int64_t position_offset, std::int64_t batch, std::int64_t seq,
                    std::int64_t heads, std::int64_t head_dim, bool interleaved, bool inverse, bool accumulate) = 0;

  // ---------------------------------------------------------------------------------------------
  // Softmax cross-entropy over a vocabulary, row by row, never materialising probabilities.
  //
  // logits is rows x vocab with row stride ld. A row whose target equals ignore_index takes no
  // part: its loss and gradient are 0 (its lse is still written). Other targets are in
  // [0, vocab).

  // lse[r] = log(sum_j exp(logits[r, j])) (computed stably in one pass over the row), and
  // losses[r] = lse[r] - logits[r, target[r]].
  virtual void cross_entropy_forward(const float* logits, std::int64_t ld, const std::int32_t* targets, float* losses,
                                     float* lse, std::int64_t rows, std::int64_t vocab, std::int32_t ignore_index) = 0;
  // In place: logits[r, j] <- grad_scale * (exp(logits[r, j] - lse[r]) - [j == target[r]]), and 0
  // for ignored rows. This turns the logits buffer into its own gradient.
  virtual void cross_entropy_backward(float* logits, std::int64_t ld, const std::int32_t* targets, const float* lse,
                                      float grad_scale, std::int64_t rows, std::int64_t vocab,
                                      std::int32_t ignore_index) = 0;

  // =============================================================================================
  // Issue 25, slice 1: the kernels of operations the core computed on the host before (the
  // elementwise product, soft-capping, softmax and log-sum-exp over the last dimension, the sum
  // of all elements, and the reductions and z-loss terms of the cross-entropy losses). The
  // reductions accumulate in float64 in a fixed order (rows in parallel at most), so that the
  // result is independent of the thread count.

  // y (+)= a * b. The forward of Ops::mul (accumulate false) and both halves of its backward
  // (da (+)= dy * b, db (+)= dy * a).
  virtual void mul(const float* a, const float* b, float* y, std::int64_t n, bool accumulate) = 0;

  // Soft-capping, cap > 0: h = tanh(x / cap), y = cap * h; tanh_out (nullable) receives h.
  // y may be the same array as x (the fused loss caps its logits in place).
  virtual void softcap_forward(const float* x, float* y, float* tanh_out, std::int64_t n, float cap) = 0;
  // dx (+)= dy * (1 - t^2) with t = h[i] * h_scale, where h[i] * h_scale is the forward's
  // tanh(x / cap): either its output y with h_scale = 1 / cap (Ops::softcap), or its tanh_out with
  // h_scale = 1 (the fused loss). dx may be the same array as dy when not accumulating.
  virtual void softcap_backward(const float* h, float h_scale, const float* dy, float* dx, std::int64_t n,
                                bool accumulate) = 0;

  // Over each row of a rows x cols matrix (cols > 0): y = exp(x - max) / sum(exp(x - max)), the
  // sum accumulated in float64.
  virtual void softmax_forward(const float* x, float* y, std::int64_t rows, std::int64_t cols) = 0;
  // From the forward's output y: dx (+)= y * (dy - sum_j dy_j y_j) row by row (the dot product in
  // float64).
  virtual void softmax_backward(const float* y, const float* dy, float* dx, std::int64_t rows, std::int64_t cols,
                                bool accumulate) = 0;

  // y[r] = log(sum_j exp(x[r, j])) over each row of a rows x cols matrix (cols > 0), computed
  // stably (max subtracted, float64 sum).
  virtual void logsumexp_forward(const float* x, float* y, std::int64_t rows, std::int64_t cols) = 0;
  // dx[r, j] (+)= dy[r] * exp(x[r, j] - y[r]).
  virtual void logsumexp_backward(const float* x, const float* y, const float* dy, float* dx, std::int64_t rows,
                                  std::int64_t cols, bool accumulate) = 0;

  // y[0] = the sum of x's n elements, accumulated in float64 in index order (n may be 0: y = 0).
  virtual void sum_forward(const float* x, float* y, std::int64_t n) = 0;
  // dx[i] (+)= dy[0] for i < n: the scalar seed read where it lies, in the backend's memory.
  virtual void sum_backward(const float* dy, float* dx, std::int64_t n, bool accumulate) = 0;

  // The value of a reduced cross-entropy loss, written to out[0] (one float in the backend's
  // memory, which the caller copies to the host if it must see it):
  //   out = float(scale * sum_r losses[r])  (float64 sum in row order)
  //         + (z_loss_weight != 0 ? float(z_loss_weight * scale * sum_{r counted} lse[r]^2) : 0)
  // where a row is counted when targets[r] != ignore_index (each part rounded to float, then
  // added in float).
  virtual void loss_reduce(const float* losses, const float* lse, const std::int32_t* targets, std::int64_t rows,
                           std::int32_t ignore_index, float scale, float z_loss_weight, float* out) = 0;
  // Reduction::none's z-loss term: losses[r] += z_loss_weight * lse[r]^2 for each counted row.
  virtual void z_loss_forward(float* losses, const float* lse, const std::int32_t* targets, std::int64_t rows,
                              std::int32_t ignore_index, float z_loss_weight) = 0;
  // In place, on rows already holding cross_entropy_backward's g (softmax - onehot) (row stride
  // ld): the gradient of the loss plus z-loss, g (softmax (1 + 2 w lse) - onehot). Each counted
  // row r is scaled by 1 + 2 w lse[r] and g 2 w lse[r] is added at its target (w = z_loss_weight,
  // g = grad_scale); ignored rows are left as they are.
  virtual void z_loss_backward(float* logits, std::int64_t ld, const std::int32_t* targets, const float* lse,
                               float grad_scale, float z_loss_weight, std::int64_t rows, std::int64_t vocab,
                               std::int32_t ignore_index) = 0;
  // ---- End of issue 25, slice 1.
  // ---------------------------------------------------------------------------------------------
  // Training step around the model (issue 25, slice 2): parameter initialisation, the optimizers'
  // elementwise updates and the gradient norm, so that a training step never reads or writes a
  // parameter, gradient or optimizer state on the host. Each has a default: a single-threaded host
  // loop over the pointers, right for a backend whose memory the host can read (`reference` uses
  // them). A host backend's callers do not even call them: they keep their own parallel host code
  // (models::fill_normal, ElementwiseOptimizer::update_chunk, the trainer's norm), which gives the
  // same bits. A device backend must override all three (the defaults would read device memory).

  // y[i] = scale * random_normal(key, first_index + i) for i < n (random.hpp's counter-based
  // stream; indices below 2^32): the same values as the host initialisation, bit for bit. Under
  // tensor parallelism each run of a shard is one call with its index in the whole tensor.
  virtual void fill_normal(float* y, std::int64_t n, std::uint64_t key, std::int64_t first_index, float scale);

  // One elementwise optimizer update of n elements (training_kernels.hpp: the rule, its constants,
  // which slots it uses), in place on the parameter and the slots, from the gradient. Must give
  // apply_elementwise_update's bits (its roundings and fused multiply-adds as written).
  virtual void elementwise_update(const ElementwiseUpdate& update, float* parameter, const float* grad,
                                  const std::array<float*, 4>& slots, std::int64_t n);

  // For each chunk c of `chunk` elements of x[0, n) (the last one shorter), in order:
  // partials[c] = sum_of_squares(x + c * chunk, ...) (training_kernels.hpp: double, eight lanes).
  // `partials` is memory of this backend's buffer type (ceil(n / chunk) doubles, 8-byte
  // aligned): the trainer gives every gradient's chunks their slots in one buffer and copies it
  // to the host once per step, where it adds them up in chunk order for the gradient norm.
  virtual void sum_of_squares(const float* x, std::int64_t n, std::int64_t chunk, double* partials);

  // ---------------------------------------------------------------------------------------------
  // A mixture of experts' router (issue 25): the top-k choices and the dispatch order computed
  // where the logits are, so that the experts' gathers and the combination read their ids from
  // the backend's memory. The default is a host loop over the pointers (right for memory the
  // host can read: `reference` and `cpu` use it, the arrays being a few ints per token); a device
  // backend overrides it.
  //
  // From logits [tokens, experts] (f32, row-major), each token's k largest logits (0 < k <=
  // experts) in decreasing order, a tie going to the lower expert id (NaN compares as in
  // std::partial_sort with that order). Choice j of token t, of expert e, gives:
  //   chosen[t k + j] = t experts + e: the chosen logit's index in the flat logits;
  //   counts[e]       = the number of tokens that chose e (every e in [0, experts));
  //   sorted[begin(e) + i] = the i-th token, in token order, that chose e, where begin(e) =
  //                     counts[0] + ... + counts[e - 1]: the expert-sorted token list (tokens k);
  //   slots[t k + j]  = the row of the choice in the outputs of the experts [first, last) (this
  //                     member's; all of them: 0, experts), expert after expert, each one's
  //                     tokens in token order: counts[first] + ... + counts[e - 1] + i for the
  //                     i-th token of e in [first, last); for an expert outside, the row after
  //                     them all (counts[first] + ... + counts[last - 1]), which the caller zeroes.
  // Every array is i32 in the backend's memory; 0 <= first <= last <= experts and tokens
  // experts < 2^31 (the core checks).
  virtual void route_top_k(const float* logits, std::int64_t tokens, std::int64_t experts, std::int64_t k,
                           std::int64_t first, std::int64_t last, std::int32_t* chosen, std::int32_t* slots,
                           std::int32_t* sorted, std::int32_t* counts);
};

// Throws UserError when `backend` computes in memory the host cannot touch: for components that
// read or write tensors on the host themselves (`loom bench gemm`'s host operands; the trainer
// and `loom generate` work on any backend). `user` names the component: "loom bench gemm".
void require_host_memory(const Backend& backend, std::string_view user);

}  // namespace loom
