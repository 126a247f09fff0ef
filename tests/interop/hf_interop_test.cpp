// Weights in and out in the Hugging Face layout (docs/checkpoints.md).
//
// HfInterop: loom alone. A model exported and imported again is bit-identical, single file or
// sharded; config.json carries the fields of its architecture; a config.json, a missing, an
// unexpected or a mis-shaped tensor that does not fit is a UserError naming every difference
// and changes nothing; trainer.init_from starts a run from a Hugging Face directory or a loom
// checkpoint.
//
// HfTransformers: against the real library (transformers in the Python environment of
// scripts/setup-python-env.sh). A trained gpt2, a trained llama (sharded) and a trained Qwen3-style
// llama (use_qk_norm) are exported with `loom export`, and a Mistral-style, a Qwen2-style, a
// Qwen3-style, a biased llama and an untied gpt2 with export_hf; hf_reference.py loads each with
// AutoModelForCausalLM.from_pretrained and computes logits. It then saves GPT-2 (as OpenAI's hub
// file: no prefix, with attn.bias buffers), Llama (sharded, Llama 3 RoPE), Llama (biases, linear
// RoPE, tied), Mistral (sliding window), Qwen2 and Qwen3 models with random weights, which loom
// reads through trainer.init_from's loader. A transformers before 4.51 has no Qwen3: its side is
// then hf_reference.py's own Qwen3ForCausalLM forward (Qwen3Reference, from transformers 4.51's
// modeling_qwen3.py), which also checks the tensor names and shapes. Logits must
// agree to a relative error of 1e-4 both ways:
//   error(loom, transformers) = max |loom - transformers| / max |transformers|
// The errors are printed and recorded as test properties.
#include "loom/run/hf_interop.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "../core/reference_support.hpp"
#include "../core/test_support.hpp"
#include "loom/autograd.hpp"
#include "loom/core/config.hpp"
#include "loom/core/plugin_host.hpp"
#include "loom/core/registry.hpp"
#include "loom/core/runtime.hpp"
#include "loom/error.hpp"
#include "loom/kinds/backend.hpp"
#include "loom/model_support.hpp"
#include "loom/run/generate.hpp"
#include "loom/run/trainer.hpp"
#include "loom/safetensors.hpp"

namespace fs = std::filesystem;

namespace loom {
namespace {

using test::relative_error;

namespace st = safetensors;
constexpr double tolerance = 1e-4;

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

void write_json(const fs::path& path, const nlohmann::json& j) {
  std::ofstream(path) << j.dump(2);
}

Value yaml(const std::string& text) {
  return config::load_string(text, "test.yaml");
}

// The plugins of this build, a cpu backend, and models made from option maps. The backend
// computes in float32 (matmul_precision: f32; its default is bf16 where the CPU has
// AVX512-BF16): its logits are compared with transformers' float32 ones.
class Models {
 public:
  Models() {
    PluginHost().load({{LOOM_PLUGIN_DIR, "test"}}, registry_);
    backend_ = registry_.create<Backend>(
        ComponentRef{"backend", "cpu", yaml("{type: cpu, matmul_precision: f32}"), "backend"});
  }

  // A built model; every parameter drawn from normal(0, 0.3) with `seed` (norm weights and
  // biases too, so that a tensor mapped to the wrong place shows).
  Handle<Model> make(const Value& options, std::uint64_t seed) {
    auto model = registry_.create<Model>(ComponentRef{"model", options.find("type")->as_string(), options, "model"});
    model->build(ModelSetup{0});
    model->initialize(seed);
    std::uint64_t i = 0;
    for (const auto& p : model->parameters())
      models::fill_normal(p.parameter->data(), stream_key(seed, 7, i++), 0.3, default_execution_context());
    return model;
  }

  Tensor logits(Model& model, const Tensor& tokens) {
    Ops ops(*backend_);
    return model.logits(ops, tokens, Tensor());
  }

  Registry& registry() { return registry_; }

 private:
  Registry registry_;
  Handle<Backend> backend_;
};

void expect_same_parameters(Model& a, Model& b) {
  const auto pa = a.parameters(), pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].parameter->name(), pb[i].parameter->name());
    EXPECT_EQ(pa[i].parameter->data().to_vector(), pb[i].parameter->data().to_vector()) << pa[i].parameter->name();
  }
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

// Model options of the cases both suites use (the llama ones with grouped-query attention).
const char* gpt2_tied = "{type: gpt2, seq_len: 16, hidden_dim: 32, num_layers: 2, num_heads: 4, vocab_size: 300}";
const char* gpt2_untied =
    "{type: gpt2, seq_len: 16, hidden_dim: 32, num_layers: 2, num_heads: 4, mlp_scale: 2, vocab_size: 300, "
    "tie_word_embeddings: false, scale_attn_by_inverse_layer_idx: true}";
const char* llama_gqa =
    "{type: llama, seq_len: 32, hidden_dim: 32, intermediate_dim: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2, "
    "vocab_size: 300}";
const char* mistral_window =
    "{type: llama, seq_len: 32, hidden_dim: 32, intermediate_dim: 64, num_layers: 2, num_heads: 4, num_kv_heads: 1, "
    "vocab_size: 300, sliding_window: 4, rope: {theta: 20000}}";
const char* qwen2_tied =
    "{type: llama, seq_len: 32, hidden_dim: 32, intermediate_dim: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2, "
    "vocab_size: 300, qkv_bias: true, tie_word_embeddings: true}";
const char* qwen3_tied =
    "{type: llama, seq_len: 32, hidden_dim: 32, intermediate_dim: 64, num_layers: 2, num_heads: 4, num_kv_heads: 1, "
    "head_dim: 16, vocab_size: 300, use_qk_norm: true, tie_word_embeddings: true, rope: {theta: 1.0e6}, "
    "layer_norm_epsilon: 1.0e-6}";
const char* llama_bias =
    "{type: llama, seq_len: 32, hidden_dim: 32, intermediate_dim: 64, num_layers: 2, num_heads: 4, num_kv_heads: 4, "
    "head_dim: 16, vocab_size: 300, use_bias: true, tie_word_embeddings: true, rope: {type: llama3, factor: 4, "
    "original_max_position_embeddings: 16}}";

// ---- loom alone ----

