// lr_schedule `cosine`, loaded through the plugin host. Expected values are worked out by hand
// (cos written through identities where that is clearer), and agree with Levanter's lr_scheduler
// run on optax (optax.cosine_decay_schedule with alpha = min_lr_ratio).
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
loom::Handle<loom::LrSchedule> cosine(std::string_view options = "{}") {
  return loom::test::make_schedule("cosine", options);
}

TEST(CosineSchedule, LevanterDefaultsOnAThousandSteps) {
  auto s = cosine();
  // Warmup int(0.01 * 1000) = 10 steps, then half a cosine over 990 steps from 1 to 0.1:
  //   rate = 0.1 + 0.45 * (1 + cos(pi * t)), t = (step - 10) / 990.
  EXPECT_NEAR(s->learning_rate(0, 1000, 1.0), 0.0, kTol);
  EXPECT_NEAR(s->learning_rate(5, 1000, 1.0), 0.5, kTol);
  EXPECT_NEAR(s->learning_rate(10, 1000, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(505, 1000, 1.0), 0.55, kTol);  // t = 1/2: cos = 0
  // The last step, t = 989/990: cos(pi - pi/990) = -cos(pi/990).
  EXPECT_NEAR(s->learning_rate(999, 1000, 1.0), 0.1 + 0.45 * (1.0 - std::cos(std::numbers::pi / 990.0)), kTol);
  EXPECT_NEAR(s->learning_rate(1000, 1000, 1.0), 0.1, kTol);
  EXPECT_NEAR(s->learning_rate(505, 1000, 3e-4), 1.65e-4, 1e-18);
}

TEST(CosineSchedule, QuartersOfTheDecay) {
  auto s = cosine("{warmup: 10}");
  // 110 steps: 10 of warmup, 100 of decay.
  EXPECT_NEAR(s->learning_rate(35, 110, 1.0), 0.1 + 0.45 * (1.0 + std::sqrt(0.5)), kTol);  // t = 1/4
  EXPECT_NEAR(s->learning_rate(60, 110, 1.0), 0.55, kTol);                                 // t = 1/2
  EXPECT_NEAR(s->learning_rate(85, 110, 1.0), 0.1 + 0.45 * (1.0 - std::sqrt(0.5)), kTol);  // t = 3/4
  EXPECT_NEAR(s->learning_rate(110, 110, 1.0), 0.1, kTol);
}

TEST(CosineSchedule, NanoGptShakespeareRecipe) {
  // lr 1e-3 cosine to 1e-4 over 2000 steps with 100 of warmup (configs/shakespeare-char.yaml).
  auto s = cosine("{warmup: 100, min_lr_ratio: 0.1}");
  EXPECT_NEAR(s->learning_rate(0, 2000, 1e-3), 0.0, 1e-15);
  EXPECT_NEAR(s->learning_rate(50, 2000, 1e-3), 5e-4, 1e-15);
  EXPECT_NEAR(s->learning_rate(100, 2000, 1e-3), 1e-3, 1e-15);
  EXPECT_NEAR(s->learning_rate(1050, 2000, 1e-3), 5.5e-4, 1e-15);  // t = 950/1900
  EXPECT_NEAR(s->learning_rate(1999, 2000, 1e-3), 1e-4 + 4.5e-4 * (1.0 - std::cos(std::numbers::pi / 1900.0)), 1e-15);
}

TEST(CosineSchedule, CyclesWithRewarmup) {
  auto s = cosine("{warmup: 0.1, rewarmup: 0.1, cycles: 2}");
  // Cycles [0, 100) and [100, 200), each 10 steps of warmup and 90 of decay; the second warmup
  // rises from the 0.1 the first cycle ended at.
  EXPECT_NEAR(s->learning_rate(99, 200, 1.0), 0.1 + 0.45 * (1.0 - std::cos(std::numbers::pi / 90.0)), kTol);
  EXPECT_NEAR(s->learning_rate(100, 200, 1.0), 0.1, kTol);
  EXPECT_NEAR(s->learning_rate(105, 200, 1.0), 0.55, kTol);  // halfway up the rewarmup
  EXPECT_NEAR(s->learning_rate(110, 200, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(155, 200, 1.0), 0.55, kTol);  // halfway down the second decay
}

TEST(CosineSchedule, ADecayPhaseLeavesAStablePeakBeforeIt) {
  auto s = cosine("{warmup: 10, decay: 50, min_lr_ratio: 0}");
  // 100 steps: warmup 10, stable 40, cosine over the last 50 to 0.
  EXPECT_NEAR(s->learning_rate(30, 100, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(49, 100, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(75, 100, 1.0), 0.5, kTol);
  EXPECT_NEAR(s->learning_rate(100, 100, 1.0), 0.0, kTol);
}

TEST(CosineSchedule, AWarmupLongerThanTheRunIsClampedToItWithOneWarning) {
  auto s = cosine("{warmup: 200}");
  const auto warnings = s->check(150);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("lr_schedule.warmup: 200 steps do not fit in the run of 150 steps; clamped to 150"),
            std::string::npos)
      << warnings[0];
  // The whole run warms up; no decay is left.
  EXPECT_NEAR(s->learning_rate(75, 150, 1.0), 0.5, kTol);
  EXPECT_NEAR(s->learning_rate(149, 150, 1.0), 149.0 / 150.0, kTol);
}

}  // namespace
