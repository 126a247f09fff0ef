// The training step around the model on the test device `guarded`
// (tests/fixtures/plugins/guarded_backend.cpp), whose memory faults on any host access outside
// the backend's own calls: parameter initialisation (fill_normal, fill_constant, a model built on
// the device), the optimizers' updates (BackendOp::optimizer), the gradient norm's sums of squares
// and the weight average each give the host path's bits without the host touching the device's
// memory (a touch would be a SIGSEGV: passing means zero faults).
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <functional>
#include <loom/autograd.hpp>
#include <loom/elementwise_optimizer.hpp>
#include <loom/error.hpp>
#include <loom/kinds/model.hpp>
#include <loom/kinds/optimizer.hpp>
#include <loom/model_support.hpp>
#include <loom/random.hpp>
#include <loom/safetensors.hpp>
#include <loom/training_kernels.hpp>
#include <string>
#include <vector>

#include "../core/test_support.hpp"
#include "checkpoint/sharded_checkpoint.hpp"
#include "numerics_test_support.hpp"
#include "train/data_parallel.hpp"
#include "train/ema.hpp"
#include "train/train_step.hpp"
#include "train/world.hpp"

namespace loom::test {
namespace {

const Device guarded_device("guarded", 0);

Handle<Backend> guarded() {
  return make_backend("guarded");
}

::testing::AssertionResult same_bits(const Tensor& a, const Tensor& b) {
  return bitwise_equal(a.to_vector(), b.to_vector());
}

std::vector<float> values(std::int64_t n, std::uint64_t key, float scale) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] = scale * random_normal(key, static_cast<std::uint32_t>(i));
  return v;
}

// ---- Weights written and read on the host's side of the device.

// The final weights of a run on a device (safetensors::save_parameters) and a run's weights read
// back into device parameters (checkpoint::TensorSet, which stages through host memory): the
// values round-trip, through explicit copies, with no host access to device memory.
TEST(DeviceTraining, WeightsAreSavedFromAndLoadedIntoDeviceMemory) {
  guarded();  // registers the device's buffer type
  test::TempDir dir;
  const Tensor host = Tensor::from(values(2 * 300, 7, 0.5f), Shape{2, 300});
  Parameter on_device("w", host.to(guarded_device));
  const std::vector<ModelParameter> params{{&on_device, ParameterRole::weight}};
  safetensors::save_parameters(dir.path() / "model.safetensors", params, {});
  EXPECT_TRUE(same_bits(safetensors::Reader(dir.path() / "model.safetensors").read("w"), host));
  Parameter back("w", Tensor::zeros(Shape{2, 300}, DType::f32, guarded_device));
  const std::vector<ModelParameter> targets{{&back, ParameterRole::weight}};
  checkpoint::TensorSet::open(dir.path() / "model.safetensors").load_parameters(targets);
  EXPECT_TRUE(same_bits(back.data(), host));
}

// ---- Parameter initialisation.

TEST(DeviceTraining, FillNormalOnTheDeviceGivesTheHostValues) {
  Handle<Backend> device = guarded();
  const Shape shape{3, 70001};  // more than one of the host loop's blocks of 2^16
  const Tensor host = Tensor::empty(shape);
  models::fill_normal(host, 1234, 0.02, default_execution_context());
  const Tensor on_device = Tensor::empty(shape, DType::f32, guarded_device);
  models::fill_normal(on_device, 1234, 0.02, default_execution_context(), device.get());
  EXPECT_TRUE(same_bits(on_device, host));
  // Without a backend the device tensor is refused, not touched.
  EXPECT_THROW(models::fill_normal(on_device, 1, 1.0, default_execution_context()), InternalError);

  models::fill_constant(host, 0.75f);
  models::fill_constant(on_device, 0.75f, device.get());
  EXPECT_TRUE(same_bits(on_device, host));
}

