// `loom report`: the charts carry the runs' data (gaps for NaN, outliers left out of the axis, log
// scale, whole-number step ticks, readable numbers), the runs' status and summary, the labels that
// tell runs apart, the config differences, the page is self-contained, bad input is one clear
// error, --watch, and the command end to end on a real `loom train` run.
#include "loom/run/report.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <memory>
#include <regex>
#include <sstream>
#include <thread>

#include "loom/error.hpp"
#include "report_test_support.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using loom::test::TempDir;

namespace {

const loom::ReportChart* find_chart(const std::vector<loom::ReportChart>& charts, const std::string& id) {
  for (const auto& c : charts)
    if (c.id == id) return &c;
  return nullptr;
}

std::string user_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const loom::UserError& e) {
    return e.what();
  }
  return "(no UserError)";
}

// The series group of a run and label in a chart's SVG.
std::string series_of(const std::string& svg, const std::string& run, const std::string& label) {
  const std::string start = "data-run=\"" + run + "\"";
  for (std::size_t at = svg.find(start); at != std::string::npos; at = svg.find(start, at + 1)) {
    const std::size_t title = svg.find("<title>", at);
    if (svg.compare(title + 7, label.size() + 8, label + "</title>") != 0) continue;
    return svg.substr(at, svg.find("</g>", at) - at);
  }
  return "";
}

// The x pixel coordinates of a series' polylines.
std::vector<double> xs_of(const std::string& svg, const std::string& run, const std::string& label) {
  const std::string group = series_of(svg, run, label);
  std::vector<double> xs;
  for (std::size_t p = group.find(" points=\""); p != std::string::npos; p = group.find(" points=\"", p + 1)) {
    std::istringstream in(group.substr(p + 9, group.find('"', p + 9) - p - 9));
    std::string point;
    while (in >> point) xs.push_back(std::stod(point.substr(0, point.find(','))));
  }
  return xs;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The texts of a chart's tick labels of one axis (class xtick or ytick).
std::vector<std::string> ticks_of(const std::string& svg, const std::string& axis) {
  std::vector<std::string> out;
  const std::regex tick("class=\"" + axis + "\"[^>]*>([^<]*)</text>");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tick); it != std::sregex_iterator(); ++it)
    out.push_back((*it)[1]);
  return out;
}

