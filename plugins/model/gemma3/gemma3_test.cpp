// The gemma3 model (Gemma 3's text decoder).
//
// Gemma3Interop, Gemma3Model, Gemma3Preset: loom alone. config.json both ways (what the export
// writes describes the model: the section model_section makes of it builds the same model, with
// no mismatch; every difference is named), the layers' windows and RoPE tables, the gemma3-1b
// preset's parameter count (google/gemma-3-1b-pt's), identical gradients under remat.
//
// Gemma3Reference: against gemma3_reference.py, a port of transformers 4.50's Gemma 3 text model
// to the reference environment's torch (transformers 4.46.3 there predates Gemma 3). Export: a
// random loom gemma3 is exported with export_hf, the port loads the directory and computes the
// logits, the loss and every gradient of one batch, which loom must match with every backend and
// attention kernel to a relative error of 1e-4 (max |loom - port| / max |port|, per tensor).
// Import: the port writes a random Gemma 3 as save_pretrained would; a run with trainer.init_from
// on it (learning rate 0) ends with those weights, whose export is the same files' tensors bit
// for bit, and whose logits match the port's. The largest errors are printed and recorded as
// test properties.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "gemma3_interop.hpp"
#include "loom/autograd.hpp"
#include "loom/core/config.hpp"
#include "loom/core/plugin_host.hpp"
#include "loom/core/registry.hpp"
#include "loom/core/runtime.hpp"
#include "loom/error.hpp"
#include "loom/hf_interop.hpp"
#include "loom/kinds/backend.hpp"
#include "loom/kinds/model.hpp"
#include "loom/model_support.hpp"
#include "loom/run/hf_interop.hpp"
#include "loom/run/lora.hpp"
#include "loom/run/trainer.hpp"
#include "loom/safetensors.hpp"
#include "reference_support.hpp"
#include "test_support.hpp"

namespace loom {
namespace {

namespace fs = std::filesystem;
namespace st = safetensors;
using test::relative_error;
constexpr double tolerance = 1e-4;

Value yaml(const std::string& text) {
  return config::load_string(text, "test.yaml");
}

Value to_value(const nlohmann::json& j) {
  if (j.is_null()) return Value();
  if (j.is_boolean()) return Value(j.get<bool>());
  if (j.is_number_integer()) return Value(j.get<std::int64_t>());
  if (j.is_number()) return Value(j.get<double>());
  if (j.is_string()) return Value(j.get<std::string>());
  if (j.is_array()) {
    Value::List l;
    for (const auto& e : j) l.push_back(to_value(e));
    return Value(std::move(l));
  }
  Value m = Value::map();
  for (auto it = j.begin(); it != j.end(); ++it) m.set(it.key(), to_value(it.value()));
  return m;
}

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UserError";
  return "";
}

// Every feature at once: grouped-query attention, the 5:1 pattern over 7 layers (layer 5
// global, layer 6 sliding again), a window of 4 over 13 positions, the global layers' linear
// RoPE scaling, tied embeddings.
const char* tiny_tied =
    "{type: gemma3, seq_len: 32, hidden_dim: 32, intermediate_dim: 64, num_layers: 7, num_heads: 4, num_kv_heads: 2, "
    "head_dim: 16, query_pre_attn_scalar: 24, sliding_window: 4, rope_scaling_factor: 8, vocab_size: 300}";
// Another pattern (layers 2 and 5 global), bases of its own, a final logit soft-cap, an untied
// output layer, multi-query attention.
const char* tiny_untied =
    "{type: gemma3, seq_len: 32, hidden_dim: 32, intermediate_dim: 48, num_layers: 6, num_heads: 2, num_kv_heads: 1, "
    "head_dim: 8, sliding_window: 3, sliding_window_pattern: 3, rope_theta: 5000, rope_local_base_freq: 100, "
    "final_logit_softcapping: 2.5, tie_word_embeddings: false, vocab_size: 300}";

class Models {
 public:
  Models() { PluginHost().load({{LOOM_PLUGIN_DIR, "test"}}, registry_); }

