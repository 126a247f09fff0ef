#include "train/checkpointing.hpp"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>

#include "checkpoint/crc32c.hpp"
#include "loom/error.hpp"
#include "loom/execution.hpp"
#include "loom/version.hpp"
#include "train/run_setup.hpp"
#include "train/world.hpp"

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

std::string parameter_of(const std::string& entry) {
  const auto slash = entry.find('/');
  return slash == std::string::npos ? entry : entry.substr(slash + 1);
}

namespace {

// The checkpoint's entries as this rank holds them: the saved parameters, the optimizer's state
// and the weight average, each whole, made what the strategies hold.
CheckpointEntries held_entries(const Run& run) {
  const RunComponents& c = run.components;
  CheckpointEntries entries;
  for (const auto& p : c.saved_parameters()) entries.model.emplace_back(p.parameter->name(), p.parameter->data());
  for (auto& [name, t] : c.optimizer->state()) entries.optimizer.emplace_back(name, t);
  // The weight average (trainer.ema_decay) is training state too: beside the optimizer's.
  if (run.state.ema)
    for (auto& [name, t] : run.state.ema->state()) entries.average.emplace_back(name, t);
  entries.model_metadata = {{"loom.run_id", run.directory.run_id()}, {"loom.step", std::to_string(run.state.step)}};
  for (const auto& strategy : c.strategies) strategy->hold(entries);
  return entries;
}

// CheckpointWriting::whole: every rank walks the same entries, and each strategy makes each whole
// along its axis (strategy.hpp's contract); rank 0 keeps them (the others only take part). The
// saved parameters first, in their order; then the optimizer's state and the weight average: this
// rank's, in its order, or, where a rank may hold none of a parameter's state, the union over the
// ranks' entries in name order.
CheckpointEntries whole_entries(const Run& run, const CheckpointEntries& held) {
  const RunComponents& c = run.components;
  World& world = *run.world;
  std::unordered_map<std::string, Tensor> value;  // this rank's, by entry name
  for (const auto* list : {&held.model, &held.optimizer, &held.average})
    for (const checkpoint::Entry& e : *list) value.emplace(e.name, e.data);
  CheckpointEntries out;
  out.model_metadata = held.model_metadata;
  auto add = [&](std::vector<checkpoint::Entry>& to, const std::string& name) {
    const auto it = value.find(name);
    const Tensor mine = it != value.end() ? it->second : Tensor();
    std::optional<Tensor> whole = make_whole(c.strategies, name, mine);
    if (!world.is_primary()) return;
    const Tensor& t = whole ? *whole : mine;
    if (t.defined()) to.emplace_back(name, t);
  };
  for (const auto& p : c.saved_parameters()) add(out.model, p.parameter->name());
  if (std::none_of(c.strategies.begin(), c.strategies.end(),
                   [](const auto& strategy) { return strategy->holds_some_entries(); })) {
    for (const checkpoint::Entry& e : held.optimizer) add(out.optimizer, e.name);
    for (const checkpoint::Entry& e : held.average) add(out.average, e.name);
    return out;
  }
  std::set<std::string> names;
  for (int r = 0; r < world.size(); ++r) {
    std::string text;
    if (r == world.rank())
      for (const auto* list : {&held.optimizer, &held.average})
        for (const checkpoint::Entry& e : *list) text += e.name + "\n";
    world.broadcast(text, r);
    for (std::size_t at = 0; at < text.size();) {
      const std::size_t end = text.find('\n', at);
      names.insert(text.substr(at, end - at));
      at = end + 1;
    }
  }
  for (const std::string& name : names) add(out.optimizer, name);
  return out;
}

}  // namespace

CheckpointEntries checkpoint_entries(const Run& run) {
  const Strategies& strategies = run.components.strategies;
  CheckpointEntries entries = held_entries(run);
  switch (checkpoint_writing(strategies)) {
    case CheckpointWriting::copy:
      return entries;
    case CheckpointWriting::parts:
      for (const auto& strategy : strategies) strategy->keep_part(entries);
      return entries;
    case CheckpointWriting::whole:
      return whole_entries(run, entries);
  }
  throw InternalError("checkpoint: unknown CheckpointWriting");
}

