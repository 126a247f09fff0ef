// The gpt2 model, loaded through the real plugin host with the reference backend and whatever
// attention kernels are built. Agreement with an independent PyTorch implementation is checked by
// tests/torch; these tests pin the model's own contract: sizes, FLOPs, initialisation, the KV
// cache, dropout and its error messages.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <loom/core/plugin_host.hpp>
#include <loom/core/registry.hpp>
#include <loom/kinds/model.hpp>
#include <loom/safetensors.hpp>
#include <map>
#include <numeric>
#include <string>
#include <vector>

namespace {

using loom::Shape;
using loom::Tensor;
using loom::Value;

class Gpt2Test : public ::testing::Test {
 protected:
  void SetUp() override {
    loom::PluginHost().load({{LOOM_PLUGIN_DIR, "test"}}, registry_);
    // The first kernel that computes on the host, which the reference backend's tensors are in
    // (a GPU's kernel, cuda-flash, sorts first where the CUDA plugins are built).
    const auto kernels = registry_.attention_kernels_on(loom::Device::host());
    ASSERT_FALSE(kernels.empty()) << "no host attention kernel is built in " << LOOM_PLUGIN_DIR;
    kernel_ = kernels.front();
    backend_ = registry_.create<loom::Backend>(loom::ComponentRef{"backend", "reference", Value(), "backend"});
  }

  // A gpt2 model from `options` (a map) over the first attention kernel, built for `vocab`.
  loom::Handle<loom::Model> make(Value options, std::int64_t vocab = 0) {
    options.set("type", "gpt2");
    if (!options.find("attention")) options.set("attention", kernel_);
    auto model = registry_.create<loom::Model>(loom::ComponentRef{"model", "gpt2", options, "model"});
    model->build(loom::ModelSetup{vocab});
    return model;
  }

  static Value tiny() {
    Value o = Value::map();
    o.set("seq_len", 16);
    o.set("hidden_dim", 32);
    o.set("num_layers", 2);
    o.set("num_heads", 4);
    o.set("vocab_size", 50);
    return o;
  }

  static Tensor ids(std::int64_t batch, std::int64_t seq, std::int32_t vocab, std::uint32_t salt) {
    std::vector<std::int32_t> v(static_cast<std::size_t>(batch * seq));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int32_t>((i * 7919u + salt * 104729u) % vocab);
    return Tensor::from(std::span<const std::int32_t>(v), Shape{batch, seq});
  }

  loom::Registry registry_;
  loom::Handle<loom::Backend> backend_;
  std::string kernel_;
};

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::abs(static_cast<double>(x)));
  return m;
}

TEST_F(Gpt2Test, Gpt2SmallHas124MParametersAndDocumentedFlops) {
  Value o = Value::map();
  o.set("vocab_size", 50257);
  const auto model = make(o);
  EXPECT_EQ(model->num_parameters(), 124439808);  // Hugging Face's gpt2, tied embeddings once
  EXPECT_EQ(model->vocab_size(), 50257);
  EXPECT_EQ(model->max_seq_len(), 1024);
  // docs/models.md: 6 * matmul weights + 12 * layers * heads * head_dim * seq_len, with matmul
  // weights 12 * (768 * 2304 + 768 * 768 + 2 * 768 * 3072) + 768 * 50257 = 123,532,032.
  EXPECT_DOUBLE_EQ(model->flops_per_token(1024), 6.0 * 123532032.0 + 12.0 * 12 * 768 * 1024);
  EXPECT_DOUBLE_EQ(model->flops_per_token(256), 6.0 * 123532032.0 + 12.0 * 12 * 768 * 256);
}

TEST_F(Gpt2Test, ParametersHaveCheckpointNamesShapesAndRoles) {
  Value o = tiny();
  o.set("tie_word_embeddings", false);
  const auto model = make(o);
  const auto params = model->parameters();
  std::int64_t total = 0;
  std::map<std::string, loom::ModelParameter> by_name;
  for (const auto& p : params) {
    total += p.parameter->shape().numel();
    EXPECT_TRUE(by_name.emplace(p.parameter->name(), p).second) << "duplicate " << p.parameter->name();
  }
  EXPECT_EQ(total, model->num_parameters());
  EXPECT_EQ(params.front().parameter->name(), "wte.weight");
  EXPECT_EQ(by_name.at("wte.weight").parameter->shape(), (Shape{50, 32}));
  EXPECT_EQ(by_name.at("wpe.weight").parameter->shape(), (Shape{16, 32}));
  EXPECT_EQ(by_name.at("h.1.attn.c_attn.weight").parameter->shape(), (Shape{32, 96}));
  EXPECT_EQ(by_name.at("h.1.mlp.c_fc.weight").parameter->shape(), (Shape{32, 128}));
  EXPECT_EQ(by_name.at("h.1.mlp.c_proj.weight").parameter->shape(), (Shape{128, 32}));
  EXPECT_EQ(by_name.at("lm_head.weight").parameter->shape(), (Shape{50, 32}));
  EXPECT_EQ(by_name.at("wte.weight").role, loom::ParameterRole::embedding);
  EXPECT_EQ(by_name.at("h.0.ln_1.bias").role, loom::ParameterRole::norm);
  EXPECT_EQ(by_name.at("h.0.attn.c_attn.bias").role, loom::ParameterRole::bias);
  EXPECT_EQ(by_name.at("h.0.attn.c_proj.weight").role, loom::ParameterRole::weight);
  // 2 embeddings + 12 per layer + ln_f (2) + lm_head
  EXPECT_EQ(params.size(), 2u + 2 * 12 + 2 + 1);

  Value no_bias = tiny();
  no_bias.set("use_bias", false);
  const auto unbiased = make(no_bias);
  for (const auto& p : unbiased->parameters()) EXPECT_FALSE(p.parameter->name().ends_with(".bias"));
}

