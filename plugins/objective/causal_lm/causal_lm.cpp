// The `causal_lm` objective: the mean next-token cross-entropy over the targets that count
// (Model::loss), what loom trained before objectives had a kind. `sft` is the same objective
// under its fine-tuning name: a chat dataset sets the targets of everything but the assistant's
// tokens to -1, and those count for nothing.
#include <loom/kinds/objective.hpp>
#include <loom/plugin.hpp>
#include <memory>

namespace {

class CausalLmObjective final : public loom::Objective {
 public:
  std::int64_t count(std::span<const std::int32_t> targets, std::int64_t /*seq_len*/) const override {
    std::int64_t counted = 0;
    for (const auto t : targets) counted += t >= 0;
    return counted;
  }

  loom::ObjectiveLoss loss(loom::Ops& ops, const loom::ObjectiveModels& models,
                           const loom::ObjectiveBatch& batch) override {
    loom::ObjectiveLoss out;
    out.output = models.policy.loss(ops, batch.tokens, batch.targets, batch.segments);
    out.value = static_cast<double>(out.output.item());
    return out;
  }
};

void register_components(loom::Registrar& registrar) {
  auto make = [](const loom::Options&, const loom::CreateContext&) { return std::make_unique<CausalLmObjective>(); };
  registrar.add<loom::Objective>({.name = "causal_lm",
                                  .description = "next-token cross-entropy over the targets that count (the default)",
                                  .version = "1.0.0"},
                                 make);
  registrar.add<loom::Objective>(
      {.name = "sft",
       .description = "supervised fine-tuning: causal_lm over the unmasked (response) targets a chat dataset gives",
       .version = "1.0.0"},
      make);
}

}  // namespace

LOOM_PLUGIN(register_components)
