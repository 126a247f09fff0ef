// Devices (device.hpp) with the test device `guarded` (tests/fixtures/plugins/guarded_backend.cpp),
// whose memory is PROT_NONE except while its own backend runs: host code cannot read it, copies
// between devices are explicit, operations refuse tensors from another device and kernels a
// backend declines, and a whole training step on the device gives the host's bits.
#include <gtest/gtest.h>

#include <cstdio>
#include <loom/error.hpp>
#include <string>

#include "numerics_test_support.hpp"
#include "tiny_model.hpp"

namespace loom::test {
namespace {

const Device guarded("guarded", 0);

// The device exists once its backend has been created (it registers its buffer type).
Handle<Backend> guarded_backend(const std::vector<std::string>& unsupported = {}) {
  Value options = Value::map();
  if (!unsupported.empty()) {
    Value::List list;
    for (const auto& name : unsupported) list.emplace_back(name);
    options.set("unsupported", Value(list));
  }
  return make_backend("guarded", nullptr, options);
}

std::vector<float> iota(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) + 0.5f;
  return v;
}

template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

TEST(Device, NamesAndEquality) {
  EXPECT_TRUE(Device().is_host());
  EXPECT_EQ(Device().str(), "host");
  EXPECT_EQ(guarded.str(), "guarded:0");
  EXPECT_EQ(Device("guarded", 1).str(), "guarded:1");
  EXPECT_FALSE(guarded == Device("guarded", 1));
  EXPECT_TRUE(guarded == Device("guarded"));
  EXPECT_THROW(Device(""), InternalError);
  EXPECT_THROW(Device("a-device-name-far-too-long-to-fit"), InternalError);
  EXPECT_THROW(Device("x", -1), InternalError);
}

TEST(Device, HostTensorsAreOnTheHostAndUnchanged) {
  const Tensor t = Tensor::from(std::span<const float>(iota(6)), Shape{2, 3});
  EXPECT_TRUE(t.device().is_host());
  EXPECT_TRUE(t.is_host_visible());
  EXPECT_EQ(&t.buffer_type(), &host_buffer_type());
  EXPECT_EQ(t.str(), "Tensor(f32, [2, 3])");
  // to() the device a tensor is on already is the tensor itself, not a copy.
  EXPECT_TRUE(t.to(Device::host()).shares_storage_with(t));
  Handle<Backend> cpu = make_backend("cpu");
  EXPECT_TRUE(cpu->device().is_host());
  EXPECT_EQ(&cpu->buffer_type(), &host_buffer_type());
}

TEST(Device, UnknownDevicesAreNamed) {
  const std::string m = message_of([] { Tensor::empty(Shape{2}, DType::f32, Device("nowhere")); });
  EXPECT_NE(m.find("nowhere:0"), std::string::npos) << m;
  EXPECT_NE(m.find("host"), std::string::npos) << m;
}

TEST(Device, HostCodeCannotReadDeviceMemory) {
  Handle<Backend> backend = guarded_backend();
  const Tensor t = Tensor::zeros(Shape{3, 4}, DType::f32, guarded);
  EXPECT_EQ(t.device(), guarded);
  EXPECT_FALSE(t.is_host_visible());
  EXPECT_EQ(t.str(), "Tensor(f32, [3, 4], guarded:0)");
  const std::string m = message_of([&] { t.data<float>(); });
  EXPECT_NE(m.find("guarded:0"), std::string::npos) << m;
  EXPECT_NE(m.find("to(Device::host())"), std::string::npos) << m;
  EXPECT_THROW(t.raw_data(), InternalError);
  EXPECT_THROW(t.slice(1, 1, 3).data<float>(), InternalError);
  // The explicit copies work.
  EXPECT_EQ(t.to_vector(), std::vector<float>(12, 0.0f));
  EXPECT_EQ(t.select(0, 1).select(0, 2).item(), 0.0f);
}

TEST(DeviceDeathTest, TheDevicesMemoryIsReallyProtected) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // A host read of device memory that bypasses data<T>()'s check faults: what makes the
  // conformance suite passing on this device mean that the core never touches device memory.
  EXPECT_DEATH(
      {
        Handle<Backend> backend = guarded_backend();
        const Tensor t = Tensor::zeros(Shape{16}, DType::f32, guarded);
        const volatile float* p = t.device_data<float>();
        std::printf("%f\n", static_cast<double>(p[3]));
      },
      "");
}

