// loom's model families against Hugging Face transformers' own implementations
// (Qwen2ForCausalLM, Gemma2ForCausalLM, MixtralForCausalLM), in the Python environment of
// scripts/setup-python-env.sh (LOOM_REFERENCE_ENV_PYTHON).
//
// hf_agreement.py saves each transformers model with small random config and weights
// (save_pretrained) and its logits, loss and the gradient of every parameter on one batch. Here
// the directory is read by import_hf (the run layer's Hugging Face loader, so the parameter
// names are checked too) into loom's model, which runs the batch with every registered backend
// and attention kernel; logits, loss and every gradient (mapped through the model's
// HfTensorLayout) must agree to a relative error of 1e-4:
//   error(loom, transformers) = max |loom - transformers| / max |transformers|   (per tensor)
// The largest errors per case, backend and kernel are printed and recorded as test properties.
// Each model is also exported with export_hf: the same tensors under the same names as
// transformers' own save_pretrained, and the same architecture in config.json.
// Skips, saying why, when transformers cannot be imported.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "../core/reference_support.hpp"
#include "../core/test_support.hpp"
#include "loom/autograd.hpp"
#include "loom/core/config.hpp"
#include "loom/core/plugin_host.hpp"
#include "loom/core/registry.hpp"
#include "loom/hf_interop.hpp"
#include "loom/kinds/backend.hpp"
#include "loom/kinds/model.hpp"
#include "loom/run/hf_interop.hpp"
#include "loom/safetensors.hpp"

namespace loom {
namespace {

using test::float32_options;
using test::relative_error;

namespace fs = std::filesystem;
namespace st = safetensors;
constexpr double tolerance = 1e-4;

class HfAgreement : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::error_code ec;
    if (!fs::exists(LOOM_REFERENCE_ENV_PYTHON, ec)) {
      skip_reason_ = "transformers is not available: there is no Python environment at " +
                     std::string(LOOM_REFERENCE_ENV_PYTHON) + " (scripts/setup-python-env.sh makes it)";
      return;
    }
    work_ = std::make_unique<test::TempDir>();
    const auto r = test::run_command({LOOM_REFERENCE_ENV_PYTHON, LOOM_HF_AGREEMENT_SCRIPT, work_->path().string()});
    if (r.exit_code == 77) {
      skip_reason_ = r.err.substr(0, r.err.find('\n'));
      return;
    }
    python_output_ = r.out + r.err;
    python_ok_ = r.exit_code == 0;
  }
  static void TearDownTestSuite() {
    work_.reset();
    std::cout << summary_.str();
  }

  void SetUp() override {
    if (!skip_reason_.empty()) return loom::test::skip_missing_reference(skip_reason_);
    ASSERT_TRUE(python_ok_) << "hf_agreement.py failed:\n" << python_output_;
    PluginHost().load({{LOOM_PLUGIN_DIR, "test"}}, registry_);
  }

  // loom's export of the imported model: the same tensors, under the same names, as the
  // directory transformers saved, and a config.json with the same architecture.
  void check_export(Model& model, const std::string& name) {
    const fs::path out = work_->path() / (name + ".loom-export");
    export_hf(model, nullptr, out);
    const st::Reader ours(out / "model.safetensors"), theirs(work_->path() / name / "model.safetensors");
    std::set<std::string> our_names, their_names;
    for (const auto& t : ours.tensors()) our_names.insert(t.name);
    for (const auto& t : theirs.tensors()) their_names.insert(t.name);
    their_names.erase("lm_head.weight");  // tied: transformers saves it only where untied
    our_names.erase("lm_head.weight");
    EXPECT_GT(their_names.size(), 10u);
    EXPECT_EQ(our_names, their_names);
    for (const auto& n : their_names) {
      if (!ours.contains(n)) continue;  // named by the set comparison above
      EXPECT_EQ(ours.read(n).to_vector(), theirs.read(n).to_vector()) << n;
    }
    std::ifstream ours_config(out / "config.json"), their_config(work_->path() / name / "config.json");
    const auto a = nlohmann::json::parse(ours_config), b = nlohmann::json::parse(their_config);
    EXPECT_EQ(a["architectures"], b["architectures"]);
    EXPECT_EQ(a["model_type"], b["model_type"]);
    // Qwen2's sliding window travels in three keys.
    if (b["model_type"] == "qwen2") {
      EXPECT_EQ(a.value("use_sliding_window", false), b.value("use_sliding_window", false));
      if (b.value("use_sliding_window", false)) {
        EXPECT_EQ(a["sliding_window"], b["sliding_window"]);
        EXPECT_EQ(a["max_window_layers"], b["max_window_layers"]);
      }
    }
  }

