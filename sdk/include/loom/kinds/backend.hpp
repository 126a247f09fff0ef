// The `backend` kind: implements the tensor operations.
//
// The interface grows with the tensor and autograd layer; today it fixes the kind's name and
// its place in the registry.
#pragma once

#include <string_view>

#include "loom/component.hpp"

namespace loom {

class Backend : public Component {
 public:
  static constexpr std::string_view kind = "backend";
  ~Backend() override;
};

}  // namespace loom
