// loom::Tensor: a dense, row-major, strided view of memory on one device.
//
// A Tensor is a small value type (no heap allocation of its own): a counted reference to a
// storage block, an element offset into it, a shape, strides in elements, a dtype, and the
// autograd identity that lets the tape route gradients (see autograd.hpp). Copying a Tensor
// copies the reference, never the data; views (view, slice, select) share the storage too.
//
// Memory comes from a buffer type (device.hpp). By default that is the host: the core's caching
// allocator (allocator.hpp), where a buffer released by the last Tensor referring to it goes
// back to a size-class cache and the next request of that class is served from the cache, so a
// training step that repeats the shapes of the previous one allocates nothing from the system.
// A tensor on another device (Tensor::empty(shape, dtype, device), Tensor::to) lives in that
// device's memory: host code cannot read it through data<T>() (which throws) and moves it only
// through explicit copies (to, copy_from, to_vector, item).
//
// Constness is shallow, like std::span: a const Tensor& still gives a mutable data pointer;
// const means "this handle is not re-pointed". Tensors may be passed between threads; writing
// the same elements from two threads at once is a race, as for any memory.
//
// Views and autograd: a view keeps the autograd identity of the tensor it was taken from, so
// `qkv.view({B, T, 3 * H, D}).slice(2, 0, H)` can be fed to an operation and its gradient lands
// in the right part of qkv's gradient, with no operation recorded for the view itself.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/device.hpp"

namespace loom {

enum class DType : std::uint8_t {
  f32,   // IEEE binary32: every operation today
  bf16,  // bfloat16 storage (the upper half of a float32); reserved for mixed precision
  i32,   // token ids, targets, positions, segment ids
};

constexpr std::size_t dtype_size(DType t) {
  return t == DType::bf16 ? 2 : 4;
}
constexpr std::string_view dtype_name(DType t) {
  return t == DType::f32 ? "f32" : t == DType::bf16 ? "bf16" : "i32";
}

// bfloat16 as stored: the top 16 bits of a float32.
struct bfloat16 {
  std::uint16_t bits = 0;
};
inline float to_float(bfloat16 v) {
  const std::uint32_t u = std::uint32_t{v.bits} << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
// Round to nearest even; NaN stays NaN.
inline bfloat16 to_bfloat16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<std::uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {static_cast<std::uint16_t>(u >> 16)};
}

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<bfloat16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::i32;
}

inline constexpr int max_rank = 6;

// Up to max_rank extents. Rank 0 is a scalar (one element).
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims);
  explicit Shape(std::span<const std::int64_t> dims);

  int rank() const { return rank_; }
  std::int64_t operator[](int i) const { return dims_[static_cast<std::size_t>(i)]; }
  std::int64_t& operator[](int i) { return dims_[static_cast<std::size_t>(i)]; }
  // Python-style: back() is the last extent; at(-2) the one before it.
  std::int64_t back() const { return dims_[static_cast<std::size_t>(rank_ - 1)]; }
  std::int64_t at(int i) const { return (*this)[i < 0 ? rank_ + i : i]; }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<std::size_t>(i)];
    return n;
  }
  const std::int64_t* begin() const { return dims_.data(); }
  const std::int64_t* end() const { return dims_.data() + rank_; }
  // The shape with the last extent replaced (rank unchanged; rank 0 becomes rank 1).
  Shape with_back(std::int64_t last) const;
  // The product of every extent but the last: the row count of the shape seen as a matrix.
  std::int64_t rows() const { return rank_ == 0 ? 1 : numel() / (back() == 0 ? 1 : back()); }

  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.rank_ != b.rank_) return false;
    for (int i = 0; i < a.rank_; ++i)
      if (a[i] != b[i]) return false;
    return true;
  }
  // "[4, 256, 768]"
  std::string str() const;

 private:
  std::array<std::int64_t, max_rank> dims_{};
  int rank_ = 0;
};

using Strides = std::array<std::int64_t, max_rank>;

class Parameter;
class Tensor;

namespace detail {

// Returns a block whose last reference was dropped to its buffer type.
inline void release_storage(Storage* storage) noexcept {
  storage->type->release(storage);
}

// Core-internal access to a tensor's autograd identity (defined in the core; not for plugins).
struct TensorAccess;

}  // namespace detail

