#include "train/checkpointing.hpp"

#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <unordered_set>

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

namespace {

// A fully sharded run's part: this rank's slice of every parameter, of the optimizer state of the
// slices it updates (elementwise optimizers) or the whole state of the parameters it owns, and of
// the weight average; written by the replicas of data index 0 alone.
void fsdp_entries(const Run& run, checkpoint::Snapshot& snap) {
  const RunComponents& c = run.components;
  const World& world = *run.world;
  if (world.data_group()->rank() != 0) return;
  std::unordered_map<std::string, const ParameterSlice*> slice_of;
  for (const ParameterSlice& s : c.fsdp->slices()) {
    slice_of[s.model->name()] = &s;
    snap.model.emplace_back(s.model->name(), s.piece->data(), s.model->shape(), s.begin, s.end);
  }
  const bool ranges = c.optimizer->elementwise();
  auto add = [&](const std::string& name, const Tensor& t) {
    const auto it = slice_of.find(name.substr(name.find('/') + 1));
    if (ranges && it != slice_of.end())
      snap.optimizer.emplace_back(name, t, it->second->model->shape(), it->second->begin, it->second->end);
    else
      snap.optimizer.emplace_back(name, t);
  };
  for (auto& [name, t] : c.optimizer->state()) add(name, t);
  if (run.state.ema)
    for (auto& [name, t] : run.state.ema->state()) add(name, t);
}

}  // namespace

namespace {

std::string parameter_of(const std::string& entry) {
  const auto slash = entry.find('/');
  return slash == std::string::npos ? entry : entry.substr(slash + 1);
}

// fsdp x tensor: every entry whole. A rank holds a slice (possibly none) of each tensor-parallel
// shard; the slices of the fsdp group are disjoint, so each shard is the sum over the group of
// the members' slices put in place in zeros (exact), and the shards of the tensor group then make
// the whole. Every rank walks the same entries: the model's parameters, and the union over the
// ranks of the optimizer state's and the weight average's entries (a rank holding no slice of a
// parameter has none of its state).
std::unordered_map<std::string, Tensor> gather_fsdp_tensor_entries(const Run& run) {
  const RunComponents& c = run.components;
  World& world = *run.world;
  std::unordered_map<std::string, const ParameterSlice*> slice_of;
  for (const ParameterSlice& s : c.fsdp->slices()) slice_of[s.model->name()] = &s;
  std::unordered_map<std::string, const Parameter*> model_of;
  for (const auto& p : c.model->parameters()) model_of[p.parameter->name()] = p.parameter;
  std::map<std::string, Tensor> local;  // this rank's pieces, by entry name
  for (auto& [name, t] : c.optimizer->state()) local.emplace(name, t);
  if (run.state.ema)
    for (auto& [name, t] : run.state.ema->state()) local.emplace(name, t);
  std::set<std::string> names;
  for (int r = 0; r < world.size(); ++r) {
    std::string text;
    if (r == world.rank())
      for (const auto& [name, t] : local) text += name + "\n";
    world.broadcast(text, r);
    for (std::size_t at = 0; at < text.size();) {
      const std::size_t end = text.find('\n', at);
      names.insert(text.substr(at, end - at));
      at = end + 1;
    }
  }
  std::unordered_map<std::string, Tensor> out;
  auto assemble = [&](const std::string& name, const Tensor* piece) {
    const auto m = model_of.find(parameter_of(name));
    if (m == model_of.end()) {  // not a parameter's entry: this rank's own, as without fsdp
      if (piece) out.emplace(name, *piece);
      return;
    }
    Tensor shard = Tensor::zeros(m->second->shape());
    const auto s = slice_of.find(m->first);
    if (piece && s != slice_of.end() && piece->numel() == s->second->end - s->second->begin)
      std::memcpy(shard.data<float>() + s->second->begin, piece->data<float>(),
                  static_cast<std::size_t>(piece->numel()) * sizeof(float));
    world.fsdp_group()->all_reduce(std::span<float>(shard.data<float>(), static_cast<std::size_t>(shard.numel())));
    Tensor whole = c.tensor->whole(name, shard);
    if (world.is_primary()) out.emplace(name, std::move(whole));  // the others only take part
  };
  for (const auto& p : c.model->parameters()) {
    const auto s = slice_of.find(p.parameter->name());
    const Tensor piece = s != slice_of.end() ? s->second->piece->data() : Tensor();
    assemble(p.parameter->name(), s != slice_of.end() ? &piece : nullptr);
  }
  for (const std::string& name : names) {
    const auto it = local.find(name);
    assemble(name, it != local.end() ? &it->second : nullptr);
  }
  return out;
}

}  // namespace