  Handle<Model> create(const Value& options, const ModelSetup& setup = ModelSetup{0}) {
    auto model = registry_.create<Model>(ComponentRef{"model", options.find("type")->as_string(), options, "model"});
    model->build(setup);
    return model;
  }
  // Every parameter from normal(0, 0.3) with `seed`, the norms' too (their 1 + w scale then
  // differs from 1, so that a norm mapped to the wrong place, or scaled by w alone, shows).
  Handle<Model> make(const Value& options, std::uint64_t seed) {
    auto model = create(options);
    model->initialize(seed);
    std::uint64_t i = 0;
    for (const auto& p : model->parameters())
      models::fill_normal(p.parameter->data(), stream_key(seed, 7, i++), 0.3, default_execution_context());
    return model;
  }
  Registry& registry() { return registry_; }

 private:
  Registry registry_;
};

// ---- the Hugging Face mapping ----

TEST(Gemma3Interop, ConfigJsonDescribesTheModel) {
  Models models;
  auto model = models.make(yaml(tiny_tied), 1);
  auto* hf = dynamic_cast<HfModel*>(model.get());
  ASSERT_NE(hf, nullptr);
  const Value c = hf->hf_config();
  EXPECT_EQ(c.find("model_type")->as_string(), "gemma3_text");
  EXPECT_EQ(c.find("architectures")->as_list().at(0).as_string(), "Gemma3ForCausalLM");
  EXPECT_EQ(c.find("sliding_window")->as_int(), 4);
  EXPECT_EQ(c.find("sliding_window_pattern")->as_int(), 6);
  EXPECT_EQ(c.find("rope_theta")->as_double(), 1e6);
  EXPECT_EQ(c.find("rope_local_base_freq")->as_double(), 1e4);
  EXPECT_EQ(c.find("rope_scaling")->find("rope_type")->as_string(), "linear");
  EXPECT_EQ(c.find("rope_scaling")->find("factor")->as_double(), 8.0);
  EXPECT_EQ(c.find("query_pre_attn_scalar")->as_double(), 24.0);
  EXPECT_TRUE(c.find("final_logit_softcapping")->is_null());
  EXPECT_TRUE(c.find("attn_logit_softcapping")->is_null());
  std::vector<std::string> types;
  for (const Value& t : c.find("layer_types")->as_list()) types.push_back(t.as_string());
  const std::string s = "sliding_attention", g = "full_attention";
  EXPECT_EQ(types, (std::vector<std::string>{s, s, s, s, s, g, s}));
  EXPECT_EQ(gemma3::hf_layer_windows(c, "config.json"), (std::vector<std::int64_t>{4, 4, 4, 4, 4, 0, 4}));
  EXPECT_TRUE(hf->hf_config_mismatches(c).empty());

  // The tensors: transformers' names, q/k/v split out of the fused projection, the q/k norms per
  // head, the tied lm_head skipped.
  const HfTensorLayout layout = hf->hf_tensors();
  EXPECT_EQ(layout.base_model_prefix, "model");
  std::map<std::string, std::pair<std::int64_t, std::int64_t>> rows;
  for (const auto& t : layout.tensors) rows[t.name] = {t.begin, t.end};
  EXPECT_EQ(rows.at("model.layers.5.self_attn.q_proj.weight"), (std::pair<std::int64_t, std::int64_t>{0, 64}));
  EXPECT_EQ(rows.at("model.layers.5.self_attn.k_proj.weight"), (std::pair<std::int64_t, std::int64_t>{64, 96}));
  EXPECT_EQ(rows.at("model.layers.5.self_attn.v_proj.weight"), (std::pair<std::int64_t, std::int64_t>{96, 128}));
  EXPECT_EQ(rows.at("model.layers.5.self_attn.q_norm.weight"), (std::pair<std::int64_t, std::int64_t>{0, 16}));
  EXPECT_EQ(rows.at("model.layers.5.self_attn.k_norm.weight"), (std::pair<std::int64_t, std::int64_t>{0, 16}));
  EXPECT_TRUE(rows.contains("model.layers.6.post_feedforward_layernorm.weight"));
  EXPECT_FALSE(rows.contains("lm_head.weight"));
  EXPECT_EQ(layout.ignored_suffixes, (std::vector<std::string>{"lm_head.weight"}));
  EXPECT_EQ(layout.tensors.size(), 1 + 7 * 13 + 1u);  // embed, 13 per layer, norm
}

// What the export writes, read back by model_section, builds the same model: no mismatch, the
// weights load, the same logits.
TEST(Gemma3Interop, TheModelSectionOfAnExportIsTheModel) {
  Models models;
  for (const char* options : {tiny_tied, tiny_untied}) {
    SCOPED_TRACE(options);
    test::TempDir dir;
    auto a = models.make(yaml(options), 3);
    export_hf(*a, nullptr, dir.path() / "hf");
    const Value config = to_value(read_json(dir.path() / "hf" / "config.json"));
    const Value section = gemma3::model_section(config, "config.json");
    EXPECT_EQ(section.find("type")->as_string(), "gemma3");
    auto b = models.create(section);
    EXPECT_EQ(dynamic_cast<HfModel*>(b.get())->hf_config_mismatches(config), std::vector<std::string>{});
    EXPECT_EQ(b->num_parameters(), a->num_parameters());
    import_hf(*b, dir.path() / "hf");
    const auto pa = a->parameters(), pb = b->parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (std::size_t i = 0; i < pa.size(); ++i)
      EXPECT_EQ(pa[i].parameter->data().to_vector(), pb[i].parameter->data().to_vector()) << pa[i].parameter->name();
    // The options that shape the function, through config.json and back.
    const Value original = yaml(options);
    for (const char* key : {"num_layers", "num_kv_heads", "head_dim", "sliding_window", "sliding_window_pattern",
                            "rope_theta", "rope_local_base_freq", "tie_word_embeddings"})
      if (const Value* v = original.find(key)) {
        if (v->is_bool())
          EXPECT_EQ(section.find(key)->as_bool(), v->as_bool()) << key;
        else
          EXPECT_EQ(section.find(key)->as_double(), v->as_double()) << key;
      }
  }
}

// The plugin claims model_type gemma3_text: the run layer describes a Gemma 3 directory through
// it (`loom eval HF_DIR`), layer_types included, and the model built from that section loads the
// directory's weights.
TEST(Gemma3Interop, TheRunLayerDescribesAGemma3DirectoryThroughThePlugin) {
  Models models;
  const HfArchitectureEntry* claim = models.registry().find_hf_architecture("gemma3_text");
  ASSERT_NE(claim, nullptr);
  EXPECT_EQ(claim->decl.model, "gemma3");
  test::TempDir dir;
  auto a = models.make(yaml(tiny_untied), 4);
  export_hf(*a, nullptr, dir.path() / "hf");
  dir.write("hf/tokenizer.model", "");  // a tokenizer the description names (not read here)
  const HfDirectoryConfig described = describe_hf_model_dir(models.registry(), dir.path() / "hf");
  const Value expected = gemma3::model_section(to_value(read_json(dir.path() / "hf" / "config.json")), "config.json");
  EXPECT_EQ(described.model.to_flow(), expected.to_flow());
  EXPECT_EQ(described.model.find("sliding_window_pattern")->as_int(), 3);
  auto b = models.create(described.model);
  import_hf(*b, dir.path() / "hf");
  EXPECT_EQ(b->parameters().back().parameter->data().to_vector(), a->parameters().back().parameter->data().to_vector());
  // A field of the wrong type is the run layer's message, naming the file and the field.
  nlohmann::json bad = read_json(dir.path() / "hf" / "config.json");
  bad["sliding_window"] = "wide";
  std::ofstream(dir.path() / "hf" / "config.json") << bad.dump();
  const std::string m = message_of([&] { describe_hf_model_dir(models.registry(), dir.path() / "hf"); });
  EXPECT_NE(m.find("sliding_window is \"wide\", expected an integer"), std::string::npos) << m;
}

TEST(Gemma3Interop, AbsentFieldsTakeGemma3TextConfigsDefaults) {
  // Gemma3TextConfig() (transformers 4.50): vocab 262208, 2304 wide, 26 layers of 8 heads of 256
  // over 4, window 4096 on 5 of 6 layers, bases 1e6 and 1e4, no scaling, no soft-cap, 131072
  // positions.
  const Value section = gemma3::model_section(yaml("{model_type: gemma3_text}"), "config.json");
  EXPECT_EQ(section.find("vocab_size")->as_int(), 262208);
  EXPECT_EQ(section.find("hidden_dim")->as_int(), 2304);
  EXPECT_EQ(section.find("intermediate_dim")->as_int(), 9216);
  EXPECT_EQ(section.find("num_layers")->as_int(), 26);
  EXPECT_EQ(section.find("num_heads")->as_int(), 8);
  EXPECT_EQ(section.find("num_kv_heads")->as_int(), 4);
  EXPECT_EQ(section.find("head_dim")->as_int(), 256);
  EXPECT_EQ(section.find("sliding_window")->as_int(), 4096);
  EXPECT_EQ(section.find("sliding_window_pattern")->as_int(), 6);
  EXPECT_EQ(section.find("rope_theta")->as_double(), 1e6);
  EXPECT_EQ(section.find("rope_local_base_freq")->as_double(), 1e4);
  EXPECT_TRUE(section.find("rope_scaling_factor")->is_null());
  EXPECT_TRUE(section.find("final_logit_softcapping")->is_null());
  EXPECT_EQ(section.find("seq_len")->as_int(), 131072);
  EXPECT_EQ(section.find("query_pre_attn_scalar")->as_double(), 256.0);
  EXPECT_TRUE(section.find("tie_word_embeddings")->as_bool());
  // layer_types (transformers 4.53 and later) in place of the pattern; the smallest pattern that
  // gives them.
  const Value typed = gemma3::model_section(
      yaml("{model_type: gemma3_text, num_hidden_layers: 4, sliding_window: 8, layer_types: [sliding_attention, "
           "full_attention, sliding_attention, full_attention]}"),
      "config.json");
  EXPECT_EQ(typed.find("sliding_window_pattern")->as_int(), 2);
  EXPECT_EQ(typed.find("sliding_window")->as_int(), 8);
  const Value global =
      gemma3::model_section(yaml("{model_type: gemma3_text, sliding_window: null, num_hidden_layers: 3}"), "c.json");
  EXPECT_TRUE(global.find("sliding_window")->is_null());
}

TEST(Gemma3Interop, WhatLoomDoesNotComputeIsRefusedNamingTheField) {
  const auto refusal = [](const std::string& config) {
    return message_of([&] { gemma3::model_section(yaml(config), "dir/config.json"); });
  };
  EXPECT_NE(refusal("{model_type: gemma2}").find("'dir/config.json': model_type is \"gemma2\""), std::string::npos);
  EXPECT_NE(refusal("{model_type: gemma3_text, rope_scaling: {rope_type: yarn, factor: 4}}")
                .find("rope_scaling.rope_type is \"yarn\""),
            std::string::npos);
  EXPECT_NE(refusal("{model_type: gemma3_text, attention_bias: true}").find("attention_bias is true"),
            std::string::npos);
  EXPECT_NE(refusal("{model_type: gemma3_text, hidden_activation: silu}").find("hidden_activation is \"silu\""),
            std::string::npos);
  EXPECT_NE(refusal("{model_type: gemma3_text, hidden_size: -3}").find("hidden_size is -3, expected a positive"),
            std::string::npos);
  EXPECT_NE(refusal("{model_type: gemma3_text, num_hidden_layers: 3, layer_types: [full_attention, "
                    "sliding_attention, sliding_attention]}")
                .find("follow no pattern"),
            std::string::npos);
  EXPECT_NE(refusal("{model_type: gemma3_text, num_hidden_layers: 3, layer_types: [full_attention]}")
                .find("expected a list of 3 (num_hidden_layers)"),
            std::string::npos);
}

TEST(Gemma3Interop, MismatchesAreAllNamed) {
  Models models;
  auto model = models.make(yaml(tiny_tied), 1);
  auto* hf = dynamic_cast<HfModel*>(model.get());
  Value c = hf->hf_config();
  c.set("sliding_window_pattern", std::int64_t{3});
  c.erase("layer_types");
  c.set("rope_scaling", Value());
  c.set("rope_local_base_freq", 20000.0);
  c.set("final_logit_softcapping", 30.0);
  c.set("attention_bias", true);
  const std::vector<std::string> lines = hf->hf_config_mismatches(c);
  const auto has = [&](const std::string& part) {
    for (const auto& l : lines)
      if (l.find(part) != std::string::npos) return true;
    return false;
  };
  std::string joined;
  for (const auto& l : lines) joined += l + "\n";
  EXPECT_EQ(lines.size(), 5u) << joined;
  EXPECT_TRUE(has("the layers' attention windows are [4, 4, global, 4, 4, global, 4]")) << lines.front();
  EXPECT_TRUE(has("model.sliding_window and sliding_window_pattern give [4, 4, 4, 4, 4, global, 4]"));
  EXPECT_TRUE(has("rope_scaling is none, model.rope_scaling_factor is 8"));
  EXPECT_TRUE(has("rope_local_base_freq is " + Value(20000.0).describe() + ", model.rope_local_base_freq is " +
                  Value(10000.0).describe()))
      << joined;
  EXPECT_TRUE(has("final_logit_softcapping is " + Value(30.0).describe() + ", model.final_logit_softcapping is null"))
      << joined;
  EXPECT_TRUE(has("attention_bias is true"));
  // Another architecture is one line naming what the plugin reads.
  Value gemma2 = hf->hf_config();
  gemma2.set("model_type", "gemma2");
  const auto other = hf->hf_config_mismatches(gemma2);
  ASSERT_EQ(other.size(), 1u);
  EXPECT_NE(other[0].find("Gemma 3 (text) checkpoints (model_type \"gemma3_text\")"), std::string::npos) << other[0];
  // attn_logit_softcapping is accepted: transformers' Gemma 3 never applies it.
  Value capped = hf->hf_config();
  capped.set("attn_logit_softcapping", 50.0);
  EXPECT_TRUE(hf->hf_config_mismatches(capped).empty());
}

// ---- the model ----

TEST(Gemma3Preset, OneBillion) {
  Models models;
  const Value root = config::load_file(fs::path(LOOM_CONFIG_DIR) / "gemma3-1b.yaml");
  ModelSetup setup;
  setup.allocate = false;
  auto m = models.create(*root.find("model"), setup);
  EXPECT_EQ(m->num_parameters(), 999885952);  // google/gemma-3-1b-pt's safetensors (tied embeddings once)
}

// Activation checkpointing recomputes each layer in the backward pass: the same loss and
// gradients, bit for bit.
TEST(Gemma3Model, RematGivesIdenticalGradients) {
  Models models;
  auto backend = models.registry().create<Backend>(ComponentRef{"backend", "cpu", yaml("{type: cpu}"), "backend"});
  const std::vector<std::int32_t> ids = {5, 9, 200, 7, 1, 42, 42, 3, 17, 250, 8, 99, 4, 11, 2, 6};
  const Tensor tokens = Tensor::from(std::span<const std::int32_t>(ids), Shape{2, 8});
  std::vector<std::int32_t> next(ids.begin() + 1, ids.end());
  next.push_back(-1);
  const Tensor targets = Tensor::from(std::span<const std::int32_t>(next), Shape{2, 8});
  std::vector<std::vector<float>> reference;
  float reference_loss = 0;
  for (const char* remat : {"none", "full", "save_dots"}) {
    SCOPED_TRACE(remat);
    Value options = yaml(tiny_tied);
    options.set("remat", remat);
    auto model = models.make(options, 5);
    Tape tape;
    Ops ops(*backend, &tape);
    const Tensor loss = model->loss(ops, tokens, targets, Tensor());
    tape.backward(loss);
    std::vector<std::vector<float>> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.parameter->grad().to_vector());
    if (reference.empty()) {
      reference = grads;
      reference_loss = loss.to_vector()[0];
      continue;
    }
    EXPECT_EQ(loss.to_vector()[0], reference_loss);
    EXPECT_EQ(grads, reference);
  }
}

