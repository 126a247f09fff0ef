// The gemma model through the real plugin host. Agreement with transformers' Gemma2ForCausalLM
// is checked by tests/models (hf_agreement); these tests pin the model's own contract: names,
// sizes, FLOPs, the (1 + w) norms' zero initialisation, soft-capped logits, the KV cache, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <loom/core/plugin_host.hpp>
#include <loom/core/registry.hpp>
#include <loom/kinds/model.hpp>
#include <map>
#include <string>
#include <vector>

namespace {

using loom::Shape;
using loom::Tensor;
using loom::Value;

class GemmaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    loom::PluginHost().load({{LOOM_PLUGIN_DIR, "test"}}, registry_);
    backend_ = registry_.create<loom::Backend>(loom::ComponentRef{"backend", "reference", Value(), "backend"});
  }

  loom::Handle<loom::Model> make(Value options, std::int64_t vocab = 0) {
    options.set("type", "gemma");
    if (!options.find("attention")) options.set("attention", "naive");
    auto model = registry_.create<loom::Model>(loom::ComponentRef{"model", "gemma", options, "model"});
    model->build(loom::ModelSetup{vocab});
    return model;
  }

  static Value tiny() {
    Value o = Value::map();
    o.set("seq_len", 16);
    o.set("hidden_dim", 32);
    o.set("intermediate_dim", 40);
    o.set("num_layers", 3);
    o.set("num_heads", 4);
    o.set("num_kv_heads", 2);
    o.set("head_dim", 8);
    o.set("sliding_window", 4);
    o.set("final_logit_softcapping", 2.0);
    o.set("vocab_size", 50);
    return o;
  }

  static Tensor ids(std::int64_t batch, std::int64_t seq, std::int32_t vocab) {
    std::vector<std::int32_t> v(static_cast<std::size_t>(batch * seq));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int32_t>((i * 7919u + 13u) % vocab);
    return Tensor::from(std::span<const std::int32_t>(v), Shape{batch, seq});
  }

  loom::Registry registry_;
  loom::Handle<loom::Backend> backend_;
};

TEST_F(GemmaTest, NamesShapesAndSizes) {
  const auto model = make(tiny());
  std::map<std::string, loom::ModelParameter> by_name;
  std::int64_t total = 0;
  for (const auto& p : model->parameters()) {
    by_name.emplace(p.parameter->name(), p);
    total += p.parameter->shape().numel();
  }
  EXPECT_EQ(total, model->num_parameters());
  EXPECT_EQ(by_name.at("layers.2.self_attn.qkv_proj.weight").parameter->shape(), (Shape{32 + 2 * 16, 32}));
  EXPECT_EQ(by_name.at("layers.0.pre_feedforward_layernorm.weight").role, loom::ParameterRole::norm);
  EXPECT_EQ(by_name.at("layers.0.post_feedforward_layernorm.weight").parameter->shape(), (Shape{32}));
  EXPECT_EQ(by_name.count("lm_head.weight"), 0u);  // tied
  // Per layer: qkv 64 x 32, o 32 x 32, MLP 3 x 40 x 32, four norms of 32.
  EXPECT_EQ(model->num_parameters(), 50 * 32 + 3 * (64 * 32 + 32 * 32 + 3 * 40 * 32 + 4 * 32) + 32);
  // Layers 0 and 2 see 4 keys per query at most, layer 1 all 16.
  const double matmul = 3.0 * (64 * 32 + 32 * 32 + 3 * 40 * 32) + 50.0 * 32;
  EXPECT_DOUBLE_EQ(model->flops_per_token(16), 6 * matmul + 12.0 * 4 * 8 * (4 + 16 + 4));
}

TEST_F(GemmaTest, NormsStartAtZeroAndLogitsAreCapped) {
  const auto model = make(tiny());
  model->initialize(1);
  for (const auto& p : model->parameters()) {
    if (p.role != loom::ParameterRole::norm) continue;
    EXPECT_EQ(p.parameter->data().to_vector(), std::vector<float>(32, 0.0f)) << p.parameter->name();
  }
  // Large weights push raw logits far past the cap of 2.
  for (const auto& p : model->parameters()) {
    if (p.role == loom::ParameterRole::norm) continue;
    auto t = p.parameter->data();
    auto v = t.to_vector();
    for (float& x : v) x *= 100.0f;
    t.copy_from(Tensor::from(std::span<const float>(v), t.shape()));
  }
  loom::Ops ops(*backend_);
  const auto logits = model->logits(ops, ids(2, 8, 50), Tensor()).to_vector();
  double peak = 0;
  for (float x : logits) peak = std::max(peak, std::abs(static_cast<double>(x)));
  EXPECT_LE(peak, 2.0);
  EXPECT_GT(peak, 1.9);
}

TEST_F(GemmaTest, CachedLogitsMatchTheFullPass) {
  const auto model = make(tiny());
  model->initialize(2);
  loom::Ops ops(*backend_);
  const Tensor tokens = ids(2, 12, 50);
  const Tensor full = model->logits(ops, tokens, Tensor());
  auto cache = model->new_cache(2, 12);
  model->next_logits(ops, tokens.slice(1, 0, 5).clone(), *cache);
  for (std::int64_t t = 5; t < 12; ++t) {
    const auto got = model->next_logits(ops, tokens.slice(1, t, t + 1).clone(), *cache).to_vector();
    const auto want = full.select(1, t).clone().to_vector();
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4) << "position " << t;
  }
}

TEST_F(GemmaTest, LossTrainsEveryParameter) {
  const auto model = make(tiny());
  model->initialize(3);
  loom::Tape tape;
  loom::Ops ops(*backend_, &tape);
  const Tensor loss = model->loss(ops, ids(2, 10, 50), ids(2, 10, 50), Tensor());
  EXPECT_NEAR(loss.item(), std::log(50.0), 0.5);
  tape.backward(loss);
  for (const auto& p : model->parameters()) EXPECT_TRUE(p.parameter->has_grad()) << p.parameter->name();
}

TEST_F(GemmaTest, HeadsMustShareKeyValueHeadsEvenly) {
  Value o = tiny();
  o.set("num_kv_heads", 3);
  try {
    make(o);
    FAIL() << "expected a UserError";
  } catch (const loom::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("num_kv_heads (3) must divide num_heads (4)"), std::string::npos) << e.what();
  }
}

}  // namespace