TEST(DeviceTraining, ShardsOfASplitParameterGetTheirWholeTensorValues) {
  Handle<Backend> device = guarded();
  for (int dim : {0, 1}) {
    models::ParameterStore host_store, device_store;
    Parameter *h = nullptr, *d = nullptr;
    for (auto* s : {&host_store, &device_store}) s->set_tensor_split(1, 3);
    host_store.declare("w", Shape{7, 10}, ParameterRole::weight, &h, TensorPlacement::split_along(dim, "x"));
    device_store.declare("w", Shape{7, 10}, ParameterRole::weight, &d, TensorPlacement::split_along(dim, "x"));
    host_store.allocate();
    device_store.allocate(guarded_device);
    ASSERT_EQ(d->tensor().device(), guarded_device);
    models::fill_normal(host_store, 0, 99, 0.5, default_execution_context());
    models::fill_normal(device_store, 0, 99, 0.5, default_execution_context(), device.get());
    EXPECT_TRUE(same_bits(d->tensor(), h->tensor())) << "split along " << dim;
  }
}

// The model `node` describes, built over a vocabulary of 64 (in `backend`'s memory, or the host's
// without one) and initialised from `seed`.
Handle<Model> built(const Value& node, Backend* backend, std::uint64_t seed) {
  Handle<Model> model =
      plugin_registry().create<Model>(ComponentRef{"model", node.find("type")->as_string(), node, "model"});
  ModelSetup setup;
  setup.vocab_size = 64;
  setup.backend = backend;
  model->build(setup);
  model->initialize(seed);
  return model;
}

Handle<Model> tiny_gpt2(Backend* backend, const char* attention) {
  Value node = Value::map();
  node.set("type", Value("gpt2"));
  node.set("seq_len", Value(std::int64_t{16}));
  node.set("hidden_dim", Value(std::int64_t{32}));
  node.set("num_layers", Value(std::int64_t{2}));
  node.set("num_heads", Value(std::int64_t{2}));
  node.set("attention", Value(attention));
  return built(node, backend, 7);
}

TEST(DeviceTraining, AModelBuiltOnTheDeviceIsInitialisedThereWithTheHostValues) {
  Handle<Backend> device = guarded();
  Handle<Model> on_host = tiny_gpt2(nullptr, "naive");
  Handle<Model> on_device = tiny_gpt2(device.get(), "naive");
  const auto& h = on_host->parameters();
  const auto& d = on_device->parameters();
  ASSERT_EQ(h.size(), d.size());
  for (std::size_t i = 0; i < h.size(); ++i) {
    EXPECT_EQ(d[i].parameter->tensor().device(), guarded_device) << d[i].parameter->name();
    EXPECT_TRUE(same_bits(d[i].parameter->tensor(), h[i].parameter->tensor())) << d[i].parameter->name();
  }
}

// ---- The optimizers' updates.

Handle<Optimizer> optimizer(const std::string& name, const Value::Map& options) {
  Value node = Value::map();
  node.set("type", Value(name));
  for (const auto& [key, value] : options) node.set(key, value);
  return plugin_registry().create<Optimizer>(ComponentRef{"optimizer", name, node, "optimizer"});
}

// Parameters of odd sizes (one longer than the optimizers' host chunks of 2^15), one without
// weight decay, on `backend`'s device.
struct Parameters {
  std::deque<Parameter> list;
  Backend* backend;

  explicit Parameters(Backend& b) : backend(&b) {
    const std::int64_t sizes[] = {5, 40000, 33};
    for (std::size_t i = 0; i < 3; ++i) {
      const Tensor v = Tensor::from(std::span<const float>(values(sizes[i], 10 + i, 0.5f)), Shape{sizes[i]});
      list.emplace_back("p" + std::to_string(i), on_backend(v, b));
    }
  }
  OptimizerSetup setup() {
    OptimizerSetup s;
    for (std::size_t i = 0; i < list.size(); ++i) s.parameters.push_back({&list[i], i != 1, ParameterRole::weight});
    s.backend = backend;
    return s;
  }
  // Gradient `step` of every parameter, set through the tape (y = 1 * p, backward with seed g).
  void set_gradients(int step) {
    for (std::size_t i = 0; i < list.size(); ++i) {
      Parameter& p = list[i];
      p.zero_grad();
      Tape tape;
      Ops ops(*backend, &tape);
      const Tensor y = ops.scale(p.tensor(), 1.0f);
      const Tensor g =
          Tensor::from(std::span<const float>(values(p.tensor().numel(), 100 * step + i, 0.1f)), p.shape());
      tape.backward(y, on_backend(g, *backend));
    }
  }
};

