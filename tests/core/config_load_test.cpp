// Config files: YAML typing, base_config, !include, cycles, overrides and precedence.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "loom/core/config.hpp"
#include "loom/error.hpp"
#include "test_support.hpp"

namespace loom {
namespace {

using test::TempDir;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ConfigLoad, ScalarsAreTypedByTheYamlCoreSchema) {
  const Value v = config::load_string(
      "i: 42\nneg: -7\nhex: 0x1F\nf: 3e-4\ng: 1.5\ninf: .inf\nt: true\nn: null\ntilde: ~\ns: hello\nq: \"42\"\n"
      "sq: 'true'\nlist: [1, two, 3.0]\n",
      "t.yaml");
  EXPECT_EQ(v.find("i")->as_int(), 42);
  EXPECT_EQ(v.find("neg")->as_int(), -7);
  EXPECT_EQ(v.find("hex")->as_int(), 31);
  EXPECT_EQ(v.find("f")->type(), Value::Type::number);
  EXPECT_DOUBLE_EQ(v.find("f")->as_double(), 3e-4);
  EXPECT_DOUBLE_EQ(v.find("g")->as_double(), 1.5);
  EXPECT_TRUE(std::isinf(v.find("inf")->as_double()));
  EXPECT_TRUE(v.find("t")->as_bool());
  EXPECT_TRUE(v.find("n")->is_null());
  EXPECT_TRUE(v.find("tilde")->is_null());
  EXPECT_EQ(v.find("s")->as_string(), "hello");
  EXPECT_EQ(v.find("q")->as_string(), "42");     // quoted: a string
  EXPECT_EQ(v.find("sq")->as_string(), "true");  // quoted: a string
  EXPECT_EQ(v.find("list")->as_list()[1].as_string(), "two");
}

TEST(ConfigLoad, ValuesRememberFileLineAndColumn) {
  TempDir dir;
  const auto file = dir.write("run.yaml", "model:\n  hidden_dim: 64\n  layers: [1, 2]\n");
  const Value v = config::load_file(file);
  const Value* hidden = v.at_path("model.hidden_dim");
  ASSERT_NE(hidden, nullptr);
  EXPECT_EQ(hidden->location().str(), file.string() + ":2:15");
  EXPECT_EQ(v.at_path("model.layers")->as_list()[1].location().str(), file.string() + ":3:15");
}

TEST(ConfigLoad, InvalidYamlNamesFileAndLine) {
  TempDir dir;
  const auto file = dir.write("bad.yaml", "a: 1\nb: [1, 2\n");
  const std::string msg = error_of([&] { config::load_file(file); });
  EXPECT_NE(msg.find(file.string() + ":"), std::string::npos) << msg;
  EXPECT_NE(msg.find("invalid YAML"), std::string::npos) << msg;
}

TEST(ConfigLoad, DuplicateKeysAreErrors) {
  TempDir dir;
  const auto file = dir.write("dup.yaml", "a: 1\nb: 2\na: 3\n");
  EXPECT_EQ(error_of([&] { config::load_file(file); }), file.string() + ":3:1: duplicate key 'a'");
}

TEST(ConfigLoad, MissingFileIsAUserError) {
  const std::string msg = error_of([] { config::load("/nonexistent/run.yaml", {}); });
  EXPECT_NE(msg.find("config file '/nonexistent/run.yaml' does not exist"), std::string::npos) << msg;
}

TEST(ConfigLoad, BaseConfigMergesMapsAndChildWins) {
  TempDir dir;
  dir.write("base/model.yaml", "model:\n  type: gpt2\n  hidden_dim: 768\n  layers: [1, 2, 3]\ntrainer:\n  steps: 10\n");
  const auto child =
      dir.write("runs/small.yaml", "base_config: ../base/model.yaml\nmodel:\n  hidden_dim: 128\n  layers: [4]\n");
  const Value v = config::load_file(child);
  EXPECT_EQ(v.find("base_config"), nullptr);
  EXPECT_EQ(v.at_path("model.type")->as_string(), "gpt2");     // inherited
  EXPECT_EQ(v.at_path("model.hidden_dim")->as_int(), 128);     // overridden
  EXPECT_EQ(v.at_path("model.layers")->as_list().size(), 1u);  // lists replace
  EXPECT_EQ(v.at_path("trainer.steps")->as_int(), 10);
  // Each value keeps the location of the file it came from.
  EXPECT_NE(v.at_path("model.type")->location().file.find("model.yaml"), std::string::npos);
  EXPECT_NE(v.at_path("model.hidden_dim")->location().file.find("small.yaml"), std::string::npos);
}

TEST(ConfigLoad, SeveralBaseConfigsApplyInOrder) {
  TempDir dir;
  dir.write("a.yaml", "x: 1\ny: 1\n");
  dir.write("b.yaml", "y: 2\nz: 2\n");
  const auto top = dir.write("top.yaml", "base_config: [a.yaml, b.yaml]\nz: 3\n");
  const Value v = config::load_file(top);
  EXPECT_EQ(v.find("x")->as_int(), 1);
  EXPECT_EQ(v.find("y")->as_int(), 2);
  EXPECT_EQ(v.find("z")->as_int(), 3);
}

TEST(ConfigLoad, IncludeIsRelativeToTheIncludingFile) {
  TempDir dir;
  dir.write("parts/optim/adam.yaml", "type: adamw\nlearning_rate: 0.001\n");
  dir.write("parts/model.yaml", "type: gpt2\noptimizer: !include optim/adam.yaml\n");
  const auto top = dir.write("top.yaml", "model: !include parts/model.yaml\n");
  const Value v = config::load_file(top);
  EXPECT_EQ(v.at_path("model.type")->as_string(), "gpt2");
  EXPECT_DOUBLE_EQ(v.at_path("model.optimizer.learning_rate")->as_double(), 0.001);
  EXPECT_NE(v.at_path("model.optimizer.type")->location().str().find("adam.yaml:1:7"), std::string::npos);
}

TEST(ConfigLoad, IncludeCycleIsReportedWithTheChain) {
  TempDir dir;
  dir.write("a.yaml", "x: !include b.yaml\n");
  dir.write("b.yaml", "y: !include c.yaml\n");
  dir.write("c.yaml", "z: !include a.yaml\n");
  const std::string msg = error_of([&] { config::load_file(dir.path() / "a.yaml"); });
  EXPECT_NE(msg.find("include cycle: "), std::string::npos) << msg;
  const auto a = msg.find("a.yaml ->"), b = msg.find("b.yaml ->"), c = msg.find("c.yaml ->");
  EXPECT_TRUE(a != std::string::npos && b != std::string::npos && c != std::string::npos && a < b && b < c) << msg;
}

TEST(ConfigLoad, BaseConfigCycleIsReported) {
  TempDir dir;
  dir.write("a.yaml", "base_config: b.yaml\n");
  dir.write("b.yaml", "base_config: a.yaml\n");
  const std::string msg = error_of([&] { config::load_file(dir.path() / "a.yaml"); });
  EXPECT_NE(msg.find("include cycle"), std::string::npos) << msg;
}

TEST(ConfigLoad, SelfIncludeIsACycle) {
  TempDir dir;
  dir.write("self.yaml", "x: !include ./self.yaml\n");
  EXPECT_NE(error_of([&] { config::load_file(dir.path() / "self.yaml"); }).find("include cycle"), std::string::npos);
}

TEST(ConfigLoad, MissingIncludeNamesTheIncludingLine) {
  TempDir dir;
  const auto top = dir.write("top.yaml", "a: 1\nb: !include nowhere.yaml\n");
  const std::string msg = error_of([&] { config::load_file(top); });
  EXPECT_NE(msg.find(top.string() + ":2:4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nowhere.yaml' does not exist"), std::string::npos) << msg;
}

TEST(ConfigOverride, ValuesParseAsYaml) {
  EXPECT_EQ(config::parse_override("a.b=3").value.as_int(), 3);
  EXPECT_DOUBLE_EQ(config::parse_override("optimizer.learning_rate=3e-4").value.as_double(), 3e-4);
  EXPECT_TRUE(config::parse_override("y=null").value.is_null());
  const Value list = config::parse_override("x=[1,2]").value;
  ASSERT_TRUE(list.is_list());
  EXPECT_EQ(list.as_list()[1].as_int(), 2);
  EXPECT_EQ(config::parse_override("name=hello world").value.as_string(), "hello world");
  EXPECT_EQ(config::parse_override("name=\"7\"").value.as_string(), "7");
  EXPECT_EQ(config::parse_override("m={k: 1}").value.find("k")->as_int(), 1);
  const auto o = config::parse_override("model.attention.type=flash");
  EXPECT_EQ(o.path, (std::vector<std::string>{"model", "attention", "type"}));
}

TEST(ConfigOverride, MalformedOverridesAreUserErrors) {
  EXPECT_NE(error_of([] { config::parse_override("novalue"); }).find("not of the form key.path=value"),
            std::string::npos);
  EXPECT_NE(error_of([] { config::parse_override("=3"); }).find("not of the form"), std::string::npos);
  EXPECT_NE(error_of([] { config::parse_override("a..b=3"); }).find("is not a key path"), std::string::npos);
  EXPECT_NE(error_of([] { config::parse_override("a=[1,"); }).find("not valid YAML"), std::string::npos);
}

TEST(ConfigOverride, PrecedenceIsBaseThenFileThenOverridesInOrder) {
  TempDir dir;
  dir.write("base.yaml", "optimizer:\n  learning_rate: 0.1\n  beta1: 0.9\n  eps: 1.0e-8\n");
  const auto file = dir.write("run.yaml", "base_config: base.yaml\noptimizer:\n  learning_rate: 0.01\n  beta1: 0.8\n");
  const Value v = config::load(file, {"optimizer.learning_rate=0.001", "optimizer.learning_rate=0.002", "new.key=5"});
  EXPECT_DOUBLE_EQ(v.at_path("optimizer.learning_rate")->as_double(), 0.002);  // last override wins
  EXPECT_DOUBLE_EQ(v.at_path("optimizer.beta1")->as_double(), 0.8);            // file over base
  EXPECT_DOUBLE_EQ(v.at_path("optimizer.eps")->as_double(), 1e-8);             // base kept
  EXPECT_EQ(v.at_path("new.key")->as_int(), 5);                                // maps created
  EXPECT_EQ(v.at_path("optimizer.learning_rate")->location().str(),
            "command-line override 'optimizer.learning_rate=0.002'");
}

TEST(ConfigOverride, OverridingThroughAScalarIsAnError) {
  TempDir dir;
  const auto file = dir.write("run.yaml", "model: gpt2\n");
  const std::string msg = error_of([&] { config::load(file, {"model.hidden_dim=3"}); });
  EXPECT_NE(msg.find("'model' is \"gpt2\" (set at " + file.string() + ":1:8), not a map"), std::string::npos) << msg;
}

}  // namespace
}  // namespace loom