// Generation through the KV cache: the cached logits of each next token are the full forward
// pass's (the window, both RoPE tables and the q/k norms at an offset).
TEST(Gemma3Model, CachedGenerationMatchesTheFullForwardPass) {
  Models models;
  auto backend = models.registry().create<Backend>(
      ComponentRef{"backend", "cpu", yaml("{type: cpu, matmul_precision: f32}"), "backend"});
  auto model = models.make(yaml(tiny_tied), 9);
  const std::vector<std::int32_t> ids = {5, 9, 200, 7, 1, 42, 42, 3, 17, 250};
  const auto n = static_cast<std::int64_t>(ids.size());
  const Tensor tokens = Tensor::from(std::span<const std::int32_t>(ids), Shape{1, n});
  Ops ops(*backend);
  const std::vector<float> full = model->logits(ops, tokens, Tensor()).to_vector();
  auto cache = model->new_cache(1, 16);
  const std::int64_t vocab = 300;
  for (std::int64_t t = 0; t < n; ++t) {
    const Tensor one = Tensor::from(std::span<const std::int32_t>(ids.data() + t, 1), Shape{1, 1});
    const std::vector<float> step = model->next_logits(ops, one, *cache).to_vector();
    const std::vector<float> expected(full.begin() + t * vocab, full.begin() + (t + 1) * vocab);
    EXPECT_LE(relative_error(step, expected), 1e-5) << "position " << t;
  }
}