class Tensor {
 public:
  // An undefined tensor: no storage. Operations take one where an input is optional (a bias).
  Tensor() = default;
  Tensor(const Tensor& other) noexcept;
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(const Tensor& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;
  ~Tensor() { reset(); }

  // New contiguous tensors, on the host unless a device (or its buffer type) is given. `empty`
  // leaves the contents undefined.
  static Tensor empty(const Shape& shape, DType dtype = DType::f32);
  static Tensor empty(const Shape& shape, DType dtype, BufferType& type);
  static Tensor empty(const Shape& shape, DType dtype, const Device& device);
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32);
  static Tensor zeros(const Shape& shape, DType dtype, const Device& device);
  static Tensor full(const Shape& shape, float value);
  static Tensor scalar(float value) { return full(Shape{}, value); }
  // A contiguous copy of `values` (values.size() must equal shape.numel()).
  static Tensor from(std::span<const float> values, const Shape& shape);
  static Tensor from(std::span<const std::int32_t> values, const Shape& shape);

  bool defined() const { return storage_ != nullptr; }
  void reset() noexcept;

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return shape_.rank(); }
  // Extent of dimension `dim`; negative counts from the end.
  std::int64_t size(int dim) const { return shape_.at(dim); }
  std::int64_t numel() const { return shape_.numel(); }
  const Strides& strides() const { return strides_; }
  std::int64_t stride(int dim) const { return strides_[static_cast<std::size_t>(dim < 0 ? rank() + dim : dim)]; }
  // Offset of element [0, ...] from the start of the storage, in elements.
  std::int64_t offset() const { return offset_; }
  bool is_contiguous() const;
  // True when the tensor, seen as a matrix of shape.rows() x shape.back(), has unit stride
  // along rows and one stride between consecutive rows: the layout BLAS calls `lda`. `*ld`
  // receives that stride. Contiguous tensors are row-strided with ld == back().
  bool is_row_strided(std::int64_t* ld = nullptr) const;

  // ---- Device.
  // Where the memory is (the host for an undefined tensor).
  Device device() const;
  // The buffer type that allocated the storage (the host's for an undefined tensor).
  BufferType& buffer_type() const { return storage_ ? *storage_->type : host_buffer_type(); }
  // Whether host code may read and write the elements through data<T>().
  bool is_host_visible() const { return !storage_ || storage_->host_visible; }

  // The data at element [0, ...], for host code. Throws InternalError when T does not match the
  // dtype, or when the memory is not host-visible (copy it with to(Device::host()) first).
  template <class T>
  T* data() const {
    if (dtype_of<T>() != dtype_ || !is_host_visible()) throw_bad_access(dtype_of<T>());
    return reinterpret_cast<T*>(address());
  }
  void* raw_data() const {
    if (!is_host_visible()) throw_bad_access(dtype_);
    return address();
  }
  // The address of element [0, ...] in the tensor's own memory, unchecked: a host pointer for
  // host-visible memory, otherwise a device address to hand to the backend that owns the
  // buffer type, never to dereference on the host. Throws InternalError when T does not match
  // the dtype.
  template <class T>
  T* device_data() const {
    if (dtype_of<T>() != dtype_) throw_bad_access(dtype_of<T>());
    return reinterpret_cast<T*>(address());
  }

  // ---- Views: share the storage and keep the autograd identity.
  // A contiguous tensor with a new shape of equal numel; one extent may be -1 (inferred).
  // Throws InternalError for a non-contiguous tensor (use Ops::contiguous first).
  Tensor view(const Shape& shape) const;
  // Elements [begin, end) of dimension `dim` (negative dims count from the end).
  Tensor slice(int dim, std::int64_t begin, std::int64_t end) const;
  // Index `index` of dimension `dim`; the dimension is removed.
  Tensor select(int dim, std::int64_t index) const;

  // ---- Copies and conversions. Copies between devices go through the buffer types' copy
  // functions; none of them is recorded on a tape.
  // A contiguous copy of the data on the same device, with no autograd identity.
  Tensor clone() const;
  // This tensor when it is on `device` already; else a contiguous copy there, with no autograd
  // identity. The device's buffer type must be registered (device.hpp).
  Tensor to(const Device& device) const;
  // The same storage and geometry, with no autograd identity (gradients stop here).
  Tensor detach() const;
  // Copies `src`'s elements (same shape and dtype, any strides, any device) into this tensor's
  // elements.
  void copy_from(const Tensor& src) const;
  // The elements in row-major order (f32 and bf16 read as float, i32 as int32), copied to the
  // host from any device.
  std::vector<float> to_vector() const;
  std::vector<std::int32_t> to_int_vector() const;
  // The value of a one-element tensor, copied to the host from any device.
  float item() const;

  // ---- Autograd identity.
  // True for a parameter (or a view of one) and for outputs of operations recorded on a tape.
  bool requires_grad() const { return param_ != nullptr || var_ != 0; }
  // The parameter this tensor is (a view of), or nullptr.
  Parameter* parameter() const { return param_; }

  // Storage identity, for tests and for operations that may reuse a buffer in place.
  bool shares_storage_with(const Tensor& other) const { return storage_ && storage_ == other.storage_; }
  std::int64_t storage_use_count() const { return storage_ ? storage_->refs.load(std::memory_order_relaxed) : 0; }
  std::size_t storage_bytes() const { return storage_ ? storage_->bytes : 0; }

  // "Tensor(f32, [2, 3])"
  std::string str() const;

 private:
  friend struct detail::TensorAccess;
  friend class Parameter;
  [[noreturn]] void throw_bad_access(DType requested) const;
  void* address() const {
    return storage_ ? storage_->data + static_cast<std::size_t>(offset_) * dtype_size(dtype_) : nullptr;
  }

  Storage* storage_ = nullptr;
  std::int64_t offset_ = 0;
  Shape shape_;
  Strides strides_{};
  DType dtype_ = DType::f32;
  Parameter* param_ = nullptr;  // set on the parameter's own tensor and on views of it
  std::uint64_t var_ = 0;       // (tape epoch << 32) | variable index; 0 when not recorded
};

