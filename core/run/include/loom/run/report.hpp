// `loom report RUN_DIR [RUN_DIR...] -o report.html`: runs' metrics as interactive charts (log scale,
// smoothing, outlier clipping, step/tokens/time axis, hover readout), a sortable runs table, the
// config keys where the runs differ and each run's header, in one self-contained HTML file (its
// script and data inline, nothing fetched); and the same charts as static SVG for --png.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loom/run/checkpoints.hpp"

namespace loom {

// One line of metrics.jsonl: its step and its numeric values by name. A value logged as null (the
// tracker's NaN or infinity) is held as NaN: a gap in its curve.
struct MetricsRow {
  std::int64_t step = 0;
  std::map<std::string, double> values;
};

// How a run stands, read from what its directory holds (docs/evaluation.md, "Run status"):
// running while a `loom train` holds its .lock; else as the run's end.json says (the trainer's
// record of how it ended: finished, diverged, stopped by a signal, or an error, which reads as
// stopped); without one (older runs), diverged when its last logged train/loss or train/grad_norm
// is NaN or infinite, finished when it wrote its final weights or logged its planned last step,
// stopped otherwise.
enum class RunState { finished, running, diverged, stopped };

struct RunStatus {
  RunState state = RunState::stopped;
  std::int64_t last_step = 0;      // the last logged step; 0: none
  std::int64_t planned_steps = 0;  // trainer.num_train_steps; 0: unknown
  std::string text;                // "running, step 130 of 400", "diverged: train/loss NaN at step 8", ...
  // How the run ended, as the trainer recorded it in end.json (empty without one): "NaN loss at
  // step 8", "SIGTERM after step 12", the error; the runs table shows it beside the state.
  std::string detail;
};

// "finished", "running", "diverged", "stopped".
std::string run_state_name(RunState state);

// The runs table's figures; absent where the run did not log what they come from.
struct RunSummary {
  std::optional<double> final_eval_loss, best_eval_loss;
  std::int64_t best_eval_step = 0;
  std::optional<double> tokens;             // last step x tokens per step
  std::optional<double> wall_seconds;       // the last throughput/elapsed_seconds
  std::optional<double> tokens_per_second;  // the median of throughput/tokens_per_second
  std::optional<double> max_mfu;            // the largest throughput/mfu (a fraction)
  std::int64_t max_mfu_step = 0;
  std::string memory;  // header.json's memory estimate (what `loom train` printed at start-up)
};

// What a report shows of one run directory.
struct RunRecord {
  std::string name;                                  // the directory's name
  std::string label;                                 // the legend's entry: see label_runs
  std::filesystem::path dir;                         // as given
  std::vector<MetricsRow> rows;                      // metrics.jsonl, in file order
  std::vector<std::string> notes;                    // what was left out of metrics.jsonl, and why
  std::string config_yaml;                           // config.yaml's text (empty when absent)
  std::map<std::string, std::string> config_values;  // config.yaml flattened: "optimizer.learning_rate" -> "0.0006"
  std::map<std::string, std::string> header;         // what the run's header says: model, batch, steps, lora...
  std::string trainer_header;                        // the trainer's start-up lines (header.json; empty when absent)
  std::int64_t tokens_per_step = 0;                  // train_batch_size x seq_len; 0: unknown
  std::optional<CheckpointsReport> checkpoints;      // none when the run saved none
  RunStatus status;
  RunSummary summary;
};

// Reads a run directory. UserError naming the file (and line) for a path that is not a run
// directory (no metrics.jsonl, or one that is not a file), an empty or malformed metrics line, a
// line that is not UTF-8 text, or a line without a step. A last line without its newline that does
// not parse is a line being written: left out, with a note.
RunRecord read_run(const std::filesystem::path& run_dir);

// Sets each run's label to the shortest ending of its path that no other run's path ends with
// (`run-nf4/run` and `run-int8/run` rather than `run` twice); a directory given twice gets " (2)".
void label_runs(std::vector<RunRecord>& runs);

// The flattened config keys whose values differ between the runs (a key one run lacks included).
std::vector<std::string> config_differences(const std::vector<RunRecord>& runs);

enum class ReportAxis { step, tokens, time };

// "step", "tokens" or "time"; UserError for anything else.
ReportAxis parse_report_axis(const std::string& text);

struct ReportOptions {
  ReportAxis axis = ReportAxis::step;
  bool log_y = false;         // a logarithmic y axis
  bool clip_outliers = true;  // the y axis leaves out values far outside the rest (drawn at its edge)
  double smoothing = 0;       // the page's initial exponential smoothing, 0 to 0.99 (TensorBoard's)
  int reload_seconds = 0;     // > 0: the page reloads itself this often (`loom report --watch`)
};

struct ReportChart {
  std::string id;                  // a file-name-safe name: loss, learning_rate, eval_hellaswag_acc, ...
  std::string title;               // what it shows
  std::string svg;                 // an <svg> element, every run overlaid, with its legend (no xmlns: inline HTML)
  std::vector<std::string> notes;  // what the chart's reader should know: MFU above 100%, curves that coincide
  double width = 0, height = 0;    // in pixels
};

// The chart as an SVG file's text (with its namespace).
std::string standalone_svg(const ReportChart& chart);

// The charts of the runs' metrics, on a shared x axis: loss (train and eval), loss per data source
// of a mixture, perplexity, learning rate, gradient norm, tokens/s, MFU, one chart per
// `eval/<task>/<metric>`, and one per any other metric logged. A chart whose metric no run has is
// left out. UserError for an axis (tokens, time) that a run does not give.
std::vector<ReportChart> report_charts(const std::vector<RunRecord>& runs, const ReportOptions& options = {});

// The whole page. It references nothing outside itself, and its Content-Security-Policy forbids
// the browser to fetch anything.
std::string render_report_html(const std::vector<RunRecord>& runs, const ReportOptions& options = {});

// The same with every other option at its default (what callers before the options had).
std::vector<ReportChart> report_charts(const std::vector<RunRecord>& runs, ReportAxis axis);
std::string render_report_html(const std::vector<RunRecord>& runs, ReportAxis axis);

// Writes each chart as DIR/<id>.png. UserError when this build has no PNG renderer.
void write_report_pngs(const std::vector<ReportChart>& charts, const std::filesystem::path& dir);

// Whether write_report_pngs can render (the build found librsvg and cairo).
bool report_png_available();

// Numbers as the report prints them: 4 significant digits, with k, M, G (or B for counts), T
// rather than exponents: 43.47G, 2.077M, 0.0006, 1e-05 only below 0.001.
std::string report_number(double value, bool count = false);

}  // namespace loom
