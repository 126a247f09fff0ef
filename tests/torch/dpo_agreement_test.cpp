// loom's `dpo` objective against a hand-written PyTorch DPO loss (reference_dpo.py) on a tiny
// GPT-2: the loss, its metrics and the gradient of every policy parameter, with every backend and
// attention kernel, within a relative error of 1e-4 (max |loom - torch| / max |torch| per tensor).
// The same batch cut into micro-batches, each weighted by its share of the pairs as the trainer
// weighs them (Objective::count), gives the same loss and gradients; and Model::token_losses'
// default (the logits and Ops::cross_entropy with Reduction::none) agrees with the model's own
// (Ops::linear_cross_entropy with Reduction::none).
//
// Skips, saying why, when /usr/bin/python3 cannot import torch (Debian's python3-torch).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <loom/autograd.hpp>
#include <loom/core/plugin_host.hpp>
#include <loom/core/registry.hpp>
#include <loom/kinds/model.hpp>
#include <loom/kinds/objective.hpp>
#include <loom/safetensors.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../core/reference_support.hpp"

namespace {

namespace fs = std::filesystem;
namespace st = loom::safetensors;
using loom::Tensor;
using loom::Value;
using loom::test::float32_options;
using loom::test::relative_error;

constexpr double tolerance = 1e-4;

Value model_options(const st::Reader& weights) {
  const auto j = nlohmann::json::parse(weights.metadata().at("model"));
  Value v = Value::map();
  for (const auto& [k, e] : j.items()) {
    if (e.is_string())
      v.set(k, Value(e.get<std::string>()));
    else if (e.is_number_integer())
      v.set(k, Value(e.get<std::int64_t>()));
  }
  return v;
}

class DpoAgreement : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    reference_.generate(LOOM_SOURCE_DIR "/tests/torch/reference_dpo.py", "loom_dpo_agreement",
                        "compare loom's DPO loss with PyTorch");
  }
  static void TearDownTestSuite() {
    reference_.remove();
    std::cout << summary_.str();
  }

  void SetUp() override {
    if (!reference_.skip_reason().empty()) return loom::test::skip_missing_reference(reference_.skip_reason());
    ASSERT_TRUE(reference_.generated()) << "tests/torch/reference_dpo.py failed";
    loom::PluginHost().load({{LOOM_PLUGIN_DIR, "test"}}, registry_);
    ASSERT_TRUE(registry_.find("objective", "dpo")) << "the dpo objective is not built in " << LOOM_PLUGIN_DIR;
  }

  loom::Handle<loom::Model> model(const Value& options, const fs::path& weights, bool frozen) {
    auto m = registry_.create<loom::Model>(loom::ComponentRef{"model", "gpt2", options, "model"});
    m->build(loom::ModelSetup{0});
    st::load_parameters(weights, m->parameters());
    if (frozen)
      for (auto& p : m->parameters()) p.parameter->set_requires_grad(false);
    return m;
  }

  // The largest relative error of the policy's gradients against torch's.
  double grad_error(loom::Model& policy, const st::Reader& data, std::string* worst = nullptr) {
    double e_max = 0;
    for (const auto& p : policy.parameters()) {
      EXPECT_TRUE(p.parameter->has_grad()) << p.parameter->name() << " got no gradient";
      if (!p.parameter->has_grad()) return INFINITY;
      const double e = relative_error(p.parameter->grad(), data.read("grad." + p.parameter->name()));
      EXPECT_LE(e, tolerance) << "gradient of " << p.parameter->name();
      if (e >= e_max) {
        e_max = e;
        if (worst) *worst = p.parameter->name();
      }
    }
    return e_max;
  }

  loom::Registry registry_;
  static inline loom::test::TorchReference reference_;
  static inline std::ostringstream summary_;
};

