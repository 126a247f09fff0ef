#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "train/hooks/run_hooks.hpp"

namespace loom::training {

namespace {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// FSDP: every rank gathers the units together; under fsdp x tensor, the tensor group's shards
// whole too.
NamedTensors gather_units(LoopState& s) {
  RunComponents& c = s.run.components;
  NamedTensors full = s.views.with_average([&] { return c.fsdp->gather_full(); });
  if (c.tensor)
    for (auto& [name, t] : full) t = c.tensor->whole(name, t);
  return full;
}

// Tensor parallelism: every rank takes part in the gathers; rank 0 alone keeps the whole
// tensors (a copy of a replicated one: the average is swapped out of the parameters after).
NamedTensors gather_shards(LoopState& s) {
  RunComponents& c = s.run.components;
  const bool primary = s.run.parallel->is_primary();
  return s.views.with_average([&] {
    NamedTensors out;
    for (const auto& p : c.model->parameters()) {
      Tensor whole =
          c.tensor->is_split(p.parameter) ? c.tensor->whole(p.parameter->name(), p.parameter->data()) : Tensor();
      if (!primary) continue;
      out.emplace_back(p.parameter->name(), whole.defined() ? std::move(whole) : p.parameter->data().clone());
    }
    return out;
  });
}

}  // namespace

void save_final_weights(LoopState& s) {
  Run& run = s.run;
  RunComponents& c = run.components;
  if (!run.trainer.get<bool>("save_final")) return;
  const bool primary = run.parallel->is_primary();
  const bool averaged = run.state.ema != nullptr;
  // A rank whose parameters are whole (and the adapters of LoRA under FSDP, which are replicated):
  // rank 0 writes its own.
  if (!(c.fsdp && !c.lora) && !c.tensor) {
    if (primary)
      s.views.with_average([&] {
        if (c.lora)  // the adapters alone, in PEFT's layout
          c.lora->save_peft(*c.model, run.directory.path(), run.trainer.get<std::string>("init_from"));
        else
          run.directory.save_weights(c.saved_parameters(), run.num_steps, averaged);
        return 0;
      });
    return;
  }
  // Sharded weights: every rank gathers the whole ones; rank 0 writes them.
  NamedTensors full = c.fsdp && !c.lora ? gather_units(s) : gather_shards(s);
  if (!primary) return;
  std::deque<Parameter> values;
  std::vector<ModelParameter> saved;
  for (auto& [name, t] : full) saved.push_back({&values.emplace_back(name, std::move(t))});
  run.directory.save_weights(saved, run.num_steps, averaged);
}

}  // namespace loom::training
