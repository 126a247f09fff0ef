// LoRA and freezing by pattern (docs/fine-tuning.md).
//
// Patterns: what a parameter-name pattern matches. Adapters: on gpt2 ([in, out] weights), llama
// (fused qkv, SwiGLU) and gemma (a GELU fused into the gate's product), the default targets are
// the attention and MLP projections, an adapted forward pass equals the base model with the
// adapters merged into its weights, and the adapters' gradients match finite differences; the
// same under activation checkpointing. Training: a LoRA run from a base run's weights learns,
// trains and saves the adapters alone (PEFT's files; optimizer state for nothing else), resumes
// exactly, and `loom generate`'s loader merges them. Freezing: frozen parameters keep their
// values and have no optimizer state; patterns that match nothing are errors naming them.
#include "loom/run/lora.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../core/test_support.hpp"
#include "loom/allocator.hpp"
#include "loom/core/runtime.hpp"
#include "loom/error.hpp"
#include "loom/run/generate.hpp"
#include "loom/run/hf_interop.hpp"
#include "loom/run/run_config.hpp"
#include "loom/run/trainer.hpp"
#include "loom/safetensors.hpp"
#include "train_test_support.hpp"

namespace fs = std::filesystem;

namespace loom {
namespace {

TEST(LoraPatterns, MatchWholeNamesAndDottedEnds) {
  EXPECT_TRUE(parameter_pattern_matches("c_attn", "h.0.attn.c_attn.weight"));
  EXPECT_TRUE(parameter_pattern_matches("attn.c_attn", "h.0.attn.c_attn.weight"));
  EXPECT_TRUE(parameter_pattern_matches("h.*.mlp.*", "h.3.mlp.c_fc.weight"));
  EXPECT_TRUE(parameter_pattern_matches("*.bias", "h.3.mlp.c_fc.bias"));
  EXPECT_TRUE(parameter_pattern_matches("ln_f", "ln_f.weight"));
  EXPECT_TRUE(parameter_pattern_matches("wte.weight", "wte.weight"));
  EXPECT_TRUE(parameter_pattern_matches("h.?.attn.c_proj", "h.1.attn.c_proj.weight"));
  EXPECT_FALSE(parameter_pattern_matches("attn", "h.0.attn.c_attn.weight"));  // a middle part
  EXPECT_FALSE(parameter_pattern_matches("c_at", "h.0.attn.c_attn.weight"));
  EXPECT_FALSE(parameter_pattern_matches("c_proj", "h.0.attn.c_attn.weight"));
  EXPECT_FALSE(parameter_pattern_matches("h.1*", "h.0.mlp.c_fc.weight"));
}

struct Lm {
  std::unique_ptr<Runtime> runtime;
  Handle<Backend> backend;
  Handle<Model> model;
};

// The cpu backend in float32 (matmul_precision: f32; its default computes the products in bf16
// where the CPU has AVX512-BF16): the tests below check identities that hold to float32 rounding
// (the adapted forward is the merged weights' forward) and gradients against finite differences.
Lm make_lm(const test::TempDir& dir, const std::string& model_yaml) {
  const auto file = dir.write("model.yaml", "model: " + model_yaml + "\nbackend: {type: cpu, matmul_precision: f32}\n");
  RuntimeOptions options;
  options.config = file;
  Lm lm;
  lm.runtime = std::make_unique<Runtime>(options);
  const Value config = resolved_run_config(*lm.runtime);
  lm.backend = lm.runtime->registry().create<Backend>(ComponentRef{"backend", "", *config.find("backend"), "backend"});
  lm.model = lm.runtime->registry().create<Model>(ComponentRef{"model", "", *config.find("model"), "model"});
  lm.model->build(ModelSetup{256});
  return lm;
}

const char* gpt2_yaml = "{type: gpt2, seq_len: 16, hidden_dim: 32, num_layers: 2, num_heads: 2, resid_pdrop: 0.0}";
const char* llama_yaml =
    "{type: llama, seq_len: 16, hidden_dim: 32, intermediate_dim: 48, num_layers: 2, num_heads: 4, num_kv_heads: 2, "
    "head_dim: null}";
const char* gemma_yaml =
    "{type: gemma, seq_len: 16, hidden_dim: 32, intermediate_dim: 48, num_layers: 2, num_heads: 4, num_kv_heads: 2, "
    "head_dim: 8, sliding_window: 8}";

Tensor tokens_of(std::int64_t batch, std::int64_t seq, int salt) {
  std::vector<std::int32_t> ids(static_cast<std::size_t>(batch * seq));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 37 + salt * 11 + 5) % 256);
  return Tensor::from(std::span<const std::int32_t>(ids), Shape{batch, seq});
}

// Fills every adapter with values (B too, which starts at zero) so that it changes the output.
void randomise(LoraAdapters& adapters) {
  int k = 0;
  for (const auto& p : adapters.parameters()) {
    Tensor t = Tensor::empty(p.parameter->shape());
    float* d = t.data<float>();
    for (std::int64_t i = 0; i < t.numel(); ++i) d[i] = 0.05f * std::sin(0.7f * static_cast<float>(i) + 1.3f * k);
    p.parameter->data().copy_from(t);
    ++k;
  }
}

double max_relative(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::abs(static_cast<double>(want[i])));
  }
  return diff / std::max(scale, 1e-30);
}

struct Case {
  const char* yaml;
  std::vector<std::string> expected_targets;  // some of them
};