TEST(Device, CopiesBetweenDevicesAreExplicitAndExact) {
  Handle<Backend> backend = guarded_backend();
  const std::vector<float> values = iota(60);
  const Tensor host = Tensor::from(std::span<const float>(values), Shape{3, 4, 5});
  const Tensor dev = host.to(guarded);
  EXPECT_EQ(dev.device(), guarded);
  EXPECT_FALSE(dev.shares_storage_with(host));
  EXPECT_EQ(dev.to_vector(), values);
  EXPECT_EQ(dev.to(Device::host()).device(), Device::host());

  // Strided both ways: a device view into a host tensor, a host view into a device tensor,
  // device to device.
  const Tensor slice = dev.slice(1, 1, 3).slice(2, 2, 5);  // [3, 2, 3], strided
  EXPECT_EQ(slice.to_vector(), host.slice(1, 1, 3).slice(2, 2, 5).to_vector());
  const Tensor host_target = Tensor::zeros(Shape{3, 4, 5});
  host_target.slice(1, 1, 3).slice(2, 2, 5).copy_from(slice);
  const Tensor dev_target = Tensor::zeros(Shape{3, 4, 5}, DType::f32, guarded);
  dev_target.slice(1, 1, 3).slice(2, 2, 5).copy_from(host.slice(1, 1, 3).slice(2, 2, 5));
  EXPECT_EQ(dev_target.to_vector(), host_target.to_vector());
  const Tensor dev_copy = Tensor::zeros(Shape{3, 4, 5}, DType::f32, guarded);
  dev_copy.slice(1, 1, 3).slice(2, 2, 5).copy_from(slice);
  EXPECT_EQ(dev_copy.to_vector(), host_target.to_vector());
  // The elements outside the copied window are untouched.
  EXPECT_EQ(dev_copy.select(1, 0).to_vector(), std::vector<float>(15, 0.0f));

  const Tensor cloned = slice.clone();
  EXPECT_EQ(cloned.device(), guarded);
  EXPECT_TRUE(cloned.is_contiguous());
  EXPECT_EQ(cloned.to_vector(), slice.to_vector());

  const Tensor ids = Tensor::from(std::span<const std::int32_t>(std::vector<std::int32_t>{4, 1, 7}), Shape{3});
  EXPECT_EQ(ids.to(guarded).to_int_vector(), (std::vector<std::int32_t>{4, 1, 7}));
}

TEST(Device, KernelsOfADeviceRefuseHostPointers) {
  Handle<Backend> backend = guarded_backend();
  std::vector<float> x(8, 1.0f), y(8);
  const std::string m = message_of([&] { backend->scale(x.data(), 2.0f, y.data(), 8, false); });
  EXPECT_NE(m.find("outside the device's memory"), std::string::npos) << m;
}

TEST(Device, OperationsRefuseTensorsFromAnotherDevice) {
  Handle<Backend> backend = guarded_backend();
  Ops ops(*backend);
  EXPECT_EQ(ops.device(), guarded);
  const Tensor host = Tensor::full(Shape{2, 3}, 1.0f);
  const Tensor dev = host.to(guarded);
  std::string m = message_of([&] { ops.add(dev, host); });
  EXPECT_NE(m.find("add: b"), std::string::npos) << m;
  EXPECT_NE(m.find("is on host"), std::string::npos) << m;
  EXPECT_NE(m.find("'guarded' computes on guarded:0"), std::string::npos) << m;
  EXPECT_EQ(ops.add(dev, dev).to_vector(), std::vector<float>(6, 2.0f));

  Handle<Backend> cpu = make_backend("cpu");
  Ops host_ops(*cpu);
  m = message_of([&] { host_ops.linear(dev, host); });
  EXPECT_NE(m.find("linear: x"), std::string::npos) << m;
  EXPECT_NE(m.find("guarded:0"), std::string::npos) << m;

  // Ids are device tensors too, checked on the host through a copy.
  const Tensor table = Tensor::full(Shape{5, 2}, 1.0f).to(guarded);
  const Tensor bad_ids =
      Tensor::from(std::span<const std::int32_t>(std::vector<std::int32_t>{1, 9}), Shape{2}).to(guarded);
  m = message_of([&] { ops.embedding(table, bad_ids); });
  EXPECT_NE(m.find("id 9 at position 1"), std::string::npos) << m;

  // An attention kernel must compute where the backend does.
  NaiveAttention host_attention;
  const Tensor q = Tensor::full(Shape{1, 2, 1, 4}, 0.5f).to(guarded);
  m = message_of([&] { ops.attention(host_attention, q, q, q); });
  EXPECT_NE(m.find("attention kernel computes on host"), std::string::npos) << m;

  // Gradient buffers live with their parameter.
  Parameter p("w", dev.clone());
  EXPECT_EQ(p.tensor().device(), guarded);
  EXPECT_THROW(p.set_grad_buffer(Tensor::zeros(Shape{2, 3})), InternalError);
  p.set_grad_buffer(Tensor::zeros(Shape{2, 3}, DType::f32, guarded));
}

