// The report's page: see loom/run/report.hpp. The tables are HTML written here; the charts are
// drawn in the browser by the page's own script (report/page_script.hpp) from the JSON data the
// page carries, so that log scale, smoothing, outlier clipping, the x axis and hover need nothing
// but the file.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loom/run/report.hpp"
#include "report/charts.hpp"
#include "report/escape.hpp"
#include "report/page_script.hpp"

namespace loom {

namespace {

// The page loads nothing: a browser that honours this refuses any fetch (images, frames, fonts,
// connections of its script), even one a later edit would add, and reports it. Its one script and
// its styles are inline.
const char* const content_security_policy =
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:";

const char* const colours[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"};

const char* const style = R"(body{font-family:sans-serif;margin:24px;color:#222;max-width:1340px}
h1{font-size:22px;margin-bottom:4px}h2{font-size:18px;margin-top:28px}h3{font-size:14px;margin:4px 0}
.charts{display:flex;flex-wrap:wrap;gap:12px}.chart{border:1px solid #ddd;padding:6px 8px;position:relative;width:620px}
.chart .plot{height:268px}.chart svg{display:block}
.note{color:#a33;font-size:12px;margin:2px 0}.legend{font-size:12px}.legend .entry{margin-right:12px;cursor:pointer;white-space:nowrap}
.legend .entry svg{display:inline;vertical-align:middle;margin-right:4px}.legend .entry.off{opacity:.35;text-decoration:line-through}
.tooltip{position:absolute;top:40px;background:rgba(255,255,255,.95);border:1px solid #999;padding:4px 6px;font-size:12px;
pointer-events:none;max-width:340px;box-shadow:1px 1px 3px rgba(0,0,0,.2)}.tooltip .head{font-weight:bold}
.swatch{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
#controls{display:flex;gap:18px;align-items:center;font-size:13px;margin:8px 0 12px;flex-wrap:wrap}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
table.sortable th{cursor:pointer;background:#f4f4f4}table.sortable th[aria-sort=ascending]::after{content:" \25B2"}
table.sortable th[aria-sort=descending]::after{content:" \25BC"}td.num{text-align:right}
.state{font-weight:bold}.detail{font-size:12px}.state-finished{color:#2a7a2a}.state-running{color:#0b5cad}.state-diverged{color:#b00}.state-stopped{color:#a60}
pre{background:#f6f6f6;padding:8px;font-size:12px;overflow:auto;max-height:420px}.live{color:#0b5cad}
.runs li{margin:2px 0})";

std::string duration(double seconds) {
  char buf[48];
  const long s = std::lround(seconds);
  if (seconds < 60)
    std::snprintf(buf, sizeof buf, "%.1f s", seconds);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%ldm %02lds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldh %02ldm %02lds", s / 3600, s / 60 % 60, s % 60);
  return buf;
}

std::string sort_number(const std::optional<double>& v) {
  if (!v) return "";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", *v);
  return buf;
}

// A table cell: what it shows, and what it sorts by (empty: unknown, sorted last).
std::string cell(const std::string& text, const std::string& sort, bool number) {
  return std::string("<td") + (number ? " class=\"num\"" : "") + " data-sort=\"" + html_escape(sort) + "\">" + text +
         "</td>";
}

int state_order(RunState s) {
  switch (s) {
    case RunState::running:
      return 0;
    case RunState::finished:
      return 1;
    case RunState::stopped:
      return 2;
    case RunState::diverged:
      return 3;
  }
  return 4;
}

void runs_table(std::ostream& os, const std::vector<RunRecord>& runs) {
  os << "<table id=\"runs-table\" class=\"sortable\">\n<thead><tr><th data-type=\"text\">run</th>"
        "<th data-type=\"number\">status</th><th data-type=\"number\">steps</th>"
        "<th data-type=\"number\">final eval loss</th><th data-type=\"number\">best eval loss</th>"
        "<th data-type=\"number\">tokens</th><th data-type=\"number\">wall time</th>"
        "<th data-type=\"number\">tokens/s</th><th data-type=\"text\">memory (estimate)</th></tr></thead>\n<tbody>\n";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const RunRecord& run = runs[i];
    const RunSummary& m = run.summary;
    os << "<tr data-run=\"" << html_escape(run.label) << "\">";
    os << cell("<span class=\"swatch\" style=\"background:" + std::string(colours[i % std::size(colours)]) +
                   "\"></span><a href=\"#run-" + std::to_string(i) + "\">" + html_escape(run.label) + "</a>",
               run.label, false);
    os << cell(
        "<span class=\"state state-" + run_state_name(run.status.state) + "\">" +
            html_escape(run_state_name(run.status.state)) + "</span>" +
            (run.status.detail.empty() ? std::string()
                                       : "<span class=\"detail\">: " + html_escape(run.status.detail) + "</span>"),
        std::to_string(state_order(run.status.state)), false);
    os << cell(std::to_string(run.status.last_step) +
                   (run.status.planned_steps > 0 ? " / " + std::to_string(run.status.planned_steps) : ""),
               std::to_string(run.status.last_step), true);
    os << cell(m.final_eval_loss ? report_number(*m.final_eval_loss) : "", sort_number(m.final_eval_loss), true);
    os << cell(
        m.best_eval_loss ? report_number(*m.best_eval_loss) + " (step " + std::to_string(m.best_eval_step) + ")" : "",
        sort_number(m.best_eval_loss), true);
    os << cell(m.tokens ? report_number(*m.tokens, true) : "", sort_number(m.tokens), true);
    os << cell(m.wall_seconds ? duration(*m.wall_seconds) : "", sort_number(m.wall_seconds), true);
    os << cell(m.tokens_per_second ? report_number(*m.tokens_per_second) : "", sort_number(m.tokens_per_second), true);
    os << cell(html_escape(m.memory), m.memory, false);
    os << "</tr>\n";
  }
  os << "</tbody>\n</table>\n";
  for (const auto& run : runs)
    os << "<p class=\"run-status\" data-run=\"" << html_escape(run.label) << "\"><b>" << html_escape(run.label)
       << "</b>: " << html_escape(run.status.text) << "</p>\n";
}

void config_diff(std::ostream& os, const std::vector<RunRecord>& runs) {
  os << "<h2>Config differences</h2>\n";
  if (runs.size() < 2) {
    os << "<p id=\"config-diff\">One run: nothing to compare (its whole config is below).</p>\n";
    return;
  }
  const auto keys = config_differences(runs);
  if (keys.empty()) {
    os << "<p id=\"config-diff\">The runs' configs are the same, but for where they were written "
          "(trainer.run_dir, trainer.run_id).</p>\n";
    return;
  }
  os << "<table id=\"config-diff\">\n<tr><th>key</th>";
  for (const auto& run : runs) os << "<th>" << html_escape(run.label) << "</th>";
  os << "</tr>\n";
  for (const auto& key : keys) {
    os << "<tr><th>" << html_escape(key) << "</th>";
    for (const auto& run : runs) {
      const auto it = run.config_values.find(key);
      os << "<td>" << (it == run.config_values.end() ? "<i>not set</i>" : html_escape(it->second)) << "</td>";
    }
    os << "</tr>\n";
  }
  os << "</table>\n";
}

std::string page_data(const std::vector<RunRecord>& runs, const ReportOptions& options) {
  using nlohmann::json;
  json runs_json = json::array();
  for (std::size_t i = 0; i < runs.size(); ++i)
    runs_json.push_back({{"label", runs[i].label},
                         {"colour", colours[i % std::size(colours)]},
                         {"tokens_per_step", runs[i].tokens_per_step},
                         {"has_time", runs[i].summary.wall_seconds.has_value()},
                         {"status", runs[i].status.text}});
  json charts = json::array();
  for (const auto& spec : report::chart_specs(runs)) {
    json series = json::array();
    for (std::size_t m = 0; m < spec.metrics.size(); ++m)
      for (std::size_t r = 0; r < runs.size(); ++r) {
        json points = json::array();
        for (const auto& [step, value, time] : report::series_points(runs[r], spec.metrics[m]))
          points.push_back({step, std::isfinite(value) ? json(value * spec.scale) : json(nullptr),
                            std::isfinite(time) ? json(time) : json(nullptr)});
        if (points.empty()) continue;
        series.push_back({{"run", r},
                          {"metric", spec.metrics[m]},
                          {"style", m},
                          {"eval", spec.metrics[m].rfind("eval/", 0) == 0},
                          {"points", points}});
      }
    charts.push_back({{"id", spec.id},
                      {"title", spec.title},
                      {"y", spec.y_label},
                      {"metrics", spec.metrics.size()},
                      {"reference", spec.reference},
                      {"smooth", spec.id != "learning_rate"},
                      {"notes", report::chart_notes(spec, runs)},
                      {"series", series}});
  }
  const char* const axes[] = {"step", "tokens", "time"};
  const json data{{"options",
                   {{"x", axes[static_cast<int>(options.axis)]},
                    {"log", options.log_y},
                    {"clip", options.clip_outliers},
                    {"smoothing", options.smoothing},
                    {"reload", options.reload_seconds}}},
                  {"runs", runs_json},
                  {"charts", charts}};
  // Inside <script>: no "<" at all, so no "</script>" or "<!--" can end or change the block.
  std::string text = data.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (char c : text) out += c == '<' ? std::string("\\u003c") : std::string(1, c);
  return out;
}

}  // namespace

std::string render_report_html(const std::vector<RunRecord>& runs, const ReportOptions& options) {
  report::check_axis(runs, options.axis);
  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
     << "<meta http-equiv=\"Content-Security-Policy\" content=\"" << content_security_policy << "\">\n"
     << "<title>loom report: ";
  for (std::size_t i = 0; i < runs.size(); ++i) os << (i ? ", " : "") << html_escape(runs[i].label);
  os << "</title>\n<style>" << style << "</style>\n</head>\n<body>\n<h1>loom report</h1>\n";
  bool running = false;
  for (const auto& run : runs) running = running || run.status.state == RunState::running;
  if (options.reload_seconds > 0 && running)
    os << "<p class=\"live\">Live: <code>loom report --watch</code> rewrites this file every " << options.reload_seconds
       << " s while a run is training, and the page reloads itself as often.</p>\n";
  os << "<h2>Runs</h2>\n";
  runs_table(os, runs);
  config_diff(os, runs);
  os << "<h2>Charts</h2>\n<div id=\"controls\">"
        "<label>x axis <select id=\"x-axis\"><option value=\"step\">step</option><option value=\"tokens\">tokens"
        "</option><option value=\"time\">time</option></select></label>"
        "<label><input type=\"checkbox\" id=\"log-y\"> log scale</label>"
        "<label><input type=\"checkbox\" id=\"clip\"> clip outliers</label>"
        "<label>smoothing <input type=\"range\" id=\"smoothing\" min=\"0\" max=\"0.99\" step=\"0.01\"> "
        "<output id=\"smoothing-value\"></output></label>"
        "<span>hover a chart for every run's value; click a legend entry to hide a run</span></div>\n"
        "<noscript><p>The charts are drawn by the page's own script: allow JavaScript for this file, or use "
        "<code>loom report --png DIR</code>.</p></noscript>\n<div id=\"charts\" class=\"charts\"></div>\n";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const RunRecord& run = runs[i];
    os << "<section class=\"run\" id=\"run-" << i << "\">\n<h2>Run " << html_escape(run.label) << "</h2>\n";
    os << "<p class=\"status state-" << run_state_name(run.status.state) << "\">" << html_escape(run.status.text)
       << "</p>\n";
    for (const auto& note : run.notes) os << "<p class=\"note\">" << html_escape(note) << "</p>\n";
    os << "<h3>Header</h3>\n<table class=\"header\">\n";
    for (const auto& [key, value] : run.header)
      os << "<tr><th>" << html_escape(key) << "</th><td>" << html_escape(value) << "</td></tr>\n";
    os << "</table>\n";
    if (!run.trainer_header.empty())
      os << "<pre class=\"trainer-header\">" << html_escape(run.trainer_header) << "</pre>\n";
    os << "<h3>Checkpoints</h3>\n";
    if (!run.checkpoints || run.checkpoints->checkpoints.empty()) {
      os << "<p>none</p>\n";
    } else {
      os << "<p>" << html_escape(run.checkpoints->dir.string())
         << "</p>\n<table "
            "class=\"checkpoints\">\n<tr><th>step</th><th>saved</th><th>bytes</th><th>verifies</th></tr>\n";
      for (const auto& c : run.checkpoints->checkpoints)
        os << "<tr><td>" << c.step << (c.latest ? " (latest)" : "") << "</td><td>" << html_escape(c.saved_at)
           << "</td><td>" << c.bytes << "</td><td>" << (c.verifies ? "yes" : "no: " + html_escape(c.problem))
           << "</td></tr>\n";
      os << "</table>\n";
    }
    os << "<h3>Config</h3>\n<details><summary>config.yaml</summary><pre class=\"config\">"
       << html_escape(run.config_yaml.empty() ? "(no config.yaml)" : run.config_yaml)
       << "</pre></details>\n</section>\n";
  }
  os << "<script type=\"application/json\" id=\"loom-data\">" << page_data(runs, options) << "</script>\n"
     << "<script>" << report::page_script << "</script>\n</body>\n</html>\n";
  return os.str();
}

std::string render_report_html(const std::vector<RunRecord>& runs, ReportAxis axis) {
  ReportOptions options;
  options.axis = axis;
  return render_report_html(runs, options);
}

}  // namespace loom
