#include "train/checkpointing.hpp"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "checkpoint/crc32c.hpp"
#include "loom/error.hpp"
#include "loom/execution.hpp"
#include "loom/version.hpp"
#include "train/run_setup.hpp"

namespace fs = std::filesystem;

namespace loom::training {

CheckpointSettings checkpoint_settings(const Options& trainer, const fs::path& run_dir) {
  const Options o = trainer.object("checkpoint");
  CheckpointSettings s;
  s.save_every_steps = o.get<std::int64_t>("save_every_steps");
  s.save_every_minutes = o.get<double>("save_every_minutes");
  s.retention.keep_last = o.get<std::int64_t>("keep_last");
  s.retention.keep_every_steps = o.get<std::int64_t>("keep_every_steps");
  const std::string dir = o.get<std::string>("dir");
  s.dir = dir.empty() ? run_dir / "checkpoints" : fs::path(dir);
  s.async = o.get<bool>("async");
  return s;
}

bool CheckpointPolicy::due(std::int64_t steps_done, Clock::time_point now) const {
  if (settings_.save_every_steps > 0 && steps_done % settings_.save_every_steps == 0) return true;
  if (settings_.retention.is_permanent(steps_done)) return true;
  return settings_.save_every_minutes > 0 &&
         std::chrono::duration<double>(now - last_save_).count() >= 60.0 * settings_.save_every_minutes;
}

bool CheckpointPolicy::soon(Clock::time_point now) const {
  if (settings_.save_every_steps > 0 || settings_.retention.keep_every_steps > 0) return true;
  return settings_.save_every_minutes > 0 &&
         std::chrono::duration<double>(now - last_save_).count() >= 30.0 * settings_.save_every_minutes;
}

std::string describe_set_aside(const checkpoint::SetAside& a) {
  return "checkpoint " + a.from.string() + " is unusable (" + a.problem + "); moved it aside to " + a.to.string() +
         ": loom never deletes a checkpoint that fails verification (inspect or repair it, then remove it yourself)";
}

std::string config_hash(const std::string& config_text) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "crc32c:%08x", checkpoint::crc32c(0, config_text.data(), config_text.size()));
  return buf;
}

std::string format_bytes(std::uint64_t bytes) {
  char buf[32];
  const double b = static_cast<double>(bytes);
  if (b >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f GB", b / 1e9);
  else if (b >= 1e6)
    std::snprintf(buf, sizeof buf, "%.1f MB", b / 1e6);
  else if (b >= 1e3)
    std::snprintf(buf, sizeof buf, "%.0f kB", b / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(bytes));
  return buf;
}

checkpoint::TrainRecord train_record(const Run& run, double elapsed_seconds) {
  const RunComponents& c = run.components;
  const TrainState& s = run.state;
  checkpoint::TrainRecord r;
  r.step = s.step;
  r.saved_at = checkpoint::utc_now();
  r.loom_version = sdk_version;
  r.run_id = run.directory.run_id();
  r.config_hash = config_hash(config_file_text(run.directory.run_id(), run.config));
  r.num_train_steps = run.num_steps;
  r.threads = default_execution_context().num_threads();
  r.seed = run.seed;
  r.micro_steps = run.batch_size / run.micro_size;
  r.next_batch = s.step;
  r.batch_size = run.batch_size;
  r.seq_len = run.seq_len;
  r.skipped_steps = s.skipped_steps;
  if (s.skip_rule) {
    r.has_skip_window = true;
    r.skip_losses = s.skip_rule->losses();
    r.skip_grad_norms = s.skip_rule->grad_norms();
  }
  r.optimizer_type = run.config.at_path("optimizer.type")->as_string();
  r.optimizer_updates = s.step - s.skipped_steps;
  r.tokenizer_type = run.config.at_path("tokenizer.type")->as_string();
  r.vocab_size = c.tokenizer->vocab_size();
  r.trackers = run.trainer.get<std::vector<std::string>>("trackers");
  r.interval_steps = s.interval.steps;
  r.interval_loss = s.interval.loss_sum;
  r.interval_trained_tokens = s.interval.trained_tokens;
  r.interval_seconds = s.interval.seconds;
  r.train_seconds = s.interval.train_seconds;
  r.elapsed_seconds = elapsed_seconds;
  return r;
}

checkpoint::Snapshot live_snapshot(const Run& run, const checkpoint::TrainRecord& record) {
  const RunComponents& c = run.components;
  checkpoint::Snapshot snap;
  snap.step = record.step;
  for (const auto& p : c.saved_parameters()) snap.model.emplace_back(p.parameter->name(), p.parameter->data());
  snap.model_metadata = {{"loom.run_id", record.run_id}, {"loom.step", std::to_string(record.step)}};
  snap.optimizer = c.optimizer->state();
  // The weight average (trainer.ema_decay) is training state too: beside the optimizer's.
  if (run.state.ema)
    for (auto& entry : run.state.ema->state()) snap.optimizer.push_back(std::move(entry));
  snap.optimizer_metadata = {{"loom.optimizer", record.optimizer_type}, {"loom.step", std::to_string(record.step)}};
  snap.files.emplace_back("state.json", checkpoint::to_json(record));
  snap.files.emplace_back("config.yaml", config_file_text(run.directory.run_id(), run.config));
  if (std::string state = c.tokenizer->state(); !state.empty()) snap.files.emplace_back("tokenizer.state", state);
  snap.files.emplace_back(
      "generation.json",
      nlohmann::json{{"separator_ends_documents", c.dataset->separator_ends_documents()}}.dump() + "\n");
  return snap;
}

}  // namespace loom::training