void expect_same_updates(const std::string& name, const Value::Map& options) {
  Handle<Backend> host_backend = make_f32_backend("cpu");
  Handle<Backend> device = guarded();
  Parameters host(*host_backend), on_device(*device);
  Handle<Optimizer> host_optimizer = optimizer(name, options), device_optimizer = optimizer(name, options);
  host_optimizer->init(host.setup());
  device_optimizer->init(on_device.setup());
  for (int step = 0; step < 3; ++step) {
    host.set_gradients(step);
    on_device.set_gradients(step);
    host_optimizer->step(1e-2, step);
    device_optimizer->step(1e-2, step);
  }
  for (std::size_t i = 0; i < host.list.size(); ++i)
    EXPECT_TRUE(same_bits(on_device.list[i].tensor(), host.list[i].tensor())) << name << ": " << host.list[i].name();
  const auto hs = host_optimizer->state(), ds = device_optimizer->state();
  ASSERT_EQ(hs.size(), ds.size()) << name;
  for (std::size_t i = 0; i < hs.size(); ++i) {
    EXPECT_EQ(ds[i].first, hs[i].first);
    EXPECT_EQ(ds[i].second.device(), guarded_device) << ds[i].first;
    EXPECT_TRUE(same_bits(ds[i].second, hs[i].second)) << name << ": " << hs[i].first;
  }
}

TEST(DeviceTraining, AdamWUpdatesOnTheDeviceAsOnTheHost) {
  expect_same_updates("adamw", {{"weight_decay", Value(0.1)}});
}

TEST(DeviceTraining, SgdUpdatesOnTheDeviceAsOnTheHost) {
  expect_same_updates("sgd", {});
  expect_same_updates("sgd", {{"momentum", Value(0.9)}, {"dampening", Value(0.1)}, {"weight_decay", Value(0.01)}});
  expect_same_updates("sgd", {{"momentum", Value(0.9)}, {"nesterov", Value(true)}, {"weight_decay", Value(0.01)}});
}

TEST(DeviceTraining, LionUpdatesOnTheDeviceAsOnTheHost) {
  expect_same_updates("lion", {{"weight_decay", Value(0.5)}});
}

TEST(DeviceTraining, HostOnlyOptimizersRefuseDeviceParameters) {
  Handle<Backend> device = guarded();
  for (const char* name : {"muon", "adafactor", "soap"}) {
    Parameters on_device(*device);
    Handle<Optimizer> o = optimizer(name, {});
    try {
      o->init(on_device.setup());
      ADD_FAILURE() << name << " accepted parameters in device memory";
    } catch (const UserError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("guarded:0"), std::string::npos) << m;
      EXPECT_NE(m.find("host memory only"), std::string::npos) << m;
    }
  }
}

// ---- The gradient norm's sums of squares.

TEST(DeviceTraining, SumOfSquaresKernelGivesTheHostChunkSums) {
  Handle<Backend> device = guarded();
  const std::int64_t n = 3 * 65536 + 77, chunk = 65536;
  const std::vector<float> v = values(n, 5, 1.0f);
  const Tensor x = on_backend(Tensor::from(std::span<const float>(v), Shape{n}), *device);
  // The partials in the device's memory too (four doubles in eight f32 slots), read back in one copy.
  const Tensor slots = Tensor::empty(Shape{8}, DType::f32, guarded_device);
  device->sum_of_squares(x.device_data<float>(), n, chunk, reinterpret_cast<double*>(slots.device_data<float>()));
  std::vector<double> partials(4);
  const Tensor read = slots.to(Device::host());
  std::memcpy(partials.data(), read.data<float>(), 4 * sizeof(double));
  for (std::int64_t c = 0; c < 4; ++c)
    EXPECT_EQ(partials[static_cast<std::size_t>(c)],
              sum_of_squares(v.data() + c * chunk, std::min(chunk, n - c * chunk)))
        << "chunk " << c;
}

// ---- The weight average.

