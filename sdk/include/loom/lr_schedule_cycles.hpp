// Levanter's learning-rate schedule structure (OptimizerConfig.lr_scheduler), shared by loom's
// lr_schedule plugins and open to out-of-tree ones. A run is split into one or more cycles, and
// each cycle runs three phases:
//
//   [warmup] [stable] [decay]
//
//   warmup  rises linearly from where the previous cycle ended (0 in the first cycle) to the peak;
//   stable  holds the peak;
//   decay   the schedule's own shape, from the peak towards min_lr_ratio * peak.
//
// Lengths are written the Levanter way: a number <= 1 is a fraction of the span it divides
// (truncated to whole steps), a whole number > 1 is a count of steps. So `warmup: 0.05` is 5% of
// the first cycle, `warmup: 200` is 200 steps, and `warmup: 1` is the whole cycle (not one step).
//
// Options (declared by CycledLrSchedule::declare_options):
//   warmup        warmup of the first cycle (fraction of the cycle, or steps);
//   decay         decay phase of each cycle (fraction of that cycle, or steps); null means the
//                 rest of the cycle after warmup, so there is no stable phase;
//   min_lr_ratio  the rate a decay ends at, as a fraction of the peak;
//   rewarmup      warmup of every cycle after the first, which rises from the rate the previous
//                 cycle ended at; 0 jumps straight back to the peak;
//   cycles        a number of equal cycles, or the list of steps at which cycles end;
//   cycle_length  the length of every cycle (fraction of the run, or steps; the last cycle takes
//                 the remainder), or the list of the cycles' lengths in steps.
//
// Like optax, the first step of a warmup from 0 has rate 0, and a decay of D steps reaches its
// end value at step D of the phase, one past the last step of a cycle that ends with it.
//
// A length given in steps that does not fit its cycle is clamped, so that a run shortened from
// the command line (`trainer.num_train_steps=5` on a config with `warmup: 50`) still runs: a
// warmup (or rewarmup) longer than its cycle takes the whole cycle, and a decay that does not fit
// after the warmup takes what is left. check() reports each clamp once; the trainer prints it as
// a warning. Lengths that fit no run (fractions adding up to more than 1, more cycles than steps,
// cycle ends past the end of the run) stay errors.
//
// A schedule derives from CycledLrSchedule and implements decay_rate(); learning_rate() is final.
// Everything is computed from the arguments on each call: no state, safe from any thread.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/error.hpp"
#include "loom/kinds/lr_schedule.hpp"
#include "loom/options.hpp"
#include "loom/value.hpp"

namespace loom {

// One cycle of a run: steps [start, end), made of warmup + stable + decay steps.
struct LrCycle {
  std::int64_t start = 0;
  std::int64_t end = 0;
  std::int64_t warmup = 0;
  std::int64_t stable = 0;
  std::int64_t decay = 0;
};

class CycledLrSchedule : public LrSchedule {
 public:
  // The defaults a schedule declares its cycle options with (Levanter's OptimizerConfig ones
  // unless a schedule has a reason to differ, as WSD does for `decay`).
  struct Defaults {
    double warmup = 0.01;
    std::optional<double> decay;  // null: the rest of the cycle
    double min_lr_ratio = 0.1;
  };

  static void declare_options(OptionSchema& s, const Defaults& d) {
    s.number("warmup", d.warmup,
             "Warmup of the first cycle, rising linearly from 0 to the peak: a fraction (<= 1) of the cycle, or "
             "whole steps (> 1).")
        .min(0.0);
    const std::string decay_doc =
        "Decay phase of each cycle: a fraction (<= 1) of the cycle, or whole steps (> 1); null: the rest of the "
        "cycle after warmup. Steps left between warmup and decay hold the peak.";
    (d.decay ? s.number("decay", *d.decay, decay_doc).nullable() : s.number("decay", std::nullopt, decay_doc)).min(0.0);
    s.number("min_lr_ratio", d.min_lr_ratio, "The rate a decay ends at, as a fraction of the peak.").range(0.0, 1.0);
    s.number("rewarmup", 0.0,
             "Warmup of every cycle after the first, from the rate the previous cycle ended at back to the peak: a "
             "fraction (<= 1) of the cycle, or whole steps (> 1); 0 jumps straight back.")
        .min(0.0);
    s.any("cycles", Value(),
          "Number of equal cycles (an integer), or the list of steps at which cycles end; null: one cycle. At most "
          "one of `cycles` and `cycle_length`.");
    s.any("cycle_length", Value(),
          "Length of every cycle, a fraction (<= 1) of the run or whole steps (> 1), the last cycle taking the "
          "remainder; or the list of the cycles' lengths in steps. Null: see `cycles`.");
  }

