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

TEST(ConfigOverride, OverridingThroughANonMapIsAnError) {
  TempDir dir;
  const auto file = dir.write("run.yaml", "trainer: 5\n");
  const std::string msg = error_of([&] { config::load(file, {"trainer.seed=3"}); });
  EXPECT_NE(msg.find("'trainer' is 5 (set at " + file.string() + ":1:10), not a map"), std::string::npos) << msg;
}

// ---- Component sections across layers: a changed `type` starts the section afresh ----

// The keys of the map at `path`, in order.
std::vector<std::string> keys_at(const Value& root, std::string_view path) {
  std::vector<std::string> out;
  const Value* v = root.at_path(path);
  if (v && v->is_map())
    for (const auto& [k, e] : v->as_map()) out.push_back(k);
  return out;
}

using Keys = std::vector<std::string>;

TEST(ConfigLayers, ABaseFileOfOneTypeAndAChildOfAnotherKeepOnlyTheChildsOptions) {
  TempDir dir;
  const auto base = dir.write("base.yaml", "data:\n  type: synthetic\n  num_documents: 20000\n  seed: 3\n");
  const auto child =
      dir.write("child.yaml", "base_config: base.yaml\ndata:\n  type: text\n  paths: [a.txt]\n  seed: 4\n");
  std::vector<config::DroppedOptions> dropped;
  const Value v = config::load_file(child, &dropped);
  EXPECT_EQ(keys_at(v, "data"), (Keys{"type", "paths", "seed"}));
  EXPECT_EQ(v.at_path("data.seed")->as_int(), 4);
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].path, "data");
  EXPECT_EQ(dropped[0].old_type, "synthetic");
  EXPECT_EQ(dropped[0].new_type, "text");
  EXPECT_EQ(dropped[0].layer, child.string());
  // seed was given again by the child, so only num_documents was lost.
  EXPECT_EQ(dropped[0].keys, (Keys{"num_documents (" + base.string() + ":3:18)"}));
  const std::string note = dropped[0].str();
  EXPECT_NE(note.find("data: " + child.string() + " changed the type from 'synthetic' to 'text'"), std::string::npos)
      << note;
  EXPECT_NE(note.find("num_documents"), std::string::npos) << note;
}

TEST(ConfigLayers, ADatasetMixtureReplacesADatasetAndTheOtherWayRound) {
  TempDir dir;
  dir.write("base.yaml", "data:\n  type: synthetic\n  num_documents: 20000\n");
  const auto child = dir.write("child.yaml", "base_config: base.yaml\ndata:\n  mixture:\n    a: {type: text}\n");
  std::vector<config::DroppedOptions> dropped;
  Value v = config::load_file(child, &dropped);
  EXPECT_EQ(keys_at(v, "data"), (Keys{"mixture"}));
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].new_type, "mixture");
  // Options merge into a mixture as into any map; a `type` replaces it.
  v = config::load(child, {"data.weights.a=2"}, nullptr);
  EXPECT_EQ(keys_at(v, "data"), (Keys{"mixture", "weights"}));
  dropped.clear();
  v = config::load(child, {"data.type=synthetic"}, &dropped);
  EXPECT_EQ(keys_at(v, "data"), (Keys{"type"}));
  ASSERT_EQ(dropped.size(), 2u);  // the file's layer, then the override's
  EXPECT_EQ(dropped[1].old_type, "mixture");
  EXPECT_EQ(dropped[1].keys, (Keys{"mixture (" + child.string() + ":4:5)"}));
}

TEST(ConfigLayers, AnOverrideChangingTheTypeDropsTheEarlierOptionsAndLaterOverridesApply) {
  TempDir dir;
  const auto file = dir.write("run.yaml", "data:\n  type: synthetic\n  num_documents: 20000\n");
  std::vector<config::DroppedOptions> dropped;
  const Value v = config::load(file, {"data.type=text", "data.paths=[a.txt]"}, &dropped);
  EXPECT_EQ(keys_at(v, "data"), (Keys{"type", "paths"}));
  EXPECT_EQ(v.at_path("data.type")->as_string(), "text");
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].layer, "command-line override 'data.type=text'");
  EXPECT_EQ(dropped[0].keys, (Keys{"num_documents (" + file.string() + ":3:18)"}));

  // An override is a layer of its own: an option given on the command line before the type
  // changes belongs to the old type and goes with it.
  dropped.clear();
  const Value w = config::load(file, {"data.seed=5", "data.type=text"}, &dropped);
  EXPECT_EQ(keys_at(w, "data"), (Keys{"type"}));
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].keys.size(), 2u);
  EXPECT_EQ(dropped[0].keys[1], "seed (command-line override 'data.seed=5')");
}

TEST(ConfigLayers, AMapOverrideWithTypeAndOptionsIsOneLayer) {
  TempDir dir;
  const auto file = dir.write("run.yaml", "optimizer: {type: adamw, beta2: 0.99, learning_rate: 0.002}\n");
  std::vector<config::DroppedOptions> dropped;
  const Value v = config::load(file, {"optimizer={type: sgd, momentum: 0.9}"}, &dropped);
  EXPECT_EQ(keys_at(v, "optimizer"), (Keys{"type", "momentum"}));
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].keys.size(), 2u);  // beta2 and learning_rate
}

