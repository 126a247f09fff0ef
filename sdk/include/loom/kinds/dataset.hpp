// The `dataset` kind: batches of token sequences, indexed by step.
//
// The interface grows with the tensor and autograd layer; today it fixes the kind's name and
// its place in the registry.
#pragma once

#include <string_view>

#include "loom/component.hpp"

namespace loom {

class Dataset : public Component {
 public:
  static constexpr std::string_view kind = "dataset";
  ~Dataset() override;
};

}  // namespace loom
