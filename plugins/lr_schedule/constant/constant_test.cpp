// lr_schedule `constant`, loaded through the plugin host: the peak after a linear warmup.
// Expected values agree with Levanter's lr_scheduler (lr_schedule: constant) run on optax.
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
loom::Handle<loom::LrSchedule> constant(std::string_view options = "{}") {
  return loom::test::make_schedule("constant", options);
}

TEST(ConstantSchedule, WarmsUpThenHoldsThePeak) {
  auto s = constant();
  // Warmup int(0.01 * 1000) = 10 steps.
  EXPECT_NEAR(s->learning_rate(0, 1000, 1.0), 0.0, kTol);
  EXPECT_NEAR(s->learning_rate(5, 1000, 1.0), 0.5, kTol);
  EXPECT_NEAR(s->learning_rate(10, 1000, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(500, 1000, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(999, 1000, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(5000, 1000, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(7, 1000, 6e-4), 4.2e-4, 1e-18);
}

TEST(ConstantSchedule, WithoutWarmupEveryStepIsThePeak) {
  auto s = constant("{warmup: 0}");
  EXPECT_NEAR(s->learning_rate(0, 10, 3e-4), 3e-4, 1e-18);
  EXPECT_NEAR(s->learning_rate(9, 10, 3e-4), 3e-4, 1e-18);
}

TEST(ConstantSchedule, DecayAndCyclesLeaveTheRateAtThePeak) {
  // Accepted so that a config switches schedules by `type` alone; a constant rate has nothing to
  // decay, and a rewarmup starts from the peak it ended at.
  auto s = constant("{warmup: 10, decay: 0.5, min_lr_ratio: 0, rewarmup: 10, cycles: 2}");
  EXPECT_NEAR(s->learning_rate(499, 1000, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(500, 1000, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(505, 1000, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(999, 1000, 1.0), 1.0, kTol);
}

TEST(ConstantSchedule, AWarmupLongerThanTheRunIsClampedToItWithOneWarning) {
  // A run shortened from the command line: the 20-step warmup takes the whole 10-step run.
  auto s = constant("{warmup: 20}");
  const auto warnings = s->check(10);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("lr_schedule.warmup: 20 steps do not fit in the run of 10 steps; clamped to 10"),
            std::string::npos)
      << warnings[0];
  EXPECT_NEAR(s->learning_rate(0, 10, 1.0), 0.0, kTol);
  EXPECT_NEAR(s->learning_rate(5, 10, 1.0), 0.5, kTol);
  EXPECT_NEAR(s->learning_rate(9, 10, 1.0), 0.9, kTol);
  EXPECT_TRUE(s->check(20).empty());  // it fits a run of its own length
}

}  // namespace
