// Where a model's starting weights come from (trainer.init_from), and which directory a
// RUN_DIR_OR_CHECKPOINT argument means (docs/checkpoints.md).
#include <algorithm>
#include <fstream>
#include <map>
#include <set>

#include "checkpoint/sharded_checkpoint.hpp"
#include "loom/core/config.hpp"
#include "loom/error.hpp"
#include "loom/run/hf_interop.hpp"
#include "loom/safetensors.hpp"

namespace fs = std::filesystem;

namespace loom {

namespace {

// checkpoints/latest: "step-<N>\n", naming a directory beside it.
fs::path latest_checkpoint(const fs::path& checkpoints) {
  std::ifstream in(checkpoints / "latest");
  std::string step;
  std::getline(in, step);
  while (!step.empty() && (step.back() == '\r' || step.back() == ' ')) step.pop_back();
  std::error_code ec;
  if (step.empty() || step.find('/') != std::string::npos || !fs::is_directory(checkpoints / step, ec))
    throw UserError("'" + (checkpoints / "latest").string() +
                    "' should name a checkpoint directory beside it (step-N)" +
                    (step.empty() ? std::string(", but it is empty") : ", but '" + step + "' is not one"));
  return checkpoints / step;
}

// What a run's final weights file holds: its "loom.weights" metadata ("ema" or "live"), or for
// a file written before it existed, the run's trainer.ema_decay (the final save has always
// taken the average).
bool final_weights_are_average(const fs::path& dir, const std::map<std::string, std::string>& metadata) {
  if (const auto it = metadata.find("loom.weights"); it != metadata.end()) return it->second == "ema";
  std::error_code ec;
  if (!fs::exists(dir / "config.yaml", ec)) return false;
  try {
    const Value config = config::load_file(dir / "config.yaml");
    const Value* decay = config.at_path("trainer.ema_decay");
    return decay && decay->is_number() && decay->as_double() > 0;
  } catch (const UserError&) {
    return false;
  }
}

}  // namespace

WeightsChoice parse_weights_choice(std::string_view text, std::string_view option) {
  if (text == "ema") return WeightsChoice::ema;
  if (text == "live") return WeightsChoice::live;
  throw UserError(std::string(option) + " is '" + std::string(text) +
                  "': give ema (the weight average of a run with trainer.ema_decay, the default) or live (the "
                  "weights the optimizer updated)");
}

RunFiles choose_weights(const fs::path& dir, const fs::path& weights, WeightsChoice choice) {
  RunFiles files{dir, weights, {}, {}, false};
  std::error_code ec;
  const bool checkpoint = weights.filename() == "model.safetensors" &&
                          (fs::exists(dir / "optimizer.safetensors", ec) || checkpoint::is_sharded_checkpoint(dir));
  if (checkpoint) {
    // A checkpoint: model.safetensors holds the live weights, and its optimizer.safetensors the
    // average ("ema/<parameter>") beside the optimizer's state; or each holds them in the rank
    // files of the ranks that wrote it (checkpoint::TensorSet reads either).
    const fs::path optimizer = dir / "optimizer.safetensors";
    const checkpoint::TensorSet set(dir, "optimizer");
    files.has_average = std::any_of(set.entries().begin(), set.entries().end(),
                                    [](const auto& t) { return t.name.starts_with("ema/"); });
    if (choice == WeightsChoice::ema && files.has_average) {
      files.average = optimizer;
      files.description = "the weight average (trainer.ema_decay) of checkpoint " + dir.string();
    } else {
      files.description = "the live weights of checkpoint " + dir.string();
      if (choice == WeightsChoice::ema) files.description += " (its run kept no weight average)";
    }
    return files;
  }
  // A run's final weights (or a weights file of its own).
  const safetensors::Reader reader(weights);
  files.has_average = final_weights_are_average(dir, reader.metadata());
  if (!files.has_average) {
    files.description = "the weights of " + weights.string();
    if (choice == WeightsChoice::ema) files.description += " (its run kept no weight average)";
    return files;
  }
  if (choice == WeightsChoice::ema) {
    files.description = "the weight average (trainer.ema_decay) of " + weights.string();
    return files;
  }
  // The live weights of a run that saved its average: its checkpoint of the same step has them.
  const auto step = reader.metadata().find("loom.step");
  if (step != reader.metadata().end()) {
    const fs::path at = dir / "checkpoints" / ("step-" + step->second);
    if (fs::exists(at / "model.safetensors", ec) && fs::exists(at / "optimizer.safetensors", ec)) {
      RunFiles live = choose_weights(at, at / "model.safetensors", WeightsChoice::live);
      live.description += " (" + weights.string() + " holds the weight average)";
      return live;
    }
  }
  throw UserError("'" + weights.string() +
                  "' holds the weight average of its run (trainer.ema_decay), and the live weights were saved only in "
                  "checkpoints: there is no checkpoint of its step" +
                  (step != reader.metadata().end() ? " (" + dir.string() + "/checkpoints/step-" + step->second + ")"
                                                   : std::string()) +
                  ". Take the average (ema), or give a checkpoint of the run");
}

void load_run_weights(const RunFiles& files, const std::vector<ModelParameter>& parameters) {
  // A file, or a sharded checkpoint's rank files (the whole tensors assembled from them).
  const checkpoint::TensorSet weights = checkpoint::TensorSet::open(files.weights);
  if (files.average.empty()) {
    weights.load_parameters(parameters);
    return;
  }
  // The average covers the trained parameters (all of them, or the ones not frozen): it is read
  // first, so that a file that does not fit changes nothing.
  const checkpoint::TensorSet average = checkpoint::TensorSet::open(files.average);
  std::vector<std::pair<const ModelParameter*, Tensor>> replaced;
  for (const auto& p : parameters) {
    const std::string name = "ema/" + p.parameter->name();
    if (!average.contains(name)) continue;
    Tensor t = p.parameter->data().clone();
    average.read_into(name, t);
    replaced.emplace_back(&p, std::move(t));
  }
  std::set<std::string> known;
  for (const auto& p : parameters) known.insert("ema/" + p.parameter->name());
  for (const auto& info : average.entries())
    if (info.name.starts_with("ema/") && !known.contains(info.name))
      throw UserError(average.describe() + " holds the weight average of '" + info.name.substr(4) +
                      "', which is no parameter of this model");
  weights.load_parameters(parameters);
  for (auto& [p, t] : replaced) p->parameter->data().copy_from(t);
}

RunFiles resolve_run_or_checkpoint(const fs::path& path, WeightsChoice choice) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw UserError("'" + path.string() + "' does not exist");
  if (!fs::is_directory(path, ec))
    return choose_weights(path.parent_path().empty() ? fs::path(".") : path.parent_path(), path, choice);
  fs::path dir = path;
  if (fs::exists(path / "checkpoints" / "latest", ec))
    dir = latest_checkpoint(path / "checkpoints");
  else if (fs::exists(path / "latest", ec))
    dir = latest_checkpoint(path);
  // A LoRA run without checkpoints: its final adapters (docs/fine-tuning.md).
  if (!fs::exists(dir / "model.safetensors", ec) && fs::exists(dir / "adapter_model.safetensors", ec))
    return choose_weights(dir, dir / "adapter_model.safetensors", choice);
  if (!fs::exists(dir / "model.safetensors", ec) && !checkpoint::is_sharded_checkpoint(dir))
    throw UserError("'" + path.string() +
                    "' is not a loom run or checkpoint: it holds neither model.safetensors nor checkpoints/latest "
                    "(give a run directory, its checkpoints/ directory, a step-N/ checkpoint or a model.safetensors)");
  return choose_weights(dir, dir / "model.safetensors", choice);
}

