// The `dpo` objective: Direct Preference Optimization (Rafailov et al. 2023, eq. 7).
//
// A batch holds preference pairs as consecutive rows: row 2i the prompt and the chosen response,
// row 2i + 1 the prompt and the rejected one, with targets -1 on the prompt (and padding) so that
// a row's counted targets are its response tokens (the `preference` dataset writes them so).
// With log p(y|x) the sum of the response tokens' log-probabilities under the policy and under
// the frozen reference model (the starting weights),
//   z_i    = beta * ((log p_c - log ref_c) - (log p_r - log ref_r))
//   loss_i = -(1 - eps) log sigmoid(z_i) - eps log sigmoid(-z_i)        (eps: label_smoothing)
// and the micro-batch's loss is their mean over its pairs. The gradient reaches the model through
// Model::token_losses: d loss / d nll_t = -beta dL/dz on a chosen response's tokens, +beta dL/dz on
// a rejected one's, computed here and handed to the trainer as the backward pass's seed.
#include <cmath>
#include <loom/error.hpp>
#include <loom/kinds/dataset.hpp>
#include <loom/kinds/objective.hpp>
#include <loom/model_support.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <string>
#include <vector>

namespace {

// log sigmoid(x), stable for either sign.
double log_sigmoid(double x) {
  return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x));
}
double sigmoid(double x) {
  return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x));
}

class DpoObjective final : public loom::Objective {
 public:
  explicit DpoObjective(const loom::Options& o)
      : beta_(o.get<double>("beta")), label_smoothing_(o.get<double>("label_smoothing")) {}

  std::int64_t rows_per_example() const override { return 2; }
  bool needs_reference_model() const override { return true; }
  bool loss_is_token_cross_entropy() const override { return false; }
  std::vector<std::string> required_batch_traits() const override {
    return {std::string(loom::batch_traits::preference_pairs)};
  }
  std::vector<std::string> metric_names() const override {
    return {"reward_accuracy", "reward_margin", "chosen_reward", "rejected_reward"};
  }

  std::int64_t count(std::span<const std::int32_t> targets, std::int64_t seq_len) const override {
    return seq_len > 0 ? static_cast<std::int64_t>(targets.size()) / seq_len / 2 : 0;
  }

