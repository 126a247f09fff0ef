// Tensor, Shape and Parameter: construction, views and copies.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "loom/autograd.hpp"
#include "loom/core/storage.hpp"
#include "loom/error.hpp"
#include "numerics/allocator_impl.hpp"
#include "numerics/strided.hpp"
#include "numerics/tape.hpp"

namespace loom {

namespace {

[[noreturn]] void fail(const std::string& message) {
  throw InternalError(message);
}

int normalise_dim(int dim, int rank, const char* what) {
  const int d = dim < 0 ? dim + rank : dim;
  if (d < 0 || d >= rank)
    fail(std::string(what) + ": dimension " + std::to_string(dim) + " is out of range for rank " +
         std::to_string(rank));
  return d;
}

}  // namespace

// ---- Device

Device::Device(std::string_view type, int index) : index_(index) {
  if (type.empty() || type.size() >= name_.size())
    fail("a device type name has 1 to " + std::to_string(name_.size() - 1) + " characters, not '" + std::string(type) +
         "'");
  if (index < 0) fail("device " + std::string(type) + ": negative index " + std::to_string(index));
  std::copy(type.begin(), type.end(), name_.begin());
  length_ = static_cast<std::uint8_t>(type.size());
}

std::string Device::str() const {
  if (is_host() && index_ == 0) return "host";
  return std::string(type()) + ":" + std::to_string(index_);
}

// ---- Shape

Shape::Shape(std::initializer_list<std::int64_t> dims)
    : Shape(std::span<const std::int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const std::int64_t> dims) {
  if (dims.size() > static_cast<std::size_t>(max_rank))
    fail("a tensor has at most " + std::to_string(max_rank) + " dimensions, not " + std::to_string(dims.size()));
  rank_ = static_cast<int>(dims.size());
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < -1) fail("negative extent " + std::to_string(dims[i]) + " in a shape");
    dims_[i] = dims[i];
  }
}

Shape Shape::with_back(std::int64_t last) const {
  Shape s = *this;
  if (s.rank_ == 0) s.rank_ = 1;
  s.dims_[static_cast<std::size_t>(s.rank_ - 1)] = last;
  return s;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string((*this)[i]);
  return s + "]";
}

Strides contiguous_strides(const Shape& shape) {
  Strides s{};
  std::int64_t stride = 1;
  for (int d = shape.rank() - 1; d >= 0; --d) {
    s[static_cast<std::size_t>(d)] = stride;
    stride *= shape[d];
  }
  return s;
}

// ---- Tensor

namespace {

void check_resolved(const Shape& shape) {
  for (int i = 0; i < shape.rank(); ++i)
    if (shape[i] < 0) fail("Tensor::empty: shape " + shape.str() + " has an unresolved extent");
}

}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  check_resolved(shape);
  Tensor t;
  t.storage_ = detail::allocate_storage(static_cast<std::size_t>(shape.numel()) * dtype_size(dtype));
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, BufferType& type) {
  check_resolved(shape);
  Tensor t;
  t.storage_ = type.allocate(static_cast<std::size_t>(shape.numel()) * dtype_size(dtype));
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, const Device& device) {
  return device.is_host() && device.index() == 0 ? empty(shape, dtype) : empty(shape, dtype, buffer_type_of(device));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  check_resolved(shape);
  Tensor t;
  t.storage_ = detail::allocate_storage(static_cast<std::size_t>(shape.numel()) * dtype_size(dtype), /*zeroed=*/true);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, const Device& device) {
  Tensor t = empty(shape, dtype, device);
  t.storage_->type->fill_zero(*t.storage_, 0, static_cast<std::size_t>(t.numel()) * dtype_size(dtype));
  return t;
}

Device Tensor::device() const {
  return storage_ ? storage_->type->device() : Device::host();
}

Tensor Tensor::full(const Shape& shape, float value) {
  Tensor t = empty(shape, DType::f32);
  std::fill_n(t.data<float>(), t.numel(), value);
  return t;
}

Tensor Tensor::from(std::span<const float> values, const Shape& shape) {
  if (static_cast<std::int64_t>(values.size()) != shape.numel())
    fail("Tensor::from: " + std::to_string(values.size()) + " values for shape " + shape.str());
  Tensor t = empty(shape, DType::f32);
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(float));
  return t;
}

Tensor Tensor::from(std::span<const std::int32_t> values, const Shape& shape) {
  if (static_cast<std::int64_t>(values.size()) != shape.numel())
    fail("Tensor::from: " + std::to_string(values.size()) + " values for shape " + shape.str());
  Tensor t = empty(shape, DType::i32);
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size() * sizeof(std::int32_t));
  return t;
}

