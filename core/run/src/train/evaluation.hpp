// The validation loss: forward passes only, over the same validation batches every time.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "loom/kinds/backend.hpp"
#include "loom/kinds/dataset.hpp"
#include "loom/kinds/model.hpp"

namespace loom::training {

// The mean loss over the counted targets of validation batches 0 .. max_batches - 1, taken
// micro_size rows at a time; -1 when max_batches is 0 or there is no validation data. For a
// mixture of datasets (train/mixture.hpp): over max_batches validation batches of each dataset
// that has a validation split, and `per_dataset` (when given) receives each one's own loss.
double evaluate(Model& model, Backend& backend, const Dataset& dataset, std::int64_t max_batches,
                std::int64_t micro_size, std::vector<std::pair<std::string, double>>* per_dataset = nullptr);

}  // namespace loom::training