TEST(DeviceTraining, WeightAverageUpdatesOnTheDeviceAsOnTheHost) {
  Handle<Backend> host_backend = make_f32_backend("reference");
  Handle<Backend> device = guarded();
  Parameters host(*host_backend), on_device(*device);
  auto model_parameters = [](Parameters& p) {
    std::vector<ModelParameter> out;
    for (auto& q : p.list) out.push_back({&q, ParameterRole::weight});
    return out;
  };
  training::ParameterEma host_ema(0.9, model_parameters(host), *host_backend);
  training::ParameterEma device_ema(0.9, model_parameters(on_device), *device);
  for (int step = 0; step < 2; ++step) {
    for (std::size_t i = 0; i < host.list.size(); ++i) {
      const Tensor v = Tensor::from(std::span<const float>(values(host.list[i].tensor().numel(), 50 + step, 1.0f)),
                                    host.list[i].shape());
      host.list[i].tensor().copy_from(v);
      on_device.list[i].tensor().copy_from(v);
    }
    host_ema.update();
    device_ema.update();
  }
  device_ema.swap();
  host_ema.swap();
  for (std::size_t i = 0; i < host.list.size(); ++i)
    EXPECT_TRUE(same_bits(on_device.list[i].tensor(), host.list[i].tensor())) << host.list[i].name();
}

// ---- Whole steps: forward and backward in two micro-batches (the set-aside gradients), the
// gradient norm, clipping, AdamW and the weight average.

template <class T>
Handle<T> component(const std::string& kind, const std::string& name) {
  Value node = Value::map();
  node.set("type", Value(name));
  return plugin_registry().create<T>(ComponentRef{kind, name, node, kind});
}

struct StepsRun {
  std::vector<double> losses, norms;
  std::vector<std::vector<float>> parameters, averages;
};

using ModelMaker = std::function<Handle<Model>(Backend* backend, const char* attention)>;

StepsRun train_steps(const std::string& backend_name, const char* attention, const ModelMaker& make_model = tiny_gpt2) {
  training::RunComponents c;
  c.backend = make_backend(backend_name);
  c.model = make_model(c.backend.get(), attention);
  c.parameters = c.model->parameters();
  c.optimizer = optimizer("adamw", {{"weight_decay", Value(0.1)}});
  OptimizerSetup setup;
  for (const auto& p : c.parameters) setup.parameters.push_back({p.parameter, true, p.role});
  setup.backend = c.backend.get();
  c.optimizer->init(setup);
  c.schedule = component<LrSchedule>("lr_schedule", "constant");
  c.objective = component<Objective>("objective", "causal_lm");
  c.peak_learning_rate = 1e-3;
  c.max_grad_norm = 0.05;  // small enough to clip every step
  training::World world(component<Collective>("collective", "single"));
  world.set_mesh(Mesh());
  c.data_parallel = std::make_shared<training::DataParallel>(world);
  c.data_parallel->set_backend(*c.backend);
  training::StepSettings settings;
  settings.seed = 3;
  settings.num_steps = 3;
  settings.micro_size = 2;
  training::TrainStep step(c, world, settings);
  training::TrainState state;
  state.ema = std::make_shared<training::ParameterEma>(0.9, c.parameters, *c.backend);
  StepsRun out;
  for (int s = 0; s < 3; ++s) {
    Batch batch;
    batch.batch_size = 4;
    batch.seq_len = 16;
    for (std::int64_t i = 0; i < 4 * 16; ++i) {
      batch.inputs.push_back(static_cast<std::int32_t>(random_bits(40 + s, static_cast<std::uint32_t>(i)) % 64));
      batch.targets.push_back(static_cast<std::int32_t>(random_bits(80 + s, static_cast<std::uint32_t>(i)) % 64));
    }
    const training::StepResult r = step.run(batch, state);
    state.ema->update();
    out.losses.push_back(r.loss);
    out.norms.push_back(r.grad_norm);
  }
  for (const auto& p : c.parameters) out.parameters.push_back(p.parameter->tensor().to_vector());
  for (const auto& [name, t] : state.ema->state()) out.averages.push_back(t.to_vector());
  return out;
}

