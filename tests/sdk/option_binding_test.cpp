// Options bound to struct fields (loom/option_binding.hpp, loom/decoder_options.hpp): the
// declaration is the OptionSchema one would write by hand, option for option, so validation and
// its messages are unchanged; read() fills every field, defaults included, in declaration order.
#include "loom/option_binding.hpp"

#include <gtest/gtest.h>

#include <complex>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loom/core/config.hpp"
#include "loom/core/registry.hpp"
#include "loom/decoder_options.hpp"
#include "loom/error.hpp"
#include "loom/kinds/lr_schedule.hpp"

namespace loom {
namespace {

// An unsupported field type is not bindable (field() does not compile for it).
static_assert(BindableOption<std::int64_t> && BindableOption<std::optional<double>> &&
              BindableOption<std::vector<std::string>> && BindableOption<Value>);
static_assert(!BindableOption<std::complex<double>> && !BindableOption<unsigned> &&
              !BindableOption<std::vector<bool>> && !BindableOption<std::optional<std::optional<int>>>);

enum class Shape { linear, cosine };

struct Restart {
  std::int64_t every;
};

struct Sched {
  double scale;
  std::int64_t warmup;
  int cycles;
  Shape shape;
  std::vector<double> betas;
  Restart restart;
  bool verbose;
  std::optional<std::int64_t> horizon;
  std::int64_t floor_steps;  // null reads as 7
  double tail;               // null: scale * 2 (a field read before it)
  std::string label;
  ComponentRef kernel;
  std::int64_t derived;  // a then() step: warmup + cycles
};

OptionBinding<Restart> restart_options() {
  OptionBinding<Restart> b;
  b.field("every", &Restart::every, 10, "Period.").min(1);
  return b;
}

OptionBinding<Sched> sched_options() {
  OptionBinding<Sched> b;
  b.field("scale", &Sched::scale, 0.5, "Scale.").range(0.0, 1.0);
  b.field("warmup", &Sched::warmup, 100, "Warmup steps.").min(0);
  b.field("cycles", &Sched::cycles, 3, "Cycles.").range(1, 9);
  b.choice("mode", &Sched::shape, Shape::cosine, {{"linear", Shape::linear}, {"cosine", Shape::cosine}}, "Shape.");
  b.field("betas", &Sched::betas, {0.9, 0.95}, "Betas.").length(2, 2).range(0.0, 1.0, false);
  b.object("restart", &Sched::restart, restart_options(), "Restarts.");
  b.field("verbose", &Sched::verbose, false, "Chatty.");
  b.field("horizon", &Sched::horizon, std::nullopt, "Horizon; null: none.").min(1);
  b.field("floor_steps", &Sched::floor_steps, std::nullopt, "Floor; null: 7.").min(0).null_as(7);
  b.field("tail", &Sched::tail, 0.25, "Tail; null: twice the scale.").nullable().null_as([](const Sched& s) {
    return 2 * s.scale;
  });
  b.field("label", &Sched::label, "run", "Label.").one_of({"run", "walk"});
  b.component("kernel", &Sched::kernel, "attention", "plain", "The kernel.");
  b.then([](Sched& s, const Options&) {
    if (s.warmup == 13) throw UserError("warmup 13 is unlucky");
    s.derived = s.warmup + s.cycles;
  });
  return b;
}

// The same options written with OptionSchema alone.
OptionSchema sched_schema_by_hand() {
  OptionSchema s;
  s.number("scale", 0.5, "Scale.").range(0.0, 1.0);
  s.integer("warmup", 100, "Warmup steps.").min(0);
  s.integer("cycles", 3, "Cycles.").range(1, 9);
  s.string("mode", "cosine", "Shape.").one_of({"linear", "cosine"});
  s.list("betas", OptionType::number, {0.9, 0.95}, "Betas.").length(2, 2).range(0.0, 1.0, false);
  OptionSchema restart;
  restart.integer("every", 10, "Period.").min(1);
  s.object("restart", restart, "Restarts.");
  s.boolean("verbose", false, "Chatty.");
  s.integer("horizon", std::nullopt, "Horizon; null: none.").min(1);
  s.integer("floor_steps", std::nullopt, "Floor; null: 7.").min(0);
  s.number("tail", 0.25, "Tail; null: twice the scale.").nullable();
  s.string("label", "run", "Label.").one_of({"run", "walk"});
  s.component("kernel", "attention", "plain", "The kernel.");
  return s;
}

// Everything an option declares, as text.
std::string describe(const OptionSchema& schema) {
  std::string out;
  for (const OptionSpec& o : schema.options()) {
    out += o.name() + " " + std::string(option_type_name(o.type())) + " default=" + o.default_value().describe() +
           " doc=" + o.doc() + " expects=" + o.expectation() + " nullable=" + std::to_string(o.is_nullable()) +
           " required=" + std::to_string(o.is_required()) + " kind=" + o.component_kind() + "\n";
    if (o.object_schema()) out += "{\n" + describe(*o.object_schema()) + "}\n";
  }
  return out;
}

class OptionBindingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<ComponentEntry> entries;
    OptionSchema none;
    entries.push_back({nullptr,
                       "attention",
                       {.name = "plain", .description = "plain", .version = "1", .options = none},
                       [](const Options&, const CreateContext&) -> std::unique_ptr<Component> { return nullptr; },
                       "<test>"});
    registry.add(std::move(entries));
  }

