#include <algorithm>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "train/hooks/run_hooks.hpp"

namespace loom::training {

namespace {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// The weights held in parts: every rank takes part in making them whole. A strategy that holds
// the model's parameters elsewhere (FSDP's units) gathers them, on every rank, and the others
// (the tensor group's shards) make each whole (make_whole, as checkpoints do); otherwise the model's parameters are
// made whole from their shards and rank 0 alone keeps them (a copy of one whole already: the average is swapped out of
// the parameters after).
NamedTensors gather_whole(LoopState& s) {
  RunComponents& c = s.run.components;
  const bool primary = s.run.world->is_primary();
  return s.views.with_average([&] {
    for (const auto& strategy : c.strategies)
      if (std::optional<NamedTensors> held = strategy->gather_model()) {
        for (auto& [name, t] : *held)
          if (std::optional<Tensor> w = make_whole(c.strategies, name, t, /*done=*/strategy.get())) t = std::move(*w);
        return std::move(*held);
      }
    NamedTensors out;
    for (const auto& p : c.model->parameters()) {
      std::optional<Tensor> w = make_whole(c.strategies, p.parameter->name(), p.parameter->data());
      if (!primary) continue;
      out.emplace_back(p.parameter->name(), w ? std::move(*w) : p.parameter->data().clone());
    }
    return out;
  });
}

}  // namespace

void save_final_weights(LoopState& s) {
  Run& run = s.run;
  RunComponents& c = run.components;
  if (!run.trainer.get<bool>("save_final")) return;
  const bool primary = run.world->is_primary();
  const bool averaged = run.state.ema != nullptr;
  // A rank whose parameters are whole (and the adapters of LoRA under FSDP, which are replicated):
  // rank 0 writes its own.
  if (std::none_of(c.strategies.begin(), c.strategies.end(),
                   [](const auto& strategy) { return strategy->holds_saved_in_parts(); })) {
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
  NamedTensors full = gather_whole(s);
  if (!primary) return;
  std::deque<Parameter> values;
  std::vector<ModelParameter> saved;
  for (auto& [name, t] : full) saved.push_back({&values.emplace_back(name, std::move(t))});
  run.directory.save_weights(saved, run.num_steps, averaged);
}

}  // namespace loom::training
