// Whole runs on the test device `guarded` (tests/fixtures/plugins/guarded_backend.cpp), whose
// memory faults on any host access outside the backend's own calls, against the same runs on the
// `reference` backend, bit for bit: the trainer's samples and `loom generate`'s loader and KV
// cache, LoRA adapters (attached, initialised, trained and merged on the device) and the DPO
// objective with its reference model. Passing means zero faults: a touch would be a SIGSEGV.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "../core/test_support.hpp"
#include "loom/core/runtime.hpp"
#include "loom/device.hpp"
#include "loom/error.hpp"
#include "loom/run/eval.hpp"
#include "loom/run/generate.hpp"
#include "loom/run/trainer.hpp"
#include "numerics_test_support.hpp"
#include "train_test_support.hpp"

namespace fs = std::filesystem;

namespace loom::test {
namespace {

const fs::path source_dir = LOOM_SOURCE_DIR;

// A tiny GPT on the synthetic corpus, small enough for the guarded backend's reference loops.
const char* tiny_run = R"(
model: {type: gpt2, seq_len: 16, hidden_dim: 32, num_layers: 1, num_heads: 2}
tokenizer: byte
data: {type: synthetic, num_documents: 200}
optimizer: {type: adamw, learning_rate: 1.0e-2}
lr_schedule: {type: constant}
trainer:
  num_train_steps: 3
  train_batch_size: 2
  log_every: 1
  steps_per_eval: 0
  max_eval_batches: 1
  sample_length: 24
  sample_temperature: 0.8
  trackers: [jsonl]
  peak_flops: 1.0e+9  # no GEMM probe: the guarded backend's products are reference loops
)";

// The overrides that put a run on `backend`: the guarded device with its attention kernel, or
// the reference backend with the attention kernel the guarded one computes as.
std::vector<std::string> on(const std::string& backend, std::vector<std::string> overrides = {}) {
  overrides.push_back("plugins.paths=[" + std::string(LOOM_TEST_DEVICE_PLUGIN_DIR) + "]");
  overrides.push_back("backend.type=" + backend);
  overrides.push_back(std::string("model.attention=") + (backend == "guarded" ? "guarded" : "naive"));
  return overrides;
}

struct RunResult {
  TrainedRun trained;
  std::vector<double> losses;
  std::vector<std::vector<double>> metrics;  // per step: the objective's metrics, in `names` order
};

RunResult train(const TempDir& dir, const std::string& name, const std::string& backend,
                std::vector<std::string> overrides = {}, const char* config = tiny_run,
                const std::vector<std::string>& names = {}) {
  RunResult run{train_in(dir.write(name + ".yaml", config), dir.path() / (name + "-" + backend),
                         on(backend, std::move(overrides))),
                {},
                {}};
  for (const auto& r : read_metrics(run.trained.dir)) {
    if (!r.contains("train/loss")) continue;
    run.losses.push_back(r["train/loss"].get<double>());
    std::vector<double> m;
    for (const auto& n : names) m.push_back(r.at("train/" + n).get<double>());
    run.metrics.push_back(m);
  }
  return run;
}

void expect_same_losses(const RunResult& device, const RunResult& host, std::size_t steps) {
  ASSERT_EQ(host.losses.size(), steps);
  ASSERT_EQ(device.losses.size(), steps);
  for (std::size_t s = 0; s < steps; ++s) {
    EXPECT_EQ(device.losses[s], host.losses[s]) << "step " << s + 1;
    EXPECT_EQ(device.metrics[s], host.metrics[s]) << "step " << s + 1;
  }
}

// `loom generate`'s path: the run loaded into its backend's memory (RunMemory::backend), then
// sampled past its context of 16 (the cache refilled as the window slides).
struct Generated {
  std::vector<std::int32_t> tokens;
  Device model_device;
};

Generated generate_from(const fs::path& run_dir) {
  RuntimeOptions options;
  options.config = run_dir / "config.yaml";
  Runtime runtime(options);
  LoadedRun run = load_run(runtime, run_dir, /*merge_lora=*/true, WeightsChoice::ema, RunMemory::backend);
  SamplingOptions sampling;
  sampling.max_new_tokens = 40;
  sampling.temperature = 0.9;
  sampling.seed = 11;
  const std::vector<std::int32_t> prompt = run.tokenizer->encode("The ");
  Generated out;
  out.tokens = generate(*run.model, *run.backend, *run.tokenizer, run.documents, prompt, sampling).tokens;
  out.model_device = run.model->parameters().front().parameter->tensor().device();
  return out;
}

TEST(DeviceGenerate, SamplesAndLoomGenerateOnTheDeviceGiveTheReferenceBackendsTokens) {
  TempDir dir;
  const RunResult host = train(dir, "samples", "reference");
  const RunResult device = train(dir, "samples", "guarded");
  expect_same_losses(device, host, 3);
  EXPECT_FALSE(host.trained.summary.final_sample.empty());
  EXPECT_EQ(device.trained.summary.final_sample, host.trained.summary.final_sample);

  const Generated h = generate_from(host.trained.dir);
  const Generated d = generate_from(device.trained.dir);
  EXPECT_EQ(d.model_device, Device("guarded", 0)) << "the model was loaded into the device's memory";
  EXPECT_EQ(h.tokens.size(), 40u);
  EXPECT_EQ(d.tokens, h.tokens);

  // `loom eval`'s loader: the run in the device's memory, scored as on the host.
  auto score = [](const fs::path& run_dir) {
    RuntimeOptions options;
    options.config = run_dir / "config.yaml";
    Runtime runtime(options);
    const eval::EvalModel m = eval::load_eval_model(runtime, run_dir, WeightsChoice::ema);
    eval::Scorer scorer(*m.model, *m.backend, eval::ScorerOptions{});
    const std::vector<eval::TokenRequest> requests{{{m.prefix, 40, 41}, {42, 43}}, {{m.prefix}, {44}}};
    std::vector<double> out;
    for (const eval::Scored& s : scorer.score(requests)) out.push_back(s.logprob);
    return out;
  };
  EXPECT_EQ(score(device.trained.dir), score(host.trained.dir));

  // Another command that loads a run keeps refusing a device backend, naming itself.
  RuntimeOptions options;
  options.config = device.trained.dir / "config.yaml";
  Runtime runtime(options);
  try {
    load_run(runtime, device.trained.dir, true, WeightsChoice::ema, RunMemory::host, "loom export");
    ADD_FAILURE() << "a run on guarded was loaded into host memory";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("loom export"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("guarded:0"), std::string::npos) << e.what();
  }
}

// A tiny GPT-2 built and initialised on `backend` (ModelSetup::backend): the same values on any.
Handle<Model> tiny_gpt2(Backend& backend, const char* attention, std::int64_t seq_len) {
  Value node = Value::map();
  node.set("type", Value("gpt2"));
  node.set("seq_len", Value(seq_len));
  node.set("hidden_dim", Value(std::int64_t{32}));
  node.set("num_layers", Value(std::int64_t{1}));
  node.set("num_heads", Value(std::int64_t{2}));
  node.set("initializer_range", Value(0.5));
  node.set("attention", Value(attention));
  Handle<Model> model = plugin_registry().create<Model>(ComponentRef{"model", "gpt2", node, "model"});
  ModelSetup setup;
  setup.vocab_size = 64;
  setup.backend = &backend;
  model->build(setup);
  model->initialize(3);
  return model;
}

// A decoding step's host<->device copies are a constant number of small ones: the new token and
// its position in, their range checks' copies back, the next token's logits out. Neither the
// weights nor the KV cache cross (each is larger than a step's whole traffic here).
TEST(DeviceGenerate, EachDecodingStepCopiesAConstantNumberOfSmallTensors) {
  Handle<Backend> device = make_backend("guarded");
  Handle<Model> model = tiny_gpt2(*device, "guarded", 64);
  DocumentBoundary boundary;
  boundary.separator = {0};
  TokenStream stream(*model, *device, boundary);
  const std::vector<std::int32_t> prompt{1, 2, 3};
  stream.start(prompt);
  auto copies_for = [&](int tokens) {
    const HostDeviceCopies before = host_device_copies();
    for (int i = 0; i < tokens; ++i) stream.append(static_cast<std::int32_t>(5 + i));
    const HostDeviceCopies after = host_device_copies();
    return HostDeviceCopies{after.count - before.count, after.bytes - before.bytes};
  };
  const HostDeviceCopies four = copies_for(4), eight = copies_for(8);
  EXPECT_GT(four.count, 0u);
  EXPECT_EQ(eight.count, 2 * four.count);
  EXPECT_EQ(eight.bytes, 2 * four.bytes);
  // Per step: the logits (64 floats) and a few ids; a layer's cache or the embedding is 8 KiB.
  EXPECT_LE(four.bytes / 4, 64u * 4u + 64u) << four.count << " copies of " << four.bytes << " bytes";
  EXPECT_EQ(stream.logits().size(), 64u);
}

// `loom eval`'s scorer (and the trainer's eval_tasks): multiple choice with and without the KV
// cache (the context run once, its cache copied into every choice's, on the device), in batches.
TEST(DeviceEval, TheScorerOnTheDeviceGivesTheReferenceBackendsLogProbabilities) {
  Handle<Backend> host = make_backend("reference"), device = make_backend("guarded");
  Handle<Model> on_host = tiny_gpt2(*host, "naive", 32), on_device = tiny_gpt2(*device, "guarded", 32);
  std::vector<eval::TokenRequest> requests;
  for (std::int32_t c = 0; c < 4; ++c) {
    std::vector<std::int32_t> context;
    for (std::int32_t t = 0; t < 9; ++t) context.push_back((t * 7 + 3) % 64);
    requests.push_back({context, {c, static_cast<std::int32_t>(10 + c), 5}});
  }
  requests.push_back({{1, 2, 3}, {4}});
  const std::vector<std::size_t> groups{4, 1};
  for (const eval::KvCacheUse kv : {eval::KvCacheUse::never, eval::KvCacheUse::always}) {
    eval::Scorer h(*on_host, *host, eval::ScorerOptions{3, kv}), d(*on_device, *device, eval::ScorerOptions{3, kv});
    const std::vector<eval::Scored> hs = h.score_grouped(requests, groups), ds = d.score_grouped(requests, groups);
    ASSERT_EQ(ds.size(), hs.size());
    for (std::size_t i = 0; i < hs.size(); ++i) {
      EXPECT_EQ(ds[i].logprob, hs[i].logprob) << "request " << i << ", kv " << static_cast<int>(kv);
      EXPECT_EQ(ds[i].greedy, hs[i].greedy) << "request " << i << ", kv " << static_cast<int>(kv);
    }
  }
}

TEST(DeviceLora, TrainingWithAdaptersOnTheDeviceGivesTheReferenceBackendsLosses) {
  TempDir dir;
  const std::vector<std::string> lora{"lora.rank=2", "lora.dropout=0.1", "trainer.sample_length=8"};
  const RunResult host = train(dir, "lora", "reference", lora);
  const RunResult device = train(dir, "lora", "guarded", lora);
  expect_same_losses(device, host, 3);
  EXPECT_NE(host.losses[2], host.losses[0]) << "the adapters trained";
  EXPECT_EQ(device.trained.summary.final_sample, host.trained.summary.final_sample);
  // `loom generate` of the LoRA run: base and adapters read into the device, merged there.
  const Generated h = generate_from(host.trained.dir), d = generate_from(device.trained.dir);
  EXPECT_EQ(d.tokens, h.tokens);
}

TEST(DeviceLora, AQuantizedBaseIsRefusedOnADevice) {
  TempDir dir;
  try {
    train(dir, "nf4", "guarded", {"lora.rank=2", "lora.base_dtype=nf4"});
    ADD_FAILURE() << "an nf4 base was accepted on the guarded device";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("lora.base_dtype: nf4"), std::string::npos) << m;
    EXPECT_NE(m.find("guarded:0"), std::string::npos) << m;
    EXPECT_NE(m.find("lora.base_dtype: f32"), std::string::npos) << m;
  }
}

