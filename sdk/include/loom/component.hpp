// Components, handles, and how a plugin registers them.
//
// A component is an object of one of loom's kinds (backend, model, attention, optimizer, dataset,
// tokenizer, lr_schedule, tracker) created by name from a config node. Plugins register a
// factory per component in their register function (see plugin.hpp); the core's registry
// validates the node against the component's declared options, calls the factory, and hands the
// object out as a Handle.
//
// Ownership: a Handle<T> is a shared_ptr whose control block also owns a reference to the plugin
// library that made the object, so the library outlives every object it created (OpenVINO's
// SoPtr idiom). Code must not copy a component's vtable, function pointers or static data out of
// its handle's lifetime.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "loom/error.hpp"
#include "loom/execution.hpp"
#include "loom/options.hpp"

namespace loom {

struct HfArchitectures;   // hf_architecture.hpp
struct HfTokenizerClass;  // hf_architecture.hpp

// Base of every kind's interface. The destructor is defined in libloom_core.so, so every
// interface's vtable and type information live there and are shared by all plugins.
class Component {
 public:
  virtual ~Component();
};

template <class T>
using Handle = std::shared_ptr<T>;

// What a plugin says about one component it provides, written with designated initializers so
// that no two of its strings can trade places unnoticed:
//
//   registrar.add<loom::LrSchedule>({.name = "exponential",
//                                    .description = "exponential decay: peak * decay_rate^(step / decay_steps)",
//                                    .version = "1.0.0",
//                                    .options = options()},
//                                   factory);
//
// A positional initializer ({"exponential", "...", "1.0.0", options()}) does not compile: the
// first member accepts nothing but its own default. `options` may be left out (no options).
struct ComponentDecl {
  struct DesignatedOnly {
    explicit DesignatedOnly() = default;
  };
  [[no_unique_address]] DesignatedOnly designated_only{};  // never written: see above

  std::string name{};         // unique within its kind: "adamw", "flash", "gpt2"
  std::string description{};  // one line, shown by `loom plugins`
  std::string version{};      // the component's version, shown by `loom plugins`
  OptionSchema options{};     // everything its config node may contain besides `type`
  // How strongly an `auto` choice prefers this component among those of its kind that fit
  // (today `model.attention: auto`, among the attention kernels on the backend's device):
  // higher first, then by name; 0 (the default) for a component that says nothing.
  // docs/attention-kernels.md#auto says what the built-in kernels declare and why.
  int preference = 0;
};

// Handed to factories. Lets a component create the components it is configured with (a model
// its attention kernel, an optimizer its schedule) without knowing which plugin provides them.
// Only valid during the factory call; do not keep a reference.
class CreateContext {
 public:
  virtual ~CreateContext();

  template <class T>
  Handle<T> create(const ComponentRef& ref) const {
    return std::static_pointer_cast<T>(create_component(T::kind, ref));
  }

  // Validates `ref.node` against the schema of component `ref.name` of `kind` and creates it.
  // Throws UserError for an unknown name or an invalid node.
  virtual Handle<Component> create_component(std::string_view kind, const ComponentRef& ref) const = 0;

  // The core's thread pool, for components that compute.
  virtual ExecutionContext& execution() const = 0;
};

using ComponentFactory = std::function<std::unique_ptr<Component>(const Options&, const CreateContext&)>;

// Given to a plugin's register function. Registration is explicit: the plugin calls add once
// per component. A plugin's registrations are committed only if its register function succeeds
// as a whole; a name already taken by another plugin makes the whole plugin fail to load.
class Registrar {
 public:
  virtual ~Registrar();

  // Registers a component of the kind of `Interface` (e.g. loom::Optimizer). `factory` is
  // called as factory(const Options&, const CreateContext&) and returns std::unique_ptr<Impl>
  // with Impl derived from Interface.
  template <class Interface, class Factory>
  void add(ComponentDecl decl, Factory factory) {
    add_component(Interface::kind, std::move(decl),
                  [f = std::move(factory)](const Options& o, const CreateContext& c) -> std::unique_ptr<Component> {
                    std::unique_ptr<Interface> object = f(o, c);
                    return object;
                  });
  }

  virtual void add_component(std::string_view kind, ComponentDecl decl, ComponentFactory factory) = 0;

  // Declares the Hugging Face architectures (config.json model_types) that the model component
  // `architectures.model`, registered by this plugin too, reads, and how (hf_architecture.hpp).
  // Optional: a model plugin without it still loads, builds and exports; only `loom eval HF_DIR`
  // cannot describe a directory of its types. Since plugin ABI 13.1 (the host implements it; an
  // older plugin never calls it).
  virtual void add_hf_architectures(const HfArchitectures& architectures) = 0;

  // Declares a transformers tokenizer class, its default special tokens and the model_types whose
  // tokenizer it is (hf_architecture.hpp), which `loom eval HF_DIR` reads where a directory's
  // tokenizer files name no BOS or EOS. Optional, as add_hf_architectures. Since plugin ABI 13.2
  // (the host implements it; an older plugin never calls it).
  virtual void add_hf_tokenizer_class(const HfTokenizerClass& tokenizer_class) = 0;
};

}  // namespace loom
