// The report in a real browser (issue 23.8): headless Chromium draws the page, its screenshot shows
// every run's curves, the DOM names every run in the legends, and the page asks for nothing from
// the network. Skips, saying so, without chromium (a failure under -DLOOM_REQUIRE_REFERENCE_TESTS=ON:
// scripts/install-deps.sh installs it).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "loom/run/report.hpp"
#include "reference_required.hpp"
#include "report_test_support.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using loom::test::TempDir;

namespace {

struct Browser {
  fs::path profile;

  // Chromium with nothing to reach: every host name fails to resolve, so a request the page made
  // could not succeed even if the Content-Security-Policy let it through.
  std::vector<std::string> argv(const std::vector<std::string>& extra) const {
    std::vector<std::string> a = {LOOM_CHROMIUM,
                                  "--headless",
                                  "--disable-gpu",
                                  "--no-sandbox",
                                  "--no-first-run",
                                  "--hide-scrollbars",
                                  "--user-data-dir=" + profile.string(),
                                  "--host-resolver-rules=MAP * ~NOTFOUND",
                                  "--enable-logging=stderr",
                                  "--v=0"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
};

struct Screenshot {
  std::map<std::string, long> pixels;  // by colour, and "nonwhite"
  std::string log;                     // the browser's stderr: console messages, CSP violations
};

Screenshot screenshot(const Browser& browser, const fs::path& html, const fs::path& png) {
  const auto shot = loom::test::run_command(
      browser.argv({"--window-size=1360,1600", "--screenshot=" + png.string(), "file://" + html.string()}));
  EXPECT_EQ(shot.exit_code, 0) << shot.err;
  Screenshot s;
  s.log = shot.out + shot.err;
  // The two runs' colours (the palette's first two), counted by a standard-library PNG decoder.
  const auto count = loom::test::run_command({"/usr/bin/python3", LOOM_PNG_PIXELS, png.string(), "0072B2", "D55E00"});
  EXPECT_EQ(count.exit_code, 0) << count.err;
  std::istringstream in(count.out);
  std::string name;
  long n = 0;
  while (in >> name >> n) s.pixels[name] = n;
  return s;
}

void write(const fs::path& file, const std::string& text) {
  std::ofstream(file, std::ios::binary) << text;
}

}  // namespace

TEST(ReportBrowser, ChartsDrawAndNothingIsFetched) {
  if (std::string(LOOM_CHROMIUM).empty() || !fs::exists(LOOM_CHROMIUM))
    return loom::test::skip_missing_reference(
        "chromium is not installed (Debian: apt-get install chromium, as scripts/install-deps.sh does; configure "
        "again after installing)");
  TempDir tmp;
  const auto runs = loom::test::two_runs(tmp.path());
  const std::string html = loom::render_report_html(runs, loom::ReportAxis::step);
  const Browser browser{tmp.path() / "profile"};

  const fs::path page = tmp.path() / "report.html";
  write(page, html);
  Screenshot drawn = screenshot(browser, page, tmp.path() / "report.png");

  // The same page with every curve's points removed: what blank charts (frames, ticks, legends,
  // evaluation dots) leave of the runs' colours. The real page must draw far more of each.
  const fs::path blank_page = tmp.path() / "blank.html";
  write(blank_page, std::regex_replace(html, std::regex("points=\"[^\"]*\""), "points=\"\""));
  Screenshot blank = screenshot(browser, blank_page, tmp.path() / "blank.png");
  for (const char* colour : {"0072B2", "D55E00"}) {
    EXPECT_GT(blank.pixels[colour], 0) << colour << ": the legends drew nothing";
    EXPECT_GT(drawn.pixels[colour], 3 * blank.pixels[colour])
        << colour << ": the curves did not draw (" << drawn.pixels[colour] << " pixels of the colour, "
        << blank.pixels[colour] << " without curves)";
  }
  EXPECT_GT(drawn.pixels["nonwhite"], 20000);

  // The run names in the legends, as the browser parsed the page.
  const auto dom = loom::test::run_command(browser.argv({"--dump-dom", "file://" + page.string()}));
  ASSERT_EQ(dom.exit_code, 0) << dom.err;
  for (const char* name : {"alpha", "beta"}) {
    EXPECT_NE(dom.out.find(std::string("<g class=\"legend\">")), std::string::npos);
    EXPECT_TRUE(std::regex_search(
        dom.out, std::regex(std::string("<g class=\"legend\">.*<text[^>]*>") + name + " train/loss</text>")))
        << name << " is not in the rendered legend";
  }

  // Nothing requested: Chromium logs every load the page's policy blocked. A page that asks for an
  // image elsewhere must be caught by this very check.
  const auto blocked = [](const std::string& log) {
    return log.find("Content Security Policy") != std::string::npos ||
           log.find("ERR_NAME_NOT_RESOLVED") != std::string::npos;
  };
  EXPECT_FALSE(blocked(drawn.log)) << drawn.log;
  const fs::path fetching = tmp.path() / "fetching.html";
  write(fetching, std::regex_replace(html, std::regex("<h1>"), "<img src=\"http://example.invalid/x.png\"><h1>"));
  EXPECT_TRUE(blocked(screenshot(browser, fetching, tmp.path() / "fetching.png").log))
      << "an external image went unnoticed: the network check does not work";
}
