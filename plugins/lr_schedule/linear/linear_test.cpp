// lr_schedule `linear`, loaded through the plugin host, and with it the cycle structure every
// schedule shares (sdk/include/loom/lr_schedule_cycles.hpp): warmup given as a fraction or as
// steps, a stable phase from `decay`, cycles by count, by end steps and by length, rewarmup, and
// what happens to options that do not fit the run (clamped, or errors). Expected values are worked out by hand in the
// comments, and agree with Levanter's lr_scheduler run on optax.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <string_view>

#include "loom/error.hpp"
#include "loom/kinds/lr_schedule.hpp"
#include "schedule_test_support.hpp"

namespace {

using loom::test::kTol;

// The schedule configured by the YAML map `options` ("{warmup: 10}").
loom::Handle<loom::LrSchedule> linear(std::string_view options = "{}") {
  return loom::test::make_schedule("linear", options);
}

// The message of the UserError `f` throws ("" and a test failure when it throws none).
std::string user_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const loom::UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a loom::UserError";
  return "";
}

// The message of the UserError that learning_rate(step, num_steps, peak) throws.
std::string rate_error(std::string_view options, std::int64_t step, std::int64_t num_steps, double peak) {
  auto s = linear(options);
  return user_error([&] { s->learning_rate(step, num_steps, peak); });
}

TEST(LinearSchedule, LevanterDefaultsWarmUpOnePercentThenDecayToATenthOfThePeak) {
  auto s = linear();
  // 1000 steps: warmup int(0.01 * 1000) = 10 steps from 0, then 990 steps of decay from 1 to 0.1.
  EXPECT_NEAR(s->learning_rate(0, 1000, 1.0), 0.0, kTol);  // the first step of a warmup from 0 (as optax)
  EXPECT_NEAR(s->learning_rate(5, 1000, 1.0), 0.5, kTol);
  EXPECT_NEAR(s->learning_rate(9, 1000, 1.0), 0.9, kTol);
  EXPECT_NEAR(s->learning_rate(10, 1000, 1.0), 1.0, kTol);    // end of warmup: the peak
  EXPECT_NEAR(s->learning_rate(505, 1000, 1.0), 0.55, kTol);  // halfway: 1 - 0.9 * 495/990
  // The last step: 1 - 0.9 * 989/990 = 0.1 + 0.9/990.
  EXPECT_NEAR(s->learning_rate(999, 1000, 1.0), 0.1 + 0.9 / 990.0, kTol);
  // Past the end the rate stays at the minimum.
  EXPECT_NEAR(s->learning_rate(1000, 1000, 1.0), 0.1, kTol);
  EXPECT_NEAR(s->learning_rate(5000, 1000, 1.0), 0.1, kTol);
  // The rate scales with the peak.
  EXPECT_NEAR(s->learning_rate(505, 1000, 6e-4), 3.3e-4, 1e-18);
}

