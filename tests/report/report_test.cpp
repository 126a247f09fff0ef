// `loom report`: the charts carry the runs' data, the page is self-contained, bad input is one
// clear error, and the command end to end on a real `loom train` run.
#include "loom/run/report.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <regex>
#include <sstream>

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

// The x pixel coordinates of a series' polyline.
std::vector<double> xs_of(const std::string& svg, const std::string& run, const std::string& label) {
  const std::string start = "data-run=\"" + run + "\"";
  for (std::size_t at = svg.find(start); at != std::string::npos; at = svg.find(start, at + 1)) {
    const std::size_t title = svg.find("<title>", at);
    if (svg.compare(title + 7, label.size() + 8, label + "</title>") != 0) continue;
    const std::size_t p = svg.find(" points=\"", title) + 9;
    std::istringstream in(svg.substr(p, svg.find('"', p) - p));
    std::vector<double> xs;
    std::string point;
    while (in >> point) xs.push_back(std::stod(point.substr(0, point.find(','))));
    return xs;
  }
  return {};
}

}  // namespace

TEST(Report, ChartsCarryEveryRunsData) {
  TempDir tmp;
  const auto runs = loom::test::two_runs(tmp.path());
  const auto charts = loom::report_charts(runs, loom::ReportAxis::step);
  for (const char* id : {"loss", "loss_per_source", "perplexity", "learning_rate", "grad_norm", "tokens_per_second",
                         "mfu", "eval_hellaswag"})
    EXPECT_NE(find_chart(charts, id), nullptr) << id;
  const auto* loss = find_chart(charts, "loss");
  ASSERT_NE(loss, nullptr);
  // Both runs, train (10 logged steps) and eval (2 evaluations), each named in the legend.
  EXPECT_NE(loss->svg.find("data-run=\"alpha\" data-points=\"10\"><title>alpha train/loss</title>"), std::string::npos);
  EXPECT_NE(loss->svg.find("data-run=\"beta\" data-points=\"10\"><title>beta train/loss</title>"), std::string::npos);
  EXPECT_NE(loss->svg.find("data-run=\"alpha\" data-points=\"2\"><title>alpha eval/loss</title>"), std::string::npos);
  EXPECT_NE(loss->svg.find("<text x=\"100\" y=\"292\">alpha train/loss</text>"), std::string::npos) << loss->svg;
  EXPECT_NE(loss->svg.find(">beta eval/loss</text>"), std::string::npos);
  EXPECT_NE(loss->svg.find(">step</text>"), std::string::npos);
  // Steps 2..20 span the plot: x from its left edge (64) to its right (624), 2 steps apart.
  const auto xs = xs_of(loss->svg, "alpha", "alpha train/loss");
  ASSERT_EQ(xs.size(), 10u);
  EXPECT_DOUBLE_EQ(xs.front(), 64);
  EXPECT_DOUBLE_EQ(xs.back(), 624);
  EXPECT_NEAR(xs[1] - xs[0], 560.0 / 9, 0.1);
  // The mixture's datasets, and the benchmark task's two metrics.
  const auto* sources = find_chart(charts, "loss_per_source");
  EXPECT_NE(sources->svg.find("<title>alpha eval/web/loss</title>"), std::string::npos);
  EXPECT_NE(sources->svg.find("<title>beta eval/code/loss</title>"), std::string::npos);
  const auto* task = find_chart(charts, "eval_hellaswag");
  EXPECT_NE(task->svg.find("<title>alpha eval/hellaswag/acc</title>"), std::string::npos);
  EXPECT_NE(task->svg.find("<title>alpha eval/hellaswag/acc_norm</title>"), std::string::npos);
  // MFU in percent: the ticks of 0.408..0.48 read 40..48.
  EXPECT_NE(find_chart(charts, "mfu")->svg.find(">44</text>"), std::string::npos);
}

TEST(Report, TokenAxisScalesByTokensPerStep) {
  TempDir tmp;
  const auto runs = loom::test::two_runs(tmp.path());
  const auto charts = loom::report_charts(runs, loom::ReportAxis::tokens);
  const auto* loss = find_chart(charts, "loss");
  ASSERT_NE(loss, nullptr);
  EXPECT_NE(loss->svg.find(">tokens</text>"), std::string::npos);
  // alpha: 4 x 32 = 128 tokens a step, beta 2 x 32: beta's last point (1280 tokens) is halfway.
  const auto alpha = xs_of(loss->svg, "alpha", "alpha train/loss");
  const auto beta = xs_of(loss->svg, "beta", "beta train/loss");
  ASSERT_EQ(beta.size(), 10u);
  EXPECT_DOUBLE_EQ(alpha.back(), 624);
  EXPECT_NEAR(beta.back(), 64 + 560.0 * (1280 - 128) / (2560 - 128), 0.1);
}