// Tensor parallelism's plan: q/k/v by heads, the q/k norms replicated with partial gradients,
// the output projection by rows, the MLP by its width, the embedding by vocabulary rows.
TEST(Gemma3Model, TensorParallelPlan) {
  Models models;
  ModelSetup setup{0};
  setup.tensor_rank = 1;
  setup.tensor_size = 2;
  auto model = models.create(yaml(tiny_tied), setup);
  std::map<std::string, PlannedParameter> plan;
  const auto planned = model->parallel_plan();
  ASSERT_TRUE(planned.has_value());
  for (const auto& p : *planned) plan[p.parameter->name()] = p;
  const auto& qkv = plan.at("layers.0.self_attn.qkv_proj.weight");
  EXPECT_EQ(qkv.whole, (Shape{128, 32}));
  EXPECT_EQ(qkv.parameter->shape(), (Shape{64, 32}));  // 2 of 4 query heads, 1 of 2 key/value heads
  EXPECT_EQ(plan.at("layers.0.self_attn.q_norm.weight").placement.split, TensorSplit::replicated_partial);
  EXPECT_EQ(plan.at("layers.0.self_attn.o_proj.weight").parameter->shape(), (Shape{32, 32}));
  EXPECT_EQ(plan.at("layers.0.mlp.gate_proj.weight").parameter->shape(), (Shape{32, 32}));
  EXPECT_EQ(plan.at("embed_tokens.weight").parameter->shape(), (Shape{150, 32}));
  EXPECT_EQ(plan.at("norm.weight").placement.split, TensorSplit::replicated);
  // Heads that split over no member count are refused, naming them.
  setup.tensor_size = 3;
  setup.tensor_rank = 0;
  const std::string m = message_of([&] { models.create(yaml(tiny_tied), setup); });
  EXPECT_NE(m.find("num_heads (4) is not a multiple of 3"), std::string::npos) << m;
}