fs::path hf_source_dir(const fs::path& source) {
  std::error_code ec;
  if (is_hf_model_dir(source)) return source;
  // A Hugging Face directory's weights file: the directory is what describes it.
  const fs::path parent = source.parent_path().empty() ? fs::path(".") : source.parent_path();
  if (fs::exists(source, ec) && !fs::is_directory(source, ec) && is_hf_model_dir(parent) &&
      !fs::exists(parent / "config.yaml", ec))
    return parent;
  return {};
}

std::vector<std::string> load_initial_weights(Model& model, const fs::path& source, WeightsChoice choice,
                                              const StoredWeights* stored) {
  std::error_code ec;
  if (!fs::exists(source, ec))
    throw UserError("'" + source.string() +
                    "' does not exist (relative paths are relative to the current directory); give a Hugging Face "
                    "model directory, a loom run or checkpoint directory, or a model.safetensors");
  if (const fs::path hf = hf_source_dir(source); !hf.empty()) return import_hf(model, hf, stored);

  const RunFiles files = resolve_run_or_checkpoint(source, choice);
  const std::vector<ModelParameter> parameters = model.parameters();
  load_run_weights(files, parameters);
  return {"read " + std::to_string(parameters.size()) + " parameters: " + files.description};
}

}  // namespace loom