  void check(const std::string& name) {
    const fs::path dir = work_->path();
    std::ifstream options_file(dir / (name + ".loom.json"));
    const Value options = config::load_string(
        std::string(std::istreambuf_iterator<char>(options_file), std::istreambuf_iterator<char>()), "case.json");
    const st::Reader expected(dir / (name + ".expected.safetensors"));
    const Tensor tokens = expected.read("tokens"), targets = expected.read("targets");
    for (const auto* backend_entry : registry_.list("backend")) {
      for (const auto* kernel_entry : registry_.list("attention")) {
        if (!test::host_attention_kernel(registry_, *kernel_entry)) continue;  // a device's kernel
        const std::string combo =
            name + " [backend " + backend_entry->decl.name + ", attention " + kernel_entry->decl.name + "]";
        SCOPED_TRACE(combo);
        auto backend = test::host_float32_backend(registry_, *backend_entry);
        if (!backend) continue;  // a device backend (or one whose device is not here)
        ASSERT_EQ(backend->matmul_dtype(), DType::f32);
        Value o = options;
        o.set("attention", kernel_entry->decl.name);
        auto model = registry_.create<Model>(ComponentRef{"model", o.find("type")->as_string(), o, "model"});
        model->build(ModelSetup{0});
        import_hf(*model, dir / name);
        // Once per case: with the first backend and the first host kernel.
        if (backend_entry == registry_.list("backend").front() &&
            kernel_entry->decl.name == registry_.attention_kernels_on(Device::host()).front())
          check_export(*model, name);

        Tape tape;
        Ops ops(*backend, &tape);
        const Tensor loss = model->loss(ops, tokens, targets, Tensor());
        const double loss_error = relative_error(loss, expected.read("loss"));
        tape.backward(loss);
        std::map<std::string, Parameter*> by_name;
        for (const auto& p : model->parameters()) by_name[p.parameter->name()] = p.parameter;
        auto* hf = dynamic_cast<HfModel*>(model.get());
        ASSERT_NE(hf, nullptr);
        double grad_error = 0;
        std::string worst;
        std::size_t compared = 0;
        for (const auto& t : hf->hf_tensors().tensors) {
          Parameter* p = by_name.at(t.parameter);
          ASSERT_TRUE(p->has_grad()) << p->name() << " got no gradient";
          ASSERT_TRUE(expected.contains("grad." + t.name)) << "transformers has no parameter " << t.name;
          const double e = relative_error(p->grad().slice(0, t.begin, t.end).clone(), expected.read("grad." + t.name));
          EXPECT_LE(e, tolerance) << "gradient of " << t.name;
          ++compared;
          if (e >= grad_error) {
            grad_error = e;
            worst = t.name;
          }
        }
        EXPECT_GT(compared, 0u);
        Ops eval(*backend);
        const double logits_error = relative_error(model->logits(eval, tokens, Tensor()), expected.read("logits"));
        EXPECT_LE(loss_error, tolerance) << "loss";
        EXPECT_LE(logits_error, tolerance) << "logits";
        std::ostringstream line;
        line << std::scientific << std::setprecision(2) << "agreement " << std::left << std::setw(48) << combo
             << " loss " << loss_error << "  logits " << logits_error << "  grads " << grad_error << " (" << worst
             << ")\n";
        summary_ << line.str();
        RecordProperty(backend_entry->decl.name + "_" + kernel_entry->decl.name + "_max_relative_error",
                       std::to_string(std::max({loss_error, logits_error, grad_error})));
      }
    }
  }

  Registry registry_;
  static inline std::unique_ptr<test::TempDir> work_;
  static inline std::string skip_reason_, python_output_;
  static inline bool python_ok_ = false;
  static inline std::ostringstream summary_;
};

TEST_F(HfAgreement, Qwen2) {
  check("qwen2");
}

// Qwen2's sliding window: on every layer (max_window_layers 0), and from layer 2 of 3 on.
TEST_F(HfAgreement, Qwen2SlidingWindow) {
  check("qwen2_window");
}

TEST_F(HfAgreement, Qwen2SlidingWindowFromMaxWindowLayers) {
  check("qwen2_window_layers");
}

TEST_F(HfAgreement, Gemma2) {
  check("gemma2");
}

// With output_router_logits: the loss includes router_aux_loss_coef times transformers'
// load-balancing loss, so the router's gradient checks it too.
TEST_F(HfAgreement, Mixtral) {
  check("mixtral");
}

}  // namespace
}  // namespace loom