// Preference pairs of the shipped data, short enough for a context of 96.
const char* tiny_dpo = R"(
model: {type: gpt2, seq_len: 96, hidden_dim: 32, num_layers: 1, num_heads: 2}
tokenizer: byte
data: {type: preference, validation_fraction: 0.1}
objective: {type: dpo, beta: 0.2, label_smoothing: 0.05}
optimizer: {type: adamw, learning_rate: 1.0e-2}
lr_schedule: {type: constant}
trainer:
  num_train_steps: 3
  train_batch_size: 4
  microbatch_size: 2
  log_every: 1
  steps_per_eval: 0
  max_eval_batches: 1
  sample_length: 0
  trackers: [jsonl]
  peak_flops: 1.0e+9
)";

TEST(DeviceDpo, TheObjectiveAndItsReferenceModelOnTheDeviceGiveTheReferenceBackendsLosses) {
  TempDir dir;
  const std::vector<std::string> data{"data.paths=[" + (source_dir / "configs/data/preferences.jsonl").string() + "]"};
  const std::vector<std::string> names{"reward_accuracy", "reward_margin", "chosen_reward", "rejected_reward"};
  const RunResult host = train(dir, "dpo", "reference", data, tiny_dpo, names);
  const RunResult device = train(dir, "dpo", "guarded", data, tiny_dpo, names);
  expect_same_losses(device, host, 3);
  EXPECT_NE(host.losses[2], host.losses[0]) << "the policy moved away from the reference";
  EXPECT_EQ(device.trained.summary.final_eval_loss, host.trained.summary.final_eval_loss);
}

}  // namespace
}  // namespace loom::test
