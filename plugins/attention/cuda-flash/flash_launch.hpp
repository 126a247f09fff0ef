// attention/cuda-flash: the launchers of flash_kernels.cu, as plain C++ declarations (the kernel
// object, cuda_flash.cpp, is compiled by the C++ compiler; only the .cu file by nvcc). Every
// pointer is device memory; every launcher queues its kernels on `stream` and checks the launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace loom::cuda_flash {

using std::int32_t;
using std::int64_t;

// One call's problem (kinds/attention.hpp's AttentionForwardArgs, flattened).
struct Problem {
  int64_t batch = 0, q_len = 0, kv_len = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  const float *q = nullptr, *k = nullptr, *v = nullptr;
  int64_t q_batch_stride = 0, q_token_stride = 0;
  int64_t k_batch_stride = 0, k_token_stride = 0;
  int64_t v_batch_stride = 0, v_token_stride = 0;
  const int32_t* q_segments = nullptr;  // [batch, q_len] or null
  const int32_t* kv_segments = nullptr;
  bool causal = true;
  int64_t window = 0;
  float softcap = 0.0f;
  float scale = 1.0f;
  bool bf16 = false;     // tile operands rounded to bfloat16 (tensor cores), float32 accumulation
  float* out = nullptr;  // [batch, q_len, q_heads, head_dim]
  float* lse = nullptr;  // [batch, q_heads, q_len]
};

struct Gradient {
  float* data = nullptr;  // null: not wanted
  int64_t batch_stride = 0, token_stride = 0;
  bool accumulate = false;
};

struct BackwardProblem {
  const float* dout = nullptr;  // [batch, q_len, q_heads, head_dim]
  float* delta = nullptr;       // scratch [batch, q_heads, q_len]
  Gradient dq, dk, dv;
};

// The shared memory (bytes) each kernel of this problem's head dim and dtype asks for: the device
// must allow that much per block (cudaDevAttrMaxSharedMemoryPerBlockOptin).
int64_t shared_bytes_needed(int64_t head_dim, bool bf16);

// Allows every kernel its shared memory (cudaFuncSetAttribute); once per process and device.
void prepare_kernels();

void launch_forward(cudaStream_t stream, const Problem& p);
// delta = rowsum(dO * O) (dO rounded to bf16 first with p.bf16), then dK/dV and dQ.
void launch_backward(cudaStream_t stream, const Problem& p, const BackwardProblem& g);

}  // namespace loom::cuda_flash
