#include <iomanip>
#include <sstream>
#include <utility>

#include "train/hooks/run_hooks.hpp"

namespace loom::training {

namespace {

std::string describe_write(const checkpoint::WriteReport& r) {
  std::ostringstream line;
  line << "checkpoint " << r.path.string() << ": " << format_bytes(r.bytes) << " written in " << std::fixed
       << std::setprecision(2) << r.write_seconds << " s";
  if (r.snapshot_seconds > 0) line << " (snapshot " << r.snapshot_seconds << " s)";
  if (!r.removed.empty()) {
    line << "; removed";
    for (auto s : r.removed) line << " step-" << s;
  }
  for (const auto& a : r.set_aside) line << "\nwarning: " << describe_set_aside(a);
  return line.str();
}

}  // namespace

Checkpoints::Checkpoints(LoopState& s)
    : s_(s),
      writer_(s.run.checkpoints.get()),
      writing_(checkpoint_writing(s.run.components.strategies)),
      parts_(writing_ == CheckpointWriting::parts),
      commit_(*s.run.world, writer_),
      policy_(s.run.checkpoint, s.start),
      last_saved_(s.run.resumed_from) {}

void Checkpoints::report_writes() {
  if (writer_)
    for (const auto& r : writer_->take_reports()) s_.progress.say(describe_write(r));
}

void Checkpoints::save(bool wait) {
  Run& run = s_.run;
  last_saved_ = run.state.step;
  policy_.saved(Clock::now());
  // What this rank writes (every rank takes part where the entries are made whole; rank 0 writes
  // them).
  CheckpointEntries entries = checkpoint_entries(run);
  if (!writer_) return;
  // The previous checkpoint is committed before the next is written.
  if (parts_) commit_.settle(/*wait=*/true);
  s_.flush_trackers();
  writer_->save(live_snapshot(run, train_record(run, s_.elapsed()), std::move(entries)));
  if (parts_) {
    commit_.started();
    if (wait) commit_.settle(/*wait=*/true);
  }
  if (wait) writer_->wait();
  report_writes();
}

void Checkpoints::reserve_if_soon() {
  // (Not where the entries are made whole, which takes every rank when saving.)
  if (!writer_ || reserved_ || writing_ == CheckpointWriting::whole || !policy_.soon(Clock::now())) return;
  writer_->reserve(live_snapshot(s_.run, train_record(s_.run, 0), checkpoint_entries(s_.run)));
  reserved_ = true;
}

void Checkpoints::settle() {
  if (commit_.pending()) commit_.settle(/*wait=*/false);
  report_writes();
}

void Checkpoints::finish() {
  commit_.settle(/*wait=*/true);
  if (writer_) writer_->wait();
  report_writes();
}

void Checkpoints::final() {
  // A run with checkpoints ends with one, so that it can be trained further (a larger
  // trainer.num_train_steps) and a rerun of the same command knows it is finished.
  if (last_saved_ >= 0 && last_saved_ != s_.run.num_steps) save(/*wait=*/true);
  finish();
}

CheckpointPolicyHook::CheckpointPolicyHook(LoopState& s, Checkpoints& checkpoints)
    : Hook(1), s_(s), checkpoints_(checkpoints) {
  checkpoints_.reserve_if_soon();
}

void CheckpointPolicyHook::after_step(const StepOutcome&) {
  // A save of parts is collective: the ranks agree on it (the time policy reads each one's clock).
  bool due = checkpoints_.due(Clock::now());
  if (checkpoints_.writes_parts()) due = s_.run.world->max_over_ranks(due ? 1 : 0) != 0;
  if (due) checkpoints_.save(/*wait=*/!s_.run.checkpoint.async);
  checkpoints_.reserve_if_soon();
}

}  // namespace loom::training
