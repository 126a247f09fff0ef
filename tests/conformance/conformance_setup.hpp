// Where the conformance suites get the plugins they test and the oracles they test them against.
//
// Two ways to run them:
//   * loom's own test build (attention_conformance_tests, loom_conformance_tests,
//     optimizer_conformance_tests): every component the build's plugins register is under test;
//   * `loom conformance PLUGIN.so` (the installed runner, lib/loom/loom-conformance): only the
//     components of PLUGIN.so are, against the installed oracles — the `reference` backend, the
//     `naive` attention kernel and the recorded PyTorch optimizer trajectories.
#pragma once

#include <filesystem>
#include <loom/core/plugin_host.hpp>
#include <string>
#include <vector>

namespace loom::conformance {

struct Setup {
  // The directory of the oracle plugins (libloom-backend-reference.so, libloom-attention-naive.so):
  // the build's plugin directory, or the installed one.
  std::filesystem::path plugin_dir;
  // The plugin under test; empty in loom's own build, where every plugin of plugin_dir is.
  std::filesystem::path subject;
  // index.json and data.bin from tests/conformance/optimizer/torch_reference.py.
  std::filesystem::path torch_reference_dir;
};

// The process's setup: in loom's build, from the compile definitions LOOM_PLUGIN_DIR and
// LOOM_TORCH_REFERENCE_DIR; the runner fills it from its command line before any test starts.
Setup& setup();

// What a suite loads: plugin_dir, or (with a subject) the oracles and the subject only.
std::vector<PluginSearchPath> plugins();

// The oracle plugins' files, by the name loom_add_plugin gives them.
std::filesystem::path oracle_file(const std::string& kind_and_name);

}  // namespace loom::conformance
