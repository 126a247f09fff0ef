// The report's page: see loom/run/report.hpp.
#include <sstream>

#include "loom/run/report.hpp"
#include "report/escape.hpp"

namespace loom {

namespace {

// The page loads nothing: a browser that honours this refuses any fetch, even one a later edit
// would add, and reports it.
const char* const content_security_policy = "default-src 'none'; style-src 'unsafe-inline'; img-src data:";

const char* const style = R"(body{font-family:sans-serif;margin:24px;color:#222;max-width:1340px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px}h3{font-size:15px}
.charts{display:flex;flex-wrap:wrap;gap:12px}.chart{border:1px solid #ddd}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
pre{background:#f6f6f6;padding:8px;font-size:12px;overflow:auto;max-height:420px}
.runs li{margin:2px 0})";

}  // namespace

std::string render_report_html(const std::vector<RunRecord>& runs, ReportAxis axis) {
  const auto charts = report_charts(runs, axis);
  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
     << "<meta http-equiv=\"Content-Security-Policy\" content=\"" << content_security_policy << "\">\n"
     << "<title>loom report: ";
  for (std::size_t i = 0; i < runs.size(); ++i) os << (i ? ", " : "") << html_escape(runs[i].name);
  os << "</title>\n<style>" << style << "</style>\n</head>\n<body>\n<h1>loom report</h1>\n<ul class=\"runs\">\n";
  for (const auto& run : runs)
    os << "<li class=\"run-name\">" << html_escape(run.name) << " (" << html_escape(run.dir.string()) << ", "
       << run.rows.size() << " logged steps)</li>\n";
  os << "</ul>\n<h2>Charts</h2>\n<div class=\"charts\">\n";
  for (const auto& chart : charts) os << chart.svg;
  if (charts.empty()) os << "<p>No metrics logged yet.</p>\n";
  os << "</div>\n";
  for (const auto& run : runs) {
    os << "<h2>Run " << html_escape(run.name) << "</h2>\n<h3>Header</h3>\n<table class=\"header\">\n";
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
    os << "<h3>Config</h3>\n<pre class=\"config\">"
       << html_escape(run.config_yaml.empty() ? "(no config.yaml)" : run.config_yaml) << "</pre>\n";
  }
  os << "</body>\n</html>\n";
  return os.str();
}

}  // namespace loom
