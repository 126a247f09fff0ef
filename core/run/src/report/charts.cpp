// The report's charts, as SVG written here: see loom/run/report.hpp.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <sstream>

#include "loom/error.hpp"
#include "loom/run/report.hpp"
#include "report/escape.hpp"

namespace loom {

namespace {

// Distinct on white and for the common colour blindnesses (Okabe and Ito's palette).
const char* const colours[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"};
// A chart's second and further metrics (eval beside train) are told apart by the dash.
const char* const dashes[] = {"", "6 3", "2 2", "8 3 2 3"};

struct Series {
  std::string label;
  std::size_t run = 0;
  std::size_t style = 0;
  bool markers = false;  // sparse metrics (evaluations): a dot at each point
  std::vector<std::pair<double, double>> points;
};

struct ChartSpec {
  std::string id, title, y_label;
  std::vector<std::string> metrics;  // one series per run and metric
  double scale = 1;                  // MFU in percent
};

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string coordinate(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// About five round ticks spanning [lo, hi].
std::vector<double> ticks(double lo, double hi) {
  const double span = hi - lo;
  const double raw = span / 5;
  const double magnitude = std::pow(10, std::floor(std::log10(raw)));
  const double r = raw / magnitude;
  const double step = (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * magnitude;
  std::vector<double> out;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step)
    out.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  return out;
}

ReportChart render(const ChartSpec& spec, const std::vector<Series>& series, const std::vector<RunRecord>& runs,
                   const std::string& x_label) {
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& s : series)
    for (const auto& [x, y] : s.points) {
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  if (!(x1 > x0)) x0 -= 0.5, x1 += 0.5;
  if (!(y1 > y0)) {
    const double pad = y0 == 0 ? 1 : std::abs(y0) * 0.05;
    y0 -= pad, y1 += pad;
  }
  const double pad = (y1 - y0) * 0.05;
  y0 -= pad, y1 += pad;

  const double width = 640, left = 64, right = 16, top = 28, plot_h = 220;
  const double plot_w = width - left - right;
  const double legend_top = top + plot_h + 44;
  const double height = legend_top + 18 * static_cast<double>(series.size()) + 6;
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * plot_w; };
  auto py = [&](double y) { return top + plot_h - (y - y0) / (y1 - y0) * plot_h; };

  std::ostringstream os;
  os << "<svg class=\"chart\" id=\"chart-" << spec.id << "\" width=\"" << width << "\" height=\"" << coordinate(height)
     << "\" viewBox=\"0 0 " << width << " " << coordinate(height)
     << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  os << "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  os << "<text x=\"" << left << "\" y=\"18\" font-size=\"14\" font-weight=\"bold\">" << html_escape(spec.title)
     << "</text>\n";
  os << "<rect class=\"plot\" x=\"" << left << "\" y=\"" << top << "\" width=\"" << plot_w << "\" height=\"" << plot_h
     << "\" fill=\"none\" stroke=\"#888888\"/>\n";
  for (double t : ticks(y0, y1)) {
    os << "<line x1=\"" << left << "\" x2=\"" << left + plot_w << "\" y1=\"" << coordinate(py(t)) << "\" y2=\""
       << coordinate(py(t)) << "\" stroke=\"#e4e4e4\"/>";
    os << "<text class=\"ytick\" x=\"" << left - 6 << "\" y=\"" << coordinate(py(t) + 4) << "\" text-anchor=\"end\">"
       << number(t) << "</text>\n";
  }
  for (double t : ticks(x0, x1)) {
    os << "<line x1=\"" << coordinate(px(t)) << "\" x2=\"" << coordinate(px(t)) << "\" y1=\"" << top + plot_h
       << "\" y2=\"" << top + plot_h + 4 << "\" stroke=\"#888888\"/>";
    os << "<text class=\"xtick\" x=\"" << coordinate(px(t)) << "\" y=\"" << top + plot_h + 17
       << "\" text-anchor=\"middle\">" << number(t) << "</text>\n";
  }
  os << "<text class=\"xlabel\" x=\"" << left + plot_w / 2 << "\" y=\"" << top + plot_h + 34
     << "\" text-anchor=\"middle\">" << html_escape(x_label) << "</text>\n";
  os << "<text class=\"ylabel\" transform=\"translate(14 " << top + plot_h / 2
     << ") rotate(-90)\" text-anchor=\"middle\">" << html_escape(spec.y_label) << "</text>\n";
  for (std::size_t i = 0; i < series.size(); ++i) {
    const Series& s = series[i];
    const char* colour = colours[s.run % std::size(colours)];
    const char* dash = dashes[s.style % std::size(dashes)];
    os << "<g class=\"series\" data-run=\"" << html_escape(runs[s.run].name) << "\" data-points=\"" << s.points.size()
       << "\"><title>" << html_escape(s.label) << "</title>";
    os << "<polyline fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"1.8\"";
    if (*dash) os << " stroke-dasharray=\"" << dash << "\"";
    os << " points=\"";
    for (const auto& [x, y] : s.points) os << coordinate(px(x)) << "," << coordinate(py(y)) << " ";
    os << "\"/>";
    if (s.markers || s.points.size() == 1)
      for (const auto& [x, y] : s.points)
        os << "<circle cx=\"" << coordinate(px(x)) << "\" cy=\"" << coordinate(py(y)) << "\" r=\"3\" fill=\"" << colour
           << "\"/>";
    os << "</g>\n";
    const double ly = legend_top + 18 * static_cast<double>(i);
    os << "<g class=\"legend\"><line x1=\"" << left << "\" x2=\"" << left + 28 << "\" y1=\"" << ly - 4 << "\" y2=\""
       << ly - 4 << "\" stroke=\"" << colour << "\" stroke-width=\"2.5\"";
    if (*dash) os << " stroke-dasharray=\"" << dash << "\"";
    os << "/><text x=\"" << left + 36 << "\" y=\"" << ly << "\">" << html_escape(s.label) << "</text></g>\n";
  }
  os << "</svg>\n";
  return {spec.id, spec.title, os.str(), width, height};
}

std::string segment(const std::string& key, std::size_t index) {
  std::size_t start = 0;
  for (std::size_t i = 0; i < index; ++i) {
    start = key.find('/', start);
    if (start == std::string::npos) return "";
    ++start;
  }
  return key.substr(start, key.find('/', start) - start);
}

std::size_t segments(const std::string& key) {
  return static_cast<std::size_t>(std::count(key.begin(), key.end(), '/')) + 1;
}

}  // namespace

std::string standalone_svg(const ReportChart& chart) {
  // The namespace lives here only: the page must not name a URL, even one no browser fetches.
  std::string svg = chart.svg;
  svg.insert(4, " xmlns=\"http://www.w3.org/2000/svg\"");
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" + svg;
}

std::vector<ReportChart> report_charts(const std::vector<RunRecord>& runs, ReportAxis axis) {
  if (axis == ReportAxis::tokens)
    for (const auto& run : runs)
      if (run.tokens_per_step <= 0)
        throw UserError("--x tokens: " + (run.dir / "config.yaml").string() +
                        " does not give trainer.train_batch_size and model.seq_len, the tokens of a step; use --x "
                        "step");
  std::set<std::string> keys;
  for (const auto& run : runs)
    for (const auto& row : run.rows)
      for (const auto& [key, value] : row.values) keys.insert(key);

  std::vector<ChartSpec> specs = {
      {"loss", "Loss", "loss", {"train/loss", "eval/loss"}, 1},
  };
  // A mixture's datasets: eval/NAME/loss (and train/NAME/loss where a run logs it).
  ChartSpec sources{"loss_per_source", "Loss per data source", "loss", {}, 1};
  std::map<std::string, ChartSpec> tasks;
  for (const auto& key : keys) {
    if (segments(key) != 3 || (segment(key, 0) != "eval" && segment(key, 0) != "train")) continue;
    if (segment(key, 2) == "loss") {
      sources.metrics.push_back(key);
    } else if (segment(key, 0) == "eval") {
      // eval/<task>/<metric>: the benchmarks of trainer.eval_tasks.
      const std::string task = segment(key, 1);
      auto [it, fresh] = tasks.try_emplace(task);
      if (fresh) it->second = {"eval_" + task, "Evaluation: " + task, "score", {}, 1};
      it->second.metrics.push_back(key);
    }
  }
  specs.push_back(sources);
  specs.push_back({"perplexity", "Evaluation perplexity", "perplexity", {"eval/perplexity"}, 1});
  specs.push_back({"learning_rate", "Learning rate", "learning rate", {"train/lr"}, 1});
  specs.push_back({"grad_norm", "Gradient norm", "gradient norm", {"train/grad_norm"}, 1});
  specs.push_back({"tokens_per_second", "Throughput", "tokens/s", {"throughput/tokens_per_second"}, 1});
  specs.push_back({"mfu", "Model FLOPs utilisation", "MFU (%)", {"throughput/mfu"}, 100});
  for (auto& [task, spec] : tasks) specs.push_back(spec);

  const std::string x_label = axis == ReportAxis::step ? "step" : "tokens";
  std::vector<ReportChart> charts;
  for (const auto& spec : specs) {
    std::vector<Series> series;
    for (std::size_t m = 0; m < spec.metrics.size(); ++m) {
      const std::string& metric = spec.metrics[m];
      for (std::size_t r = 0; r < runs.size(); ++r) {
        Series s;
        s.run = r;
        s.style = m;
        s.markers = metric.rfind("eval/", 0) == 0;
        s.label = runs[r].name + (spec.metrics.size() > 1 ? " " + metric : "");
        for (const auto& row : runs[r].rows) {
          const auto it = row.values.find(metric);
          if (it == row.values.end() || !std::isfinite(it->second)) continue;
          const double x = axis == ReportAxis::step ? static_cast<double>(row.step)
                                                    : static_cast<double>(row.step * runs[r].tokens_per_step);
          s.points.emplace_back(x, it->second * spec.scale);
        }
        if (!s.points.empty()) series.push_back(std::move(s));
      }
    }
    if (series.empty()) continue;
    charts.push_back(render(spec, series, runs, x_label));
  }
  return charts;
}

}  // namespace loom
