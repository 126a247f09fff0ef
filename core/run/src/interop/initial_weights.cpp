// Where a model's starting weights come from (trainer.init_from), and which directory a
// RUN_DIR_OR_CHECKPOINT argument means (docs/checkpoints.md).
#include <fstream>

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

}  // namespace

RunFiles resolve_run_or_checkpoint(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw UserError("'" + path.string() + "' does not exist");
  if (!fs::is_directory(path, ec)) return {path.parent_path().empty() ? fs::path(".") : path.parent_path(), path};
  fs::path dir = path;
  if (fs::exists(path / "checkpoints" / "latest", ec))
    dir = latest_checkpoint(path / "checkpoints");
  else if (fs::exists(path / "latest", ec))
    dir = latest_checkpoint(path);
  // A LoRA run without checkpoints: its final adapters (docs/fine-tuning.md).
  if (!fs::exists(dir / "model.safetensors", ec) && fs::exists(dir / "adapter_model.safetensors", ec))
    return {dir, dir / "adapter_model.safetensors"};
  if (!fs::exists(dir / "model.safetensors", ec))
    throw UserError("'" + path.string() +
                    "' is not a loom run or checkpoint: it holds neither model.safetensors nor checkpoints/latest "
                    "(give a run directory, its checkpoints/ directory, a step-N/ checkpoint or a model.safetensors)");
  return {dir, dir / "model.safetensors"};
}

std::vector<std::string> load_initial_weights(Model& model, const fs::path& source) {
  std::error_code ec;
  if (!fs::exists(source, ec))
    throw UserError("'" + source.string() +
                    "' does not exist (relative paths are relative to the current directory); give a Hugging Face "
                    "model directory, a loom run or checkpoint directory, or a model.safetensors");
  if (is_hf_model_dir(source)) return import_hf(model, source);
  // A Hugging Face directory's weights file: the directory is what describes it.
  const fs::path parent = source.parent_path().empty() ? fs::path(".") : source.parent_path();
  if (!fs::is_directory(source, ec) && is_hf_model_dir(parent) && !fs::exists(parent / "config.yaml", ec))
    return import_hf(model, parent);

  const fs::path weights = resolve_run_or_checkpoint(source).weights;
  const std::vector<ModelParameter> parameters = model.parameters();
  safetensors::load_parameters(weights, parameters);
  return {"read " + std::to_string(parameters.size()) + " parameters from " + weights.string()};
}

}  // namespace loom
