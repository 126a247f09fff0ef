// What the page's script and the static SVG charts share: which charts there are, their points
// and notes, and how the y axis leaves out outliers.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "loom/run/report.hpp"

namespace loom::report {

struct ChartSpec {
  std::string id, title, y_label;
  std::vector<std::string> metrics;  // one series per run and metric
  double scale = 1;                  // MFU in percent
  double reference = 0;              // > 0: a dotted line at this value (MFU's 100%)
};

// The charts the runs' metrics make, in the page's order; each has a metric some run logged.
std::vector<ChartSpec> chart_specs(const std::vector<RunRecord>& runs);

// A series' points in file order: step, value (NaN where logged as null: a gap) and the run's
// elapsed seconds at that step (NaN where the run logs none).
std::vector<std::array<double, 3>> series_points(const RunRecord& run, const std::string& metric);

// What a reader of the chart should be told: MFU above 100%, runs whose curves coincide.
std::vector<std::string> chart_notes(const ChartSpec& spec, const std::vector<RunRecord>& runs);

// UserError when a run does not give the axis: tokens without its tokens per step, time without
// throughput/elapsed_seconds.
void check_axis(const std::vector<RunRecord>& runs, ReportAxis axis);

// The y range to draw each series' `values` in (finite, in the axis's space: log10 of them on a
// log axis): their whole range, or, when clipping, the range without the values far outside the
// rest of their own series (more than 10 spreads beyond its quartiles) where leaving them out
// narrows it at least fivefold. A whole run apart from the others is never an outlier.
std::array<double, 2> y_range(const std::vector<std::vector<double>>& series, bool clip);

}  // namespace loom::report
