#include "loom/core/registry.hpp"

#include <algorithm>
#include <cctype>
#include <optional>

#include "loom/error.hpp"
#include "loom/kinds.hpp"
#include "loom/kinds/attention.hpp"
#include "loom/kinds/model.hpp"

namespace loom {

Registry::Registry() = default;
Registry::~Registry() = default;

namespace {

bool valid_name(std::string_view name) {
  if (name.empty()) return false;
  for (char c : name)
    if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '_' ||
          c == '-' || c == '.'))
      return false;
  return true;
}

std::string plural_kind(std::string_view kind) {
  if (kind == "attention") return "attention kernels";
  if (kind == "lr_schedule") return "lr_schedules";
  return std::string(kind) + "s";
}

class RegistryCreateContext final : public CreateContext {
 public:
  explicit RegistryCreateContext(const Registry& r) : registry_(r) {}
  Handle<Component> create_component(std::string_view kind, const ComponentRef& ref) const override {
    return registry_.create(kind, ref);
  }
  ExecutionContext& execution() const override { return registry_.execution(); }

 private:
  const Registry& registry_;
};

// The object and the library that made it, destroyed in that order.
struct ComponentHolder {
  std::shared_ptr<LoadedLibrary> library;
  std::unique_ptr<Component> object;
  ~ComponentHolder() { object.reset(); }
};

// A tokenizer class's name without its fast twin's "Fast": "LlamaTokenizerFast" -> "LlamaTokenizer".
std::string_view slow_tokenizer_name(std::string_view name) {
  if (name.size() > 4 && name.ends_with("Fast")) name.remove_suffix(4);
  return name;
}

bool names_tokenizer_class(const HfTokenizerClass& c, std::string_view name) {
  const std::string_view slow = slow_tokenizer_name(name);
  if (slow_tokenizer_name(c.name) == slow) return true;
  return std::any_of(c.also.begin(), c.also.end(),
                     [&](const std::string& also) { return slow_tokenizer_name(also) == slow; });
}

// "bos_token \"<s>\" and eos_token \"</s>\"", "bos_token none and ...".
std::string tokenizer_tokens(const HfTokenizerClass& c) {
  auto token = [](const std::optional<std::string>& t) { return t ? Value(*t).describe() : std::string("none"); };
  return "bos_token " + token(c.bos_token) + " and eos_token " + token(c.eos_token);
}

}  // namespace

void Registry::add(std::vector<ComponentEntry> entries) {
  add(std::move(entries), {}, {});
}

void Registry::add(std::vector<ComponentEntry> entries, std::vector<HfArchitectureEntry> architectures) {
  add(std::move(entries), std::move(architectures), {});
}

