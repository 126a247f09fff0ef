// The instruction set a plugin needs (its ABI record's LOOM_BUILD_ISA) against what this CPU runs.
#include <algorithm>
#include <string>
#include <vector>

#include "loom/build_isa.hpp"
#include "loom/core/cpu_detect.hpp"
#include "loom/core/plugin_host.hpp"

namespace loom {

namespace {

bool has(const std::vector<std::string>& features, const std::string& name) {
  return std::find(features.begin(), features.end(), name) != features.end();
}

std::string join(const std::vector<std::string>& names, const char* separator) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : separator) + n;
  return out;
}

// The first part of a LOOM_BUILD_ISA string ("x86-64-v3", "aarch64").
std::string base_of(const std::string& isa) {
  return isa.substr(0, isa.find('+'));
}

}  // namespace

std::string host_isa() {
  return LOOM_BUILD_ISA;
}

std::vector<std::string> host_cpu_features() {
  static const std::vector<std::string> features = [] {
    bool supported[cpu_detect::feature_count];
    cpu_detect::detect(supported);
    std::vector<std::string> names;
    for (int i = 0; i < cpu_detect::feature_count; ++i)
      if (supported[i]) names.emplace_back(cpu_detect::features[i].name);
    return names;
  }();
  return features;
}

std::string describe_cpu(const std::vector<std::string>& cpu_features) {
  if (base_of(host_isa()).rfind("x86-64", 0) != 0) return base_of(host_isa());
  int level = 1;
  for (int l = 2; l <= 4; ++l) {
    bool all = true;
    for (const auto& f : cpu_detect::features)
      if (f.level >= 2 && f.level <= l && !has(cpu_features, f.name)) all = false;
    if (!all) break;
    level = l;
  }
  std::string out = level == 1 ? "x86-64" : "x86-64-v" + std::to_string(level);
  for (const auto& f : cpu_detect::features)
    if ((f.level == 0 || f.level > level) && has(cpu_features, f.name)) out += std::string("+") + f.name;
  return out;
}

std::string check_isa(const std::string& isa, const std::vector<std::string>& cpu_features) {
  if (isa.empty())
    return "instruction set: the plugin's ABI record names none; rebuild the plugin against the SDK installed with "
           "this loom";
  std::vector<std::string> parts;
  for (std::size_t start = 0; start <= isa.size();) {
    std::size_t end = isa.find('+', start);
    if (end == std::string::npos) end = isa.size();
    if (end > start) parts.push_back(isa.substr(start, end - start));
    start = end + 1;
  }
  const int level = parts.empty() ? 0 : cpu_detect::level_of(parts[0].data(), static_cast<int>(parts[0].size()));
  if (level == 0) {
    // Not x86-64 ("aarch64"): no extensions are recorded, the processor must be the host's.
    if (!parts.empty() && parts[0] == base_of(host_isa())) return "";
    return "instruction set: the plugin is built for " + isa + ", this loom for " + host_isa();
  }
  std::vector<std::string> missing, unknown;
  for (const auto& f : cpu_detect::features)
    if (f.level >= 2 && f.level <= level && !has(cpu_features, f.name)) missing.emplace_back(f.name);
  for (std::size_t i = 1; i < parts.size(); ++i) {
    if (cpu_detect::find_feature(parts[i].data(), static_cast<int>(parts[i].size())) < 0)
      unknown.push_back(parts[i]);
    else if (!has(cpu_features, parts[i]))
      missing.push_back(parts[i]);
  }
  if (!unknown.empty())
    return "instruction set: the plugin needs " + join(unknown, ", ") +
           ", which this loom cannot check on this CPU (it is built for " + isa +
           "); rebuild it for a level this CPU has (-march=" + base_of(describe_cpu(cpu_features)) +
           ", or without -march=native)";
  if (!missing.empty())
    return "instruction set: the plugin needs " + join(missing, ", ") + ", which this CPU (" +
           describe_cpu(cpu_features) + ") lacks: it is built for " + isa +
           " (-march=native on another machine?); rebuild it without -march=native, or with -march=" +
           base_of(describe_cpu(cpu_features)) + " or lower (this loom is built for " + base_of(host_isa()) + ")";
  return "";
}

}  // namespace loom