bool Tensor::is_contiguous() const {
  std::int64_t expected = 1;
  for (int d = rank() - 1; d >= 0; --d) {
    if (shape_[d] == 1) continue;
    if (strides_[static_cast<std::size_t>(d)] != expected) return false;
    expected *= shape_[d];
  }
  return true;
}

bool Tensor::is_row_strided(std::int64_t* ld) const {
  const int r = rank();
  if (r == 0) {
    if (ld) *ld = 1;
    return true;
  }
  if (shape_.back() != 1 && strides_[static_cast<std::size_t>(r - 1)] != 1) return false;
  // The leading dimensions must collapse into one with a single stride.
  std::int64_t row_stride = -1, expected = -1;
  for (int d = r - 2; d >= 0; --d) {
    if (shape_[d] == 1) continue;
    const std::int64_t s = strides_[static_cast<std::size_t>(d)];
    if (row_stride < 0) {
      row_stride = s;
      expected = s * shape_[d];
    } else {
      if (s != expected) return false;
      expected *= shape_[d];
    }
  }
  if (row_stride < 0) row_stride = std::max<std::int64_t>(1, shape_.back());
  if (row_stride < shape_.back() && shape_.rows() > 1) return false;
  if (ld) *ld = row_stride;
  return true;
}

void Tensor::throw_bad_access(DType requested) const {
  const std::string what = "data<" + std::string(dtype_name(requested)) + ">()";
  if (!defined()) fail(what + " of an undefined tensor");
  if (requested != dtype_) fail(what + " of a " + std::string(dtype_name(dtype_)) + " tensor " + shape_.str());
  fail(what + " of " + str() + ": its memory is on " + device().str() +
       ", which host code cannot read or write; copy it with to(Device::host()), or hand device_data() to the "
       "backend that owns it");
}

Tensor Tensor::view(const Shape& shape) const {
  if (!defined()) fail("view of an undefined tensor");
  if (!is_contiguous())
    fail("view " + shape.str() + " of a non-contiguous tensor " + shape_.str() + "; use contiguous()");
  Shape resolved = shape;
  int infer = -1;
  std::int64_t known = 1;
  for (int i = 0; i < shape.rank(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) fail("view " + shape.str() + ": more than one extent is -1");
      infer = i;
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel() % known != 0) fail("view " + shape.str() + " does not fit " + shape_.str());
    resolved[infer] = numel() / known;
  }
  if (resolved.numel() != numel()) fail("view " + shape.str() + " has a different size than " + shape_.str());
  Tensor t = *this;
  t.shape_ = resolved;
  t.strides_ = contiguous_strides(resolved);
  return t;
}

Tensor Tensor::slice(int dim, std::int64_t begin, std::int64_t end) const {
  if (!defined()) fail("slice of an undefined tensor");
  const int d = normalise_dim(dim, rank(), "slice");
  if (begin < 0 || end < begin || end > shape_[d])
    fail("slice [" + std::to_string(begin) + ", " + std::to_string(end) + ") of dimension " + std::to_string(d) +
         " of " + shape_.str());
  Tensor t = *this;
  t.offset_ += begin * strides_[static_cast<std::size_t>(d)];
  t.shape_[d] = end - begin;
  return t;
}

Tensor Tensor::select(int dim, std::int64_t index) const {
  if (!defined()) fail("select of an undefined tensor");
  const int d = normalise_dim(dim, rank(), "select");
  if (index < 0 || index >= shape_[d])
    fail("select index " + std::to_string(index) + " of dimension " + std::to_string(d) + " of " + shape_.str());
  Tensor t = *this;
  t.offset_ += index * strides_[static_cast<std::size_t>(d)];
  std::array<std::int64_t, max_rank> dims{};
  Strides strides{};
  int k = 0;
  for (int i = 0; i < rank(); ++i) {
    if (i == d) continue;
    dims[static_cast<std::size_t>(k)] = shape_[i];
    strides[static_cast<std::size_t>(k)] = strides_[static_cast<std::size_t>(i)];
    ++k;
  }
  t.shape_ = Shape(std::span<const std::int64_t>(dims.data(), static_cast<std::size_t>(k)));
  t.strides_ = strides;
  return t;
}

