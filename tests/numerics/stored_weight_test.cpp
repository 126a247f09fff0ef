// Weights stored in fewer bits (Parameter::stored, lora.base_dtype): linear (forward and the input
// gradient, both layouts, with bias and activation), linear_cross_entropy and embedding with a
// stored weight equal the same operations on a parameter holding the dequantized float32 weight,
// on every dequantization kernel set (AVX-512 and AVX2) and backend; set_stored gives the float32
// value's memory back; every other operation refuses a stored weight; LinearAdaptersScope.
#include <gtest/gtest.h>

#include <loom/error.hpp>
#include <loom/quantization.hpp>

#include "numerics_test_support.hpp"

namespace loom::test {
namespace {

using quant::StorageFormat;

struct Kernels {
  explicit Kernels(bool avx2) { quant::force_avx2_kernels(avx2); }
  ~Kernels() { quant::force_avx2_kernels(false); }
};

// A frozen weight stored in `format`, and a plain parameter holding its dequantized values.
struct Pair {
  Pair(const Shape& shape, StorageFormat format, std::uint64_t key)
      : stored("w", random_tensor(shape, key, 0.02f)), plain("w_plain", Tensor::zeros(shape)) {
    const Tensor v = stored.data();
    auto m = std::make_shared<quant::StoredMatrix>(quant::store(
        std::span<const float>(v.data<float>(), static_cast<std::size_t>(v.numel())), shape[0], shape[1], format, "w"));
    const std::vector<float> deq = quant::dequantize(*m);
    plain.data().copy_from(Tensor::from(std::span<const float>(deq), shape));
    plain.set_requires_grad(false);
    stored.set_stored(std::move(m));
  }
  Parameter stored, plain;
};

struct Case {
  std::string backend;  // "cpu" in float32, "cpu-default" (bf16 products on AVX512-BF16), "reference"
  StorageFormat format;
  bool avx2;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.backend << " " << quant::storage_format_name(c.format) << (c.avx2 ? " avx2" : "");
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string b = info.param.backend == "cpu-default" ? "CpuDefault" : info.param.backend;
  return b + "_" + quant::storage_format_name(info.param.format) + (info.param.avx2 ? "_avx2" : "_auto");
}

class StoredWeight : public ::testing::TestWithParam<Case> {
 protected:
  Handle<Backend> backend() const {
    const std::string& b = GetParam().backend;
    return b == "cpu-default" ? make_backend("cpu") : make_f32_backend(b);
  }
  // bf16 products round both operands; the panels of a stored weight split sums over the inner
  // dimension, so the two sides differ by a reordering of float32 sums at most.
  double rtol() const { return GetParam().backend == "cpu-default" ? 2e-3 : 2e-5; }
};

TEST_P(StoredWeight, LinearForwardAndInputGradientEqualTheDequantizedWeight) {
  const Kernels kernels(GetParam().avx2);
  Handle<Backend> be = backend();
  struct Shape3 {
    std::int64_t m, in, out;
  };
  // The second shape is several panels (2^21 values each) along both dimensions' uses.
  for (const Shape3 s : {Shape3{7, 96, 40}, Shape3{5, 9000, 300}})
    for (const bool in_out : {false, true})
      for (const Activation act : {Activation::none, Activation::gelu_tanh}) {
        SCOPED_TRACE(::testing::Message() << s.m << "x" << s.in << "->" << s.out << " in_out " << in_out << " act "
                                          << static_cast<int>(act));
        const Shape wshape = in_out ? Shape{s.in, s.out} : Shape{s.out, s.in};
        Pair w(wshape, GetParam().format, 11);
        Parameter bias("b", random_tensor({s.out}, 12, 0.1f));
        bias.set_requires_grad(false);
        auto run = [&](Parameter& weight) {
          Parameter x("x", random_tensor({s.m, s.in}, 13));
          Tape tape;
          Ops ops(*be, &tape);
          const Tensor y = ops.linear(x.tensor(), weight.tensor(), bias.tensor(), {in_out, act});
          const std::vector<float> out = y.to_vector();
          tape.backward(y, random_tensor({s.m, s.out}, 14));
          EXPECT_FALSE(weight.has_grad());
          return std::make_pair(out, x.grad().to_vector());
        };
        const auto [y_stored, dx_stored] = run(w.stored);
        const auto [y_plain, dx_plain] = run(w.plain);
        EXPECT_TRUE(all_close(y_stored, y_plain, rtol()));
        EXPECT_TRUE(all_close(dx_stored, dx_plain, rtol()));
      }
}

TEST_P(StoredWeight, FusedCrossEntropyAndEmbeddingEqualTheDequantizedWeight) {
  const Kernels kernels(GetParam().avx2);
  Handle<Backend> be = backend();
  const std::int64_t vocab = 1000, dim = 64, tokens = 24;
  Pair table({vocab, dim}, GetParam().format, 21);
  const Tensor ids = random_ids({2, tokens / 2}, static_cast<std::int32_t>(vocab), 22);
  for (const Reduction reduction : {Reduction::mean, Reduction::none}) {
    auto run = [&](Parameter& weight) {
      Parameter x("x", random_tensor({tokens, dim}, 23));
      Tape tape;
      Ops ops(*be, &tape);
      const Tensor targets = random_ids({tokens}, static_cast<std::int32_t>(vocab), 24);
      CrossEntropyOptions options;
      options.reduction = reduction;
      options.chunk_tokens = 10;
      const Tensor loss = ops.linear_cross_entropy(x.tensor(), weight.tensor(), targets, options);
      const std::vector<float> l = loss.to_vector();
      if (reduction == Reduction::none)
        tape.backward(loss, random_tensor({tokens}, 25));
      else
        tape.backward(loss);
      const std::vector<float> e = ops.embedding(weight.tensor(), ids).to_vector();
      return std::make_tuple(l, x.grad().to_vector(), e);
    };
    const auto [l_stored, dx_stored, e_stored] = run(table.stored);
    const auto [l_plain, dx_plain, e_plain] = run(table.plain);
    EXPECT_TRUE(all_close(l_stored, l_plain, rtol()));
    EXPECT_TRUE(all_close(dx_stored, dx_plain, rtol()));
    EXPECT_EQ(e_stored, e_plain) << "an embedding row is its dequantized values";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Formats, StoredWeight,
    ::testing::Values(Case{"cpu", StorageFormat::bf16, false}, Case{"cpu", StorageFormat::int8, false},
                      Case{"cpu", StorageFormat::nf4, false}, Case{"cpu", StorageFormat::int8, true},
                      Case{"cpu", StorageFormat::nf4, true}, Case{"cpu-default", StorageFormat::nf4, false},
                      Case{"reference", StorageFormat::nf4, false}, Case{"reference", StorageFormat::int8, true}),
    case_name);

TEST(StoredWeightMemory, SetStoredGivesTheValuesPagesBackAndFreezes) {
  const Shape shape{512, 1024};  // 2 MiB of float32
  Parameter w("w", random_tensor(shape, 31));
  EXPECT_TRUE(w.requires_grad());
  const Tensor v = w.data();
  auto m = std::make_shared<quant::StoredMatrix>(
      quant::store(std::span<const float>(v.data<float>(), static_cast<std::size_t>(v.numel())), 512, 1024,
                   StorageFormat::nf4, "w"));
  EXPECT_LT(m->storage_bytes(), v.numel());  // 4.13 bits a value
  w.set_stored(m);
  EXPECT_EQ(w.stored(), m.get());
  EXPECT_FALSE(w.requires_grad());
  // The pages inside the value now read as zero: the system took them back.
  const float* d = v.data<float>();
  EXPECT_EQ(d[v.numel() / 2], 0.0f);
  EXPECT_EQ(d[v.numel() / 2 + 1023], 0.0f);
}

TEST(StoredWeightMemory, OtherOperationsAndSlicesRefuseAStoredWeight) {
  Handle<Backend> be = make_backend("cpu");
  Pair w({8, 64}, StorageFormat::int8, 41);
  Tape tape;
  Ops ops(*be, &tape);
  try {
    ops.scale(w.stored.tensor(), 2.0f);
    FAIL() << "scale took a stored weight";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("'w', stored as int8 (lora.base_dtype)"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops.linear(random_tensor({2, 64}, 1), w.stored.tensor().slice(0, 0, 4)), InternalError);
  EXPECT_THROW(ops.matmul(random_tensor({2, 64}, 1), w.stored.tensor(), false, true), InternalError);
}

TEST(LinearAdaptersScope, OpsMadeWithinItCarryTheAdapters) {
  Handle<Backend> be = make_f32_backend("cpu");
  Parameter w("w", random_tensor({6, 5}, 51)), a("a", random_tensor({2, 5}, 52)), b("b", random_tensor({6, 2}, 53));
  LinearAdapters table;
  table[&w].push_back({&a, &b, 0.5f, 0.0f, 0, 0});
  const Tensor x = random_tensor({3, 5}, 54);
  auto out = [&] {
    Ops ops(*be);
    return ops.linear(x, w.tensor()).to_vector();
  };
  const std::vector<float> base = out();
  std::vector<float> adapted;
  {
    Ops explicit_ops(*be);
    explicit_ops.set_linear_adapters(&table);
    adapted = explicit_ops.linear(x, w.tensor()).to_vector();
  }
  {
    const LinearAdaptersScope scope(&table);
    EXPECT_EQ(out(), adapted);
  }
  EXPECT_EQ(out(), base) << "the scope ends with its lifetime";
}

}  // namespace
}  // namespace loom::test
