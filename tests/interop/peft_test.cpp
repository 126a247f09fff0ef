// LoRA adapters against Hugging Face PEFT (docs/fine-tuning.md). For a gpt2 ([in, out] Conv1D
// weights: fan_in_fan_out), a llama (a fused qkv_proj that PEFT sees as q_proj, k_proj and
// v_proj), and a llama with PEFT's own target_modules [q_proj, v_proj] (adapters on rows of the
// fused weight), with and without lm_head, and a llama with an nf4 base (lora.base_dtype: PEFT reads the
// adapters over the run's stored base dequantized, and not over the float32 base it came from): a base run is exported
// with `loom export`, a LoRA run from its weights exports its adapters (PEFT's files) and, with --merge-lora, the
// merged model. peft_reference.py (in the Python environment of scripts/setup-python-env.sh with peft added, or
// LOOM_PEFT_PYTHON) loads base + adapters with peft.PeftModel.from_pretrained, and the merged model with transformers.
// Their logits must agree with loom's adapted model (Ops with the adapters) and loom's merged model to a relative error
// of 1e-4:
//   error = max |loom - reference| / max |reference|
// The test skips, saying why, where peft is not installed.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../core/reference_support.hpp"
#include "../core/test_support.hpp"
#include "loom/autograd.hpp"
#include "loom/core/runtime.hpp"
#include "loom/run/generate.hpp"
#include "loom/run/hf_interop.hpp"
#include "loom/run/lora.hpp"
#include "loom/run/trainer.hpp"
#include "loom/safetensors.hpp"

namespace fs = std::filesystem;

namespace loom {
namespace {

using test::relative_error;

constexpr double tolerance = 1e-4;

void train_in(const fs::path& yaml, const fs::path& run_dir, std::vector<std::string> overrides) {
  RuntimeOptions options;
  options.config = yaml;
  options.plugin_paths = {LOOM_PLUGIN_DIR};
  options.default_plugin_path = false;
  overrides.push_back("trainer.run_dir=" + run_dir.string());
  options.overrides = overrides;
  Runtime runtime(options);
  std::ostringstream log;
  TrainOptions train_options;
  train_options.out = &log;
  train(runtime, train_options);
}

void export_run(const fs::path& run, const fs::path& out, bool merge) {
  std::vector<std::string> command = {LOOM_BINARY, "export", run.string(), "--format", "hf", out.string()};
  if (merge) command.push_back("--merge-lora");
  const auto r = test::run_command(command);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
}

struct Case {
  std::string name;
  std::string model;
  std::vector<std::string> lora = {};  // more lora.* overrides
  int lora_modules = 0;                // the LoRA modules PEFT builds (0: not checked)
  bool quantized_base = false;         // lora.base_dtype is not f32: PEFT reads the dequantized base
};

class Peft : public ::testing::TestWithParam<Case> {};

TEST_P(Peft, AdaptersAgreeWithPeft) {
  std::error_code ec;
  if (!fs::exists(LOOM_PEFT_PYTHON, ec))
    return loom::test::skip_missing_reference(
        std::string("peft is not available: there is no Python environment at ") + LOOM_PEFT_PYTHON +
        " (scripts/setup-python-env.sh makes it; set LOOM_PEFT_PYTHON to one with peft)");
  test::TempDir work;
  const fs::path dir = work.path() / GetParam().name;
  fs::create_directories(dir);
  // float32 products (the cpu backend's default is bf16 where the CPU has AVX512-BF16): the
  // logits are compared with PEFT's float32 ones.
  const auto yaml = work.write("run.yaml", "model: " + GetParam().model + R"(
backend: {type: cpu, matmul_precision: f32}
tokenizer: byte
data: {type: synthetic, num_documents: 100}
optimizer: {type: adamw, learning_rate: 1.0e-2}
lr_schedule: constant
trainer: {num_train_steps: 3, train_batch_size: 2, max_eval_batches: 0, sample_length: 0, trackers: [],
          peak_flops: 1.0e9}
)");
  train_in(yaml, work.path() / "base_run", {});
  // With a quantized base, PEFT's base is the one the run trained over: the stored weights
  // dequantized (the run's model loaded without merging, written with export_hf), and the
  // float32 base it was quantized from goes beside it, to show that it would not do.
  const bool quantized = GetParam().quantized_base;
  export_run(work.path() / "base_run", dir / (quantized ? "base_f32" : "base"), false);
  std::vector<std::string> lora = {"trainer.init_from=" + (work.path() / "base_run").string(), "lora.rank=4",
                                   "lora.alpha=8", "trainer.num_train_steps=6"};
  lora.insert(lora.end(), GetParam().lora.begin(), GetParam().lora.end());
  train_in(yaml, work.path() / "lora_run", lora);
  export_run(work.path() / "lora_run", dir / "adapters", false);
  export_run(work.path() / "lora_run", dir / "merged", true);
  if (quantized) {
    RuntimeOptions reload;
    reload.config = work.path() / "lora_run" / "config.yaml";
    reload.plugin_paths = {LOOM_PLUGIN_DIR};
    reload.default_plugin_path = false;
    Runtime runtime(reload);
    LoadedRun run = load_run(runtime, work.path() / "lora_run", /*merge_lora=*/false);
    ASSERT_TRUE(run.lora && run.lora->base_stored());
    export_hf(*run.model, run.tokenizer.get(), dir / "base");
  }

  std::vector<std::int32_t> ids(2 * 12);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 29 + 7) % 256);
  const Tensor tokens = Tensor::from(std::span<const std::int32_t>(ids), Shape{2, 12});
  safetensors::save(dir / "tokens.safetensors", std::vector<std::pair<std::string, Tensor>>{{"tokens", tokens}});

