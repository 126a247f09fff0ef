// state.json: where a training run stood when a checkpoint was taken, beyond the tensors
// (model.safetensors, optimizer.safetensors). Everything the next step depends on is here or in
// the config: the step (which is also the data cursor and the position of the dropout stream,
// since both are keyed by it), the skip-bad-steps window, the log interval's partial sums, and
// what identifies the run (config hash, seed, thread count, loom version).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace loom::checkpoint {

struct TrainRecord {
  std::int64_t step = 0;  // steps done
  std::string saved_at;   // UTC, ISO 8601
  std::string loom_version;
  std::string run_id;       // a resumed run keeps it when trainer.run_id is unset
  std::string config_hash;  // "crc32c:<8 hex digits>" of config.yaml
  std::int64_t num_train_steps = 0;
  int threads = 0;  // of the execution context: results are bit-exact for a given count

  // Random streams: counter-based (loom/random.hpp), keyed by (seed, stream, counter); their
  // positions follow from the step.
  std::uint64_t seed = 0;
  std::int64_t micro_steps = 1;  // dropout draws per step: counter = step * micro_steps + micro-batch

  // Data: batch `next_batch` of the training split comes next (== step).
  std::int64_t next_batch = 0;
  std::int64_t batch_size = 0, seq_len = 0;

  // trainer.skip_bad_steps.
  std::int64_t skipped_steps = 0;
  bool has_skip_window = false;
  std::vector<double> skip_losses, skip_grad_norms;

  std::string optimizer_type;
  std::int64_t optimizer_updates = 0;  // updates applied (steps not skipped)
  std::string tokenizer_type;
  std::int64_t vocab_size = 0;

  // Trackers: what they hold is every record up to `step`; a resumed run starts them at
  // step + 1, dropping what the interrupted run logged past the checkpoint.
  std::vector<std::string> trackers;

  // The log interval in progress (steps since the last log line), so that the next line's mean
  // loss is the uninterrupted run's; and the run's clocks.
  std::int64_t interval_steps = 0;
  double interval_loss = 0, interval_seconds = 0;
  std::int64_t interval_trained_tokens = 0;  // targets counted toward the loss (absent before: 0)
  double train_seconds = 0, elapsed_seconds = 0;
};

std::string to_json(const TrainRecord& record);
// Throws UserError (what is wrong) when `text` is not a state.json this loom writes.
TrainRecord parse_train_record(const std::string& text);

// The current time in UTC, formatted by strftime's `format`.
std::string utc_time(const char* format);
// The current time as "2026-11-24T20:55:03Z".
std::string utc_now();

}  // namespace loom::checkpoint