// Row-major strides of a contiguous tensor of `shape`.
Strides contiguous_strides(const Shape& shape);

inline Tensor::Tensor(const Tensor& o) noexcept
    : storage_(o.storage_),
      offset_(o.offset_),
      shape_(o.shape_),
      strides_(o.strides_),
      dtype_(o.dtype_),
      param_(o.param_),
      var_(o.var_) {
  if (storage_) storage_->refs.fetch_add(1, std::memory_order_relaxed);
}
inline Tensor::Tensor(Tensor&& o) noexcept
    : storage_(o.storage_),
      offset_(o.offset_),
      shape_(o.shape_),
      strides_(o.strides_),
      dtype_(o.dtype_),
      param_(o.param_),
      var_(o.var_) {
  o.storage_ = nullptr;
  o.param_ = nullptr;
  o.var_ = 0;
}
inline Tensor& Tensor::operator=(const Tensor& o) noexcept {
  if (this != &o) {
    if (o.storage_) o.storage_->refs.fetch_add(1, std::memory_order_relaxed);
    reset();
    storage_ = o.storage_;
    offset_ = o.offset_;
    shape_ = o.shape_;
    strides_ = o.strides_;
    dtype_ = o.dtype_;
    param_ = o.param_;
    var_ = o.var_;
  }
  return *this;
}
inline Tensor& Tensor::operator=(Tensor&& o) noexcept {
  if (this != &o) {
    reset();
    storage_ = o.storage_;
    offset_ = o.offset_;
    shape_ = o.shape_;
    strides_ = o.strides_;
    dtype_ = o.dtype_;
    param_ = o.param_;
    var_ = o.var_;
    o.storage_ = nullptr;
    o.param_ = nullptr;
    o.var_ = 0;
  }
  return *this;
}
inline void Tensor::reset() noexcept {
  if (storage_ && storage_->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) detail::release_storage(storage_);
  storage_ = nullptr;
  param_ = nullptr;
  var_ = 0;
}

}  // namespace loom
