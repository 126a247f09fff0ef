// The report in a real browser: headless Chromium, driven over the DevTools protocol by
// cdp_session.py (Python's standard library only), loads the page of five runs and the test checks
// the DOM and the interactions: the charts drawn, NaN as a gap, whole-number step ticks, y labels
// clear of the tick labels, the outlier left out of the axis, the notes, sorting the runs table,
// hovering a chart, log scale, smoothing, clipping off, the x axis, hiding a run from the legend;
// a screenshot that shows the runs' colours; nothing fetched; and a --watch page reloading itself
// with its controls kept. Skips, saying so, without chromium (a failure under
// -DLOOM_REQUIRE_REFERENCE_TESTS=ON: scripts/install-deps.sh installs it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "loom/run/report.hpp"
#include "reference_required.hpp"
#include "report_test_support.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using loom::test::TempDir;
using nlohmann::json;

namespace {

bool have_chromium() {
  return !std::string(LOOM_CHROMIUM).empty() && fs::exists(LOOM_CHROMIUM);
}

const char* const missing =
    "chromium is not installed (Debian: apt-get install chromium, as scripts/install-deps.sh does; configure again "
    "after installing)";

struct Session {
  json results = json::array();
  std::vector<std::string> exceptions, log, requests;
  std::string error;  // the driver's message when a step failed
};

// Runs `steps` in a fresh headless Chromium on the page.
Session drive(const fs::path& tmp, const fs::path& page, const json& steps) {
  static int n = 0;
  const std::string id = std::to_string(++n);
  const fs::path steps_file = tmp / ("steps-" + id + ".json"), result_file = tmp / ("result-" + id + ".json");
  std::ofstream(steps_file) << steps.dump();
  const auto run =
      loom::test::run_command({"/usr/bin/python3", LOOM_CDP_SESSION, LOOM_CHROMIUM, (tmp / ("profile-" + id)).string(),
                               "file://" + page.string(), steps_file.string(), result_file.string()});
  Session s;
  if (run.exit_code != 0) s.error = run.out + run.err;
  std::ifstream in(result_file);
  if (!in) {
    if (s.error.empty()) s.error = "no result from the driver";
    return s;
  }
  const json out = json::parse(in);
  s.results = out["results"];
  for (const auto& e : out["exceptions"]) s.exceptions.push_back(e.get<std::string>());
  for (const auto& e : out["log"]) s.log.push_back(e.get<std::string>());
  for (const auto& e : out["requests"]) {
    const std::string url = e.get<std::string>();
    if (url != "file://" + page.string()) s.requests.push_back(url);
  }
  return s;
}

json eval(const std::string& js) {
  return {{"eval", js}};
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

// The number in "quickstart-lr2e-3 train/loss: 2.345 at step 22".
double value_in(const std::string& row) {
  std::smatch m;
  if (!std::regex_search(row, m, std::regex(": ([-0-9.e+]+)"))) return NAN;
  return std::stod(m[1]);
}

std::vector<loom::RunRecord> read_runs(const std::vector<fs::path>& dirs) {
  std::vector<loom::RunRecord> runs;
  for (const auto& d : dirs) runs.push_back(loom::read_run(d));
  loom::label_runs(runs);
  return runs;
}

const char* const ready = "document.body.dataset.ready === 'true'";

}  // namespace

TEST(ReportBrowser, ChartsAndInteractions) {
  if (!have_chromium()) return loom::test::skip_missing_reference(missing);
  TempDir tmp;
  const auto dirs = loom::test::five_runs(tmp.path());
  loom::test::TrainingLock lock(dirs[2]);
  const auto runs = read_runs(dirs);
  const fs::path page = tmp.path() / "report.html";
  loom::test::write_file(page, loom::render_report_html(runs));
  const fs::path shot = tmp.path() / "report.png";

  const json steps = {
      {{"wait", ready}},
      eval("Array.from(document.querySelectorAll('.chart')).map(c => c.dataset.chart)"),
      eval("Array.from(document.querySelectorAll('#chart-loss .legend .entry')).map(e => e.textContent)"),
      // 3: the NaN at step 14 splits lr6e-4's loss into two pieces
      eval("document.querySelector('#chart-loss g.series[data-run=\"quickstart-lr6e-4\"] path').getAttribute('d')"
           ".split('M').length - 1"),
      // 4: charts whose rotated y label reaches into a tick label
      eval("Array.from(document.querySelectorAll('.chart')).filter(c => { const l = c.querySelector('.ylabel');"
           " const r = l.getBoundingClientRect(); return Array.from(c.querySelectorAll('.ytick')).some(t =>"
           " t.getBoundingClientRect().left < r.right + 1); }).map(c => c.dataset.chart)"),
      // 5: the step axes' tick labels
      eval("Array.from(document.querySelectorAll('.xtick')).map(t => t.textContent)"),
      // 6: the loss axis with the 1e30 left out, its note, the triangle at the edge
      eval("[Math.max(...Array.from(document.querySelectorAll('#chart-loss .ytick')).map(t => "
           "parseFloat(t.textContent))),"
           " document.querySelector('#chart-loss .notes').textContent,"
           " document.querySelectorAll('#chart-loss path.clipped').length]"),
      eval("document.querySelector('#chart-mfu .notes').textContent"),
      // 8: the runs table as written
      eval("Array.from(document.querySelectorAll('#runs-table tbody tr')).map(r => Array.from(r.cells).slice(0, 4)"
           ".map(c => c.textContent).join('|'))"),
      {{"click", "#runs-table thead th:nth-child(4)"}},
      eval("Array.from(document.querySelectorAll('#runs-table tbody tr')).map(r => r.dataset.run)"),
      {{"click", "#runs-table thead th:nth-child(4)"}},
      eval("Array.from(document.querySelectorAll('#runs-table tbody tr')).map(r => r.dataset.run)"),
      // 13: hover the loss chart's middle
      {{"hover", "#chart-loss .hover-area"}, {"fx", 0.5}, {"fy", 0.5}},
      eval("[!document.querySelector('#chart-loss .tooltip').hidden, document.querySelector('#chart-loss .tooltip "
           ".head').textContent, Array.from(document.querySelectorAll('#chart-loss .tooltip .row')).map(r => "
           "r.textContent), document.querySelector('#chart-loss .cursor').getAttribute('visibility')]"),
      // 15: log scale
      {{"click", "#log-y"}},
      eval("[document.querySelector('#chart-loss .ylabel').textContent, Array.from(document.querySelectorAll("
           "'#chart-loss .ytick')).map(t => t.textContent)]"),
      {{"click", "#log-y"}},
      // 18: smoothing moved to 0.8 of the slider
      {{"click", "#smoothing"}, {"fx", 0.8}, {"fy", 0.5}},
      eval("(() => { const raw = document.querySelector('#chart-loss g.raw[data-run=\"quickstart-lr2e-3\"] path');"
           " const sm = document.querySelector('#chart-loss g.smoothed[data-run=\"quickstart-lr2e-3\"] path');"
           " return [+document.getElementById('smoothing').value, "
           "document.getElementById('smoothing-value').textContent,"
           " document.querySelectorAll('#chart-loss g.smoothed').length, raw.getAttribute('stroke-opacity'),"
           " sm.getAttribute('d') !== raw.getAttribute('d')]; })()"),
      // 20: clipping off: the axis reaches 1e30
      {{"click", "#clip"}},
      eval("Math.max(...Array.from(document.querySelectorAll('#chart-loss .ytick')).map(t => "
           "parseFloat(t.textContent)))"),
      {{"click", "#clip"}},
      // 23: the x axis
      eval("(() => { const s = document.getElementById('x-axis'); s.value = 'tokens'; s.dispatchEvent(new "
           "Event('change')); const a = document.querySelector('#chart-loss .xlabel').textContent; s.value = 'time';"
           " s.dispatchEvent(new Event('change')); const b = document.querySelector('#chart-loss .xlabel').textContent;"
           " s.value = 'step'; s.dispatchEvent(new Event('change')); return [a, b]; })()"),
      // 24: a legend entry hides its run in every chart, and shows it again
      {{"click", "#chart-loss .legend .entry[data-run=\"0\"]"}},
      eval("document.querySelectorAll('g.series[data-run=\"quickstart-lr2e-3\"]').length"),
      {{"click", "#chart-loss .legend .entry[data-run=\"0\"]"}},
      eval("document.querySelectorAll('#chart-loss g.series[data-run=\"quickstart-lr2e-3\"]').length"),
      {{"screenshot", shot.string()}},
  };
  const Session s = drive(tmp.path(), page, steps);
  ASSERT_EQ(s.error, "") << "the browser session failed";
  ASSERT_EQ(s.results.size(), steps.size());
  EXPECT_TRUE(s.exceptions.empty()) << joined(s.exceptions);
  const json& r = s.results;

  const auto charts = r[1].get<std::vector<std::string>>();
  for (const char* id : {"loss", "perplexity", "learning_rate", "grad_norm", "tokens_per_second", "mfu",
                         "eval_arc_easy_acc", "train_skipped_steps"})
    EXPECT_NE(std::find(charts.begin(), charts.end(), id), charts.end()) << id;
  const auto legend = r[2].get<std::vector<std::string>>();
  for (const char* entry : {"quickstart-lr2e-3 train/loss", "run-nf4/run train/loss", "run-int8/run eval/loss"})
    EXPECT_NE(std::find(legend.begin(), legend.end(), entry), legend.end()) << entry << "\n" << r[2].dump();
  EXPECT_EQ(r[3], 2) << "lr6e-4's NaN at step 14 is not a gap";
  EXPECT_EQ(r[4], json::array()) << "y labels over tick labels in " << r[4].dump();
  for (const auto& t : r[5]) EXPECT_TRUE(std::regex_match(t.get<std::string>(), std::regex("[0-9]+"))) << t;
  EXPECT_LT(r[6][0].get<double>(), 10) << "the 1e30 outlier flattens the loss chart";
  EXPECT_NE(r[6][1].get<std::string>().find("1 value lies far outside the rest"), std::string::npos) << r[6];
  EXPECT_EQ(r[6][2], 1);
  EXPECT_NE(r[7].get<std::string>().find("run-nf4/run: MFU reaches 118.6%"), std::string::npos) << r[7];
  EXPECT_EQ(r[8], json({"quickstart-lr2e-3|finished|40 / 40|1.882", "quickstart-lr6e-4|finished|40 / 40|2.774",
                        "quickstart-wide|running|26 / 40|1.976", "run-nf4/run|diverged|18 / 40|3.99",
                        "run-int8/run|stopped|12 / 40|3.99"}))
      << r[8].dump();
  // Sorted by the final eval loss, ascending, then descending (equal ones keep their order).
  EXPECT_EQ(r[10], json({"quickstart-lr2e-3", "quickstart-wide", "quickstart-lr6e-4", "run-nf4/run", "run-int8/run"}));
  EXPECT_EQ(r[12], json({"run-nf4/run", "run-int8/run", "quickstart-lr6e-4", "quickstart-wide", "quickstart-lr2e-3"}));
  // Hover: the step under the cursor, and each run's value there (the runs that reach it).
  ASSERT_EQ(r[14].size(), 4u);
  EXPECT_EQ(r[14][0], true);
  EXPECT_EQ(r[14][3], "visible");
  std::smatch head;
  const std::string head_text = r[14][1].get<std::string>();
  ASSERT_TRUE(std::regex_match(head_text, head, std::regex("step ([0-9]+)"))) << head_text;
  const int step = std::stoi(head[1]);
  EXPECT_TRUE(step == 20 || step == 22) << step;
  std::map<std::string, std::string> rows;
  for (const auto& row : r[14][2]) {
    const std::string text = row.get<std::string>();
    rows[text.substr(0, text.find(':'))] = text;
  }
  EXPECT_EQ(rows.size(), 10u) << r[14][2].dump();
  EXPECT_NEAR(value_in(rows["quickstart-lr2e-3 train/loss"]), loom::test::curve(5.6, 1.7, 0.12, step), 2e-3);
  EXPECT_NEAR(value_in(rows["quickstart-lr6e-4 train/loss"]), loom::test::curve(5.6, 1.7, 0.036, step), 2e-3);
  EXPECT_NEAR(value_in(rows["quickstart-wide train/loss"]), loom::test::curve(5.6, 1.45, 0.12, step), 2e-3);
  // The runs that stopped before: their last point, with its step.
  EXPECT_NE(rows["run-int8/run train/loss"].find("at step 12"), std::string::npos) << rows["run-int8/run train/loss"];
  // Log scale.
  EXPECT_EQ(r[16][0], "loss (log)");
  for (const auto& t : r[16][1])
    EXPECT_TRUE(std::regex_match(t.get<std::string>(), std::regex("[125](0*)|0\\.0*[125]"))) << t;
  // Smoothing: the slider moved, a smoothed curve over a faint raw one.
  const double smoothing = r[19][0].get<double>();
  EXPECT_NEAR(smoothing, 0.79, 0.04);
  char shown[16];
  std::snprintf(shown, sizeof shown, "%.2f", smoothing);
  EXPECT_EQ(r[19][1], shown);
  EXPECT_EQ(r[19][2], 5);
  EXPECT_EQ(r[19][3], "0.25");
  EXPECT_EQ(r[19][4], true);
  EXPECT_GE(r[21].get<double>(), 1e29) << "clipping off still leaves the outlier out";
  EXPECT_EQ(r[23], json({"tokens", "time (seconds)"}));
  EXPECT_EQ(r[25], 0);
  EXPECT_EQ(r[27], 3);  // raw and smoothed train/loss (smoothing is on), eval/loss

  // The screenshot shows the first two runs' colours (counted by a standard-library PNG decoder).
  const auto count = loom::test::run_command({"/usr/bin/python3", LOOM_PNG_PIXELS, shot.string(), "0072B2", "D55E00"});
  ASSERT_EQ(count.exit_code, 0) << count.err;
  std::istringstream in(count.out);
  std::map<std::string, long> pixels;
  std::string name;
  long n = 0;
  while (in >> name >> n) pixels[name] = n;
  EXPECT_GT(pixels["0072B2"], 2000);
  EXPECT_GT(pixels["D55E00"], 2000);
  EXPECT_GT(pixels["nonwhite"], 100000);

  // Nothing requested but the page itself, nothing blocked.
  EXPECT_TRUE(s.requests.empty()) << joined(s.requests);
  EXPECT_TRUE(s.log.empty()) << joined(s.log);
}

TEST(ReportBrowser, NothingIsFetched) {
  if (!have_chromium()) return loom::test::skip_missing_reference(missing);
  TempDir tmp;
  const auto runs = loom::test::two_runs(tmp.path());
  const std::string html = loom::render_report_html(runs);
  // A page that asks for an image elsewhere, and a script that tries a connection: the browser
  // blocks both and says so, which is what the check above relies on.
  const fs::path fetching = tmp.path() / "fetching.html";
  loom::test::write_file(
      fetching, std::regex_replace(html, std::regex("<h1>"),
                                   "<img src=\"http://example.invalid/x.png\"><script>fetch('http://example.invalid/"
                                   "y').catch(() => {});</script><h1>"));
  const Session s = drive(tmp.path(), fetching, {{{"wait", ready}}});
  ASSERT_EQ(s.error, "");
  const std::string log = joined(s.log);
  EXPECT_NE(log.find("Content Security Policy"), std::string::npos) << log;
  EXPECT_NE(log.find("example.invalid/y"), std::string::npos) << log;
}

// A page written by --watch while a run trains reloads itself, and keeps its controls' state.
TEST(ReportBrowser, WatchedPageReloadsKeepingItsControls) {
  if (!have_chromium()) return loom::test::skip_missing_reference(missing);
  TempDir tmp;
  const auto dirs = loom::test::five_runs(tmp.path());
  loom::test::TrainingLock lock(dirs[2]);
  loom::ReportOptions options;
  options.reload_seconds = 1;
  const fs::path page = tmp.path() / "live.html";
  loom::test::write_file(page, loom::render_report_html(read_runs({dirs[2]}), options));
  const Session s = drive(
      tmp.path(), page,
      {{{"wait", ready}},
       eval("document.querySelector('.live').textContent"),
       {{"click", "#log-y"}},
       eval("window.loomMarker = 1; performance.getEntriesByType('navigation')[0].type"),
       {{"wait", "!window.loomMarker && document.body && document.body.dataset.ready === 'true'"}, {"timeout", 15}},
       eval("[performance.getEntriesByType('navigation')[0].type, document.getElementById('log-y').checked,"
            " document.querySelector('#chart-loss .ylabel').textContent, document.querySelector('.run-status')"
            ".textContent]")});
  ASSERT_EQ(s.error, "");
  EXPECT_TRUE(s.exceptions.empty()) << joined(s.exceptions);
  EXPECT_NE(s.results[1].get<std::string>().find("rewrites this file every 1 s"), std::string::npos);
  EXPECT_EQ(s.results[3], "navigate");
  EXPECT_EQ(s.results[5], json({"reload", true, "loss (log)", "quickstart-wide: running, step 26 of 40"}));
}