class LoraModels : public ::testing::TestWithParam<Case> {};

TEST_P(LoraModels, AdaptedForwardEqualsMergedWeights) {
  test::TempDir dir;
  Lm lm = make_lm(dir, GetParam().yaml);
  LoraSettings settings;
  settings.rank = 4;
  settings.alpha = 8;
  LoraAdapters adapters(*lm.model, *lm.backend, settings);
  lm.model->initialize(7);
  adapters.initialize(7);
  const auto names = adapters.target_names();
  for (const auto& want : GetParam().expected_targets)
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want << " has no adapter";
  for (const auto& n : names) EXPECT_EQ(n.find("embed"), std::string::npos) << n;

  const Tensor tokens = tokens_of(2, 16, 1);
  auto logits = [&](bool adapted) {
    Tape tape;
    tape.set_enabled(false);
    Ops ops(*lm.backend, &tape);
    ops.set_training(false);
    if (adapted) ops.set_linear_adapters(&adapters.table());
    return lm.model->logits(ops, tokens, Tensor()).to_vector();
  };
  const auto base = logits(false);
  EXPECT_EQ(logits(true), base) << "B = 0: the adapted model starts as the base model";
  randomise(adapters);
  const auto adapted = logits(true);
  EXPECT_GT(max_relative(adapted, base), 1e-3) << "the adapters change the output";
  adapters.with_merged(*lm.backend, [&] {
    EXPECT_LE(max_relative(logits(false), adapted), 1e-5);
    return 0;
  });
  EXPECT_EQ(logits(false), base) << "with_merged puts the base weights back exactly";
}

INSTANTIATE_TEST_SUITE_P(Plugins, LoraModels,
                         ::testing::Values(Case{gpt2_yaml,
                                                {"h.0.attn.c_attn.weight", "h.0.attn.c_proj.weight",
                                                 "h.1.mlp.c_fc.weight", "h.1.mlp.c_proj.weight"}},
                                           Case{llama_yaml,
                                                {"layers.0.self_attn.qkv_proj.weight",
                                                 "layers.0.self_attn.o_proj.weight", "layers.1.mlp.gate_proj.weight",
                                                 "layers.1.mlp.up_proj.weight", "layers.1.mlp.down_proj.weight"}},
                                           Case{gemma_yaml,
                                                {"layers.0.self_attn.qkv_proj.weight",
                                                 "layers.0.self_attn.o_proj.weight", "layers.1.mlp.gate_proj.weight",
                                                 "layers.1.mlp.up_proj.weight", "layers.1.mlp.down_proj.weight"}}),
                         // The model family: the `type` the case's YAML names.
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const std::string yaml = info.param.yaml;
                           const std::size_t at = yaml.find("type: ") + 6;
                           return yaml.substr(at, yaml.find_first_of(",}", at) - at);
                         });

// d loss / d A and d loss / d B by the tape against central differences in double-checked f32,
// with and without activation checkpointing (the recomputation carries the adapters).
TEST(LoraGradients, MatchFiniteDifferences) {
  for (const char* remat : {"none", "save_dots"}) {
    SCOPED_TRACE(remat);
    test::TempDir dir;
    Lm lm = make_lm(dir, std::string("{type: gpt2, seq_len: 8, hidden_dim: 16, num_layers: 1, num_heads: 2, "
                                     "resid_pdrop: 0.0, embed_pdrop: 0.0, remat: ") +
                             remat + "}");
    LoraSettings settings;
    settings.rank = 2;
    settings.alpha = 4;
    LoraAdapters adapters(*lm.model, *lm.backend, settings);
    lm.model->initialize(3);
    randomise(adapters);
    for (const auto& p : lm.model->parameters()) p.parameter->set_requires_grad(false);
    const Tensor tokens = tokens_of(1, 8, 2), targets = tokens_of(1, 8, 3);
    auto loss = [&](bool record) {
      Tape tape;
      tape.set_enabled(record);
      Ops ops(*lm.backend, &tape);
      ops.set_linear_adapters(&adapters.table());
      Tensor l = lm.model->loss(ops, tokens, targets, Tensor());
      const double value = l.item();
      if (record) tape.backward(l);
      return value;
    };
    for (const auto& p : adapters.parameters()) p.parameter->zero_grad();
    loss(true);
    for (const auto& p : adapters.parameters()) {
      for (const auto& p2 : lm.model->parameters()) EXPECT_FALSE(p2.parameter->has_grad()) << "frozen base";
      ASSERT_TRUE(p.parameter->has_grad()) << p.parameter->name();
      const auto grad = p.parameter->grad().to_vector();
      Tensor value = p.parameter->data();
      for (std::int64_t i : {std::int64_t{0}, value.numel() / 2, value.numel() - 1}) {
        float* x = value.data<float>() + i;
        const float keep = *x, h = 1e-2f;
        *x = keep + h;
        const double up = loss(false);
        *x = keep - h;
        const double down = loss(false);
        *x = keep;
        const double numeric = (up - down) / (2 * h);
        EXPECT_NEAR(grad[static_cast<std::size_t>(i)], numeric, 2e-3 + 2e-2 * std::abs(numeric))
            << p.parameter->name() << "[" << i << "]";
      }
    }
  }
}

