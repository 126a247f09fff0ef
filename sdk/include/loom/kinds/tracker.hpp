// The `tracker` kind: where a run's metrics go (files, dashboards).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/component.hpp"
#include "loom/value.hpp"

namespace loom {

struct RunInfo {
  std::string run_dir;  // exists when start() is called
  std::string run_id;
  Value config;                 // the resolved config
  std::int64_t start_step = 0;  // > 0 when a run resumes
};

class Tracker : public Component {
 public:
  static constexpr std::string_view kind = "tracker";
  ~Tracker() override;

  // Called once before anything is logged. A resumed run appends to what the previous part of
  // the run wrote (and may drop records past `start_step`).
  virtual void start(const RunInfo& run) = 0;
  // Records named scalars for `step` ("train/loss", "eval/loss", "throughput/mfu", ...).
  virtual void log_scalars(std::int64_t step, const std::vector<std::pair<std::string, double>>& scalars) = 0;
  // Records a text sample ("sample").
  virtual void log_text(std::int64_t /*step*/, std::string_view /*tag*/, std::string_view /*text*/) {}
  // Makes everything logged so far durable. Called at the end of a run and before checkpoints.
  virtual void flush() {}
};

}  // namespace loom
