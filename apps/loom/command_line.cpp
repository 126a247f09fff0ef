#include "command_line.hpp"

#include <iostream>

#include "loom/error.hpp"
#include "loom/run/run_config.hpp"

namespace loom::app {

const std::vector<Command>& commands() {
  static const std::vector<Command> table = {
      {"train", "train a model from a config", run_train},
      {"generate", "continue a prompt with a trained model", run_generate},
      {"eval",
       "score a model on benchmark tasks as lm-evaluation-harness does: `loom eval RUN_DIR --tasks hellaswag,...`",
       run_eval},
      {"export", "write a run's weights in another layout: --format hf for Hugging Face transformers", run_export},
      {"checkpoints", "list a run's checkpoints: step, time, size, and whether each verifies", run_checkpoints},
      {"report", "a run's metrics as charts in one self-contained HTML file: `loom report RUN_DIR... -o report.html`",
       run_report},
      {"plugins", "list the components every plugin provides, and the plugins that failed to load", run_plugins},
      {"config", "show a resolved config, or the options every component declares", run_config},
      {"bench",
       "measure components: `loom bench attention` (attention kernels), `loom bench gemm` (GEMMs, f32 and bf16)",
       run_bench},
      {"tokenize", "turn text or JSON-lines files into token shards for the tokens dataset", run_tokenize},
      {"conformance", "run loom's conformance suites on a plugin: `loom conformance PLUGIN.so`", run_conformance},
  };
  return table;
}

void add_common_options(po::options_description& options, CommonOptions& common) {
  options.add_options()("help,h", "show this help")(
      "plugin-path", po::value(&common.plugin_paths)->composing(),
      "a plugin directory or file searched before all others (repeatable)")(
      "no-default-plugin-path", po::bool_switch(&common.only_plugin_path),
      "search only --plugin-path (not plugins.paths, LOOM_PLUGIN_PATH, or the built-in and installed plugins)");
}

bool parse(const std::vector<std::string>& args, const po::options_description& options,
           const po::positional_options_description& positional, po::variables_map& vm, const std::string& usage,
           const po::options_description* hidden) {
  po::options_description all;
  all.add(options);
  if (hidden) all.add(*hidden);
  po::store(po::command_line_parser(args).options(all).positional(positional).run(), vm);
  if (vm.count("help")) {
    std::cout << usage << "\n\n" << options << "\n";
    return false;
  }
  po::notify(vm);
  return true;
}

RuntimeOptions runtime_options(const CommonOptions& common, const std::vector<std::string>& positional,
                               bool config_required) {
  RuntimeOptions r;
  r.sections = &run_config_schema();
  r.plugin_paths = common.plugin_paths;
  r.default_plugin_path = !common.only_plugin_path;
  for (const auto& arg : positional) {
    const bool is_override = arg.find('=') != std::string::npos;
    if (!is_override && !r.config) {
      r.config = arg;
    } else if (!is_override) {
      throw UserError("unexpected argument '" + arg +
                      "': give one config file, then overrides of the form a.b.c=value");
    } else {
      r.overrides.push_back(arg);
    }
  }
  if (config_required && !r.config) throw UserError("no config file given");
  return r;
}

std::optional<RuntimeOptions> parse_config_command(const std::vector<std::string>& args, const std::string& usage) {
  CommonOptions common;
  std::vector<std::string> positional;
  po::options_description options("options");
  add_common_options(options, common);
  po::options_description hidden;
  hidden.add_options()("args", po::value(&positional), "CONFIG and overrides");
  po::positional_options_description pos;
  pos.add("args", -1);
  po::variables_map vm;
  if (!parse(args, options, pos, vm, usage, &hidden)) return std::nullopt;
  return runtime_options(common, positional, true);
}

void print_error(const Error& error) {
  std::cerr << "loom: " << (error.kind() == ErrorKind::user ? "error" : "internal error") << ": " << error.what()
            << std::endl;
}

}  // namespace loom::app
