// loom generate RUN_DIR_OR_WEIGHTS --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P]
#include <iostream>

#include "command_line.hpp"
#include "loom/error.hpp"
#include "loom/run/generate.hpp"

namespace fs = std::filesystem;

namespace loom::app {

int run_generate(const std::vector<std::string>& args) {
  CommonOptions common;
  std::string target, prompt;
  SamplingOptions sampling;
  std::int64_t seed = 0;
  bool greedy = false;
  po::options_description options("options");
  add_common_options(options, common);
  options.add_options()("run", po::value(&target), "a run directory, or a model.safetensors inside one")(
      "prompt,p", po::value(&prompt)->default_value(""), "the text to continue")(
      "max-new-tokens,n", po::value(&sampling.max_new_tokens)->default_value(200), "tokens to generate")(
      "temperature,t", po::value(&sampling.temperature)->default_value(0.8), "sampling temperature; 0: greedy")(
      "top-k,k", po::value(&sampling.top_k)->default_value(0), "sample among the k most likely tokens; 0: all")(
      "top-p", po::value(&sampling.top_p)->default_value(1.0),
      "sample among the most likely tokens whose probability adds up to p")(
      "greedy", po::bool_switch(&greedy), "always take the most likely token (temperature 0)")(
      "seed", po::value(&seed)->default_value(0), "random seed of the sampling");
  po::positional_options_description pos;
  pos.add("run", 1);
  po::variables_map vm;
  if (!parse(args, options, pos, vm,
             "usage: loom generate RUN_DIR [--prompt TEXT] [--max-new-tokens N] [--temperature T] [--top-k K]\n"
             "                     [--top-p P] [--greedy] [--seed S]\n\n"
             "Continues the prompt with the model a `loom train` run saved, one token at a time with a KV cache."))
    return 0;
  if (target.empty()) throw UserError("no run given: `loom generate RUN_DIR --prompt TEXT`");
  if (sampling.temperature < 0)
    throw UserError("--temperature must be >= 0, got " + std::to_string(sampling.temperature));
  if (sampling.top_p <= 0 || sampling.top_p > 1)
    throw UserError("--top-p must be in (0, 1], got " + std::to_string(sampling.top_p));
  if (sampling.max_new_tokens < 1) throw UserError("--max-new-tokens must be at least 1");
  if (greedy) sampling.temperature = 0;
  sampling.seed = static_cast<std::uint64_t>(seed);

  std::error_code ec;
  const fs::path run_dir = fs::is_directory(target, ec) ? fs::path(target) : fs::path(target).parent_path();
  const fs::path config = run_dir / "config.yaml";
  if (!fs::exists(config, ec))
    throw UserError("'" + target + "' is not a loom run: there is no " + config.string() +
                    " (give the directory `loom train` printed, such as runs/<run_id>)");
  Runtime runtime(runtime_options(common, {config.string()}, true));
  LoadedRun run = load_run(runtime, target);

  std::vector<std::int32_t> ids = run.tokenizer->encode(prompt);
  const auto eot = run.tokenizer->end_of_text();
  if (ids.empty()) ids = eot ? std::vector<std::int32_t>{*eot} : run.tokenizer->encode("\n");
  std::cout << prompt << std::flush;
  // Decode incrementally: print what the tokens so far decode to beyond what was printed, so
  // multi-byte characters split across tokens come out whole.
  std::vector<std::int32_t> produced;
  std::size_t printed = 0;
  generate(
      *run.model, *run.backend, ids, sampling,
      [&](std::int32_t token) {
        if (eot && token == *eot) return;
        produced.push_back(token);
        const std::string text = run.tokenizer->decode(produced);
        std::size_t end = text.size();
        while (end > printed && (static_cast<unsigned char>(text[end - 1]) & 0xC0) == 0x80) --end;
        if (end > printed && static_cast<unsigned char>(text[end - 1]) >= 0xC0) --end;
        if (end > printed) {
          std::cout << text.substr(printed, end - printed) << std::flush;
          printed = end;
        }
      },
      eot);
  const std::string text = run.tokenizer->decode(produced);
  if (text.size() > printed) std::cout << text.substr(printed);
  std::cout << "\n";
  return 0;
}

}  // namespace loom::app
