// The report's charts: which there are (shared with the page's script), and each as static SVG for
// --png. See loom/run/report.hpp.
#include "report/charts.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "loom/error.hpp"
#include "loom/run/report.hpp"
#include "report/escape.hpp"

namespace loom {

namespace report {

namespace {

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

std::string file_safe(const std::string& key) {
  std::string out;
  for (char c : key) out += std::isalnum(static_cast<unsigned char>(c)) || c == '-' ? c : '_';
  return out;
}

double quantile(const std::vector<double>& sorted, double q) {
  const double at = q * static_cast<double>(sorted.size() - 1);
  const auto i = static_cast<std::size_t>(std::floor(at));
  const std::size_t j = std::min(i + 1, sorted.size() - 1);
  return sorted[i] + (sorted[j] - sorted[i]) * (at - static_cast<double>(i));
}

}  // namespace

std::vector<ChartSpec> chart_specs(const std::vector<RunRecord>& runs) {
  std::set<std::string> keys;
  for (const auto& run : runs)
    for (const auto& row : run.rows)
      for (const auto& [key, value] : row.values) keys.insert(key);

  std::vector<ChartSpec> specs = {{"loss", "Loss", "loss", {"train/loss", "eval/loss"}}};
  // A mixture's datasets: eval/NAME/loss (and train/NAME/loss where a run logs it).
  ChartSpec sources{"loss_per_source", "Loss per data source", "loss", {}};
  std::vector<ChartSpec> tasks;
  std::set<std::string> charted = {"throughput/elapsed_seconds"};
  for (const auto& key : keys) {
    if (segments(key) != 3 || (segment(key, 0) != "eval" && segment(key, 0) != "train")) continue;
    if (segment(key, 2) == "loss") {
      sources.metrics.push_back(key);
    } else if (segment(key, 0) == "eval") {
      // eval/<task>/<metric>: the benchmarks of trainer.eval_tasks, a chart each.
      tasks.push_back({file_safe("eval_" + segment(key, 1) + "_" + segment(key, 2)),
                       "Evaluation: " + segment(key, 1) + " " + segment(key, 2),
                       segment(key, 2),
                       {key}});
    }
  }
  specs.push_back(sources);
  specs.push_back({"perplexity", "Evaluation perplexity", "perplexity", {"eval/perplexity"}});
  specs.push_back({"learning_rate", "Learning rate", "learning rate", {"train/lr"}});
  specs.push_back({"grad_norm", "Gradient norm", "gradient norm", {"train/grad_norm"}});
  specs.push_back({"tokens_per_second", "Throughput", "tokens/s", {"throughput/tokens_per_second"}});
  specs.push_back({"mfu", "Model FLOPs utilisation", "MFU (%)", {"throughput/mfu"}, 100, 100});
  specs.insert(specs.end(), tasks.begin(), tasks.end());
  for (const auto& s : specs) charted.insert(s.metrics.begin(), s.metrics.end());
  // Whatever else a run logs (the objective's metrics, a mixture of experts' router losses, the
  // device copies, ...): a chart each, named by the metric.
  for (const auto& key : keys)
    if (!charted.count(key)) specs.push_back({file_safe(key), key, key.substr(key.rfind('/') + 1), {key}});

  std::vector<ChartSpec> out;
  for (const auto& spec : specs) {
    bool logged = false;
    for (const auto& metric : spec.metrics) logged = logged || keys.count(metric);
    if (logged) out.push_back(spec);
  }
  return out;
}

std::vector<std::array<double, 3>> series_points(const RunRecord& run, const std::string& metric) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  // The run's elapsed time at each step that logs it; an evaluation's line of the same step gets
  // its step's time, one without gets the time of the last step before it that has one.
  std::map<std::int64_t, double> elapsed;
  for (const auto& row : run.rows) {
    const auto it = row.values.find("throughput/elapsed_seconds");
    if (it != row.values.end() && std::isfinite(it->second)) elapsed[row.step] = it->second;
  }
  std::vector<std::array<double, 3>> out;
  for (const auto& row : run.rows) {
    const auto it = row.values.find(metric);
    if (it == row.values.end()) continue;
    double time = nan;
    auto at = elapsed.upper_bound(row.step);
    if (at != elapsed.begin())
      time = std::prev(at)->second;
    else if (at != elapsed.end())
      time = at->second;
    out.push_back({static_cast<double>(row.step), it->second, time});
  }
  return out;
}

std::vector<std::string> chart_notes(const ChartSpec& spec, const std::vector<RunRecord>& runs) {
  std::vector<std::string> notes;
  if (spec.id == "mfu")
    for (const auto& run : runs)
      if (run.summary.max_mfu && *run.summary.max_mfu > 1) {
        char pct[32];
        std::snprintf(pct, sizeof pct, "%.1f%%", *run.summary.max_mfu * 100);
        const auto peak = run.header.find("peak FLOP/s");
        const auto flops = run.header.find("FLOPs per token");
        notes.push_back(
            run.label + ": MFU reaches " + pct + " (step " + std::to_string(run.summary.max_mfu_step) +
            "), above the 100% no hardware exceeds: the peak FLOP/s it is measured against" +
            (peak != run.header.end() ? " (" + peak->second + ")" : std::string()) +
            " is below what this run's matrix products reach, or the FLOPs counted per token" +
            (flops != run.header.end() ? " (" + flops->second + ")" : std::string()) +
            " exceed the work done (a LoRA run computes no gradients of its frozen weights); give trainer.peak_flops "
            "the hardware's peak for a true figure");
      }
  // Runs whose series of a metric are the same points: the one drawn last hides the others.
  for (const auto& metric : spec.metrics) {
    std::vector<bool> told(runs.size(), false);
    for (std::size_t i = 0; i < runs.size(); ++i) {
      if (told[i]) continue;
      const auto a = series_points(runs[i], metric);
      if (a.empty()) continue;
      std::vector<std::string> same = {runs[i].label};
      for (std::size_t j = i + 1; j < runs.size(); ++j) {
        const auto b = series_points(runs[j], metric);
        bool equal = a.size() == b.size();
        for (std::size_t k = 0; equal && k < a.size(); ++k)
          equal = a[k][0] == b[k][0] && (a[k][1] == b[k][1] || (std::isnan(a[k][1]) && std::isnan(b[k][1])));
        if (equal) same.push_back(runs[j].label), told[j] = true;
      }
      if (same.size() < 2) continue;
      std::string names;
      for (std::size_t k = 0; k < same.size(); ++k) names += (k ? k + 1 == same.size() ? " and " : ", " : "") + same[k];
      notes.push_back(names + " logged the same " + metric +
                      " at every step: their curves coincide, and the last drawn hides the others");
    }
  }
  return notes;
}

void check_axis(const std::vector<RunRecord>& runs, ReportAxis axis) {
  for (const auto& run : runs) {
    if (axis == ReportAxis::tokens && run.tokens_per_step <= 0)
      throw UserError("--x tokens: " + (run.dir / "config.yaml").string() +
                      " does not give trainer.train_batch_size and model.seq_len, the tokens of a step; use --x "
                      "step");
    if (axis == ReportAxis::time && !run.summary.wall_seconds)
      throw UserError("--x time: " + (run.dir / "metrics.jsonl").string() +
                      " logs no throughput/elapsed_seconds, the time of a step; use --x step");
  }
}

std::array<double, 2> y_range(const std::vector<std::vector<double>>& series, bool clip) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& values : series)
    for (double v : values) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!(hi >= lo)) return {0, 1};
  if (!clip) return {lo, hi};
  double in_lo = std::numeric_limits<double>::infinity(), in_hi = -in_lo;
  for (const auto& values : series) {
    double fence_lo = -std::numeric_limits<double>::infinity(), fence_hi = -fence_lo;
    if (values.size() >= 4) {
      std::vector<double> sorted = values;
      std::sort(sorted.begin(), sorted.end());
      const double q1 = quantile(sorted, 0.25), q3 = quantile(sorted, 0.75), median = quantile(sorted, 0.5);
      const double spread = std::max({q3 - q1, std::abs(median) * 0.05, 1e-300});
      fence_lo = q1 - 10 * spread, fence_hi = q3 + 10 * spread;
    }
    for (double v : values)
      if (v >= fence_lo && v <= fence_hi) in_lo = std::min(in_lo, v), in_hi = std::max(in_hi, v);
  }
  if (!(in_hi >= in_lo)) return {lo, hi};
  double kept = in_hi - in_lo;
  if (kept == 0) kept = std::abs(in_hi) * 0.05;
  if (kept == 0) kept = 1e-300;
  if (hi - lo < 5 * kept) return {lo, hi};
  return {in_lo, in_hi};
}

}  // namespace report