  explicit CycledLrSchedule(const Options& o)
      : path_(o.path().empty() ? std::string(kind) : o.path()),
        warmup_(read_length(o, "warmup")),
        rewarmup_(read_length(o, "rewarmup")),
        min_lr_ratio_(o.get<double>("min_lr_ratio")) {
    if (!o.is_null("decay")) decay_ = read_length(o, "decay");
    // Errors found later, once the run's length is known, still point at the option's line.
    for (const char* name : {"warmup", "decay", "rewarmup", "cycles", "cycle_length"})
      locations_.emplace_back(name, location_prefix(o.raw(name)));
    read_cycles(o);
  }

  double learning_rate(std::int64_t step, std::int64_t num_steps, double peak) const final {
    if (step < 0)
      throw InternalError(path_ + ": the learning rate was asked for step " + std::to_string(step) +
                          "; steps count from 0");
    const std::vector<LrCycle> all = cycles(num_steps);
    // Steps past the end of the run stay in the last cycle's decay, as optax's join_schedules does.
    std::size_t c = 0;
    while (c + 1 < all.size() && step >= all[c + 1].start) ++c;
    const LrCycle& cycle = all[c];
    const double min_lr = peak * min_lr_ratio_;
    const double from = c == 0 ? 0.0 : end_rate(all[c - 1], peak, min_lr);

    std::int64_t offset = step - cycle.start;
    if (offset < cycle.warmup)
      return from + (peak - from) * static_cast<double>(offset) / static_cast<double>(cycle.warmup);
    offset -= cycle.warmup;
    if (offset < cycle.stable) return peak;
    offset -= cycle.stable;
    return decay_rate({offset, cycle.decay, cycle.warmup, peak, min_lr});
  }

  std::vector<std::string> check(std::int64_t num_steps) const final {
    std::vector<std::string> clamped;
    cycles(num_steps, &clamped);
    return clamped;
  }

  // The cycles of a run of `num_steps` steps. Lengths in steps that do not fit are clamped (see
  // above), with one line per clamped option appended to `clamped` when given. Throws UserError,
  // naming the option, when the options fit no run (fractions of a cycle adding up to more than
  // it, more cycles than steps, cycle ends past the end of the run).
  std::vector<LrCycle> cycles(std::int64_t num_steps, std::vector<std::string>* clamped = nullptr) const {
    if (num_steps < 1)
      throw UserError(path_ + ": a schedule needs a run of at least one step, got " + std::to_string(num_steps) +
                      " training steps");
    std::vector<std::int64_t> ends;  // where each cycle ends, the last one at num_steps
    switch (cycle_mode_) {
      case CycleMode::one:
        break;
      case CycleMode::count:
        if (cycle_count_ > num_steps)
          option_error("cycles", std::to_string(cycle_count_) + " cycles do not fit in a run of " +
                                     std::to_string(num_steps) + " steps");
        // Levanter: int(total / cycles * (i + 1)).
        for (std::int64_t i = 0; i + 1 < cycle_count_; ++i)
          ends.push_back(static_cast<std::int64_t>(static_cast<double>(num_steps) / static_cast<double>(cycle_count_) *
                                                   static_cast<double>(i + 1)));
        break;
      case CycleMode::ends:
        for (std::int64_t e : cycle_ends_) {
          if (e > num_steps)
            option_error("cycles", "the cycle ending at step " + std::to_string(e) + " is past the end of the run (" +
                                       std::to_string(num_steps) + " steps)");
          ends.push_back(e);
        }
        break;
      case CycleMode::length: {
        const std::int64_t length = length_in_steps(cycle_length_, num_steps);
        if (length < 1)
          option_error("cycle_length", "a cycle of " + format_length(cycle_length_) + " of a run of " +
                                           std::to_string(num_steps) + " steps is shorter than one step");
        // Levanter: cycles end at i * length for i in [1, total // length); the last one takes the remainder.
        for (std::int64_t i = 1; i < num_steps / length; ++i) ends.push_back(i * length);
        break;
      }
      case CycleMode::lengths: {
        std::int64_t sum = 0;
        for (std::int64_t l : cycle_lengths_) ends.push_back(sum += l);
        if (sum > num_steps)
          option_error("cycle_length", "the cycles add up to " + std::to_string(sum) + " steps, more than the run's " +
                                           std::to_string(num_steps) + " steps");
        break;
      }
    }
    if (ends.empty() || ends.back() != num_steps) ends.push_back(num_steps);

    std::vector<LrCycle> out;
    out.reserve(ends.size());
    std::int64_t start = 0;
    for (std::int64_t end : ends) {
      const bool first = out.empty();
      if (end <= start)
        option_error(cycle_option(), "the cycle starting at step " + std::to_string(start) + " would have no steps");
      LrCycle cycle;
      cycle.start = start;
      cycle.end = end;
      const std::int64_t span = end - start;
      const char* warmup_name = first ? "warmup" : "rewarmup";
      const double warmup_length = first ? warmup_ : rewarmup_;
      cycle.warmup = length_in_steps(warmup_length, span);
      if (cycle.warmup > span) {
        note_clamp(clamped, warmup_name,
                   std::to_string(cycle.warmup) + " steps do not fit in " + describe_cycle(cycle, ends) + " of " +
                       std::to_string(span) + " steps; clamped to " + std::to_string(span) + " (no decay follows)");
        cycle.warmup = span;
      }
      cycle.decay = decay_ ? length_in_steps(*decay_, span) : span - cycle.warmup;
      if (cycle.warmup + cycle.decay > span) {
        const std::string what = std::to_string(cycle.decay) + " steps of decay after " + std::to_string(cycle.warmup) +
                                 " steps of " + warmup_name + " do not fit in " + describe_cycle(cycle, ends) + " of " +
                                 std::to_string(span) + " steps";
        // Fractions of a cycle that add up to more than it fit no run: a mistake, not a short run.
        if (warmup_length <= 1.0 && (!decay_ || *decay_ <= 1.0)) option_error("decay", what);
        cycle.decay = span - cycle.warmup;
        note_clamp(clamped, "decay", what + "; clamped to " + std::to_string(cycle.decay));
      }
      cycle.stable = span - cycle.warmup - cycle.decay;
      out.push_back(cycle);
      start = end;
    }
    return out;
  }

