// The `objective` kind: what training minimises, given the model and one micro-batch.
//
// The trainer is one trainer whatever it optimises: for each micro-batch it asks the objective
// for the loss, seeds the backward pass with what the objective returns, and weighs the
// micro-batches by count() so that the accumulated gradient is the gradient of the whole batch's
// loss (across micro-batches and data-parallel ranks alike). `causal_lm` (the default) is the
// next-token cross-entropy of Model::loss; `dpo` compares the policy's and a frozen reference
// model's log-probabilities of preferred and rejected responses (Rafailov et al. 2023).
//
// Calls come from the thread running the step, after prepare().
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/autograd.hpp"
#include "loom/component.hpp"
#include "loom/kinds/model.hpp"

namespace loom {

// One micro-batch: rows of a Batch (kinds/dataset.hpp) as tensors in the backend's memory (the
// host's for cpu and reference; a device backend's otherwise: read them through explicit copies,
// to_int_vector, never data<T>()).
struct ObjectiveBatch {
  Tensor tokens, targets;  // i32 [rows, seq]; targets -1: no loss there
  Tensor segments;         // i32 [rows, seq], or undefined
};

// The models an objective computes with.
struct ObjectiveModels {
  Model& policy;               // the model being trained
  Model* reference = nullptr;  // the frozen starting weights, when needs_reference_model()
};

struct ObjectiveLoss {
  // The micro-batch's loss: a mean over its count() units.
  double value = 0;
  // Recorded on the tape of the Ops the loss was computed with: where the backward pass starts.
  Tensor output;
  // d value / d output, f32 of output's shape in output's memory; undefined when `output` is the
  // scalar loss itself (seeded with 1). The trainer scales it by the micro-batch's weight.
  Tensor gradient;
  // Values of metric_names(), in that order: means over the micro-batch's count() units.
  std::vector<double> metrics;
};

class Objective : public Component {
 public:
  static constexpr std::string_view kind = "objective";
  ~Objective() override;

  // Rows of a batch that belong together (a preference pair: 2). Micro-batches and data-parallel
  // ranks take whole groups: the trainer refuses a micro-batch size that is not a multiple.
  virtual std::int64_t rows_per_example() const { return 1; }
  // Whether loss() needs ObjectiveModels::reference: a second instance of the model, built from
  // the same config and holding the run's starting weights (trainer.init_from, or the
  // initialisation of trainer.seed, also when the run resumes), never trained.
  virtual bool needs_reference_model() const { return false; }
  // The names of the scalars loss() reports ("reward_accuracy"); the trainer logs them as
  // train/<name> and, over the validation batches, eval/<name>. Fixed for the objective's life.
  virtual std::vector<std::string> metric_names() const { return {}; }
  // Whether the loss is a mean cross-entropy per token, so that exp(loss) is a perplexity (the
  // trainer reports eval/perplexity only then).
  virtual bool loss_is_token_cross_entropy() const { return true; }
  // The batch traits (kinds/dataset.hpp: batch_traits) the loss needs its data to have ("dpo":
  // preference_pairs). The trainer refuses a dataset whose Dataset::batch_traits() lacks one,
  // naming the objective, the dataset and the trait, before anything trains. None by default.
  virtual std::vector<std::string> required_batch_traits() const { return {}; }

  // What the loss of rows with these targets (i32, rows * seq_len of them) is a mean over:
  // counted targets for a token-level loss, pairs for DPO. The trainer weighs each micro-batch
  // by its share of the batch's count. 0: nothing to learn from these rows.
  virtual std::int64_t count(std::span<const std::int32_t> targets, std::int64_t seq_len) const = 0;

  // The loss of one micro-batch (count() > 0), computed with `ops` (recording when it records).
  // Throws UserError for a batch it cannot use (rows not in pairs, a response without a target).
  virtual ObjectiveLoss loss(Ops& ops, const ObjectiveModels& models, const ObjectiveBatch& batch) = 0;
};

}  // namespace loom