std::unordered_map<std::string, Tensor> gather_whole_entries(const Run& run) {
  const RunComponents& c = run.components;
  std::unordered_map<std::string, Tensor> out;
  if (!c.tensor) return out;
  if (c.fsdp) return gather_fsdp_tensor_entries(run);
  auto add = [&](const std::string& name, const Tensor& t) {
    const PlannedParameter* e = c.tensor->planned(name);
    if (!e || !e->placement.is_split()) return;
    // Every rank takes part in the gather; rank 0 alone writes, and keeps the whole tensor.
    Tensor whole = c.tensor->whole(name, t);
    if (run.world->is_primary()) out.emplace(name, std::move(whole));
  };
  for (const auto& p : c.saved_parameters()) add(p.parameter->name(), p.parameter->data());
  for (auto& [name, t] : c.optimizer->state()) add(name, t);
  if (run.state.ema)
    for (auto& [name, t] : run.state.ema->state()) add(name, t);
  return out;
}

checkpoint::Snapshot live_snapshot(const Run& run, const checkpoint::TrainRecord& record,
                                   const std::unordered_map<std::string, Tensor>* wholes) {
  const RunComponents& c = run.components;
  const World& world = *run.world;
  const DataParallel& data = *c.data_parallel;
  checkpoint::Snapshot snap;
  snap.step = record.step;
  if (world.size() > 1)
    for (MeshAxis axis : mesh_axes) snap.mesh.emplace_back(std::string(mesh_axis_name(axis)), world.mesh().size(axis));
  const bool parts = data.writes_checkpoint_parts();
  if (parts) {
    snap.shards = world.size();
    snap.rank = world.rank();
  }
  if (c.fsdp && c.tensor) {
    // fsdp x tensor: every entry gathered whole (gather_whole_entries), written by rank 0 alone.
    if (wholes) {
      std::set<std::string> model_names;
      for (const auto& p : c.model->parameters()) {
        snap.model.emplace_back(p.parameter->name(), wholes->at(p.parameter->name()));
        model_names.insert(p.parameter->name());
      }
      std::map<std::string, Tensor> rest(wholes->begin(), wholes->end());  // in name order
      for (const auto& [name, t] : rest)
        if (!model_names.contains(name)) snap.optimizer.emplace_back(name, t);
    }
    snap.model_metadata = {{"loom.run_id", record.run_id}, {"loom.step", std::to_string(record.step)}};
  } else if (c.fsdp) {
    fsdp_entries(run, snap);
  } else {
    // The parameters this rank writes: every one, or in a checkpoint of parts those it owns.
    // Under tensor parallelism, the whole tensors gathered for the entries of split parameters.
    auto value = [&](const std::string& name, const Tensor& t) {
      if (wholes)
        if (const auto it = wholes->find(name); it != wholes->end()) return it->second;
      return t;
    };
    std::unordered_set<std::string> mine;
    for (const auto& p : c.saved_parameters())
      if (!parts || data.checkpoint_writer_of(p.parameter) == world.rank()) {
        snap.model.emplace_back(p.parameter->name(), value(p.parameter->name(), p.parameter->data()));
        mine.insert(p.parameter->name());
      }
    snap.model_metadata = {{"loom.run_id", record.run_id}, {"loom.step", std::to_string(record.step)}};
    // The optimizer's state: this rank's optimizer holds only what this rank updates (ZeRO-1).
    for (auto& [name, t] : c.optimizer->state()) snap.optimizer.emplace_back(name, value(name, t));
    // The weight average (trainer.ema_decay) is training state too: beside the optimizer's. Every
    // rank holds all of it; each writes the average of the parameters it writes.
    if (run.state.ema)
      for (auto& [name, t] : run.state.ema->state())
        if (!parts || mine.contains(name.substr(name.find('/') + 1))) snap.optimizer.emplace_back(name, value(name, t));
  }
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
