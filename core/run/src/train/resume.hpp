// trainer.resume: whether a run continues from a checkpoint, which one, and whether the config
// still fits it. auto (the default) continues from the run directory's latest valid checkpoint
// (passing over corrupt ones with a warning), starts afresh when there is no checkpoint, and
// refuses when there are checkpoints and none verifies; never starts afresh, refusing a directory
// with final weights or a valid checkpoint; a path continues from that checkpoint, which must
// verify. A run directory that holds a finished run is never trained over, and a checkpoint that
// fails verification is moved aside, never deleted (CheckpointStore::discard_after).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint_store.hpp"
#include "checkpoint/train_record.hpp"
#include "loom/options.hpp"
#include "loom/value.hpp"
#include "train/components.hpp"
#include "train/run_directory.hpp"

namespace loom::training {

// A checkpoint a run continues from, verified and read.
struct ResumePoint {
  std::filesystem::path dir;  // step-<N>/
  checkpoint::TrainRecord record;
  std::string config_text;      // its config.yaml
  std::string tokenizer_state;  // its tokenizer.state ("" when it has none)
};

// Reads the checkpoint in `dir` (its state.json, config.yaml and tokenizer.state) without
// verifying it: for the ranks of a data-parallel run, to which rank 0 names the checkpoint it
// verified. Throws UserError for a file that cannot be read or parsed.
ResumePoint read_point(const std::filesystem::path& dir);

struct ResumeDecision {
  std::optional<ResumePoint> point;  // nullopt: start at step 0
  bool finished = false;             // the run is complete: nothing to train
  std::vector<std::string> warnings;
};

// Decides from trainer.resume, the run directory and its checkpoint store. Throws UserError for
// a directory with final weights or a valid checkpoint under `never`, for checkpoints none of
// which verifies under auto (naming each; nothing is changed), for a finished run without a
// checkpoint under auto, for an explicit checkpoint that does not verify (naming the file and
// what is wrong), and for a checkpoint past trainer.num_train_steps.
ResumeDecision decide_resume(const Options& trainer, const RunDirectory& directory,
                             const checkpoint::CheckpointStore& store, std::int64_t num_steps);

// One key whose value differs between two configs ("" for a key one of them lacks).
struct ConfigChange {
  std::string key, before, after;
};
// The keys whose values differ, in the order of `after` (then keys only `before` has). Both are
// compared as their YAML text reads back, so a number written as 1 and as 1.0 is the same.
std::vector<ConfigChange> diff_configs(const std::string& before_yaml, const std::string& after_yaml);

// Before anything is built: the checkpoint's optimizer must be the configured one (UserError
// naming optimizer.type otherwise). Returns the warnings to print: options changed since the
// checkpoint (the continuation then differs from an uninterrupted run), a raised
// num_train_steps, another thread count.
std::vector<std::string> check_resume_config(const ResumePoint& point, const std::string& config_yaml,
                                             std::int64_t num_steps);

// What part of a checkpoint's entries this rank holds, when the ranks hold different state.
struct RankShare {
  // The optimizer state entries ("slot/parameter") this rank's optimizer holds (every entry when
  // unset): a rank's shard of a run with trainer.shard_optimizer_state.
  std::function<bool(const std::string&)> keeps;
  // Elements [begin, end) of an entry's flat values (a parameter, an optimizer state entry, or a
  // weight average "ema/<parameter>") when this rank holds that range of it rather than the whole
  // (FSDP); nullopt: the whole. The live tensor then has end - begin elements.
  std::function<std::optional<std::pair<std::int64_t, std::int64_t>>(const std::string&)> range;
  // The weight average entries ("ema/<parameter>") this rank holds (every one when unset).
  std::function<bool(const std::string&)> keeps_average;
  // FSDP: the parameters the weights load into, with the global shape each is a range of (in
  // place of the model's own parameters, whose values live in sharded units).
  std::vector<std::pair<Parameter*, Shape>> weights;
  // Tensor parallelism: the whole shape of entry `name` whose live tensor (this rank's shard) has
  // shape `live`, and this rank's shard of the whole tensor read. Unset: the live tensors are
  // whole.
  std::function<Shape(const std::string& name, const Shape& live)> whole_shape;
  std::function<Tensor(const std::string& name, const Tensor& whole)> shard_of;
};

// Once the components are built and the optimizer initialised: checks the tokenizer's vocabulary
// and the model's tensors against the checkpoint's (UserErrors naming the config keys that
// differ), then loads the weights and the optimizer state. Nothing is loaded unless every check
// passes. The checkpoint may have been written by any number of ranks on any mesh: each tensor,
// or the range of it that `share` asks for, is assembled from the files that hold it
// (checkpoint::TensorSet), and a part no file holds is an error naming the checkpoint, the entry
// and the elements.
// Returns the checkpoint's weight average ("ema/<parameter>" entries of optimizer.safetensors,
// under trainer.ema_decay), which the caller restores once it has made the average.
std::vector<std::pair<std::string, Tensor>> load_checkpoint_tensors(const ResumePoint& point, RunComponents& components,
                                                                    const std::string& config_yaml,
                                                                    const RankShare& share = {});

}  // namespace loom::training
