// Validation of config nodes against declared options: every error path names the file and
// line, the key path, what was expected and the closest valid key.
#include <gtest/gtest.h>

#include "loom/core/config.hpp"
#include "loom/core/registry.hpp"
#include "loom/error.hpp"
#include "loom/kinds/lr_schedule.hpp"
#include "loom/kinds/tokenizer.hpp"
#include "test_support.hpp"

namespace loom {
namespace {

class Flat final : public LrSchedule {
 public:
  explicit Flat(const Options& o) : scale_(o.get<double>("scale")) {}
  double learning_rate(std::int64_t, std::int64_t, double peak) const override { return peak * scale_; }
  double scale_;
};

class Chars final : public Tokenizer {
 public:
  std::int64_t vocab_size() const override { return 128; }
  std::vector<std::int32_t> encode(std::string_view) const override { return {}; }
  std::string decode(std::span<const std::int32_t>) const override { return ""; }
};

OptionSchema schedule_options() {
  OptionSchema s;
  s.number("scale", 0.5, "Scale.").range(0.0, 1.0);
  s.integer("warmup", 100, "Warmup steps.").min(0);
  s.string("mode", "cosine", "Shape.").one_of({"linear", "cosine"});
  s.list("betas", OptionType::number, {0.9, 0.95}, "Betas.").length(2, 2).range(0.0, 1.0, false);
  OptionSchema restart;
  restart.integer("every", 10, "Period.").min(1);
  s.object("restart", restart, "Restarts.");
  s.component("tokenizer", "tokenizer", "chars", "Nested.");
  s.boolean("verbose", false, "Chatty.");
  return s;
}

class ValidateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<ComponentEntry> entries;
    entries.push_back(
        {nullptr,
         "lr_schedule",
         {.name = "flat", .description = "flat schedule", .version = "1", .options = schedule_options()},
         [](const Options& o, const CreateContext&) -> std::unique_ptr<Component> { return std::make_unique<Flat>(o); },
         "<test>"});
    OptionSchema none;
    entries.push_back(
        {nullptr,
         "tokenizer",
         {.name = "chars", .description = "chars", .version = "1", .options = none},
         [](const Options&, const CreateContext&) -> std::unique_ptr<Component> { return std::make_unique<Chars>(); },
         "<test>"});
    registry.add(std::move(entries));
  }

  // Writes `yaml` to a file, loads it with `overrides`, and validates `lr_schedule` in it.
  Value validate(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
    file = dir.write("run.yaml", yaml);
    const Value root = config::load(file, overrides);
    return config::validate_component("lr_schedule", *root.find("lr_schedule"), "lr_schedule", registry);
  }

  std::string error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
    try {
      validate(yaml, overrides);
    } catch (const UserError& e) {
      return e.what();
    }
    return "(no error)";
  }

  // The error for `yaml` must be the file's path followed by `suffix`.
  void expect_error(const std::string& yaml, const std::string& suffix) {
    const std::string msg = error(yaml);
    EXPECT_EQ(msg, file.string() + suffix);
  }

  Registry registry;
  test::TempDir dir;
  std::filesystem::path file;
};

TEST_F(ValidateTest, FillsDefaultsInDeclarationOrder) {
  const Value v = validate("lr_schedule:\n  type: flat\n  warmup: 5\n");
  ASSERT_TRUE(v.is_map());
  std::vector<std::string> keys;
  for (const auto& [k, x] : v.as_map()) keys.push_back(k);
  EXPECT_EQ(keys,
            (std::vector<std::string>{"type", "scale", "warmup", "mode", "betas", "restart", "tokenizer", "verbose"}));
  EXPECT_EQ(v.find("warmup")->as_int(), 5);
  EXPECT_DOUBLE_EQ(v.find("scale")->as_double(), 0.5);
  EXPECT_EQ(v.at_path("restart.every")->as_int(), 10);
  EXPECT_EQ(v.at_path("tokenizer.type")->as_string(), "chars");
}

TEST_F(ValidateTest, BareNameSelectsAComponent) {
  const Value v = validate("lr_schedule: flat\n");
  EXPECT_EQ(v.find("type")->as_string(), "flat");
}

