// Tensor, Shape and Parameter: construction, views and copies.
#include <algorithm>
#include <cstring>

#include "loom/autograd.hpp"
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

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  for (int i = 0; i < shape.rank(); ++i)
    if (shape[i] < 0) fail("Tensor::empty: shape " + shape.str() + " has an unresolved extent");
  Tensor t;
  t.storage_ = detail::allocate_storage(static_cast<std::size_t>(shape.numel()) * dtype_size(dtype));
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  std::memset(t.raw_data(), 0, static_cast<std::size_t>(t.numel()) * dtype_size(dtype));
  return t;
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

void Tensor::throw_dtype_mismatch(DType requested) const {
  if (!defined()) fail("data<" + std::string(dtype_name(requested)) + ">() of an undefined tensor");
  fail("data<" + std::string(dtype_name(requested)) + ">() of a " + std::string(dtype_name(dtype_)) + " tensor " +
       shape_.str());
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
  Tensor t = empty(shape_, dtype_);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::detach() const {
  Tensor t = *this;
  t.param_ = nullptr;
  t.var_ = 0;
  return t;
}

void Tensor::copy_from(const Tensor& src) const {
  if (!defined() || !src.defined()) fail("copy_from with an undefined tensor");
  if (!(src.shape_ == shape_) || src.dtype_ != dtype_) fail("copy_from: " + src.str() + " into " + str());
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
  Tensor c = is_contiguous() ? *this : clone();
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
  Tensor c = is_contiguous() ? *this : clone();
  std::vector<std::int32_t> out(static_cast<std::size_t>(numel()));
  if (!out.empty()) std::memcpy(out.data(), c.raw_data(), out.size() * sizeof(std::int32_t));
  return out;
}

float Tensor::item() const {
  if (numel() != 1) fail("item() of " + str() + ": not a single element");
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
  return "Tensor(" + std::string(dtype_name(dtype_)) + ", " + shape_.str() + ")";
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
      !(buffer.shape() == value_.shape()))
    fail("parameter '" + name_ + "': gradient buffer " + buffer.str() + " does not match " + value_.str());
  Tensor old = grad();
  grad_ = buffer.detach();
  if (has_grad_ && old.defined()) grad_.copy_from(old);
}

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