checkpoint::Snapshot live_snapshot(const Run& run, const checkpoint::TrainRecord& record, CheckpointEntries entries) {
  const RunComponents& c = run.components;
  const World& world = *run.world;
  checkpoint::Snapshot snap;
  snap.step = record.step;
  if (world.size() > 1)
    for (MeshAxis axis : mesh_axes) snap.mesh.emplace_back(std::string(mesh_axis_name(axis)), world.mesh().size(axis));
  const bool parts = checkpoint_writing(c.strategies) == CheckpointWriting::parts;
  if (parts) {
    snap.shards = world.size();
    snap.rank = world.rank();
  }
  snap.model = std::move(entries.model);
  snap.model_metadata = std::move(entries.model_metadata);
  snap.optimizer = std::move(entries.optimizer);
  snap.optimizer.insert(snap.optimizer.end(), std::make_move_iterator(entries.average.begin()),
                        std::make_move_iterator(entries.average.end()));
  snap.optimizer_metadata = {{"loom.optimizer", record.optimizer_type}, {"loom.step", std::to_string(record.step)}};
  if (parts && !world.is_primary()) return snap;
  snap.files.emplace_back("state.json", checkpoint::to_json(record));
  snap.files.emplace_back("config.yaml", config_file_text(run.directory.run_id(), run.config));
  if (std::string state = c.tokenizer->state(); !state.empty()) snap.files.emplace_back("tokenizer.state", state);
  snap.files.emplace_back(
      "generation.json",
      nlohmann::json{{"separator_ends_documents", c.dataset->separator_ends_documents()}}.dump() + "\n");
  return snap;
}

void PartsCommit::settle(bool wait) {
  if (!pending_) return;
  if (wait) writer_->wait_idle();
  const checkpoint::PartState state = writer_->part_state();
  // [some rank is still writing, some rank's write failed]
  std::vector<double> flags{state == checkpoint::PartState::writing ? 1.0 : 0.0,
                            state == checkpoint::PartState::failed || state == checkpoint::PartState::none ? 1.0 : 0.0};
  world_.collective().all_reduce(std::span<double>(flags), ReduceOp::max);
  if (flags[1] != 0) {
    pending_ = false;
    writer_->drop_part();
    world_.together([&] {
      if (state == checkpoint::PartState::failed) writer_->wait();  // rethrows the write's error
      if (state == checkpoint::PartState::none) throw InternalError("checkpoint part: none was written");
    });
    throw ReportedError(ErrorKind::user, "a rank's checkpoint part could not be written");
  }
  if (flags[0] != 0) return;  // the next step boundary asks again
  // Every part is durable: rank 0 learns every rank's files ("name<TAB>size<TAB>crc32c" lines).
  std::vector<checkpoint::ManifestEntry> all;
  for (int r = 0; r < world_.size(); ++r) {
    std::string text;
    if (r == world_.rank())
      for (const auto& f : writer_->part_files())
        text += f.name + "\t" + std::to_string(f.size) + "\t" + std::to_string(f.crc32c) + "\n";
    world_.broadcast(text, r);
    if (!world_.is_primary()) continue;
    for (std::size_t at = 0; at < text.size();) {
      const std::size_t a = text.find('\t', at), b = text.find('\t', a + 1), end = text.find('\n', b);
      all.push_back({text.substr(at, a - at), std::stoull(text.substr(a + 1, b - a - 1)),
                     static_cast<std::uint32_t>(std::stoul(text.substr(b + 1, end - b - 1)))});
      at = end + 1;
    }
  }
  pending_ = false;
  if (world_.is_primary())
    writer_->commit_parts(std::move(all));
  else
    writer_->drop_part();
}

}  // namespace loom::training