void Registry::add(std::vector<ComponentEntry> entries, std::vector<HfArchitectureEntry> architectures,
                   std::vector<HfTokenizerClassEntry> tokenizer_classes) {
  std::vector<std::string> seen;
  for (const auto& e : entries) {
    if (!is_component_kind(e.kind)) {
      std::vector<std::string> kinds;
      for (const auto& k : component_kinds) kinds.emplace_back(k.name);
      const std::string guess = closest_match(e.kind, kinds);
      throw UserError("component '" + e.decl.name + "' has unknown kind '" + e.kind + "'" +
                      (guess.empty() ? "" : "; did you mean '" + guess + "'?"));
    }
    if (!valid_name(e.decl.name))
      throw UserError(e.kind + " name '" + e.decl.name +
                      "' is not valid: use lower-case letters, digits, '_', '-' and '.'");
    if (e.kind == AttentionKernel::kind && e.decl.name == auto_attention)
      throw UserError(
          "attention kernel name 'auto' is reserved: `model.attention: auto` picks a kernel for the "
          "backend's device (" +
          e.plugin_file + " registers one under that name; rename it)");
    const std::string key = e.kind + "/" + e.decl.name;
    config::check_declared_defaults(e.decl.options, e.kind + " '" + e.decl.name + "'");
    if (std::find(seen.begin(), seen.end(), key) != seen.end())
      throw UserError(key + " is registered twice by " + e.plugin_file);
    seen.push_back(key);
    if (const ComponentEntry* existing = find(e.kind, e.decl.name)) {
      conflicts_[key] = {existing->plugin_file, e.plugin_file};
      throw UserError(key + " is already provided by " + existing->plugin_file + "; " + e.plugin_file +
                      " claims it too (remove one of the two files from the plugin path)");
    }
  }
  std::vector<std::string> claimed;
  for (const auto& a : architectures) {
    const bool in_plugin = std::any_of(entries.begin(), entries.end(), [&](const ComponentEntry& e) {
      return e.kind == Model::kind && e.decl.name == a.decl.model;
    });
    if (!in_plugin && !(a.plugin_file == "<built-in>" && find(Model::kind, a.decl.model)))
      throw UserError("Hugging Face architectures are declared for model '" + a.decl.model + "', which " +
                      a.plugin_file + " does not register");
    if (!a.decl.model_section)
      throw UserError("the Hugging Face architectures of model '" + a.decl.model + "' were declared without a mapping");
    if (a.decl.model_types.empty())
      throw UserError("the Hugging Face architectures of model '" + a.decl.model + "' name no model_type");
    for (const auto& type : a.decl.model_types) {
      if (std::find(claimed.begin(), claimed.end(), type) != claimed.end())
        throw UserError("Hugging Face model_type \"" + type + "\" is claimed twice by " + a.plugin_file);
      claimed.push_back(type);
      if (const HfArchitectureEntry* existing = find_hf_architecture(type))
        throw UserError("Hugging Face model_type \"" + type + "\" is already claimed by " + existing->plugin_file +
                        " (model '" + existing->decl.model + "'); " + a.plugin_file +
                        " claims it too (remove one of the two files from the plugin path)");
    }
  }
  // Each tokenizer class against those already registered and those before it in this plugin.
  std::vector<const HfTokenizerClassEntry*> classes;
  for (const auto& c : hf_tokenizer_classes_) classes.push_back(&c);
  for (const auto& c : tokenizer_classes) {
    if (c.decl.name.empty())
      throw UserError("a Hugging Face tokenizer class is declared without a name by " + c.plugin_file);
    auto twice = [&](const HfTokenizerClassEntry& existing) {
      return existing.plugin_file == c.plugin_file ? "twice by " + c.plugin_file
                                                   : "by " + existing.plugin_file + " and by " + c.plugin_file;
    };
    std::vector<std::string> names = c.decl.also;
    names.insert(names.begin(), c.decl.name);
    for (const HfTokenizerClassEntry* existing : classes)
      for (const std::string& name : names)
        if (names_tokenizer_class(existing->decl, name) &&
            (existing->decl.bos_token != c.decl.bos_token || existing->decl.eos_token != c.decl.eos_token))
          throw UserError("Hugging Face tokenizer class " + name + " is declared " + twice(*existing) +
                          " with different default tokens (" + tokenizer_tokens(existing->decl) + "; " +
                          tokenizer_tokens(c.decl) + "); remove one of the two files from the plugin path");
    for (const std::string& type : c.decl.model_types)
      for (const HfTokenizerClassEntry* existing : classes)
        if (std::find(existing->decl.model_types.begin(), existing->decl.model_types.end(), type) !=
            existing->decl.model_types.end())
          throw UserError("the tokenizer class of Hugging Face model_type \"" + type + "\" is declared " +
                          twice(*existing) + " (" + existing->decl.name + ", " + c.decl.name +
                          "); remove one of the two files from the plugin path");
    classes.push_back(&c);
  }
  for (auto& e : entries) {
    auto& by_name = entries_[e.kind];
    std::string name = e.decl.name;
    by_name.emplace(std::move(name), std::move(e));
  }
  for (auto& a : architectures) hf_architectures_.push_back(std::move(a));
  for (auto& c : tokenizer_classes) hf_tokenizer_classes_.push_back(std::move(c));
}

const HfTokenizerClassEntry* Registry::find_hf_tokenizer_class(std::string_view name) const {
  for (const auto& c : hf_tokenizer_classes_)
    if (names_tokenizer_class(c.decl, name)) return &c;
  return nullptr;
}

