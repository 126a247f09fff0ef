// loom config show CONFIG [a.b=c ...]
// loom config schema [KIND[/NAME]] [--json]
#include <iostream>

#include "command_line.hpp"
#include "loom/error.hpp"
#include "loom/run/describe.hpp"
#include "loom/run/run_config.hpp"

namespace loom::app {

namespace {

int run_show(const std::vector<std::string>& args) {
  const auto options = parse_config_command(
      args,
      "usage: loom config show CONFIG [a.b.c=value ...]\n\n"
      "Prints the config with base_config, !include and overrides applied, every component's options\n"
      "validated and defaults filled in.");
  if (!options) return 0;
  const Runtime runtime(*options);
  std::cout << resolved_run_config(runtime).to_yaml();
  return 0;
}

int run_schema(const std::vector<std::string>& args) {
  CommonOptions common;
  std::string selector;
  po::options_description options("options");
  add_common_options(options, common);
  options.add_options()("json", "print JSON")("markdown", "print a Markdown reference page")(
      "selector", po::value(&selector), "config, KIND or KIND/NAME");
  po::positional_options_description pos;
  pos.add("selector", 1);
  po::variables_map vm;
  if (!parse(args, options, pos, vm,
             "usage: loom config schema [config | KIND | KIND/NAME] [--json | --markdown]\n\n"
             "Prints the options of the config's sections and of every registered component (or of those\n"
             "selected): name, type, allowed values, default and description."))
    return 0;
  const Runtime runtime(runtime_options(common, {}, false));
  if (vm.count("json"))
    std::cout << describe_schema_json(runtime, selector);
  else if (vm.count("markdown"))
    std::cout << describe_schema_markdown(runtime, selector);
  else
    std::cout << describe_schema(runtime, selector);
  return 0;
}

}  // namespace

int run_config(const std::vector<std::string>& args) {
  const std::string usage =
      "usage: loom config show CONFIG [a.b.c=value ...]\n"
      "       loom config schema [config | KIND | KIND/NAME] [--json]";
  if (args.empty()) throw UserError("`loom config` needs a subcommand: show or schema\n" + usage);
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "show") return run_show(rest);
  if (args[0] == "schema") return run_schema(rest);
  if (args[0] == "--help" || args[0] == "-h") {
    std::cout << usage << "\n";
    return 0;
  }
  const std::string guess = closest_match(args[0], {"show", "schema"});
  throw UserError("unknown config subcommand '" + args[0] + "'" +
                  (guess.empty() ? "" : "; did you mean '" + guess + "'?") + "\n" + usage);
}

}  // namespace loom::app