TEST_F(DpoAgreement, LossMetricsAndGradientsMatchPyTorch) {
  const st::Reader data(reference_.dir() / "dpo.data.safetensors");
  const st::Reader weights(reference_.dir() / "dpo.weights.safetensors");
  const Value base = model_options(weights);
  Value objective_options = Value::map();
  objective_options.set("type", Value("dpo"));
  objective_options.set("beta", Value(std::stod(weights.metadata().at("beta"))));
  objective_options.set("label_smoothing", Value(std::stod(weights.metadata().at("label_smoothing"))));
  const Tensor tokens = data.read("input.tokens"), targets = data.read("input.targets");
  const double expected_loss = data.read("expected.loss").item();
  const auto expected_metrics = data.read("expected.metrics").to_vector();
  const std::int64_t rows = tokens.size(0), seq = tokens.size(1);

  for (const auto* backend_entry : registry_.list("backend")) {
    for (const auto* kernel_entry : registry_.list("attention")) {
      if (!loom::test::host_attention_kernel(registry_, *kernel_entry)) continue;  // a device's kernel
      const std::string combo =
          "dpo [backend " + backend_entry->decl.name + ", attention " + kernel_entry->decl.name + "]";
      SCOPED_TRACE(combo);
      auto backend = loom::test::host_float32_backend(registry_, *backend_entry);
      if (!backend) continue;  // a device backend (or one whose device is not here)
      ASSERT_EQ(backend->matmul_dtype(), loom::DType::f32);
      Value options = base;
      options.set("attention", kernel_entry->decl.name);
      auto policy = model(options, weights.path(), false);
      auto reference = model(options, reference_.dir() / "dpo.reference.safetensors", true);
      auto objective =
          registry_.create<loom::Objective>(loom::ComponentRef{"objective", "dpo", objective_options, "objective"});
      const loom::ObjectiveModels models{*policy, reference.get()};

      // The whole batch at once.
      loom::Tensor seed;
      double loss_error = 0, metric_error = 0;
      {
        loom::Tape tape;
        loom::Ops ops(*backend, &tape);
        loom::ObjectiveLoss loss = objective->loss(ops, models, loom::ObjectiveBatch{tokens, targets, {}});
        loss_error = std::abs(loss.value - expected_loss) / std::abs(expected_loss);
        ASSERT_EQ(loss.metrics.size(), expected_metrics.size());
        for (std::size_t i = 0; i < expected_metrics.size(); ++i)
          metric_error = std::max(metric_error, std::abs(loss.metrics[i] - expected_metrics[i]) /
                                                    std::max(1.0, std::abs(static_cast<double>(expected_metrics[i]))));
        ASSERT_TRUE(loss.gradient.defined());
        seed = loss.gradient.clone();
        tape.backward(loss.output, std::move(loss.gradient));
      }
      EXPECT_LE(loss_error, tolerance) << "loss";
      EXPECT_LE(metric_error, tolerance) << "metrics";
      std::string worst;
      const double whole = grad_error(*policy, data, &worst);

      // Micro-batches of one pair and two pairs, weighted by their share of the pairs.
      for (auto& p : policy->parameters()) p.parameter->zero_grad();
      const std::int64_t total = objective->count(targets.to_int_vector(), seq);
      ASSERT_EQ(total, rows / 2);
      double accumulated = 0;
      for (const auto& [begin, end] : {std::pair<std::int64_t, std::int64_t>{0, 2}, {2, rows}}) {
        const Tensor t = targets.slice(0, begin, end).clone(), k = tokens.slice(0, begin, end).clone();
        const double weight =
            static_cast<double>(objective->count(t.to_int_vector(), seq)) / static_cast<double>(total);
        loom::Tape tape;
        loom::Ops ops(*backend, &tape);
        loom::ObjectiveLoss loss = objective->loss(ops, models, loom::ObjectiveBatch{k, t, {}});
        accumulated += loss.value * weight;
        float* g = loss.gradient.data<float>();
        for (std::int64_t i = 0; i < loss.gradient.numel(); ++i) g[i] = static_cast<float>(g[i] * weight);
        tape.backward(loss.output, std::move(loss.gradient));
      }
      EXPECT_LE(std::abs(accumulated - expected_loss) / std::abs(expected_loss), tolerance) << "micro-batched loss";
      const double micro = grad_error(*policy, data);

      // Model::token_losses' default (logits + cross_entropy, Reduction::none) with the same seed.
      for (auto& p : policy->parameters()) p.parameter->zero_grad();
      double fallback = 0;
      {
        loom::Tape tape;
        loom::Ops ops(*backend, &tape);
        const Tensor losses = policy->loom::Model::token_losses(ops, tokens, targets, {});
        const Tensor own = [&] {
          loom::Ops plain(*backend);
          return policy->token_losses(plain, tokens, targets, {});
        }();
        EXPECT_LE(relative_error(losses, own), tolerance) << "token losses: logits path against the fused one";
        tape.backward(losses, seed);
        fallback = grad_error(*policy, data);
      }

      std::ostringstream line;
      line << std::scientific << std::setprecision(2) << "agreement " << std::left << std::setw(48) << combo << " loss "
           << loss_error << "  metrics " << metric_error << "  grads " << whole << " (" << worst
           << ")  micro-batched grads " << micro << "  logits-path grads " << fallback << "\n";
      summary_ << line.str();
    }
  }
}

}  // namespace
