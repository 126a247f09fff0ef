#include "loom/core/plugin_host.hpp"

#include <cxxabi.h>
#include <dlfcn.h>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <cstdlib>
#include <map>
#include <set>

#include "loom/error.hpp"
#include "loom/kinds.hpp"
#include "loom/plugin.hpp"

#ifndef LOOM_INSTALL_PLUGIN_DIR
#define LOOM_INSTALL_PLUGIN_DIR "/usr/local/lib/loom/plugins"
#endif

namespace fs = std::filesystem;

namespace loom {

class LoadedLibrary {
 public:
  explicit LoadedLibrary(boost::dll::shared_library library) : library_(std::move(library)) {}
  boost::dll::shared_library& library() { return library_; }

 private:
  boost::dll::shared_library library_;
};

namespace {

// Collects one plugin's registrations; the host commits them to the registry only if the
// plugin's register function succeeds.
class CollectingRegistrar final : public Registrar {
 public:
  CollectingRegistrar(std::string file, std::shared_ptr<LoadedLibrary> library)
      : file_(std::move(file)), library_(std::move(library)) {}

  void add_component(std::string_view kind, ComponentDecl decl, ComponentFactory factory) override {
    if (!factory) throw UserError("component '" + decl.name + "' was registered without a factory");
    entries_.push_back(ComponentEntry{library_, std::string(kind), std::move(decl), std::move(factory), file_});
  }

  void add_hf_architectures(const HfArchitectures& architectures) override {
    architectures_.push_back(HfArchitectureEntry{library_, architectures, file_});
  }

  void add_hf_tokenizer_class(const HfTokenizerClass& tokenizer_class) override {
    tokenizer_classes_.push_back(HfTokenizerClassEntry{library_, tokenizer_class, file_});
  }

  std::vector<ComponentEntry> take() { return std::move(entries_); }
  std::vector<HfArchitectureEntry> take_architectures() { return std::move(architectures_); }
  std::vector<HfTokenizerClassEntry> take_tokenizer_classes() { return std::move(tokenizer_classes_); }