TEST_F(ValidateTest, IntegersAreAcceptedAsNumbersAndIntegralFloatsAsIntegers) {
  const Value v = validate("lr_schedule:\n  type: flat\n  scale: 1\n  warmup: 1e3\n");
  EXPECT_EQ(v.find("scale")->type(), Value::Type::number);
  EXPECT_EQ(v.find("warmup")->as_int(), 1000);
}

TEST_F(ValidateTest, UnknownKeyNamesFileLineClosestKeyAndTheOptions) {
  const std::string msg = error("lr_schedule:\n  type: flat\n  warmpu: 5\n");
  const std::string head =
      file.string() + ":3:11: lr_schedule.warmpu: unknown option of lr_schedule 'flat'; did you mean 'warmup'?";
  EXPECT_EQ(msg.substr(0, msg.find('\n')), head) << msg;
  EXPECT_NE(msg.find("warmup (int, default 100): Warmup steps."), std::string::npos) << msg;
  EXPECT_NE(msg.find("scale (float, default 0.5): Scale."), std::string::npos) << msg;
}

TEST_F(ValidateTest, WrongTypeSaysWhatWasExpected) {
  expect_error("lr_schedule:\n  type: flat\n  warmup: soon\n",
               ":3:11: lr_schedule.warmup: expected an integer >= 0, got \"soon\"");
  expect_error("lr_schedule:\n  type: flat\n  verbose: 1\n",
               ":3:12: lr_schedule.verbose: expected a boolean (true or false), got 1");
  expect_error("lr_schedule:\n  type: flat\n  warmup: 2.5\n",
               ":3:11: lr_schedule.warmup: expected an integer >= 0, got 2.5");
}

TEST_F(ValidateTest, OutOfRangeValuesAreRejected) {
  expect_error("lr_schedule:\n  type: flat\n  scale: 1.5\n",
               ":3:10: lr_schedule.scale: expected a number in [0, 1], got 1.5 (out of range)");
  expect_error("lr_schedule:\n  type: flat\n  warmup: -1\n",
               ":3:11: lr_schedule.warmup: expected an integer >= 0, got -1 (out of range)");
}

TEST_F(ValidateTest, ChoicesSuggestTheClosest) {
  expect_error(
      "lr_schedule:\n  type: flat\n  mode: cosin\n",
      ":3:9: lr_schedule.mode: expected a string, one of linear, cosine, got \"cosin\" (did you mean 'cosine'?)");
}

TEST_F(ValidateTest, ListsCheckLengthAndEachElement) {
  expect_error("lr_schedule:\n  type: flat\n  betas: [0.9]\n",
               ":3:10: lr_schedule.betas: expected a list of 2 numbers in (0, 1), got [0.9] (wrong length)");
  expect_error("lr_schedule:\n  type: flat\n  betas: [0.9, 1.0]\n",
               ":3:16: lr_schedule.betas[1]: expected a list of 2 numbers in (0, 1), got 1.0 (out of range)");
}

TEST_F(ValidateTest, NestedObjectsAreValidatedWithTheirPath) {
  expect_error("lr_schedule:\n  type: flat\n  restart:\n    every: 0\n",
               ":4:12: lr_schedule.restart.every: expected an integer >= 1, got 0 (out of range)");
  const std::string msg = error("lr_schedule:\n  type: flat\n  restart:\n    evry: 3\n");
  EXPECT_EQ(
      msg.substr(0, msg.find('\n')),
      file.string() + ":4:11: lr_schedule.restart.evry: unknown option of lr_schedule.restart; did you mean 'every'?");
}

TEST_F(ValidateTest, ErrorsInOverridesNameTheOverride) {
  EXPECT_EQ(error("lr_schedule:\n  type: flat\n", {"lr_schedule.scale=7"}),
            "command-line override 'lr_schedule.scale=7': lr_schedule.scale: expected a number in [0, 1], got 7 (out "
            "of range)");
}