const HfTokenizerClassEntry* Registry::find_hf_tokenizer_class_of(std::string_view model_type) const {
  for (const auto& c : hf_tokenizer_classes_)
    if (std::find(c.decl.model_types.begin(), c.decl.model_types.end(), model_type) != c.decl.model_types.end())
      return &c;
  return nullptr;
}

const HfArchitectureEntry* Registry::find_hf_architecture(std::string_view model_type) const {
  for (const auto& a : hf_architectures_)
    if (std::find(a.decl.model_types.begin(), a.decl.model_types.end(), model_type) != a.decl.model_types.end())
      return &a;
  return nullptr;
}

std::vector<const HfArchitectureEntry*> Registry::hf_architectures() const {
  std::vector<const HfArchitectureEntry*> out;
  for (const auto& a : hf_architectures_) out.push_back(&a);
  std::stable_sort(out.begin(), out.end(), [](const HfArchitectureEntry* a, const HfArchitectureEntry* b) {
    return a->decl.model < b->decl.model;
  });
  return out;
}

const ComponentEntry* Registry::find(std::string_view kind, std::string_view name) const {
  auto k = entries_.find(kind);
  if (k == entries_.end()) return nullptr;
  auto n = k->second.find(name);
  return n == k->second.end() ? nullptr : &n->second;
}

std::vector<const ComponentEntry*> Registry::list(std::string_view kind) const {
  std::vector<const ComponentEntry*> out;
  auto k = entries_.find(kind);
  if (k != entries_.end())
    for (const auto& [name, e] : k->second) out.push_back(&e);
  return out;
}

std::vector<const ComponentEntry*> Registry::all() const {
  std::vector<const ComponentEntry*> out;
  for (const auto& k : component_kinds)
    for (const auto* e : list(k.name)) out.push_back(e);
  return out;
}

void Registry::set_search_info(std::vector<std::string> searched_dirs, std::vector<FailedPlugin> failed) {
  searched_dirs_ = std::move(searched_dirs);
  failed_ = std::move(failed);
}

ExecutionContext& Registry::execution() const {
  return execution_ ? *execution_ : default_execution_context();
}

void Registry::throw_unknown(std::string_view kind, std::string_view name, std::string_view path,
                             const SourceLocation& where) const {
  const std::string at = where.known() ? where.str() + ": " : "";
  const std::string key = std::string(kind) + "/" + std::string(name);
  if (auto c = conflicts_.find(key); c != conflicts_.end())
    throw UserError(at + std::string(path) + ": " + std::string(kind) + " '" + std::string(name) +
                    "' is provided by two plugins, " + c->second.first + " and " + c->second.second +
                    "; remove one of them from the plugin path");
  std::string msg = at + std::string(path) + ": unknown " + std::string(kind) + " '" + std::string(name) + "'";
  std::vector<std::string> names;
  for (const auto* e : list(kind)) names.push_back(e->decl.name);
  const std::string guess = closest_match(name, names);
  if (!guess.empty()) msg += "; did you mean '" + guess + "'?";
  if (names.empty()) {
    msg += "\nno " + std::string(kind) + " is available: no loaded plugin provides one";
  } else {
    msg += "\navailable " + plural_kind(kind) + ":";
    std::size_t width = 0;
    for (const auto& n : names) width = std::max(width, n.size());
    for (const auto* e : list(kind))
      msg += "\n  " + e->decl.name + std::string(width - e->decl.name.size() + 2, ' ') + e->plugin_file;
  }
  if (!searched_dirs_.empty()) {
    msg += "\nplugin path searched:";
    for (const auto& d : searched_dirs_) msg += "\n  " + d;
  }
  if (!failed_.empty()) {
    msg += "\nplugins that failed to load:";
    for (const auto& f : failed_) msg += "\n  " + f.file + ": " + f.reason;
  }
  throw UserError(msg);
}

namespace {

// The device an attention kernel's default instance computes on, or why it cannot be created.
struct KernelDevice {
  std::optional<Device> device;
  std::string why;
};

// Set while the kernels are being asked for their devices: a kernel whose default options name
// `auto` (a wrapper around "the best kernel") would otherwise ask again, without end.
thread_local bool choosing_attention = false;

KernelDevice default_kernel_device(const Registry& registry, const std::string& name) {
  try {
    const Handle<AttentionKernel> kernel =
        registry.create<AttentionKernel>(ComponentRef{"attention", name, Value(name), "model.attention"});
    return {kernel->device(), ""};
  } catch (const std::exception& e) {
    return {std::nullopt, e.what()};
  }
}

}  // namespace

