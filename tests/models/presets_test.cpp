// The real-size presets of configs/ describe the published models: each preset's model section,
// built through the plugin host without allocating its parameters, counts exactly the published
// number of parameters (tied embeddings once).
#include <gtest/gtest.h>

#include <filesystem>
#include <loom/core/config.hpp>
#include <loom/core/plugin_host.hpp>
#include <loom/core/registry.hpp>
#include <loom/kinds/model.hpp>
#include <string>

namespace {

namespace fs = std::filesystem;

class Presets : public ::testing::Test {
 protected:
  void SetUp() override { loom::PluginHost().load({{LOOM_PLUGIN_DIR, "test"}}, registry_); }

  // The parameter count of configs/NAME's model, its vocabulary from the preset itself.
  std::int64_t parameters(const std::string& name) {
    const loom::Value root = loom::config::load_file(fs::path(LOOM_CONFIG_DIR) / name);
    const loom::Value* model = root.find("model");
    if (!model) throw std::runtime_error(name + " has no model section");
    const std::string type = model->find("type")->as_string();
    auto m = registry_.create<loom::Model>(loom::ComponentRef{"model", type, *model, "model"});
    loom::ModelSetup setup;
    setup.allocate = false;
    m->build(setup);
    return m->num_parameters();
  }

  loom::Registry registry_;
};

// Published counts: the models' safetensors on the Hugging Face hub (tied embeddings once).
TEST_F(Presets, Qwen25HalfBillion) {
  EXPECT_EQ(parameters("qwen2.5-0.5b.yaml"), 494032768);  // Qwen/Qwen2.5-0.5B
}

TEST_F(Presets, Qwen3SixHundredMillion) {
  EXPECT_EQ(parameters("qwen3-0.6b.yaml"), 596049920);  // Qwen/Qwen3-0.6B
}

TEST_F(Presets, Gemma2TwoBillion) {
  EXPECT_EQ(parameters("gemma2-2b.yaml"), 2614341888);  // google/gemma-2-2b
}

TEST_F(Presets, Mixtral8x7B) {
  EXPECT_EQ(parameters("mixtral-8x7b.yaml"), 46702792704);  // mistralai/Mixtral-8x7B-v0.1
}

TEST_F(Presets, Llama32OneBillion) {
  EXPECT_EQ(parameters("llama-1b.yaml"), 1235814400);  // meta-llama/Llama-3.2-1B
}

}  // namespace