TEST(Report, PageIsSelfContained) {
  TempDir tmp;
  const auto runs = loom::test::two_runs(tmp.path());
  const std::string html = loom::render_report_html(runs, loom::ReportAxis::step);
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_NE(html.find("content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\""), std::string::npos);
  // Each run's header, config and checkpoints.
  EXPECT_NE(html.find("<h2>Run alpha</h2>"), std::string::npos);
  EXPECT_NE(html.find("<tr><th>optimizer</th><td>adamw</td></tr>"), std::string::npos);
  EXPECT_NE(html.find("train_batch_size: 4"), std::string::npos);
  EXPECT_NE(html.find("<h3>Checkpoints</h3>\n<p>none</p>"), std::string::npos);
  // Text from the files is escaped.
  EXPECT_EQ(html.find("<b>bold</b>"), std::string::npos);
  EXPECT_NE(html.find("&lt;b&gt;bold&lt;/b&gt;"), std::string::npos);
}

TEST(Report, BadInputIsOneErrorNamingFileAndLine) {
  TempDir tmp;
  EXPECT_NE(user_error_of([&] { loom::read_run(tmp.path() / "absent"); }).find("is not a directory"),
            std::string::npos);
  fs::create_directories(tmp.path() / "empty");
  EXPECT_NE(user_error_of([&] { loom::read_run(tmp.path() / "empty"); }).find("has no metrics.jsonl"),
            std::string::npos);
  const std::string good = "{\"step\":1,\"train/loss\":2.5}\n";
  tmp.write("blank/metrics.jsonl", good + "\n" + good);
  EXPECT_NE(user_error_of([&] { loom::read_run(tmp.path() / "blank"); }).find("blank/metrics.jsonl:2: empty line"),
            std::string::npos);
  tmp.write("cut/metrics.jsonl", good + good + "{\"step\":3,\"train/lo");
  EXPECT_NE(user_error_of([&] { loom::read_run(tmp.path() / "cut"); }).find("cut/metrics.jsonl:3: not a JSON object"),
            std::string::npos);
  tmp.write("nostep/metrics.jsonl", "{\"train/loss\":2.5}\n");
  EXPECT_NE(user_error_of([&] { loom::read_run(tmp.path() / "nostep"); }).find("nostep/metrics.jsonl:1: no integer"),
            std::string::npos);
  EXPECT_NE(user_error_of([] { loom::parse_report_axis("time"); }).find("step or tokens"), std::string::npos);
  // No config: no tokens per step to put on a token axis.
  tmp.write("noconfig/metrics.jsonl", good);
  const auto run = loom::read_run(tmp.path() / "noconfig");
  EXPECT_NE(user_error_of([&] { loom::report_charts({run}, loom::ReportAxis::tokens); }).find("--x tokens"),
            std::string::npos);
  // A NaN logged as null is a gap, not an error.
  tmp.write("nan/metrics.jsonl", good + "{\"step\":2,\"train/loss\":null}\n");
  EXPECT_EQ(loom::read_run(tmp.path() / "nan").rows.size(), 2u);
}

TEST(Report, PngsOrASayingSo) {
  TempDir tmp;
  const auto runs = loom::test::two_runs(tmp.path());
  const auto charts = loom::report_charts(runs, loom::ReportAxis::step);
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
  std::ifstream in(html);
  const std::string page((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(page.find("data-run=\"quick\" data-points=\"6\"><title>quick train/loss</title>"), std::string::npos);
  EXPECT_NE(page.find("data-run=\"quick\" data-points=\"2\"><title>quick eval/loss</title>"), std::string::npos);
  EXPECT_NE(page.find("<tr><td>12 (latest)</td>"), std::string::npos);
  EXPECT_EQ(page.find("http://"), std::string::npos);

  const auto missing = loom::test::run_command({LOOM_BINARY, "report", (tmp.path() / "nope").string(), "-o", "x.html"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("nope' is not a directory"), std::string::npos) << missing.err;
  std::ofstream(run / "metrics.jsonl", std::ios::app) << "\n";
  const auto blank = loom::test::run_command({LOOM_BINARY, "report", run.string(), "-o", html.string()});
  EXPECT_EQ(blank.exit_code, 2);
  EXPECT_NE(blank.err.find("metrics.jsonl:7: empty line"), std::string::npos) << blank.err;
}
