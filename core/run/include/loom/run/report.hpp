// `loom report RUN_DIR [RUN_DIR...] -o report.html`: a run's metrics as charts, in one self-contained
// HTML file (SVG written here, no script, no network), and the same charts as SVG for --png.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loom/run/checkpoints.hpp"

namespace loom {

// One line of metrics.jsonl: its step and its numeric values by name.
struct MetricsRow {
  std::int64_t step = 0;
  std::map<std::string, double> values;
};

// What a report shows of one run directory.
struct RunRecord {
  std::string name;                              // the directory's name: the legend's entry
  std::filesystem::path dir;                     // as given
  std::vector<MetricsRow> rows;                  // metrics.jsonl, in file order
  std::string config_yaml;                       // config.yaml's text (empty when absent)
  std::map<std::string, std::string> header;     // what the run's header line says: model, batch, steps...
  std::string trainer_header;                    // the trainer's start-up lines (header.json; empty when absent)
  std::int64_t tokens_per_step = 0;              // train_batch_size x seq_len; 0: unknown
  std::optional<CheckpointsReport> checkpoints;  // none when the run saved none
};

// Reads a run directory. UserError naming the file (and line) for a path that is not a run
// directory (no metrics.jsonl), an empty or malformed metrics line, or a line without a step.
RunRecord read_run(const std::filesystem::path& run_dir);

enum class ReportAxis { step, tokens };

// "step" or "tokens"; UserError for anything else.
ReportAxis parse_report_axis(const std::string& text);

struct ReportChart {
  std::string id;                // a file-name-safe name: loss, learning_rate, eval_hellaswag, ...
  std::string title;             // what it shows
  std::string svg;               // an <svg> element, every run overlaid, with its legend (no xmlns: inline HTML)
  double width = 0, height = 0;  // in pixels
};

// The chart as an SVG file's text (with its namespace).
std::string standalone_svg(const ReportChart& chart);

// The charts of the runs' metrics, on a shared x axis: loss (train and eval), loss per data source
// of a mixture, learning rate, gradient norm, tokens/s, MFU, and one chart per `eval/<task>/...`
// task. A chart whose metric no run has is left out. UserError for --x tokens on a run whose
// config does not say its tokens per step.
std::vector<ReportChart> report_charts(const std::vector<RunRecord>& runs, ReportAxis axis);

// The whole page: the charts, then per run its header, checkpoints and config. It references
// nothing outside itself, and its Content-Security-Policy forbids the browser to fetch anything.
std::string render_report_html(const std::vector<RunRecord>& runs, ReportAxis axis);

// Writes each chart as DIR/<id>.png. UserError when this build has no PNG renderer.
void write_report_pngs(const std::vector<ReportChart>& charts, const std::filesystem::path& dir);

// Whether write_report_pngs can render (the build found librsvg and cairo).
bool report_png_available();

}  // namespace loom
