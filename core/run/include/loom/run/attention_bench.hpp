// `loom bench attention`: the time and the extra memory of attention kernels, side by side.
//
// For each sequence length, every kernel runs the forward pass alone and the forward pass
// followed by the backward pass on the same random problem: q, k and v are slices of one fused
// [batch, seq_len, 3 * heads, head_dim] buffer (as a GPT's qkv projection gives them), the output
// gradient is random, and dq, dk and dv land in one fused gradient buffer. Times are the median
// of `repeats` runs after one warm-up run. "Peak extra memory" is the most memory the kernel held
// from the core's allocator (allocator.hpp: peak_bytes_in_use above what was in use before the
// call) at any point of a forward and backward pass: its scratch, not the inputs, outputs and
// gradients that every kernel shares.
//
// A kernel of another device than the host (cuda-flash on cuda:N, the test device guarded:0)
// runs on copies of the problem in its device's memory, made once per sequence length; since its
// launches may return before the device is done, each timed run ends by copying the log-sum-exp
// ([batch, heads, seq_len] floats) back to the host, which waits for the device, and is part of
// the time. Its scratch comes from the device's own pool, which the core's allocator does not
// see: the memory columns show "-" for it.
//
// Compute dtypes: every kernel runs once per entry of `dtypes` (AttentionForwardArgs::compute):
// f32, or bf16 (the tile products in bfloat16 with float32 accumulation, where the kernel has
// such a path on this CPU: `flash` with AVX512-BF16). A kernel that computes float32 whatever it
// is asked gives bit-identical outputs for bf16; the bench checks that and marks the row.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loom/core/registry.hpp"
#include "loom/kinds/attention.hpp"

namespace loom {

struct AttentionBenchOptions {
  std::vector<ComponentRef> kernels;      // the first is the baseline of the ratios
  std::vector<DType> dtypes{DType::f32};  // per kernel, in this order
  std::vector<std::int64_t> seq_lens{256, 512, 1024, 2048};
  std::int64_t batch = 4;
  std::int64_t heads = 12;     // query heads
  std::int64_t kv_heads = 0;   // 0: as many as query heads
  std::int64_t head_dim = 64;  // GPT-2 small: 12 heads of 64
  AttentionParams params;      // causal by default; scale 0 = 1/sqrt(head_dim)
  int repeats = 3;
  std::uint64_t seed = 0;
};

struct AttentionBenchResult {
  std::string kernel;  // the label: name, plus options when given
  std::string device;  // where it computed: "host", "cuda:0"
  DType dtype = DType::f32;
  bool fallback = false;  // bf16 asked, and the output is the float32 run's, bit for bit
  std::int64_t seq_len = 0;
  double forward_ms = 0.0;
  double forward_backward_ms = 0.0;
  std::size_t peak_extra_bytes = 0;
  bool memory_measured = true;  // false for a device kernel (its scratch is not the core's)
};

// Runs every kernel in every dtype at every length (lengths outer, then kernels, then dtypes).
// `progress`, when set, is called after each result. Throws UserError for invalid options (no
// kernel or dtype, a non-positive size, heads not a multiple of kv_heads, an unknown kernel or
// invalid kernel options).
std::vector<AttentionBenchResult> run_attention_bench(
    const Registry& registry, const AttentionBenchOptions& options,
    const std::function<void(const AttentionBenchResult&)>& progress = {});

// One table per sequence length: forward ms, forward+backward ms, peak extra MiB, and each row's
// speed-up over the first row (its time divided into the first row's), memory relative to the
// first row's, and for a dtype other than f32 the forward+backward speed-up over the same
// kernel's f32 row.
std::string format_attention_bench(const AttentionBenchOptions& options,
                                   const std::vector<AttentionBenchResult>& results, int threads);

}  // namespace loom
