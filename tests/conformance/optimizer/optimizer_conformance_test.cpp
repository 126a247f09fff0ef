// The optimizer conformance suite.
//
// 1. The contract of kinds/optimizer.hpp, checked on every optimizer plugin found in the plugin
//    directory (a new optimizer is covered by adding its folder): bit-exact state round trip,
//    results independent of the thread count, parameters without a gradient left alone, lr = 0
//    a no-op on the parameters, bad checkpoints rejected without damage, misuse reported.
// 2. Agreement with PyTorch, step by step on the same gradients: torch_reference.py (run at build
//    time with the Debian python3-torch) records what torch.optim.AdamW, torch.optim.SGD and the
//    Lion paper's rule do; each case is replayed here through loom's plugins.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "../../core/reference_required.hpp"
#include "../conformance_setup.hpp"
#include "optimizer_test_support.hpp"

namespace {

namespace ot = loom::optimizer_test;
using loom::Tensor;
using loom::Value;

// ---------------------------------------------------------------------------------------------
// Every optimizer plugin

// The optimizer plugins of the build's plugin directory (under `loom conformance`, the plugin
// under test), and the backend whose GEMM optimizers such as muon compute through.
std::vector<std::filesystem::path> optimizer_plugin_files() {
  const loom::conformance::Setup& setup = loom::conformance::setup();
  const std::filesystem::path cpu = loom::conformance::oracle_file("backend-cpu");
  if (!setup.subject.empty()) return {setup.subject, cpu};
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(setup.plugin_dir)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("libloom-optimizer-") && name.ends_with(".so")) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  files.push_back(cpu);
  return files;
}

// Options that give each known optimizer all of its state (SGD keeps none without momentum).
Value::Map stateful_options(const std::string& name) {
  if (name == "sgd") return {{"momentum", Value(0.9)}, {"weight_decay", Value(1e-2)}};
  return {};
}

// A peak learning rate at which each known optimizer moves the test's parameters visibly.
double peak_lr(const std::string& name) {
  if (name == "adamw" || name == "muon" || name == "adafactor") return 1e-2;
  return 1e-3;
}

class EveryOptimizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    registry_ = ot::load_plugins(optimizer_plugin_files()).release();
    for (const auto* entry : registry_->list("optimizer")) names_.push_back(entry->decl.name);
    backend_ = new loom::Handle<loom::Backend>(ot::create_cpu_backend(*registry_));
    ot::ParameterSet::default_backend = backend_->get();
  }
  static void TearDownTestSuite() {
    ot::ParameterSet::default_backend = nullptr;
    delete backend_;
    backend_ = nullptr;
    delete registry_;
    registry_ = nullptr;
    names_.clear();
  }

  static loom::Handle<loom::Optimizer> create(const std::string& name, Value::Map extra = {}) {
    Value::Map options = stateful_options(name);
    for (auto& kv : extra) options.push_back(std::move(kv));
    return ot::create_optimizer(*registry_, name, options);
  }

  static loom::Registry* registry_;
  static loom::Handle<loom::Backend>* backend_;
  static std::vector<std::string> names_;
};
loom::Registry* EveryOptimizer::registry_ = nullptr;
loom::Handle<loom::Backend>* EveryOptimizer::backend_ = nullptr;
std::vector<std::string> EveryOptimizer::names_;

// A small model's worth of parameters and a seeded stream of gradients; gradient (step, i) is
// absent for the pairs in `missing`.
struct Problem {
  struct Spec {
    const char* name;
    loom::Shape shape;
    bool decay;
  };
  std::vector<Spec> specs{{"h.0.attn.c_attn.weight", {33, 17}, true},
                          {"h.0.attn.c_attn.bias", {17}, false},
                          {"h.0.mlp.c_fc.weight", {2, 3, 5}, true},
                          {"wte.weight", {71, 1031}, true}};  // several parallel chunks
  // Parameter 2 gets its first gradient only after the checkpoint of the round-trip test.
  std::set<std::pair<int, int>> missing{{0, 1}, {1, 1}, {0, 2}, {1, 2}, {2, 2}, {3, 2}, {5, 0}, {6, 3}};
  std::vector<std::vector<float>> initial;
  std::vector<std::vector<std::vector<float>>> grads;  // [step][parameter]