TEST_F(ValidateTest, UnknownTypeListsWhatIsAvailable) {
  registry.set_search_info({"/some/dir (LOOM_PLUGIN_PATH)"}, {{"/some/dir/libloom-x.so", "not an ELF shared object"}});
  const std::string msg = error("lr_schedule:\n  type: flta\n");
  EXPECT_EQ(msg.substr(0, msg.find('\n')),
            file.string() + ":2:9: lr_schedule: unknown lr_schedule 'flta'; did you mean 'flat'?");
  EXPECT_NE(msg.find("available lr_schedules:\n  flat  <test>"), std::string::npos) << msg;
  EXPECT_NE(msg.find("plugin path searched:\n  /some/dir (LOOM_PLUGIN_PATH)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("plugins that failed to load:\n  /some/dir/libloom-x.so: not an ELF shared object"),
            std::string::npos)
      << msg;
}

TEST_F(ValidateTest, UnknownNestedComponentIsReportedAtItsPath) {
  const std::string msg = error("lr_schedule:\n  type: flat\n  tokenizer: bpe\n");
  EXPECT_EQ(msg.substr(0, msg.find('\n')), file.string() + ":3:14: lr_schedule.tokenizer: unknown tokenizer 'bpe'");
}

TEST_F(ValidateTest, MissingTypeIsExplained) {
  expect_error(
      "lr_schedule:\n  scale: 0.1\n",
      ":2:3: lr_schedule: missing `type`: which lr_schedule to use (for example `lr_schedule: {type: NAME, ...}`)");
}

TEST_F(ValidateTest, RequiredOptionsMustBeGiven) {
  OptionSchema s;
  s.integer("steps", 0, "Total steps.").required();
  const Value node = config::load_string("other: 1\n", "r.yaml");
  try {
    config::validate(s, config::load_string("{}\n", "r.yaml"), "trainer", registry);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "r.yaml:1:1: trainer: missing required option 'steps' (an integer): Total steps.");
  }
}

TEST_F(ValidateTest, NullDefaultOptionsAreNullUnlessGiven) {
  OptionSchema s;
  s.boolean("flag", std::nullopt, "A switch.");
  s.integer("head_dim", std::nullopt, "Width of one head; null: derived.").min(2);
  s.number("theta", std::nullopt, "Base.").min(0.0, false);
  s.string("path", std::nullopt, "A file.");
  s.list("sizes", OptionType::integer, std::nullopt, "Sizes.").min(1);
  s.component("tokenizer", "tokenizer", std::nullopt, "A tokenizer.");
  for (const OptionSpec& spec : s.options()) {
    SCOPED_TRACE(spec.name());
    EXPECT_TRUE(spec.is_nullable());
    EXPECT_FALSE(spec.is_required());
    EXPECT_TRUE(spec.default_value().is_null());
    EXPECT_EQ(spec.expectation().substr(spec.expectation().size() - 9), ", or null");
  }

  // Absent: present in the validated map, as null.
  const Options absent(config::validate(s, config::load_string("{}\n", "n.yaml"), "model", registry), "model");
  for (const char* name : {"flag", "head_dim", "theta", "path", "sizes", "tokenizer"}) {
    ASSERT_NE(absent.values().find(name), nullptr) << name;
    EXPECT_TRUE(absent.is_null(name)) << name;
  }
  EXPECT_EQ(absent.get_optional<std::int64_t>("head_dim"), std::nullopt);

  // Given: validated like any option of its type (bounds included); null may be written out.
  const Options given(
      config::validate(s,
                       config::load_string("{flag: true, head_dim: 8, theta: null, path: a.txt, sizes: [2, 3], "
                                           "tokenizer: chars}\n",
                                           "n.yaml"),
                       "model", registry),
      "model");
  EXPECT_EQ(given.get_optional<bool>("flag"), true);
  EXPECT_EQ(given.get_optional<std::int64_t>("head_dim"), 8);
  EXPECT_TRUE(given.is_null("theta"));
  EXPECT_EQ(given.get<std::string>("path"), "a.txt");
  EXPECT_EQ(given.get<std::vector<std::int64_t>>("sizes"), (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(given.component("tokenizer").name, "chars");
  try {
    config::validate(s, config::load_string("{head_dim: 1}\n", "n.yaml"), "model", registry);
    FAIL() << "head_dim 1 accepted";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()),
              "n.yaml:1:12: model.head_dim: expected an integer >= 2, or null, got 1 (out of range)");
  }
}

