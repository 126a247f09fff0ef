#include "train/resume.hpp"

#include <algorithm>
#include <map>
#include <set>

#include "checkpoint/durable_io.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/sharded_checkpoint.hpp"
#include "loom/core/config.hpp"
#include "loom/error.hpp"
#include "loom/execution.hpp"
#include "loom/safetensors.hpp"

namespace fs = std::filesystem;

namespace loom::training {

namespace {

using checkpoint::CheckpointStore;

// Keys a resume may change without a word: how and where the run is saved and watched.
bool is_quiet_key(const std::string& key) {
  for (const char* prefix : {"trainer.checkpoint.", "plugins."})
    if (key.rfind(prefix, 0) == 0) return true;
  for (const char* k : {"trainer.resume", "trainer.run_dir", "trainer.run_id", "trainer.init_from", "trainer.prefetch",
                        "trainer.peak_flops", "trainer.num_train_steps"})
    if (key == k) return true;
  return false;
}

std::string describe_change(const ConfigChange& c) {
  auto show = [](const std::string& v) { return v.empty() ? std::string("(unset)") : v; };
  return c.key + " (" + show(c.before) + " in the checkpoint, " + show(c.after) + " now)";
}

// The changes under any of `prefixes`, described, one per line.
std::string changes_under(const std::vector<ConfigChange>& changes, std::initializer_list<const char*> prefixes) {
  std::string out;
  for (const auto& c : changes)
    for (const char* p : prefixes)
      if (c.key.rfind(p, 0) == 0) {
        out += "\n  " + describe_change(c);
        break;
      }
  return out;
}

void flatten(const Value& v, const std::string& prefix, std::vector<std::pair<std::string, std::string>>& out) {
  if (v.is_map() && !v.as_map().empty()) {
    for (const auto& [k, child] : v.as_map()) flatten(child, prefix.empty() ? k : prefix + "." + k, out);
    return;
  }
  out.emplace_back(prefix, v.to_flow());
}

std::vector<std::pair<std::string, std::string>> flat_config(const std::string& yaml) {
  std::vector<std::pair<std::string, std::string>> out;
  flatten(config::load_string(yaml, "config.yaml"), "", out);
  return out;
}

// An explicit trainer.resume: a step-N directory, a checkpoints directory (its latest) or a run
// directory (its checkpoints/latest).
fs::path resolve_explicit(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec))
    throw UserError("trainer.resume: '" + path.string() +
                    "' is not a directory (give a checkpoint step-N/, a checkpoints/ directory or a run directory; "
                    "relative paths are relative to the current directory), or `auto` or `never`");
  if (fs::exists(path / "manifest.json", ec) || fs::exists(path / "state.json", ec) ||
      CheckpointStore::parse_dir_name(path.filename().string()))
    return path;
  for (const fs::path& store_dir : {path, path / "checkpoints"}) {
    if (!fs::exists(store_dir / "latest", ec)) continue;
    const CheckpointStore store(store_dir);
    const auto latest = store.latest();
    if (!latest)
      throw UserError("trainer.resume: '" + (store_dir / "latest").string() + "' does not name a step-N directory");
    return store_dir / CheckpointStore::dir_name(*latest);
  }
  throw UserError("trainer.resume: '" + path.string() +
                  "' is not a checkpoint: it holds no manifest.json, latest or checkpoints/latest (give a checkpoint "
                  "step-N/, a checkpoints/ directory or a run directory)");
}

}  // namespace

ResumePoint read_point(const fs::path& dir) {
  ResumePoint p;
  p.dir = dir;
  try {
    p.record = checkpoint::parse_train_record(checkpoint::read_whole(dir / "state.json"));
  } catch (const UserError& e) {
    throw UserError("'" + (dir / "state.json").string() + "' " + e.what());
  }
  const auto step = CheckpointStore::parse_dir_name(dir.filename().string());
  if (step && *step != p.record.step)
    throw UserError("'" + (dir / "state.json").string() + "' is for step " + std::to_string(p.record.step) +
                    ", but the directory is " + dir.filename().string());
  p.config_text = checkpoint::read_whole(dir / "config.yaml");
  std::error_code ec;
  if (fs::exists(dir / "tokenizer.state", ec)) p.tokenizer_state = checkpoint::read_whole(dir / "tokenizer.state");
  return p;
}

