#include <gtest/gtest.h>

#include <cmath>
#include <loom/autograd.hpp>
#include <loom/error.hpp>
#include <numeric>

namespace loom {
namespace {

Tensor iota(const Shape& s) {
  std::vector<float> v(static_cast<std::size_t>(s.numel()));
  std::iota(v.begin(), v.end(), 0.0f);
  return Tensor::from(std::span<const float>(v), s);
}

TEST(Shape, BasicsAndFormatting) {
  const Shape s{4, 3, 2};
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s.back(), 2);
  EXPECT_EQ(s.at(-2), 3);
  EXPECT_EQ(s.rows(), 12);
  EXPECT_EQ(s.str(), "[4, 3, 2]");
  EXPECT_EQ(s.with_back(7), (Shape{4, 3, 7}));
  EXPECT_EQ(Shape{}.numel(), 1);
  EXPECT_EQ(Shape{}.str(), "[]");
  EXPECT_THROW(Shape({1, 2, 3, 4, 5, 6, 7}), InternalError);
}

TEST(Tensor, FactoriesAndAccess) {
  const Tensor z = Tensor::zeros({2, 3});
  EXPECT_EQ(z.to_vector(), std::vector<float>(6, 0.0f));
  EXPECT_TRUE(z.is_contiguous());
  EXPECT_EQ(z.strides()[0], 3);
  const Tensor f = Tensor::full({2}, 1.5f);
  EXPECT_EQ(f.to_vector(), (std::vector<float>{1.5f, 1.5f}));
  EXPECT_EQ(Tensor::scalar(3.0f).item(), 3.0f);
  const Tensor ids = Tensor::from(std::span<const std::int32_t>(std::vector<std::int32_t>{3, 1}), Shape{2});
  EXPECT_EQ(ids.dtype(), DType::i32);
  EXPECT_EQ(ids.to_int_vector(), (std::vector<std::int32_t>{3, 1}));
  EXPECT_THROW(ids.data<float>(), InternalError);
  EXPECT_THROW(Tensor::from(std::span<const float>(std::vector<float>{1.0f}), Shape{2}), InternalError);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(z.raw_data()) % 64, 0u);
  EXPECT_FALSE(Tensor().defined());
  EXPECT_EQ(z.str(), "Tensor(f32, [2, 3])");
}

TEST(Tensor, CopiesShareStorageAndCountReferences) {
  Tensor a = Tensor::zeros({4});
  EXPECT_EQ(a.storage_use_count(), 1);
  {
    Tensor b = a;
    EXPECT_TRUE(b.shares_storage_with(a));
    EXPECT_EQ(a.storage_use_count(), 2);
    b.data<float>()[1] = 5.0f;
  }
  EXPECT_EQ(a.storage_use_count(), 1);
  EXPECT_EQ(a.to_vector()[1], 5.0f);
  Tensor c = std::move(a);
  EXPECT_FALSE(a.defined());  // NOLINT(bugprone-use-after-move): moved-from is undefined
  EXPECT_EQ(c.storage_use_count(), 1);
}

TEST(Tensor, ViewReshapesContiguousTensors) {
  const Tensor t = iota({2, 3, 4});
  const Tensor v = t.view({6, -1});
  EXPECT_EQ(v.shape(), (Shape{6, 4}));
  EXPECT_TRUE(v.shares_storage_with(t));
  EXPECT_EQ(v.to_vector(), t.to_vector());
  EXPECT_THROW(t.view({5, -1}), InternalError);
  EXPECT_THROW(t.view({-1, -1}), InternalError);
  EXPECT_THROW(t.slice(2, 0, 2).view({12}), InternalError);
}

TEST(Tensor, SliceAndSelectAreStridedViews) {
  const Tensor t = iota({3, 4});
  const Tensor cols = t.slice(1, 1, 3);
  EXPECT_EQ(cols.shape(), (Shape{3, 2}));
  EXPECT_FALSE(cols.is_contiguous());
  std::int64_t ld = 0;
  EXPECT_TRUE(cols.is_row_strided(&ld));
  EXPECT_EQ(ld, 4);
  EXPECT_EQ(cols.to_vector(), (std::vector<float>{1, 2, 5, 6, 9, 10}));
  const Tensor row = t.select(0, 2);
  EXPECT_EQ(row.shape(), (Shape{4}));
  EXPECT_EQ(row.to_vector(), (std::vector<float>{8, 9, 10, 11}));
  const Tensor column = t.select(1, 3);
  EXPECT_EQ(column.to_vector(), (std::vector<float>{3, 7, 11}));
  EXPECT_FALSE(column.is_row_strided());  // stride 4 between elements
  EXPECT_THROW(t.slice(1, 3, 5), InternalError);
  EXPECT_THROW(t.select(2, 0), InternalError);
  // Rows of a 3-d slice collapse only when the leading strides are consistent.
  const Tensor x = iota({2, 3, 5});
  EXPECT_TRUE(x.slice(2, 1, 4).is_row_strided(&ld));
  EXPECT_EQ(ld, 5);
  EXPECT_FALSE(x.slice(1, 0, 2).is_row_strided());
}

TEST(Tensor, CloneAndCopyFromHandleStrides) {
  const Tensor t = iota({3, 4});
  const Tensor c = t.slice(1, 1, 3).clone();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_FALSE(c.shares_storage_with(t));
  EXPECT_EQ(c.to_vector(), (std::vector<float>{1, 2, 5, 6, 9, 10}));
  Tensor dst = Tensor::zeros({3, 4});
  dst.slice(1, 2, 4).copy_from(c);
  EXPECT_EQ(dst.to_vector(), (std::vector<float>{0, 0, 1, 2, 0, 0, 5, 6, 0, 0, 9, 10}));
  EXPECT_THROW(dst.copy_from(c), InternalError);
}

TEST(Tensor, Bfloat16RoundsToNearestEven) {
  EXPECT_EQ(to_float(to_bfloat16(1.0f)), 1.0f);
  EXPECT_EQ(to_float(to_bfloat16(3.140625f)), 3.140625f);
  EXPECT_EQ(to_float(to_bfloat16(1.00390625f)), 1.0f);       // halfway: ties to even
  EXPECT_EQ(to_float(to_bfloat16(1.01171875f)), 1.015625f);  // halfway: ties to even (up)
  EXPECT_TRUE(std::isnan(to_float(to_bfloat16(std::nanf("")))));
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
}

TEST(Parameter, CarriesIdentityAndRequiresContiguousValues) {
  Parameter p("w", Tensor::zeros({2, 3}));
  EXPECT_EQ(p.tensor().parameter(), &p);
  EXPECT_TRUE(p.tensor().requires_grad());
  EXPECT_EQ(p.tensor().slice(1, 0, 2).parameter(), &p);  // views keep the identity
  EXPECT_FALSE(p.data().requires_grad());
  EXPECT_FALSE(p.tensor().detach().requires_grad());
  EXPECT_FALSE(p.has_grad());
  EXPECT_THROW(Parameter("bad", Tensor::zeros({3, 4}).slice(1, 0, 2)), InternalError);
  EXPECT_THROW(Parameter("bad", Tensor()), InternalError);
}

}  // namespace
}  // namespace loom