Tensor Tensor::clone() const {
  if (!defined()) return {};
  Tensor t = storage_->host_visible && storage_->type == &host_buffer_type() ? empty(shape_, dtype_)
                                                                             : empty(shape_, dtype_, *storage_->type);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(const Device& device) const {
  if (!defined()) return {};
  if (this->device() == device) return *this;
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::detach() const {
  Tensor t = *this;
  t.param_ = nullptr;
  t.var_ = 0;
  return t;
}

namespace {

// Elements [first, last] of storage that a tensor's elements lie in (strides are never
// negative), as a byte range.
struct Span {
  std::size_t offset, bytes;
};
Span span_of(const Tensor& t) {
  std::int64_t last = t.offset();
  for (int d = 0; d < t.rank(); ++d) last += (t.size(d) - 1) * t.stride(d);
  const std::size_t es = dtype_size(t.dtype());
  return {static_cast<std::size_t>(t.offset()) * es, static_cast<std::size_t>(last - t.offset() + 1) * es};
}

// A host-visible tensor with `t`'s geometry over a host copy of t's span (read from its device
// when `read`, else left undefined), and the span.
std::pair<Tensor, Span> host_stage(const Tensor& t, bool read) {
  const Span span = span_of(t);
  const std::size_t es = dtype_size(t.dtype());
  Tensor staged = Tensor::empty(Shape{static_cast<std::int64_t>(span.bytes / es)}, t.dtype());
  if (read) t.buffer_type().copy_to_host(staged.raw_data(), *detail::TensorAccess::storage(t), span.offset, span.bytes);
  Tensor view = detail::TensorAccess::view_of(staged, 0, t.shape(), t.strides());
  return {view, span};
}

}  // namespace

namespace {

std::atomic<std::uint64_t> host_device_copy_count{0};
std::atomic<std::uint64_t> host_device_copy_bytes{0};

}  // namespace

HostDeviceCopies host_device_copies() {
  return {host_device_copy_count.load(std::memory_order_relaxed),
          host_device_copy_bytes.load(std::memory_order_relaxed)};
}

HostDeviceCopies reset_host_device_copies() {
  return {host_device_copy_count.exchange(0, std::memory_order_relaxed),
          host_device_copy_bytes.exchange(0, std::memory_order_relaxed)};
}

void Tensor::copy_from(const Tensor& src) const {
  if (!defined() || !src.defined()) fail("copy_from with an undefined tensor");
  if (!(src.shape_ == shape_) || src.dtype_ != dtype_) fail("copy_from: " + src.str() + " into " + str());
  if (!storage_->host_visible || !src.storage_->host_visible) {
    // At least one side is device memory: whole contiguous ranges go through the buffer types'
    // copy functions in one call; anything strided is staged through host memory (one read of
    // the source's span, and one read and one write of the destination's).
    if (numel() == 0) return;
    const std::size_t es = dtype_size(dtype_);
    const std::size_t bytes = static_cast<std::size_t>(numel()) * es;
    // Counted once here, at the top: the staged paths below recurse only between host memories.
    if (storage_->host_visible || src.storage_->host_visible || storage_->type != src.storage_->type) {
      host_device_copy_count.fetch_add(1, std::memory_order_relaxed);
      host_device_copy_bytes.fetch_add(bytes, std::memory_order_relaxed);
    }
    const std::size_t dst_offset = static_cast<std::size_t>(offset_) * es;
    const std::size_t src_offset = static_cast<std::size_t>(src.offset_) * es;
    if (is_contiguous() && src.is_contiguous()) {
      if (storage_->host_visible) {
        src.storage_->type->copy_to_host(address(), *src.storage_, src_offset, bytes);
        return;
      }
      if (src.storage_->host_visible) {
        storage_->type->copy_from_host(*storage_, dst_offset, src.address(), bytes);
        return;
      }
      if (storage_->type == src.storage_->type) {
        storage_->type->copy(*storage_, dst_offset, *src.storage_, src_offset, bytes);
        return;
      }
    }
    const Tensor host_src = src.storage_->host_visible ? src : host_stage(src, true).first;
    if (storage_->host_visible) {
      copy_from(host_src);
      return;
    }
    auto [host_dst, span] = host_stage(*this, !is_contiguous());
    host_dst.copy_from(host_src);
    storage_->type->copy_from_host(*storage_, span.offset, host_dst.raw_data(), span.bytes);
    return;
  }
  const std::size_t es = dtype_size(dtype_);
  if (is_contiguous() && src.is_contiguous()) {
    std::memmove(raw_data(), src.raw_data(), static_cast<std::size_t>(numel()) * es);
    return;
  }
  auto* dst_base = static_cast<std::byte*>(raw_data());
  const auto* src_base = static_cast<const std::byte*>(src.raw_data());
  const auto e = static_cast<std::int64_t>(es);
  const std::int64_t ds = rank() ? strides_[static_cast<std::size_t>(rank() - 1)] : 1;
  const std::int64_t ss = rank() ? src.strides_[static_cast<std::size_t>(rank() - 1)] : 1;
  detail::for_each_row_pair(shape_, strides_, src.strides_, [&](std::int64_t off, std::int64_t soff, std::int64_t len) {
    if (ds == 1 && ss == 1) {
      std::memmove(dst_base + off * e, src_base + soff * e, static_cast<std::size_t>(len) * es);
    } else {
      for (std::int64_t i = 0; i < len; ++i)
        std::memcpy(dst_base + (off + i * ds) * e, src_base + (soff + i * ss) * e, es);
    }
  });
}

std::vector<float> Tensor::to_vector() const {
  if (!defined()) return {};
  const Tensor c = !is_host_visible() ? to(Device::host()) : is_contiguous() ? *this : clone();
  std::vector<float> out(static_cast<std::size_t>(numel()));
  if (dtype_ == DType::f32) {
    std::memcpy(out.data(), c.raw_data(), out.size() * sizeof(float));
  } else if (dtype_ == DType::bf16) {
    const auto* p = static_cast<const bfloat16*>(c.raw_data());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = to_float(p[i]);
  } else {
    const auto* p = static_cast<const std::int32_t*>(c.raw_data());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(p[i]);
  }
  return out;
}

std::vector<std::int32_t> Tensor::to_int_vector() const {
  if (!defined()) return {};
  if (dtype_ != DType::i32) fail("to_int_vector of a " + std::string(dtype_name(dtype_)) + " tensor");
  const Tensor c = !is_host_visible() ? to(Device::host()) : is_contiguous() ? *this : clone();
  std::vector<std::int32_t> out(static_cast<std::size_t>(numel()));
  if (!out.empty()) std::memcpy(out.data(), c.raw_data(), out.size() * sizeof(std::int32_t));
  return out;
}

float Tensor::item() const {
  if (numel() != 1) fail("item() of " + str() + ": not a single element");
  if (!is_host_visible()) return to(Device::host()).item();
  switch (dtype_) {
    case DType::f32:
      return *static_cast<const float*>(raw_data());
    case DType::bf16:
      return to_float(*static_cast<const bfloat16*>(raw_data()));
    case DType::i32:
      break;
  }
  return static_cast<float>(*static_cast<const std::int32_t*>(raw_data()));
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  const Device d = device();
  return "Tensor(" + std::string(dtype_name(dtype_)) + ", " + shape_.str() + (d.is_host() ? "" : ", " + d.str()) + ")";
}

// ---- Parameter

Parameter::Parameter(std::string name, Tensor value) : name_(std::move(name)), value_(std::move(value)) {
  if (!value_.defined()) fail("parameter '" + name_ + "': undefined value");
  if (value_.dtype() != DType::f32 || !value_.is_contiguous())
    fail("parameter '" + name_ + "': the value must be a contiguous f32 tensor, not " + value_.str());
  value_ = value_.detach();
  value_.param_ = this;
}

Parameter::~Parameter() = default;

void Parameter::set_grad_buffer(Tensor buffer) {
  if (!buffer.defined() || buffer.dtype() != DType::f32 || !buffer.is_contiguous() ||
      !(buffer.shape() == value_.shape()) || !(buffer.device() == value_.device()))
    fail("parameter '" + name_ + "': gradient buffer " + buffer.str() + " does not match " + value_.str());
  Tensor old = grad();
  grad_ = buffer.detach();
  if (has_grad_ && old.defined()) grad_.copy_from(old);
}

void Parameter::set_stored(std::shared_ptr<const quant::StoredMatrix> stored) {
  if (!stored) fail("parameter '" + name_ + "': set_stored(null)");
  if (value_.rank() != 2 || value_.size(0) != stored->rows || value_.size(1) != stored->cols ||
      !value_.is_host_visible())
    fail("parameter '" + name_ + "': a stored [" + std::to_string(stored->rows) + ", " + std::to_string(stored->cols) +
         "] matrix for the value " + value_.str());
  stored_ = std::move(stored);
  requires_grad_ = false;
  has_grad_ = false;
  grad_.reset();
  // Only the pages wholly inside the value: its neighbours in a model's flat buffer keep theirs.
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(value_.raw_data());
  const std::uintptr_t first = (begin + page - 1) / page * page;
  const std::uintptr_t last = (begin + static_cast<std::uintptr_t>(value_.numel()) * sizeof(float)) / page * page;
  if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

namespace core {
void rebind_parameter(Parameter& p, const Tensor& value) {
  const Tensor& old = detail::TensorAccess::param_value(p);
  if (!value.defined() || value.dtype() != DType::f32 || !value.is_contiguous() || !(value.shape() == old.shape()) ||
      &value.buffer_type() != &old.buffer_type())
    throw InternalError("rebind_parameter '" + p.name() + "': " + (value.defined() ? value.str() : "undefined") +
                        " does not match " + old.str());
  Tensor v = value.detach();
  detail::TensorAccess::set_param(v, &p);
  detail::TensorAccess::param_value_mut(p) = std::move(v);
}
}  // namespace core

namespace detail {

Tensor TensorAccess::view_of(const Tensor& like, std::int64_t offset, const Shape& shape, const Strides& strides) {
  Tensor t = like.detach();
  t.offset_ = offset;
  t.shape_ = shape;
  t.strides_ = strides;
  return t;
}

}  // namespace detail

}  // namespace loom