// LoRA without the plugin's help: PEFT's q_proj and v_proj are rows of the fused qkv_proj; the
// default targets are every projection the loss multiplies (not the tied embedding).
TEST(Gemma3Model, LoraTargetsPeftModules) {
  Models models;
  auto backend = models.registry().create<Backend>(ComponentRef{"backend", "cpu", yaml("{type: cpu}"), "backend"});
  auto model = models.make(yaml(tiny_tied), 1);
  LoraSettings settings;
  settings.rank = 2;
  settings.target_modules = {"q_proj", "v_proj"};
  const LoraAdapters peft(*model, *backend, settings);
  const auto names = peft.target_names();
  ASSERT_EQ(names.size(), 14u);
  EXPECT_EQ(names[0], "layers.0.self_attn.qkv_proj.weight (q_proj)");
  EXPECT_EQ(names[13], "layers.6.self_attn.qkv_proj.weight (v_proj)");
  settings.target_modules = {};
  const LoraAdapters every(*model, *backend, settings);
  const auto all = every.target_names();
  EXPECT_EQ(all.size(), 7 * 5u);  // qkv_proj, o_proj, gate_proj, up_proj, down_proj
  EXPECT_NE(std::find(all.begin(), all.end(), "layers.6.mlp.down_proj.weight"), all.end());
  for (const auto& n : all) EXPECT_EQ(n.find("embed"), std::string::npos) << n;
}