 private:
  std::string file_;
  std::shared_ptr<LoadedLibrary> library_;
  std::vector<ComponentEntry> entries_;
  std::vector<HfArchitectureEntry> architectures_;
  std::vector<HfTokenizerClassEntry> tokenizer_classes_;
};

// Every library the host has mapped, kept until the process exits (deliberately never
// destroyed): a library is never unloaded during a run, so nothing a plugin made, registered or
// threw can outlive its code.
std::vector<std::shared_ptr<LoadedLibrary>>& resident_libraries() {
  static auto* libraries = new std::vector<std::shared_ptr<LoadedLibrary>>;
  return *libraries;
}

// The dynamic loader's message with each C++ symbol demangled: "undefined symbol:
// _ZN9loom_test7missingEv" reads "undefined symbol: loom_test::missing()".
std::string demangle_symbols(std::string message) {
  const std::string marker = "undefined symbol: ";
  for (std::size_t at = message.find(marker); at != std::string::npos; at = message.find(marker, at)) {
    const std::size_t start = at + marker.size();
    std::size_t end = start;
    while (end < message.size() && message[end] != ',' && message[end] != ' ' && message[end] != '\n') ++end;
    const std::string symbol = message.substr(start, end - start);
    int status = 0;
    char* name = symbol.rfind("_Z", 0) == 0 ? abi::__cxa_demangle(symbol.c_str(), nullptr, nullptr, &status) : nullptr;
    if (name && status == 0) message.replace(start, end - start, name);
    std::free(name);
    at = start;
  }
  return message;
}

bool is_plugin_file_name(const std::string& name) {
  return name.size() > 11 && name.rfind("libloom-", 0) == 0 && name.compare(name.size() - 3, 3, ".so") == 0;
}

}  // namespace

std::vector<PluginSearchPath> PluginHost::default_search_path(const std::vector<PluginSearchPath>& command_line,
                                                              const std::vector<PluginSearchPath>& config_paths) {
  std::vector<PluginSearchPath> search = command_line;
  search.insert(search.end(), config_paths.begin(), config_paths.end());
  if (const char* env = std::getenv("LOOM_PLUGIN_PATH")) {
    std::string value(env);
    std::size_t start = 0;
    while (start <= value.size()) {
      std::size_t end = value.find(':', start);
      if (end == std::string::npos) end = value.size();
      if (end > start) search.push_back({value.substr(start, end - start), "LOOM_PLUGIN_PATH"});
      start = end + 1;
    }
  }
  std::error_code ec;
  const auto exe = boost::dll::program_location(ec);
  if (!ec)
    search.push_back(
        {(exe.parent_path() / ".." / "lib" / "loom" / "plugins").lexically_normal(), "next to the executable"});
  search.push_back({fs::path(LOOM_INSTALL_PLUGIN_DIR), "install directory"});
  return search;
}

void PluginHost::load(const std::vector<PluginSearchPath>& search, Registry& registry) {
  std::set<fs::path> seen_files;
  std::map<std::string, std::string> loaded_names;  // file name -> canonical path that took it
  std::vector<std::string> searched;
  for (const auto& entry : search) {
    std::error_code ec;
    const bool exists = fs::exists(entry.path, ec);
    searched.push_back(entry.path.string() + " (" + entry.origin + (exists ? "" : ", not found") + ")");
    if (!exists) continue;
    std::vector<fs::path> files;
    if (fs::is_directory(entry.path, ec)) {
      for (const auto& f : fs::directory_iterator(entry.path, ec))
        if (is_plugin_file_name(f.path().filename().string()) && !f.is_directory()) files.push_back(f.path());
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(entry.path);
    }
    for (const auto& f : files) {
      const fs::path canonical = fs::weakly_canonical(f, ec);
      if (!seen_files.insert(canonical).second) continue;  // the same file reached twice
      const std::string name = canonical.filename().string();
      if (auto it = loaded_names.find(name); it != loaded_names.end()) {
        PluginRecord r;
        r.file = canonical.string();
        r.origin = entry.origin;
        r.status = PluginRecord::Status::shadowed;
        r.reason = "shadowed by " + it->second + ", found earlier on the plugin path";
        plugins_.push_back(std::move(r));
        continue;
      }
      loaded_names.emplace(name, canonical.string());
      load_file(canonical, entry.origin, registry);
    }
  }
  std::vector<Registry::FailedPlugin> failed;
  for (const auto& p : plugins_)
    if (p.status == PluginRecord::Status::failed) failed.push_back({p.file, p.reason});
  registry.set_search_info(std::move(searched), std::move(failed));
}

void PluginHost::load_file(const fs::path& file, const std::string& origin, Registry& registry) {
  PluginRecord record;
  record.file = file.string();
  record.origin = origin;
  try {
    // 1. The ABI record, read from the file: no code of the plugin has run yet.
    const AbiRecordInfo abi = read_abi_record(file);
    record.sdk_version = abi.sdk_version;
    record.build_tag = abi.build_tag;
    record.isa = abi.isa;
    if (std::string why = check_abi(abi); !why.empty()) throw UserError(why);

    // 2. Load it. RTLD_NOW: an unresolved symbol fails here, not in the middle of a run.
    std::error_code ec;
    boost::dll::shared_library library(file, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local, ec);
    if (ec || !library.is_loaded()) {
      const char* why = dlerror();
      throw UserError("cannot be loaded: " + demangle_symbols(why ? why : ec.message()));
    }
    if (!library.has("loom_plugin_abi"))
      throw UserError("missing symbol loom_plugin_abi (an ABI record section without the exported record)");
    if (!library.has("loom_plugin_register"))
      throw UserError("missing symbol loom_plugin_register: the plugin exports no register function");
    const auto entry =
        reinterpret_cast<LoomRegisterFunction>(const_cast<void*>(library.get<const void*>("loom_plugin_register")));
    auto loaded = std::make_shared<LoadedLibrary>(std::move(library));
    resident_libraries().push_back(loaded);

    // 3. Register, as one transaction.
    CollectingRegistrar registrar(record.file, loaded);
    const LoomRegisterResult result = entry(registrar);
    if (!result.ok) {
      std::string message(result.message, strnlen(result.message, sizeof(result.message)));
      throw UserError("register function failed: " + (message.empty() ? "(no message)" : message));
    }
    std::vector<ComponentEntry> entries = registrar.take();
    for (const auto& e : entries) record.components.push_back(e.kind + "/" + e.decl.name);
    registry.add(std::move(entries), registrar.take_architectures(), registrar.take_tokenizer_classes());
    record.status = PluginRecord::Status::loaded;
  } catch (const std::exception& e) {
    record.status = PluginRecord::Status::failed;
    record.components.clear();
    record.reason = e.what();
  }
  plugins_.push_back(std::move(record));
}

}  // namespace loom