TEST(LoraAdapters, PatternThatMatchesNoLinearWeightIsAUserError) {
  test::TempDir dir;
  Lm lm = make_lm(dir, gpt2_yaml);
  LoraSettings settings;
  settings.rank = 4;
  settings.target_modules = {"c_attn", "q_proj"};
  try {
    LoraAdapters adapters(*lm.model, *lm.backend, settings);
    FAIL() << "no error";
  } catch (const UserError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("lora.target_modules: 'q_proj' matches no weight"), std::string::npos) << what;
    EXPECT_NE(what.find("h.0.attn.c_attn.weight"), std::string::npos) << what;
  }
  settings.target_modules = {"wte"};  // an embedding: not a target
  EXPECT_THROW(LoraAdapters(*lm.model, *lm.backend, settings), UserError);
}

// PEFT's module names on a llama, whose q, k and v share one fused weight: [q_proj, v_proj] gives
// the query rows and the value rows of each layer's qkv_proj an adapter each (PEFT's q_proj and
// v_proj adapters), the key rows none; lm_head adapts the untied output head, also inside the
// loss's fused cross-entropy. The adapted forward equals the merged weights', the merge leaves
// the key rows alone, and the gradients of every adapter match finite differences.
TEST(LoraPeftNames, QueryAndValueRowsOfTheFusedWeightAndTheOutputHead) {
  test::TempDir dir;
  Lm lm = make_lm(dir, llama_yaml);  // 4 query heads and 2 key/value heads of 8: q 32 rows, k 16, v 16
  LoraSettings settings;
  settings.rank = 2;
  settings.alpha = 4;
  settings.target_modules = {"q_proj", "v_proj", "lm_head"};
  LoraAdapters adapters(*lm.model, *lm.backend, settings);
  lm.model->initialize(5);
  EXPECT_EQ(adapters.target_names(),
            (std::vector<std::string>{"layers.0.self_attn.qkv_proj.weight (q_proj)",
                                      "layers.0.self_attn.qkv_proj.weight (v_proj)",
                                      "layers.1.self_attn.qkv_proj.weight (q_proj)",
                                      "layers.1.self_attn.qkv_proj.weight (v_proj)", "lm_head.weight"}));
  std::vector<std::string> names;
  for (const auto& p : adapters.parameters()) names.push_back(p.parameter->name() + " " + p.parameter->shape().str());
  EXPECT_EQ(names[0], "layers.0.self_attn.qkv_proj.q_proj.lora_A.weight [2, 32]");
  EXPECT_EQ(names[1], "layers.0.self_attn.qkv_proj.q_proj.lora_B.weight [32, 2]");
  EXPECT_EQ(names[3], "layers.0.self_attn.qkv_proj.v_proj.lora_B.weight [16, 2]");
  EXPECT_EQ(names[9], "lm_head.lora_B.weight [256, 2]");
  randomise(adapters);

  const Tensor tokens = tokens_of(2, 16, 1), targets = tokens_of(2, 16, 2);
  auto run = [&](bool adapted, bool record, double* loss) {
    Tape tape;
    tape.set_enabled(record);
    Ops ops(*lm.backend, &tape);
    ops.set_training(false);
    if (adapted) ops.set_linear_adapters(&adapters.table());
    const auto logits = lm.model->logits(ops, tokens, Tensor()).to_vector();
    Tensor l = lm.model->loss(ops, tokens, targets, Tensor());
    *loss = l.item();
    if (record) tape.backward(l);
    return logits;
  };
  double base_loss = 0, adapted_loss = 0, merged_loss = 0;
  const auto base = run(false, false, &base_loss);
  const auto adapted = run(true, false, &adapted_loss);
  EXPECT_GT(max_relative(adapted, base), 1e-3);
  // The loss's fused cross-entropy sees the adapted head as logits() does.
  double from_logits = 0;
  for (std::int64_t r = 0; r < 32; ++r) {
    const float* row = adapted.data() + r * 256;
    double m = -INFINITY, z = 0;
    for (int v = 0; v < 256; ++v) m = std::max(m, static_cast<double>(row[v]));
    for (int v = 0; v < 256; ++v) z += std::exp(row[v] - m);
    from_logits += (m + std::log(z) - row[targets.data<std::int32_t>()[r]]) / 32.0;
  }
  EXPECT_NEAR(adapted_loss, from_logits, 1e-5 * from_logits);
  const Parameter* qkv = nullptr;
  for (const auto& p : lm.model->parameters())
    if (p.parameter->name() == "layers.0.self_attn.qkv_proj.weight") qkv = p.parameter;
  ASSERT_NE(qkv, nullptr);
  const auto qkv_before = qkv->data().to_vector();
  adapters.with_merged(*lm.backend, [&] {
    EXPECT_LE(max_relative(run(false, false, &merged_loss), adapted), 1e-5);
    const auto qkv_merged = qkv->data().to_vector();
    for (std::size_t i = 0; i < qkv_merged.size(); ++i) {
      const std::size_t row = i / 32;
      if (row >= 32 && row < 48) {
        EXPECT_EQ(qkv_merged[i], qkv_before[i]) << "key row " << row;
      } else if (row < 32 && i % 32 == 0) {
        EXPECT_NE(qkv_merged[i], qkv_before[i]) << "query row " << row;
      }
    }
    return 0;
  });

  for (const auto& p : lm.model->parameters()) p.parameter->set_requires_grad(false);
  for (const auto& p : adapters.parameters()) p.parameter->zero_grad();
  double loss = 0;
  run(true, true, &loss);
  for (const auto& p : adapters.parameters()) {
    ASSERT_TRUE(p.parameter->has_grad()) << p.parameter->name();
    const auto grad = p.parameter->grad().to_vector();
    Tensor value = p.parameter->data();
    for (std::int64_t i : {std::int64_t{0}, value.numel() / 2, value.numel() - 1}) {
      float* x = value.data<float>() + i;
      const float keep = *x, h = 1e-2f;
      double up = 0, down = 0;
      *x = keep + h;
      run(true, false, &up);
      *x = keep - h;
      run(true, false, &down);
      *x = keep;
      const double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(grad[static_cast<std::size_t>(i)], numeric, 2e-3 + 2e-2 * std::abs(numeric))
          << p.parameter->name() << "[" << i << "]";
    }
  }
}