ResumeDecision decide_resume(const Options& trainer, const RunDirectory& directory, const CheckpointStore& store,
                             std::int64_t num_steps) {
  ResumeDecision d;
  const std::string mode = trainer.get<std::string>("resume");
  const std::string dir = directory.path().string();
  if (mode == "never") {
    // Starting over is refused where it would train over something of value: final weights, or
    // a checkpoint that could be continued. Checkpoints that fail verification are moved aside
    // (set_up_run's discard_after), never deleted.
    const checkpoint::LatestValid latest = store.find_latest_valid();
    if (directory.holds_final_weights() || latest.checkpoint)
      throw UserError("run directory '" + dir + "' already holds a run and trainer.resume is `never`" +
                      (latest.checkpoint ? " (checkpoint " + latest.checkpoint->path.string() + " verifies)"
                                         : std::string(" (its final model.safetensors is there)")) +
                      ": choose another trainer.run_dir (or trainer.run_id), remove it, or set trainer.resume=auto to "
                      "continue it from its latest checkpoint");
    if (!latest.warnings.empty())
      d.warnings.push_back("trainer.resume is `never`: the run in " + dir +
                           " starts at step 0; its checkpoints, none of which verifies, are moved aside");
    return d;
  }
  if (mode == "auto") {
    const checkpoint::LatestValid latest = store.find_latest_valid();
    if (!latest.checkpoint && !latest.warnings.empty()) {
      // Checkpoints are there and none verifies: starting again from step 0 would train over
      // them (and a bit flip, a file system's hiccup or a newer format would cost the whole run).
      std::string list;
      for (const auto& w : latest.warnings) list += "\n  " + w;
      throw UserError("run directory '" + dir + "' has checkpoints in " + store.dir().string() +
                      ", and none of them can be resumed from (nothing was loaded or changed):" + list +
                      "\nrepair or restore one (`loom checkpoints " + dir +
                      "` verifies them) and run the same command again; or start over from step 0 deliberately with "
                      "trainer.resume=never (the checkpoints are then moved aside as step-N.unusable-<time>, not "
                      "deleted), or choose another trainer.run_dir");
    }
    for (const auto& w : latest.warnings) d.warnings.push_back(w);
    if (!latest.checkpoint) {
      if (directory.holds_run()) {
        if (directory.holds_final_weights())
          throw UserError(
              "run directory '" + dir +
              "' already holds a run, finished (its model.safetensors is there), and no valid checkpoint to continue "
              "from: choose another trainer.run_dir (or trainer.run_id), or remove it");
        d.warnings.push_back("no valid checkpoint to resume from in " + store.dir().string() + ": the run in " + dir +
                             " starts again from step 0");
      }
      return d;
    }
    if (!latest.warnings.empty())
      d.warnings.push_back("resuming from the previous valid checkpoint, " + latest.checkpoint->path.string());
    d.point = read_point(latest.checkpoint->path);
  } else {
    const fs::path path = resolve_explicit(mode);
    const checkpoint::Verification v = checkpoint::verify_checkpoint(path);
    if (!v.ok)
      throw UserError("trainer.resume: checkpoint '" + path.string() + "' is unusable: " + v.describe(path) +
                      "; nothing was loaded");
    d.point = read_point(path);
  }
  const std::int64_t step = d.point->record.step;
  if (step > num_steps)
    throw UserError("checkpoint '" + d.point->dir.string() + "' is at step " + std::to_string(step) +
                    ", past trainer.num_train_steps (" + std::to_string(num_steps) +
                    "): a resumed run may raise num_train_steps, not lower it below the checkpoint");
  const bool save_final = trainer.get<bool>("save_final");
  if (step == num_steps && (directory.holds_final_weights() || !save_final)) d.finished = true;
  return d;
}

std::vector<ConfigChange> diff_configs(const std::string& before_yaml, const std::string& after_yaml) {
  const auto before = flat_config(before_yaml), after = flat_config(after_yaml);
  const std::map<std::string, std::string> before_map(before.begin(), before.end());
  std::set<std::string> seen;
  std::vector<ConfigChange> changes;
  for (const auto& [key, value] : after) {
    seen.insert(key);
    const auto it = before_map.find(key);
    if (it == before_map.end())
      changes.push_back({key, "", value});
    else if (it->second != value)
      changes.push_back({key, it->second, value});
  }
  for (const auto& [key, value] : before)
    if (!seen.contains(key)) changes.push_back({key, value, ""});
  return changes;
}