// ---- against the port of transformers' Gemma 3 ----

class Gemma3Reference : public ::testing::Test {
 protected:
  void SetUp() override {
    std::error_code ec;
    if (!fs::exists(LOOM_REFERENCE_ENV_PYTHON, ec))
      return test::skip_missing_reference("torch is not available: there is no Python environment at " +
                                          std::string(LOOM_REFERENCE_ENV_PYTHON) +
                                          " (scripts/setup-python-env.sh makes it)");
  }
  static void TearDownTestSuite() { std::cout << summary_.str(); }

  // Runs gemma3_reference.py; its skip (77) skips the test, another failure fails it.
  bool port(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {LOOM_REFERENCE_ENV_PYTHON, LOOM_GEMMA3_REFERENCE_SCRIPT};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto r = test::run_command(argv);
    if (r.exit_code == 77) {
      test::skip_missing_reference(r.err.substr(0, r.err.find('\n')));
      return false;
    }
    EXPECT_EQ(r.exit_code, 0) << "gemma3_reference.py failed:\n" << r.out << r.err;
    return r.exit_code == 0;
  }

  // A batch of 2 x 13 tokens with two targets ignored; no token is 0, the pad_token_id, whose
  // embedding row transformers' nn.Embedding(padding_idx=0) leaves without a lookup gradient.
  static std::pair<Tensor, Tensor> batch(const fs::path& file) {
    std::vector<std::int32_t> tokens, targets;
    for (int i = 0; i < 26; ++i) {
      tokens.push_back(1 + (i * 37 + 11) % 299);
      targets.push_back(1 + (i * 53 + 5) % 299);
    }
    targets[3] = -1;
    targets[13] = -1;
    const Tensor t = Tensor::from(std::span<const std::int32_t>(tokens), Shape{2, 13});
    const Tensor y = Tensor::from(std::span<const std::int32_t>(targets), Shape{2, 13});
    const std::pair<std::string, Tensor> named[] = {{"tokens", t}, {"targets", y}};
    st::save(file, named);
    return {t, y};
  }

