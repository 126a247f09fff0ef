// The `attention` kind: an attention kernel, forward and backward.
//
// The interface grows with the tensor and autograd layer; today it fixes the kind's name and
// its place in the registry.
#pragma once

#include <string_view>

#include "loom/component.hpp"

namespace loom {

class AttentionKernel : public Component {
 public:
  static constexpr std::string_view kind = "attention";
  ~AttentionKernel() override;
};

}  // namespace loom