// Without target_modules every weight the loss multiplies is adapted, the output head not.
TEST(LoraPeftNames, TheDefaultLeavesTheOutputHeadAlone) {
  test::TempDir dir;
  Lm lm = make_lm(dir, llama_yaml);
  LoraSettings settings;
  settings.rank = 2;
  const auto names = LoraAdapters(*lm.model, *lm.backend, settings).target_names();
  EXPECT_EQ(names.size(), 10u);  // qkv, o, gate, up, down in each of 2 layers
  EXPECT_EQ(std::find(names.begin(), names.end(), "lm_head.weight"), names.end());
}

// lm_head on a model that ties its head to the embedding: the message says how to untie it.
TEST(LoraPeftNames, WhatCannotBeAdaptedIsAUserError) {
  test::TempDir dir;
  Lm lm = make_lm(dir, gpt2_yaml);
  LoraSettings settings;
  settings.rank = 2;
  settings.target_modules = {"lm_head"};
  try {
    LoraAdapters adapters(*lm.model, *lm.backend, settings);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("set model.tie_word_embeddings: false to adapt lm_head"), std::string::npos)
        << e.what();
  }
  settings.target_modules = {"lm_head"};
  test::TempDir dir2;
  Lm untied = make_lm(dir2,
                      "{type: gpt2, seq_len: 16, hidden_dim: 32, num_layers: 2, num_heads: 2, "
                      "tie_word_embeddings: false}");
  EXPECT_EQ(LoraAdapters(*untied.model, *untied.backend, settings).target_names(),
            std::vector<std::string>{"lm_head.weight"});
}

// ---- Training ----

const char* tiny_config = R"(
model: {type: gpt2, seq_len: 32, hidden_dim: 32, num_layers: 2, num_heads: 2, attention: flash}
tokenizer: byte
data: {type: synthetic, num_documents: 400}
optimizer: {type: adamw, learning_rate: 1.0e-2}
lr_schedule: {type: cosine, warmup: 2}
trainer:
  num_train_steps: 6
  train_batch_size: 4
  log_every: 1
  steps_per_eval: 0
  max_eval_batches: 2
  sample_length: 8
  peak_flops: 1.0e9
  trackers: [jsonl]
)";

using TinyRun = test::TrainedRun;

TinyRun train_tiny(const test::TempDir& dir, const std::string& name, std::vector<std::string> overrides) {
  return test::train_in(dir.write(name + ".yaml", tiny_config), dir.path() / name, std::move(overrides));
}

std::map<std::string, std::vector<float>> tensors_of(const fs::path& file) {
  safetensors::Reader reader(file);
  std::map<std::string, std::vector<float>> out;
  for (const auto& info : reader.tensors()) out[info.name] = reader.read(info.name).to_vector();
  return out;
}

class LoraTraining : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<test::TempDir>();
    train_tiny(*dir_, "base", {"trainer.num_train_steps=60"});
    // The fine-tuning data: text unlike the synthetic corpus the base learnt.
    std::string text;
    const std::vector<std::string> words = {"the",  "quick", "brown", "fox",   "jumps", "over", "the",
                                            "lazy", "dog",   "while", "seven", "cats",  "watch"};
    for (int repeat = 0; repeat < 40; ++repeat)
      for (std::size_t i = 0; i < words.size(); ++i) {
        for (std::size_t j = 0; j < words.size(); ++j) text += (j ? " " : "") + words[(i + j) % words.size()];
        text += ".\n";
      }
    dir_->write("text.txt", text);
  }
  static void TearDownTestSuite() { dir_.reset(); }
  static fs::path base() { return dir_->path() / "base"; }
  static std::vector<std::string> lora(std::vector<std::string> more = {}) {
    std::vector<std::string> o = {
        "trainer.init_from=" + base().string(),
        "data={type: text, paths: ['" + (dir_->path() / "text.txt").string() + "'], validation_fraction: 0.1}",
        "lora.rank=4",
        "lora.alpha=8",
        "lora.dropout=0.1",
        "trainer.num_train_steps=60"};
    o.insert(o.end(), more.begin(), more.end());
    return o;
  }
  static inline std::unique_ptr<test::TempDir> dir_;
};

