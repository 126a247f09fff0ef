// The `attention` kind: an attention kernel, forward and backward.
//
// Ops::attention (autograd.hpp) validates its inputs, allocates the output and the row
// statistics, calls forward, records the tape, and later calls backward with the output
// gradient. A kernel provides both passes; a model never writes either.
//
// Layout. Queries are [batch, q_len, q_heads, head_dim] and keys/values [batch, kv_len,
// kv_heads, head_dim]. Within a token the heads are contiguous (head stride = head_dim,
// element stride 1); tokens and batches have their own strides, so q, k and v may be column
// slices of one fused qkv projection. out and dout are contiguous.
//
// Semantics, for batch b, query head h, query row i and key row j:
//   kv head        g = h / (q_heads / kv_heads)                (grouped-query attention)
//   positions      query i is at absolute position p_i = kv_len - q_len + i (queries are the last
//                  q_len positions of the keys: equal lengths in training, a suffix with a cache)
//   score          s = scale * dot(q[b,i,h], k[b,j,g])         (scale 0 means 1/sqrt(head_dim))
//   soft-cap       s = softcap * tanh(s / softcap)             (when softcap > 0; Gemma 2)
//   visible        causal:           j <= p_i
//                  window > 0:       p_i - j < window          (and j - p_i < window if not causal)
//                  segments given:   q_segments[b,i] == kv_segments[b,j]  (packed documents)
//   out[b,i,h]     = sum_j softmax_j(s over visible j) * v[b,j,g]
//   lse[b,h,i]     = log(sum over visible j of exp(s)): natural log, after soft-capping
// A row with no visible key gets out = 0 and lse = -infinity, and contributes no gradient.
//
// Memory: every pointer in the arguments is an address in the memory of the kernel's device()
// (the host unless the kernel says otherwise); Ops::attention refuses operands on any other
// device, so a kernel for a device comes with that device's backend.
//
// Threads: calls come from the thread running the step; a kernel parallelises through the
// ExecutionContext it was created with and uses BLAS single-threaded only. Scratch memory comes
// from Tensor::empty (the core's caching allocator). Deterministic for a given thread count.
#pragma once

#include <cstdint>
#include <string_view>

#include "loom/component.hpp"
#include "loom/device.hpp"
#include "loom/tensor.hpp"

namespace loom {

// The options a model passes per call (usually from its config).
struct AttentionParams {
  bool causal = true;
  std::int64_t window = 0;  // sliding window in positions; 0: unlimited
  float softcap = 0.0f;     // logit soft-cap; 0: off
  float scale = 0.0f;       // score scale; 0: 1/sqrt(head_dim)
};

// One strided [batch, len, heads, head_dim] operand.
struct AttentionOperand {
  const float* data = nullptr;
  std::int64_t batch_stride = 0;  // elements between batch b and b+1
  std::int64_t token_stride = 0;  // elements between token t and t+1 (>= heads * head_dim)
};

struct AttentionForwardArgs {
  std::int64_t batch = 0, q_len = 0, kv_len = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  AttentionOperand q, k, v;
  const std::int32_t* q_segments = nullptr;   // [batch, q_len], or null: no segments
  const std::int32_t* kv_segments = nullptr;  // [batch, kv_len]; non-null iff q_segments is
  AttentionParams params;                     // scale already resolved (never 0 here)
  float* out = nullptr;                       // [batch, q_len, q_heads, head_dim], contiguous
  float* lse = nullptr;                       // [batch, q_heads, q_len]
  // The dtype of the kernel's tile products, set by Ops::attention from the backend's
  // Backend::matmul_dtype(): f32, or bf16 (Q, K, V, P, dO and dS rounded to bfloat16 as they
  // enter a product, float32 accumulation; softmax statistics, the log-sum-exp, out and the
  // gradients stay float32). A kernel without a bf16 path computes f32 whatever it says.
  DType compute = DType::f32;
};

// A gradient destination: same strides convention as AttentionOperand, plus whether to add.
struct AttentionGradient {
  float* data = nullptr;  // null: not wanted
  std::int64_t batch_stride = 0;
  std::int64_t token_stride = 0;
  bool accumulate = false;  // false: overwrite (contents undefined before); true: add
};

struct AttentionBackwardArgs {
  const AttentionForwardArgs* forward = nullptr;  // the forward's arguments; out and lse as it wrote them
  const float* dout = nullptr;                    // [batch, q_len, q_heads, head_dim], contiguous
  AttentionGradient dq, dk, dv;                   // dk/dv sum over the heads of a group
};

class AttentionKernel : public Component {
 public:
  static constexpr std::string_view kind = "attention";
  ~AttentionKernel() override;

  // The device whose memory the kernel reads and writes.
  virtual Device device() const { return Device::host(); }

  // Writes out and lse as described above.
  virtual void forward(const AttentionForwardArgs& args) = 0;
  // Writes the gradients of the loss with respect to q, k and v given dout. Called at most once
  // per forward, with the forward's inputs and outputs unchanged.
  virtual void backward(const AttentionBackwardArgs& args) = 0;
};

}  // namespace loom