TEST(Device, UnsupportedKernelsAreRefusedNamingOperationBackendAndDtype) {
  Handle<Backend> backend = guarded_backend({"rope", "dropout"});
  EXPECT_FALSE(backend->supports_op(BackendOp::rope, DType::f32));
  EXPECT_TRUE(backend->supports_op(BackendOp::gemm, DType::f32));
  EXPECT_FALSE(backend->supports_op(BackendOp::gemm, DType::bf16));
  Ops ops(*backend);
  const RopeTable table(RopeConfig{}, 4, 8);
  const Tensor x = Tensor::full(Shape{1, 3, 2, 4}, 1.0f).to(guarded);
  std::string m;
  try {
    ops.rope(x, table);
  } catch (const UserError& e) {
    m = e.what();
  }
  EXPECT_NE(m.find("rope: backend 'guarded' does not support f32 data in its rope kernels"), std::string::npos) << m;
  EXPECT_THROW(ops.dropout(x, 0.5f), UserError);
  // What it supports still runs.
  EXPECT_EQ(ops.scale(x, 2.0f).to_vector(), std::vector<float>(24, 2.0f));
  EXPECT_THROW(guarded_backend({"no_such_kernels"}), UserError);
}

TEST(Device, TheTrainerRefusesABackendWithoutHostMemory) {
  Handle<Backend> backend = guarded_backend();
  const std::string m = message_of([&] { require_host_memory(*backend, "loom train"); });
  EXPECT_NE(m.find("backend 'guarded' computes in guarded:0 memory"), std::string::npos) << m;
  EXPECT_NE(m.find("loom train"), std::string::npos) << m;
  Handle<Backend> cpu = make_backend("cpu");
  EXPECT_NO_THROW(require_host_memory(*cpu, "loom train"));
}

TEST(Device, TrainingStepsOnTheDeviceGiveTheHostsBits) {
  // The guarded device computes with `reference` and `naive` inside its arena, so the same steps
  // on the host with those two must give the same bits: nothing on the way (copies, staging,
  // the tape's gradient plumbing) changes a value.
  Handle<Backend> device_backend = guarded_backend();
  Handle<AttentionKernel> device_attention = make_attention("guarded");
  Handle<Backend> host_backend = make_backend("reference");
  Handle<AttentionKernel> host_attention = make_attention("naive");
  auto run = [](Backend& backend, AttentionKernel& attention) {
    TinyModel model({}, 1, backend.device());
    std::vector<float> losses;
    for (std::uint64_t s = 0; s < 2; ++s) {
      Tape tape;
      Ops ops(backend, &tape);
      ops.set_dropout_seed(5, s);
      auto [tokens, targets] = model.batch(s);
      Tensor loss = model.loss(ops, attention, tokens, targets);
      losses.push_back(loss.item());
      tape.backward(loss);
      for (Parameter& p : model.parameters())
        if (p.has_grad())
          backend.scale(p.grad().device_data<float>(), -0.05f, p.data().device_data<float>(), p.grad().numel(), true);
      if (s == 0)
        for (Parameter& p : model.parameters()) p.zero_grad();
    }
    std::vector<std::vector<float>> grads;
    for (Parameter& p : model.parameters()) {
      EXPECT_EQ(p.tensor().device(), backend.device());
      grads.push_back(p.grad().to_vector());
    }
    return std::make_pair(losses, grads);
  };
  const auto [device_losses, device_grads] = run(*device_backend, *device_attention);
  const auto [host_losses, host_grads] = run(*host_backend, *host_attention);
  EXPECT_TRUE(bitwise_equal(device_losses, host_losses));
  ASSERT_EQ(device_grads.size(), host_grads.size());
  for (std::size_t i = 0; i < host_grads.size(); ++i)
    EXPECT_TRUE(bitwise_equal(device_grads[i], host_grads[i])) << "parameter " << i;
}