  explicit Problem(int steps, unsigned seed = 42) {
    std::mt19937 rng(seed);
    for (const Spec& s : specs) initial.push_back(ot::random_values(rng, s.shape.numel(), 0.5f));
    for (int t = 0; t < steps; ++t) {
      grads.emplace_back();
      for (const Spec& s : specs) grads.back().push_back(ot::random_values(rng, s.shape.numel(), 1.0f));
    }
  }
  void make(ot::ParameterSet& set) const {
    for (std::size_t i = 0; i < specs.size(); ++i) set.add(specs[i].name, specs[i].shape, specs[i].decay, initial[i]);
  }
  double lr(int step) const { return 1.0 - 0.05 * step; }  // scaled by the optimizer's peak_lr
  // Runs steps [from, to) of `optimizer` (whose peak rate is `peak`) on `set`.
  void run(loom::Optimizer& optimizer, double peak, ot::ParameterSet& set, int from, int to) const {
    for (int t = from; t < to; ++t) {
      for (std::size_t i = 0; i < specs.size(); ++i) {
        if (missing.contains({t, static_cast<int>(i)}))
          set.parameters[i].zero_grad();
        else
          ot::set_gradient(set.parameters[i], grads[static_cast<std::size_t>(t)][i]);
      }
      optimizer.step(peak * lr(t), t);
    }
  }
};

void expect_same_bits(ot::ParameterSet& a, ot::ParameterSet& b) {
  for (std::size_t i = 0; i < a.parameters.size(); ++i)
    EXPECT_TRUE(ot::bitwise_equal(a.parameters[i].data(), b.parameters[i].data()))
        << "parameter " << a.parameters[i].name();
}
void expect_same_bits(const loom::Optimizer& a, const loom::Optimizer& b) {
  const auto sa = a.state(), sb = b.state();
  ASSERT_EQ(sa.size(), sb.size());
  for (std::size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, sb[i].first);
    EXPECT_TRUE(ot::bitwise_equal(sa[i].second, sb[i].second)) << "state " << sa[i].first;
  }
}

TEST_F(EveryOptimizer, TheBuildHasItsOptimizers) {
  if (!loom::conformance::setup().subject.empty()) GTEST_SKIP() << "a check of loom's own build";
  for (const char* name : {"adamw", "lion", "sgd", "muon", "adafactor", "soap"})
    EXPECT_NE(std::find(names_.begin(), names_.end(), name), names_.end()) << name << " is not registered";
}

TEST_F(EveryOptimizer, RestoringSavedStateContinuesBitForBit) {
  constexpr int k = 4, total = 9;
  const Problem problem(total);
  for (const std::string& name : names_) {
    SCOPED_TRACE(name);
    // Uninterrupted.
    ot::ParameterSet straight;
    problem.make(straight);
    auto a = create(name);
    a->init(straight.for_optimizer());
    problem.run(*a, peak_lr(name), straight, 0, total);

    // k steps, a checkpoint (independent copies of parameters and state), then a fresh optimizer
    // that loads it and goes on.
    ot::ParameterSet first;
    problem.make(first);
    std::vector<std::pair<std::string, Tensor>> saved;
    std::vector<std::vector<float>> saved_values;
    {
      auto b = create(name);
      b->init(first.for_optimizer());
      problem.run(*b, peak_lr(name), first, 0, k);
      saved = ot::snapshot(*b);
      for (auto& p : first.parameters) saved_values.push_back(p.data().to_vector());
    }
    ot::ParameterSet resumed;
    for (std::size_t i = 0; i < problem.specs.size(); ++i)
      resumed.add(problem.specs[i].name, problem.specs[i].shape, problem.specs[i].decay, saved_values[i]);
    auto c = create(name);
    c->init(resumed.for_optimizer());
    c->load_state(saved);
    saved.clear();  // the optimizer must not depend on the caller keeping these
    problem.run(*c, peak_lr(name), resumed, k, total);

    expect_same_bits(straight, resumed);
    expect_same_bits(*a, *c);
  }
}

TEST_F(EveryOptimizer, ResultsDoNotDependOnTheThreadCount) {
  const Problem problem(5);
  const auto one = loom::make_execution_context(1);
  const auto two = loom::make_execution_context(2);
  for (const std::string& name : names_) {
    SCOPED_TRACE(name);
    ot::ParameterSet s1, s2;
    problem.make(s1);
    problem.make(s2);
    registry_->set_execution_context(one.get());
    auto a = create(name);
    registry_->set_execution_context(two.get());
    auto b = create(name);
    registry_->set_execution_context(nullptr);
    a->init(s1.for_optimizer());
    b->init(s2.for_optimizer());
    problem.run(*a, peak_lr(name), s1, 0, 5);
    problem.run(*b, peak_lr(name), s2, 0, 5);
    expect_same_bits(s1, s2);
    expect_same_bits(*a, *b);
  }
}

