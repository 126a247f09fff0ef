// The validation loss: forward passes only, over the same validation batches every time.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "loom/kinds/backend.hpp"
#include "loom/kinds/dataset.hpp"
#include "loom/kinds/model.hpp"
#include "loom/kinds/objective.hpp"

namespace loom::training {

struct Evaluation {
  double loss = -1;             // -1: no evaluation (max_batches 0, or no validation data)
  std::vector<double> metrics;  // the objective's metric_names(), over the same batches
};

// The objective's mean loss (a mean over its count(): counted targets, pairs) over validation
// batches 0 .. max_batches - 1, taken micro_size rows at a time, and its metrics. For a mixture
// of datasets (train/mixture.hpp): over max_batches validation batches of each dataset that has
// a validation split, and `per_dataset` (when given) receives each one's own loss.
Evaluation evaluate(Objective& objective, const ObjectiveModels& models, Backend& backend, const Dataset& dataset,
                    std::int64_t max_batches, std::int64_t micro_size,
                    std::vector<std::pair<std::string, double>>* per_dataset = nullptr,
                    const std::function<void(Ops&)>& attach = {});

}  // namespace loom::training
