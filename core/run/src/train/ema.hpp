// An exponential moving average of the model's weights (trainer.ema_decay): after every step,
// ema <- decay * ema + (1 - decay) * p. Evaluation and the final save use it in place of the
// weights; it is training state, which a checkpoint saves and resume restores ("ema/<parameter>").
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "loom/kinds/backend.hpp"
#include "loom/kinds/model.hpp"

namespace loom::training {

class ParameterEma {
 public:
  // Starts the average at the parameters' current values. decay in (0, 1).
  ParameterEma(double decay, const std::vector<ModelParameter>& parameters, Backend& backend);

  // One step of the average, with the backend's kernels (two scale passes per parameter).
  void update();
  // Exchanges the averaged values with the parameters' own; calling it again exchanges them back.
  void swap();

  // The averages, as named tensors "ema/<parameter>" (the live tensors: copy before the next
  // update), and their restoration from such a list (a name, shape or count that does not match:
  // UserError, nothing changed).
  std::vector<std::pair<std::string, Tensor>> state() const;
  void load_state(const std::vector<std::pair<std::string, Tensor>>& state);

 private:
  float decay_;
  std::vector<ModelParameter> parameters_;
  std::vector<Tensor> averages_;
  Backend& backend_;
};

}  // namespace loom::training