std::vector<std::string> check_resume_config(const ResumePoint& point, const std::string& config_yaml,
                                             std::int64_t num_steps) {
  std::vector<std::string> warnings;
  const std::vector<ConfigChange> changes = diff_configs(point.config_text, config_yaml);
  const std::string where = "cannot resume from '" + point.dir.string() + "': ";
  for (const auto& c : changes)
    if (c.key == "optimizer.type")
      throw UserError(where + "its optimizer state is " + c.before + "'s and the config's optimizer is " + c.after +
                      ":\n  " + describe_change(c) + "\nset optimizer.type: " + c.before +
                      " to continue the run, or start a new one in another trainer.run_dir");
  std::string changed;
  for (const auto& c : changes)
    if (!is_quiet_key(c.key)) changed += "\n  " + describe_change(c);
  if (!changed.empty())
    warnings.push_back(
        "options changed since the checkpoint (the run continues, but will not match an "
        "uninterrupted one):" +
        changed);
  if (num_steps != point.record.num_train_steps)
    warnings.push_back("trainer.num_train_steps is " + std::to_string(num_steps) + " (the checkpoint's run had " +
                       std::to_string(point.record.num_train_steps) +
                       "): the learning-rate schedule continues as for a run of " + std::to_string(num_steps) +
                       " steps");
  const int threads = default_execution_context().num_threads();
  if (point.record.threads != threads)
    warnings.push_back("the checkpoint was written with " + std::to_string(point.record.threads) +
                       " threads and this run has " + std::to_string(threads) +
                       ": the continuation may differ from an uninterrupted run in the last bits");
  return warnings;
}

