// Quantized storage of frozen weights (issue 22, QLoRA): the codecs. A row-major [rows, cols]
// matrix of float32 (or bf16) values is quantized once, and dequantized as often as needed, whole
// or a range of rows and columns at a time into a caller's buffer (the way a GEMM's packing reads
// a panel of a weight). Two formats:
//
// - nf4: QLoRA's NormalFloat-4 (Dettmers et al. 2023, section 3) exactly as bitsandbytes stores it
//   (`bitsandbytes.functional.quantize_4bit(w, quant_type="nf4", blocksize=64,
//   compress_statistics=True)`): the row-major flattened values in blocks of 64, each with its
//   absmax; each value becomes the index of the nearest of the 16 NormalFloat levels
//   (nf4_levels()) to value / absmax (a value on a midpoint between two levels takes the lower);
//   two codes per byte, the even-indexed value in the high nibble. Double quantization: the
//   absmaxes' mean is subtracted (one float32 offset), and the centred absmaxes are quantized in
//   blocks of 256 to bitsandbytes' signed 8-bit dynamic float code (dynamic8_levels()), each block
//   with a float32 absmax of its own. Storage: 4 bits a weight + 8 bits per 64 weights + 32 bits
//   per 16384: 4.127 bits a weight. The statistics are bitsandbytes' own (its CPU kernels,
//   0.50.2): the mean is torch.mean's float32 sum (its CPU order, 8-lane vectors on one thread)
//   divided by the count, and each centred absmax c of a block with absmax s takes
//   dynamic8_code(c * (1 / s)) (dynamic8_code below: a 65536-entry table, not the nearest level).
//   A fused weight whose parts bitsandbytes quantizes as tensors of their own (llama's q, k and v
//   rows of qkv_proj) takes each part's statistics on its own (quantize_nf4 with part_rows).
// - int8: per-output-row (per-row) absmax, symmetric: scale = absmax / 127, code =
//   round-half-to-even(value * (127 / absmax)) in [-127, 127]; value ~ code * scale.
//
// Everything here is deterministic (the same input gives the same bytes on every CPU and kernel
// set) and thread-safe (no state; different calls may run concurrently). Dequantization picks
// AVX-512 or AVX2 (the build baseline) kernels at run time; every kernel gives the same bits.
// Quantizing a non-finite value is a UserError naming where it is.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace loom::quant {

// The number of consecutive (row-major, flattened) values sharing one nf4 absmax.
inline constexpr std::int64_t nf4_block_size = 64;
// The number of consecutive absmaxes sharing one double-quantization scale.
inline constexpr std::int64_t nf4_absmax_block_size = 256;

// The 16 NormalFloat-4 levels in code order (code 0 = -1, code 7 = 0, code 15 = 1): bitsandbytes'
// table (`get_4bit_type("nf4")`, the paper's create_normal_map(offset=0.9677083)), bit for bit.
const std::array<float, 16>& nf4_levels();

// bitsandbytes' signed 8-bit dynamic float code, sorted (`create_dynamic_map()`: 256 values in
// [-1, 1], dense near 0), which quantizes the centred nf4 absmaxes.
const std::array<float, 256>& dynamic8_levels();

// The dynamic8 code bitsandbytes' CPU kernel (cquantize_blockwise_cpu_fp32, 0.50.2) gives a
// normalised value x in [-1, 1]: the code nearest to the point of torch.linspace(-1, 1, 65536)
// that x rounds to, index floor(fl(fl(x + 1) * 32767.5) + 0.5) in float32 arithmetic. Within
// 1/65535 of a midpoint between two levels it may take the farther one.
std::uint8_t dynamic8_code(float x);

// The mean bitsandbytes subtracts from the absmaxes: torch.mean of a float32 tensor on the CPU,
// its cascade sum (4 accumulators of 8-lane vectors, levels of 16 or more) on one thread, divided
// by the count in float32. (On more threads, or with 16-lane vectors, torch itself may round
// the last bit otherwise.)
float torch_float32_mean(std::span<const float> values);

// A matrix in NF4 with double-quantized absmaxes.
struct Nf4Matrix {
  std::int64_t rows = 0, cols = 0;
  // ceil(rows * cols / 2) bytes: the code of flat value 2i in the high nibble of byte i, 2i + 1 in
  // its low nibble (after an odd count, the last low nibble is 7, the code of 0, as bitsandbytes
  // pads).
  std::vector<std::uint8_t> codes;
  // One per block of nf4_block_size values: the dynamic8 code of (absmax - absmax_offset) /
  // absmax_scales[block / nf4_absmax_block_size].
  std::vector<std::uint8_t> absmax_codes;
  // One per nf4_absmax_block_size blocks: the largest |absmax - absmax_offset| among them.
  std::vector<float> absmax_scales;
  // The mean of all the blocks' absmaxes (torch_float32_mean); of the first part's with parts.
  float absmax_offset = 0.0f;
  // A matrix quantized as several tensors (quantize_nf4 with part_rows): each part's first block,
  // its first absmax scale (its blocks are grouped in 256s from its first) and its mean. Empty:
  // one part, absmax_offset and groups from block 0.
  struct Part {
    std::int64_t first_block = 0, first_scale = 0;
    float offset = 0.0f;
  };
  std::vector<Part> parts;

  std::int64_t blocks() const { return static_cast<std::int64_t>(absmax_codes.size()); }
  // Block b's absmax as dequantization uses it: dynamic8_levels()[absmax_codes[b]] *
  // absmax_scales[b / 256] + absmax_offset (with parts: the scale of its group within its part,
  // and its part's offset).
  float absmax(std::int64_t block) const;
  // The bytes it takes in memory (codes, absmax codes and scales, the offset).
  std::int64_t storage_bytes() const;
};

