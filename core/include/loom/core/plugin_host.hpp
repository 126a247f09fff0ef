// The plugin host: finds plugin files, checks their ABI record, loads them with Boost.DLL and
// runs their register functions into a Registry.
//
// Search order (each a directory, or a plugin file):
//   1. --plugin-path on the command line (repeatable), in order;
//   2. `plugins.paths` in the config (relative to the config file that names them);
//   3. LOOM_PLUGIN_PATH, colon-separated;
//   4. <directory of the loom executable>/../lib/loom/plugins;
//   5. the install directory (<prefix>/lib/loom/plugins).
// In a directory, files named libloom-*.so are taken in name order. A file reached twice (same
// canonical path) loads once. A file whose name was already loaded from an earlier directory is
// shadowed (recorded, not loaded): earlier directories override later ones, as with PATH.
//
// A library, once mapped, stays mapped until the process exits, whether its registration
// succeeded or not (its static initialisers have run).
//
// A plugin that fails (not an ELF shared object, no ABI record, ABI mismatch, missing register
// symbol, unloadable, register threw or returned an error, or a component name another plugin
// already claims) is recorded with its reason and never crashes the host.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/registry.hpp"

namespace loom {

struct PluginSearchPath {
  std::filesystem::path path;
  std::string origin;  // "--plugin-path", "plugins.paths (x.yaml)", "LOOM_PLUGIN_PATH", ...
};

struct PluginRecord {
  enum class Status { loaded, failed, shadowed };
  std::string file;  // canonical path
  std::string origin;
  Status status = Status::failed;
  std::string reason;                   // why it failed or what shadows it
  std::string sdk_version;              // from its ABI record, when readable
  std::string build_tag;                // from its ABI record, when readable
  std::string isa;                      // from its ABI record (ABI 7 and newer), when readable
  std::vector<std::string> components;  // "kind/name" registered by it
};

// What a plugin's ABI record says, read from the file without loading it.
struct AbiRecordInfo {
  unsigned abi_major = 0, abi_minor = 0;
  std::string sdk_version, build_tag;
  std::string isa;  // empty in records of ABI 6 and older, which have no such field
};
// Reads the `loom_abi` section of an ELF shared object, in this ABI's layout or the shorter one
// of ABI 6 and older (so that those are refused by their version, not as malformed). Throws
// UserError saying why the file is not a loom plugin (not ELF, not a shared object, no record,
// malformed record).
AbiRecordInfo read_abi_record(const std::filesystem::path& file);
// Empty when a plugin with this record may be loaded by this host on this CPU; else the reason,
// saying what to change. What is checked is what breaks compatibility: the ABI version, the C++
// ABI (Itanium), the standard library (libstdc++, its dual ABI, a release no newer than the
// host's) and the instruction set; not the compiler's name.
std::string check_abi(const AbiRecordInfo& record);
// The host's own build tag ("gcc-12.2;cxxabi=itanium;stdlib=libstdc++-12;cxx11abi=1").
std::string host_build_tag();
// The instruction set the host was compiled for (LOOM_BUILD_ISA: "x86-64-v3").
std::string host_isa();

// The instruction-set extensions this CPU runs, by LOOM_BUILD_ISA's names (cpuid and the OS's
// saved register state); empty off x86-64.
std::vector<std::string> host_cpu_features();
// The x86-64 level `cpu_features` make up, with the extensions beyond it: "x86-64-v4+avx512bf16+...".
std::string describe_cpu(const std::vector<std::string>& cpu_features);
// Empty when a CPU with `cpu_features` runs code built for `isa` (a LOOM_BUILD_ISA string); else
// the reason: the extensions it lacks, or names this loom cannot check.
std::string check_isa(const std::string& isa, const std::vector<std::string>& cpu_features);

class PluginHost {
 public:
  // The default search path: `command_line` and `config_paths` first, then LOOM_PLUGIN_PATH,
  // the executable-relative directory and the install directory.
  static std::vector<PluginSearchPath> default_search_path(const std::vector<PluginSearchPath>& command_line,
                                                           const std::vector<PluginSearchPath>& config_paths);

  // Loads every plugin found along `search` into `registry`.
  void load(const std::vector<PluginSearchPath>& search, Registry& registry);

  const std::vector<PluginRecord>& plugins() const { return plugins_; }

 private:
  void load_file(const std::filesystem::path& file, const std::string& origin, Registry& registry);
  std::vector<PluginRecord> plugins_;
};

}  // namespace loom