  Options validated(const OptionSchema& schema, const std::string& yaml) {
    return Options(config::validate(schema, config::load_string(yaml, "s.yaml"), "lr_schedule", registry),
                   "lr_schedule");
  }
  Sched read(const std::string& yaml) { return binding.read(validated(binding.schema(), yaml)); }

  // The validation error of `yaml` against `schema`.
  std::string error(const OptionSchema& schema, const std::string& yaml) {
    try {
      validated(schema, yaml);
    } catch (const UserError& e) {
      return e.what();
    }
    return "(no error)";
  }

  Registry registry;
  OptionBinding<Sched> binding = sched_options();
};

TEST_F(OptionBindingTest, DeclaresExactlyTheHandWrittenSchema) {
  EXPECT_EQ(describe(binding.schema()), describe(sched_schema_by_hand()));
}

TEST_F(OptionBindingTest, ReadsTheDefaults) {
  const Sched s = read("{}\n");
  EXPECT_EQ(s.scale, 0.5);
  EXPECT_EQ(s.warmup, 100);
  EXPECT_EQ(s.cycles, 3);
  EXPECT_EQ(s.shape, Shape::cosine);
  EXPECT_EQ(s.betas, (std::vector<double>{0.9, 0.95}));
  EXPECT_EQ(s.restart.every, 10);
  EXPECT_FALSE(s.verbose);
  EXPECT_EQ(s.horizon, std::nullopt);
  EXPECT_EQ(s.floor_steps, 7);
  EXPECT_EQ(s.tail, 0.25);
  EXPECT_EQ(s.label, "run");
  EXPECT_EQ(s.kernel.name, "plain");
  EXPECT_EQ(s.kernel.path, "lr_schedule.kernel");
  EXPECT_EQ(s.derived, 103);
}

TEST_F(OptionBindingTest, ReadsGivenValuesAndNulls) {
  const Sched s = read(
      "scale: 0.125\nwarmup: 5\ncycles: 2\nmode: linear\nbetas: [0.5, 0.75]\nrestart: {every: 4}\nverbose: true\n"
      "horizon: 40\nfloor_steps: 0\ntail: null\nlabel: walk\n");
  EXPECT_EQ(s.scale, 0.125);
  EXPECT_EQ(s.warmup, 5);
  EXPECT_EQ(s.cycles, 2);
  EXPECT_EQ(s.shape, Shape::linear);
  EXPECT_EQ(s.betas, (std::vector<double>{0.5, 0.75}));
  EXPECT_EQ(s.restart.every, 4);
  EXPECT_TRUE(s.verbose);
  EXPECT_EQ(s.horizon, 40);
  EXPECT_EQ(s.floor_steps, 0);
  EXPECT_EQ(s.tail, 0.25);  // null: twice the scale read before it
  EXPECT_EQ(s.label, "walk");
  EXPECT_EQ(s.derived, 7);
}

