#include "conformance_setup.hpp"

namespace loom::conformance {

Setup& setup() {
  static Setup s = [] {
    Setup d;
#ifdef LOOM_PLUGIN_DIR
    d.plugin_dir = LOOM_PLUGIN_DIR;
#endif
#ifdef LOOM_TORCH_REFERENCE_DIR
    d.torch_reference_dir = LOOM_TORCH_REFERENCE_DIR;
#endif
    return d;
  }();
  return s;
}

std::filesystem::path oracle_file(const std::string& kind_and_name) {
  return setup().plugin_dir / ("libloom-" + kind_and_name + ".so");
}

std::vector<PluginSearchPath> plugins() {
  const Setup& s = setup();
  if (s.subject.empty()) return {{s.plugin_dir, "the build's plugins"}};
  return {{oracle_file("backend-reference"), "oracle"},
          {oracle_file("attention-naive"), "oracle"},
          {s.subject, "the plugin under test"}};
}

}  // namespace loom::conformance