TEST(LinearSchedule, WarmupInStepsAndADecayPhaseLeaveAStablePhaseBetween) {
  auto s = linear("{warmup: 20, decay: 0.5, min_lr_ratio: 0}");
  // 100 steps, peak 2: warmup 20 steps, decay int(0.5 * 100) = 50 steps, stable 30 steps between.
  EXPECT_NEAR(s->learning_rate(0, 100, 2.0), 0.0, kTol);
  EXPECT_NEAR(s->learning_rate(10, 100, 2.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(20, 100, 2.0), 2.0, kTol);  // stable from here
  EXPECT_NEAR(s->learning_rate(49, 100, 2.0), 2.0, kTol);
  EXPECT_NEAR(s->learning_rate(50, 100, 2.0), 2.0, kTol);   // decay starts at the peak
  EXPECT_NEAR(s->learning_rate(75, 100, 2.0), 1.0, kTol);   // 2 * (1 - 25/50)
  EXPECT_NEAR(s->learning_rate(99, 100, 2.0), 0.04, kTol);  // 2 * (1 - 49/50)
}

TEST(LinearSchedule, OneIsAFractionAndAnythingAboveOneIsSteps) {
  // warmup: 1 is the whole run (Levanter's convention), so the peak is only reached after it.
  auto whole = linear("{warmup: 1}");
  EXPECT_NEAR(whole->learning_rate(0, 10, 1.0), 0.0, kTol);
  EXPECT_NEAR(whole->learning_rate(9, 10, 1.0), 0.9, kTol);
  EXPECT_NEAR(whole->learning_rate(10, 10, 1.0), 1.0, kTol);  // no decay phase: the peak holds
  auto two = linear("{warmup: 2}");
  EXPECT_NEAR(two->learning_rate(1, 10, 1.0), 0.5, kTol);
  EXPECT_NEAR(two->learning_rate(2, 10, 1.0), 1.0, kTol);
  // A fraction is truncated to whole steps: int(0.15 * 10) = 1 step of warmup.
  auto fraction = linear("{warmup: 0.15}");
  EXPECT_NEAR(fraction->learning_rate(0, 10, 1.0), 0.0, kTol);
  EXPECT_NEAR(fraction->learning_rate(1, 10, 1.0), 1.0, kTol);
}

TEST(LinearSchedule, EqualCyclesRewarmFromWhereThePreviousCycleEnded) {
  auto s = linear("{warmup: 10, rewarmup: 0.1, cycles: 2}");
  // 100 steps in cycles [0, 50) and [50, 100). Cycle 0: warmup 10, decay 40 to 0.1.
  EXPECT_NEAR(s->learning_rate(0, 100, 1.0), 0.0, kTol);
  EXPECT_NEAR(s->learning_rate(5, 100, 1.0), 0.5, kTol);
  EXPECT_NEAR(s->learning_rate(10, 100, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(30, 100, 1.0), 0.55, kTol);    // 1 - 0.9 * 20/40
  EXPECT_NEAR(s->learning_rate(49, 100, 1.0), 0.1225, kTol);  // 1 - 0.9 * 39/40
  // Cycle 1: rewarmup int(0.1 * 50) = 5 steps from 0.1 back to 1, then decay 45.
  EXPECT_NEAR(s->learning_rate(50, 100, 1.0), 0.1, kTol);
  EXPECT_NEAR(s->learning_rate(52, 100, 1.0), 0.46, kTol);  // 0.1 + 0.9 * 2/5
  EXPECT_NEAR(s->learning_rate(55, 100, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(99, 100, 1.0), 0.12, kTol);  // 1 - 0.9 * 44/45
}

TEST(LinearSchedule, CyclesAtGivenStepsJumpBackToThePeakWithoutRewarmup) {
  auto s = linear("{warmup: 0, min_lr_ratio: 0, cycles: [30, 70]}");
  // Cycles [0, 30), [30, 70), [70, 100), each a full decay from 1 to 0.
  EXPECT_NEAR(s->learning_rate(0, 100, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(15, 100, 1.0), 0.5, kTol);
  EXPECT_NEAR(s->learning_rate(29, 100, 1.0), 1.0 / 30.0, kTol);
  EXPECT_NEAR(s->learning_rate(30, 100, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(50, 100, 1.0), 0.5, kTol);  // 1 - 20/40
  EXPECT_NEAR(s->learning_rate(70, 100, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(99, 100, 1.0), 1.0 / 30.0, kTol);
}

TEST(LinearSchedule, CycleLengthInStepsGivesTheRemainderToTheLastCycle) {
  auto s = linear("{warmup: 0, min_lr_ratio: 0, cycle_length: 25}");
  // 110 steps: cycles end at 25, 50, 75, and the last one runs [75, 110): 35 steps.
  EXPECT_NEAR(s->learning_rate(24, 110, 1.0), 0.04, kTol);  // 1 - 24/25
  EXPECT_NEAR(s->learning_rate(25, 110, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(75, 110, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(82, 110, 1.0), 0.8, kTol);  // 1 - 7/35
  EXPECT_NEAR(s->learning_rate(109, 110, 1.0), 1.0 / 35.0, kTol);
}

TEST(LinearSchedule, CycleLengthAsAFractionOrAListOfLengths) {
  auto quarter = linear("{warmup: 0, min_lr_ratio: 0, cycle_length: 0.25}");
  // 100 steps: four cycles of 25.
  EXPECT_NEAR(quarter->learning_rate(24, 100, 1.0), 0.04, kTol);
  EXPECT_NEAR(quarter->learning_rate(50, 100, 1.0), 1.0, kTol);
  EXPECT_NEAR(quarter->learning_rate(99, 100, 1.0), 0.04, kTol);
  auto listed = linear("{warmup: 0, min_lr_ratio: 0, cycle_length: [10, 20]}");
  // 40 steps: cycles [0, 10), [10, 30) and the rest [30, 40).
  EXPECT_NEAR(listed->learning_rate(5, 40, 1.0), 0.5, kTol);
  EXPECT_NEAR(listed->learning_rate(10, 40, 1.0), 1.0, kTol);
  EXPECT_NEAR(listed->learning_rate(20, 40, 1.0), 0.5, kTol);
  EXPECT_NEAR(listed->learning_rate(30, 40, 1.0), 1.0, kTol);
  EXPECT_NEAR(listed->learning_rate(35, 40, 1.0), 0.5, kTol);
}

TEST(LinearSchedule, IsAPureFunctionOfItsArguments) {
  auto s = linear("{warmup: 10, rewarmup: 5, cycles: 3}");
  const double late = s->learning_rate(250, 300, 1.0);
  const double early = s->learning_rate(3, 300, 1.0);
  EXPECT_EQ(s->learning_rate(250, 300, 1.0), late);
  EXPECT_EQ(s->learning_rate(3, 300, 1.0), early);
  EXPECT_NEAR(early, 0.3, kTol);
}

// The lines check(num_steps) returns, joined.
std::string check_warnings(std::string_view options, std::int64_t num_steps) {
  std::string out;
  for (const auto& w : linear(options)->check(num_steps)) out += w + "\n";
  return out;
}

TEST(LinearSchedule, LengthsInStepsThatDoNotFitAShortRunAreClampedWithAWarningEach) {
  std::string w = check_warnings("{warmup: 500}", 300);
  EXPECT_EQ(w.rfind("schedule.yaml:1:", 0), 0u) << w;  // where the option was written
  EXPECT_NE(w.find("lr_schedule.warmup: 500 steps do not fit in the run of 300 steps; clamped to 300"),
            std::string::npos)
      << w;
  EXPECT_EQ(std::count(w.begin(), w.end(), '\n'), 1) << w;

  // 30 steps of warmup, then the decay takes the 70 steps left.
  w = check_warnings("{warmup: 30, decay: 80}", 100);
  EXPECT_NE(w.find("lr_schedule.decay: 80 steps of decay after 30 steps of warmup do not fit in the run of 100 "
                   "steps; clamped to 70"),
            std::string::npos)
      << w;
  auto s = linear("{warmup: 30, decay: 80, min_lr_ratio: 0}");
  EXPECT_NEAR(s->learning_rate(30, 100, 1.0), 1.0, kTol);
  EXPECT_NEAR(s->learning_rate(65, 100, 1.0), 0.5, kTol);  // half way down the 70 steps

  // Reported once, although both cycles clamp it.
  w = check_warnings("{rewarmup: 60, cycles: 3}", 120);
  EXPECT_NE(w.find("lr_schedule.rewarmup: 60 steps do not fit in the cycle of steps [40, 80)"), std::string::npos) << w;
  EXPECT_EQ(std::count(w.begin(), w.end(), '\n'), 1) << w;

  // A fraction always fits; a run long enough reports nothing.
  EXPECT_EQ(check_warnings("{warmup: 0.5}", 3), "");
  EXPECT_EQ(check_warnings("{warmup: 30, decay: 60}", 100), "");
}

TEST(LinearSchedule, OptionsThatFitNoRunAreUserErrorsNamingTheOption) {
  // Fractions of the run that add up to more than it are a mistake whatever the run's length.
  std::string e = rate_error("{warmup: 0.5, decay: 0.6}", 0, 100, 1.0);
  EXPECT_NE(e.find("lr_schedule.decay: 60 steps of decay after 50 steps of warmup do not fit in the run of 100"),
            std::string::npos)
      << e;
  e = user_error([] { linear("{warmup: 0.5, decay: 0.6}")->check(100); });
  EXPECT_NE(e.find("lr_schedule.decay"), std::string::npos) << e;

  e = rate_error("{cycles: 5}", 0, 3, 1.0);
  EXPECT_NE(e.find("lr_schedule.cycles: 5 cycles do not fit in a run of 3 steps"), std::string::npos) << e;

  e = rate_error("{cycles: [50, 150]}", 0, 100, 1.0);
  EXPECT_NE(e.find("lr_schedule.cycles: the cycle ending at step 150 is past the end of the run"), std::string::npos)
      << e;

  e = rate_error("{cycle_length: [60, 60]}", 0, 100, 1.0);
  EXPECT_NE(e.find("lr_schedule.cycle_length: the cycles add up to 120 steps"), std::string::npos) << e;

  e = rate_error("{}", 0, 0, 1.0);
  EXPECT_NE(e.find("at least one step"), std::string::npos) << e;
}

TEST(LinearSchedule, MalformedOptionsAreUserErrorsAtCreation) {
  // Negative lengths and ratios out of [0, 1] are refused by the declared ranges.
  std::string e = user_error([] { linear("{min_lr_ratio: -0.1}"); });
  EXPECT_NE(e.find("lr_schedule.min_lr_ratio"), std::string::npos) << e;
  e = user_error([] { linear("{min_lr_ratio: 1.5}"); });
  EXPECT_NE(e.find("lr_schedule.min_lr_ratio"), std::string::npos) << e;
  e = user_error([] { linear("{warmup: -5}"); });
  EXPECT_NE(e.find("lr_schedule.warmup"), std::string::npos) << e;
  e = user_error([] { linear("{decay: -0.5}"); });
  EXPECT_NE(e.find("lr_schedule.decay"), std::string::npos) << e;

  // Above 1 a length counts steps, so it must be whole; the message points at the file.
  e = user_error([] { linear("{warmup: 2.5}"); });
  EXPECT_NE(e.find("schedule.yaml:1:"), std::string::npos) << e;
  EXPECT_NE(e.find("lr_schedule.warmup: expected a fraction (<= 1) or a whole number of steps (> 1), got 2.5"),
            std::string::npos)
      << e;

  e = user_error([] { linear("{cycles: 0}"); });
  EXPECT_NE(e.find("lr_schedule.cycles: expected a number of cycles"), std::string::npos) << e;
  e = user_error([] { linear("{cycles: [50, 30]}"); });
  EXPECT_NE(e.find("lr_schedule.cycles"), std::string::npos) << e;
  e = user_error([] { linear("{cycles: two}"); });
  EXPECT_NE(e.find("lr_schedule.cycles"), std::string::npos) << e;
  e = user_error([] { linear("{cycle_length: 1.5}"); });
  EXPECT_NE(e.find("lr_schedule.cycle_length"), std::string::npos) << e;
  e = user_error([] { linear("{cycles: 2, cycle_length: 10}"); });
  EXPECT_NE(e.find("give one of them"), std::string::npos) << e;
}

TEST(LinearSchedule, ANegativeStepIsABugInTheCaller) {
  EXPECT_THROW(linear()->learning_rate(-1, 100, 1.0), loom::InternalError);
}

}  // namespace