TEST(Device, HostDeviceCopiesAreCounted) {
  Handle<Backend> backend = guarded_backend();
  reset_host_device_copies();
  const Tensor host = Tensor::from(std::span<const float>(iota(12)), Shape{3, 4});
  const Tensor dev = host.to(guarded);
  EXPECT_EQ(host_device_copies().count, 1u);
  EXPECT_EQ(host_device_copies().bytes, 48u);
  // Within one device, and within the host: not counted.
  const Tensor dev2 = dev.clone();
  const Tensor host2 = host.clone();
  host2.copy_from(host);
  EXPECT_EQ(host_device_copies().count, 1u);
  // Out again: whole, strided (staged through the host, still one copy) and one element.
  EXPECT_EQ(dev2.to_vector(), iota(12));
  EXPECT_EQ(dev.slice(1, 1, 3).to_vector(), (std::vector<float>{1.5f, 2.5f, 5.5f, 6.5f, 9.5f, 10.5f}));
  EXPECT_EQ(dev.select(0, 1).select(0, 2).item(), 6.5f);
  // Into a strided view of device memory: one copy.
  dev2.slice(1, 0, 2).copy_from(host.slice(1, 2, 4));
  const HostDeviceCopies counted = reset_host_device_copies();
  EXPECT_EQ(counted.count, 5u);
  EXPECT_EQ(counted.bytes, 48u + 48u + 24u + 4u + 24u);
  EXPECT_EQ(host_device_copies().count, 0u);
  EXPECT_EQ(host_device_copies().bytes, 0u);
}

// The operations that computed on the host until issue 25 (mul, softcap, softmax, logsumexp,
// concat, sum, the losses' z-loss and logit soft-cap and their reductions) run on the device
// without the host touching its memory (the guarded arena would fault), copy nothing to or from
// the host but what the losses must (the targets' range check; the seed of the backward pass),
// and give the reference backend's bits, forward and backward.
TEST(Device, ConvertedOperationsRunOnTheDeviceWithTheReferencesBits) {
  Handle<Backend> device_backend = guarded_backend();
  Handle<Backend> host_backend = make_backend("reference");
  struct Result {
    std::vector<std::vector<float>> values;
    std::uint64_t forward_copies = 0, backward_copies = 0;
  };
  const std::vector<std::int32_t> target_values{3, -100, 0, 6, 2, 6};
  auto run = [&](Backend& backend, int which) {
    const Device d = backend.device();
    Parameter a("a", random_tensor(Shape{6, 7}, 11, 2.0f).to(d));
    Parameter b("b", random_tensor(Shape{6, 7}, 12, 2.0f).to(d));
    Parameter w("w", random_tensor(Shape{7, 7}, 13, 0.5f).to(d));
    const Tensor targets = Tensor::from(std::span<const std::int32_t>(target_values), Shape{6}).to(d);
    Tape tape;
    Ops ops(backend, &tape);
    ops.set_z_loss_weight(0.03f);
    reset_host_device_copies();
    Tensor out;
    switch (which) {
      case 0:
        out = ops.sum(ops.mul(ops.softcap(a.tensor(), 1.5f), b.tensor()));
        break;
      case 1:
        out = ops.sum(ops.mul(ops.softmax(a.tensor()),
                              ops.concat(std::vector<Tensor>{b.tensor().slice(0, 0, 2), b.tensor().slice(0, 2, 6)})));
        break;
      case 2:
        out = ops.sum(ops.logsumexp(ops.mul(a.tensor(), b.tensor())));
        break;
      case 3:
        out = ops.cross_entropy(ops.scale(a.tensor(), 1.0f), targets);
        break;
      case 4:
        out = ops.linear_cross_entropy(a.tensor(), w.tensor(), targets, {.chunk_tokens = 4, .logit_softcap = 2.0f});
        break;
      default:
        out = ops.sum(ops.linear_cross_entropy(
            a.tensor(), w.tensor(), targets, {.reduction = Reduction::none, .chunk_tokens = 4, .logit_softcap = 2.0f}));
        break;
    }
    Result r;
    r.forward_copies = reset_host_device_copies().count;
    const Tensor seed = Tensor::scalar(0.75f).to(d);
    reset_host_device_copies();
    tape.backward(std::vector<Tensor>{out}, std::vector<Tensor>{seed});
    r.backward_copies = reset_host_device_copies().count;
    r.values.push_back(out.to_vector());
    for (Parameter* p : {&a, &b, &w}) r.values.push_back(p->has_grad() ? p->grad().to_vector() : std::vector<float>());
    return r;
  };
  for (int which = 0; which < 6; ++which) {
    SCOPED_TRACE("case " + std::to_string(which));
    const Result device = run(*device_backend, which);
    const Result host = run(*host_backend, which);
    ASSERT_EQ(device.values.size(), host.values.size());
    for (std::size_t i = 0; i < host.values.size(); ++i)
      EXPECT_TRUE(bitwise_equal(device.values[i], host.values[i])) << "value " << i;
    // The losses read their targets on the host to check their range, and their
    // backward passes read the seed (one per row with Reduction::none). Nothing else.
    const bool loss = which >= 3;
    EXPECT_EQ(device.forward_copies, loss ? 1u : 0u);
    EXPECT_EQ(device.backward_copies, loss ? 1u : 0u);
  }
}

}  // namespace
}  // namespace loom::test