// A matrix in int8 with one scale per row.
struct Int8Matrix {
  std::int64_t rows = 0, cols = 0;
  std::vector<std::int8_t> codes;  // rows * cols, row-major
  std::vector<float> scales;       // one per row: absmax / 127 (0 for a row of zeros)

  std::int64_t storage_bytes() const;
};

// Quantizes the row-major [rows, cols] matrix `values` (rows * cols of them). The bf16 overloads
// take raw bf16 bits (the high half of a float32) and quantize the float32 each stands for, so a
// bf16 checkpoint gives the same codes as its float32 widening. `what` names the tensor in errors.
Nf4Matrix quantize_nf4(std::span<const float> values, std::int64_t rows, std::int64_t cols,
                       const std::string& what = "tensor");
Nf4Matrix quantize_nf4_bf16(std::span<const std::uint16_t> values, std::int64_t rows, std::int64_t cols,
                            const std::string& what = "tensor");
// As bitsandbytes quantizes the rows [part_rows[i], part_rows[i + 1]) (part_rows[0] = 0, the last
// = rows) as tensors of their own: the same codes and blocks (each part must start on a block,
// part_rows[i] * cols a multiple of nf4_block_size: an InternalError otherwise), the double
// quantization's mean and groups of 256 absmaxes taken over each part.
Nf4Matrix quantize_nf4(std::span<const float> values, std::int64_t rows, std::int64_t cols, const std::string& what,
                       std::span<const std::int64_t> part_rows);
Nf4Matrix quantize_nf4_bf16(std::span<const std::uint16_t> values, std::int64_t rows, std::int64_t cols,
                            const std::string& what, std::span<const std::int64_t> part_rows);
Int8Matrix quantize_int8(std::span<const float> values, std::int64_t rows, std::int64_t cols,
                         const std::string& what = "tensor");
Int8Matrix quantize_int8_bf16(std::span<const std::uint16_t> values, std::int64_t rows, std::int64_t cols,
                              const std::string& what = "tensor");

// Writes rows [row0, row0 + nrows) x columns [col0, col0 + ncols) of the dequantized matrix to
// out, row r at out + (r - row0) * ld (ld >= ncols). The range must lie in the matrix (an
// InternalError otherwise: a caller's bug). Fastest where the runs of a row within one nf4 block
// are long (cols a multiple of 64, col0 even).
void dequantize(const Nf4Matrix& m, std::int64_t row0, std::int64_t nrows, std::int64_t col0, std::int64_t ncols,
                float* out, std::int64_t ld);
void dequantize(const Int8Matrix& m, std::int64_t row0, std::int64_t nrows, std::int64_t col0, std::int64_t ncols,
                float* out, std::int64_t ld);
// The whole matrix, row-major.
std::vector<float> dequantize(const Nf4Matrix& m);
std::vector<float> dequantize(const Int8Matrix& m);

// ---- A frozen weight in its storage format (lora.base_dtype, docs/fine-tuning.md)

// How a frozen weight is stored: float32 (the Parameter's own value), bf16 (the high half of each
// float32, rounded to nearest even), per-row int8, or nf4.
enum class StorageFormat : std::uint8_t { f32, bf16, int8, nf4 };
const char* storage_format_name(StorageFormat format);

// One frozen [rows, cols] matrix in bf16, int8 or nf4 (never f32: that is the Parameter's value).
// Immutable once made; shared by the Parameter that is stored this way (Parameter::stored()).
struct StoredMatrix {
  StorageFormat format = StorageFormat::bf16;
  std::int64_t rows = 0, cols = 0;
  std::vector<std::uint16_t> bf16;  // format bf16: rows * cols raw bf16 values, row-major
  Int8Matrix int8;                  // format int8
  Nf4Matrix nf4;                    // format nf4

  std::int64_t storage_bytes() const;
};

// `values` (row-major [rows, cols], float32 or raw bf16 bits) in `format` (not f32: InternalError).
StoredMatrix store(std::span<const float> values, std::int64_t rows, std::int64_t cols, StorageFormat format,
                   const std::string& what = "tensor");
StoredMatrix store_bf16(std::span<const std::uint16_t> values, std::int64_t rows, std::int64_t cols,
                        StorageFormat format, const std::string& what = "tensor");
// With the rows of the tensors a fused weight is made of (quantize_nf4's part_rows; only nf4
// takes statistics over a part, and only parts that start on a block: otherwise one part).
StoredMatrix store(std::span<const float> values, std::int64_t rows, std::int64_t cols, StorageFormat format,
                   const std::string& what, std::span<const std::int64_t> part_rows);
StoredMatrix store_bf16(std::span<const std::uint16_t> values, std::int64_t rows, std::int64_t cols,
                        StorageFormat format, const std::string& what, std::span<const std::int64_t> part_rows);
// dequantize() above for whichever format `m` holds (bf16 widens exactly).
void dequantize(const StoredMatrix& m, std::int64_t row0, std::int64_t nrows, std::int64_t col0, std::int64_t ncols,
                float* out, std::int64_t ld);
std::vector<float> dequantize(const StoredMatrix& m);

// The kernel set dequantize() uses on this CPU ("avx512" or "avx2"), and a switch for tests and
// benchmarks to force the AVX2 one (force_avx2(false) restores the automatic choice). Not to be
// flipped while another thread dequantizes.
const char* dequantize_kernels();
void force_avx2_kernels(bool on);

}  // namespace loom::quant