  loom::ObjectiveLoss loss(loom::Ops& ops, const loom::ObjectiveModels& models,
                           const loom::ObjectiveBatch& batch) override {
    if (!models.reference) throw loom::InternalError("dpo: the trainer gave no reference model");
    const std::int64_t rows = batch.targets.size(0), seq = batch.targets.size(1);
    if (rows % 2 != 0)
      throw loom::UserError("objective (dpo): a micro-batch of " + std::to_string(rows) +
                            " rows; preference pairs need an even number (chosen, rejected): use a dataset that "
                            "writes pairs (data.type: preference) and an even trainer.microbatch_size");
    if (ops.z_loss_weight() != 0.0f)
      throw loom::UserError(
          "objective (dpo): trainer.z_loss_weight is " + std::to_string(ops.z_loss_weight()) +
          "; the z-loss would add to the log-probabilities DPO compares: set trainer.z_loss_weight: 0");
    const loom::Tensor policy = models.policy.token_losses(ops, batch.tokens, batch.targets, batch.segments);
    loom::Tensor reference;
    {
      loom::models::InferenceScope scope(ops);  // no tape, no dropout: the reference is a constant
      reference = models.reference->token_losses(ops, batch.tokens, batch.targets, batch.segments);
    }
    // The pairs' arithmetic is a few scalars per row, in double, on the host. On a device backend
    // its inputs come out through explicit copies (both models' per-token losses, the targets and
    // the tokens) and its seed goes back in through one: the edges of the loss, a constant number
    // per micro-batch.
    const auto policy_nll = policy.to_vector(), reference_nll = reference.to_vector();
    const std::vector<std::int32_t> host_targets = batch.targets.to_int_vector();
    const std::int32_t* targets = host_targets.data();

    // Each row's summed log-probability of its response, policy and reference, in double.
    std::vector<double> logp(static_cast<std::size_t>(rows), 0.0), ref_logp(logp);
    for (std::int64_t r = 0; r < rows; ++r) {
      std::int64_t counted = 0;
      for (std::int64_t t = 0; t < seq; ++t) {
        const auto i = static_cast<std::size_t>(r * seq + t);
        if (targets[i] < 0) continue;
        ++counted;
        logp[static_cast<std::size_t>(r)] -= policy_nll[i];
        ref_logp[static_cast<std::size_t>(r)] -= reference_nll[i];
      }
      if (counted == 0)
        throw loom::UserError("objective (dpo): row " + std::to_string(r) + " of a micro-batch (the " +
                              (r % 2 == 0 ? "chosen" : "rejected") +
                              " response of a pair) has no target: every response needs at least one token "
                              "after the prompt within the sequence length");
    }

    const std::int64_t pairs = rows / 2;
    check_pairs_share_prompts(targets, batch.tokens.to_int_vector().data(), pairs, seq);
    const double eps = label_smoothing_, inv_pairs = 1.0 / static_cast<double>(pairs);
    loom::ObjectiveLoss out;
    out.metrics.assign(4, 0.0);
    std::vector<float> grad(static_cast<std::size_t>(rows * seq), 0.0f);
    for (std::int64_t p = 0; p < pairs; ++p) {
      const auto c = static_cast<std::size_t>(2 * p), r = c + 1;
      const double chosen_reward = beta_ * (logp[c] - ref_logp[c]);
      const double rejected_reward = beta_ * (logp[r] - ref_logp[r]);
      const double z = chosen_reward - rejected_reward;
      out.value += (-(1.0 - eps) * log_sigmoid(z) - eps * log_sigmoid(-z)) * inv_pairs;
      out.metrics[0] += (z > 0 ? 1.0 : 0.0) * inv_pairs;
      out.metrics[1] += z * inv_pairs;
      out.metrics[2] += chosen_reward * inv_pairs;
      out.metrics[3] += rejected_reward * inv_pairs;
      // d loss / d z, then through z = beta (logp_c - logp_r) + const and logp = -sum nll.
      const double dz = (-(1.0 - eps) * sigmoid(-z) + eps * sigmoid(z)) * inv_pairs;
      for (std::int64_t t = 0; t < seq; ++t) {
        const auto ic = c * static_cast<std::size_t>(seq) + static_cast<std::size_t>(t);
        const auto ir = r * static_cast<std::size_t>(seq) + static_cast<std::size_t>(t);
        if (targets[ic] >= 0) grad[ic] = static_cast<float>(-beta_ * dz);
        if (targets[ir] >= 0) grad[ir] = static_cast<float>(beta_ * dz);
      }
    }
    out.output = policy;
    out.gradient = loom::Tensor::from(std::span<const float>(grad), policy.shape()).to(policy.device());
    return out;
  }

 private:
  // Rows 2i and 2i + 1 hold one prompt and two responses: their inputs agree up to the first
  // target that counts, and it is at the same position. Catches data that is not in pairs (a chat
  // or text dataset under `objective: dpo`) where it masks its prompts.
  static void check_pairs_share_prompts(const std::int32_t* targets, const std::int32_t* tokens, std::int64_t pairs,
                                        std::int64_t seq) {
    auto first_counted = [&](std::int64_t row) {
      std::int64_t t = 0;
      while (t < seq && targets[row * seq + t] < 0) ++t;
      return t;
    };
    for (std::int64_t p = 0; p < pairs; ++p) {
      const std::int64_t c = 2 * p, r = c + 1, start = first_counted(c);
      bool same = start == first_counted(r);
      for (std::int64_t t = 0; same && t < start; ++t) same = tokens[c * seq + t] == tokens[r * seq + t];
      if (!same)
        throw loom::UserError("objective (dpo): rows " + std::to_string(c) + " and " + std::to_string(r) +
                              " of a micro-batch do not share a prompt: dpo reads each two rows as a prompt with "
                              "its chosen and its rejected response; use a dataset of preference pairs "
                              "(data.type: preference)");
    }
  }

  double beta_, label_smoothing_;
};

loom::OptionSchema options() {
  loom::OptionSchema s;
  s.number("beta", 0.1,
           "Strength of the KL constraint to the reference model: the implicit reward is beta * (log p - log "
           "p_ref) of the response.")
      .min(0.0, false);
  s.number("label_smoothing", 0.0,
           "Probability that a pair's preference is flipped (conservative DPO): the loss is -(1 - eps) log "
           "sigmoid(z) - eps log sigmoid(-z).")
      .min(0.0)
      .max(0.5, false);
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Objective>(
      {.name = "dpo",
       .description = "Direct Preference Optimization over (chosen, rejected) row pairs, against a frozen reference",
       .version = "1.0.0",
       .options = options()},
      [](const loom::Options& o, const loom::CreateContext&) { return std::make_unique<DpoObjective>(o); });
}

}  // namespace

LOOM_PLUGIN(register_components)
