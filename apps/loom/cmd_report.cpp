// loom report RUN_DIR [RUN_DIR...] -o report.html [--x step|tokens] [--png DIR]
#include <fstream>
#include <iostream>

#include "command_line.hpp"
#include "loom/error.hpp"
#include "loom/run/report.hpp"

namespace loom::app {

int run_report(const std::vector<std::string>& args) {
  std::vector<std::string> dirs;
  std::string output, x_axis = "step", png_dir;
  po::options_description options("options");
  options.add_options()("help,h", "show this help")("output,o", po::value(&output),
                                                    "the HTML file to write (one self-contained file)")(
      "x", po::value(&x_axis), "the shared x axis: step or tokens (steps x train_batch_size x seq_len)")(
      "png", po::value(&png_dir), "also write each chart as DIR/<chart>.png");
  po::options_description hidden;
  hidden.add_options()("dirs", po::value(&dirs), "run directories");
  po::positional_options_description pos;
  pos.add("dirs", -1);
  po::variables_map vm;
  if (!parse(args, options, pos, vm,
             "usage: loom report RUN_DIR [RUN_DIR...] -o report.html [--x step|tokens] [--png DIR]\n\n"
             "Charts runs' metrics.jsonl (loss, train and eval and per data source, learning rate, gradient\n"
             "norm, tokens/s, MFU, eval/<task>/... scores), several runs overlaid, with each run's header,\n"
             "checkpoints and config, in one HTML file that loads nothing (docs/evaluation.md).",
             &hidden))
    return 0;
  if (dirs.empty()) throw UserError("`loom report` needs a run directory: `loom report RUN_DIR -o report.html`");
  if (output.empty() && png_dir.empty())
    throw UserError("`loom report` needs somewhere to write: -o report.html (and/or --png DIR)");
  const ReportAxis axis = parse_report_axis(x_axis);
  std::vector<RunRecord> runs;
  for (const auto& dir : dirs) runs.push_back(read_run(dir));
  if (!output.empty()) {
    const std::string html = render_report_html(runs, axis);
    std::ofstream out(output, std::ios::binary);
    out << html;
    out.close();
    if (!out) throw UserError("cannot write '" + output + "'");
    std::cout << "report: " << output << "\n";
  }
  if (!png_dir.empty()) {
    const auto charts = report_charts(runs, axis);
    write_report_pngs(charts, png_dir);
    std::cout << "charts: " << charts.size() << " PNG files in " << png_dir << "\n";
  }
  return 0;
}

}  // namespace loom::app