std::vector<std::pair<std::string, Tensor>> load_checkpoint_tensors(const ResumePoint& point, RunComponents& c,
                                                                    const std::string& config_yaml,
                                                                    const RankShare& share) {
  const std::vector<ConfigChange> changes = diff_configs(point.config_text, config_yaml);
  const std::string where = "cannot resume from '" + point.dir.string() + "': ";

  // The tokenizer: the same vocabulary, or every token id means something else.
  const std::string state = c.tokenizer->state();
  if (c.tokenizer->vocab_size() != point.record.vocab_size || state != point.tokenizer_state) {
    const std::string keys = changes_under(changes, {"tokenizer.", "data."});
    throw UserError(
        where + "the tokenizer's vocabulary differs from the checkpoint's (" + std::to_string(point.record.vocab_size) +
        " tokens there, " + std::to_string(c.tokenizer->vocab_size()) + " now" +
        (state != point.tokenizer_state ? ", and the fitted vocabulary differs" : "") + ")" +
        (keys.empty() ? std::string("; no tokenizer or data option differs") : "; the options that differ:" + keys));
  }

  // The elements of entry `name` this rank holds: its range, or the whole entry.
  auto range_of = [&](const checkpoint::TensorSet& set, const std::string& name) {
    if (share.range)
      if (const auto range = share.range(name)) return *range;
    return std::pair<std::int64_t, std::int64_t>{0, set.info(name).shape.numel()};
  };
  auto check_size = [](const std::string& name, std::pair<std::int64_t, std::int64_t> range, std::int64_t numel) {
    if (range.second - range.first != numel)
      throw InternalError("resume: elements [" + std::to_string(range.first) + ", " + std::to_string(range.second) +
                          ") of '" + name + "' for a tensor of " + std::to_string(numel));
  };
  // What this rank holds of entry `name`, in `shape`.
  auto read_part = [&](const checkpoint::TensorSet& set, const std::string& name, const Shape& shape) {
    const auto range = range_of(set, name);
    check_size(name, range, shape.numel());
    Tensor part = Tensor::empty(shape, set.info(name).dtype);
    set.read_range_into(name, range.first, range.second, part);
    return part;
  };
  // The parameters the weights load into, with their global shapes.
  std::vector<std::pair<Parameter*, Shape>> targets = share.weights;
  if (targets.empty())
    for (const auto& p : c.saved_parameters()) targets.emplace_back(p.parameter, p.parameter->shape());

  // The model: every tensor by name and shape.
  const checkpoint::TensorSet model(point.dir, "model");
  std::vector<std::string> problems;
  std::set<std::string> names;
  // Every parameter by name and shape (only their shapes: under FSDP their values live in units).
  for (const auto& mp : c.saved_parameters()) {
    const std::string& name = mp.parameter->name();
    const Shape shape = share.whole_shape ? share.whole_shape(name, mp.parameter->shape()) : mp.parameter->shape();
    names.insert(name);
    if (!model.contains(name))
      problems.push_back("'" + name + "' is not in the checkpoint");
    else if (!(model.info(name).shape == shape))
      problems.push_back("'" + name + "' is " + model.info(name).shape.str() + " there and " + shape.str() + " now");
  }
  for (const auto& info : model.entries())
    if (!names.contains(info.name)) problems.push_back("'" + info.name + "' is in the checkpoint but not in the model");
  if (!problems.empty()) {
    const std::string keys = changes_under(changes, {"model.", "tokenizer."});
    std::string detail;
    for (std::size_t i = 0; i < problems.size() && i < 4; ++i) detail += (i ? "; " : "") + problems[i];
    if (problems.size() > 4) detail += "; and " + std::to_string(problems.size() - 4) + " more";
    throw UserError(where + "the model's shape differs from the checkpoint's (" + detail + ")" +
                    (keys.empty() ? std::string("; no model option differs (was the model plugin changed?)")
                                  : "; the options that differ:" + keys));
  }

  // The optimizer state, checked by name and shape against the live state before anything loads.
  const checkpoint::TensorSet optimizer(point.dir, "optimizer");
  std::map<std::string, Tensor> live;
  for (const auto& [name, t] : c.optimizer->state()) live.emplace(name, t);
  std::vector<std::pair<std::string, Tensor>> saved;
  std::vector<std::pair<std::string, Tensor>> average;
  std::vector<std::string> not_yet_live;
  {
    std::vector<std::string> mismatch;
    std::set<std::string> seen;
    for (const auto& info : optimizer.entries()) {
      if (info.name.starts_with("ema/") || (share.keeps && !share.keeps(info.name))) continue;
      seen.insert(info.name);
      const auto it = live.find(info.name);
      if (it == live.end())
        // An optimizer with lazy state (SGD's momentum buffer) has none for a parameter before its
        // first update: the entry is read and handed to load_state(), which refuses, naming it,
        // an entry that is no state of this optimizer.
        not_yet_live.push_back(info.name);
      else if (const Shape now =
                   share.whole_shape ? share.whole_shape(info.name, it->second.shape()) : it->second.shape();
               !(share.range && share.range(info.name)) && !(now == info.shape))
        mismatch.push_back("'" + info.name + "' is " + info.shape.str() + " there and " + now.str() + " now");
    }
    for (const auto& [name, t] : live)
      if (!seen.contains(name)) mismatch.push_back("'" + name + "' is not in the checkpoint");
    if (!mismatch.empty()) {
      const std::string keys = changes_under(changes, {"optimizer."});
      std::string detail;
      for (std::size_t i = 0; i < mismatch.size() && i < 4; ++i) detail += (i ? "; " : "") + mismatch[i];
      if (mismatch.size() > 4) detail += "; and " + std::to_string(mismatch.size() - 4) + " more";
      throw UserError(where + "the optimizer's state differs from the checkpoint's (" + detail + ")" +
                      (keys.empty() ? std::string() : "; the options that differ:" + keys));
    }
  }

  // Every range's coverage is checked, and the optimizer state read, before anything is loaded;
  // the weights are read straight into the parameters.
  with_context("while reading " + model.describe(), [&] {
    for (const auto& [p, shape] : targets) {
      const auto range = range_of(model, p->name());
      check_size(p->name(), range,
                 share.whole_shape ? share.whole_shape(p->name(), p->shape()).numel() : p->shape().numel());
      model.check_covered(p->name(), range.first, range.second);
    }
  });
  with_context("while reading " + optimizer.describe(), [&] {
    for (const auto& [name, t] : live)
      if (share.shard_of)
        saved.emplace_back(name, share.shard_of(name, read_part(optimizer, name, share.whole_shape(name, t.shape()))));
      else
        saved.emplace_back(name, read_part(optimizer, name, t.shape()));
    for (const std::string& name : not_yet_live) {
      // This rank's range of it, or the whole entry (this rank's shard of it under tensor parallelism).
      const auto range = share.range ? share.range(name) : std::nullopt;
      Tensor part =
          read_part(optimizer, name, range ? Shape{range->second - range->first} : optimizer.info(name).shape);
      saved.emplace_back(name, share.shard_of ? share.shard_of(name, part) : part);
    }
    for (const auto& info : optimizer.entries())
      if (info.name.starts_with("ema/") && (!share.keeps_average || share.keeps_average(info.name))) {
        // The whole average of a parameter, or this rank's range of it.
        const auto range = share.range ? share.range(info.name) : std::nullopt;
        Tensor part = read_part(optimizer, info.name,
                                range ? Shape{range->second - range->first} : optimizer.info(info.name).shape);
        average.emplace_back(info.name, share.shard_of ? share.shard_of(info.name, part) : part);
      }
  });
  // The optimizer's own checks first (it refuses an entry that is none of its state, leaving
  // itself unchanged), so that a refusal leaves the weights unloaded too.
  with_context("while loading " + optimizer.describe(), [&] { c.optimizer->load_state(saved); });
  with_context("while loading " + model.describe(), [&] {
    for (const auto& [p, shape] : targets) {
      const auto range = range_of(model, p->name());
      if (share.shard_of) {  // the whole tensor, then this rank's shard of it
        const Tensor whole = read_part(model, p->name(), share.whole_shape(p->name(), p->shape()));
        p->data().copy_from(share.shard_of(p->name(), whole));
        continue;
      }
      model.read_range_into(p->name(), range.first, range.second, p->data());
    }
  });
  return average;
}

}  // namespace loom::training
