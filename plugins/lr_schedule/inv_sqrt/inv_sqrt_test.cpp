// lr_schedule `inv_sqrt`, loaded through the plugin host. With the warmup W and the decay
// starting right after it, the rate is max(peak * min(1, sqrt(timescale / step)), min_lr), which
// makes the expected values easy to work out by hand; they agree with Levanter's
// _inv_sqrt_decay_schedule run on optax.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>
#include <string_view>

#include "loom/error.hpp"
#include "loom/kinds/lr_schedule.hpp"
#include "schedule_test_support.hpp"

namespace {

using loom::test::kTol;

// The schedule configured by the YAML map `options` ("{warmup: 10}").
loom::Handle<loom::LrSchedule> inv_sqrt(std::string_view options = "{}") {
  return loom::test::make_schedule("inv_sqrt", options);
}

TEST(InvSqrtSchedule, FallsAsOneOverSqrtStepAfterTheTimescale) {
  auto s = inv_sqrt("{warmup: 20, timescale: 100}");
  EXPECT_NEAR(s->learning_rate(0, 1000, 1.0), 0.0, kTol);
  EXPECT_NEAR(s->learning_rate(10, 1000, 1.0), 0.5, kTol);
  EXPECT_NEAR(s->learning_rate(20, 1000, 1.0), 1.0, kTol);   // end of warmup: sqrt(100/20) > 1
  EXPECT_NEAR(s->learning_rate(100, 1000, 1.0), 1.0, kTol);  // the timescale: sqrt(100/100)
  EXPECT_NEAR(s->learning_rate(400, 1000, 1.0), 0.5, kTol);  // sqrt(100/400)
  EXPECT_NEAR(s->learning_rate(900, 1000, 1.0), 1.0 / 3.0, kTol);
  EXPECT_NEAR(s->learning_rate(999, 1000, 1.0), std::sqrt(100.0 / 999.0), kTol);
  EXPECT_NEAR(s->learning_rate(400, 1000, 6e-4), 3e-4, 1e-18);
}

TEST(InvSqrtSchedule, IsFlooredAtTheMinimumRate) {
  auto s = inv_sqrt("{warmup: 20, timescale: 100, min_lr_ratio: 0.4}");
  EXPECT_NEAR(s->learning_rate(400, 1000, 1.0), 0.5, kTol);
  EXPECT_NEAR(s->learning_rate(900, 1000, 1.0), 0.4, kTol);  // 1/3 is below the floor
}

TEST(InvSqrtSchedule, LevanterTimescaleKeepsAShortRunAtThePeak) {
  auto s = inv_sqrt();
  // Warmup 10 steps; sqrt(10000 / step) >= 1 for every step of a 1000-step run.
  EXPECT_NEAR(s->learning_rate(5, 1000, 1.0), 0.5, kTol);
  EXPECT_NEAR(s->learning_rate(10, 1000, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(999, 1000, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(40000, 1000, 1.0), 0.5, kTol);  // past the run the decay goes on
}

TEST(InvSqrtSchedule, EachCycleRestartsTheDecayAfterItsOwnWarmup) {
  auto s = inv_sqrt("{warmup: 0, rewarmup: 100, cycles: 2, timescale: 100, min_lr_ratio: 0}");
  // Cycles [0, 400) and [400, 800). The first has no warmup and ends at sqrt(100/400) = 0.5; the
  // second rewarms from 0.5 over 100 steps and decays with count + 100 in place of the step.
  EXPECT_NEAR(s->learning_rate(0, 800, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(399, 800, 1.0), std::sqrt(100.0 / 399.0), kTol);
  EXPECT_NEAR(s->learning_rate(400, 800, 1.0), 0.5, kTol);
  EXPECT_NEAR(s->learning_rate(450, 800, 1.0), 0.75, kTol);
  EXPECT_NEAR(s->learning_rate(500, 800, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(625, 800, 1.0), 2.0 / 3.0, kTol);  // sqrt(100 / (125 + 100))
  EXPECT_NEAR(s->learning_rate(799, 800, 1.0), std::sqrt(100.0 / 399.0), kTol);
}

TEST(InvSqrtSchedule, ANonPositiveTimescaleIsRefused) {
  try {
    inv_sqrt("{timescale: 0}");
    FAIL() << "expected a loom::UserError";
  } catch (const loom::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("lr_schedule.timescale"), std::string::npos) << e.what();
  }
}

}  // namespace