  // Loss, every gradient and the logits of `options`'s model with the weights of `dir` against
  // the port's `expected`, for every backend and attention kernel.
  void compare(const std::string& name, const Value& options, const fs::path& dir, const st::Reader& expected,
               const Tensor& tokens, const Tensor& targets) {
    Models models;
    for (const auto* backend_entry : models.registry().list("backend")) {
      for (const auto* kernel_entry : models.registry().list("attention")) {
        if (!test::host_attention_kernel(models.registry(), *kernel_entry)) continue;  // a device's kernel
        const std::string combo =
            name + " [backend " + backend_entry->decl.name + ", attention " + kernel_entry->decl.name + "]";
        SCOPED_TRACE(combo);
        auto backend = test::host_float32_backend(models.registry(), *backend_entry);
        if (!backend) continue;  // a device backend (or one whose device is not here)
        Value o = options;
        o.set("attention", kernel_entry->decl.name);
        auto model = models.create(o);
        import_hf(*model, dir);
        Tape tape;
        Ops ops(*backend, &tape);
        const Tensor loss = model->loss(ops, tokens, targets, Tensor());
        const double loss_error = relative_error(loss, expected.read("loss"));
        tape.backward(loss);
        std::map<std::string, Parameter*> by_name;
        for (const auto& p : model->parameters()) by_name[p.parameter->name()] = p.parameter;
        double grad_error = 0;
        std::string worst;
        std::size_t compared = 0;
        for (const auto& t : dynamic_cast<HfModel*>(model.get())->hf_tensors().tensors) {
          Parameter* p = by_name.at(t.parameter);
          ASSERT_TRUE(p->has_grad()) << p->name() << " got no gradient";
          ASSERT_TRUE(expected.contains("grad." + t.name)) << "the port has no parameter " << t.name;
          const double e = relative_error(p->grad().slice(0, t.begin, t.end).clone(), expected.read("grad." + t.name));
          EXPECT_LE(e, tolerance) << "gradient of " << t.name;
          ++compared;
          if (e >= grad_error) {
            grad_error = e;
            worst = t.name;
          }
        }
        EXPECT_GT(compared, 10u);
        Ops eval(*backend);
        const double logits_error = relative_error(model->logits(eval, tokens, Tensor()), expected.read("logits"));
        EXPECT_LE(loss_error, tolerance) << "loss";
        EXPECT_LE(logits_error, tolerance) << "logits";
        std::ostringstream line;
        line << std::scientific << std::setprecision(2) << "gemma3 agreement " << std::left << std::setw(52) << combo
             << " loss " << loss_error << "  logits " << logits_error << "  grads " << grad_error << " (" << worst
             << ")\n";
        summary_ << line.str();
        RecordProperty(name + "_" + backend_entry->decl.name + "_" + kernel_entry->decl.name + "_max_relative_error",
                       std::to_string(std::max({loss_error, logits_error, grad_error})));
      }
    }
  }

