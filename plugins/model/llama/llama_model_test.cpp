// The llama model, loaded through the real plugin host with the reference backend and whatever
// attention kernels are built. Agreement with an independent PyTorch implementation is checked by
// tests/torch; these tests pin the model's own contract: sizes, FLOPs, initialisation, packed
// sequences, the KV cache and its error messages.
#include <gtest/gtest.h>

#include <cmath>
#include <loom/core/plugin_host.hpp>
#include <loom/core/registry.hpp>
#include <loom/hf_interop.hpp>
#include <loom/kinds/model.hpp>
#include <map>
#include <numeric>
#include <string>
#include <vector>

namespace {

using loom::Shape;
using loom::Tensor;
using loom::Value;

class LlamaTest : public ::testing::Test {
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

  loom::Handle<loom::Model> make(Value options, std::int64_t vocab = 0) {
    options.set("type", "llama");
    if (!options.find("attention")) options.set("attention", kernel_);
    auto model = registry_.create<loom::Model>(loom::ComponentRef{"model", "llama", options, "model"});
    model->build(loom::ModelSetup{vocab});
    return model;
  }

  // 2 layers, 6 query heads over 2 key/value heads of width 8 (hidden 32 is not 6 * 8: head_dim
  // is set explicitly, as Qwen3 and Gemma do).
  static Value tiny() {
    Value o = Value::map();
    o.set("seq_len", 16);
    o.set("hidden_dim", 32);
    o.set("intermediate_dim", 40);
    o.set("num_layers", 2);
    o.set("num_heads", 6);
    o.set("num_kv_heads", 2);
    o.set("head_dim", 8);
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

Value rope(const std::string& type, double factor) {
  Value r = Value::map();
  r.set("type", type);
  r.set("factor", factor);
  return r;
}

TEST_F(LlamaTest, LlamaTinyPresetSizeAndFlops) {
  // configs/llama-tiny.yaml with the byte tokenizer.
  Value o = Value::map();
  o.set("seq_len", 512);
  o.set("hidden_dim", 256);
  o.set("intermediate_dim", 768);
  o.set("num_layers", 4);
  o.set("num_heads", 8);
  o.set("num_kv_heads", 4);
  const auto model = make(o, 256);
  // Per layer: qkv (256 + 2 * 128) x 256, o 256 x 256, MLP 3 x 768 x 256, two norms of 256.
  const std::int64_t layer = 512 * 256 + 256 * 256 + 3 * 768 * 256 + 2 * 256;
  EXPECT_EQ(model->num_parameters(), 2 * 256 * 256 + 4 * layer + 256);
  const double matmul = 4.0 * (512 * 256 + 256 * 256 + 3 * 768 * 256) + 256.0 * 256;
  EXPECT_DOUBLE_EQ(model->flops_per_token(512), 6 * matmul + 12.0 * 4 * 8 * 32 * 512);

  // A sliding window caps the keys each query is charged for.
  o.set("sliding_window", 128);
  const auto windowed = make(o, 256);
  EXPECT_DOUBLE_EQ(windowed->flops_per_token(512), 6 * matmul + 12.0 * 4 * 8 * 32 * 128);
  EXPECT_DOUBLE_EQ(windowed->flops_per_token(64), 6 * matmul + 12.0 * 4 * 8 * 32 * 64);
}

TEST_F(LlamaTest, ParametersHaveNamesShapesAndRoles) {
  Value o = tiny();
  o.set("use_qk_norm", true);
  o.set("use_bias", true);
  const auto model = make(o);
  std::map<std::string, loom::ModelParameter> by_name;
  std::int64_t total = 0;
  for (const auto& p : model->parameters()) {
    by_name.emplace(p.parameter->name(), p);
    total += p.parameter->shape().numel();
  }
  EXPECT_EQ(total, model->num_parameters());
  EXPECT_EQ(by_name.at("embed_tokens.weight").parameter->shape(), (Shape{50, 32}));
  EXPECT_EQ(by_name.at("layers.1.self_attn.qkv_proj.weight").parameter->shape(), (Shape{48 + 2 * 16, 32}));
  EXPECT_EQ(by_name.at("layers.1.self_attn.qkv_proj.bias").role, loom::ParameterRole::bias);
  EXPECT_EQ(by_name.at("layers.1.self_attn.q_norm.weight").parameter->shape(), (Shape{8}));
  EXPECT_EQ(by_name.at("layers.1.self_attn.k_norm.weight").role, loom::ParameterRole::norm);
  EXPECT_EQ(by_name.at("layers.1.self_attn.o_proj.weight").parameter->shape(), (Shape{32, 48}));
  EXPECT_EQ(by_name.at("layers.0.mlp.gate_proj.weight").parameter->shape(), (Shape{40, 32}));
  EXPECT_EQ(by_name.at("layers.0.mlp.down_proj.weight").parameter->shape(), (Shape{32, 40}));
  EXPECT_EQ(by_name.at("norm.weight").role, loom::ParameterRole::norm);
  EXPECT_EQ(by_name.at("lm_head.weight").parameter->shape(), (Shape{50, 32}));

  Value tied = tiny();
  tied.set("tie_word_embeddings", true);
  const auto t = make(tied);
  for (const auto& p : t->parameters()) EXPECT_NE(p.parameter->name(), "lm_head.weight");
}

TEST_F(LlamaTest, InitialisationIsNormalWithUnitNorms) {
  Value o = tiny();
  o.set("hidden_dim", 128);
  o.set("intermediate_dim", 256);
  o.set("initializer_range", 0.05);
  const auto a = make(o), b = make(o);
  a->initialize(3);
  b->initialize(3);
  const auto pa = a->parameters(), pb = b->parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    const auto v = pa[i].parameter->data().to_vector();
    EXPECT_EQ(v, pb[i].parameter->data().to_vector());
    if (pa[i].role == loom::ParameterRole::norm) {
      for (float x : v) ASSERT_EQ(x, 1.0f);
      continue;
    }
    const double mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
    double var = 0;
    for (float x : v) var += (x - mean) * (x - mean);
    EXPECT_NEAR(std::sqrt(var / static_cast<double>(v.size())), 0.05, 0.004) << pa[i].parameter->name();
  }
}

// RoPE makes attention depend on relative positions only, so a document packed after another
// (kept apart by segment ids) gets exactly the logits it gets alone.
TEST_F(LlamaTest, PackedDocumentsDoNotSeeEachOther) {
  const auto model = make(tiny());
  model->initialize(9);
  loom::Ops ops(*backend_);
  const std::int64_t first = 5, second = 9, vocab = 50;
  const Tensor packed = ids(1, first + second, 50, 4);
  std::vector<std::int32_t> seg(first + second, 0);
  for (std::int64_t i = first; i < first + second; ++i) seg[static_cast<std::size_t>(i)] = 1;
  const Tensor segments = Tensor::from(std::span<const std::int32_t>(seg), Shape{1, first + second});
  const auto together = model->logits(ops, packed, segments).to_vector();
  const auto alone = model->logits(ops, packed.slice(1, first, first + second).clone(), Tensor()).to_vector();
  const double scale = max_abs(alone);
  for (std::int64_t t = 0; t < second; ++t)
    for (std::int64_t j = 0; j < vocab; ++j)
      ASSERT_NEAR(together[(first + t) * vocab + j], alone[t * vocab + j], 2e-5 * scale) << "position " << t;
  // Without segment ids the second document does see the first.
  const auto unsegmented = model->logits(ops, packed, Tensor()).to_vector();
  EXPECT_GT(std::abs(unsegmented[(first + 2) * vocab] - alone[2 * vocab]), 1e-4 * scale);
}

TEST_F(LlamaTest, CachedGenerationMatchesTheFullForward) {
  struct Variant {
    const char* name;
    Value options;
  };
  std::vector<Variant> variants;
  variants.push_back({"gqa", tiny()});
  Value mqa = tiny();
  mqa.set("num_kv_heads", 1);
  mqa.set("use_qk_norm", true);
  mqa.set("use_bias", true);
  variants.push_back({"mqa + qk-norm + bias", mqa});
  Value window = tiny();
  window.set("sliding_window", 4);
  window.set("tie_word_embeddings", true);
  variants.push_back({"sliding window", window});
  Value qwen2_window = tiny();
  qwen2_window.set("sliding_window", 4);
  qwen2_window.set("max_window_layers", 1);
  qwen2_window.set("qkv_bias", true);
  variants.push_back({"window from layer 1 (max_window_layers)", qwen2_window});
  Value llama3 = tiny();
  llama3.set("rope", rope("llama3", 4.0));
  variants.push_back({"llama3 rope", llama3});
  Value linear = tiny();
  linear.set("rope", rope("default", 2.0));
  variants.push_back({"linear rope", linear});

  for (const auto& variant : variants) {
    const auto model = make(variant.options);
    model->initialize(17);
    loom::Ops ops(*backend_);
    const std::int64_t batch = 2, seq = 11, vocab = 50;
    const Tensor tokens = ids(batch, seq, 50, 2);
    const auto full = model->logits(ops, tokens, Tensor()).to_vector();
    const double scale = max_abs(full);
    auto cache = model->new_cache(batch, 16);
    const std::int64_t prefill = 6;
    Tensor out = model->next_logits(ops, tokens.slice(1, 0, prefill).clone(), *cache);
    for (std::int64_t t = prefill - 1; t < seq; ++t) {
      if (t >= prefill) out = model->next_logits(ops, tokens.slice(1, t, t + 1).clone(), *cache);
      const auto got = out.to_vector();
      for (std::int64_t b = 0; b < batch; ++b)
        for (std::int64_t j = 0; j < vocab; ++j)
          ASSERT_NEAR(got[b * vocab + j], full[(b * seq + t) * vocab + j], 1e-5 * scale)
              << variant.name << ", position " << t;
    }
  }
}

// Qwen2's max_window_layers: layers below it attend to everything. With the window on layer 1
// only, the logits differ from the window on both layers and from none, and the FLOPs count each
// layer's keys.
TEST_F(LlamaTest, MaxWindowLayersWindowsOnlyTheUpperLayers) {
  const Tensor tokens = ids(1, 12, 50, 3);
  std::vector<std::vector<float>> outs;
  std::vector<double> flops;
  for (const std::int64_t max_window_layers : {-1, 0, 1, 2}) {  // -1: no window
    Value o = tiny();
    if (max_window_layers >= 0) {
      o.set("sliding_window", 3);
      o.set("max_window_layers", max_window_layers);
    }
    const auto model = make(o);
    model->initialize(6);
    loom::Ops ops(*backend_);
    outs.push_back(model->logits(ops, tokens, Tensor()).to_vector());
    flops.push_back(model->flops_per_token(12));
  }
  EXPECT_NE(outs[1], outs[0]);
  EXPECT_NE(outs[2], outs[0]);
  EXPECT_NE(outs[2], outs[1]);
  EXPECT_EQ(outs[3], outs[0]);          // max_window_layers = num_layers: no layer is windowed
  const double per_key = 12.0 * 6 * 8;  // 12 * heads * head_dim per key of one layer
  EXPECT_DOUBLE_EQ(flops[0] - flops[1], per_key * 2 * (12 - 3));
  EXPECT_DOUBLE_EQ(flops[0] - flops[2], per_key * (12 - 3));
  EXPECT_DOUBLE_EQ(flops[3], flops[0]);
}

// The window travels to Hugging Face as Qwen2Config's use_sliding_window, sliding_window and
// max_window_layers, and a config that differs in them is named.
TEST_F(LlamaTest, Qwen2WindowIsExportedAndChecked) {
  Value o = tiny();
  o.set("head_dim", Value());
  o.set("num_heads", 4);
  o.set("qkv_bias", true);
  o.set("sliding_window", 4);
  o.set("max_window_layers", 1);
  const auto model = make(o);
  const auto* hf = dynamic_cast<const loom::HfModel*>(model.get());
  ASSERT_NE(hf, nullptr);
  Value config = hf->hf_config();
  EXPECT_EQ(config.find("model_type")->as_string(), "qwen2");
  EXPECT_TRUE(config.find("use_sliding_window")->as_bool());
  EXPECT_EQ(config.find("sliding_window")->as_int(), 4);
  EXPECT_EQ(config.find("max_window_layers")->as_int(), 1);
  EXPECT_TRUE(hf->hf_config_mismatches(config).empty());
  config.set("max_window_layers", 2);
  const auto mismatches = hf->hf_config_mismatches(config);
  ASSERT_EQ(mismatches.size(), 1u);
  EXPECT_NE(mismatches[0].find("max_window_layers"), std::string::npos) << mismatches[0];
  config.set("use_sliding_window", false);  // no window at all: the other keys are ignored
  EXPECT_EQ(hf->hf_config_mismatches(config).size(), 1u);

  Value mistral = o;
  mistral.set("qkv_bias", false);  // a window from layer 1 on without Qwen2's biases: no architecture
  EXPECT_THROW(dynamic_cast<const loom::HfModel*>(make(mistral).get())->hf_config(), loom::UserError);
}

TEST_F(LlamaTest, RopeScalingChangesTheModel) {
  // The same weights under different rope settings give different logits (the options are used).
  const Tensor tokens = ids(1, 12, 50, 5);
  std::vector<std::vector<float>> outs;
  for (const auto& r : {rope("default", 1.0), rope("default", 2.0), rope("llama3", 4.0)}) {
    Value o = tiny();
    o.set("rope", r);
    // llama3 with a short original context, so that the 8-wide heads' frequencies are rescaled.
    if (r.find("type")->as_string() == "llama3") {
      Value rr = r;
      rr.set("original_max_position_embeddings", 8);
      o.set("rope", rr);
    }
    const auto model = make(o);
    model->initialize(4);
    loom::Ops ops(*backend_);
    outs.push_back(model->logits(ops, tokens, Tensor()).to_vector());
  }
  EXPECT_NE(outs[0], outs[1]);
  EXPECT_NE(outs[0], outs[2]);
  EXPECT_NE(outs[1], outs[2]);
}

TEST_F(LlamaTest, BadOptionsAreUserErrors) {
  Value kv = tiny();
  kv.set("num_kv_heads", 4);  // does not divide 6
  EXPECT_THROW(make(kv), loom::UserError);
  Value odd = tiny();
  odd.set("head_dim", 7);
  EXPECT_THROW(make(odd), loom::UserError);
  Value indivisible = tiny();
  indivisible.set("head_dim", Value());  // 32 / 6
  EXPECT_THROW(make(indivisible), loom::UserError);
  Value freqs = tiny();
  Value r = rope("llama3", 8.0);
  r.set("low_freq_factor", 4.0);
  r.set("high_freq_factor", 4.0);
  freqs.set("rope", r);
  EXPECT_THROW(make(freqs), loom::UserError);
  Value window = tiny();
  window.set("sliding_window", 0);
  EXPECT_THROW(make(window), loom::UserError);
  Value layers_without_window = tiny();
  layers_without_window.set("max_window_layers", 1);
  EXPECT_THROW(make(layers_without_window), loom::UserError);

  const auto model = make(tiny());
  model->initialize(1);
  loom::Ops ops(*backend_);
  EXPECT_THROW(model->logits(ops, ids(1, 17, 50, 1), Tensor()), loom::UserError);
  EXPECT_THROW(model->logits(ops, ids(1, 8, 50, 1), ids(2, 8, 50, 1)), loom::UserError);  // segments shape
  auto cache = model->new_cache(2, 4);
  EXPECT_THROW(model->next_logits(ops, ids(1, 2, 50, 1), *cache), loom::UserError);  // batch differs
  EXPECT_THROW(model->next_logits(ops, ids(2, 5, 50, 1), *cache), loom::UserError);  // too long
}

// ---- Mixture of experts (moe) ----

Value moe(std::int64_t experts, std::int64_t k, const std::string& softmax, double aux, double z) {
  Value m = Value::map();
  m.set("num_experts", experts);
  m.set("experts_per_token", k);
  m.set("router_softmax", softmax);
  m.set("router_aux_loss_coef", aux);
  m.set("router_z_loss_coef", z);
  return m;
}

double metric(const loom::Model& model, const std::string& name) {
  for (const auto& [key, value] : model.metrics())
    if (key == name) return value;
  ADD_FAILURE() << "no metric " << name;
  return NAN;
}

TEST_F(LlamaTest, MixtureOfExpertsNamesSizesAndFlops) {
  Value o = tiny();
  o.set("moe", moe(4, 2, "after_top_k", 0.01, 0.0));
  const auto model = make(o);
  std::map<std::string, Shape> shapes;
  for (const auto& p : model->parameters()) shapes.emplace(p.parameter->name(), p.parameter->shape());
  EXPECT_EQ(shapes.at("layers.0.block_sparse_moe.gate.weight"), (Shape{4, 32}));
  EXPECT_EQ(shapes.at("layers.0.block_sparse_moe.experts.w1.weight"), (Shape{4 * 40, 32}));
  EXPECT_EQ(shapes.at("layers.1.block_sparse_moe.experts.w2.weight"), (Shape{4 * 32, 40}));
  EXPECT_EQ(shapes.count("layers.0.mlp.gate_proj.weight"), 0u);
  // Per layer: qkv (48 + 32) x 32, o 32 x 48, router 4 x 32, 4 experts of 3 x 40 x 32, two norms.
  const std::int64_t layer = 80 * 32 + 32 * 48 + 4 * 32 + 4 * 3 * 40 * 32 + 2 * 32;
  EXPECT_EQ(model->num_parameters(), 2 * 50 * 32 + 2 * layer + 32);
  // FLOPs count the 2 experts a token runs, and the router.
  Value dense = tiny();
  dense.set("intermediate_dim", 80);
  EXPECT_DOUBLE_EQ(model->flops_per_token(16), make(dense)->flops_per_token(16) + 6.0 * 2 * 4 * 32);
}

TEST_F(LlamaTest, RoutingEveryExpertIsTheDenseMixture) {
  // With experts_per_token = num_experts, both router modes weigh every expert by the full
  // softmax: the same function.
  Value a = tiny(), b = tiny();
  a.set("moe", moe(3, 3, "after_top_k", 0.0, 0.0));
  b.set("moe", moe(3, 3, "before_top_k", 0.0, 0.0));
  const auto ma = make(a), mb = make(b);
  ma->initialize(4);
  mb->initialize(4);
  loom::Ops ops(*backend_);
  const auto la = ma->logits(ops, ids(2, 9, 50, 1), Tensor()).to_vector();
  const auto lb = mb->logits(ops, ids(2, 9, 50, 1), Tensor()).to_vector();
  ASSERT_EQ(la.size(), lb.size());
  for (std::size_t i = 0; i < la.size(); ++i) EXPECT_NEAR(la[i], lb[i], 1e-5 * max_abs(la));
  // With 1 of 3, after_top_k gives the chosen expert weight 1, before_top_k its probability.
  a.set("moe", moe(3, 1, "after_top_k", 0.0, 0.0));
  b.set("moe", moe(3, 1, "before_top_k", 0.0, 0.0));
  const auto sa = make(a), sb = make(b);
  sa->initialize(4);
  sb->initialize(4);
  EXPECT_NE(sa->logits(ops, ids(2, 9, 50, 1), Tensor()).to_vector(),
            sb->logits(ops, ids(2, 9, 50, 1), Tensor()).to_vector());
}

TEST_F(LlamaTest, RouterLossesAreAddedWithTheirCoefficientsAndReported) {
  Value o = tiny();
  o.set("moe", moe(4, 2, "after_top_k", 0.0, 0.0));
  const auto plain = make(o);
  plain->initialize(5);
  o.set("moe", moe(4, 2, "after_top_k", 0.1, 0.01));
  const auto weighted = make(o);
  weighted->initialize(5);
  loom::Tape tape;
  loom::Ops ops(*backend_, &tape);
  const Tensor tokens = ids(2, 12, 50, 2), targets = ids(2, 12, 50, 3);
  const float base = plain->loss(ops, tokens, targets, Tensor()).item();
  tape.clear();
  const Tensor total = weighted->loss(ops, tokens, targets, Tensor());
  const double aux = metric(*weighted, "router_aux_loss"), z = metric(*weighted, "router_z_loss");
  EXPECT_NEAR(aux, 2.0, 0.5);  // experts * sum_e f_e P_e: k (= 2) when the load is balanced
  EXPECT_GT(z, 0.0);
  EXPECT_NEAR(total.item(), base + 0.1 * aux + 0.01 * z, 1e-5);
  EXPECT_DOUBLE_EQ(metric(*plain, "router_aux_loss"), aux);  // reported whatever the coefficient
  double load = 0;
  for (int e = 0; e < 4; ++e) load += metric(*weighted, "expert_load/" + std::to_string(e));
  EXPECT_NEAR(load, 1.0, 1e-12);  // dropless: every (token, choice) pair lands on an expert
  tape.backward(total);
  for (const auto& p : weighted->parameters()) EXPECT_TRUE(p.parameter->has_grad()) << p.parameter->name();
}

TEST_F(LlamaTest, MixtureOfExpertsCachedGenerationMatches) {
  Value o = tiny();
  o.set("moe", moe(4, 2, "before_top_k", 0.01, 0.0));
  const auto model = make(o);
  model->initialize(6);
  loom::Ops ops(*backend_);
  const Tensor tokens = ids(1, 10, 50, 4);
  const Tensor full = model->logits(ops, tokens, Tensor());
  auto cache = model->new_cache(1, 10);
  model->next_logits(ops, tokens.slice(1, 0, 4).clone(), *cache);
  for (std::int64_t t = 4; t < 10; ++t) {
    const auto got = model->next_logits(ops, tokens.slice(1, t, t + 1).clone(), *cache).to_vector();
    const auto want = full.select(1, t).clone().to_vector();
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4 * max_abs(want));
  }
}

TEST_F(LlamaTest, BadMixtureOptionsAreUserErrors) {
  Value o = tiny();
  o.set("moe", moe(2, 3, "after_top_k", 0.0, 0.0));
  try {
    make(o);
    FAIL() << "expected a UserError";
  } catch (const loom::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("experts_per_token (3) exceeds moe.num_experts (2)"), std::string::npos)
        << e.what();
  }
  o.set("moe", moe(2, 1, "after_top_k", 0.0, 0.0));
  o.set("use_bias", true);
  EXPECT_THROW(make(o), loom::UserError);
}

}  // namespace