TEST_F(ValidateTest, CreateGivesTheComponentItsOptions) {
  const Value root = config::load_string("lr_schedule:\n  type: flat\n  scale: 0.25\n", "c.yaml");
  auto schedule =
      registry.create<LrSchedule>(ComponentRef{"lr_schedule", "", *root.find("lr_schedule"), "lr_schedule"});
  EXPECT_DOUBLE_EQ(schedule->learning_rate(0, 10, 2.0), 0.5);
}

// A component's declaration is written with designated fields; the positional form, where two
// adjacent strings could trade places, does not compile.
template <class Decl>
concept PositionalDecl = requires {
  Decl{std::string(), std::string(), std::string(), OptionSchema()};
};
template <class Decl>
concept PositionalDeclAfterTag = requires {
  Decl{{}, std::string(), std::string(), std::string(), OptionSchema()};
};
template <class Decl>
concept DesignatedDecl = requires {
  Decl{.name = std::string(), .description = std::string(), .version = std::string()};
};
static_assert(!PositionalDecl<ComponentDecl>);
static_assert(!PositionalDeclAfterTag<ComponentDecl>);
static_assert(DesignatedDecl<ComponentDecl>);

TEST(ComponentDecl, DesignatedFieldsLandWhereTheySay) {
  const ComponentDecl decl{.name = "x", .description = "an x", .version = "1.2.3"};
  EXPECT_EQ(decl.name, "x");
  EXPECT_EQ(decl.description, "an x");
  EXPECT_EQ(decl.version, "1.2.3");
  EXPECT_TRUE(decl.options.empty());
}

// A section's own options (the run layer's optimizer.learning_rate): validated, defaulted and
// listed with the component's options, with the component's suggested default; a typo among them
// gets the closest key; a component that declares one itself is refused.
TEST_F(ValidateTest, SectionOptionsJoinTheComponentsOptions) {
  OptionSchema section;
  section.number("peak", 1.0, "Peak, read by the owner of the section.").min(0.0);
  OptionSchema root;
  root.component("lr_schedule", "lr_schedule", "flat", "The schedule.").section_options(section);
  auto load = [&](const std::string& yaml) {
    file = dir.write("run.yaml", yaml);
    return config::validate(root, config::load(file, {}), "", registry);
  };
  const Value v = load("lr_schedule:\n  type: flat\n  peak: 0.25\n");
  std::vector<std::string> keys;
  for (const auto& [k, x] : v.find("lr_schedule")->as_map()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"type", "peak", "scale", "warmup", "mode", "betas", "restart", "tokenizer",
                                            "verbose"}));
  EXPECT_EQ(v.at_path("lr_schedule.peak")->as_double(), 0.25);
  EXPECT_EQ(load("lr_schedule: flat\n").at_path("lr_schedule.peak")->as_double(), 1.0);
  try {
    load("lr_schedule:\n  type: flat\n  peek: 0.25\n");
    ADD_FAILURE() << "a typo was accepted";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("lr_schedule.peek: unknown option of lr_schedule 'flat'; did you mean 'peak'?"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("peak (float, default 1.0): Peak"), std::string::npos) << msg;
  }
  EXPECT_THROW(load("lr_schedule:\n  type: flat\n  peak: -1\n"), UserError);
  // Without the section (as the registry creates the component), the option is unknown.
  EXPECT_THROW(validate("lr_schedule:\n  type: flat\n  peak: 0.25\n"), UserError);

  OptionSchema component;
  component.number("scale", 0.5, "Scale.");
  component.section_default("peak", 0.125);
  const OptionSchema merged = section_schema(section, component, "lr_schedule 'flat'");
  EXPECT_EQ(merged.names(), (std::vector<std::string>{"peak", "scale"}));
  EXPECT_EQ(merged.find("peak")->default_value().as_double(), 0.125);
  OptionSchema clash;
  clash.number("peak", 0.5, "Declared again.");
  EXPECT_THROW(section_schema(section, clash, "x"), UserError);
  OptionSchema unknown_default;
  unknown_default.section_default("peek", 0.5);
  EXPECT_THROW(section_schema(section, unknown_default, "x"), UserError);
  OptionSchema bad_default;
  bad_default.section_default("peak", -1.0);
  EXPECT_THROW(section_schema(section, bad_default, "x"), UserError);
}

