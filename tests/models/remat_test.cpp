// model.remat: activation checkpointing per layer. For gpt2 (with dropout), llama (biases,
// qk-norm, GQA, packed documents; a mixture of experts with its auxiliary losses) and gemma, the loss and every
// gradient are bit-identical under none, full and save_dots, every parameter is announced to Tape::on_gradient_ready
// once its gradient is complete, and the memory held between the forward and the backward pass shrinks: full <
// save_dots < none.
#include <gtest/gtest.h>

#include <loom/allocator.hpp>
#include <loom/autograd.hpp>
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

struct StepResult {
  float loss = 0;
  std::vector<std::vector<float>> grads;
  std::size_t held = 0;  // allocator bytes in use after the forward pass, over those before it
};

class Remat : public ::testing::Test {
 protected:
  void SetUp() override {
    loom::PluginHost().load({{LOOM_PLUGIN_DIR, "test"}}, registry_);
    backend_ = registry_.create<loom::Backend>(loom::ComponentRef{"backend", "cpu", Value(), "backend"});
  }

  static Tensor ids(std::int64_t batch, std::int64_t seq, std::int32_t vocab, std::uint32_t salt) {
    std::vector<std::int32_t> v(static_cast<std::size_t>(batch * seq));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int32_t>((i * 7919u + salt * 104729u) % vocab);
    return Tensor::from(std::span<const std::int32_t>(v), Shape{batch, seq});
  }

  StepResult run(Value options, const std::string& remat, const Tensor& segments = Tensor()) {
    options.set("remat", remat);
    const std::string type = options.find("type")->as_string();
    auto model = registry_.create<loom::Model>(loom::ComponentRef{"model", type, options, "model"});
    model->build(loom::ModelSetup{0});
    model->initialize(7);
    loom::Tape tape;
    loom::Ops ops(*backend_, &tape);
    ops.set_dropout_seed(3, 11);
    const Tensor tokens = ids(2, 32, 64, 1), targets = ids(2, 32, 64, 2);
    const std::size_t before = loom::allocator_stats().bytes_in_use;
    const Tensor loss = model->loss(ops, tokens, targets, segments);
    StepResult r;
    r.held = loom::allocator_stats().bytes_in_use - before;
    r.loss = loss.item();
    // Each parameter is announced once, with its gradient complete (the data-parallel trainer
    // starts reducing it then): a checkpoint's node is the first use of its layer's parameters.
    std::map<const loom::Parameter*, std::vector<float>> announced;
    tape.on_gradient_ready([&](loom::Parameter& p) {
      EXPECT_TRUE(p.has_grad()) << p.name();
      EXPECT_TRUE(announced.emplace(&p, p.grad().to_vector()).second) << p.name() << " announced twice";
    });
    tape.backward(loss);
    for (const auto& p : model->parameters()) {
      const auto it = announced.find(p.parameter);
      EXPECT_NE(it, announced.end()) << p.parameter->name() << " never announced with remat " << remat;
      if (it == announced.end()) continue;
      EXPECT_EQ(it->second, p.parameter->grad().to_vector()) << p.parameter->name() << " changed after announced";
    }
    for (const auto& p : model->parameters()) {
      EXPECT_TRUE(p.parameter->has_grad()) << p.parameter->name() << " with remat " << remat;
      r.grads.push_back(p.parameter->grad().to_vector());
    }
    return r;
  }

  void check(const Value& options, const Tensor& segments = Tensor()) {
    const StepResult none = run(options, "none", segments);
    for (const char* policy : {"full", "save_dots"}) {
      SCOPED_TRACE(policy);
      const StepResult r = run(options, policy, segments);
      EXPECT_EQ(r.loss, none.loss);
      ASSERT_EQ(r.grads.size(), none.grads.size());
      for (std::size_t i = 0; i < r.grads.size(); ++i) EXPECT_EQ(r.grads[i], none.grads[i]) << "parameter " << i;
      EXPECT_LT(r.held, none.held);
    }
    EXPECT_LT(run(options, "full", segments).held, run(options, "save_dots", segments).held);
  }

  static Value shape(const std::string& type) {
    Value o = Value::map();
    o.set("type", type);
    o.set("seq_len", 32);
    o.set("hidden_dim", 64);
    o.set("num_layers", 3);
    o.set("num_heads", 4);
    o.set("vocab_size", 64);
    o.set("attention", "flash");
    return o;
  }

  loom::Registry registry_;
  loom::Handle<loom::Backend> backend_;
};

TEST_F(Remat, Gpt2WithDropoutIsBitIdentical) {
  Value o = shape("gpt2");
  o.set("embed_pdrop", 0.1);
  o.set("resid_pdrop", 0.1);
  check(o);
}

TEST_F(Remat, LlamaWithPackedDocumentsIsBitIdentical) {
  Value o = shape("llama");
  o.set("intermediate_dim", 96);
  o.set("num_kv_heads", 2);
  o.set("qkv_bias", true);
  o.set("use_qk_norm", true);
  std::vector<std::int32_t> seg(64);
  for (std::size_t i = 0; i < seg.size(); ++i) seg[i] = static_cast<std::int32_t>(i % 32 < 20 ? 0 : 1);
  check(o, Tensor::from(std::span<const std::int32_t>(seg), Shape{2, 32}));
}

TEST_F(Remat, GemmaIsBitIdentical) {
  Value o = shape("gemma");
  o.set("intermediate_dim", 96);
  o.set("num_kv_heads", 2);
  o.set("head_dim", 16);
  o.set("sliding_window", 8);
  check(o);
}

// A mixture of experts: the routers' auxiliary losses (load balancing and z-loss) reach the
// router weights through the recomputed layers (the segment returns the router logits).
TEST_F(Remat, MixtureOfExpertsIsBitIdentical) {
  Value o = shape("llama");
  o.set("num_kv_heads", 2);
  o.set("intermediate_dim", 48);
  Value moe = Value::map();
  moe.set("num_experts", 4);
  moe.set("router_aux_loss_coef", 0.05);
  moe.set("router_z_loss_coef", 0.01);
  o.set("moe", moe);
  check(o);
}

}  // namespace