TEST_F(EveryOptimizer, LeavesParametersWithoutAGradientAndTheirStateAlone) {
  std::mt19937 rng(7);
  const auto w0 = ot::random_values(rng, 40, 1.0f), f0 = ot::random_values(rng, 40, 1.0f);
  for (const std::string& name : names_) {
    SCOPED_TRACE(name);
    ot::ParameterSet set;
    set.add("trained", {8, 5}, true, w0);
    set.add("frozen", {8, 5}, true, f0);
    auto opt = create(name);
    opt->init(set.for_optimizer());
    const auto before = ot::snapshot(*opt);
    for (int t = 0; t < 3; ++t) {
      ot::set_gradient(set.parameters[0], ot::random_values(rng, 40, 1.0f));
      opt->step(peak_lr(name), t);
    }
    EXPECT_EQ(set.parameters[1].data().to_vector(), f0);
    EXPECT_NE(set.parameters[0].data().to_vector(), w0);
    for (const auto& [key, tensor] : opt->state()) {
      if (key.find("frozen") == std::string::npos) continue;
      for (const auto& [key0, tensor0] : before) {
        if (key0 != key) continue;
        EXPECT_TRUE(ot::bitwise_equal(tensor, tensor0)) << key;
      }
    }
  }
}

TEST_F(EveryOptimizer, ZeroLearningRateLeavesParametersUnchanged) {
  const Problem problem(3);
  for (const std::string& name : names_) {
    SCOPED_TRACE(name);
    ot::ParameterSet set;
    problem.make(set);
    auto opt = create(name);
    opt->init(set.for_optimizer());
    for (int t = 0; t < 3; ++t) {
      for (std::size_t i = 0; i < problem.specs.size(); ++i)
        ot::set_gradient(set.parameters[i], problem.grads[static_cast<std::size_t>(t)][i]);
      opt->step(0.0, t);
    }
    for (std::size_t i = 0; i < problem.specs.size(); ++i)
      EXPECT_EQ(set.parameters[i].data().to_vector(), problem.initial[i]) << problem.specs[i].name;
  }
}

TEST_F(EveryOptimizer, RejectsTheStateOfAnotherModelAndKeepsItsOwn) {
  const Problem problem(2);
  for (const std::string& name : names_) {
    SCOPED_TRACE(name);
    ot::ParameterSet set;
    problem.make(set);
    auto opt = create(name);
    opt->init(set.for_optimizer());
    problem.run(*opt, peak_lr(name), set, 0, 2);
    const auto good = ot::snapshot(*opt);
    if (good.empty()) continue;  // nothing to corrupt

    auto expect_user_error = [&](std::vector<std::pair<std::string, Tensor>> bad, const std::string& mentions) {
      try {
        opt->load_state(bad);
        ADD_FAILURE() << "expected a UserError mentioning '" << mentions << "'";
      } catch (const loom::UserError& e) {
        EXPECT_NE(std::string(e.what()).find(mentions), std::string::npos) << e.what();
      }
      const auto now = opt->state();
      ASSERT_EQ(now.size(), good.size());
      for (std::size_t i = 0; i < now.size(); ++i)
        EXPECT_TRUE(ot::bitwise_equal(now[i].second, good[i].second)) << "a failed load changed " << now[i].first;
    };

    // An entry naming a parameter this model does not have (written last, so that a careless
    // implementation would already have copied the others).
    auto extra = good;
    for (auto& [key, tensor] : extra) tensor = Tensor::zeros(tensor.shape());
    extra.emplace_back("exp_avg/h.7.mlp.c_proj.weight", Tensor::zeros({4, 4}));
    expect_user_error(extra, "h.7.mlp.c_proj.weight");

    // A tensor of the wrong shape.
    auto wrong = good;
    for (auto& [key, tensor] : wrong) tensor = Tensor::zeros(tensor.shape());
    wrong.back().second = Tensor::zeros({3});
    expect_user_error(wrong, wrong.back().first);
  }
}

