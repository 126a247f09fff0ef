// lr_schedule `wsd`, loaded through the plugin host: warmup, a stable peak, and a decay over the
// last `decay` of each cycle in one of three shapes. Expected values are worked out by hand; the
// linear shape agrees with Levanter's lr_scheduler (lr_schedule: linear, decay: 0.2) on optax.
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
loom::Handle<loom::LrSchedule> wsd(std::string_view options = "{}") {
  return loom::test::make_schedule("wsd", options);
}

TEST(WsdSchedule, DefaultsHoldThePeakUntilTheLastFifth) {
  auto s = wsd();
  // 1000 steps: warmup 10, stable 790, linear decay over int(0.2 * 1000) = 200 steps to 0.1.
  EXPECT_NEAR(s->learning_rate(0, 1000, 1.0), 0.0, kTol);
  EXPECT_NEAR(s->learning_rate(5, 1000, 1.0), 0.5, kTol);
  EXPECT_NEAR(s->learning_rate(10, 1000, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(400, 1000, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(799, 1000, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(800, 1000, 1.0), 1.0, kTol);     // the decay starts at the peak
  EXPECT_NEAR(s->learning_rate(900, 1000, 1.0), 0.55, kTol);    // 1 - 0.9 * 100/200
  EXPECT_NEAR(s->learning_rate(999, 1000, 1.0), 0.1045, kTol);  // 1 - 0.9 * 199/200
  EXPECT_NEAR(s->learning_rate(1000, 1000, 1.0), 0.1, kTol);
}

TEST(WsdSchedule, OneMinusSqrtDecay) {
  auto s = wsd("{decay_shape: 1-sqrt}");
  // rate = 0.1 + 0.9 * (1 - sqrt(t)) over the last 200 steps.
  EXPECT_NEAR(s->learning_rate(800, 1000, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(850, 1000, 1.0), 0.55, kTol);  // t = 1/4
  EXPECT_NEAR(s->learning_rate(900, 1000, 1.0), 0.1 + 0.9 * (1.0 - std::sqrt(0.5)), kTol);
  EXPECT_NEAR(s->learning_rate(1000, 1000, 1.0), 0.1, kTol);
}

TEST(WsdSchedule, CosineDecay) {
  auto s = wsd("{decay_shape: cosine}");
  EXPECT_NEAR(s->learning_rate(850, 1000, 1.0), 0.1 + 0.45 * (1.0 + std::sqrt(0.5)), kTol);  // t = 1/4
  EXPECT_NEAR(s->learning_rate(900, 1000, 1.0), 0.55, kTol);
  EXPECT_NEAR(s->learning_rate(950, 1000, 1.0), 0.1 + 0.45 * (1.0 - std::sqrt(0.5)), kTol);
}

TEST(WsdSchedule, DecayInStepsAndToZero) {
  auto s = wsd("{warmup: 0, decay: 100, min_lr_ratio: 0}");
  EXPECT_NEAR(s->learning_rate(0, 1000, 2.0), 2.0, kTol);  // no warmup
  EXPECT_NEAR(s->learning_rate(899, 1000, 2.0), 2.0, kTol);
  EXPECT_NEAR(s->learning_rate(950, 1000, 2.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(999, 1000, 2.0), 0.02, kTol);
}

TEST(WsdSchedule, CyclesRewarmFromZeroAndDecayAgain) {
  auto s = wsd("{warmup: 0.02, rewarmup: 0.02, min_lr_ratio: 0, cycles: 2}");
  // Cycles [0, 500) and [500, 1000): warmup 10, stable 390, decay 100 each.
  EXPECT_NEAR(s->learning_rate(400, 1000, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(450, 1000, 1.0), 0.5, kTol);
  EXPECT_NEAR(s->learning_rate(499, 1000, 1.0), 0.01, kTol);
  EXPECT_NEAR(s->learning_rate(500, 1000, 1.0), 0.0, kTol);  // the second cycle rewarms from 0
  EXPECT_NEAR(s->learning_rate(505, 1000, 1.0), 0.5, kTol);
  EXPECT_NEAR(s->learning_rate(510, 1000, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(899, 1000, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(950, 1000, 1.0), 0.5, kTol);
}

TEST(WsdSchedule, AnUnknownShapeIsRefusedWithTheChoices) {
  try {
    wsd("{decay_shape: sqrt}");
    FAIL() << "expected a loom::UserError";
  } catch (const loom::UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("lr_schedule.decay_shape"), std::string::npos) << m;
    EXPECT_NE(m.find("linear, 1-sqrt, cosine"), std::string::npos) << m;
  }
}

}  // namespace
