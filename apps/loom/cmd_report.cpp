// loom report RUN_DIR [RUN_DIR...] -o report.html [--x step|tokens|time] [--log] [--no-clip]
//             [--smoothing S] [--watch [SECONDS]] [--png DIR]
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "command_line.hpp"
#include "loom/error.hpp"
#include "loom/run/report.hpp"

namespace loom::app {

namespace {

// Written beside and renamed over: a browser reloading the page never reads half a file.
void write_atomically(const std::string& output, const std::string& text) {
  const std::string temporary = output + ".tmp-" + std::to_string(::getpid());
  std::ofstream out(temporary, std::ios::binary);
  out << text;
  out.close();
  std::error_code ec;
  if (!out) {
    std::filesystem::remove(temporary, ec);
    throw UserError("cannot write '" + output + "'");
  }
  std::filesystem::rename(temporary, output, ec);
  if (ec) {
    std::filesystem::remove(temporary, ec);
    throw UserError("cannot write '" + output + "': " + ec.message());
  }
}

}  // namespace

int run_report(const std::vector<std::string>& args) {
  std::vector<std::string> dirs;
  std::string output, x_axis = "step", png_dir;
  double smoothing = 0;
  int watch = 0;
  po::options_description options("options");
  options.add_options()("help,h", "show this help")("output,o", po::value(&output),
                                                    "the HTML file to write (one self-contained file)")(
      "x", po::value(&x_axis),
      "the charts' x axis at first (the page switches): step, tokens (steps x train_batch_size x seq_len) or time "
      "(throughput/elapsed_seconds)")("log", "a logarithmic y axis at first (the page switches)")(
      "no-clip", "draw outliers inside the y axis rather than leaving them out of its range")(
      "smoothing", po::value(&smoothing), "the page's exponential smoothing at first, 0 to 0.99 (TensorBoard's)")(
      "watch", po::value(&watch)->implicit_value(10),
      "rewrite the report every SECONDS (10) while a run is training, the page reloading itself as often; "
      "returns when no run is training")("png", po::value(&png_dir), "also write each chart as DIR/<chart>.png");
  po::options_description hidden;
  hidden.add_options()("dirs", po::value(&dirs), "run directories");
  po::positional_options_description pos;
  pos.add("dirs", -1);
  po::variables_map vm;
  if (!parse(args, options, pos, vm,
             "usage: loom report RUN_DIR [RUN_DIR...] -o report.html [--x step|tokens|time] [--log] [--no-clip]\n"
             "                   [--smoothing S] [--watch [SECONDS]] [--png DIR]\n\n"
             "Charts runs' metrics.jsonl (loss, train and eval and per data source, learning rate, gradient\n"
             "norm, tokens/s, MFU, each eval/<task>/<metric>, any other metric), several runs overlaid, with a\n"
             "runs table (status, steps, eval loss, tokens, time, throughput), the config keys where the runs\n"
             "differ and each run's header, checkpoints and config, in one HTML file that loads nothing: log\n"
             "scale, smoothing, outlier clipping, x axis and hover in the page (docs/evaluation.md).",
             &hidden))
    return 0;
  if (dirs.empty()) throw UserError("`loom report` needs a run directory: `loom report RUN_DIR -o report.html`");
  if (output.empty() && png_dir.empty())
    throw UserError("`loom report` needs somewhere to write: -o report.html (and/or --png DIR)");
  ReportOptions report;
  report.axis = parse_report_axis(x_axis);
  report.log_y = vm.count("log") > 0;
  report.clip_outliers = vm.count("no-clip") == 0;
  if (!(smoothing >= 0 && smoothing <= 0.99))
    throw UserError("--smoothing " + std::to_string(smoothing) + ": the smoothing is 0 (none) to 0.99");
  report.smoothing = smoothing;
  if (vm.count("watch") && watch < 1)
    throw UserError("--watch " + std::to_string(watch) + ": the seconds between rewrites are 1 or more");
  if (vm.count("watch") && output.empty()) throw UserError("--watch rewrites an HTML file: give -o report.html");
  report.reload_seconds = vm.count("watch") ? watch : 0;
  for (;;) {
    std::vector<RunRecord> runs;
    for (const auto& dir : dirs) runs.push_back(read_run(dir));
    label_runs(runs);
    bool running = false;
    for (const auto& run : runs) running = running || run.status.state == RunState::running;
    const bool last = report.reload_seconds == 0 || !running;
    if (!output.empty()) {
      // The last page written (every run done) stays still: it reloads no more.
      ReportOptions page = report;
      if (last) page.reload_seconds = 0;
      write_atomically(output, render_report_html(runs, page));
      std::cout << "report: " << output;
      for (const auto& run : runs)
        std::cout << (&run == &runs.front() ? " (" : "; ") << run.label << " " << run.status.text;
      std::cout << ")" << std::endl;
    }
    if (last) {
      if (!png_dir.empty()) {
        const auto charts = report_charts(runs, report);
        write_report_pngs(charts, png_dir);
        std::cout << "charts: " << charts.size() << " PNG files in " << png_dir << "\n";
      }
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::seconds(report.reload_seconds));
  }
}

}  // namespace loom::app
