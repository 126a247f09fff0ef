// The component registry: every component that loaded plugins (or in-process code) registered,
// by kind and name, and the creation of components from validated config nodes.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "loom/component.hpp"
#include "loom/core/config.hpp"
#include "loom/device.hpp"
#include "loom/hf_architecture.hpp"

namespace loom {

// A loaded library; components made by it hold a shared_ptr to it. Opaque outside the host.
class LoadedLibrary;

struct ComponentEntry {
  // First, so it is destroyed last: `factory` and `decl` may hold code and data of the library.
  std::shared_ptr<LoadedLibrary> library;
  std::string kind;
  ComponentDecl decl;
  ComponentFactory factory;
  std::string plugin_file;  // canonical path, or "<built-in>" for in-process registrations
};

// A plugin's claim of Hugging Face model_types (Registrar::add_hf_architectures).
struct HfArchitectureEntry {
  std::shared_ptr<LoadedLibrary> library;  // first, so it is destroyed last (see ComponentEntry)
  HfArchitectures decl;
  std::string plugin_file;
};

// A plugin's declaration of a transformers tokenizer class (Registrar::add_hf_tokenizer_class).
struct HfTokenizerClassEntry {
  std::shared_ptr<LoadedLibrary> library;  // first, so it is destroyed last (see ComponentEntry)
  HfTokenizerClass decl;
  std::string plugin_file;
};

class Registry final : public config::ComponentCatalog {
 public:
  Registry();
  ~Registry() override;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Adds components as one transaction: either all of `entries` are added, or (on a kind/name
  // already taken, or an unknown kind) none is and UserError is thrown naming both files.
  void add(std::vector<ComponentEntry> entries);
  // The same with a plugin's Hugging Face architectures: each names a model component that is
  // among `entries` (or already registered, for in-process registrations) and claims
  // model_types no other plugin claims; otherwise nothing is added and UserError names both files.
  void add(std::vector<ComponentEntry> entries, std::vector<HfArchitectureEntry> architectures);
  // And its tokenizer classes: each model_type is declared by one class, and a class declared by
  // two plugins has the same tokens in both; otherwise nothing is added and UserError names both
  // files.
  void add(std::vector<ComponentEntry> entries, std::vector<HfArchitectureEntry> architectures,
           std::vector<HfTokenizerClassEntry> tokenizer_classes);

  // The plugin that claims config.json's `model_type`, or nullptr.
  const HfArchitectureEntry* find_hf_architecture(std::string_view model_type) const;
  // Every claim, by model component name (then in the order each plugin declared them).
  std::vector<const HfArchitectureEntry*> hf_architectures() const;
  // The tokenizer class named `name` (HfTokenizerClass::name or one of `also`, either with "Fast"
  // after it: "LlamaTokenizerFast"), or nullptr.
  const HfTokenizerClassEntry* find_hf_tokenizer_class(std::string_view name) const;
  // AutoTokenizer's class for config.json's `model_type` (HfTokenizerClass::model_types), or nullptr.
  const HfTokenizerClassEntry* find_hf_tokenizer_class_of(std::string_view model_type) const;

  const ComponentEntry* find(std::string_view kind, std::string_view name) const;
  // Sorted by name.
  std::vector<const ComponentEntry*> list(std::string_view kind) const;
  std::vector<const ComponentEntry*> all() const;

  // Diagnostics for "unknown type" errors: where plugins were searched and which failed.
  struct FailedPlugin {
    std::string file;
    std::string reason;
  };
  void set_search_info(std::vector<std::string> searched_dirs, std::vector<FailedPlugin> failed);
  const std::vector<std::string>& searched_dirs() const { return searched_dirs_; }
  const std::vector<FailedPlugin>& failed_plugins() const { return failed_; }

  // config::ComponentCatalog
  const OptionSchema& component_schema(std::string_view kind, std::string_view name, std::string_view path,
                                       const SourceLocation& where) const override;

  // The thread pool handed to components through CreateContext::execution(); the process's
  // default context until set. Not owned; must outlive the registry's components.
  void set_execution_context(ExecutionContext* context) { execution_ = context; }
  ExecutionContext& execution() const;

  // `auto` as the name of an attention kernel (`model.attention: auto`, every model's default):
  // the kernel on the backend's device that its ComponentDecl::preference ranks first
  // (docs/attention-kernels.md#auto). The run layer resolves it against the configured backend
  // before it creates the model (loom::resolve_attention_kernel); a component created here
  // with `auto` gets the host's kernel. No attention kernel may be named `auto`.
  static constexpr std::string_view auto_attention = "auto";

  // The attention kernels that compute on `device`, most preferred first (preference, then
  // name), each with the device its default instance declares (AttentionKernel::device()):
  // every attention kernel is created with its defaults and asked. A kernel that cannot be
  // created here (a GPU's, on a machine without that GPU) is left out, with the reason in
  // `unavailable` when given.
  std::vector<std::string> attention_kernels_on(const Device& device,
                                                std::vector<std::string>* unavailable = nullptr) const;
  // Every loaded attention kernel and the device its default instance computes on ("host",
  // "guarded:0"), or why it cannot be created: "flash (host), guarded (guarded:0)". For messages.
  std::string describe_attention_devices() const;

  // Validates `ref.node` and creates the component. The handle keeps the plugin loaded.
  Handle<Component> create(std::string_view kind, const ComponentRef& ref) const;
  template <class T>
  Handle<T> create(const ComponentRef& ref) const {
    return std::static_pointer_cast<T>(create(T::kind, ref));
  }

 private:
  [[noreturn]] void throw_unknown(std::string_view kind, std::string_view name, std::string_view path,
                                  const SourceLocation& where) const;
  std::map<std::string, std::map<std::string, ComponentEntry, std::less<>>, std::less<>> entries_;
  std::vector<HfArchitectureEntry> hf_architectures_;
  std::vector<HfTokenizerClassEntry> hf_tokenizer_classes_;
  // kind/name claimed by a plugin that failed for it: the files of both claimants.
  std::map<std::string, std::pair<std::string, std::string>, std::less<>> conflicts_;
  ExecutionContext* execution_ = nullptr;
  std::vector<std::string> searched_dirs_;
  std::vector<FailedPlugin> failed_;
};

}  // namespace loom