TEST_F(Gpt2Test, InitialisationFollowsGpt2AndIsDeterministic) {
  Value o = tiny();
  o.set("hidden_dim", 128);
  o.set("num_layers", 8);
  const auto a = make(o), b = make(o), c = make(o);
  a->initialize(7);
  b->initialize(7);
  c->initialize(8);
  const auto pa = a->parameters(), pb = b->parameters(), pc = c->parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    const auto va = pa[i].parameter->data().to_vector();
    EXPECT_EQ(va, pb[i].parameter->data().to_vector()) << pa[i].parameter->name();
    const std::string& name = pa[i].parameter->name();
    if (name.ends_with("ln_1.weight") || name.ends_with("ln_2.weight") || name == "ln_f.weight") {
      for (float x : va) ASSERT_EQ(x, 1.0f) << name;
    } else if (name.ends_with(".bias")) {
      for (float x : va) ASSERT_EQ(x, 0.0f) << name;
    } else {
      EXPECT_NE(va, pc[i].parameter->data().to_vector()) << name << " ignores the seed";
      const double mean = std::accumulate(va.begin(), va.end(), 0.0) / static_cast<double>(va.size());
      double var = 0;
      for (float x : va) var += (x - mean) * (x - mean);
      const double std = std::sqrt(var / static_cast<double>(va.size()));
      const double expected = name.ends_with("c_proj.weight") ? 0.02 / std::sqrt(16.0) : 0.02;
      EXPECT_NEAR(std, expected, 0.06 * expected) << name;
      EXPECT_NEAR(mean, 0.0, 0.1 * expected) << name;
    }
  }
}

TEST_F(Gpt2Test, InitialLossIsNearUniform) {
  const auto model = make(tiny());
  model->initialize(1);
  loom::Ops ops(*backend_);
  const Tensor loss = model->loss(ops, ids(2, 16, 50, 1), ids(2, 16, 50, 2), Tensor());
  EXPECT_NEAR(loss.item(), std::log(50.0), 0.05);
}

TEST_F(Gpt2Test, IgnoredTargetsDoNotCount) {
  const auto model = make(tiny());
  model->initialize(3);
  loom::Ops ops(*backend_);
  const Tensor tokens = ids(1, 16, 50, 4), targets = ids(1, 16, 50, 5);
  const Tensor logits = model->logits(ops, tokens, Tensor());
  // Mean cross-entropy over the first 10 positions only, from the logits.
  const auto l = logits.to_vector();
  const auto t = targets.to_int_vector();
  double expected = 0;
  for (int i = 0; i < 10; ++i) {
    double m = -1e30, s = 0;
    for (int j = 0; j < 50; ++j) m = std::max(m, static_cast<double>(l[i * 50 + j]));
    for (int j = 0; j < 50; ++j) s += std::exp(l[i * 50 + j] - m);
    expected += m + std::log(s) - l[i * 50 + t[i]];
  }
  expected /= 10;
  std::vector<std::int32_t> m = t;
  for (int i = 10; i < 16; ++i) m[static_cast<std::size_t>(i)] = -1;
  const Tensor masked = Tensor::from(std::span<const std::int32_t>(m), Shape{1, 16});
  EXPECT_NEAR(model->loss(ops, tokens, masked, Tensor()).item(), expected, 1e-5);
}

TEST_F(Gpt2Test, CachedGenerationMatchesTheFullForward) {
  for (const bool tied : {true, false}) {
    Value o = tiny();
    o.set("tie_word_embeddings", tied);
    o.set("scale_attn_by_inverse_layer_idx", true);
    const auto model = make(o);
    model->initialize(11);
    loom::Tape tape;
    loom::Ops ops(*backend_, &tape);
    const std::int64_t batch = 2, seq = 12, vocab = 50;
    const Tensor tokens = ids(batch, seq, 50, 9);
    const auto full = model->logits(ops, tokens, Tensor()).to_vector();
    tape.clear();
    const double scale = max_abs(full);

    auto cache = model->new_cache(batch, seq);
    const std::int64_t prefill = 5;
    Tensor out = model->next_logits(ops, tokens.slice(1, 0, prefill).clone(), *cache);
    EXPECT_EQ(tape.size(), 0u) << "generation must not record";
    EXPECT_EQ(cache->length(), prefill);
    for (std::int64_t t = prefill - 1; t < seq; ++t) {
      if (t >= prefill) out = model->next_logits(ops, tokens.slice(1, t, t + 1).clone(), *cache);
      ASSERT_EQ(out.shape(), (Shape{batch, vocab}));
      const auto got = out.to_vector();
      for (std::int64_t b = 0; b < batch; ++b)
        for (std::int64_t j = 0; j < vocab; ++j)
          ASSERT_NEAR(got[b * vocab + j], full[(b * seq + t) * vocab + j], 1e-5 * scale)
              << "position " << t << ", tied " << tied;
    }
    EXPECT_EQ(cache->length(), seq);
    EXPECT_THROW(model->next_logits(ops, tokens.slice(1, 0, 1).clone(), *cache), loom::UserError);  // full
    cache->reset();
    EXPECT_EQ(cache->length(), 0);
    const auto again = model->next_logits(ops, tokens.slice(1, 0, 1).clone(), *cache).to_vector();
    for (std::int64_t j = 0; j < vocab; ++j) EXPECT_NEAR(again[j], full[j], 1e-5 * scale);
  }
}

