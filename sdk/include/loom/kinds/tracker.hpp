// The `tracker` kind: where a run's metrics go (files, dashboards).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/component.hpp"

namespace loom {

class Tracker : public Component {
 public:
  static constexpr std::string_view kind = "tracker";
  ~Tracker() override;

  // Records named scalars for `step`. Called from the trainer's thread only.
  virtual void log_scalars(std::int64_t step, const std::vector<std::pair<std::string, double>>& scalars) = 0;
  // Makes everything logged so far durable. Called at the end of a run and before checkpoints.
  virtual void flush() {}
};

}  // namespace loom
