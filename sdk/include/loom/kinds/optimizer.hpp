// The `optimizer` kind: updates parameters from gradients.
//
// The interface grows with the tensor and autograd layer; today it fixes the kind's name and
// its place in the registry.
#pragma once

#include <string_view>

#include "loom/component.hpp"

namespace loom {

class Optimizer : public Component {
 public:
  static constexpr std::string_view kind = "optimizer";
  ~Optimizer() override;
};

}  // namespace loom