  double min_lr_ratio() const { return min_lr_ratio_; }

  // A length written the Levanter way, in steps of a span of `span` steps: a fraction (<= 1) of
  // it, truncated, or whole steps (> 1).
  static std::int64_t length_in_steps(double fraction_or_steps, std::int64_t span) {
    if (fraction_or_steps <= 1.0) return static_cast<std::int64_t>(fraction_or_steps * static_cast<double>(span));
    return static_cast<std::int64_t>(fraction_or_steps);
  }

 protected:
  // Where the rate is `count` steps into a decay phase.
  struct DecayPoint {
    std::int64_t count;         // steps since the phase began; > decay_steps only past the end of the run
    std::int64_t decay_steps;   // the phase's length; 0 when the cycle has no decay
    std::int64_t warmup_steps;  // the warmup of this cycle (inverse square root uses it)
    double peak;
    double min_lr;  // peak * min_lr_ratio
  };

  // The rate at `p`. Also called with count == decay_steps for the rate a cycle ends at (where
  // the next cycle's warmup starts), so it must accept decay_steps == 0.
  virtual double decay_rate(const DecayPoint& p) const = 0;

  // "<file:line:column: ><path>.<option>: <message>".
  std::string option_message(std::string_view option, const std::string& message) const {
    std::string where;
    for (const auto& [name, prefix] : locations_)
      if (name == option) where = prefix;
    return where + path_ + "." + std::string(option) + ": " + message;
  }

  [[noreturn]] void option_error(std::string_view option, const std::string& message) const {
    throw UserError(option_message(option, message));
  }

  // Appends the clamp of `option` to `clamped`, once per option (the first cycle it happens in).
  void note_clamp(std::vector<std::string>* clamped, std::string_view option, const std::string& message) const {
    if (!clamped) return;
    const std::string prefix = path_ + "." + std::string(option) + ":";
    for (const auto& line : *clamped)
      if (line.find(prefix) != std::string::npos) return;
    clamped->push_back(option_message(option, message));
  }

  const std::string& path() const { return path_; }

 private:
  enum class CycleMode { one, count, ends, length, lengths };

  const char* cycle_option() const {
    return cycle_mode_ == CycleMode::length || cycle_mode_ == CycleMode::lengths ? "cycle_length" : "cycles";
  }

