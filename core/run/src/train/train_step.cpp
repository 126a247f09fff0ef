#include "train/train_step.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <string>

#include "loom/autograd.hpp"
#include "loom/error.hpp"
#include "loom/execution.hpp"
#include "loom/training_kernels.hpp"
#include "train/micro_batches.hpp"

namespace loom::training {

namespace {

bool is_bad(double x, bool nan, bool inf) {
  return (nan && std::isnan(x)) || (inf && std::isinf(x));
}

// Elements per chunk of the gradient norm: a fixed size, so that the sum's order (and bits) does
// not depend on the thread count.
constexpr std::int64_t kNormChunk = std::int64_t{1} << 16;

}  // namespace

TrainStep::TrainStep(RunComponents& components, World& world, const StepSettings& settings)
    : components_(components), world_(world), settings_(settings), strategies_(components.strategies) {
  if (components.strategies.empty())
    components.strategies = build_strategies(components, world, settings.overlap_reduce);
}

StepResult TrainStep::run(const Batch& batch, TrainState& state) {
  const std::int64_t step = state.step;
  StepResult result;
  // Each rank's part of the loss and gradients, then their sums over the ranks: every rank sees
  // the same norm, takes the same skip decision and applies the same update.
  result.loss = world_.sum(accumulate_gradients(batch, step, result.metrics));
  for (double& m : result.metrics) m = world_.sum(m);
  for (const auto& s : strategies_) s->finish_gradients(components_.parameters);
  result.grad_norm = global_grad_norm();
  check_finite(step, result.loss, result.grad_norm);

  result.lr = components_.schedule->learning_rate(step, settings_.num_steps, components_.peak_learning_rate);
  // A NaN or infinite loss or norm (crash_on_nan / crash_on_inf off) is never applied, and never
  // enters the skip rule's window.
  const bool finite = std::isfinite(result.loss) && std::isfinite(result.grad_norm);
  result.skipped = !finite || (state.skip_rule && state.skip_rule->should_skip(result.loss, result.grad_norm));
  if (result.skipped) {
    ++state.skipped_steps;
    ++state.step;
    return result;
  }

  clip_gradients(result.grad_norm, components_.max_grad_norm);
  for (auto s = strategies_.rbegin(); s != strategies_.rend(); ++s) (*s)->before_update();
  components_.optimizer->step(result.lr, step - state.skipped_steps);
  for (auto s = strategies_.rbegin(); s != strategies_.rend(); ++s) (*s)->after_update();
  ++state.step;
  return result;
}

double TrainStep::accumulate_gradients(const Batch& batch, std::int64_t step, std::vector<double>& metrics) {
  for (auto& p : components_.parameters) p.parameter->zero_grad();
  for (const auto& s : strategies_) s->begin_step();
  // Unless a strategy sums the micro-batches' gradients itself (FSDP, into its shards as they are
  // reduced), each micro-batch after the first sets the earlier ones' sum aside and adds it back.
  const bool set_aside =
      std::none_of(strategies_.begin(), strategies_.end(), [](const auto& s) { return s->sums_micro_batches(); });
  const std::function<void(Parameter&)> complete = [this](Parameter& p) { add_set_aside_gradient(p); };
  const std::int64_t micro_steps = batch.batch_size / settings_.micro_size;
  Objective& objective = *components_.objective;
  const ObjectiveModels models{*components_.model, components_.reference.get()};
  metrics.assign(objective.metric_names().size(), 0.0);

  // Each micro-batch's loss is a mean over its count() (counted targets, or pairs); weighting
  // it by its share of the batch's count makes the accumulated gradient the gradient of the
  // whole batch's loss, as one big batch would give.
  const std::int64_t total_counted = objective.count(batch.targets, batch.seq_len);
  // The whole batch's count: every rank fails alike, and rank 0 says so.
  if (total_counted == 0)
    world_.fail_together(UserError("step " + std::to_string(step) + ": the batch has no targets to learn"));

  double loss_sum = 0;
  bool first = true;
  const std::int64_t first_row = world_.first_row(batch.batch_size), rows = world_.row_count(batch.batch_size);
  const std::int64_t last_micro = (first_row + rows + settings_.micro_size - 1) / settings_.micro_size - 1;
  for_each_micro_batch(
      batch, settings_.micro_size,
      [&](const MicroBatch& micro) {
        if (!first && set_aside) set_aside_gradients();
        Tape tape;
        const MicroBatchTape on_tape{micro.index == last_micro, first || !set_aside ? nullptr : &complete};
        for (const auto& s : strategies_) s->attach(tape, on_tape);
        Ops ops(*components_.backend, &tape);
        ops.set_dropout_seed(settings_.seed, static_cast<std::uint64_t>(step * micro_steps + micro.index));
        ops.set_z_loss_weight(settings_.z_loss_weight);
        if (components_.lora) ops.set_linear_adapters(&components_.lora->table());
        for (const auto& s : strategies_) s->attach(ops);
        // The batch in: one explicit copy of each tensor to a device backend's memory.
        const Device device = components_.backend->device();
        auto in = [&](const Tensor& t) { return t.defined() ? t.to(device) : t; };
        ObjectiveLoss loss =
            objective.loss(ops, models, ObjectiveBatch{in(micro.tokens), in(micro.targets), in(micro.segments)});
        const std::int64_t counted =
            objective.count(std::span<const std::int32_t>(micro.targets.data<std::int32_t>(),
                                                          static_cast<std::size_t>(micro.targets.numel())),
                            batch.seq_len);
        const double weight = static_cast<double>(counted) / static_cast<double>(total_counted);
        loss_sum += loss.value * weight;
        for (std::size_t i = 0; i < metrics.size() && i < loss.metrics.size(); ++i)
          metrics[i] += loss.metrics[i] * weight;
        if (!loss.gradient.defined()) {
          tape.backward(loss.output, static_cast<float>(weight));
        } else {
          if (loss.gradient.is_host_visible()) {
            float* g = loss.gradient.data<float>();
            for (std::int64_t i = 0; i < loss.gradient.numel(); ++i) g[i] = static_cast<float>(g[i] * weight);
          } else {
            // In the backend's memory: scaled there (by the weight rounded to float first).
            float* g = loss.gradient.device_data<float>();
            components_.backend->scale(g, static_cast<float>(weight), g, loss.gradient.numel(), false);
          }
          tape.backward(loss.output, std::move(loss.gradient));
        }
        for (const auto& s : strategies_) s->end_micro_batch();
        if (set_aside && !first) add_set_aside_gradients();
        first = false;
      },
      first_row, rows);
  // Every reduction is posted now, before the loss sum, whatever this rank's micro-batches reached
  // (the gradients are complete: the earlier micro-batches' are added in above).
  for (const auto& s : strategies_) s->end_backward();
  return loss_sum;
}

void TrainStep::set_aside_gradients() {
  auto& params = components_.parameters;
  if (set_aside_.empty()) {
    set_aside_.resize(params.size());
    has_set_aside_.assign(params.size(), false);
  }
  Backend& backend = *components_.backend;
  for (std::size_t i = 0; i < params.size(); ++i) {
    Parameter& p = *params[i].parameter;
    has_set_aside_[i] = p.has_grad();
    if (!p.has_grad()) continue;
    if (!set_aside_[i].defined()) set_aside_[i] = Tensor::empty(p.shape(), DType::f32, p.tensor().device());
    const Tensor g = p.grad();
    backend.scale(g.device_data<float>(), 1.0f, set_aside_[i].device_data<float>(), g.numel(), false);
    p.zero_grad();
  }
}

void TrainStep::add_set_aside_gradients() {
  for (std::size_t i = 0; i < components_.parameters.size(); ++i) add_set_aside_gradient(i);
}

void TrainStep::add_set_aside_gradient(Parameter& p) {
  if (index_.empty())
    for (std::size_t i = 0; i < components_.parameters.size(); ++i) index_[components_.parameters[i].parameter] = i;
  if (const auto it = index_.find(&p); it != index_.end()) add_set_aside_gradient(it->second);
}

void TrainStep::add_set_aside_gradient(std::size_t i) {
  if (!has_set_aside_[i]) return;
  has_set_aside_[i] = false;  // added once, during backward or after it
  Parameter& p = *components_.parameters[i].parameter;
  Backend& backend = *components_.backend;
  if (p.has_grad()) {
    const Tensor g = p.grad();
    backend.add(set_aside_[i].device_data<float>(), g.device_data<float>(), g.device_data<float>(), g.numel());
  } else {
    // Not reached by this micro-batch: the gradient is the earlier ones' sum, back in place.
    p.mark_grad_written();
    const Tensor g = p.grad();
    backend.scale(set_aside_[i].device_data<float>(), 1.0f, g.device_data<float>(), g.numel(), false);
  }
}

double TrainStep::global_grad_norm() const {
  // In double: each parameter's gradient in chunks of kNormChunk elements, the chunks summed in
  // parallel and their sums added in parameter and chunk order (one pass over the gradients at
  // memory speed; the order, and so the result, independent of the thread count). A sharded run
  // sums its shard's squares and then the ranks'.
  std::vector<NormChunk>& chunks = norm_chunks_;
  chunks.clear();
  // Each chunk's part of the norm, as the strategies hold its parameter (train/strategy.hpp): this
  // rank's own squares, a tensor shard's, or a replica's.
  std::vector<NormPart>& part_of = norm_parts_;
  part_of.clear();
  for (std::size_t i = 0; i < components_.parameters.size(); ++i) {
    const ModelParameter& p = components_.parameters[i];
    if (!p.parameter->has_grad()) continue;
    const Tensor g = p.parameter->grad();
    // A gradient in a device's memory: its chunks are summed by the backend's kernel below, into
    // the same slots of `partial`, in the same chunk order.
    const bool on_host = g.is_host_visible();
    const float* d = g.device_data<float>();
    NormPart part = NormPart::local;
    for (auto s = strategies_.rbegin(); s != strategies_.rend(); ++s)
      if (const std::optional<NormPart> decided = (*s)->norm_part(i, *p.parameter)) {
        part = *decided;
        break;
      }
    for (std::int64_t i = 0; i < g.numel(); i += kNormChunk) {
      chunks.push_back({d + i, std::min(kNormChunk, g.numel() - i), on_host, i == 0 ? g.numel() : 0});
      part_of.push_back(part);
    }
  }
  std::vector<double>& partial = norm_partials_;
  partial.resize(chunks.size());
  // Gradients in a device's memory: each one's chunk sums into its slots of one device buffer
  // (chunk c at double c), which comes to the host in one copy, whatever the parameter count.
  const bool any_device = std::any_of(chunks.begin(), chunks.end(), [](const NormChunk& c) { return !c.host; });
  if (any_device) {
    const auto slots = static_cast<std::int64_t>(2 * chunks.size());
    if (!norm_device_partials_.defined() || norm_device_partials_.numel() < slots)
      norm_device_partials_ = Tensor::empty(Shape{slots}, DType::f32, components_.backend->device());
    auto* device_partials = reinterpret_cast<double*>(norm_device_partials_.device_data<float>());
    for (std::size_t c = 0; c < chunks.size(); ++c)
      if (!chunks[c].host && chunks[c].whole > 0)
        components_.backend->sum_of_squares(chunks[c].data, chunks[c].whole, kNormChunk, device_partials + c);
    const Tensor host = norm_device_partials_.slice(0, 0, slots).to(Device::host());
    const auto* sums = reinterpret_cast<const double*>(host.data<float>());
    for (std::size_t c = 0; c < chunks.size(); ++c)
      if (!chunks[c].host) partial[c] = sums[c];
  }
  default_execution_context().parallel_for(static_cast<std::int64_t>(chunks.size()), 1,
                                           [&](std::int64_t first, std::int64_t last) {
                                             for (std::int64_t c = first; c < last; ++c)
                                               if (chunks[c].host)
                                                 partial[c] = sum_of_squares(chunks[c].data, chunks[c].n);
                                           });
  NormParts parts;
  for (std::size_t c = 0; c < partial.size(); ++c)
    (part_of[c] == NormPart::split   ? parts.split
     : part_of[c] == NormPart::local ? parts.local
                                     : parts.replicated) += partial[c];
  for (auto s = strategies_.rbegin(); s != strategies_.rend(); ++s) (*s)->contribute_to_norm(parts);
  return std::sqrt(parts.local + parts.replicated);
}

void TrainStep::check_finite(std::int64_t step, double loss, double grad_norm) {
  const bool crash_nan = settings_.crash_on_nan, crash_inf = settings_.crash_on_inf;
  // The loss and the norm are the ranks' sums: every rank fails alike, and rank 0 says so.
  if (is_bad(loss, crash_nan, crash_inf) || is_bad(grad_norm, crash_nan, crash_inf)) {
    const bool bad_loss = is_bad(loss, crash_nan, crash_inf);
    const std::string quantity = bad_loss ? "loss" : "gradient norm";
    const std::string kind = std::isnan(bad_loss ? loss : grad_norm) ? "NaN" : "infinite";
    UserError error("step " + std::to_string(step + 1) + ": the " + quantity + " is " + kind + " (loss " +
                    std::to_string(loss) + ", gradient norm " + std::to_string(grad_norm) +
                    "): the run diverged. Lower optimizer.learning_rate, raise the warmup, or set "
                    "trainer.skip_bad_steps=true; trainer.crash_on_nan=false and crash_on_inf=false continue anyway");
    divergence_ = Divergence{step + 1, loss, grad_norm, kind + " " + quantity, error.message()};
    world_.fail_together(error);
  }
}

void TrainStep::clip_gradients(double grad_norm, double max_norm) {
  if (max_norm <= 0 || grad_norm <= max_norm) return;
  const float factor = static_cast<float>(max_norm / (grad_norm + 1e-6));
  for (const auto& p : components_.parameters) {
    if (!p.parameter->has_grad()) continue;
    const Tensor g = p.parameter->grad();
    components_.backend->scale(g.device_data<float>(), factor, g.device_data<float>(), g.numel(), false);
  }
}

}  // namespace loom::training