// Where a chart's plot begins: right of its tick labels.
double plot_left(const std::string& svg) {
  std::smatch s;
  if (!std::regex_search(svg, s, std::regex("<rect class=\"plot\" x=\"([0-9.]+)\""))) return -1;
  return std::stod(s[1]);
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST(Report, ChartsCarryEveryRunsData) {
  TempDir tmp;
  const auto runs = loom::test::two_runs(tmp.path());
  const auto charts = loom::report_charts(runs);
  for (const char* id : {"loss", "loss_per_source", "perplexity", "learning_rate", "grad_norm", "tokens_per_second",
                         "mfu", "eval_hellaswag_acc", "eval_hellaswag_acc_norm"})
    EXPECT_NE(find_chart(charts, id), nullptr) << id;
  const auto* loss = find_chart(charts, "loss");
  ASSERT_NE(loss, nullptr);
  // Both runs, train (10 logged steps) and eval (2 evaluations), each named in the legend.
  EXPECT_NE(loss->svg.find("data-run=\"alpha\" data-points=\"10\"><title>alpha train/loss</title>"), std::string::npos);
  EXPECT_NE(loss->svg.find("data-run=\"beta\" data-points=\"10\"><title>beta train/loss</title>"), std::string::npos);
  EXPECT_NE(loss->svg.find("data-run=\"alpha\" data-points=\"2\"><title>alpha eval/loss</title>"), std::string::npos);
  EXPECT_NE(loss->svg.find(">beta eval/loss</text>"), std::string::npos);
  EXPECT_NE(loss->svg.find(">step</text>"), std::string::npos);
  // Steps 2..20 span the plot, 2 steps apart: from its left edge to its right (624).
  const auto xs = xs_of(loss->svg, "alpha", "alpha train/loss");
  ASSERT_EQ(xs.size(), 10u);
  EXPECT_NEAR(xs.back(), 624, 0.05);
  EXPECT_NEAR(xs[1] - xs[0], (624 - xs[0]) / 9, 0.1);
  // The mixture's datasets, and each of the benchmark task's metrics in a chart of its own.
  const auto* sources = find_chart(charts, "loss_per_source");
  EXPECT_NE(sources->svg.find("<title>alpha eval/web/loss</title>"), std::string::npos);
  EXPECT_NE(sources->svg.find("<title>beta eval/code/loss</title>"), std::string::npos);
  const auto* acc = find_chart(charts, "eval_hellaswag_acc");
  EXPECT_EQ(acc->title, "Evaluation: hellaswag acc");
  EXPECT_NE(acc->svg.find("<title>alpha</title>"), std::string::npos);
  EXPECT_EQ(acc->svg.find("acc_norm"), std::string::npos);
  // MFU in percent: the ticks of 40.8..48 read 40..48.
  EXPECT_NE(find_chart(charts, "mfu")->svg.find(">44</text>"), std::string::npos);
}

TEST(Report, TokenAndTimeAxes) {
  TempDir tmp;
  const auto runs = loom::test::two_runs(tmp.path());
  const auto charts = loom::report_charts(runs, {loom::ReportAxis::tokens});
  const auto* loss = find_chart(charts, "loss");
  ASSERT_NE(loss, nullptr);
  EXPECT_NE(loss->svg.find(">tokens</text>"), std::string::npos);
  // alpha: 4 x 32 = 128 tokens a step, beta 2 x 32: beta's last point (1280 tokens) is halfway.
  const auto alpha = xs_of(loss->svg, "alpha", "alpha train/loss");
  const auto beta = xs_of(loss->svg, "beta", "beta train/loss");
  ASSERT_EQ(beta.size(), 10u);
  EXPECT_NEAR(alpha.back(), 624, 0.05);
  const double left = plot_left(loss->svg);
  EXPECT_NEAR(beta.front(), left, 0.05);
  EXPECT_NEAR(beta.back(), left + (624 - left) * (1280 - 128) / (2560 - 128), 0.1);
  // Time: throughput/elapsed_seconds (0.5 s a step), the evaluations at their step's time.
  const auto timed = loom::report_charts(runs, {loom::ReportAxis::time});
  const auto* t = find_chart(timed, "loss");
  EXPECT_NE(t->svg.find(">seconds</text>"), std::string::npos);
  EXPECT_EQ(xs_of(t->svg, "alpha", "alpha eval/loss").back(), xs_of(t->svg, "alpha", "alpha train/loss").back());
}

TEST(Report, NanIsAGapNotAJoin) {
  TempDir tmp;
  tmp.write("nan/metrics.jsonl",
            "{\"step\":1,\"train/loss\":3}\n{\"step\":2,\"train/loss\":2.5}\n{\"step\":3,\"train/loss\":null}\n"
            "{\"step\":4,\"train/loss\":2}\n{\"step\":5,\"train/loss\":1.5}\n");
  const auto run = loom::read_run(tmp.path() / "nan");
  ASSERT_EQ(run.rows.size(), 5u);
  EXPECT_TRUE(std::isnan(run.rows[2].values.at("train/loss")));
  const auto charts = loom::report_charts({run});
  const std::string group = series_of(find_chart(charts, "loss")->svg, "nan", "nan train/loss");
  // Two pieces: steps 1-2 and 4-5, none across step 3.
  EXPECT_EQ(count(group, "<polyline"), 2u) << group;
  EXPECT_EQ(xs_of(find_chart(charts, "loss")->svg, "nan", "nan train/loss").size(), 4u);
}

TEST(Report, StepTicksAreWholeNumbersAndNumbersReadable) {
  TempDir tmp;
  tmp.write("short/metrics.jsonl",
            "{\"step\":1,\"train/loss\":3,\"train/lr\":0.00002}\n{\"step\":2,\"train/loss\":2.5,\"train/lr\":0."
            "00004}\n{\"step\":3,\"train/loss\":2,\"train/lr\":0.00006}\n");
  const auto charts = loom::report_charts({loom::read_run(tmp.path() / "short")});
  EXPECT_EQ(ticks_of(find_chart(charts, "loss")->svg, "xtick"), (std::vector<std::string>{"1", "2", "3"}));
  for (const auto& t : ticks_of(find_chart(charts, "learning_rate")->svg, "ytick"))
    EXPECT_TRUE(std::regex_match(t, std::regex("0|[1-9](\\.[0-9]+)?e-0[45]"))) << t;
  EXPECT_EQ(loom::report_number(4.347e10), "43.47G");
  EXPECT_EQ(loom::report_number(2.077e6, true), "2.077M");
  EXPECT_EQ(loom::report_number(6738415616, true), "6.738B");
  EXPECT_EQ(loom::report_number(0.0006), "0.0006");
  EXPECT_EQ(loom::report_number(2.5e-5), "2.5e-05");
  EXPECT_EQ(loom::report_number(1e30), "1e+30");
  EXPECT_EQ(loom::report_number(1234.4), "1234");
}

TEST(Report, YLabelLeavesRoomForTheTickLabels) {
  TempDir tmp;
  const auto runs = loom::test::two_runs(tmp.path());
  for (const auto& chart : loom::report_charts(runs)) {
    // The rotated label's line ends at x 24; the widest tick label (7 px a character) ends 6 px
    // left of the plot.
    const double left = plot_left(chart.svg);
    ASSERT_GT(left, 0) << chart.id;
    std::size_t widest = 0;
    for (const auto& t : ticks_of(chart.svg, "ytick")) widest = std::max(widest, t.size());
    EXPECT_GE(left - 6 - 7.0 * static_cast<double>(widest), 24) << chart.id;
  }
}

TEST(Report, OutliersLeftOutOfTheAxisAndLogScale) {
  TempDir tmp;
  std::string metrics;
  for (int step = 1; step <= 20; ++step)
    metrics += "{\"step\":" + std::to_string(step) +
               ",\"train/loss\":" + (step == 7 ? "1e30" : std::to_string(4.0 - 0.1 * step)) + "}\n";
  tmp.write("spike/metrics.jsonl", metrics);
  const auto run = loom::read_run(tmp.path() / "spike");
  const auto clipped_charts = loom::report_charts({run});
  const auto* clipped = find_chart(clipped_charts, "loss");
  for (const auto& t : ticks_of(clipped->svg, "ytick")) EXPECT_LT(std::stod(t), 10) << t;
  EXPECT_EQ(count(clipped->svg, "class=\"clipped\""), 1u);
  ASSERT_EQ(clipped->notes.size(), 1u);
  EXPECT_NE(clipped->notes[0].find("1 value lies far outside the rest"), std::string::npos);
  loom::ReportOptions all;
  all.clip_outliers = false;
  const auto whole_charts = loom::report_charts({run}, all);
  const auto* whole = find_chart(whole_charts, "loss");
  EXPECT_EQ(ticks_of(whole->svg, "ytick").back(), "1e+30");
  EXPECT_EQ(count(whole->svg, "class=\"clipped\""), 0u);
  // A loss falling 4 -> 2 and steady: no outlier to leave out.
  const auto steady = loom::report_charts(loom::test::two_runs(tmp.path()));
  EXPECT_TRUE(find_chart(steady, "loss")->notes.empty());
  // Log scale: powers of ten and their 2 and 5 between, the label says so.
  loom::ReportOptions log;
  log.log_y = true;
  log.clip_outliers = false;
  const auto logged_charts = loom::report_charts({run}, log);
  const auto* logged = find_chart(logged_charts, "loss");
  EXPECT_NE(logged->svg.find(">loss (log)</text>"), std::string::npos);
  const auto ticks = ticks_of(logged->svg, "ytick");
  EXPECT_NE(std::find(ticks.begin(), ticks.end(), "1e+30"), ticks.end());
  EXPECT_NE(std::find(ticks.begin(), ticks.end(), "1"), ticks.end());
  EXPECT_LE(ticks.size(), 9u);  // 32 decades, a label every 5
}

TEST(Report, StatusOfEachRun) {
  TempDir tmp;
  const auto dirs = loom::test::five_runs(tmp.path());
  loom::test::TrainingLock lock(dirs[2]);
  std::vector<loom::RunRecord> runs;
  for (const auto& d : dirs) runs.push_back(loom::read_run(d));
  EXPECT_EQ(runs[0].status.state, loom::RunState::finished);
  EXPECT_EQ(runs[0].status.text, "finished, 40 steps");
  EXPECT_EQ(runs[1].status.state, loom::RunState::finished);  // a NaN at step 14, then finite again
  EXPECT_EQ(runs[2].status.state, loom::RunState::running);
  EXPECT_EQ(runs[2].status.text, "running, step 26 of 40");
  EXPECT_EQ(runs[3].status.state, loom::RunState::diverged);
  EXPECT_EQ(runs[3].status.text, "diverged: train/loss NaN or infinite at step 16 and after, to step 18 of 40");
  EXPECT_EQ(runs[4].status.state, loom::RunState::stopped);
  EXPECT_EQ(runs[4].status.text.rfind("stopped at step 12 of 40: not running, no final weights; no checkpoint", 0), 0u)
      << runs[4].status.text;
  lock.release();
  EXPECT_EQ(loom::read_run(dirs[2]).status.state, loom::RunState::stopped);
  // A run that logged its planned last step finished, with or without final weights.
  fs::remove(dirs[0] / "model.safetensors");
  EXPECT_EQ(loom::read_run(dirs[0]).status.state, loom::RunState::finished);
  // The runs table's figures.
  const auto& m = runs[0].summary;
  ASSERT_TRUE(m.final_eval_loss && m.best_eval_loss && m.tokens && m.wall_seconds && m.tokens_per_second);
  EXPECT_NEAR(*m.final_eval_loss, loom::test::curve(5.6, 1.7, 0.12, 40) + 0.15, 1e-4);
  EXPECT_EQ(m.best_eval_step, 40);
  EXPECT_EQ(*m.tokens, 40.0 * 8 * 64);
  EXPECT_NEAR(*m.wall_seconds, 16, 1e-9);
  EXPECT_NEAR(*m.tokens_per_second, 20040, 1e-6);
  EXPECT_EQ(runs[3].summary.memory, "5.1 GiB");
}

// end.json, the trainer's record of how a run ended, says what the metrics alone cannot.
TEST(Report, StatusFromTheRecordOfTheEnd) {
  TempDir tmp;
  const auto dirs = loom::test::five_runs(tmp.path());
  const fs::path stopped = dirs[4];  // logged to step 12 of 40, no final weights, no checkpoint
  auto write_end = [&](const fs::path& dir, const std::string& json) { std::ofstream(dir / "end.json") << json; };
  write_end(stopped, R"({"status": "stopped", "step": 12, "reason": "SIGTERM", "message": "stopped by SIGTERM"})");
  auto run = loom::read_run(stopped);
  EXPECT_EQ(run.status.state, loom::RunState::stopped);
  EXPECT_EQ(run.status.text, "stopped by SIGTERM after step 12 of 40; no checkpoint");
  EXPECT_EQ(run.header["status"], run.status.text);
  EXPECT_EQ(run.status.detail, "by SIGTERM after step 12");
  write_end(stopped, R"({"status": "error", "step": 12, "reason": "cannot read 'data/x.bin'", "message": "x"})");
  EXPECT_EQ(loom::read_run(stopped).status.text, "error after step 12 of 40: cannot read 'data/x.bin'; no checkpoint");
  write_end(stopped, R"({"status": "diverged", "step": 13, "reason": "infinite gradient norm"})");
  run = loom::read_run(stopped);
  EXPECT_EQ(run.status.state, loom::RunState::diverged);
  EXPECT_EQ(run.status.text, "diverged: infinite gradient norm at step 13 of 40");
  // Unreadable: a note, and the status the metrics give.
  write_end(stopped, R"({"status": "exploded", "step": 12})");
  run = loom::read_run(stopped);
  EXPECT_EQ(run.status.text.rfind("stopped at step 12 of 40: not running", 0), 0u) << run.status.text;
  ASSERT_EQ(run.notes.size(), 1u);
  EXPECT_NE(run.notes[0].find("end.json is not a record of how the run ended"), std::string::npos) << run.notes[0];
  // A run that trains (a resumed one) is running, whatever an earlier end left.
  write_end(dirs[2], R"({"status": "finished", "step": 20})");
  loom::test::TrainingLock lock(dirs[2]);
  EXPECT_EQ(loom::read_run(dirs[2]).status.text, "running, step 26 of 40");
}

TEST(Report, LabelsTellRunsApart) {
  TempDir tmp;
  const auto dirs = loom::test::five_runs(tmp.path());
  std::vector<loom::RunRecord> runs;
  for (const auto& d : dirs) runs.push_back(loom::read_run(d));
  runs.push_back(loom::read_run(dirs[0]));
  loom::label_runs(runs);
  EXPECT_EQ(runs[0].label, "quickstart-lr2e-3");
  EXPECT_EQ(runs[2].label, "quickstart-wide");
  EXPECT_EQ(runs[3].label, "run-nf4/run");
  EXPECT_EQ(runs[4].label, "run-int8/run");
  EXPECT_EQ(runs[5].label, "quickstart-lr2e-3 (2)");
  const auto charts = loom::report_charts(runs);
  EXPECT_NE(find_chart(charts, "loss")->svg.find("<title>run-nf4/run train/loss</title>"), std::string::npos);
}

TEST(Report, ConfigDifferencesAndLoraHeader) {
  TempDir tmp;
  const auto dirs = loom::test::five_runs(tmp.path());
  std::vector<loom::RunRecord> runs;
  for (const auto& d : dirs) runs.push_back(loom::read_run(d));
  loom::label_runs(runs);
  EXPECT_EQ(loom::config_differences({runs[0], runs[1]}), (std::vector<std::string>{"optimizer.learning_rate"}));
  EXPECT_EQ(loom::config_differences({runs[3], runs[4]}), (std::vector<std::string>{"lora.base_dtype"}));
  EXPECT_EQ(loom::config_differences({runs[0], runs[3]}),
            (std::vector<std::string>{"lora.alpha", "lora.base_dtype", "lora.rank", "lora.target_modules",
                                      "optimizer.learning_rate"}));
  EXPECT_EQ(runs[3].header.at("lora rank"), "16");
  EXPECT_EQ(runs[3].header.at("lora targets"), "[q_proj, v_proj]");
  EXPECT_EQ(runs[3].header.at("lora base_dtype"), "nf4");
  EXPECT_EQ(runs[3].header.at("parameters"), "6.738B");
  EXPECT_EQ(runs[3].header.at("FLOPs per token"), "43.47G");
  EXPECT_EQ(runs[3].header.at("training tokens"), "2.077M");
  EXPECT_EQ(runs[0].header.count("lora rank"), 0u);
  const std::string html = loom::render_report_html(runs);
  EXPECT_NE(html.find("<tr><th>lora.base_dtype</th><td><i>not set</i></td><td><i>not set</i></td><td><i>not "
                      "set</i></td><td>nf4</td><td>int8</td>"),
            std::string::npos)
      << html.substr(html.find("config-diff"), 2000);
}

TEST(Report, NotesForMfuAbove100AndCurvesThatCoincide) {
  TempDir tmp;
  const auto dirs = loom::test::five_runs(tmp.path());
  std::vector<loom::RunRecord> runs;
  for (const auto& d : dirs) runs.push_back(loom::read_run(d));
  loom::label_runs(runs);
  const auto charts = loom::report_charts(runs);
  const auto* mfu = find_chart(charts, "mfu");
  ASSERT_NE(mfu, nullptr);
  ASSERT_EQ(mfu->notes.size(), 1u);
  EXPECT_EQ(mfu->notes[0].rfind("run-nf4/run: MFU reaches 118.6% (step 18), above the 100% no hardware exceeds", 0), 0u)
      << mfu->notes[0];
  EXPECT_NE(mfu->notes[0].find("(1.2T)"), std::string::npos);
  EXPECT_NE(mfu->svg.find("class=\"reference\""), std::string::npos);
  // The two LoRA runs' schedules match to step 12, but nf4 goes on: not the same curve. The two
  // quickstart runs at 2e-3 share every learning rate up to step 26, but the wide one stops there.
  EXPECT_TRUE(find_chart(charts, "learning_rate")->notes.empty());
  std::vector<loom::RunRecord> twice = {runs[0], runs[0]};
  loom::label_runs(twice);
  const auto twice_charts = loom::report_charts(twice);
  const auto notes = find_chart(twice_charts, "loss")->notes;
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_EQ(notes[0],
            "quickstart-lr2e-3 and quickstart-lr2e-3 (2) logged the same train/loss at every step: their curves "
            "coincide, and the last drawn hides the others");
  EXPECT_NE(notes[1].find("the same eval/loss"), std::string::npos);
}

TEST(Report, PageIsSelfContained) {
  TempDir tmp;
  auto runs = loom::test::two_runs(tmp.path());
  const std::string html = loom::render_report_html(runs);
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("<script src"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_NE(html.find("content=\"default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src "
                      "data:\""),
            std::string::npos);
  // Each run's header, config and checkpoints; the runs table; the data the script draws.
  EXPECT_NE(html.find("<h2>Run alpha</h2>"), std::string::npos);
  EXPECT_NE(html.find("<tr><th>optimizer</th><td>adamw</td></tr>"), std::string::npos);
  EXPECT_NE(html.find("train_batch_size: 4"), std::string::npos);
  EXPECT_NE(html.find("<h3>Checkpoints</h3>\n<p>none</p>"), std::string::npos);
  EXPECT_NE(html.find("<table id=\"runs-table\" class=\"sortable\">"), std::string::npos);
  EXPECT_NE(html.find("<td class=\"num\" data-sort=\"20\">20 / 20</td>"), std::string::npos);
  EXPECT_NE(html.find("\"metric\":\"train/loss\""), std::string::npos);
  // Text from the files is escaped, in the HTML and inside the script's data.
  EXPECT_EQ(html.find("<b>bold</b>"), std::string::npos);
  EXPECT_NE(html.find("&lt;b&gt;bold&lt;/b&gt;"), std::string::npos);
  runs[0].label = "</script><b>x";
  const std::string hostile = loom::render_report_html(runs);
  EXPECT_EQ(hostile.find("</script><b>x"), std::string::npos);
  EXPECT_NE(hostile.find("\\u003c/script>\\u003cb>x"), std::string::npos);
}

TEST(Report, BadInputIsOneErrorNamingFileAndLine) {
  TempDir tmp;
  EXPECT_NE(user_error_of([&] { loom::read_run(tmp.path() / "absent"); }).find("is not a directory"),
            std::string::npos);
  fs::create_directories(tmp.path() / "empty");
  EXPECT_NE(user_error_of([&] { loom::read_run(tmp.path() / "empty"); }).find("has no metrics.jsonl"),
            std::string::npos);
  fs::create_directories(tmp.path() / "dir/metrics.jsonl");
  EXPECT_NE(user_error_of([&] { loom::read_run(tmp.path() / "dir"); }).find("dir/metrics.jsonl' is not a file"),
            std::string::npos);
  const std::string good = "{\"step\":1,\"train/loss\":2.5}\n";
  tmp.write("blank/metrics.jsonl", good + "\n" + good);
  EXPECT_NE(user_error_of([&] { loom::read_run(tmp.path() / "blank"); }).find("blank/metrics.jsonl:2: empty line"),
            std::string::npos);
  // A cut line in the middle is damage; at the end, without its newline, a line being written.
  tmp.write("cut/metrics.jsonl", good + "{\"step\":2,\"train/lo\n" + good);
  EXPECT_NE(user_error_of([&] { loom::read_run(tmp.path() / "cut"); }).find("cut/metrics.jsonl:2: not a JSON object"),
            std::string::npos);
  tmp.write("writing/metrics.jsonl", good + good + "{\"step\":3,\"train/lo");
  const auto writing = loom::read_run(tmp.path() / "writing");
  EXPECT_EQ(writing.rows.size(), 2u);
  ASSERT_EQ(writing.notes.size(), 1u);
  EXPECT_NE(writing.notes[0].find("line 3 of"), std::string::npos);
  EXPECT_NE(writing.notes[0].find("a line being written, left out"), std::string::npos);
  // Broken UTF-8 and binary: the bytes named, never copied into the message.
  tmp.write("latin1/metrics.jsonl", good + "{\"step\":2,\"caf\xe9\":1}\n");
  const std::string latin1 = user_error_of([&] { loom::read_run(tmp.path() / "latin1"); });
  EXPECT_NE(latin1.find("latin1/metrics.jsonl:2: not UTF-8 text (byte 0xE9 at column 15)"), std::string::npos)
      << latin1;
  tmp.write("binary/metrics.jsonl", good + std::string("\x00\x01\x02\xff\xfe", 5) + "\n");
  const std::string binary = user_error_of([&] { loom::read_run(tmp.path() / "binary"); });
  EXPECT_NE(binary.find("binary/metrics.jsonl:2: not UTF-8 text (byte 0x00 at column 1)"), std::string::npos) << binary;
  for (const std::string& message : {latin1, binary})
    for (char c : message) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << "a raw byte " << int(static_cast<unsigned char>(c));
  // A syntax error quotes the line with its odd bytes escaped.
  tmp.write("syntax/metrics.jsonl", good + "{\"step\":2,\"x\":\t@}\n");
  EXPECT_NE(user_error_of([&] { loom::read_run(tmp.path() / "syntax"); }).find("\\x09@}"), std::string::npos);
  tmp.write("nostep/metrics.jsonl", "{\"train/loss\":2.5}\n");
  EXPECT_NE(user_error_of([&] { loom::read_run(tmp.path() / "nostep"); }).find("nostep/metrics.jsonl:1: no integer"),
            std::string::npos);
  EXPECT_NE(user_error_of([] {
              loom::parse_report_axis("wall\xff");
            }).find("'wall\\xff': the x axis is step, tokens or time"),
            std::string::npos);
  // No config: no tokens per step to put on a token axis; no elapsed time for a time axis.
  tmp.write("noconfig/metrics.jsonl", good);
  const auto run = loom::read_run(tmp.path() / "noconfig");
  EXPECT_NE(user_error_of([&] { loom::report_charts({run}, {loom::ReportAxis::tokens}); }).find("--x tokens"),
            std::string::npos);
  EXPECT_NE(user_error_of([&] { loom::render_report_html({run}, {loom::ReportAxis::time}); }).find("--x time"),
            std::string::npos);
}

TEST(Report, PngsOrASayingSo) {
  TempDir tmp;
  const auto runs = loom::test::two_runs(tmp.path());
  const auto charts = loom::report_charts(runs);
  if (!loom::report_png_available()) {
    EXPECT_NE(user_error_of([&] { loom::write_report_pngs(charts, tmp.path() / "png"); }).find("not available"),
              std::string::npos);
    return;
  }
  loom::write_report_pngs(charts, tmp.path() / "png");
  for (const auto& chart : charts) {
    std::ifstream in(tmp.path() / "png" / (chart.id + ".png"), std::ios::binary);
    std::string signature(8, '\0');
    in.read(signature.data(), 8);
    EXPECT_EQ(signature, "\x89PNG\r\n\x1a\n") << chart.id;
  }
}

// --watch: the page is rewritten while a run trains (its .lock held), reloads itself, and the
// command returns once no run trains, leaving a page that no longer reloads.
TEST(ReportCommand, WatchRewritesWhileARunTrains) {
  TempDir tmp;
  const auto dirs = loom::test::five_runs(tmp.path());
  auto lock = std::make_unique<loom::test::TrainingLock>(dirs[2]);
  const fs::path html = tmp.path() / "live.html";
  loom::test::CommandResult watched;
  std::thread watcher([&] {
    watched = loom::test::run_command({LOOM_BINARY, "report", dirs[2].string(), "-o", html.string(), "--watch", "1"});
  });
  auto wait_for = [&](const std::string& text) {
    for (int i = 0; i < 600 && read_text(html).find(text) == std::string::npos; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return read_text(html);
  };
  std::string page = wait_for("running, step 26 of 40");
  EXPECT_NE(page.find("running, step 26 of 40"), std::string::npos);
  EXPECT_NE(page.find("\"reload\":1"), std::string::npos);
  EXPECT_NE(page.find("<p class=\"live\">"), std::string::npos);
  // The trainer logs two more steps, the second one being written as the report reads.
  std::ofstream(dirs[2] / "metrics.jsonl", std::ios::app) << "{\"step\":28,\"train/loss\":2.1}\n{\"step\":30,\"tr";
  page = wait_for("running, step 28 of 40");
  EXPECT_NE(page.find("running, step 28 of 40"), std::string::npos);
  EXPECT_NE(page.find("a line being written, left out"), std::string::npos);
  lock.reset();  // the run ends
  watcher.join();
  EXPECT_EQ(watched.exit_code, 0) << watched.err;
  page = read_text(html);
  EXPECT_NE(page.find("stopped at step 28 of 40"), std::string::npos);
  EXPECT_NE(page.find("\"reload\":0"), std::string::npos);
  EXPECT_EQ(page.find("<p class=\"live\">"), std::string::npos);
  EXPECT_NE(watched.out.find("running, step 26 of 40"), std::string::npos) << watched.out;
}

// End to end: a short real run of the quickstart, charted by the command.
TEST(ReportCommand, ChartsARealRun) {
  TempDir tmp;
  const fs::path run = tmp.path() / "quick";
  const auto train = loom::test::run_command(
      {LOOM_BINARY, "train", LOOM_SOURCE_DIR "/configs/quickstart.yaml", "trainer.run_dir=" + run.string(),
       "trainer.num_train_steps=12", "trainer.log_every=2", "trainer.steps_per_eval=6", "trainer.sample_length=0",
       "lr_schedule.warmup=2", "trainer.checkpoint.save_every_steps=6", "data.num_documents=2000"});
  ASSERT_EQ(train.exit_code, 0) << train.err;
  const fs::path html = tmp.path() / "report.html";
  const auto report = loom::test::run_command({LOOM_BINARY, "report", run.string(), "-o", html.string()});
  ASSERT_EQ(report.exit_code, 0) << report.err;
  EXPECT_NE(report.out.find("(quick finished, 12 steps)"), std::string::npos) << report.out;
  const std::string page = read_text(html);
  EXPECT_NE(page.find("{\"eval\":false,\"metric\":\"train/loss\",\"points\":[[2.0,"), std::string::npos);
  EXPECT_NE(page.find("<tr><td>12 (latest)</td>"), std::string::npos);
  EXPECT_NE(page.find("finished, 12 steps"), std::string::npos);
  EXPECT_EQ(page.find("http://"), std::string::npos);
  // The header's numbers without exponents.
  EXPECT_FALSE(std::regex_search(page, std::regex("<td>[0-9.]+e\\+[0-9]+")));

  // A run that diverges: end.json names the step, the report says so in the runs table and the
  // run's header, and the step that diverged is a gap in the loss chart.
  const fs::path diverged = tmp.path() / "nan";
  const auto nan = loom::test::run_command(
      {LOOM_BINARY, "train", LOOM_SOURCE_DIR "/configs/quickstart.yaml", "trainer.run_dir=" + diverged.string(),
       "trainer.num_train_steps=12", "trainer.log_every=1", "trainer.sample_length=0", "lr_schedule.warmup=0",
       "optimizer.learning_rate=1.0e+30", "optimizer.max_grad_norm=0", "data.num_documents=2000", "model.num_layers=1",
       "model.hidden_dim=32", "model.num_heads=2", "model.seq_len=32", "trainer.train_batch_size=2"});
  ASSERT_EQ(nan.exit_code, 2) << nan.out << nan.err;
  ASSERT_NE(nan.err.find("step 2: the loss is NaN"), std::string::npos) << nan.err;
  const auto diverged_report = loom::test::run_command({LOOM_BINARY, "report", diverged.string(), "-o", html.string()});
  ASSERT_EQ(diverged_report.exit_code, 0) << diverged_report.err;
  EXPECT_NE(diverged_report.out.find("(nan diverged: NaN loss at step 2 of 12)"), std::string::npos)
      << diverged_report.out;
  const std::string diverged_page = read_text(html);
  // The runs table's state cell, and the run's section.
  EXPECT_NE(diverged_page.find("\">diverged</span><span class=\"detail\">: NaN loss at step 2</span></td>"),
            std::string::npos)
      << diverged_page;
  EXPECT_NE(diverged_page.find("<p class=\"status state-diverged\">diverged: NaN loss at step 2 of 12</p>"),
            std::string::npos);
  EXPECT_NE(diverged_page.find("\"points\":[[1.0,"), std::string::npos);

  const auto missing = loom::test::run_command({LOOM_BINARY, "report", (tmp.path() / "nope").string(), "-o", "x.html"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("nope' is not a directory"), std::string::npos) << missing.err;
  fs::create_directories(tmp.path() / "odd/metrics.jsonl");
  const auto odd = loom::test::run_command({LOOM_BINARY, "report", (tmp.path() / "odd").string(), "-o", "x.html"});
  EXPECT_EQ(odd.exit_code, 2);
  EXPECT_NE(odd.err.find("metrics.jsonl' is not a file"), std::string::npos) << odd.err;
  const auto smoothing =
      loom::test::run_command({LOOM_BINARY, "report", run.string(), "-o", html.string(), "--smoothing", "1.5"});
  EXPECT_EQ(smoothing.exit_code, 2);
  EXPECT_NE(smoothing.err.find("the smoothing is 0 (none) to 0.99"), std::string::npos) << smoothing.err;
  std::ofstream(run / "metrics.jsonl", std::ios::app) << "\n{\"step\":13}\n";
  const auto blank = loom::test::run_command({LOOM_BINARY, "report", run.string(), "-o", html.string()});
  EXPECT_EQ(blank.exit_code, 2);
  EXPECT_NE(blank.err.find("metrics.jsonl:7: empty line"), std::string::npos) << blank.err;
}