  double end_rate(const LrCycle& cycle, double peak, double min_lr) const {
    return decay_rate({cycle.decay, cycle.decay, cycle.warmup, peak, min_lr});
  }

  static std::string location_prefix(const Value& v) { return v.location().known() ? v.location().str() + ": " : ""; }

  static std::string format_length(double v) {
    if (v <= 1.0) {
      std::string s = std::to_string(v);
      while (s.size() > 1 && s.back() == '0') s.pop_back();
      if (!s.empty() && s.back() == '.') s.pop_back();
      return s;
    }
    return std::to_string(static_cast<std::int64_t>(v)) + " steps";
  }

  std::string describe_cycle(const LrCycle& cycle, const std::vector<std::int64_t>& ends) const {
    if (ends.size() == 1) return "the run";
    return "the cycle of steps [" + std::to_string(cycle.start) + ", " + std::to_string(cycle.end) + ")";
  }

  // A length option: >= 0 (the schema checks), and a whole number when above 1.
  static double read_length(const Options& o, std::string_view name) {
    const double v = o.get<double>(name);
    if (v > 1.0 && v != std::floor(v)) {
      const Value& raw = o.raw(name);
      throw UserError(location_prefix(raw) + (o.path().empty() ? std::string(kind) : o.path()) + "." +
                      std::string(name) + ": expected a fraction (<= 1) or a whole number of steps (> 1), got " +
                      raw.describe());
    }
    return v;
  }

  [[noreturn]] void bad_cycles(const Value& v, std::string_view name, const std::string& expected) const {
    throw UserError(location_prefix(v) + path_ + "." + std::string(name) + ": expected " + expected + ", got " +
                    v.describe());
  }

  // A list of positive integers (strictly increasing when `increasing`).
  std::vector<std::int64_t> positive_integers(const Value& v, std::string_view name, const std::string& expected,
                                              bool increasing) const {
    std::vector<std::int64_t> out;
    for (const Value& e : v.as_list()) {
      if (!e.is_int() || e.as_int() < 1) bad_cycles(e, name, expected);
      if (increasing && !out.empty() && e.as_int() <= out.back()) bad_cycles(v, name, expected);
      out.push_back(e.as_int());
    }
    if (out.empty()) bad_cycles(v, name, expected);
    return out;
  }

  void read_cycles(const Options& o) {
    const Value& cycles = o.raw("cycles");
    const Value& length = o.raw("cycle_length");
    if (!cycles.is_null() && !length.is_null())
      throw UserError(location_prefix(length) + path_ +
                      ": `cycles` and `cycle_length` both say how the run is split into cycles; give one of them");
    const std::string cycles_expected = "a number of cycles (an integer >= 1) or a list of increasing step numbers";
    if (cycles.is_int()) {
      if (cycles.as_int() < 1) bad_cycles(cycles, "cycles", cycles_expected);
      cycle_mode_ = cycles.as_int() == 1 ? CycleMode::one : CycleMode::count;
      cycle_count_ = cycles.as_int();
    } else if (cycles.is_list()) {
      cycle_ends_ = positive_integers(cycles, "cycles", cycles_expected, /*increasing=*/true);
      cycle_mode_ = CycleMode::ends;
    } else if (!cycles.is_null()) {
      bad_cycles(cycles, "cycles", cycles_expected);
    }

    const std::string length_expected =
        "a fraction (<= 1) of the run, a whole number of steps (> 1), or a list of cycle lengths in steps";
    if (length.is_number()) {
      const double v = length.as_double();
      if (!(v > 0.0) || (v > 1.0 && v != std::floor(v))) bad_cycles(length, "cycle_length", length_expected);
      cycle_length_ = v;
      cycle_mode_ = CycleMode::length;
    } else if (length.is_list()) {
      cycle_lengths_ = positive_integers(length, "cycle_length", length_expected, /*increasing=*/false);
      cycle_mode_ = CycleMode::lengths;
    } else if (!length.is_null()) {
      bad_cycles(length, "cycle_length", length_expected);
    }
  }

  std::string path_;
  double warmup_;
  double rewarmup_;
  std::optional<double> decay_;
  double min_lr_ratio_;
  CycleMode cycle_mode_ = CycleMode::one;
  std::int64_t cycle_count_ = 1;
  std::vector<std::int64_t> cycle_ends_;
  double cycle_length_ = 1.0;
  std::vector<std::int64_t> cycle_lengths_;
  std::vector<std::pair<std::string, std::string>> locations_;  // option name, "file:line:column: " or ""
};

}  // namespace loom
