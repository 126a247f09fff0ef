// `loom bench gemm`: the matrix products of a backend, float32 and bfloat16, against raw library
// calls measured in the same run.
//
// For each shape (GPT-2 small's by default: the products of one training step at 4 x 256
// tokens), every backend runs every dtype on the same random operands: `f32` is Backend::gemm
// (of a backend created with matmul_precision: f32 where it declares that option, so that the
// row is the float32 product whatever the backend's default), `bf16` is Backend::gemm_bf16 (bf16
// products, float32 accumulation; a backend without bf16 kernels on this CPU computes it through
// the float32 fallback, and the table says so). Times are the median of `repeats` runs after one
// warm-up run; GFLOP/s counts 2 m n k.
//
// `int8` and `nf4` time the product with a frozen weight stored in that format (lora.base_dtype):
// Ops::linear of A by B stored as a weight (B^T: an [out, in] weight; else [in, out]), which
// dequantizes panels of the weight and multiplies them with the backend's float32 gemm, so its
// ratio to the backend's f32 row is the cost of dequantizing on the fly. Shapes with A^T (weight
// gradients, which a frozen weight has none of) have no such row.
//
// The library baselines, in the same run: `openblas` is one cblas_sgemm on the calling thread
// (the core holds OpenBLAS to one thread: execution.hpp, "BLAS policy"), so a backend's ratio to
// it is its speed-up from the pool's threads and its own kernels; `onednn` is oneDNN's
// dnnl_gemm_bf16bf16f32 on operands converted to bf16 beforehand (not timed), with its own
// OpenMP threads (as many as the pool), when the library (libdnnl.so.2) can be loaded.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loom/core/registry.hpp"
#include "loom/quantization.hpp"
#include "loom/tensor.hpp"

namespace loom {

struct GemmShape {
  std::string name;  // "qkv", "mlp_up_dW", ...
  std::int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
};

// The products of one GPT-2 small (width 768, vocabulary 50257) training step on `tokens`
// tokens: the forward products of each kind of linear layer, one weight-gradient product
// (A transposed) and the tied output layer (B transposed).
std::vector<GemmShape> gpt2_small_gemm_shapes(std::int64_t tokens);

struct GemmBenchOptions {
  std::vector<ComponentRef> backends;  // at least one
  std::vector<DType> dtypes{DType::f32, DType::bf16};
  std::vector<quant::StorageFormat> weight_formats;  // int8, nf4 (bf16 too): a stored B
  std::vector<GemmShape> shapes = gpt2_small_gemm_shapes(1024);
  bool libraries = true;  // also measure the raw library calls
  int repeats = 3;
  std::uint64_t seed = 0;
};

struct GemmBenchResult {
  std::string shape;
  std::string backend;  // a backend's name, or "openblas" / "onednn" for the raw calls
  bool library = false;
  DType dtype = DType::f32;
  double ms = 0.0;
  double gflops = 0.0;
  bool fallback = false;                                    // bf16 asked of a backend without bf16 kernels on this CPU
  quant::StorageFormat weight = quant::StorageFormat::f32;  // not f32: B stored in this format
  // "f32", "bf16", or the stored weight's format.
  std::string label() const {
    return weight == quant::StorageFormat::f32 ? std::string(dtype_name(dtype)) : quant::storage_format_name(weight);
  }
};

// Runs every shape (outer), dtype, backend and library. `progress`, when set, is called after
// each result. A device backend (memory the host cannot read) is timed on operands copied to its
// memory once per shape, each timed product ending with a one-element copy of C to the host (which
// waits for it). Throws UserError for invalid options (no backend, a non-positive size, a stored
// weight's dtype (int8, nf4) with a device backend, an unknown backend).
std::vector<GemmBenchResult> run_gemm_bench(const Registry& registry, const GemmBenchOptions& options,
                                            const std::function<void(const GemmBenchResult&)>& progress = {});

// One table per shape: ms, GFLOP/s, the ratio to the library call of the same dtype, and bf16's
// speed-up over the same backend's f32.
std::string format_gemm_bench(const GemmBenchOptions& options, const std::vector<GemmBenchResult>& results,
                              int threads);

// "f32" -> f32, "bf16" -> bf16; UserError otherwise (naming `where`).
DType parse_compute_dtype(const std::string& text, const std::string& where);
// --dtypes: f32 and bf16 into options.dtypes, int8 and nf4 into options.weight_formats;
// UserError for anything else (naming `where`).
void parse_gemm_dtypes(const std::vector<std::string>& names, GemmBenchOptions& options, const std::string& where);

}  // namespace loom