TEST_F(OptionBindingTest, ValidationMessagesAreTheHandWrittenSchemasOnes) {
  const OptionSchema by_hand = sched_schema_by_hand();
  const std::vector<std::string> cases = {"scale: 1.5\n",   "warmup: -1\n",          "cycles: 10\n",   "mode: cosin\n",
                                          "betas: [0.9]\n", "restart: {every: 0}\n", "warmpu: 5\n",    "horizon: 0\n",
                                          "label: run2\n",  "verbose: 1\n",          "kernel: fancy\n"};
  for (const std::string& yaml : cases) {
    const std::string msg = error(binding.schema(), yaml);
    EXPECT_NE(msg, "(no error)") << yaml;
    EXPECT_EQ(msg, error(by_hand, yaml)) << yaml;
  }
  EXPECT_EQ(error(binding.schema(), "scale: 1.5\n"),
            "s.yaml:1:8: lr_schedule.scale: expected a number in [0, 1], got 1.5 (out of range)");
  EXPECT_EQ(error(binding.schema(), "cycles: 10\n"),
            "s.yaml:1:9: lr_schedule.cycles: expected an integer in [1, 9], got 10 (out of range)");
  const std::string unknown = error(binding.schema(), "warmpu: 5\n");
  EXPECT_EQ(unknown.substr(0, unknown.find('\n')),
            "s.yaml:1:9: lr_schedule.warmpu: unknown option of lr_schedule; did you mean 'warmup'?");
}

TEST_F(OptionBindingTest, ThenStepsRunAfterTheFieldsAndMayRefuse) {
  try {
    read("warmup: 13\n");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_STREQ(e.what(), "warmup 13 is unlucky");
  }
}