TEST(HfInterop, ParsesByteSizes) {
  EXPECT_EQ(parse_byte_size("5GB", "x"), 5'000'000'000ull);
  EXPECT_EQ(parse_byte_size("64KiB", "x"), 65536ull);
  EXPECT_EQ(parse_byte_size("2mb", "x"), 2'000'000ull);
  EXPECT_EQ(parse_byte_size("1000", "x"), 1000ull);
  for (const char* bad : {"", "GB", "0", "-1", "1.5GB", "5XB", "99999999999999999999"}) {
    const std::string m = message_of([&] { parse_byte_size(bad, "--max-shard-size"); });
    EXPECT_NE(m.find("--max-shard-size: '" + std::string(bad) + "' is not a size"), std::string::npos) << m;
  }
}

TEST(HfInterop, RoundTripIsExactForEveryArchitecture) {
  Models models;
  const std::map<std::string, std::string> expected_type = {
      {gpt2_tied, "gpt2"},   {gpt2_untied, "gpt2"}, {llama_gqa, "llama"}, {mistral_window, "mistral"},
      {qwen2_tied, "qwen2"}, {llama_bias, "llama"}, {qwen3_tied, "qwen3"}};
  for (const auto& [options, type] : expected_type) {
    SCOPED_TRACE(options);
    test::TempDir dir;
    auto a = models.make(yaml(options), 1);
    const HfExportResult result = export_hf(*a, nullptr, dir.path() / "hf");
    EXPECT_EQ(result.shards, 1);
    EXPECT_TRUE(fs::exists(dir.path() / "hf" / "model.safetensors"));
    EXPECT_EQ(result.tokenizer_note, "no tokenizer files: the run's tokenizer has no Hugging Face form");
    const nlohmann::json config = read_json(dir.path() / "hf" / "config.json");
    EXPECT_EQ(config["model_type"], type);
    EXPECT_EQ(config["vocab_size"], 300);
    EXPECT_EQ(config["torch_dtype"], "float32");
    EXPECT_EQ(st::Reader(dir.path() / "hf" / "model.safetensors").metadata().at("format"), "pt");

    auto b = models.make(yaml(options), 2);
    const auto notes = import_hf(*b, dir.path() / "hf");
    expect_same_parameters(*a, *b);
    ASSERT_EQ(notes.size(), 1u);
    EXPECT_NE(notes[0].find("of the Hugging Face " + type + " model"), std::string::npos) << notes[0];
  }
}

TEST(HfInterop, ConfigJsonCarriesTheArchitecture) {
  Models models;
  test::TempDir dir;
  export_hf(*models.make(yaml(mistral_window), 1), nullptr, dir.path() / "mistral");
  nlohmann::json c = read_json(dir.path() / "mistral" / "config.json");
  EXPECT_EQ(c["architectures"], nlohmann::json::array({"MistralForCausalLM"}));
  EXPECT_EQ(c["sliding_window"], 4);
  EXPECT_EQ(c["num_key_value_heads"], 1);
  EXPECT_EQ(c["head_dim"], 8);
  EXPECT_EQ(c["rope_theta"], 20000.0);
  export_hf(*models.make(yaml(llama_bias), 1), nullptr, dir.path() / "llama");
  c = read_json(dir.path() / "llama" / "config.json");
  EXPECT_EQ(c["architectures"], nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(c["attention_bias"], true);
  EXPECT_EQ(c["mlp_bias"], true);
  EXPECT_EQ(c["head_dim"], 16);
  EXPECT_EQ(c["tie_word_embeddings"], true);
  EXPECT_EQ(c["rope_scaling"], (nlohmann::json{{"rope_type", "llama3"},
                                               {"factor", 4.0},
                                               {"low_freq_factor", 1.0},
                                               {"high_freq_factor", 4.0},
                                               {"original_max_position_embeddings", 16}}));
  export_hf(*models.make(yaml(qwen2_tied), 1), nullptr, dir.path() / "qwen2");
  c = read_json(dir.path() / "qwen2" / "config.json");
  EXPECT_EQ(c["architectures"], nlohmann::json::array({"Qwen2ForCausalLM"}));
  EXPECT_FALSE(c.contains("head_dim"));  // Qwen2 derives it
  // Qwen3: q/k norms, its own head width, no biases; the norms are per-head tensors of their own.
  export_hf(*models.make(yaml(qwen3_tied), 1), nullptr, dir.path() / "qwen3");
  c = read_json(dir.path() / "qwen3" / "config.json");
  EXPECT_EQ(c["architectures"], nlohmann::json::array({"Qwen3ForCausalLM"}));
  EXPECT_EQ(c["model_type"], "qwen3");
  EXPECT_EQ(c["head_dim"], 16);
  EXPECT_EQ(c["attention_bias"], false);
  EXPECT_EQ(c["use_sliding_window"], false);
  EXPECT_EQ(c["rope_theta"], 1e6);
  EXPECT_EQ(c["tie_word_embeddings"], true);
  const st::Reader qwen3_weights(dir.path() / "qwen3" / "model.safetensors");
  EXPECT_EQ(qwen3_weights.info("model.layers.1.self_attn.q_norm.weight").shape, (Shape{16}));
  EXPECT_EQ(qwen3_weights.info("model.layers.1.self_attn.k_norm.weight").shape, (Shape{16}));
  EXPECT_EQ(qwen3_weights.info("model.layers.1.self_attn.q_proj.weight").shape, (Shape{64, 32}));
  EXPECT_FALSE(qwen3_weights.contains("lm_head.weight"));
  export_hf(*models.make(yaml(gpt2_untied), 1), nullptr, dir.path() / "gpt2");
  c = read_json(dir.path() / "gpt2" / "config.json");
  EXPECT_EQ(c["architectures"], nlohmann::json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(c["n_inner"], 64);
  EXPECT_EQ(c["activation_function"], "gelu_new");
  EXPECT_EQ(c["scale_attn_by_inverse_layer_idx"], true);
  EXPECT_EQ(c["tie_word_embeddings"], false);
  // An untied model's output projection is the top-level lm_head.weight, the rest under "transformer."
  const st::Reader weights(dir.path() / "gpt2" / "model.safetensors");
  EXPECT_TRUE(weights.contains("lm_head.weight"));
  EXPECT_TRUE(weights.contains("transformer.h.1.attn.c_attn.weight"));
  EXPECT_EQ(weights.info("transformer.h.1.attn.c_attn.weight").shape, (Shape{32, 96}));  // Conv1D: [in, out]
}

// A run initialised from a Hugging Face directory exports that model's token ids and its
// context (the run trained at a shorter model.seq_len than its rotary positions reach), not the
// end-of-text id as bos_token_id or the training length.
TEST(HfInterop, ConfigJsonKeepsTheBaseModelsTokenIdsAndContext) {
  Models models;
  test::TempDir dir;
  const auto model = models.make(yaml(mistral_window), 1);
  export_hf(*model, nullptr, dir.path() / "plain");
  const nlohmann::json plain = read_json(dir.path() / "plain" / "config.json");
  ASSERT_TRUE(plain.contains("max_position_embeddings"));
  const std::int64_t trained = plain["max_position_embeddings"].get<std::int64_t>();
  dir.write("base/config.json", R"({"model_type": "mistral", "max_position_embeddings": 32768,
                                    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": null})");
  HfExportOptions options;
  options.base_dir = dir.path() / "base";
  export_hf(*model, nullptr, dir.path() / "from-base", options);
  const nlohmann::json c = read_json(dir.path() / "from-base" / "config.json");
  EXPECT_GT(32768, trained);
  EXPECT_EQ(c["max_position_embeddings"], 32768);
  EXPECT_EQ(c["bos_token_id"], 1);
  EXPECT_EQ(c["eos_token_id"], 2);
  // A base shorter than the model's context leaves the model's.
  dir.write("short/config.json", R"({"max_position_embeddings": 1})");
  options.base_dir = dir.path() / "short";
  export_hf(*model, nullptr, dir.path() / "from-short", options);
  EXPECT_EQ(read_json(dir.path() / "from-short" / "config.json")["max_position_embeddings"], trained);
}

TEST(HfInterop, ShardsAboveTheLimitWithAnIndex) {
  Models models;
  test::TempDir dir;
  auto a = models.make(yaml(llama_gqa), 1);
  HfExportOptions options;
  options.max_shard_bytes = 16 * 1024;
  const HfExportResult result = export_hf(*a, nullptr, dir.path() / "hf", options);
  ASSERT_GT(result.shards, 2);
  EXPECT_FALSE(fs::exists(dir.path() / "hf" / "model.safetensors"));
  const nlohmann::json index = read_json(dir.path() / "hf" / "model.safetensors.index.json");
  EXPECT_EQ(index["metadata"]["total_size"], result.weight_bytes);
  std::map<std::string, std::uint64_t> shard_bytes;
  for (const auto& [name, file] : index["weight_map"].items()) {
    const st::Reader shard(dir.path() / "hf" / file.get<std::string>());
    ASSERT_TRUE(shard.contains(name)) << name << " is not in " << file;
    const auto& info = shard.info(name);
    shard_bytes[file] += info.end - info.begin;
  }
  EXPECT_EQ(static_cast<std::int64_t>(shard_bytes.size()), result.shards);
  EXPECT_EQ(static_cast<std::int64_t>(index["weight_map"].size()), result.tensors);
  // The fused qkv_proj of a layer is three tensors: 4 heads of q, 2 of k and 2 of v, 8 wide.
  EXPECT_TRUE(index["weight_map"].contains("model.layers.0.self_attn.k_proj.weight"));
  const st::Reader k_shard(dir.path() / "hf" / index["weight_map"]["model.layers.0.self_attn.k_proj.weight"]);
  EXPECT_EQ(k_shard.info("model.layers.0.self_attn.k_proj.weight").shape, (Shape{16, 32}));
  // A shard passes the limit only when one tensor alone does (the 300 x 32 embedding).
  for (const auto& [file, bytes] : shard_bytes) {
    const st::Reader shard(dir.path() / "hf" / file);
    if (shard.tensors().size() > 1) {
      EXPECT_LE(bytes, options.max_shard_bytes) << file;
    }
  }
  auto b = models.make(yaml(llama_gqa), 2);
  const auto notes = import_hf(*b, dir.path() / "hf");
  expect_same_parameters(*a, *b);
  EXPECT_NE(notes[0].find("(" + std::to_string(result.shards) + " files)"), std::string::npos) << notes[0];
}

TEST(HfInterop, ExportRefusesWhatHuggingFaceCannotHold) {
  Models models;
  test::TempDir dir;
  // q/k norms are Qwen3's, which has no biases.
  auto qk = models.make(yaml(std::string(qwen2_tied).replace(1, 0, "use_qk_norm: true, ")), 1);
  EXPECT_NE(message_of([&] {
              export_hf(*qk, nullptr, dir.path() / "a");
            }).find("model.use_qk_norm with model.qkv_bias has no Hugging Face architecture (Qwen3"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir.path() / "a"));
  auto no_bias = models.make(yaml(std::string(gpt2_tied).replace(1, 0, "use_bias: false, ")), 1);
  EXPECT_NE(message_of([&] { export_hf(*no_bias, nullptr, dir.path() / "b"); }).find("model.use_bias is false"),
            std::string::npos);
  dir.write("c/something", "x");
  auto fine = models.make(yaml(gpt2_tied), 1);
  EXPECT_NE(message_of([&] { export_hf(*fine, nullptr, dir.path() / "c"); }).find("is not empty"), std::string::npos);
}

TEST(HfInterop, ConfigMismatchesAreAllNamed) {
  Models models;
  test::TempDir dir;
  auto model = models.make(yaml(llama_gqa), 1);
  export_hf(*model, nullptr, dir.path() / "hf");
  const auto before = model->parameters()[0].parameter->data().to_vector();
  nlohmann::json c = read_json(dir.path() / "hf" / "config.json");
  c["num_key_value_heads"] = 4;
  c["hidden_size"] = 64;
  c["rms_norm_eps"] = 1e-3;
  c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  write_json(dir.path() / "hf" / "config.json", c);
  const std::string m = message_of([&] { import_hf(*model, dir.path() / "hf"); });
  EXPECT_NE(m.find("does not describe the configured model (4 differences)"), std::string::npos) << m;
  EXPECT_NE(m.find("num_key_value_heads is 4, model.num_kv_heads is 2"), std::string::npos) << m;
  EXPECT_NE(m.find("hidden_size is 64, model.hidden_dim is 32"), std::string::npos) << m;
  EXPECT_NE(m.find("rms_norm_eps is 0.001, model.layer_norm_epsilon is 1e-05"), std::string::npos) << m;
  EXPECT_NE(m.find("rope_scaling.rope_type is \"yarn\""), std::string::npos) << m;
  EXPECT_EQ(model->parameters()[0].parameter->data().to_vector(), before);

  c["model_type"] = "gpt2";
  write_json(dir.path() / "hf" / "config.json", c);
  const std::string other = message_of([&] { import_hf(*model, dir.path() / "hf"); });
  EXPECT_NE(other.find("model_type is \"gpt2\"; the llama model loads Llama, Mistral, Mixtral, Qwen2 and Qwen3"),
            std::string::npos)
      << other;
}

// A field config.json leaves out takes its config class's default, as in transformers 4.46.3
// (hf_config_defaults_test.cpp checks every field against transformers itself):
// MistralConfig's num_key_value_heads is 8, not the query heads; Gemma2Config's
// query_pre_attn_scalar is 224, not 256; Qwen2Config's vocab_size 151936 and intermediate_size
// 22016.
TEST(HfInterop, AbsentConfigFieldsTakeTheConfigClassDefaults) {
  Models models;
  auto without = [&](const char* options, std::vector<std::string> fields) {
    auto model = models.make(yaml(options), 1);
    Value config = dynamic_cast<HfModel&>(*model).hf_config();
    for (const auto& f : fields) config.erase(f);
    std::string all;
    for (const auto& line : dynamic_cast<HfModel&>(*model).hf_config_mismatches(config)) all += line + "\n";
    return all;
  };
  // 4 query heads, 1 key/value head.
  EXPECT_EQ(without(mistral_window, {"num_key_value_heads"}), "num_key_value_heads is 8, model.num_kv_heads is 1\n");
  // As many key/value heads as query heads (Llama's default) is a difference in a Mistral file.
  EXPECT_EQ(without("{type: llama, seq_len: 32, hidden_dim: 32, intermediate_dim: 64, num_layers: 2, num_heads: 4, "
                    "num_kv_heads: 4, vocab_size: 300, sliding_window: 4}",
                    {"num_key_value_heads"}),
            "num_key_value_heads is 8, model.num_kv_heads is 4\n");
  EXPECT_EQ(without(llama_gqa, {"num_key_value_heads"}), "num_key_value_heads is 4, model.num_kv_heads is 2\n");
  EXPECT_EQ(
      without(qwen2_tied, {"vocab_size", "intermediate_size"}),
      "vocab_size is 151936, model.vocab_size is 300\nintermediate_size is 22016, model.intermediate_dim is 64\n");
  const char* gemma_256 =
      "{type: gemma, seq_len: 32, hidden_dim: 32, intermediate_dim: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2, "
      "head_dim: 8, query_pre_attn_scalar: 256, vocab_size: 300}";
  EXPECT_EQ(without(gemma_256, {"query_pre_attn_scalar"}),
            "query_pre_attn_scalar is 224.0, model.query_pre_attn_scalar is 256.0\n");
  EXPECT_EQ(without(gemma_256, {}), "");
}

TEST(HfInterop, MissingUnexpectedAndMisshapenTensorsAreAllNamed) {
  Models models;
  test::TempDir dir;
  auto model = models.make(yaml(gpt2_tied), 1);
  export_hf(*model, nullptr, dir.path() / "hf");
  const fs::path file = dir.path() / "hf" / "model.safetensors";
  std::vector<std::pair<std::string, Tensor>> tensors;
  {
    const st::Reader reader(file);
    for (const auto& t : reader.tensors()) {
      if (t.name == "transformer.h.1.mlp.c_fc.weight") continue;
      tensors.emplace_back(t.name, t.name == "transformer.ln_f.bias" ? Tensor::zeros(Shape{33}) : reader.read(t.name));
    }
  }
  tensors.emplace_back("transformer.h.0.attn.rotary_extra", Tensor::zeros(Shape{4}));
  tensors.emplace_back("transformer.h.1.attn.rotary_extra", Tensor::zeros(Shape{4}));
  tensors.emplace_back("transformer.h.0.attn.bias", Tensor::zeros(Shape{1, 1, 16, 16}));  // ignored
  st::save(file, tensors);
  const auto before = model->parameters()[0].parameter->data().to_vector();
  const std::string m = message_of([&] { import_hf(*model, dir.path() / "hf"); });
  EXPECT_NE(m.find("missing: transformer.h.1.mlp.c_fc.weight"), std::string::npos) << m;
  EXPECT_NE(m.find("transformer.ln_f.bias: the file has F32 [33], the model needs F32, BF16 or F16 [32]"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("not used by the model: transformer.h.*.attn.rotary_extra (2 tensors)"), std::string::npos) << m;
  EXPECT_EQ(m.find("attn.bias"), std::string::npos) << m;
  EXPECT_EQ(model->parameters()[0].parameter->data().to_vector(), before);
}

// Many hub checkpoints are F16: their tensors load, widened to float32 exactly.
TEST(HfInterop, F16FilesLoadWidenedExactly) {
  Models models;
  test::TempDir dir;
  auto a = models.make(yaml(llama_gqa), 1);
  export_hf(*a, nullptr, dir.path() / "hf");
  const fs::path file = dir.path() / "hf" / "model.safetensors";
  // The file again with every tensor in binary16 (safetensors: an 8-byte header length, the JSON
  // header, the data).
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  std::map<std::string, std::vector<float>> widened;
  {
    const st::Reader reader(file);
    for (const auto& t : reader.tensors()) {
      const std::vector<float> values = reader.read(t.name).to_vector();
      std::vector<float>& w = widened[t.name];
      const std::size_t begin = data.size();
      for (const float v : values) {
        const auto h = static_cast<_Float16>(v);
        data.append(reinterpret_cast<const char*>(&h), 2);
        w.push_back(static_cast<float>(h));
      }
      header[t.name] = {{"dtype", "F16"},
                        {"shape", std::vector<std::int64_t>(t.shape.begin(), t.shape.end())},
                        {"data_offsets", {begin, data.size()}}};
    }
  }
  const std::string text = header.dump();
  const std::uint64_t length = text.size();
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(&length), 8);
    out << text << data;
  }
  auto b = models.make(yaml(llama_gqa), 2);
  import_hf(*b, dir.path() / "hf");
  // Each loom parameter against the widened rows of the tensors the layout maps to it.
  const HfTensorLayout layout = dynamic_cast<HfModel&>(*b).hf_tensors();
  std::map<std::string, std::vector<float>> expected;
  for (const auto& t : layout.tensors) {
    const auto& w = widened.at(t.name);
    auto& e = expected[t.parameter];
    e.insert(e.end(), w.begin(), w.end());
  }
  for (const auto& p : b->parameters())
    EXPECT_EQ(p.parameter->data().to_vector(), expected.at(p.parameter->name())) << p.parameter->name();
}

TEST(HfInterop, InitFromLoomWeightsAndCheckpoints) {
  Models models;
  test::TempDir dir;
  auto a = models.make(yaml(llama_gqa), 1);
  st::save_parameters(dir.path() / "weights.safetensors", a->parameters());
  auto b = models.make(yaml(llama_gqa), 2);
  load_initial_weights(*b, dir.path() / "weights.safetensors");
  expect_same_parameters(*a, *b);

  // A run directory with checkpoints: its latest one (docs/checkpoints.md).
  const fs::path run = dir.path() / "run";
  fs::create_directories(run / "checkpoints" / "step-7");
  st::save_parameters(run / "checkpoints" / "step-7" / "model.safetensors", a->parameters());
  dir.write("run/checkpoints/latest", "step-7\n");
  auto c = models.make(yaml(llama_gqa), 3);
  const auto notes = load_initial_weights(*c, run);
  expect_same_parameters(*a, *c);
  EXPECT_NE(notes[0].find("step-7"), std::string::npos) << notes[0];
  EXPECT_EQ(resolve_run_or_checkpoint(run / "checkpoints").dir, run / "checkpoints" / "step-7");

  // The weights file of a Hugging Face directory stands for the directory.
  export_hf(*a, nullptr, dir.path() / "hf");
  auto d = models.make(yaml(llama_gqa), 4);
  const auto hf_notes = load_initial_weights(*d, dir.path() / "hf" / "model.safetensors");
  expect_same_parameters(*a, *d);
  EXPECT_NE(hf_notes[0].find("of the Hugging Face llama model"), std::string::npos) << hf_notes[0];

  const std::string m = message_of([&] { load_initial_weights(*c, dir.path() / "nowhere"); });
  EXPECT_NE(m.find("does not exist"), std::string::npos) << m;
  const std::string shape = message_of([&] { load_initial_weights(*models.make(yaml(mistral_window), 1), run); });
  EXPECT_NE(shape.find("with another shape or dtype"), std::string::npos) << shape;
}

// trainer.init_from from a Hugging Face directory: with a learning rate of 0 the run's final
// weights are the imported ones.
TEST(HfInterop, TrainerInitFromAHuggingFaceDirectory) {
  Models models;
  test::TempDir dir;
  auto a = models.make(yaml(llama_gqa), 1);
  export_hf(*a, nullptr, dir.path() / "hf");
  const auto config = dir.write("run.yaml", std::string("model: ") + llama_gqa + R"(
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
  options.overrides = {"trainer.run_dir=" + (dir.path() / "run").string(),
                       "trainer.init_from=" + (dir.path() / "hf").string()};
  Runtime runtime(options);
  std::ostringstream log;
  TrainOptions train_options;
  train_options.out = &log;
  train(runtime, train_options);
  EXPECT_NE(log.str().find("init_from: read 21 tensors of the Hugging Face llama model"), std::string::npos)
      << log.str();
  auto b = models.make(yaml(llama_gqa), 2);
  st::load_parameters(dir.path() / "run" / "model.safetensors", b->parameters());
  expect_same_parameters(*a, *b);

  options.overrides = {"trainer.run_dir=" + (dir.path() / "bad").string(),
                       "trainer.init_from=" + (dir.path() / "missing").string()};
  Runtime bad(options);
  const std::string m = message_of([&] { train(bad, train_options); });
  EXPECT_NE(m.find("while loading trainer.init_from"), std::string::npos) << m;
}

// `loom export` as a user runs it: a run directory, its checkpoint, and the errors (status 2).
TEST(HfInterop, ExportCommand) {
  test::TempDir dir;
  const auto config = dir.write("run.yaml", std::string("model: ") + gpt2_tied + R"(
tokenizer: byte
data: {type: synthetic, num_documents: 50}
optimizer: {type: adamw, learning_rate: 1.0e-3}
lr_schedule: constant
trainer: {num_train_steps: 1, train_batch_size: 2, max_eval_batches: 0, sample_length: 0, trackers: [],
          peak_flops: 1.0e9}
)");
  RuntimeOptions options;
  options.config = config;
  options.plugin_paths = {LOOM_PLUGIN_DIR};
  options.default_plugin_path = false;
  options.overrides = {"trainer.run_dir=" + (dir.path() / "run").string()};
  Runtime runtime(options);
  std::ostringstream log;
  TrainOptions train_options;
  train_options.out = &log;
  train(runtime, train_options);
  const std::string run = (dir.path() / "run").string();

  auto r = test::run_command(
      {LOOM_BINARY, "export", run, "--format", "hf", (dir.path() / "out").string(), "--max-shard-size", "20KB"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("exported 28 tensors"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("no tokenizer files: the run's tokenizer has no Hugging Face form"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(dir.path() / "out" / "model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(dir.path() / "out" / "config.json"));

  // --dtype bf16: every tensor BF16, half the bytes, config.json's torch_dtype bfloat16.
  r = test::run_command(
      {LOOM_BINARY, "export", run, "--format", "hf", (dir.path() / "out-bf16").string(), "--dtype", "bf16"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  {
    const st::Reader bf16(dir.path() / "out-bf16" / "model.safetensors");
    for (const auto& t : bf16.tensors()) EXPECT_EQ(t.stored_dtype, "BF16") << t.name;
    EXPECT_EQ(read_json(dir.path() / "out-bf16" / "config.json")["torch_dtype"], "bfloat16");
  }

  // A step-N checkpoint directory is the same thing as a run directory.
  fs::create_directories(dir.path() / "run" / "checkpoints" / "step-1");
  for (const char* file : {"config.yaml", "model.safetensors"})
    fs::copy_file(dir.path() / "run" / file, dir.path() / "run" / "checkpoints" / "step-1" / file);
  dir.write("run/checkpoints/latest", "step-1\n");
  r = test::run_command({LOOM_BINARY, "export", run, "--format", "hf", (dir.path() / "out2").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("step-1"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(dir.path() / "out2" / "model.safetensors"));

  const std::vector<std::pair<std::vector<std::string>, std::string>> errors = {
      {{"export", run}, "needs a run or checkpoint and an output directory"},
      {{"export", run, "--format", "onnx", (dir.path() / "x").string()}, "--format onnx is not a format"},
      {{"export", run, "--format", "hf", (dir.path() / "out").string()}, "is not empty"},
      {{"export", run, (dir.path() / "y").string(), "--max-shard-size", "5 GB"}, "is not a size"},
      {{"export", run, (dir.path() / "y").string(), "--dtype", "f16"}, "--dtype f16 is not a dtype loom exports"},
      {{"export", (dir.path() / "nothing").string(), (dir.path() / "z").string()}, "does not exist"},
      {{"export", dir.path().string(), (dir.path() / "z").string()}, "is not a loom run or checkpoint"}};
  for (const auto& [args, message] : errors) {
    std::vector<std::string> argv = {LOOM_BINARY};
    argv.insert(argv.end(), args.begin(), args.end());
    r = test::run_command(argv);
    EXPECT_EQ(r.exit_code, 2) << args.back() << ": " << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  }
}

// Every value of a safetensors file by tensor name, with `prefix` taken off the names.
std::map<std::string, std::vector<float>> tensors_of(const fs::path& file, const std::string& prefix = "") {
  st::Reader reader(file);
  std::map<std::string, std::vector<float>> out;
  for (const auto& info : reader.tensors())
    out[info.name.starts_with(prefix) ? info.name.substr(prefix.size()) : info.name] =
        reader.read(info.name).to_vector();
  return out;
}

std::map<std::string, std::vector<float>> values_of(Model& model) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& p : model.parameters()) out[p.parameter->name()] = p.parameter->data().to_vector();
  return out;
}

// trainer.ema_decay: the final model.safetensors holds the average, a checkpoint holds the live
// weights in model.safetensors and the average in optimizer.safetensors (ema/<parameter>).
// `loom export`, trainer.init_from and `loom generate` take the average by default, --weights live
// (trainer.init_from_weights: live) the live weights, and each says which.
TEST(HfInterop, TheWeightAverageIsWhatExportInitFromAndGenerateTakeByDefault) {
  test::TempDir dir;
  const auto config = dir.write("run.yaml", std::string("model: ") + gpt2_tied + R"(
tokenizer: byte
data: {type: synthetic, num_documents: 50}
optimizer: {type: adamw, learning_rate: 1.0e-2}
lr_schedule: constant
trainer: {num_train_steps: 4, train_batch_size: 2, max_eval_batches: 0, sample_length: 0, trackers: [],
          peak_flops: 1.0e9, ema_decay: 0.5, checkpoint: {save_every_steps: 2}}
)");
  RuntimeOptions options;
  options.config = config;
  options.plugin_paths = {LOOM_PLUGIN_DIR};
  options.default_plugin_path = false;
  auto train_into = [&](const fs::path& run, std::vector<std::string> overrides) {
    overrides.push_back("trainer.run_dir=" + run.string());
    options.overrides = overrides;
    Runtime runtime(options);
    std::ostringstream log;
    TrainOptions train_options;
    train_options.out = &log;
    train(runtime, train_options);
    return log.str();
  };
  const fs::path run = dir.path() / "run";
  train_into(run, {});
  const auto average = tensors_of(run / "model.safetensors");
  const auto live = tensors_of(run / "checkpoints" / "step-4" / "model.safetensors");
  ASSERT_NE(average, live);
  EXPECT_EQ(st::Reader(run / "model.safetensors").metadata().at("loom.weights"), "ema");

  // The files: a run directory means its latest checkpoint, whose average is taken by default.
  const RunFiles ema_files = resolve_run_or_checkpoint(run);
  EXPECT_EQ(ema_files.weights, run / "checkpoints" / "step-4" / "model.safetensors");
  EXPECT_EQ(ema_files.average, run / "checkpoints" / "step-4" / "optimizer.safetensors");
  EXPECT_NE(ema_files.description.find("the weight average"), std::string::npos) << ema_files.description;
  const RunFiles live_files = resolve_run_or_checkpoint(run, WeightsChoice::live);
  EXPECT_TRUE(live_files.average.empty());
  EXPECT_NE(live_files.description.find("the live weights of checkpoint"), std::string::npos);

  // trainer.init_from, in a model: the average, or with live the live weights.
  Models models;
  auto a = models.make(yaml(gpt2_tied), 1);
  const auto notes = load_initial_weights(*a, run);
  EXPECT_EQ(values_of(*a), average);
  EXPECT_NE(notes[0].find("the weight average (trainer.ema_decay) of checkpoint"), std::string::npos) << notes[0];
  load_initial_weights(*a, run, WeightsChoice::live);
  EXPECT_EQ(values_of(*a), live);
  // And through the trainer (learning rate 0: the final weights are the starting ones).
  const fs::path from_ema = dir.path() / "from_ema", from_live = dir.path() / "from_live";
  const std::vector<std::string> frozen{"trainer.ema_decay=0",
                                        "trainer.num_train_steps=1",
                                        "optimizer.learning_rate=0",
                                        "optimizer.weight_decay=0",
                                        "trainer.checkpoint.save_every_steps=0",
                                        "trainer.init_from=" + run.string()};
  const std::string log = train_into(from_ema, frozen);
  EXPECT_NE(log.find("init_from: read 28 parameters: the weight average"), std::string::npos) << log;
  EXPECT_EQ(tensors_of(from_ema / "model.safetensors"), average);
  auto live_overrides = frozen;
  live_overrides.push_back("trainer.init_from_weights=live");
  train_into(from_live, live_overrides);
  EXPECT_EQ(tensors_of(from_live / "model.safetensors"), live);

  // loom export: the average unless --weights live, and the output says which.
  auto r = test::run_command({LOOM_BINARY, "export", run.string(), (dir.path() / "ema").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(
      r.out.find("the weight average (trainer.ema_decay) of checkpoint " + (run / "checkpoints" / "step-4").string()),
      std::string::npos)
      << r.out;
  EXPECT_EQ(tensors_of(dir.path() / "ema" / "model.safetensors", "transformer."), average);
  r = test::run_command({LOOM_BINARY, "export", run.string(), (dir.path() / "live").string(), "--weights", "live"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("the live weights of checkpoint"), std::string::npos) << r.out;
  EXPECT_EQ(tensors_of(dir.path() / "live" / "model.safetensors", "transformer."), live);
  r = test::run_command({LOOM_BINARY, "export", run.string(), (dir.path() / "x").string(), "--weights", "both"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--weights is 'both': give ema"), std::string::npos) << r.err;

  // loom generate reads the final weights (the average); --weights live finds the checkpoint of
  // the same step. Greedy continuations of the two differ, and each says what it read.
  r = test::run_command({LOOM_BINARY, "generate", run.string(), "--greedy", "-n", "8"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(
      r.err.find("loom generate: the weight average (trainer.ema_decay) of " + (run / "model.safetensors").string()),
      std::string::npos)
      << r.err;
  r = test::run_command({LOOM_BINARY, "generate", run.string(), "--greedy", "-n", "8", "--weights", "live"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("the live weights of checkpoint " + (run / "checkpoints" / "step-4").string()),
            std::string::npos)
      << r.err;

  // Without a checkpoint of its last step, the live weights were never saved: an error.
  fs::remove_all(run / "checkpoints");
  const std::string m = message_of([&] { resolve_run_or_checkpoint(run, WeightsChoice::live); });
  EXPECT_NE(m.find("holds the weight average of its run (trainer.ema_decay), and the live weights were saved only "
                   "in checkpoints"),
            std::string::npos)
      << m;
  // A run without an average has only its live weights, and says so.
  const fs::path plain = dir.path() / "plain";
  train_into(plain, {"trainer.ema_decay=0"});
  const RunFiles plain_files = resolve_run_or_checkpoint(plain);
  EXPECT_TRUE(plain_files.average.empty());
  EXPECT_NE(plain_files.description.find("(its run kept no weight average)"), std::string::npos)
      << plain_files.description;
}

// ---- against transformers ----

struct Export {
  Handle<Model> model;
  std::string expected_class;
};

class HfTransformers : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::error_code ec;
    if (!fs::exists(LOOM_REFERENCE_ENV_PYTHON, ec)) {
      skip_reason_ = "transformers is not available: there is no Python environment at " +
                     std::string(LOOM_REFERENCE_ENV_PYTHON) +
                     " (scripts/setup-python-env.sh, called by scripts/install-deps.sh, makes it)";
      return;
    }
    work_ = std::make_unique<test::TempDir>();
    models_ = std::make_unique<Models>();
    fs::create_directories(work_->path() / "export");
    train_and_export();
    for (const auto& [name, options] : std::map<std::string, const char*>{{"mistral_window", mistral_window},
                                                                          {"qwen2_tied", qwen2_tied},
                                                                          {"qwen3_tied", qwen3_tied},
                                                                          {"llama_bias_tied", llama_bias},
                                                                          {"gpt2_untied", gpt2_untied}}) {
      auto model = models_->make(yaml(options), 5);
      export_hf(*model, nullptr, work_->path() / "export" / name);
      exports_[name] = {model, ""};
    }
    const auto r = test::run_command({LOOM_REFERENCE_ENV_PYTHON, LOOM_HF_REFERENCE_SCRIPT, work_->path().string()});
    if (r.exit_code == 77) {
      skip_reason_ = r.err.substr(0, r.err.find('\n'));
      return;
    }
    python_output_ = r.out + r.err;
    python_ok_ = r.exit_code == 0;
  }

  // A gpt2 with GPT-2's tokenizer (configs/data/gpt2, shipped with the repository) and a llama
  // trained for a few steps by the trainer, exported by the `loom` command (the llama in shards).
  static void train_and_export() {
    const fs::path data(LOOM_DATA_DIR);
    const std::string tokenizer = "{type: gpt2-bpe, encoder_json: '" + (data / "gpt2/encoder.json").string() +
                                  "', vocab_bpe: '" + (data / "gpt2/vocab.bpe").string() + "'}";
    const std::map<std::string, std::string> runs = {
        {"gpt2_trained", "{type: gpt2, seq_len: 16, hidden_dim: 32, num_layers: 2, num_heads: 4}"},
        {"llama_trained", std::string(llama_gqa)},
        // configs/qwen3-tiny.yaml's architecture, smaller.
        {"qwen3_trained",
         "{type: llama, seq_len: 32, hidden_dim: 32, intermediate_dim: 96, num_layers: 2, num_heads: 4, "
         "num_kv_heads: 1, use_qk_norm: true, rope: {theta: 1000000}, layer_norm_epsilon: 1.0e-6, "
         "tie_word_embeddings: true}"}};
    for (const auto& [name, model] : runs) {
      const std::string tok = name == "gpt2_trained" ? tokenizer : "byte";
      const auto config = work_->write(name + ".yaml", "model: " + model + "\ntokenizer: " + tok + R"(
data: {type: synthetic, num_documents: 100}
optimizer: {type: adamw, learning_rate: 1.0e-2}
lr_schedule: constant
trainer: {num_train_steps: 3, train_batch_size: 2, max_eval_batches: 0, sample_length: 0, trackers: [],
          peak_flops: 1.0e9}
)");
      RuntimeOptions options;
      options.config = config;
      options.plugin_paths = {LOOM_PLUGIN_DIR};
      options.default_plugin_path = false;
      options.overrides = {"trainer.run_dir=" + (work_->path() / name).string()};
      Runtime runtime(options);
      std::ostringstream log;
      TrainOptions train_options;
      train_options.out = &log;
      train(runtime, train_options);

      std::vector<std::string> command = {LOOM_BINARY, "export", (work_->path() / name).string(),
                                          "--format",  "hf",     (work_->path() / "export" / name).string()};
      if (name == "llama_trained") command.insert(command.end(), {"--max-shard-size", "16KiB"});
      const auto r = test::run_command(command);
      export_output_[name] = r.out + r.err;
      if (r.exit_code != 0) continue;

      RuntimeOptions reload;
      reload.config = work_->path() / name / "config.yaml";
      reload.plugin_paths = {LOOM_PLUGIN_DIR};
      reload.default_plugin_path = false;
      runtimes_.push_back(std::make_unique<Runtime>(reload));
      LoadedRun run = load_run(*runtimes_.back(), work_->path() / name);
      if (name == "gpt2_trained") tokenizer_ = run.tokenizer;
      exports_[name] = {run.model, name == "gpt2_trained"    ? "GPT2LMHeadModel"
                                   : name == "qwen3_trained" ? "Qwen3ForCausalLM"
                                                             : "LlamaForCausalLM"};
    }
    export_qlora();
  }

  // QLoRA: a LoRA run over the trained llama with its base in nf4, exported merged
  // (`loom export --merge-lora`) in f32 and in bf16 (--dtype bf16). The f32 export is compared with
  // the model the run trained (its nf4 base with the adapters, LinearAdaptersScope); the bf16 one
  // with the same files read back by loom.
  static void export_qlora() {
    const auto config = work_->write("llama_qlora.yaml", "model: " + std::string(llama_gqa) + R"(
tokenizer: byte
data: {type: synthetic, num_documents: 100}
optimizer: {type: adamw, learning_rate: 1.0e-2}
lr_schedule: constant
lora: {rank: 4, base_dtype: nf4}
trainer: {num_train_steps: 3, train_batch_size: 2, max_eval_batches: 0, sample_length: 0, trackers: [],
          peak_flops: 1.0e9}
)");
    RuntimeOptions options;
    options.config = config;
    options.plugin_paths = {LOOM_PLUGIN_DIR};
    options.default_plugin_path = false;
    options.overrides = {"trainer.run_dir=" + (work_->path() / "llama_qlora").string(),
                         "trainer.init_from=" + (work_->path() / "llama_trained").string()};
    {
      Runtime runtime(options);
      std::ostringstream log;
      TrainOptions train_options;
      train_options.out = &log;
      train(runtime, train_options);
    }
    for (const std::string dtype : {"f32", "bf16"}) {
      const std::string name = "llama_qlora_merged_" + dtype;
      const auto r =
          test::run_command({LOOM_BINARY, "export", (work_->path() / "llama_qlora").string(), "--format", "hf",
                             (work_->path() / "export" / name).string(), "--merge-lora", "--dtype", dtype});
      export_output_[name] = r.out + r.err;
    }
    RuntimeOptions reload;
    reload.config = work_->path() / "llama_qlora" / "config.yaml";
    reload.plugin_paths = {LOOM_PLUGIN_DIR};
    reload.default_plugin_path = false;
    runtimes_.push_back(std::make_unique<Runtime>(reload));
    LoadedRun run = load_run(*runtimes_.back(), work_->path() / "llama_qlora");
    adapters_["llama_qlora_merged_f32"] = run.lora;
    exports_["llama_qlora_merged_f32"] = {run.model, "LlamaForCausalLM"};
    const fs::path bf16 = work_->path() / "export" / "llama_qlora_merged_bf16";
    if (fs::exists(bf16 / "config.json")) {
      auto model = models_->make(yaml(llama_gqa), 1);
      import_hf(*model, bf16);
      exports_["llama_qlora_merged_bf16"] = {model, "LlamaForCausalLM"};
    }
  }

  static void TearDownTestSuite() {
    std::cout << summary_.str();
    exports_.clear();
    adapters_.clear();
    tokenizer_.reset();
    runtimes_.clear();
    models_.reset();
    work_.reset();
  }

  void SetUp() override {
    if (!skip_reason_.empty()) return loom::test::skip_missing_reference(skip_reason_);
    ASSERT_TRUE(python_ok_) << "tests/interop/hf_reference.py failed:\n" << python_output_;
  }

  void record(const std::string& what, double error) {
    std::ostringstream line;
    line << std::scientific << std::setprecision(2) << "hf-interop " << std::left << std::setw(40) << what
         << " logits relative error " << error << "\n";
    summary_ << line.str();
    RecordProperty(what, std::to_string(error));
  }

  // loom -> transformers: the exported directory loaded by from_pretrained.
  void check_export(const std::string& name, const std::string& expected_class) {
    ASSERT_TRUE(exports_.count(name)) << "the export of " << name << " failed:\n" << export_output_[name];
    const fs::path results = work_->path() / "export_results";
    const nlohmann::json report = read_json(results / (name + ".json"));
    EXPECT_EQ(report["class"], expected_class);
    EXPECT_TRUE(report["missing"].empty()) << report.dump();
    EXPECT_TRUE(report["unexpected"].empty()) << report.dump();
    EXPECT_TRUE(report["mismatched"].empty()) << report.dump();
    const st::Reader reader(results / (name + ".safetensors"));
    std::optional<LinearAdaptersScope> scope;
    if (const auto it = adapters_.find(name); it != adapters_.end()) scope.emplace(&it->second->table());
    const double error =
        relative_error(models_->logits(*exports_[name].model, reader.read("tokens")), reader.read("logits"));
    EXPECT_LE(error, tolerance);
    record("export " + name, error);
  }

  // transformers -> loom: a save_pretrained directory read by trainer.init_from's loader.
  std::vector<std::string> check_import(const std::string& name) {
    const fs::path dir = work_->path() / "import";
    auto model = models_->make(config::load_file(dir / (name + ".loom.json")), 3);
    const std::vector<std::string> notes = load_initial_weights(*model, dir / name);
    const st::Reader expected(dir / (name + ".expected.safetensors"));
    const double error = relative_error(models_->logits(*model, expected.read("tokens")), expected.read("logits"));
    EXPECT_LE(error, tolerance);
    record("import " + name, error);
    return notes;
  }

  static inline std::string skip_reason_, python_output_;
  static inline bool python_ok_ = false;
  // The adapters of a model in exports_ whose base is stored (its logits need them in scope).
  static inline std::map<std::string, std::shared_ptr<LoraAdapters>> adapters_;
  static inline std::unique_ptr<test::TempDir> work_;
  static inline std::unique_ptr<Models> models_;
  static inline std::vector<std::unique_ptr<Runtime>> runtimes_;
  static inline std::map<std::string, Export> exports_;
  static inline std::map<std::string, std::string> export_output_;
  static inline Handle<Tokenizer> tokenizer_;
  static inline std::ostringstream summary_;
};

TEST_F(HfTransformers, ExportTrainedGpt2) {
  check_export("gpt2_trained", "GPT2LMHeadModel");
  const fs::path dir = work_->path() / "export" / "gpt2_trained";
  for (const char* file : {"vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json"})
    EXPECT_TRUE(fs::exists(dir / file)) << file;
  // transformers' tokenizer, read from the exported files, encodes as loom's does.
  const st::Reader reader(work_->path() / "export_results" / "gpt2_trained.safetensors");
  const Tensor ids_tensor = reader.read("tokenizer_ids");
  const std::span<const std::int32_t> ids(ids_tensor.data<std::int32_t>(),
                                          static_cast<std::size_t>(ids_tensor.numel()));
  const std::vector<std::int32_t> loom_ids =
      tokenizer_->encode("Hello world, this is loom's export.<|endoftext|> Again: 42 tokens\n\tand   spaces.");
  EXPECT_EQ(loom_ids, std::vector<std::int32_t>(ids.begin(), ids.end()));
  EXPECT_EQ(read_json(dir / "config.json")["eos_token_id"], 50256);
}

TEST_F(HfTransformers, ExportTrainedLlamaInShards) {
  EXPECT_TRUE(fs::exists(work_->path() / "export" / "llama_trained" / "model.safetensors.index.json"));
  EXPECT_NE(export_output_["llama_trained"].find("shards"), std::string::npos) << export_output_["llama_trained"];
  check_export("llama_trained", "LlamaForCausalLM");
}

// issue 22: the merged model of a LoRA run with an nf4 base (the dequantized base plus the
// adapters), in f32 and in bf16 files that transformers loads.
TEST_F(HfTransformers, ExportQloraRunMerged) {
  const fs::path dir = work_->path() / "export" / "llama_qlora_merged_bf16";
  ASSERT_TRUE(fs::exists(dir / "model.safetensors")) << export_output_["llama_qlora_merged_bf16"];
  EXPECT_EQ(read_json(dir / "config.json")["torch_dtype"], "bfloat16");
  const st::Reader reader(dir / "model.safetensors");
  for (const auto& t : reader.tensors()) EXPECT_EQ(t.stored_dtype, "BF16") << t.name;
  check_export("llama_qlora_merged_bf16", "LlamaForCausalLM");
  check_export("llama_qlora_merged_f32", "LlamaForCausalLM");
}

TEST_F(HfTransformers, ExportMistralSlidingWindow) {
  check_export("mistral_window", "MistralForCausalLM");
}

TEST_F(HfTransformers, ExportQwen2Tied) {
  check_export("qwen2_tied", "Qwen2ForCausalLM");
}

// Qwen3's q/k norms as model.layers.N.self_attn.{q,k}_norm.weight, read by Qwen3ForCausalLM (or,
// before transformers 4.51, by hf_reference.py's Qwen3Reference: the report says which).
TEST_F(HfTransformers, ExportQwen3TrainedAndTied) {
  EXPECT_EQ(read_json(work_->path() / "export" / "qwen3_trained" / "config.json")["model_type"], "qwen3");
  check_export("qwen3_trained", "Qwen3ForCausalLM");
  check_export("qwen3_tied", "Qwen3ForCausalLM");
  std::cout << "hf-interop qwen3 read by "
            << read_json(work_->path() / "export_results" / "qwen3_tied.json")["implementation"].get<std::string>()
            << "\n";
}

TEST_F(HfTransformers, ExportLlamaBiasesLlama3Rope) {
  check_export("llama_bias_tied", "LlamaForCausalLM");
}

TEST_F(HfTransformers, ExportGpt2Untied) {
  check_export("gpt2_untied", "GPT2LMHeadModel");
}

TEST_F(HfTransformers, ImportHubStyleGpt2IgnoringItsBuffers) {
  const auto notes = check_import("gpt2_hub");
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_EQ(notes[1],
            "ignored tensors the model does not use: h.*.attn.bias (2 tensors), h.*.attn.masked_bias (2 tensors)");
}

TEST_F(HfTransformers, ImportGpt2Untied) {
  check_import("gpt2_untied");
}

TEST_F(HfTransformers, ImportShardedLlamaWithLlama3Rope) {
  ASSERT_TRUE(fs::exists(work_->path() / "import" / "llama_sharded" / "model.safetensors.index.json"));
  const auto notes = check_import("llama_sharded");
  EXPECT_EQ(notes[0].find("(1 file)"), std::string::npos) << notes[0];
}

TEST_F(HfTransformers, ImportLlamaWithBiasesAndLinearRope) {
  check_import("llama_bias_tied");
}

TEST_F(HfTransformers, ImportMistralSlidingWindow) {
  check_import("mistral_window");
}

TEST_F(HfTransformers, ImportQwen2) {
  check_import("qwen2_tied");
}

TEST_F(HfTransformers, ImportQwen3) {
  check_import("qwen3_tied");
}

}  // namespace
}  // namespace loom
