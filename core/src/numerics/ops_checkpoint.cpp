// Activation checkpointing (Ops::checkpoint): a segment of the forward pass runs unrecorded and
// is recomputed, on a tape of its own, when the backward pass reaches it.
#include <deque>

#include "numerics/ops_support.hpp"

namespace loom {
namespace detail {

struct CheckpointNode final : Node {
  using Node::Node;
  const char* name() const override { return "checkpoint"; }
  Segment segment;
  RematPolicy policy = RematPolicy::full;
  std::vector<Tensor> inputs;       // detached values
  std::vector<GradTarget> targets;  // where each input's gradient goes
  std::vector<Tensor> saved;        // save_dots: the matrix products' outputs, in call order
  bool training = true;
  std::uint64_t dropout_seed = 0, dropout_step = 0, dropout_calls = 0;
  const LinearAdapters* adapters = nullptr;            // the first run's low-rank adapters
  std::function<void(Parameter&)> parameter_observer;  // the first run's
  CollectiveGroup* tensor_group = nullptr;             // the first run's: the recomputation communicates alike

  void backward(BackwardPass& pass) override {
    Tape tape;
    Ops ops(*backend, &tape);
    ops.set_training(training);
    ops.set_dropout_seed(dropout_seed, dropout_step);
    ops.dropout_calls_ = dropout_calls;  // the dropout masks of the first run
    ops.adapters_ = adapters;
    ops.parameter_observer_ = parameter_observer;
    ops.tensor_group_ = tensor_group;
    if (policy == RematPolicy::save_dots) ops.remat_replay_ = &saved;
    // The inputs become leaves of the inner tape (parameters of their own) where a gradient is
    // wanted; the segment's parameters are the model's, and accumulate as usual.
    std::deque<Parameter> leaves;
    std::vector<Tensor> args;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (targets[i].active()) {
        args.push_back(leaves.emplace_back("checkpoint input", inputs[i]).tensor());
      } else {
        args.push_back(inputs[i]);
      }
    }
    const std::vector<Tensor> outputs = segment(ops, args);
    if (policy == RematPolicy::save_dots && ops.remat_next_ != saved.size())
      throw InternalError("checkpoint: the segment made " + std::to_string(ops.remat_next_) +
                          " matrix products when recomputed, " + std::to_string(saved.size()) + " the first time");
    if (outputs.size() != num_outputs)
      throw InternalError("checkpoint: the segment returned " + std::to_string(outputs.size()) +
                          " outputs when recomputed, " + std::to_string(num_outputs) + " the first time");
    std::vector<Tensor> roots, seeds;
    for (std::uint32_t i = 0; i < num_outputs; ++i) {
      const Tensor& g = pass.output_grad(*this, static_cast<int>(i));
      if (!g.defined() || !tape.state().requires_grad(outputs[i], "checkpoint")) continue;
      roots.push_back(outputs[i]);
      seeds.push_back(g);
    }
    if (!roots.empty()) tape.backward(roots, seeds);
    auto leaf = leaves.begin();
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (!targets[i].active()) continue;
      if (leaf->has_grad()) pass.accumulate(targets[i], leaf->grad());
      ++leaf;
    }
  }
};

}  // namespace detail

std::vector<Tensor> Ops::checkpoint(std::span<const Tensor> inputs_in, const Segment& segment, RematPolicy policy) {
  if (parameter_observer_) observe_parameters(inputs_in);
  constexpr const char* op = "checkpoint";
  if (policy == RematPolicy::none || !tape_ || !tape_->recording() || remat_save_ || remat_replay_)
    return segment(*this, inputs_in);  // nothing to save, or already inside a checkpoint
  // Contiguous inputs (recorded copies where needed): the recomputation's leaves are parameters.
  std::vector<Tensor> inputs;
  for (const Tensor& t : inputs_in) {
    detail::require_f32(*this, t, op, "input");
    inputs.push_back(contiguous(t));
  }
  std::vector<Tensor> saved;
  const std::uint64_t dropout_calls = dropout_calls_;
  std::vector<Tensor> outputs;
  detail::TapeState& state = tape_->state();
  std::vector<Parameter*> parameters;  // those the segment uses: the node is their first use
  {
    NoGradGuard guard(*tape_);
    if (policy == RematPolicy::save_dots) remat_save_ = &saved;
    state.parameter_collector = &parameters;
    try {
      outputs = segment(*this, inputs);
    } catch (...) {
      remat_save_ = nullptr;
      state.parameter_collector = nullptr;
      throw;
    }
    remat_save_ = nullptr;
    state.parameter_collector = nullptr;
  }
  // A parameter's gradient is complete once the backward pass is past its first use (the
  // data-parallel trainer's on_gradient_ready): for those of the segment, this node. And the
  // segment's parameters, frozen ones too, are needed again when the backward pass reaches it
  // (on_parameter_needed).
  for (Parameter* p : parameters) {
    const Tensor* value = &p->tensor();
    state.note_inputs(std::span<const Tensor* const>(&value, 1));
  }
  auto* node = state.record<detail::CheckpointNode>(*backend_);
  node->segment = segment;
  node->policy = policy;
  for (const Tensor& t : inputs) {
    node->inputs.push_back(t.detach());
    node->targets.push_back(state.requires_grad(t, op) ? state.target(t) : detail::GradTarget{});
  }
  node->saved = std::move(saved);
  node->training = training_;
  node->dropout_seed = dropout_seed_;
  node->dropout_step = dropout_step_;
  node->dropout_calls = dropout_calls;
  node->adapters = adapters_;
  node->parameter_observer = parameter_observer_;
  node->tensor_group = tensor_group_;
  for (Tensor& out : outputs) {
    if (!out.defined() || !out.is_contiguous() || out.dtype() != DType::f32)
      detail::op_error(op, "the segment's outputs must be contiguous f32 tensors made by its operations");
    state.add_output(*node, out);
  }
  return outputs;
}

}  // namespace loom