// The two runs' losses, norms, final parameters and weight averages, bit for bit.
void expect_same_bits(const StepsRun& device, const StepsRun& host) {
  ASSERT_EQ(device.losses.size(), host.losses.size());
  for (std::size_t s = 0; s < host.losses.size(); ++s) {
    EXPECT_EQ(device.losses[s], host.losses[s]) << "step " << s;
    EXPECT_EQ(device.norms[s], host.norms[s]) << "step " << s;
  }
  ASSERT_EQ(device.parameters.size(), host.parameters.size());
  for (std::size_t i = 0; i < host.parameters.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(device.parameters[i], host.parameters[i])) << "parameter " << i;
    EXPECT_TRUE(bitwise_equal(device.averages[i], host.averages[i])) << "average " << i;
  }
}

TEST(DeviceTraining, WholeStepsOnTheDeviceGiveTheReferenceBackendsBits) {
  expect_same_bits(train_steps("guarded", "guarded"), train_steps("reference", "naive"));
}

// A tiny Mixtral (llama with a mixture of 4 experts, 2 per token, both router losses): the
// router's top-k, the experts' gathers and the auxiliary losses on the device (BackendOp::routing),
// with and without remat (whose recomputation routes again).
ModelMaker tiny_mixtral(const char* remat) {
  return [remat](Backend* backend, const char* attention) {
    Value moe = Value::map();
    moe.set("num_experts", Value(std::int64_t{4}));
    moe.set("experts_per_token", Value(std::int64_t{2}));
    moe.set("router_aux_loss_coef", Value(0.05));
    moe.set("router_z_loss_coef", Value(0.01));
    Value node = Value::map();
    node.set("type", Value("llama"));
    node.set("seq_len", Value(std::int64_t{16}));
    node.set("hidden_dim", Value(std::int64_t{32}));
    node.set("intermediate_dim", Value(std::int64_t{24}));
    node.set("num_layers", Value(std::int64_t{2}));
    node.set("num_heads", Value(std::int64_t{2}));
    node.set("num_kv_heads", Value(std::int64_t{1}));
    node.set("moe", moe);
    node.set("remat", Value(remat));
    node.set("attention", Value(attention));
    return built(node, backend, 11);
  };
}

TEST(DeviceTraining, MixtureOfExpertsStepsOnTheDeviceGiveTheReferenceBackendsBits) {
  for (const char* remat : {"none", "full"}) {
    SCOPED_TRACE(std::string("remat ") + remat);
    expect_same_bits(train_steps("guarded", "guarded", tiny_mixtral(remat)),
                     train_steps("reference", "naive", tiny_mixtral(remat)));
  }
}

// The router's metrics come from the device's memory when read (MoeMetrics::read), and equal the
// reference backend's; reading them is the only copy they cost.
TEST(DeviceTraining, MixtureOfExpertsMetricsAreReadFromTheDevice) {
  const auto metrics_of = [](const std::string& backend_name, const char* attention) {
    Handle<Backend> backend = make_backend(backend_name);
    Handle<Model> model = tiny_mixtral("none")(backend.get(), attention);
    std::vector<std::int32_t> ids(2 * 16);
    for (std::size_t i = 0; i < ids.size(); ++i)
      ids[i] = static_cast<std::int32_t>(random_bits(5, static_cast<std::uint32_t>(i)) % 64);
    const Tensor tokens = Tensor::from(std::span<const std::int32_t>(ids), Shape{2, 16}).to(backend->device());
    Tape tape;
    Ops ops(*backend, &tape);
    model->loss(ops, tokens, tokens, Tensor());
    const HostDeviceCopies before = host_device_copies();
    auto metrics = model->metrics();
    const HostDeviceCopies after = host_device_copies();
    return std::make_pair(metrics, after.count - before.count);
  };
  const auto [host, host_copies] = metrics_of("reference", "naive");
  const auto [device, device_copies] = metrics_of("guarded", "guarded");
  EXPECT_EQ(host_copies, 0u);
  EXPECT_EQ(device_copies, 1u);
  ASSERT_EQ(device.size(), 2u + 4u);  // router_aux_loss, router_z_loss, expert_load/0..3
  EXPECT_EQ(device, host);
}

}  // namespace
}  // namespace loom::test
