// The validation loss: forward passes only, over the same validation batches every time.
#pragma once

#include <cstdint>

#include "loom/kinds/backend.hpp"
#include "loom/kinds/dataset.hpp"
#include "loom/kinds/model.hpp"

namespace loom::training {

// The mean loss over the counted targets of validation batches 0 .. max_batches - 1, taken
// micro_size rows at a time; -1 when max_batches is 0 or there is no validation data.
double evaluate(Model& model, Backend& backend, const Dataset& dataset, std::int64_t max_batches,
                std::int64_t micro_size);

}  // namespace loom::training