TEST(RegistryAdd, UnknownKindAndBadNamesAreRejected) {
  Registry r;
  auto factory = [](const Options&, const CreateContext&) -> std::unique_ptr<Component> { return nullptr; };
  try {
    r.add({{nullptr, "optimiser", {.name = "x"}, factory, "a.so"}});
    FAIL();
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "component 'x' has unknown kind 'optimiser'; did you mean 'optimizer'?");
  }
  EXPECT_THROW(r.add({{nullptr, "optimizer", {.name = "Bad Name"}, factory, "a.so"}}), UserError);
  EXPECT_TRUE(r.list("optimizer").empty());
}

TEST(RegistryAdd, AFailedBatchAddsNothing) {
  Registry r;
  auto factory = [](const Options&, const CreateContext&) -> std::unique_ptr<Component> { return nullptr; };
  r.add({{nullptr, "optimizer", {.name = "taken"}, factory, "first.so"}});
  try {
    r.add({{nullptr, "optimizer", {.name = "fresh"}, factory, "second.so"},
           {nullptr, "optimizer", {.name = "taken"}, factory, "second.so"}});
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer/taken is already provided by first.so; second.so claims it too"),
              std::string::npos);
  }
  EXPECT_EQ(r.find("optimizer", "fresh"), nullptr);
}

// A default its own option refuses is the plugin's bug: registration fails naming the component,
// the option (nested ones by their path) and what the option accepts; nothing is added.
TEST(RegistryAdd, DeclaredDefaultsMustBeAcceptedByTheirOwnOptions) {
  auto factory = [](const Options&, const CreateContext&) -> std::unique_ptr<Component> { return nullptr; };
  auto refused = [&](OptionSchema options) {
    Registry r;
    try {
      r.add({{nullptr, "optimizer", {.name = "valid"}, factory, "a.so"},
             {nullptr, "optimizer", {.name = "mine", .options = std::move(options)}, factory, "a.so"}});
    } catch (const UserError& e) {
      EXPECT_EQ(r.find("optimizer", "valid"), nullptr);
      return std::string(e.what());
    }
    return std::string();
  };
  OptionSchema range;
  range.number("beta", 1.5, "Decay.").min(0.0).max(1.0, false);
  EXPECT_EQ(refused(range),
            "optimizer 'mine' declares the option 'beta' with the default 1.5, which the option itself refuses "
            "(expected a number in [0, 1), got 1.5 (out of range)): the plugin must change the default or the "
            "option's range or choices");
  OptionSchema integer;
  integer.integer("steps", 0, "Steps.").min(1);
  EXPECT_NE(refused(integer).find("'steps' with the default 0"), std::string::npos);
  OptionSchema choice;
  choice.string("mode", "constant", "Shape.").one_of({"linear", "cosine"});
  EXPECT_NE(refused(choice).find("'mode' with the default \"constant\", which the option itself refuses "
                                 "(expected a string, one of linear, cosine"),
            std::string::npos)
      << refused(choice);
  OptionSchema list;
  list.list("betas", OptionType::number, {0.9, 1.0}, "Betas.").range(0.0, 1.0, false);
  EXPECT_NE(
      refused(list).find("'betas' with the default [0.9, 1.0], which the option itself refuses (betas[1]: expected"),
      std::string::npos)
      << refused(list);
  OptionSchema length;
  length.list("betas", OptionType::number, {0.9}, "Betas.").length(2, 2);
  EXPECT_NE(refused(length).find("wrong length"), std::string::npos) << refused(length);
  OptionSchema inner, nested;
  inner.integer("every", -1, "Period.").min(1);
  nested.object("restart", inner, "Restarts.");
  EXPECT_NE(refused(nested).find("'restart.every' with the default -1"), std::string::npos) << refused(nested);

  // Null defaults, required options, component names and `any` have nothing to check.
  OptionSchema fine;
  fine.number("beta", std::nullopt, "Derived when null.").min(0.0).max(1.0, false);
  fine.integer("count", 0, "Count.").required();
  fine.component("attention", "attention", "flash", "Kernel.");
  fine.any("tags", Value::map(), "Tags.");
  fine.number("edge", 0.0, "On the inclusive bound.").range(0.0, 1.0);
  EXPECT_EQ(refused(fine), "");
}

}  // namespace
}  // namespace loom