TEST_F(OptionBindingTest, ANullablePlainFieldWithoutNullAsIsADeclarationBug) {
  struct Plain {
    std::int64_t steps;
  };
  OptionBinding<Plain> b;
  b.field("steps", &Plain::steps, 5, "Steps.").nullable();
  const Options o(config::validate(b.schema(), config::load_string("{}\n", "s.yaml"), "x", registry), "x");
  try {
    b.read(o);
    FAIL();
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("option 'steps' of x may be null, and its field is not a std::optional"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(OptionBindingTest, AnEnumDefaultOutsideItsChoicesIsADeclarationBug) {
  struct WithEnum {
    Shape shape;
  };
  OptionBinding<WithEnum> b;
  EXPECT_THROW(b.choice("mode", &WithEnum::shape, Shape::cosine, {{"linear", Shape::linear}}, "Shape."), InternalError);
}

// The experts' options (models::moe_options, bound to MoeConfig) declare exactly what the
// hand-written moe_schema declared before them, read the same as read_moe_options, which still
// reads and checks them for a model whose options are an OptionSchema.
OptionSchema moe_schema_by_hand() {
  OptionSchema s;
  s.integer("num_experts", 0, "Experts per layer in place of the MLP (Mixtral: 8); 0: a dense MLP.")
      .min(0)
      .max(static_cast<double>(models::max_model_experts));
  s.integer("experts_per_token", 2, "Experts each token is routed to (top-k).")
      .min(1)
      .max(static_cast<double>(models::max_model_experts));
  s.string("router_softmax", "after_top_k",
           "after_top_k: gate weights are the softmax over the chosen experts' logits (Mixtral, whose softmax then "
           "renormalisation is the same); before_top_k: the full softmax's probabilities of the chosen experts, not "
           "renormalised (DeepSeek).")
      .one_of({"after_top_k", "before_top_k"});
  s.number("router_aux_loss_coef", 0.001,
           "Weight of the load-balancing loss (Switch / transformers' Mixtral, over all layers' tokens).")
      .min(0.0);
  s.number("router_z_loss_coef", 0.0, "Weight of the router z-loss (ST-MoE): mean of logsumexp(logits)^2.").min(0.0);
  return s;
}

TEST_F(OptionBindingTest, TheMoeOptionsAreBoundAsTheyWereDeclaredByHand) {
  EXPECT_EQ(describe(models::moe_options().schema()), describe(moe_schema_by_hand()));
  EXPECT_EQ(describe(models::moe_schema()), describe(moe_schema_by_hand()));
  const Options given = validated(models::moe_schema(),
                                  "{num_experts: 8, experts_per_token: 3, router_softmax: before_top_k, "
                                  "router_aux_loss_coef: 0.5, router_z_loss_coef: 0.25}\n");
  for (const models::MoeConfig& m : {models::moe_options().read(given), models::read_moe_options(given, "model")}) {
    EXPECT_EQ(m.num_experts, 8);
    EXPECT_EQ(m.experts_per_token, 3);
    EXPECT_FALSE(m.softmax_after_top_k);
    EXPECT_EQ(m.aux_loss_coef, 0.5);
    EXPECT_EQ(m.z_loss_coef, 0.25);
    EXPECT_EQ(m.hidden_dim, 0);  // the model's to fill in
    EXPECT_EQ(m.model, "model");
  }
  const models::MoeConfig defaults = models::read_moe_options(validated(models::moe_schema(), "{}\n"), "model");
  EXPECT_EQ(defaults.num_experts, 0);
  EXPECT_EQ(defaults.experts_per_token, 2);
  EXPECT_TRUE(defaults.softmax_after_top_k);
  EXPECT_EQ(defaults.aux_loss_coef, 0.001);
  try {
    models::read_moe_options(validated(models::moe_schema(), "{num_experts: 2, experts_per_token: 3}\n"), "model");
    FAIL() << "expected an error";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "model.moe.experts_per_token (3) exceeds moe.num_experts (2)");
  }
}

// The decoder base: the shared options' ranges written once, path and the enum read.
struct TinyDecoder : models::RotaryDecoderOptions {
  bool extra;
};

TEST_F(OptionBindingTest, DecoderSchemaDeclaresTheSharedOptionsWithTheirRanges) {
  models::DecoderSchema<TinyDecoder> s;
  s.seq_len(64, "Positions.");
  s.hidden_dim(32, "Width.");
  s.intermediate_dim(96, "MLP width.");
  s.num_layers(2, "Layers.");
  s.num_heads(4, "Heads.");
  s.num_kv_heads(2, "KV heads.");
  s.head_dim(std::nullopt, "Head width; null: derived.");
  s.sliding_window(16, "Window; null: none.").nullable();
  s.field("extra", &TinyDecoder::extra, true, "Extra.");
  s.initializer_range();
  s.layer_norm_epsilon(1e-6, "Epsilon.");
  s.tie_word_embeddings(true, "Tied.");
  s.vocab_size();
  s.remat();
  s.attention();

  OptionSchema h;
  h.integer("seq_len", 64, "Positions.").min(1).max(static_cast<double>(models::max_model_seq_len));
  h.integer("hidden_dim", 32, "Width.").min(1).max(static_cast<double>(models::max_model_width));
  h.integer("intermediate_dim", 96, "MLP width.").min(1).max(static_cast<double>(models::max_model_width));
  h.integer("num_layers", 2, "Layers.").min(1).max(static_cast<double>(models::max_model_layers));
  h.integer("num_heads", 4, "Heads.").min(1).max(static_cast<double>(models::max_model_heads));
  h.integer("num_kv_heads", 2, "KV heads.").min(1).max(static_cast<double>(models::max_model_heads));
  h.integer("head_dim", std::nullopt, "Head width; null: derived.")
      .min(2)
      .max(static_cast<double>(models::max_model_width));
  h.integer("sliding_window", 16, "Window; null: none.").nullable().min(1);
  h.boolean("extra", true, "Extra.");
  h.number("initializer_range", 0.02, "Standard deviation of the normal initialisation.").min(0.0);
  h.number("layer_norm_epsilon", 1e-6, "Epsilon.").min(0.0);
  h.boolean("tie_word_embeddings", true, "Tied.");
  h.integer("vocab_size", std::nullopt, "Vocabulary size; null takes the tokenizer's.")
      .min(1)
      .max(static_cast<double>(models::max_model_vocab_size));
  h.string("remat", "none", models::remat_doc).one_of({"none", "full", "save_dots"});
  h.component("attention", "attention", "auto",
              "The attention kernel, by name or {type: NAME, ...}; auto: the one the backend's device prefers "
              "(flash on the host; docs/attention-kernels.md#auto).");
  EXPECT_EQ(describe(s.schema()), describe(h));

  // "auto" is no registered kernel here: read a given one.
  const Options o(
      config::validate(s.schema(),
                       config::load_string("remat: save_dots\nsliding_window: null\nattention: plain\n", "s.yaml"), "",
                       registry),
      "");
  const TinyDecoder d = s.read(o);
  EXPECT_EQ(d.path, "model");
  EXPECT_EQ(d.seq_len, 64);
  EXPECT_EQ(d.num_kv_heads, 2);
  EXPECT_EQ(d.head_dim, 0);
  EXPECT_EQ(d.sliding_window, 0);
  EXPECT_EQ(d.vocab_size, 0);
  EXPECT_EQ(d.remat, RematPolicy::save_dots);
  EXPECT_EQ(d.attention.name, "plain");
  EXPECT_TRUE(d.extra);
}

}  // namespace
}  // namespace loom