TEST_F(LoraTraining, LearnsAndSavesTheAdaptersAlone) {
  const TinyRun run = train_tiny(*dir_, "lora", lora({"trainer.checkpoint.save_every_steps=30"}));
  EXPECT_NE(run.log.find("lora: 8 rank-4 adapters"), std::string::npos) << run.log;
  // The same run at a learning rate of zero: the base model on this data.
  const TinyRun still = train_tiny(*dir_, "still", lora({"optimizer.learning_rate=0"}));
  EXPECT_LT(run.summary.final_eval_loss, still.summary.final_eval_loss - 0.05)
      << "the evaluation loss falls: " << still.summary.final_eval_loss << " -> " << run.summary.final_eval_loss;

  // PEFT's files, and nothing of the base model.
  EXPECT_FALSE(fs::exists(run.dir / "model.safetensors"));
  const auto adapters = tensors_of(run.dir / "adapter_model.safetensors");
  ASSERT_EQ(adapters.size(), 16u);
  const auto& b = adapters.at("base_model.model.transformer.h.0.attn.c_attn.lora_B.weight");
  EXPECT_EQ(b.size(), 96u * 4u);
  EXPECT_GT(*std::max_element(b.begin(), b.end()), 0.0f) << "B trained away from zero";
  std::ifstream config_file(run.dir / "adapter_config.json");
  const auto config = nlohmann::json::parse(config_file);
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["r"], 4);
  EXPECT_EQ(config["lora_alpha"], 8.0);
  EXPECT_EQ(config["fan_in_fan_out"], true) << "GPT-2's Conv1D weights are [in, out]";
  EXPECT_EQ(config["base_model_name_or_path"], base().string());
  EXPECT_EQ(config["target_modules"].size(), 8u);

  // The checkpoint: the adapters and their optimizer state, nothing else.
  const fs::path ckpt = run.dir / "checkpoints" / "step-30";
  for (const auto& [name, v] : tensors_of(ckpt / "model.safetensors"))
    EXPECT_NE(name.find(".lora_"), std::string::npos) << name;
  const auto state = tensors_of(ckpt / "optimizer.safetensors");
  EXPECT_FALSE(state.empty());
  for (const auto& [name, v] : state) EXPECT_NE(name.find(".lora_"), std::string::npos) << name;

  // `loom generate`'s loader: the base with the adapters merged. For the [in, out] c_attn weight,
  // W = W_base + alpha / rank * A^T B^T.
  RuntimeOptions reload;
  reload.config = run.dir / "config.yaml";
  Runtime runtime(reload);
  LoadedRun loaded = load_run(runtime, run.dir);
  ASSERT_TRUE(loaded.lora);
  const auto base_weights = tensors_of(base() / "model.safetensors");
  const auto& w0 = base_weights.at("h.0.attn.c_attn.weight");
  const auto& a = adapters.at("base_model.model.transformer.h.0.attn.c_attn.lora_A.weight");
  std::vector<float> merged;
  for (const auto& p : loaded.model->parameters())
    if (p.parameter->name() == "h.0.attn.c_attn.weight") merged = p.parameter->data().to_vector();
  ASSERT_EQ(merged.size(), 32u * 96u);
  double worst = 0;
  for (int i = 0; i < 32; ++i)
    for (int o = 0; o < 96; ++o) {
      double delta = 0;
      for (int r = 0; r < 4; ++r) delta += static_cast<double>(a[r * 32 + i]) * b[o * 4 + r];
      worst = std::max(worst, std::abs(merged[i * 96 + o] - (w0[i * 96 + o] + 2.0 * delta)));
    }
  EXPECT_LT(worst, 1e-5);
  for (const auto& p : loaded.model->parameters())
    if (p.parameter->name() == "wte.weight") {
      EXPECT_EQ(p.parameter->data().to_vector(), base_weights.at("wte.weight"));
    }
}

// QLoRA: with the frozen base weights stored in bf16, int8 or nf4, the run says what they take,
// learns as the float32 base does (final evaluation loss within issue 22's 2%: evaluation reads
// the stored weights with the adapters, which cannot be merged into them), and saves the same
// files.
TEST_F(LoraTraining, QuantizedBaseLearnsLikeTheFloat32Base) {
  const TinyRun f32 = train_tiny(*dir_, "base-f32", lora());
  for (const std::string format : {"bf16", "int8", "nf4"}) {
    SCOPED_TRACE(format);
    const TinyRun run = train_tiny(*dir_, "base-" + format, lora({"lora.base_dtype=" + format}));
    EXPECT_NE(run.log.find("lora.base_dtype " + format + ": the frozen base weights take"), std::string::npos)
        << run.log;
    std::cout << "lora.base_dtype " << format << ": final eval loss " << run.summary.final_eval_loss << " (f32 "
              << f32.summary.final_eval_loss << ")\n";
    EXPECT_LT(std::abs(run.summary.final_eval_loss - f32.summary.final_eval_loss), 0.02 * f32.summary.final_eval_loss)
        << format << " " << run.summary.final_eval_loss << " against f32 " << f32.summary.final_eval_loss;
    EXPECT_TRUE(fs::exists(run.dir / "adapter_model.safetensors"));
    const TinyRun still =
        train_tiny(*dir_, "still-" + format, lora({"lora.base_dtype=" + format, "optimizer.learning_rate=0"}));
    EXPECT_LT(run.summary.final_eval_loss, still.summary.final_eval_loss - 0.05) << "it learns";
  }
}

