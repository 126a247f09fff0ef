// safetensors: loom's file format for weights (and the tensors of checkpoints).
//
// The format is the field's convention (Hugging Face's safetensors), so files loom writes open in
// PyTorch, JAX or `safetensors` tools, and theirs open here:
//
//   bytes [0, 8)        N, the header's length: an unsigned 64-bit little-endian integer
//   bytes [8, 8 + N)    the header: a UTF-8 JSON object (loom pads it with spaces to a multiple
//                       of 8 bytes, so that the data that follows is 8-byte aligned)
//   bytes [8 + N, end)  the data: every tensor's bytes, little-endian, row-major, back to back
//
// The header maps each tensor name to {"dtype": "F32" | "BF16" | "F16" | "I32", "shape": [d0, d1,
// ...], "data_offsets": [begin, end]} (byte offsets into the data section), and may hold one
// "__metadata__" object of string values. loom writes "format": "pt" there (Hugging Face's
// from_pretrained refuses a file without it) beside its own keys (the model's config). loom has
// no f16 tensors: F16 data is read widened to f32, exactly, as BF16 data can be. The reader
// accepts exactly what the specification allows: offsets in range, tensors whose byte count
// matches dtype and shape, data covered with no gap and no overlap; anything else is a UserError
// naming the file (and the tensor).
//
// Writes are atomic: a file is written to a temporary name in the same directory, flushed to
// disk and renamed over the target, so a reader (or a crash) never sees half a file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loom/kinds/model.hpp"
#include "loom/tensor.hpp"

namespace loom::safetensors {

// "F32", "BF16", "I32": the safetensors name of a dtype (loom writes no F16).
std::string_view dtype_code(DType dtype);

// One tensor's entry in a file's header.
struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;          // what read() returns: the stored dtype, f32 for F16 data
  std::string stored_dtype = "F32";  // the file's code: "F32", "BF16", "F16" or "I32"
  Shape shape;
  std::uint64_t begin = 0;  // byte offsets into the data section
  std::uint64_t end = 0;
};

// A safetensors file opened for reading: the header is parsed and validated on open, and the
// file is memory-mapped, so reading one tensor touches only its bytes. Movable, not copyable.
// Reads may come from any thread.
class Reader {
 public:
  // Throws UserError when the file cannot be read or is not a valid safetensors file.
  explicit Reader(const std::filesystem::path& path);
  ~Reader();
  Reader(Reader&&) noexcept;
  Reader& operator=(Reader&&) noexcept;
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Every tensor, in the order of their data offsets.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  bool contains(const std::string& name) const;
  // Throws UserError naming the file when there is no tensor `name`.
  const TensorInfo& info(const std::string& name) const;

  // A new contiguous tensor with the stored shape and values, of dtype info(name).dtype.
  Tensor read(const std::string& name) const;
  // Copies tensor `name` into `destination` (any strides), which must have the stored shape. An
  // f32 destination accepts F32, BF16 and F16 data (widened exactly); i32 and bf16 ones need
  // their own dtype. Throws UserError naming the file and tensor on a mismatch.
  void read_into(const std::string& name, const Tensor& destination) const;
  // Elements [begin, end) of tensor `name`'s flat (row-major) values, as a new 1-D tensor of
  // dtype info(name).dtype: a part of a large tensor without reading the rest (a sharded
  // checkpoint's reader). Throws UserError naming the file and tensor for a range outside it.
  Tensor read_elements(const std::string& name, std::int64_t begin, std::int64_t end) const;
  // The same into `destination`, a contiguous host tensor of end - begin elements (f32 for F32,
  // BF16 and F16 data; else the stored dtype).
  void read_elements_into(const std::string& name, std::int64_t begin, std::int64_t end,
                          const Tensor& destination) const;
  // Gives back the mapped pages that lie wholly inside tensor `name`'s bytes (they stay in the
  // page cache, out of the process's resident memory): a reader of a model larger than memory
  // calls it once a tensor is read. A later read maps them again.
  void release(const std::string& name) const;

 private:
  struct Mapping;
  std::filesystem::path path_;
  std::unique_ptr<Mapping> mapping_;
  std::map<std::string, std::string> metadata_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> index_;
};

// Writes `tensors` (names unique, non-empty and not "__metadata__"; any dtype, any strides) and
// `metadata` to `path`, atomically, with "format": "pt" added to the metadata unless it sets
// "format" itself. F32 and I32 tensors come first, then BF16 ones, so that every tensor's data
// is aligned to its element size. Throws UserError when the file cannot be written.
void save(const std::filesystem::path& path, std::span<const std::pair<std::string, Tensor>> tensors,
          const std::map<std::string, std::string>& metadata = {});

// A model's parameters by name (ModelParameter::parameter->name()): writes every value.
void save_parameters(const std::filesystem::path& path, std::span<const ModelParameter> parameters,
                     const std::map<std::string, std::string>& metadata = {});
// Reads every parameter's value from `path` by name. The file must hold exactly the parameters'
// names with their shapes (F32, or BF16 or F16 widened to f32): a missing, extra or mis-shaped tensor is
// a UserError that lists the offending names. Nothing is modified unless every check passes.
// Returns the file's metadata.
std::map<std::string, std::string> load_parameters(const std::filesystem::path& path,
                                                   std::span<const ModelParameter> parameters);

}  // namespace loom::safetensors