TEST_F(Gpt2Test, DropoutIsSeededAndOffOutsideTraining) {
  Value o = tiny();
  o.set("embed_pdrop", 0.1);
  o.set("resid_pdrop", 0.2);
  const auto model = make(o);
  model->initialize(5);
  loom::Ops ops(*backend_);
  const Tensor tokens = ids(2, 16, 50, 1), targets = ids(2, 16, 50, 2);
  ops.set_dropout_seed(1, 0);
  const float a = model->loss(ops, tokens, targets, Tensor()).item();
  ops.set_dropout_seed(1, 0);
  const float b = model->loss(ops, tokens, targets, Tensor()).item();
  ops.set_dropout_seed(1, 1);
  const float c = model->loss(ops, tokens, targets, Tensor()).item();
  ops.set_training(false);
  const float eval1 = model->loss(ops, tokens, targets, Tensor()).item();
  const float eval2 = model->loss(ops, tokens, targets, Tensor()).item();
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, eval1);
  EXPECT_EQ(eval1, eval2);
}

TEST_F(Gpt2Test, SavedWeightsLoadIntoAFreshModel) {
  const auto a = make(tiny()), b = make(tiny());
  a->initialize(21);
  b->initialize(22);
  const auto path =
      std::filesystem::temp_directory_path() / ("loom_gpt2_test_" + std::to_string(::getpid()) + ".safetensors");
  loom::safetensors::save_parameters(path, a->parameters(), {{"model", "gpt2"}});
  const auto metadata = loom::safetensors::load_parameters(path, b->parameters());
  std::filesystem::remove(path);
  EXPECT_EQ(metadata.at("model"), "gpt2");
  loom::Ops ops(*backend_);
  const Tensor tokens = ids(1, 8, 50, 3);
  EXPECT_EQ(a->logits(ops, tokens, Tensor()).to_vector(), b->logits(ops, tokens, Tensor()).to_vector());
}

TEST_F(Gpt2Test, BadOptionsAndInputsAreUserErrors) {
  Value heads = tiny();
  heads.set("num_heads", 5);
  EXPECT_THROW(make(heads), loom::UserError);
  Value attn_drop = tiny();
  attn_drop.set("attn_pdrop", 0.1);
  try {
    make(attn_drop);
    FAIL() << "attn_pdrop > 0 accepted";
  } catch (const loom::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("attn_pdrop"), std::string::npos) << e.what();
  }
  Value small_vocab = tiny();
  EXPECT_THROW(make(small_vocab, 51), loom::UserError);  // tokenizer larger than vocab_size
  Value no_vocab = tiny();
  no_vocab.set("vocab_size", Value());
  EXPECT_THROW(make(no_vocab, 0), loom::UserError);
  EXPECT_EQ(make(no_vocab, 77)->vocab_size(), 77);

  const auto model = make(tiny());
  model->initialize(1);
  loom::Ops ops(*backend_);
  EXPECT_THROW(model->loss(ops, ids(1, 17, 50, 1), ids(1, 17, 50, 1), Tensor()), loom::UserError);  // > seq_len
  Tensor bad = ids(1, 8, 50, 1).clone();
  bad.data<std::int32_t>()[3] = 50;
  try {
    model->loss(ops, bad, ids(1, 8, 50, 1), Tensor());
    FAIL() << "token out of vocabulary accepted";
  } catch (const loom::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("[0, 3] is 50"), std::string::npos) << e.what();
  }
  Tensor bad_target = ids(1, 8, 50, 1).clone();
  bad_target.data<std::int32_t>()[0] = -2;
  EXPECT_THROW(model->loss(ops, ids(1, 8, 50, 1), bad_target, Tensor()), loom::UserError);
  EXPECT_THROW(model->loss(ops, ids(1, 8, 50, 1), ids(1, 7, 50, 1), Tensor()), loom::UserError);
  EXPECT_THROW(model->new_cache(1, 17), loom::UserError);
  auto other = make(tiny());
  auto cache = other->new_cache(1, 8);
  EXPECT_THROW(model->next_logits(ops, ids(1, 1, 50, 1), *cache), loom::UserError);
}

}  // namespace