TEST(ConfigLayers, TheSameTypeAgainOrNoTypeKeepsTheEarlierOptions) {
  TempDir dir;
  dir.write("base.yaml", "optimizer:\n  type: adamw\n  beta2: 0.99\n");
  const auto same = dir.write("same.yaml", "base_config: base.yaml\noptimizer:\n  type: adamw\n  eps: 1.0e-6\n");
  const auto untyped = dir.write("untyped.yaml", "base_config: base.yaml\noptimizer:\n  eps: 1.0e-6\n");
  std::vector<config::DroppedOptions> dropped;
  EXPECT_EQ(keys_at(config::load_file(same, &dropped), "optimizer"), (Keys{"type", "beta2", "eps"}));
  EXPECT_EQ(keys_at(config::load_file(untyped, &dropped), "optimizer"), (Keys{"type", "beta2", "eps"}));
  EXPECT_EQ(keys_at(config::load(untyped, {"optimizer.type=adamw"}, &dropped), "optimizer"),
            (Keys{"type", "beta2", "eps"}));
  // A bare name equal to the type is the same type.
  EXPECT_EQ(keys_at(config::load(untyped, {"optimizer=adamw"}, &dropped), "optimizer"), (Keys{"type", "beta2", "eps"}));
  EXPECT_TRUE(dropped.empty());

  // An earlier layer that named no type used the section's default, which the loader does not
  // know: its options are kept, and validation judges them against the new type.
  const auto no_type = dir.write("no_type.yaml", "optimizer:\n  beta2: 0.99\n");
  EXPECT_EQ(keys_at(config::load(no_type, {"optimizer.type=sgd"}, &dropped), "optimizer"), (Keys{"beta2", "type"}));
  EXPECT_TRUE(dropped.empty());
}

TEST(ConfigLayers, NestedComponentSectionsFollowTheSameRule) {
  TempDir dir;
  const auto file = dir.write("run.yaml",
                              "model:\n  type: gpt2\n  hidden_dim: 64\n  attention:\n    type: flash\n"
                              "    block_size: 32\n");
  std::vector<config::DroppedOptions> dropped;
  Value v = config::load(file, {"model.attention.type=naive"}, &dropped);
  EXPECT_EQ(keys_at(v, "model"), (Keys{"type", "hidden_dim", "attention"}));
  EXPECT_EQ(keys_at(v, "model.attention"), (Keys{"type"}));
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].path, "model.attention");
  EXPECT_EQ(dropped[0].keys, (Keys{"block_size (" + file.string() + ":6:17)"}));

  // The same through a file layer, and through a bare name.
  dir.write("child.yaml", "base_config: run.yaml\nmodel:\n  attention: naive\n");
  dropped.clear();
  v = config::load_file(dir.path() / "child.yaml", &dropped);
  EXPECT_EQ(v.at_path("model.attention")->as_string(), "naive");
  EXPECT_EQ(v.at_path("model.hidden_dim")->as_int(), 64);
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].path, "model.attention");

  // Changing the outer type starts the whole section afresh, nested sections included.
  dropped.clear();
  v = config::load(file, {"model.type=llama"}, &dropped);
  EXPECT_EQ(keys_at(v, "model"), (Keys{"type"}));
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].path, "model");
  EXPECT_EQ(dropped[0].keys.size(), 2u);  // hidden_dim, attention
}

TEST(ConfigLayers, OptionsGivenToABareNameExtendIt) {
  TempDir dir;
  const auto file = dir.write("run.yaml", "model:\n  type: gpt2\n  attention: flash\n");
  Value v = config::load(file, {"model.attention.block_size=64"});
  EXPECT_EQ(v.at_path("model.attention.type")->as_string(), "flash");
  EXPECT_EQ(v.at_path("model.attention.block_size")->as_int(), 64);
  EXPECT_EQ(v.at_path("model.attention.type")->location().str(), file.string() + ":3:14");

  dir.write("child.yaml", "base_config: run.yaml\nmodel:\n  attention: {block_size: 16}\n");
  v = config::load_file(dir.path() / "child.yaml");
  EXPECT_EQ(keys_at(v, "model.attention"), (Keys{"type", "block_size"}));

  // A type change through a bare name: nothing to drop, the new type with its options.
  std::vector<config::DroppedOptions> dropped;
  v = config::load(file, {"model.attention={type: naive, causal: true}"}, &dropped);
  EXPECT_EQ(keys_at(v, "model.attention"), (Keys{"type", "causal"}));
  EXPECT_TRUE(dropped.empty());
}