namespace {

using report::ChartSpec;

// Distinct on white and for the common colour blindnesses (Okabe and Ito's palette).
const char* const colours[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"};
// A chart's second and further metrics (eval beside train) are told apart by the dash.
const char* const dashes[] = {"", "6 3", "2 2", "8 3 2 3"};

struct Series {
  std::string label;
  std::size_t run = 0;
  std::size_t style = 0;
  bool markers = false;                           // sparse metrics (evaluations): a dot at each point
  std::vector<std::pair<double, double>> points;  // y NaN: a gap
};

std::string coordinate(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// About five round ticks spanning [lo, hi]; whole numbers only on an integer axis (steps, tokens).
std::vector<double> ticks(double lo, double hi, bool integer, double* step_out) {
  const double span = hi - lo;
  const double raw = span / 5;
  const double magnitude = std::pow(10, std::floor(std::log10(raw)));
  const double r = raw / magnitude;
  double step = (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * magnitude;
  if (integer) step = std::max(1.0, std::round(step));
  *step_out = step;
  std::vector<double> out;
  for (double t = std::ceil(lo / step - 1e-9) * step; t <= hi + step * 1e-9; t += step)
    out.push_back(std::abs(t) < step * 1e-9 ? 0 : t);
  return out;
}

// A tick's label: as few digits as its spacing needs, k/M/G for large values, never "1.5" on an
// integer axis.
std::string tick_label(double t, double step) {
  if (t == 0) return "0";
  if (std::abs(step) >= 1 || std::abs(t) >= 1e4) return report_number(t);
  if (std::abs(step) < 1e-3) return report_number(t);
  const int decimals = std::max(0, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, t);
  return buf;
}

ReportChart render(const ChartSpec& spec, const std::vector<Series>& series, const std::vector<RunRecord>& runs,
                   const std::string& x_label, bool integer_x, const ReportOptions& options,
                   std::vector<std::string> notes) {
  const bool log_y = options.log_y;
  auto fy = [&](double y) { return log_y ? (y > 0 ? std::log10(y) : std::numeric_limits<double>::quiet_NaN()) : y; };
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0;
  std::vector<std::vector<double>> ys;
  for (const auto& s : series) {
    ys.emplace_back();
    for (const auto& [x, y] : s.points) {
      x0 = std::min(x0, x), x1 = std::max(x1, x);
      if (std::isfinite(fy(y))) ys.back().push_back(fy(y));
    }
  }
  auto [y0, y1] = report::y_range(ys, options.clip_outliers);
  std::size_t clipped = 0;
  for (const auto& own : ys)
    for (double y : own) clipped += y < y0 || y > y1;
  if (clipped)
    notes.push_back(std::to_string(clipped) + (clipped == 1 ? " value lies" : " values lie") +
                    " far outside the rest: drawn as triangles at the axis's edge");
  if (!(x1 > x0)) x0 -= 0.5, x1 += 0.5;
  if (!(y1 > y0)) {
    const double pad = y0 == 0 ? 1 : std::abs(y0) * 0.05;
    y0 -= pad, y1 += pad;
  }
  const double pad = (y1 - y0) * 0.05;
  y0 -= pad, y1 += pad;

  double y_step = 1, x_step = 1;
  std::vector<double> y_ticks = ticks(y0, y1, false, &y_step);
  if (log_y) {
    // Powers of ten; 2 and 5 between them when the axis spans less than three.
    // At most about 8 labels: every k-th power of ten over a tall range.
    y_ticks.clear();
    const double every = std::max(1.0, std::ceil((y1 - y0) / 8));
    for (double e = std::ceil(std::floor(y0) / every) * every; e <= y1; e += every)
      for (double m : (y1 - y0 < 3 ? std::vector<double>{1, 2, 5} : std::vector<double>{1})) {
        const double t = e + std::log10(m);
        if (t >= y0 && t <= y1) y_ticks.push_back(t);
      }
  }
  std::vector<std::string> y_labels;
  for (double t : y_ticks) y_labels.push_back(log_y ? report_number(std::pow(10, t)) : tick_label(t, y_step));
  if (log_y && y_ticks.size() < 2) {
    // Less than a factor of 2 or 5 tall: round values between, placed on the log axis.
    y_ticks.clear(), y_labels.clear();
    for (double t : ticks(std::pow(10, y0), std::pow(10, y1), false, &y_step))
      if (t > 0) y_ticks.push_back(std::log10(t)), y_labels.push_back(tick_label(t, y_step));
  }
  std::size_t widest = 1;
  for (const auto& label : y_labels) widest = std::max(widest, label.size());

  // The y label's rotated line takes x 8..20; the tick labels end 6 px left of the plot and start
  // right of it, each character about 7 px wide.
  const double width = 640, right = 16, top = 28 + 16 * static_cast<double>(notes.size()), plot_h = 220;
  const double left = 28 + 7 * static_cast<double>(widest) + 6;
  const double plot_w = width - left - right;
  const double legend_top = top + plot_h + 44;
  const double height = legend_top + 18 * static_cast<double>(series.size()) + 6;
  auto px = [&](double x) { return left + (x - x0) / (x1 - x0) * plot_w; };
  auto py = [&](double y) { return top + plot_h - (std::clamp(y, y0, y1) - y0) / (y1 - y0) * plot_h; };

  std::ostringstream os;
  os << "<svg class=\"chart\" id=\"chart-" << spec.id << "\" width=\"" << width << "\" height=\"" << coordinate(height)
     << "\" viewBox=\"0 0 " << width << " " << coordinate(height)
     << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  os << "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  os << "<text x=\"" << left << "\" y=\"18\" font-size=\"14\" font-weight=\"bold\">" << html_escape(spec.title)
     << "</text>\n";
  for (std::size_t i = 0; i < notes.size(); ++i)
    os << "<text class=\"note\" x=\"8\" y=\"" << 34 + 16 * i << "\" font-size=\"11\" fill=\"#a33\">"
       << html_escape(notes[i].size() > 110 ? notes[i].substr(0, 107) + "..." : notes[i]) << "</text>\n";
  os << "<rect class=\"plot\" x=\"" << coordinate(left) << "\" y=\"" << top << "\" width=\"" << coordinate(plot_w)
     << "\" height=\"" << plot_h << "\" fill=\"none\" stroke=\"#888888\"/>\n";
  for (std::size_t i = 0; i < y_ticks.size(); ++i) {
    const double t = y_ticks[i];
    os << "<line x1=\"" << coordinate(left) << "\" x2=\"" << coordinate(left + plot_w) << "\" y1=\""
       << coordinate(py(t)) << "\" y2=\"" << coordinate(py(t)) << "\" stroke=\"#e4e4e4\"/>";
    os << "<text class=\"ytick\" x=\"" << coordinate(left - 6) << "\" y=\"" << coordinate(py(t) + 4)
       << "\" text-anchor=\"end\">" << y_labels[i] << "</text>\n";
  }
  if (spec.reference > 0 && fy(spec.reference) >= y0 && fy(spec.reference) <= y1)
    os << "<line class=\"reference\" x1=\"" << coordinate(left) << "\" x2=\"" << coordinate(left + plot_w) << "\" y1=\""
       << coordinate(py(fy(spec.reference))) << "\" y2=\"" << coordinate(py(fy(spec.reference)))
       << "\" stroke=\"#a33\" stroke-dasharray=\"3 3\"/>\n";
  for (double t : ticks(x0, x1, integer_x, &x_step)) {
    os << "<line x1=\"" << coordinate(px(t)) << "\" x2=\"" << coordinate(px(t)) << "\" y1=\"" << top + plot_h
       << "\" y2=\"" << top + plot_h + 4 << "\" stroke=\"#888888\"/>";
    os << "<text class=\"xtick\" x=\"" << coordinate(px(t)) << "\" y=\"" << top + plot_h + 17
       << "\" text-anchor=\"middle\">" << tick_label(t, x_step) << "</text>\n";
  }
  os << "<text class=\"xlabel\" x=\"" << coordinate(left + plot_w / 2) << "\" y=\"" << top + plot_h + 34
     << "\" text-anchor=\"middle\">" << html_escape(x_label) << "</text>\n";
  os << "<text class=\"ylabel\" transform=\"translate(18 " << top + plot_h / 2
     << ") rotate(-90)\" text-anchor=\"middle\">" << html_escape(spec.y_label + (log_y ? " (log)" : "")) << "</text>\n";
  for (std::size_t i = 0; i < series.size(); ++i) {
    const Series& s = series[i];
    const char* colour = colours[s.run % std::size(colours)];
    const char* dash = dashes[s.style % std::size(dashes)];
    std::size_t drawn = 0;
    for (const auto& p : s.points) drawn += std::isfinite(fy(p.second));
    os << "<g class=\"series\" data-run=\"" << html_escape(runs[s.run].label) << "\" data-points=\"" << drawn
       << "\"><title>" << html_escape(s.label) << "</title>";
    // One polyline per stretch of finite values: a NaN (or a value a log axis cannot show) is a gap.
    std::vector<std::vector<std::pair<double, double>>> pieces(1);
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(fy(y))) {
        if (!pieces.back().empty()) pieces.emplace_back();
        continue;
      }
      pieces.back().emplace_back(x, fy(y));
    }
    for (const auto& piece : pieces) {
      if (piece.empty()) continue;
      os << "<polyline fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"1.8\"";
      if (*dash) os << " stroke-dasharray=\"" << dash << "\"";
      os << " points=\"";
      for (const auto& [x, y] : piece) os << coordinate(px(x)) << "," << coordinate(py(y)) << " ";
      os << "\"/>";
      for (const auto& [x, y] : piece) {
        if (y > y1 || y < y0) {
          // An outlier left out of the axis: a triangle at the edge, pointing where it lies.
          const double ey = py(y), d = y > y1 ? -1 : 1;
          os << "<path class=\"clipped\" d=\"M" << coordinate(px(x) - 4) << "," << coordinate(ey + 5 * d) << "L"
             << coordinate(px(x) + 4) << "," << coordinate(ey + 5 * d) << "L" << coordinate(px(x)) << ","
             << coordinate(ey) << "Z\" fill=\"" << colour << "\"/>";
        } else if (s.markers || piece.size() == 1) {
          os << "<circle cx=\"" << coordinate(px(x)) << "\" cy=\"" << coordinate(py(y)) << "\" r=\"3\" fill=\""
             << colour << "\"/>";
        }
      }
    }
    os << "</g>\n";
    const double ly = legend_top + 18 * static_cast<double>(i);
    os << "<g class=\"legend\"><line x1=\"" << coordinate(left) << "\" x2=\"" << coordinate(left + 28) << "\" y1=\""
       << ly - 4 << "\" y2=\"" << ly - 4 << "\" stroke=\"" << colour << "\" stroke-width=\"2.5\"";
    if (*dash) os << " stroke-dasharray=\"" << dash << "\"";
    os << "/><text x=\"" << coordinate(left + 36) << "\" y=\"" << ly << "\">" << html_escape(s.label)
       << "</text></g>\n";
  }
  os << "</svg>\n";
  return {spec.id, spec.title, os.str(), notes, width, height};
}

}  // namespace

std::string standalone_svg(const ReportChart& chart) {
  // The namespace lives here only: the page must not name a URL, even one no browser fetches.
  std::string svg = chart.svg;
  svg.insert(4, " xmlns=\"http://www.w3.org/2000/svg\"");
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n" + svg;
}

std::vector<ReportChart> report_charts(const std::vector<RunRecord>& runs, const ReportOptions& options) {
  const ReportAxis axis = options.axis;
  report::check_axis(runs, axis);
  const std::string x_label = axis == ReportAxis::step ? "step" : axis == ReportAxis::tokens ? "tokens" : "seconds";
  std::vector<ReportChart> charts;
  for (const auto& spec : report::chart_specs(runs)) {
    std::vector<Series> series;
    for (std::size_t m = 0; m < spec.metrics.size(); ++m) {
      const std::string& metric = spec.metrics[m];
      for (std::size_t r = 0; r < runs.size(); ++r) {
        Series s;
        s.run = r;
        s.style = m;
        s.markers = metric.rfind("eval/", 0) == 0;
        s.label = runs[r].label + (spec.metrics.size() > 1 ? " " + metric : "");
        for (const auto& [step, value, time] : report::series_points(runs[r], metric)) {
          const double x = axis == ReportAxis::step     ? step
                           : axis == ReportAxis::tokens ? step * static_cast<double>(runs[r].tokens_per_step)
                                                        : time;
          if (std::isfinite(x)) s.points.emplace_back(x, value * spec.scale);
        }
        if (!s.points.empty()) series.push_back(std::move(s));
      }
    }
    if (series.empty()) continue;
    charts.push_back(
        render(spec, series, runs, x_label, axis != ReportAxis::time, options, report::chart_notes(spec, runs)));
  }
  return charts;
}

std::vector<ReportChart> report_charts(const std::vector<RunRecord>& runs, ReportAxis axis) {
  ReportOptions options;
  options.axis = axis;
  return report_charts(runs, options);
}

}  // namespace loom