  void export_and_compare(const std::string& name, const char* options) {
    test::TempDir dir;
    Models models;
    export_hf(*models.make(yaml(options), 11), nullptr, dir.path() / "hf");
    const auto [tokens, targets] = batch(dir.path() / "batch.safetensors");
    if (!port({"forward", (dir.path() / "hf").string(), (dir.path() / "batch.safetensors").string(),
               (dir.path() / "expected.safetensors").string()}))
      return;
    const st::Reader expected(dir.path() / "expected.safetensors");
    compare(name, yaml(options), dir.path() / "hf", expected, tokens, targets);
  }

  static inline std::ostringstream summary_;
};

TEST_F(Gemma3Reference, ExportTiedWithTheFiveToOnePatternAndLinearRope) {
  export_and_compare("tied", tiny_tied);
}

TEST_F(Gemma3Reference, ExportUntiedWithSoftCapAndItsOwnPattern) {
  export_and_compare("untied", tiny_untied);
}

// The import direction: a directory the port writes as save_pretrained does, read by a run's
// trainer.init_from (the model section from the directory's config.json), exported again.
TEST_F(Gemma3Reference, ImportThroughInitFromAndExportAgain) {
  test::TempDir dir;
  const fs::path source = dir.path() / "source";
  if (!port({"make", source.string(), "21"})) return;
  const Value hf_config = to_value(read_json(source / "config.json"));
  const Value section = gemma3::model_section(hf_config, (source / "config.json").string());

  const auto config = dir.write("run.yaml", "model: " + section.to_flow() + R"(
tokenizer: byte
data: {type: synthetic, num_documents: 50}
optimizer: {type: adamw, learning_rate: 0.0, weight_decay: 0.0}
lr_schedule: constant
trainer: {num_train_steps: 1, train_batch_size: 2, max_eval_batches: 0, sample_length: 0, trackers: [],
          peak_flops: 1.0e9}
)");
  RuntimeOptions options;
  options.config = config;
  options.plugin_paths = {LOOM_PLUGIN_DIR};
  options.default_plugin_path = false;
  options.overrides = {"trainer.run_dir=" + (dir.path() / "run").string(), "trainer.init_from=" + source.string()};
  Runtime runtime(options);
  std::ostringstream log;
  TrainOptions train_options;
  train_options.out = &log;
  train(runtime, train_options);
  EXPECT_NE(log.str().find("init_from: read 93 tensors of the Hugging Face gemma3_text model"), std::string::npos)
      << log.str();

  // The run's final weights (learning rate 0: the imported ones), exported: the same tensors.
  Models models;
  auto model = models.create(section);
  st::load_parameters(dir.path() / "run" / "model.safetensors", model->parameters());
  export_hf(*model, nullptr, dir.path() / "again");
  const st::Reader theirs(source / "model.safetensors"), ours(dir.path() / "again" / "model.safetensors");
  std::set<std::string> their_names, our_names;
  for (const auto& t : theirs.tensors()) their_names.insert(t.name);
  for (const auto& t : ours.tensors()) our_names.insert(t.name);
  EXPECT_EQ(our_names, their_names);
  for (const auto& n : their_names)
    if (ours.contains(n)) {
      EXPECT_EQ(ours.read(n).to_vector(), theirs.read(n).to_vector()) << n;
    }
  const nlohmann::json a = read_json(dir.path() / "again" / "config.json"), b = read_json(source / "config.json");
  for (const char* key :
       {"architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "query_pre_attn_scalar", "sliding_window",
        "sliding_window_pattern", "rope_theta", "rope_local_base_freq", "rope_scaling", "rms_norm_eps",
        "tie_word_embeddings", "final_logit_softcapping", "hidden_activation"})
    EXPECT_EQ(a[key], b[key]) << key;

  // And loom computes what the port computes on the directory it wrote.
  const auto [tokens, targets] = batch(dir.path() / "batch.safetensors");
  if (!port({"forward", source.string(), (dir.path() / "batch.safetensors").string(),
             (dir.path() / "expected.safetensors").string()}))
    return;
  const st::Reader expected(dir.path() / "expected.safetensors");
  compare("import", section, source, expected, tokens, targets);
}

}  // namespace
}  // namespace loom
