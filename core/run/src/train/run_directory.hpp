// A run's directory: where its config, tokenizer state, metrics and weights go. The directory of
// a finished run is what `loom generate` loads; checkpoints belong here too.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "loom/kinds/model.hpp"
#include "loom/options.hpp"
#include "loom/value.hpp"

namespace loom::training {

class RunDirectory {
 public:
  RunDirectory() = default;

  // Names the run (trainer.run_id, else the config file's name and the start time) and its
  // directory (trainer.run_dir, else runs/<run_id>), creates it and writes config.yaml, the
  // resolved `config`. An existing run is never overwritten: a directory that already holds
  // metrics or weights is a UserError.
  static RunDirectory create(const Options& trainer, const Value& config);

  const std::filesystem::path& path() const { return path_; }
  const std::string& run_id() const { return run_id_; }

  // tokenizer.state, when the tokenizer has a state (a vocabulary fitted to the training data)
  // that `loom generate` needs back.
  void write_tokenizer_state(const std::string& state) const;
  // model.safetensors: the weights after `step` steps.
  void save_weights(const std::vector<ModelParameter>& parameters, std::int64_t step) const;

 private:
  std::filesystem::path path_;
  std::string run_id_;
};

}  // namespace loom::training