// `loom export --merge-lora` of a GPT-2 LoRA run with an nf4 base ([in, out] weights: the
// adapters' A^T B^T added to the dequantized rows, a tensor at a time): the exported files, read
// back into a plain model, give the logits of the run's model (its nf4 base with the adapters in
// the products, as `loom generate` runs it).
TEST_F(LoraTraining, AQuantizedBaseExportsMergedAsTheRunComputesIt) {
  const TinyRun run = train_tiny(*dir_, "export-nf4", lora({"lora.base_dtype=nf4"}));
  auto open = [](const fs::path& dir) {
    RuntimeOptions options;
    options.config = dir / "config.yaml";
    options.overrides = {"backend.matmul_precision=f32"};  // the products exact to float32 rounding
    return std::make_unique<Runtime>(options);
  };
  const auto runtime = open(run.dir);
  LoadedRun loaded = load_run(*runtime, run.dir);
  ASSERT_TRUE(loaded.lora && loaded.lora->base_stored());
  HfExportOptions options;
  options.add_to_stored = [&](const Parameter& w, std::int64_t begin, std::int64_t end, float* rows) {
    loaded.lora->add_merged_rows(w, begin, end, rows);
  };
  export_hf(*loaded.model, nullptr, run.dir / "merged", options);
  const auto base_runtime = open(base());
  LoadedRun plain = load_run(*base_runtime, base());
  import_hf(*plain.model, run.dir / "merged");

  std::vector<std::int32_t> ids(32);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int32_t>((i * 37 + 5) % 200);
  const Tensor tokens = Tensor::from(std::span<const std::int32_t>(ids), Shape{1, 32});
  auto logits = [&](LoadedRun& r) {
    Tape tape;
    tape.set_enabled(false);
    Ops ops(*r.backend, &tape);
    ops.set_training(false);  // no dropout on the adapters' input
    return r.model->logits(ops, tokens, Tensor()).to_vector();
  };
  std::vector<float> run_logits;
  {
    const LinearAdaptersScope scope(&loaded.lora->table());
    run_logits = logits(loaded);
  }
  const std::vector<float> exported = logits(plain);
  ASSERT_EQ(run_logits.size(), exported.size());
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < exported.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(run_logits[i]) - exported[i]));
    scale = std::max(scale, std::abs(static_cast<double>(exported[i])));
  }
  EXPECT_LT(worst, 1e-4 * scale) << "the export is the run's model";
  // Without the adapters, the export would be the quantized base alone: far from the run's model.
  const std::vector<float> without = [&] { return logits(loaded); }();
  double apart = 0;
  for (std::size_t i = 0; i < exported.size(); ++i)
    apart = std::max(apart, std::abs(static_cast<double>(without[i]) - run_logits[i]));
  EXPECT_GT(apart, 4 * worst) << "the adapters change the logits more than the export's rounding";
}

TEST_F(LoraTraining, ResumesExactly) {
  const std::vector<std::string> every = {"trainer.checkpoint.save_every_steps=20",
                                          "trainer.checkpoint.keep_every_steps=20"};
  const TinyRun whole = train_tiny(*dir_, "whole", lora(every));
  const fs::path checkpoint = whole.dir / "checkpoints" / "step-20";
  auto from = every;
  from.push_back("trainer.resume=" + checkpoint.string());
  const TinyRun resumed = train_tiny(*dir_, "resumed", lora(from));
  EXPECT_EQ(resumed.summary.resumed_from_step, 20);
  EXPECT_EQ(resumed.summary.final_eval_loss, whole.summary.final_eval_loss);
  EXPECT_EQ(tensors_of(resumed.dir / "adapter_model.safetensors"), tensors_of(whole.dir / "adapter_model.safetensors"));
}

TEST_F(LoraTraining, FrozenParametersKeepTheirValuesAndHaveNoOptimizerState) {
  const TinyRun run = train_tiny(*dir_, "frozen",
                                 {"trainer.init_from=" + base().string(), "trainer.frozen=[wte, wpe, 'h.0.*']",
                                  "trainer.checkpoint.save_every_steps=3"});
  EXPECT_NE(run.log.find("frozen: 14 of 28 parameters"), std::string::npos) << run.log;
  const auto before = tensors_of(base() / "model.safetensors");
  const auto after = tensors_of(run.dir / "model.safetensors");
  ASSERT_EQ(after.size(), before.size()) << "the final weights hold every parameter";
  for (const auto& [name, v] : after) {
    const bool frozen = name.starts_with("wte.") || name.starts_with("wpe.") || name.starts_with("h.0.");
    if (frozen) {
      EXPECT_EQ(v, before.at(name)) << name;
    } else if (name.ends_with(".weight")) {
      EXPECT_NE(v, before.at(name)) << name;
    }
  }
  for (const auto& [name, v] : tensors_of(run.dir / "checkpoints" / "step-3" / "optimizer.safetensors"))
    EXPECT_TRUE(name.find("wte.") == std::string::npos && name.find("/h.0.") == std::string::npos) << name;

  // trainer.trainable: only those.
  const TinyRun only =
      train_tiny(*dir_, "trainable", {"trainer.init_from=" + base().string(), "trainer.trainable=[ln_f]"});
  for (const auto& [name, v] : tensors_of(only.dir / "model.safetensors"))
    if (!name.starts_with("ln_f.")) {
      EXPECT_EQ(v, before.at(name)) << name;
    }
}