  const auto r = test::run_command({LOOM_PEFT_PYTHON, LOOM_PEFT_REFERENCE_SCRIPT, work.path().string()});
  if (r.exit_code == 77) return loom::test::skip_missing_reference(r.err.substr(0, r.err.find('\n')));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::ifstream report_file(dir / "peft.json");
  const auto report = nlohmann::json::parse(report_file);
  EXPECT_TRUE(report["reached"].get<bool>()) << r.err;
  EXPECT_EQ(report["lora_modules"].get<int>() * 2, report["tensors"].get<int>());
  if (GetParam().lora_modules > 0) {
    EXPECT_EQ(report["lora_modules"].get<int>(), GetParam().lora_modules);
  }
  const safetensors::Reader reference(dir / "peft.safetensors");

  auto logits = [&](bool merge) {
    RuntimeOptions reload;
    reload.config = work.path() / "lora_run" / "config.yaml";
    reload.plugin_paths = {LOOM_PLUGIN_DIR};
    reload.default_plugin_path = false;
    Runtime runtime(reload);
    LoadedRun run = load_run(runtime, work.path() / "lora_run", merge);
    Tape tape;
    tape.set_enabled(false);
    Ops ops(*run.backend, &tape);
    ops.set_training(false);
    // A stored base has no float32 weights to merge into: the adapters apply in the products.
    if (!merge || run.lora->base_stored()) ops.set_linear_adapters(&run.lora->table());
    return run.model->logits(ops, tokens, Tensor()).to_vector();
  };
  const std::vector<float> loom_adapted = logits(false);
  EXPECT_GT(relative_error(loom_adapted, reference.read("base_logits")), 1e-3) << "the adapters change the logits";
  const double adapted = relative_error(loom_adapted, reference.read("peft_logits"));
  const double merged = relative_error(logits(true), reference.read("merged_logits"));
  std::cout << std::scientific << std::setprecision(2) << "peft " << GetParam().name
            << ": loom adapted vs PEFT logits relative error " << adapted << ", loom merged vs transformers (merged "
            << "export) " << merged << "\n";
  RecordProperty("adapted_vs_peft", std::to_string(adapted));
  RecordProperty("merged_vs_transformers", std::to_string(merged));
  EXPECT_LE(adapted, tolerance);
  EXPECT_LE(merged, tolerance);
  if (quantized) {
    const double over_f32 = relative_error(loom_adapted, reference.read("peft_f32_base_logits"));
    std::cout << "peft " << GetParam().name << ": loom adapted vs PEFT over the float32 base (not the run's) "
              << over_f32 << "\n";
    RecordProperty("adapted_vs_peft_over_f32_base", std::to_string(over_f32));
    EXPECT_GT(over_f32, 100 * tolerance) << "the quantized base's rounding shows in the logits";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, Peft,
    ::testing::Values(Case{"gpt2", "{type: gpt2, seq_len: 16, hidden_dim: 32, num_layers: 2, num_heads: 4}"},
                      Case{"llama",
                           "{type: llama, seq_len: 16, hidden_dim: 32, intermediate_dim: 48, num_layers: 2, "
                           "num_heads: 4, num_kv_heads: 2}"},
                      // PEFT's usual Llama recipe: the query and value rows of the fused qkv_proj,
                      // each its own adapter; and the untied output head.
                      Case{"llama_q_v",
                           "{type: llama, seq_len: 16, hidden_dim: 32, intermediate_dim: 48, num_layers: 2, "
                           "num_heads: 4, num_kv_heads: 2}",
                           {"lora.target_modules=[q_proj, v_proj]"},
                           4},
                      Case{"llama_q_v_lm_head",
                           "{type: llama, seq_len: 16, hidden_dim: 32, intermediate_dim: 48, num_layers: 2, "
                           "num_heads: 4, num_kv_heads: 2}",
                           {"lora.target_modules=[q_proj, v_proj, lm_head]"},
                           5},
                      // issue 22: a QLoRA run's adapter files over its dequantized nf4 base.
                      Case{"llama_nf4",
                           "{type: llama, seq_len: 16, hidden_dim: 32, intermediate_dim: 48, num_layers: 2, "
                           "num_heads: 4, num_kv_heads: 2}",
                           {"lora.base_dtype=nf4"},
                           0,
                           true}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace loom
