#include <cmath>
#include <functional>
#include <iomanip>
#include <sstream>

#include "train/hooks/run_hooks.hpp"

namespace loom::training {

ValidationHook::ValidationHook(LoopState& s)
    : Hook(s.run.trainer.get<std::int64_t>("steps_per_eval")),
      s_(s),
      max_batches_(s.run.trainer.get<std::int64_t>("max_eval_batches")) {}

Evaluation ValidationHook::evaluate() {
  parts_.clear();
  RunComponents& c = s_.run.components;
  const World& world = *s_.run.world;
  // Under FSDP (its units are gathered together) and tensor parallelism (every member computes
  // its part) every rank runs the evaluation; rank 0 reports. Otherwise rank 0 evaluates while
  // the others go on to the next step's reduction.
  if (!world.is_primary() && !s_.together) return Evaluation{};
  const ObjectiveModels models{*c.model, c.reference.get()};
  Evaluation e = s_.views.with_average([&] {
    return s_.views.with_adapters([&] {
      return training::evaluate(*c.objective, models, *c.backend, *c.dataset, max_batches_, s_.run.micro_size, &parts_,
                                s_.together ? std::function<void(Ops&)>([&](Ops& ops) {
                                  for (const auto& strategy : c.strategies) strategy->attach(ops);
                                })
                                            : std::function<void(Ops&)>());
    });
  });
  for (const auto& strategy : c.strategies) strategy->release();
  return world.is_primary() ? e : Evaluation{};
}

std::pair<std::string, std::string> ValidationHook::log(std::int64_t step, const Evaluation& e) const {
  // The tracker's scalars and the printed details: the perplexity of a token-level loss, the
  // objective's metrics.
  std::vector<std::pair<std::string, double>> scalars{{"eval/loss", e.loss}};
  std::ostringstream line;
  line << std::fixed;
  if (s_.run.components.objective->loss_is_token_cross_entropy()) {
    scalars.emplace_back("eval/perplexity", std::exp(e.loss));
    line << "perplexity " << std::setprecision(2) << std::exp(e.loss);
  }
  for (auto& [name, value] : s_.named("eval/", e.metrics)) {
    scalars.emplace_back(name, value);
    line << (line.tellp() > 0 ? ", " : "") << name.substr(5) << " " << std::setprecision(4) << value;
  }
  std::ostringstream parts;
  parts << std::fixed << std::setprecision(4);
  for (const auto& [name, part] : parts_) {
    scalars.emplace_back("eval/" + name + "/loss", part);
    parts << (parts.tellp() > 0 ? ", " : "") << name << " " << part;
  }
  s_.log(step, scalars);
  return std::pair{line.str(), parts.str()};
}

void ValidationHook::after_step(const StepOutcome& step) {
  const Evaluation e = evaluate();
  if (e.loss < 0) return;
  const auto [details, parts] = log(step.step, e);
  s_.progress.eval(step.step, e.loss, details);
  if (!parts.empty()) s_.progress.say("  per dataset: " + parts);
}

void ValidationHook::final() {
  const Evaluation e = evaluate();
  TrainSummary& summary = s_.summary;
  summary.final_eval_loss = e.loss;
  if (summary.final_eval_loss < 0) return;
  const auto [details, parts] = log(s_.run.num_steps, e);
  s_.progress.final_eval(summary.final_eval_loss, max_batches_, details);
  if (!parts.empty()) s_.progress.say("  per dataset: " + parts);
  for (auto& [name, value] : s_.named("", e.metrics)) summary.final_eval_metrics.emplace_back(name, value);
}

}  // namespace loom::training