TEST_F(EveryOptimizer, MisuseIsAnInternalError) {
  for (const std::string& name : names_) {
    SCOPED_TRACE(name);
    std::vector<float> v(6, 1.0f);
    ot::ParameterSet set;
    set.add("w", {2, 3}, true, v);
    auto opt = create(name);
    EXPECT_THROW(opt->step(1e-3, 0), loom::InternalError);
    EXPECT_THROW(opt->load_state({}), loom::InternalError);
    opt->init(set.for_optimizer());
    EXPECT_THROW(opt->init(set.for_optimizer()), loom::InternalError);
    EXPECT_THROW(opt->step(-1.0, 0), loom::InternalError);

    ot::ParameterSet twins;
    twins.add("same", {2}, true, std::vector<float>{1, 2});
    twins.add("same", {2}, true, std::vector<float>{3, 4});
    EXPECT_THROW(create(name)->init(twins.for_optimizer()), loom::InternalError);
  }
}

// The peak rate and the clip are the run layer's options of the optimizer section: a plugin that
// declared them would clash with them there (see tests/train for the section itself).
TEST_F(EveryOptimizer, LeavesLearningRateAndClipToTheRunLayer) {
  for (const std::string& name : names_) {
    SCOPED_TRACE(name);
    const loom::OptionSchema& options = registry_->find("optimizer", name)->decl.options;
    for (const char* option : {"learning_rate", "max_grad_norm"}) {
      EXPECT_EQ(options.find(option), nullptr) << name << " declares " << option;
      EXPECT_THROW(ot::create_optimizer(*registry_, name, {{option, Value(0.5)}}), loom::UserError) << option;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Agreement with PyTorch

struct Reference {
  std::string skipped;  // why there is no reference, when there is none
  nlohmann::json index;
  std::vector<float> data;

  std::vector<float> slice(std::int64_t offset, std::int64_t n) const {
    return {data.begin() + offset, data.begin() + offset + n};
  }
};

const Reference& reference() {
  static const Reference ref = [] {
    Reference r;
    const std::filesystem::path dir = loom::conformance::setup().torch_reference_dir;
    std::ifstream index(dir / "index.json");
    if (!index) {
      r.skipped = "no " + (dir / "index.json").string() + " (build the optimizer_torch_reference target)";
      return r;
    }
    r.index = nlohmann::json::parse(index);
    if (r.index.contains("skipped")) {
      r.skipped = r.index["skipped"].get<std::string>();
      return r;
    }
    std::ifstream bin(dir / "data.bin", std::ios::binary);
    bin.seekg(0, std::ios::end);
    const auto bytes = static_cast<std::size_t>(bin.tellg());
    bin.seekg(0);
    r.data.resize(bytes / sizeof(float));
    bin.read(reinterpret_cast<char*>(r.data.data()), static_cast<std::streamsize>(bytes));
    return r;
  }();
  return ref;
}

struct Agreement {
  double max_abs = 0.0;     // max |loom - torch|
  double max_rel = 0.0;     // max |loom - torch| / max(|torch|, 1e-3)
  double max_scaled = 0.0;  // max |loom - torch| / max(1, max |torch| of the tensor)
  void add(const std::vector<float>& got, const std::vector<float>& want) {
    double scale = 1.0;
    for (float w : want) scale = std::max(scale, static_cast<double>(std::fabs(w)));
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double d = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
      max_abs = std::max(max_abs, d);
      max_rel = std::max(max_rel, d / std::max(std::fabs(static_cast<double>(want[i])), 1e-3));
      max_scaled = std::max(max_scaled, d / scale);
    }
  }
};

// Agreement to float32 rounding: loom and PyTorch order some float operations differently (and
// PyTorch's vector kernels fuse multiply-adds), so they differ by a few units in the last place
// per step, relative to the size of the tensor's values. 1e-6 is about 8 ulps at 1.
constexpr double kTolerance = 1e-6;
// Optimizers that go through iterations of matrix products (Newton-Schulz) or reductions are
// compared at the 1e-5 (a case's "tolerance").

void replay(const std::string& optimizer) {
  const Reference& ref = reference();
  if (!ref.skipped.empty()) return loom::test::skip_missing_reference(ref.skipped);
  auto registry = ot::load_plugins(optimizer_plugin_files());
  const auto backend = ot::create_cpu_backend(*registry);
  int cases = 0;
  for (const auto& c : ref.index["cases"]) {
    if (c["optimizer"] != optimizer) continue;
    ++cases;
    const std::string case_name = c["name"];
    SCOPED_TRACE(case_name);
    Value::Map options;
    for (const auto& [key, value] : c["options"].items()) {
      if (value.is_null())
        options.emplace_back(key, Value());
      else if (value.is_boolean())
        options.emplace_back(key, Value(value.get<bool>()));
      else
        options.emplace_back(key, Value(value.get<double>()));
    }
    auto opt = ot::create_optimizer(*registry, optimizer, options);
    const double tolerance = c.value("tolerance", kTolerance);
    ot::ParameterSet set;
    set.backend = backend.get();
    for (const auto& p : c["params"]) {
      const std::vector<std::int64_t> dims = p["shape"];
      const loom::Shape shape(std::span<const std::int64_t>(dims.data(), dims.size()));
      set.add(p["name"], shape, p["weight_decay"], ref.slice(p["initial"], shape.numel()));
    }
    opt->init(set.for_optimizer());

    Agreement params, state;
    const int steps = c["steps"];
    for (int t = 0; t < steps; ++t) {
      for (std::size_t i = 0; i < set.parameters.size(); ++i) {
        const auto& g = c["grads"][t][i];
        if (g.is_null())
          set.parameters[i].zero_grad();
        else
          ot::set_gradient(set.parameters[i], ref.slice(g, set.parameters[i].data().numel()));
      }
      opt->step(c["lr"][t].get<double>(), t);
      for (std::size_t i = 0; i < set.parameters.size(); ++i) {
        const Tensor value = set.parameters[i].data();
        const auto want = ref.slice(c["expected"][t][i], value.numel());
        Agreement one;
        one.add(value.to_vector(), want);
        params.add(value.to_vector(), want);
        ASSERT_LE(one.max_scaled, tolerance)
            << "step " << t << ", parameter " << set.parameters[i].name() << ": max abs diff " << one.max_abs;
      }
    }

    // The state: same names as PyTorch's state (Lion: as the paper's m), same values.
    std::map<std::string, std::int64_t> expected_state = c["expected_state"];
    std::set<std::string> names;
    for (const auto& [key, tensor] : opt->state()) {
      names.insert(key);
      const auto it = expected_state.find(key);
      if (it == expected_state.end()) {
        ADD_FAILURE() << "state entry '" << key << "' has no PyTorch counterpart";
        continue;
      }
      Agreement one;
      one.add(tensor.to_vector(), ref.slice(it->second, tensor.numel()));
      state.add(tensor.to_vector(), ref.slice(it->second, tensor.numel()));
      EXPECT_LE(one.max_scaled, tolerance) << "state " << key << ": max abs diff " << one.max_abs;
    }
    for (const auto& [key, offset] : expected_state)
      EXPECT_TRUE(names.contains(key)) << "PyTorch has state '" << key << "', loom does not";

    std::printf(
        "[ torch    ] %-26s params: max abs %.3g, max rel %.3g, max abs/scale %.3g; state: max abs %.3g, "
        "max rel %.3g, max abs/scale %.3g\n",
        case_name.c_str(), params.max_abs, params.max_rel, params.max_scaled, state.max_abs, state.max_rel,
        state.max_scaled);
    const std::string prefix = "case_" + case_name + "_";
    ::testing::Test::RecordProperty(prefix + "params_max_abs", std::to_string(params.max_abs));
    ::testing::Test::RecordProperty(prefix + "params_max_rel", std::to_string(params.max_rel));
  }
  if (cases == 0) {
    std::set<std::string> recorded;
    for (const auto& c : ref.index["cases"]) recorded.insert(c["optimizer"].get<std::string>());
    std::string names;
    for (const std::string& n : recorded) names += (names.empty() ? "" : ", ") + n;
    GTEST_SKIP() << "no PyTorch trajectory is recorded for '" << optimizer << "' (recorded: " << names
                 << "); only the contract (EveryOptimizer) applies to it";
  }
}

// Every optimizer of the plugins under test, replayed where PyTorch has its trajectories.
std::vector<std::string> optimizer_names() {
  auto registry = ot::load_plugins(optimizer_plugin_files());
  std::vector<std::string> names;
  for (const auto* entry : registry->list("optimizer")) names.push_back(entry->decl.name);
  return names;
}

class AgreesWithPyTorch : public ::testing::TestWithParam<std::string> {};

TEST_P(AgreesWithPyTorch, StepByStep) {
  replay(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Registered, AgreesWithPyTorch, ::testing::ValuesIn(optimizer_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(AgreesWithPyTorch);

}  // namespace