std::vector<std::string> Registry::attention_kernels_on(const Device& device,
                                                        std::vector<std::string>* unavailable) const {
  if (choosing_attention)
    throw UserError(
        "attention: auto cannot be resolved while the attention kernels are being asked for their "
        "devices (a kernel whose default options name `auto`): name a kernel there instead");
  struct Choosing {
    Choosing() { choosing_attention = true; }
    ~Choosing() { choosing_attention = false; }
  } choosing;
  std::vector<const ComponentEntry*> fitting;
  for (const ComponentEntry* e : list(AttentionKernel::kind)) {
    if (conflicts_.count(e->kind + "/" + e->decl.name)) continue;
    const KernelDevice found = default_kernel_device(*this, e->decl.name);
    if (!found.device) {
      if (unavailable) unavailable->push_back(e->decl.name + ": " + found.why);
      continue;
    }
    if (*found.device == device) fitting.push_back(e);
  }
  // list() is sorted by name, so a stable sort by preference breaks ties by name.
  std::stable_sort(fitting.begin(), fitting.end(), [](const ComponentEntry* a, const ComponentEntry* b) {
    return a->decl.preference > b->decl.preference;
  });
  std::vector<std::string> names;
  for (const ComponentEntry* e : fitting) names.push_back(e->decl.name);
  return names;
}

std::string Registry::describe_attention_devices() const {
  if (choosing_attention) return "being asked for their devices";
  struct Choosing {
    Choosing() { choosing_attention = true; }
    ~Choosing() { choosing_attention = false; }
  } choosing;
  std::string out;
  for (const ComponentEntry* e : list(AttentionKernel::kind)) {
    const KernelDevice found = default_kernel_device(*this, e->decl.name);
    out += (out.empty() ? "" : ", ") + e->decl.name + " (" +
           (found.device ? found.device->str() : "cannot be created here") + ")";
  }
  return out.empty() ? "none is loaded" : out;
}

const OptionSchema& Registry::component_schema(std::string_view kind, std::string_view name, std::string_view path,
                                               const SourceLocation& where) const {
  // `auto` takes no options of its own: the kernel it picks runs with its defaults.
  static const OptionSchema no_options;
  if (kind == AttentionKernel::kind && name == auto_attention) return no_options;
  const ComponentEntry* e = find(kind, name);
  if (!e || conflicts_.count(std::string(kind) + "/" + std::string(name))) throw_unknown(kind, name, path, where);
  return e->decl.options;
}

Handle<Component> Registry::create(std::string_view kind, const ComponentRef& ref) const {
  const std::string path = ref.path.empty() ? std::string(kind) : ref.path;
  Value node = ref.node;
  if (node.is_null() && !ref.name.empty()) node = Value(ref.name);
  const Value validated = config::validate_component(kind, node, path, *this);
  const std::string name = validated.find("type")->as_string();
  if (kind == AttentionKernel::kind && name == auto_attention) {
    const std::vector<std::string> host = attention_kernels_on(Device::host());
    if (host.empty())
      throw UserError(path + ": auto: no loaded attention kernel computes on the host (attention kernels: " +
                      describe_attention_devices() + ")");
    return create(kind, ComponentRef{std::string(kind), host.front(), Value(host.front()), path});
  }
  const ComponentEntry* entry = find(kind, name);
  Value options = validated;
  options.erase("type");
  return with_context("while creating " + std::string(kind) + " '" + name + "' (" + path + ")", [&] {
    RegistryCreateContext context(*this);
    auto holder = std::make_shared<ComponentHolder>();
    holder->library = entry->library;
    holder->object = entry->factory(Options(std::move(options), path), context);
    if (!holder->object)
      throw InternalError("the factory of " + std::string(kind) + " '" + name + "' in " + entry->plugin_file +
                          " returned no object");
    Component* raw = holder->object.get();
    return Handle<Component>(std::move(holder), raw);
  });
}

}  // namespace loom
