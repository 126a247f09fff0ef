// A config.json that leaves out optional fields, read as transformers reads it (docs/checkpoints.md).
//
// For each architecture loom exports (GPT-2, Llama, Mistral, Qwen2 and Qwen3 with and without a
// sliding window, Mixtral, Gemma 2), a small model's config.json is written once per field with that field
// removed; hf_config_defaults.py (in the Python environment of scripts/setup-python-env.sh) reads
// each with AutoConfig.from_pretrained and reports the value the field then takes: the config
// class's default, or what the class derives from the other fields. loom's check of the file
// against the model (HfModel::hf_config_mismatches) must read the same value: no difference
// when it is the model's own, else a difference naming the field with transformers' value
// ("num_key_value_heads is 8, model.num_kv_heads is 1"). Skips, saying why, without transformers;
// a transformers without Qwen3 (before 4.51) leaves the Qwen3 cases out, saying so.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../core/test_support.hpp"
#include "loom/core/config.hpp"
#include "loom/core/plugin_host.hpp"
#include "loom/core/registry.hpp"
#include "loom/hf_interop.hpp"
#include "loom/kinds/model.hpp"
#include "loom/run/hf_interop.hpp"
#include "reference_required.hpp"

namespace fs = std::filesystem;

namespace loom {
namespace {

// Fields that do not change the function the weights compute, which loom does not read
// (docs/checkpoints.md: dropouts, initialisation, a RoPE model's max_position_embeddings, the
// router's training settings, file metadata).
const std::set<std::string> unread = {"architectures",        "model_type",
                                      "torch_dtype",          "transformers_version",
                                      "initializer_range",    "attention_dropout",
                                      "embd_pdrop",           "resid_pdrop",
                                      "attn_pdrop",           "use_cache",
                                      "bos_token_id",         "eos_token_id",
                                      "pad_token_id",         "router_aux_loss_coef",
                                      "output_router_logits", "router_jitter_noise",
                                      "pretraining_tp",       "max_position_embeddings"};

struct Case {
  std::string name;
  std::string model;
};

// Small models whose fields differ from the config classes' defaults where that matters
// (grouped-query attention, a head_dim not hidden / heads, a Gemma query_pre_attn_scalar of 256).
const std::vector<Case> cases = {
    {"gpt2",
     "{type: gpt2, seq_len: 16, hidden_dim: 32, num_layers: 2, num_heads: 4, mlp_scale: 2, vocab_size: 300, "
     "tie_word_embeddings: false, scale_attn_by_inverse_layer_idx: true}"},
    {"llama",
     "{type: llama, seq_len: 32, hidden_dim: 32, intermediate_dim: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2, "
     "vocab_size: 300}"},
    {"llama_bias",
     "{type: llama, seq_len: 32, hidden_dim: 32, intermediate_dim: 64, num_layers: 2, num_heads: 4, num_kv_heads: 4, "
     "head_dim: 16, vocab_size: 300, use_bias: true, tie_word_embeddings: true, rope: {type: llama3, factor: 4, "
     "original_max_position_embeddings: 16}}"},
    {"mistral",
     "{type: llama, seq_len: 32, hidden_dim: 32, intermediate_dim: 64, num_layers: 2, num_heads: 4, num_kv_heads: 1, "
     "vocab_size: 300, sliding_window: 4, rope: {theta: 20000}}"},
    {"mistral_mha",
     "{type: llama, seq_len: 32, hidden_dim: 64, intermediate_dim: 64, num_layers: 2, num_heads: 8, num_kv_heads: 8, "
     "vocab_size: 300, sliding_window: 4096}"},
    {"qwen2",
     "{type: llama, seq_len: 32, hidden_dim: 32, intermediate_dim: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2, "
     "vocab_size: 300, qkv_bias: true, tie_word_embeddings: true}"},
    {"qwen2_window",
     "{type: llama, seq_len: 32, hidden_dim: 32, intermediate_dim: 64, num_layers: 4, num_heads: 4, num_kv_heads: 2, "
     "vocab_size: 300, qkv_bias: true, sliding_window: 8, max_window_layers: 2}"},
    {"qwen3",
     "{type: llama, seq_len: 32, hidden_dim: 32, intermediate_dim: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2, "
     "head_dim: 16, vocab_size: 300, use_qk_norm: true, tie_word_embeddings: true, rope: {theta: 1.0e6}}"},
    {"qwen3_window",
     "{type: llama, seq_len: 32, hidden_dim: 32, intermediate_dim: 64, num_layers: 4, num_heads: 4, num_kv_heads: 2, "
     "vocab_size: 300, use_qk_norm: true, sliding_window: 8, max_window_layers: 2}"},
    {"mixtral",
     "{type: llama, seq_len: 32, hidden_dim: 32, intermediate_dim: 48, num_layers: 2, num_heads: 4, num_kv_heads: 2, "
     "vocab_size: 300, layer_norm_epsilon: 1.0e-5, rope: {theta: 1.0e6}, moe: {num_experts: 4, experts_per_token: "
     "2}}"},
    {"gemma2",
     "{type: gemma, seq_len: 32, hidden_dim: 32, intermediate_dim: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2, "
     "head_dim: 8, query_pre_attn_scalar: 8, sliding_window: 8, vocab_size: 300}"},
    {"gemma2_256",
     "{type: gemma, seq_len: 32, hidden_dim: 32, intermediate_dim: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2, "
     "head_dim: 8, query_pre_attn_scalar: 256, vocab_size: 300}"},
};

Value to_value(const nlohmann::json& j) {
  if (j.is_null()) return Value();
  if (j.is_boolean()) return Value(j.get<bool>());
  if (j.is_number_integer()) return Value(j.get<std::int64_t>());
  if (j.is_number()) return Value(j.get<double>());
  if (j.is_string()) return Value(j.get<std::string>());
  if (j.is_array()) {
    Value::List list;
    for (const auto& e : j) list.push_back(to_value(e));
    return Value(list);
  }
  Value map = Value::map();
  for (const auto& [k, v] : j.items()) map.set(k, to_value(v));
  return map;
}

bool same(const nlohmann::json& a, const nlohmann::json& b) {
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    return std::abs(x - y) <= 1e-9 * std::max(std::abs(x), std::abs(y));
  }
  return a == b;
}

// The value a mismatch line "FIELD is VALUE, ..." gives FIELD, as text.
std::string value_in(const std::string& line, const std::string& field) {
  const std::string start = field + " is ";
  if (!line.starts_with(start)) return "";
  std::string rest = line.substr(start.size());
  return rest.substr(0, std::min(rest.find(','), rest.find(';')));
}

bool reads_as(const std::string& text, const nlohmann::json& expected) {
  if (expected.is_null()) return text == "null";
  if (expected.is_boolean()) return text == (expected.get<bool>() ? "true" : "false");
  if (expected.is_string()) return text == Value(expected.get<std::string>()).describe();
  if (expected.is_number()) {
    char* end = nullptr;
    const double x = std::strtod(text.c_str(), &end);
    return end != text.c_str() && *end == '\0' && same(nlohmann::json(x), expected);
  }
  return false;
}

TEST(HfConfigDefaults, AbsentFieldsReadAsTransformersReadsThem) {
  std::error_code ec;
  if (!fs::exists(LOOM_REFERENCE_ENV_PYTHON, ec))
    return test::skip_missing_reference(
        std::string("transformers is not available: there is no Python environment at ") + LOOM_REFERENCE_ENV_PYTHON +
        " (scripts/setup-python-env.sh makes it)");
  Registry registry;
  PluginHost().load({{LOOM_PLUGIN_DIR, "test"}}, registry);
  test::TempDir work;
  std::map<std::string, Handle<Model>> models;
  std::map<std::string, nlohmann::json> full;
  for (const auto& c : cases) {
    const Value options = config::load_string(c.model, "test.yaml");
    auto model = registry.create<Model>(ComponentRef{"model", options.find("type")->as_string(), options, "model"});
    model->build(ModelSetup{0});
    model->initialize(1);
    export_hf(*model, nullptr, work.path() / "export" / c.name);
    std::ifstream in(work.path() / "export" / c.name / "config.json");
    const nlohmann::json config = nlohmann::json::parse(in);
    ASSERT_TRUE(dynamic_cast<HfModel&>(*model).hf_config_mismatches(to_value(config)).empty()) << c.name;
    for (const auto& [field, value] : config.items()) {
      if (unread.count(field)) continue;
      nlohmann::json without = config;
      without.erase(field);
      const fs::path dir = work.path() / "cases" / c.name / field;
      fs::create_directories(dir);
      std::ofstream(dir / "config.json") << without.dump(2);
    }
    models[c.name] = model;
    full[c.name] = config;
  }
  const auto r =
      test::run_command({LOOM_REFERENCE_ENV_PYTHON, LOOM_HF_CONFIG_DEFAULTS_SCRIPT, (work.path() / "cases").string()});
  if (r.exit_code == 77) return test::skip_missing_reference(r.err.substr(0, r.err.find('\n')));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::cout << r.out;
  std::ifstream in(work.path() / "cases" / "expected.json");
  const nlohmann::json expected = nlohmann::json::parse(in);

  int checked = 0, differing = 0;
  for (const auto& c : cases) {
    if (!expected.contains(c.name)) {
      // Only a case the script skipped, saying why (a model_type this transformers predates).
      ASSERT_TRUE(expected["skipped"].contains(c.name)) << c.name << " is missing from " << expected.dump();
      std::cout << "hf_config_defaults: " << c.name << " not checked: " << expected["skipped"][c.name] << "\n";
      continue;
    }
    HfModel& hf = dynamic_cast<HfModel&>(*models.at(c.name));
    for (const auto& [field, theirs] : expected.at(c.name).items()) {
      SCOPED_TRACE(c.name + " without " + field);
      nlohmann::json without = full.at(c.name);
      without.erase(field);
      const std::vector<std::string> lines = hf.hf_config_mismatches(to_value(without));
      std::string all;
      for (const auto& l : lines) all += "\n  " + l;
      ++checked;
      if (same(theirs, full.at(c.name).at(field))) {
        // transformers reads the model's own value: the file still describes the model.
        EXPECT_TRUE(lines.empty()) << "transformers takes " << theirs.dump() << ", the model's own; loom says:" << all;
        continue;
      }
      ++differing;
      // transformers reads another value: loom must name the field, with that value (or, for
      // Qwen2's use_sliding_window, the window it switches off).
      if (field == "use_sliding_window" && !theirs.get<bool>()) {
        EXPECT_NE(all.find("\n  sliding_window is null, "), std::string::npos) << all;
        continue;
      }
      const auto line =
          std::find_if(lines.begin(), lines.end(), [&](const std::string& l) { return l.starts_with(field + " is "); });
      ASSERT_NE(line, lines.end()) << "transformers takes " << theirs.dump() << " (the file had "
                                   << full.at(c.name).at(field).dump() << "); loom says:" << all;
      EXPECT_TRUE(reads_as(value_in(*line, field), theirs))
          << "transformers takes " << theirs.dump() << "; loom says: " << *line;
    }
  }
  std::cout << "hf_config_defaults: " << checked << " fields removed, " << differing
            << " of them read by transformers as a value other than the model's\n";
  EXPECT_GT(differing, 20);
}

}  // namespace
}  // namespace loom
