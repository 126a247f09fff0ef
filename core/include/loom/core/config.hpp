// The config system: YAML files with base_config and !include, command-line overrides, and
// validation of every section against declared options.
//
// Resolution order (later wins):
//   1. the files named by `base_config:` (a path or a list of paths, each relative to the file
//      that names it), merged in order;
//   2. the file itself;
//   3. command-line overrides `a.b.c=value`, in the order given.
// Each of these is a layer. Maps merge key by key, recursively; any other value (scalars, lists)
// replaces. `!include PATH` replaces a node by the whole content of another file (it is part of
// the including file's layer). Include cycles are reported with the chain of files.
//
// Component sections are the exception to key-by-key merging. A map with a `type` key names a
// component (or a variant chosen by `type`), and its other keys are that type's options: a layer
// that changes `type` starts the section afresh, so the options earlier layers gave for the old
// type are dropped (and reported as DroppedOptions) while the layer's own options, and later
// layers', apply. Options declared for the whole section rather than for one type (OptionSpec::
// section_options: `optimizer.learning_rate`, `optimizer.max_grad_norm`, read by the run layer
// whichever optimizer is named) survive the change, where the loader is given the top-level
// schema that declares them (`sections` below). A layer that repeats the same type, or gives
// options without a type, merges as usual. A bare name (`attention: flash`) is shorthand for `{type: flash}`: options
// merged onto it, or an override below it (`model.attention.block_size=64`), extend it into that map.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "loom/component.hpp"
#include "loom/options.hpp"
#include "loom/value.hpp"

namespace loom::config {

// Options an earlier layer gave a component section, dropped because a later layer changed its
// `type` (see above). `loom config show` prints each as a note.
struct DroppedOptions {
  std::string path;      // the section's key path, "data" or "model.attention"
  std::string old_type;  // the type the options were given for
  std::string new_type;
  std::string layer;              // the layer that changed the type: a file, or "command-line override '...'"
  std::vector<std::string> keys;  // each dropped key with where it was set: "num_documents (run.yaml:14:3)"
  // One line: "data: type 'synthetic' -> 'text' (command-line override 'data.type=text') dropped ..."
  std::string str() const;
};

// Parses one YAML document (`text`, read from `file` for locations) into a Value, resolving
// `!include` relative to `file`'s directory and `base_config` as described above. Scalars are
// typed by the YAML 1.2 core schema (null, booleans, integers, floats, else strings); quoted
// scalars are always strings.
// Options dropped by type changes are appended to `dropped` when it is given. `sections`, the
// top-level schema when the caller knows it, names the section-wide options that a change of type
// keeps (null: every option of the old type is dropped).
Value load_file(const std::filesystem::path& file, std::vector<DroppedOptions>* dropped = nullptr,
                const OptionSchema* sections = nullptr);
Value load_string(std::string_view text, const std::filesystem::path& file_for_locations,
                  std::vector<DroppedOptions>* dropped = nullptr, const OptionSchema* sections = nullptr);

// One `a.b.c=value` override. The value parses as YAML ("3e-4", "[1,2]", "null", "{a: 1}").
struct Override {
  std::vector<std::string> path;  // {"a", "b", "c"}
  Value value;                    // located at "<command line>" with the argument's index
  std::string text;               // as given
};
Override parse_override(std::string_view text);
// Sets the value at the override's path, creating maps along the way; the override is one layer
// (a map value merges, a changed `type` drops the section's earlier options). Going through a
// bare name extends it into {type: name}; going through any other non-map (`a=1` then `a.b=2`)
// is a UserError.
void apply_override(Value& root, const Override& o, std::vector<DroppedOptions>* dropped = nullptr,
                    const OptionSchema* sections = nullptr);

// load_file followed by every override.
Value load(const std::filesystem::path& file, const std::vector<std::string>& overrides,
           std::vector<DroppedOptions>* dropped = nullptr, const OptionSchema* sections = nullptr);

// Merges layer `over` into `base`: maps recursively, component sections as described above,
// everything else replaced. `layer` names `over` in DroppedOptions; `path` is where `base` sits
// in the config that `sections` (the top-level schema, or null) describes.
void merge(Value& base, const Value& over, const std::string& layer = "",
           std::vector<DroppedOptions>* dropped = nullptr, const std::string& path = "",
           const OptionSchema* sections = nullptr);

// What validation needs to know about components; the plugin registry implements it.
class ComponentCatalog {
 public:
  virtual ~ComponentCatalog() = default;
  // The declared options of component `name` of `kind`. Throws UserError when there is none,
  // listing what is available (path and location say where the name was written).
  virtual const OptionSchema& component_schema(std::string_view kind, std::string_view name, std::string_view path,
                                               const SourceLocation& where) const = 0;
};

// Validates `node` (a map, or null meaning empty) against `schema`, returning a map with every
// declared option in declaration order and defaults filled in. `path` is the key path of the
// node ("optimizer"), used in messages. Nested `component` options are validated through
// `catalog` and normalised to {type: name, ...options}.
//
// Errors (UserError) name the file:line:column of the offending value, the full key path, what
// was expected and, for unknown keys, the closest valid key and the list of valid ones.
Value validate(const OptionSchema& schema, const Value& node, std::string_view path, const ComponentCatalog& catalog);

// Validates a component node: a bare name ("flash") or a map with `type`. Returns
// {type: name, ...options with defaults}.
Value validate_component(std::string_view kind, const Value& node, std::string_view path,
                         const ComponentCatalog& catalog);

// Checks that every default `schema` declares (nested objects' included) is a value the option
// itself accepts: a default outside its own range, choices or length would pass `loom plugins`
// and `loom config schema` and fail only in a run, blaming the user's config. Throws UserError
// naming `owner` ("optimizer 'mine'"), the option, the default and what the option accepts. The
// registry runs it on every component it registers.
void check_declared_defaults(const OptionSchema& schema, std::string_view owner);

}  // namespace loom::config
