// Tensor parallelism as a user runs it: `mpirun -np N loom train ... trainer.mesh.tensor=T`
// against one process on the same global batch (the point 5): losses and final weights
// within 1e-5 relative over 20 steps in float32 products, for every built-in family, with remat
// on and off; checkpoints written under one tensor size resume under another (point 6), export
// whole tensors and generate from them. The members of a tensor group sum their partial products
// in another order than one process's whole matrix products: float32 rounding, not bits.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "distributed_test_support.hpp"

namespace {

namespace fs = std::filesystem;
using namespace loom::test::distributed;
using loom::test::run_command;

std::string config(const std::string& name) {
  return std::string(LOOM_SOURCE_DIR) + "/configs/" + name;
}

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A run of `config_file` with the test's defaults, then `extra`.
std::vector<std::string> tp_args(const fs::path& run_dir, const std::string& config_file, std::int64_t micro,
                                 const std::vector<std::string>& extra) {
  std::vector<std::string> args = train_args(run_dir, micro);
  args[2] = config_file;
  args.pop_back();  // model.num_layers=2: the quickstart's; the cases say their own
  args.insert(args.end(), {kFloat32Products, "trainer.checkpoint.save_every_minutes=0"});
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

constexpr double kRelative = 1e-5;
// Adaptive optimizers (AdamW, Muon, Adafactor, Lion) normalise each update: an entry whose
// gradient is zero in exact arithmetic (gpt2's key biases: the softmax ignores a shift shared by
// every key) gets its rounding noise turned into full-size steps, differently in any other
// summation order, so their final weights are held to a looser bound; the losses to kRelative.
// The runs without an optimizer of their own train with SGD and momentum (the updates scale
// with the gradients): their weights are held to kRelative.
constexpr double kAdaptive = 5e-3;
const std::vector<std::string> kSgd{"optimizer.type=sgd", "optimizer.momentum=0.9", "optimizer.learning_rate=0.05"};

// SGD unless the overrides or the config name an optimizer.
std::vector<std::string> with_optimizer(const std::string& config_file, std::vector<std::string> overrides) {
  for (const auto& o : overrides)
    if (o.starts_with("optimizer.")) return overrides;
  if (config_file.ends_with("sft-tiny.yaml") || config_file.ends_with("dpo-tiny.yaml")) return overrides;
  overrides.insert(overrides.begin(), kSgd.begin(), kSgd.end());
  return overrides;
}

void expect_close_losses(const fs::path& expected_dir, const fs::path& got_dir) {
  const auto expected = losses(expected_dir), got = losses(got_dir);
  ASSERT_EQ(expected.size(), 20u);
  ASSERT_EQ(got.size(), 20u);
  for (std::size_t i = 0; i < expected.size(); ++i)
    EXPECT_NEAR(got[i], expected[i], kRelative * std::abs(expected[i])) << "step " << i + 1;
}

struct Case {
  std::string name;
  std::string config;
  std::vector<std::string> model;  // overrides of both runs
  int ranks = 2;
  std::vector<std::string> mesh;  // the parallel run's
  double weights = kRelative;     // the final weights' bound
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

const std::vector<std::string> kTwoLayers{"model.num_layers=2"};
// 8 heads over 4 key/value heads (GQA); a short context keeps the test quick.
const std::vector<std::string> kLlama{"data.type=synthetic", "model.seq_len=64", "model.num_layers=2"};
const std::vector<std::string> kRemat{"model.remat=full"};
const std::vector<std::string> kTensor2{"trainer.mesh.tensor=2"};
const std::vector<std::string> kTensor4{"trainer.mesh.tensor=4"};
const std::vector<std::string> kData2Tensor2{"trainer.mesh.data=2", "trainer.mesh.tensor=2"};
const std::vector<std::string> kFsdp2Tensor2{"trainer.mesh.fsdp=2", "trainer.mesh.tensor=2"};

// The members of a tensor group take the same rows: one micro-batch of 8 per data replica.
std::int64_t micro_batch(int ranks, const std::vector<std::string>& mesh) {
  int tensor = 1;
  for (const auto& m : mesh)
    if (m.starts_with("trainer.mesh.tensor=")) tensor = std::stoi(m.substr(m.find('=') + 1));
  return 8 / (ranks / tensor);
}

class TensorParallelTrainsAsOneProcess : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelTrainsAsOneProcess, LossesAndFinalWeightsWithinFloat32Rounding) {
  const Case& c = GetParam();
  const fs::path one = scratch("one-" + c.name), many = scratch("tp-" + c.name);
  const std::int64_t micro = micro_batch(c.ranks, c.mesh);
  const std::int64_t tensor = c.ranks * micro / 8;
  const auto model = with_optimizer(c.config, c.model);
  const auto single = run_command(tp_args(one, c.config, micro, model), {"LOOM_NUM_THREADS=1"});
  ASSERT_EQ(single.exit_code, 0) << single.out << single.err;
  const auto parallel = mpirun(c.ranks, tp_args(many, c.config, micro, model + c.mesh));
  ASSERT_EQ(parallel.exit_code, 0) << parallel.out << parallel.err;
  EXPECT_NE(parallel.out.find("tensor " + std::to_string(tensor) + ": "), std::string::npos) << parallel.out;
  expect_close_losses(one, many);
  // It trained: the runs compared are not two copies of the initial weights.
  const auto l = losses(one);
  EXPECT_GT(std::abs(l.back() - l.front()), 1e-3) << "the loss did not move";
  EXPECT_LT(max_relative_difference(one / "model.safetensors", many / "model.safetensors"), c.weights);
}

// Point 5's grid: every family on tensor 2, tensor 4, data 2 x tensor 2 and fsdp 2 x tensor 2,
// with remat off and on; then the parts of the step the grid does not reach.
std::vector<Case> cases() {
  struct Family {
    const char* name;
    const char* config;
    std::vector<std::string> model;
  };
  const std::vector<Family> families{{"gpt2", "quickstart.yaml", kTwoLayers},
                                     {"llama", "llama-tiny.yaml", kLlama},
                                     {"gemma2", "gemma2-tiny.yaml", kTwoLayers},
                                     {"mixtral", "mixtral-tiny.yaml", kTwoLayers}};
  struct Layout {
    const char* name;
    int ranks;
    std::vector<std::string> mesh;
  };
  const std::vector<Layout> meshes{{"tensor2", 2, kTensor2},
                                   {"tensor4", 4, kTensor4},
                                   {"data2_tensor2", 4, kData2Tensor2},
                                   {"fsdp2_tensor2", 4, kFsdp2Tensor2}};
  std::vector<Case> out;
  for (const Family& f : families)
    for (const Layout& m : meshes)
      for (const bool remat : {false, true})
        out.push_back(Case{std::string(f.name) + "_" + m.name + (remat ? "_remat" : ""), config(f.config),
                           remat ? f.model + kRemat : f.model, m.ranks, m.mesh});
  const std::vector<Case> more{
      // Qwen 3's q/k norms (partial gradients summed over the group) and Qwen 2's biases.
      Case{"qwen3_qk_norm", config("llama-tiny.yaml"), kLlama + std::vector<std::string>{"model.use_qk_norm=true"}, 2,
           kTensor2},
      Case{"qwen2_biases", config("llama-tiny.yaml"), kLlama + std::vector<std::string>{"model.qkv_bias=true"}, 2,
           kTensor2},
      // Tensor 4: llama's 4 key/value heads split one per rank; with 2 they are replicated, each
      // rank using the one its query heads read.
      Case{"llama_kv2_tensor4", config("llama-tiny.yaml"), kLlama + std::vector<std::string>{"model.num_kv_heads=2"}, 4,
           kTensor4},
      // The rest of the step: z-loss, the weight average, clipping; SGD and Lion; SFT and DPO
      // (its reference model split too).
      Case{"zloss_ema_clip", config("quickstart.yaml"),
           kTwoLayers + kSgd +
               std::vector<std::string>{"trainer.z_loss_weight=1e-4", "trainer.ema_decay=0.9",
                                        "optimizer.max_grad_norm=0.5"},
           2, kTensor2},
      Case{"lion", config("llama-tiny.yaml"), kLlama + std::vector<std::string>{"optimizer.type=lion"}, 2, kTensor2,
           kAdaptive},
      // Whole-matrix optimizers update whole copies of the split matrices.
      Case{"muon", config("llama-tiny.yaml"), kLlama + std::vector<std::string>{"optimizer.type=muon"}, 2, kTensor2,
           kAdaptive},
      // (llama: no biases. gpt2's key biases, whose gradient is zero in exact arithmetic, take
      // Adafactor's full relative steps from rounding noise, differently in every order.)
      Case{"adafactor_ema", config("llama-tiny.yaml"),
           kLlama + std::vector<std::string>{"optimizer.type=adafactor", "trainer.ema_decay=0.9"}, 2, kTensor2,
           kAdaptive},
      Case{"sft",
           config("sft-tiny.yaml"),
           {"data.paths=[" + config("data/sft-tiny.jsonl") + "]"},
           2,
           kTensor2,
           kAdaptive},
      Case{"dpo",
           config("dpo-tiny.yaml"),
           {"data.paths=[" + config("data/preferences.jsonl") + "]"},
           2,
           kTensor2,
           kAdaptive}};
  out.insert(out.end(), more.begin(), more.end());
  return out;
}

INSTANTIATE_TEST_SUITE_P(Tensor, TensorParallelTrainsAsOneProcess, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// A checkpoint written under one tensor size resumes under another: the run goes on as the same
// checkpoint resumed in one process does. Constant learning rate; the runs stop at 10 and go on to 20.
struct Reshard {
  std::string name;
  std::string config;
  std::vector<std::string> model;
  int from_ranks;
  std::vector<std::string> from_mesh;
  int to_ranks;
  std::vector<std::string> to_mesh;
};

void PrintTo(const Reshard& r, std::ostream* os) {
  *os << r.name;
}

class TensorParallelCheckpoints : public ::testing::TestWithParam<Reshard> {};

TEST_P(TensorParallelCheckpoints, ResumeOnAnotherMeshAsInOneProcess) {
  const Reshard& r = GetParam();
  const fs::path first = scratch("ckpt-" + r.name), on_mesh = scratch("ckpt-mesh-" + r.name),
                 in_one = scratch("ckpt-one-" + r.name);
  const std::vector<std::string> common =
      with_optimizer(r.config, r.model) + std::vector<std::string>{"lr_schedule.type=constant", "lr_schedule.warmup=0",
                                                                   "trainer.checkpoint.save_every_steps=5",
                                                                   "trainer.ema_decay=0.9"};
  const bool adaptive = common.front() != kSgd.front();
  auto run = [&](int ranks, std::vector<std::string> args) {
    return ranks == 1 ? run_command(args, {"LOOM_NUM_THREADS=1"}) : mpirun(ranks, args);
  };
  auto ten = tp_args(first, r.config, micro_batch(r.from_ranks, r.from_mesh), common + r.from_mesh);
  ten.push_back("trainer.num_train_steps=10");
  auto done = run(r.from_ranks, ten);
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  fs::copy(first, on_mesh, fs::copy_options::recursive);
  fs::copy(first, in_one, fs::copy_options::recursive);
  // The rest in the new mesh's micro-batches, and in one process with the same ones.
  const std::int64_t micro = micro_batch(r.to_ranks, r.to_mesh);
  done = run(r.to_ranks, tp_args(on_mesh, r.config, micro, common + r.to_mesh));
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  EXPECT_NE(done.out.find("resumed from checkpoint"), std::string::npos) << done.out;
  done = run(1, tp_args(in_one, r.config, micro, common));
  ASSERT_EQ(done.exit_code, 0) << done.out << done.err;
  expect_close_losses(in_one, on_mesh);
  EXPECT_LT(max_relative_difference(in_one / "model.safetensors", on_mesh / "model.safetensors"),
            adaptive ? kAdaptive : kRelative);
}

INSTANTIATE_TEST_SUITE_P(
    Tensor, TensorParallelCheckpoints,
    ::testing::Values(
        Reshard{"tensor2_to_one", config("quickstart.yaml"), kTwoLayers, 2, kTensor2, 1, {}},
        Reshard{"muon_tensor2_to_one",
                config("llama-tiny.yaml"),
                kLlama + std::vector<std::string>{"optimizer.type=muon"},
                2,
                kTensor2,
                1,
                {}},
        Reshard{"muon_one_to_tensor2",
                config("llama-tiny.yaml"),
                kLlama + std::vector<std::string>{"optimizer.type=muon"},
                1,
                {},
                2,
                kTensor2},
        Reshard{"one_to_tensor2", config("llama-tiny.yaml"), kLlama, 1, {}, 2, kTensor2},
        Reshard{"tensor4_to_tensor2", config("mixtral-tiny.yaml"), kTwoLayers, 4, kTensor4, 2, kTensor2},
        Reshard{"fsdp2_tensor2_to_tensor4", config("llama-tiny.yaml"), kLlama, 4, kFsdp2Tensor2, 4, kTensor4},
        Reshard{"tensor2_to_fsdp2_tensor2", config("quickstart.yaml"), kTwoLayers, 2, kTensor2, 4, kFsdp2Tensor2}),
    [](const ::testing::TestParamInfo<Reshard>& info) { return info.param.name; });

TEST(TensorParallel, ExportAndGenerateReadTheWholeTensorsOfARun) {
  const fs::path run = scratch("export-run"), hf = scratch("export-hf");
  const auto trained =
      mpirun(2, tp_args(run, config("llama-tiny.yaml"), 8,
                        kLlama + kTensor2 + std::vector<std::string>{"trainer.checkpoint.save_every_steps=10"}));
  ASSERT_EQ(trained.exit_code, 0) << trained.out << trained.err;
  const fs::path checkpoint = run / "checkpoints" / "step-20";
  // The checkpoint holds whole tensors, as one process writes them.
  const auto in_checkpoint = weights(checkpoint / "model.safetensors"),
             final_weights = weights(run / "model.safetensors");
  ASSERT_EQ(in_checkpoint.size(), final_weights.size());
  const auto exported = run_command({LOOM_BINARY, "export", checkpoint.string(), "--format", "hf", hf.string()}, {});
  ASSERT_EQ(exported.exit_code, 0) << exported.out << exported.err;
  EXPECT_TRUE(fs::exists(hf / "config.json"));
  // Every exported tensor is one of the run's final tensors (or a q/k/v slice of the fused
  // projection), whole: the export of a one-process run (tests/interop loads those in
  // transformers).
  const auto hf_weights = weights(hf / "model.safetensors");
  ASSERT_GE(hf_weights.size(), final_weights.size());
  for (const auto& [name, values] : final_weights) {
    if (name.find("qkv_proj") != std::string::npos) continue;
    bool found = false;
    for (const auto& [hf_name, hf_values] : hf_weights) found |= hf_name.ends_with(name) && hf_values == values;
    EXPECT_TRUE(found) << name;
  }
  // One process generates from the run, and so does every rank of mpirun.
  for (const int ranks : {1, 2}) {
    std::vector<std::string> args{LOOM_BINARY,        "generate", checkpoint.string(), "--prompt", "To be",
                                  "--max-new-tokens", "8"};
    const auto generated = ranks == 1 ? run_command(args, {}) : mpirun(ranks, args);
    EXPECT_EQ(generated.exit_code, 0) << ranks << " ranks: " << generated.out << generated.err;
  }
}

// trainer.init_from (a loom run here; a Hugging Face directory takes the same path) is read whole
// and each rank takes its shards: the run then trains as one process started from it does.
TEST(TensorParallel, InitFromReadsTheWholeWeightsAndEachRankTakesItsShards) {
  const fs::path source = scratch("init-source"), one = scratch("init-one"), two = scratch("init-tp");
  auto first = tp_args(source, config("llama-tiny.yaml"), 8, kLlama);
  first.push_back("trainer.num_train_steps=5");
  const auto made = run_command(first, {"LOOM_NUM_THREADS=1"});
  ASSERT_EQ(made.exit_code, 0) << made.out << made.err;
  const std::vector<std::string> from =
      with_optimizer("", kLlama) + std::vector<std::string>{"trainer.init_from=" + source.string()};
  const auto single = run_command(tp_args(one, config("llama-tiny.yaml"), 8, from), {"LOOM_NUM_THREADS=1"});
  ASSERT_EQ(single.exit_code, 0) << single.out << single.err;
  const auto parallel = mpirun(2, tp_args(two, config("llama-tiny.yaml"), 8, from + kTensor2));
  ASSERT_EQ(parallel.exit_code, 0) << parallel.out << parallel.err;
  EXPECT_NE(parallel.out.find("took its shards of the whole weights"), std::string::npos) << parallel.out;
  expect_close_losses(one, two);
  EXPECT_LT(max_relative_difference(one / "model.safetensors", two / "model.safetensors"), kRelative);
}

TEST(TensorParallel, WhatItDoesNotCombineWithIsOneClearError) {
  struct Refusal {
    int ranks;
    std::vector<std::string> overrides;
    std::string message;
  };
  const std::vector<Refusal> refused = {
      {2, {"trainer.mesh.tensor=2", "trainer.shard_optimizer_state=true"}, "does not combine with tensor parallelism"},
      {2, {"trainer.mesh.tensor=2", "lora.rank=4"}, "LoRA (lora.rank > 0) does not combine with tensor parallelism"},
      {4,
       {"trainer.mesh.tensor=2", "trainer.mesh.fsdp=2", "optimizer.type=muon"},
       "optimizer muon updates each matrix whole"},
      {2, {"trainer.mesh.tensor=2", "trainer.mesh.data=3"}, "trainer.mesh {data: 3, fsdp: 1, tensor: 2} has 6 ranks"},
  };
  for (const auto& [ranks, overrides, message] : refused) {
    const fs::path dir = scratch("refused");
    const auto r = mpirun(ranks, tp_args(dir, config("quickstart.yaml"), 4, kTwoLayers + overrides));
    EXPECT_EQ(r.exit_code, 2) << message << "\n" << r.out << r.err;
    const std::string all = r.out + r.err;
    EXPECT_NE(all.find(message), std::string::npos) << all;
    EXPECT_FALSE(fs::exists(dir)) << message;
  }
}

// MFU is against every rank's roof: under tensor 2 both members' (a given trainer.peak_flops is
// per rank), where it used to count the data x fsdp ranks alone (tensor 2 reported 307%).
TEST(TensorParallel, MfuIsAgainstTheRoofOfEveryRank) {
  const fs::path dir = scratch("mfu");
  auto args = tp_args(dir, config("quickstart.yaml"), 8, kTwoLayers + kTensor2);
  args[4] = "trainer.num_train_steps=4";
  const auto r = mpirun(2, args);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("peak 200.0 GFLOP/s (trainer.peak_flops, all ranks)"), std::string::npos) << r.out;
  const auto header = nlohmann::json::parse(file_bytes(dir / "header.json"));
  EXPECT_EQ(header["peak_flops"].get<double>(), 2e11);
  const double flops_per_token = header["flops_per_token"].get<double>();
  std::ifstream in(dir / "metrics.jsonl");
  int steps = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("throughput/mfu")) continue;
    ++steps;
    const double expected = flops_per_token * j["throughput/tokens_per_second"].get<double>() / 2e11;
    EXPECT_NEAR(j["throughput/mfu"].get<double>(), expected, 1e-9 * expected) << line;
  }
  EXPECT_EQ(steps, 4);
}

}  // namespace