TEST(ConfigLayers, SeveralBaseConfigsAreLayersInOrder) {
  TempDir dir;
  const auto a = dir.write("a.yaml", "lr_schedule: {type: cosine, warmup: 50, min_lr_ratio: 0.1}\n");
  const auto b = dir.write("b.yaml", "lr_schedule: {type: wsd, decay: 0.2}\n");
  const auto top = dir.write("top.yaml", "base_config: [a.yaml, b.yaml]\nlr_schedule: {warmup: 10}\n");
  std::vector<config::DroppedOptions> dropped;
  const Value v = config::load_file(top, &dropped);
  EXPECT_EQ(keys_at(v, "lr_schedule"), (Keys{"type", "decay", "warmup"}));
  EXPECT_EQ(v.at_path("lr_schedule.warmup")->as_int(), 10);
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].layer, b.string());
  EXPECT_EQ(dropped[0].keys.size(), 2u);
}

TEST(ConfigLayers, AnIncludedFilesLayersAreNamedWhereItLands) {
  TempDir dir;
  dir.write("parts/sgd.yaml", "type: sgd\nmomentum: 0.9\n");
  const auto adam = dir.write("parts/adam.yaml", "base_config: sgd.yaml\ntype: adamw\nbeta2: 0.95\n");
  const auto top = dir.write("top.yaml", "optimizer: !include parts/adam.yaml\n");
  std::vector<config::DroppedOptions> dropped;
  const Value v = config::load_file(top, &dropped);
  EXPECT_EQ(keys_at(v, "optimizer"), (Keys{"type", "beta2"}));
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].path, "optimizer");
  EXPECT_EQ(dropped[0].layer, adam.string());
}

// The options a section declares for every type (the run layer's optimizer.learning_rate and
// max_grad_norm) are not the old type's: where the loader knows the top-level schema, a change of
// type keeps them, in every kind of layer, and the note names only what was dropped.
TEST(ConfigLayers, SectionWideOptionsSurviveATypeChange) {
  OptionSchema section;
  section.number("learning_rate", 6e-4, "Peak rate.").min(0.0);
  section.number("max_grad_norm", 1.0, "Clip.").min(0.0).nullable();
  OptionSchema stage;
  stage.component("optimizer", "optimizer", "adamw", "Nested under an object.").section_options(section);
  OptionSchema sections;
  sections.component("optimizer", "optimizer", "adamw", "The optimizer.").section_options(section);
  sections.component("model", "model", std::nullopt, "No section options.");
  sections.object("stage", stage, "An object holding a component section.");

  TempDir dir;
  const auto file = dir.write("run.yaml",
                              "optimizer:\n  type: adamw\n  learning_rate: 2.0e-3\n  beta2: 0.99\n"
                              "model: {type: gpt2, hidden_dim: 64}\n");
  std::vector<config::DroppedOptions> dropped;
  // The command line: the rate given before the type change stays.
  Value v = config::load(file, {"optimizer.learning_rate=1e-3", "optimizer.type=sgd"}, &dropped, &sections);
  ASSERT_EQ(keys_at(v, "optimizer"), (Keys{"type", "learning_rate"}));
  EXPECT_EQ(v.at_path("optimizer.learning_rate")->as_double(), 1e-3);
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].keys, (Keys{"beta2 (" + file.string() + ":4:10)"}));

  // A map with the new type and its options, and a bare name: the file's rate stays.
  dropped.clear();
  v = config::load(file, {"optimizer={type: sgd, momentum: 0.9, max_grad_norm: 0.5}"}, &dropped, &sections);
  ASSERT_EQ(keys_at(v, "optimizer"), (Keys{"type", "momentum", "max_grad_norm", "learning_rate"}));
  EXPECT_EQ(v.at_path("optimizer.learning_rate")->as_double(), 2e-3);
  EXPECT_EQ(v.at_path("optimizer.max_grad_norm")->as_double(), 0.5);
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0].keys.size(), 1u);  // beta2
  v = config::load(file, {"optimizer=sgd"}, nullptr, &sections);
  ASSERT_EQ(keys_at(v, "optimizer"), (Keys{"type", "learning_rate"}));
  EXPECT_EQ(v.at_path("optimizer.type")->as_string(), "sgd");

  // A file layer over a base of another type.
  const auto child = dir.write("child.yaml", "base_config: run.yaml\noptimizer: {type: lion, beta1: 0.95}\n");
  v = config::load_file(child, nullptr, &sections);
  EXPECT_EQ(keys_at(v, "optimizer"), (Keys{"type", "beta1", "learning_rate"}));

  // A section under a plain map follows the same rule; a section that declares none drops all.
  const auto nested = dir.write("nested.yaml", "stage:\n  optimizer: {type: adamw, learning_rate: 0.1, eps: 1.0e-8}\n");
  v = config::load(nested, {"stage.optimizer.type=sgd"}, nullptr, &sections);
  EXPECT_EQ(keys_at(v, "stage.optimizer"), (Keys{"type", "learning_rate"}));
  v = config::load(file, {"model.type=llama"}, nullptr, &sections);
  EXPECT_EQ(keys_at(v, "model"), (Keys{"type"}));

  // Without the schema the loader cannot tell, and drops them (the behaviour of plain load()).
  v = config::load(file, {"optimizer.type=sgd"});
  EXPECT_EQ(keys_at(v, "optimizer"), (Keys{"type"}));
}

}  // namespace
}  // namespace loom
