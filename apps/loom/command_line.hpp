// What every subcommand shares: the command table, option parsing helpers, and the runtime.
#pragma once

#include <boost/program_options.hpp>
#include <optional>
#include <string>
#include <vector>

#include "loom/core/runtime.hpp"
#include "loom/error.hpp"

namespace loom::app {

namespace po = boost::program_options;

struct Command {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<std::string>& args);
};

const std::vector<Command>& commands();

// What every subcommand that loads plugins accepts.
struct CommonOptions {
  std::vector<std::string> plugin_paths;  // --plugin-path, repeatable
  bool only_plugin_path = false;          // --no-default-plugin-path
};

// Adds --help, --plugin-path and --no-default-plugin-path to a subcommand's options.
void add_common_options(po::options_description& options, CommonOptions& common);

// Parses `args` (the subcommand's arguments, without its name). Returns false when --help was
// given, after printing `usage` and the options (not the `hidden` ones: those that take the
// positional arguments).
bool parse(const std::vector<std::string>& args, const po::options_description& options,
           const po::positional_options_description& positional, po::variables_map& vm, const std::string& usage,
           const po::options_description* hidden = nullptr);

// The `config a.b=c ...` positional arguments: the first that is not an override is the config
// file; the rest must be overrides.
RuntimeOptions runtime_options(const CommonOptions& common, const std::vector<std::string>& positional,
                               bool config_required);

// For commands of the form `loom X CONFIG [a.b.c=value ...]` that take only the common
// options: the runtime options, or nullopt when --help was given (after printing `usage`).
std::optional<RuntimeOptions> parse_config_command(const std::vector<std::string>& args, const std::string& usage);

// "loom: error: ..." (or "loom: internal error: ...") on stderr: how the command reports a
// loom::Error, once.
void print_error(const Error& error);

int run_plugins(const std::vector<std::string>& args);
int run_config(const std::vector<std::string>& args);
int run_bench(const std::vector<std::string>& args);
int run_tokenize(const std::vector<std::string>& args);
int run_train(const std::vector<std::string>& args);
int run_generate(const std::vector<std::string>& args);
int run_eval(const std::vector<std::string>& args);
int run_export(const std::vector<std::string>& args);
int run_checkpoints(const std::vector<std::string>& args);
int run_report(const std::vector<std::string>& args);
int run_conformance(const std::vector<std::string>& args);

}  // namespace loom::app