TEST_F(LoraTraining, PatternsThatMatchNothingAreUserErrors) {
  try {
    train_tiny(*dir_, "bad", {"trainer.frozen=[wte, attn.q_proj]"});
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("trainer.frozen: 'attn.q_proj' matches no parameter"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(train_tiny(*dir_, "bad2", {"trainer.trainable=[nothing_here]"}), UserError);
  EXPECT_THROW(train_tiny(*dir_, "bad3", {"trainer.frozen=['*']"}), UserError);  // nothing left to train
  EXPECT_THROW(train_tiny(*dir_, "bad4", lora({"lora.target_modules=[c_attn, q_proj]"})), UserError);
  EXPECT_THROW(train_tiny(*dir_, "bad5", {"lora.target_modules=[c_attn]"}), UserError);  // rank 0
  EXPECT_THROW(train_tiny(*dir_, "bad6", lora({"trainer.trainable=[ln_f]"})), UserError);
}

// A quantized base needs adapters: lora.base_dtype with lora.rank 0 (LoRA off) would train the
// whole model in float32, so the run is refused before anything is built, saying what to set.
TEST(LoraConfig, AQuantizedBaseWithoutAdaptersIsRefused) {
  const test::TempDir dir;
  for (const std::string format : {"bf16", "int8", "nf4"}) {
    try {
      train_tiny(dir, "rank0-" + format, {"lora.base_dtype=" + format});
      FAIL() << format << ": trained without adapters";
    } catch (const UserError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("lora.base_dtype: " + format), std::string::npos) << what;
      EXPECT_NE(what.find("lora.rank is 0"), std::string::npos) << what;
      EXPECT_NE(what.find("set lora.rank"), std::string::npos) << what;
    }
    EXPECT_FALSE(fs::exists(dir.path() / ("rank0-" + format) / "config.yaml")) << "refused before the run directory";
  }
}

// configs/lora-gpt2.yaml, shortened: from a short quickstart run's weights, the adapters learn
// tiny Shakespeare (the evaluation loss falls).
TEST(LoraConfig, LoraGpt2Learns) {
  const fs::path data = LOOM_TINYSHAKESPEARE;  // configs/data/tinyshakespeare.txt, the config's own file
  test::TempDir dir;
  auto run = [&](const char* config, std::vector<std::string> overrides) {
    RuntimeOptions options;
    options.config = fs::path(LOOM_SOURCE_DIR) / "configs" / config;
    overrides.insert(overrides.end(),
                     {"trainer.sample_length=0", "trainer.trackers=[jsonl]", "trainer.peak_flops=1e9"});
    options.overrides = overrides;
    Runtime runtime(options);
    std::ostringstream out;
    TrainOptions train_options;
    train_options.out = &out;
    return train(runtime, train_options);
  };
  run("quickstart.yaml", {"trainer.run_dir=" + (dir.path() / "base").string(), "trainer.num_train_steps=60"});
  const std::vector<std::string> lora = {"trainer.init_from=" + (dir.path() / "base").string(),
                                         "data.paths=['" + data.string() + "']", "trainer.num_train_steps=60",
                                         "trainer.steps_per_eval=20"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), lora.begin(), lora.end());
    return more;
  };
  const TrainSummary summary = run("lora-gpt2.yaml", with({"trainer.run_dir=" + (dir.path() / "lora").string()}));
  // The base model on the same data: a LoRA run of one step at a learning rate of zero.
  const TrainSummary before = run("lora-gpt2.yaml", with({"trainer.run_dir=" + (dir.path() / "zero").string(),
                                                          "trainer.num_train_steps=1", "optimizer.learning_rate=0"}));
  std::cout << "lora-gpt2 (60 steps): eval loss " << before.final_eval_loss << " -> " << summary.final_eval_loss
            << "\n";
  EXPECT_LT(summary.final_eval_loss, before.final_eval_loss - 0.2);
  EXPECT_TRUE(fs::exists(dir.path() / "lora" / "adapter_model.safetensors"));
}

// LoRA with remat on every family (and a mixture of experts, and a quantized base): a run trains
// the same adapters under remat none, full and save_dots, bit for bit.
TEST(LoraRemat, EveryFamilyTrainsTheSameAdaptersUnderRemat) {
  const test::TempDir dir;
  const fs::path config = dir.write("tiny.yaml", tiny_config);
  const std::vector<std::pair<std::string, std::string>> models = {
      {"gpt2", "{type: gpt2, seq_len: 32, hidden_dim: 32, num_layers: 2, num_heads: 2, attention: flash}"},
      {"llama",
       "{type: llama, seq_len: 32, hidden_dim: 32, num_layers: 2, num_heads: 2, num_kv_heads: 1, intermediate_dim: "
       "64, attention: flash}"},
      {"mixtral",
       "{type: llama, seq_len: 32, hidden_dim: 32, num_layers: 2, num_heads: 2, num_kv_heads: 1, intermediate_dim: "
       "32, moe: {num_experts: 4, router_aux_loss_coef: 0.05, router_z_loss_coef: 0.01}, attention: flash}"},
      {"gemma",
       "{type: gemma, seq_len: 32, hidden_dim: 32, num_layers: 2, num_heads: 2, num_kv_heads: 1, head_dim: 16, "
       "intermediate_dim: 64, sliding_window: 8, attention: flash}"}};
  for (const auto& [name, model] : models)
    for (const std::string base : {"f32", "nf4"}) {
      SCOPED_TRACE(name + " " + base);
      std::map<std::string, TrainSummary> summaries;
      std::map<std::string, std::map<std::string, std::vector<float>>> adapters;
      for (const std::string remat : {"none", "full", "save_dots"}) {
        const test::TrainedRun run =
            test::train_in(config, dir.path() / (name + "-" + base + "-" + remat),
                           {"model=" + model, "model.remat=" + remat, "lora.rank=4", "lora.dropout=0.1",
                            "lora.base_dtype=" + base, "trainer.sample_length=0"});
        summaries[remat] = run.summary;
        adapters[remat] = tensors_of(run.dir / "adapter_model.safetensors");
      }
      for (const std::string remat : {"full", "save_dots"}) {
        EXPECT_EQ(summaries[remat].final_eval_loss, summaries["none"].final_eval_loss) << remat;
        EXPECT_EQ(adapters[remat], adapters["none"]) << remat;
      }
    }
}

// ---- QLoRA from a Hugging Face directory (trainer.init_from, issue 22 point 4)

std::int64_t proc_status_bytes(const char* key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(std::string(key).size())) * 1024;
  return 0;
}

const char* llama_config = R"(
model: {type: llama, seq_len: 16, hidden_dim: 1024, num_layers: 4, num_heads: 8, num_kv_heads: 4,
        intermediate_dim: 4096, tie_word_embeddings: false, attention: flash}
tokenizer: byte
data: {type: synthetic, num_documents: 200}
optimizer: {type: adamw, learning_rate: 1.0e-3}
lr_schedule: {type: cosine, warmup: 1}
trainer:
  num_train_steps: 2
  train_batch_size: 1
  log_every: 1
  steps_per_eval: 0
  max_eval_batches: 1
  sample_length: 0
  peak_flops: 1.0e9
  trackers: []
)";

// A llama's bf16 weights, sharded as save_pretrained shards them (q, k and v separate: loom fuses
// them into qkv_proj), read straight into nf4: the run equals the one whose base is the same
// weights read from a loom file in float32 and stored afterwards (the old path), and the float32
// values of the stored weights are never allocated: the process's peak resident memory grows by
// far less than the float32 model while the run loads and trains.
TEST(LoraStreamingLoad, HuggingFaceWeightsGoStraightIntoTheirFormat) {
  const test::TempDir dir;
  const fs::path config = dir.write("llama.yaml", llama_config);
  // The base: a run's initial weights, exported in bf16 in shards of 40 MB; and the same values
  // as a loom file (the bf16 values widened), for the old path.
  const test::TrainedRun base = test::train_in(config, dir.path() / "base", {"trainer.num_train_steps=1"});
  std::int64_t f32_weight_bytes = 0;
  {
    RuntimeOptions options;
    options.config = base.dir / "config.yaml";
    Runtime runtime(options);
    LoadedRun loaded = load_run(runtime, base.dir);
    HfExportOptions hf;
    hf.dtype = DType::bf16;
    hf.max_shard_bytes = 40'000'000;
    const HfExportResult exported = export_hf(*loaded.model, nullptr, dir.path() / "hf", hf);
    ASSERT_GT(exported.shards, 2);
    import_hf(*loaded.model, dir.path() / "hf");  // the bf16 values, widened
    std::vector<ModelParameter> params = loaded.model->parameters();
    safetensors::save_parameters(dir.path() / "widened.safetensors", params);
    for (const auto& p : params)
      if (p.parameter->shape().rank() == 2) f32_weight_bytes += p.parameter->shape().numel() * 4;
  }
  ASSERT_GT(f32_weight_bytes, std::int64_t{200} << 20);
  const std::vector<std::string> lora = {"lora.rank=4", "lora.base_dtype=nf4",
                                         "lora.target_modules=[q_proj, v_proj, down_proj]"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.end(), lora.begin(), lora.end());
    return more;
  };

  // What the run holds besides, then the peak from here on (clear_refs 5 resets VmHWM).
  allocator_release_cached();
  { std::ofstream("/proc/self/clear_refs") << "5"; }
  const std::int64_t before = proc_status_bytes("VmRSS:");
  const test::TrainedRun streamed =
      test::train_in(config, dir.path() / "streamed", with({"trainer.init_from=" + (dir.path() / "hf").string()}));
  const std::int64_t peak = proc_status_bytes("VmHWM:");
  ASSERT_GT(before, 0) << "/proc/self/status gives no VmRSS";
  std::cout << "loading and training from the Hugging Face directory: peak resident memory +"
            << (peak - before) / (1 << 20) << " MiB (the float32 weights: " << f32_weight_bytes / (1 << 20)
            << " MiB)\n";
  EXPECT_LT(peak - before, f32_weight_bytes / 3)
      << "peak resident memory grew by " << (peak - before) / (1 << 20) << " MiB while the float32 weights take "
      << f32_weight_bytes / (1 << 20) << " MiB\n"
      << streamed.log;
  EXPECT_NE(streamed.log.find("lora.base_dtype nf4: the frozen base weights take"), std::string::npos) << streamed.log;
  EXPECT_EQ(streamed.log.find("the float32 base before it is stored"), std::string::npos)
      << "no float32 loading peak: " << streamed.log;
  EXPECT_NE(streamed.log.find("(the stored base and the tensors being read into it)"), std::string::npos)
      << streamed.log;

  allocator_release_cached();
  const test::TrainedRun stored = test::train_in(
      config, dir.path() / "stored", with({"trainer.init_from=" + (dir.path() / "widened.safetensors").string()}));
  EXPECT_NE(stored.log.find("loading peak"), std::string::npos) << stored.log;
  EXPECT_EQ(streamed.summary.final_eval_loss, stored.summary.final_eval_loss);
  EXPECT_EQ(tensors_of(streamed.dir / "adapter_model.safetensors"),
            tensors_of(stored.dir / "adapter_model.safetensors"));
}

}  // namespace
}  // namespace loom
