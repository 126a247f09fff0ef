// loom generate RUN_DIR_OR_WEIGHTS [--prompt TEXT] [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P]
//               [--greedy] [--stop-at-context] [--seed S]
#include <iostream>
#include <optional>

#include "command_line.hpp"
#include "loom/error.hpp"
#include "loom/run/generate.hpp"

namespace fs = std::filesystem;

namespace loom::app {

int run_generate(const std::vector<std::string>& args) {
  CommonOptions common;
  std::string target, prompt, weights;
  SamplingOptions sampling;
  std::int64_t seed = 0;
  bool greedy = false, stop_at_context = false;
  po::options_description options("options");
  add_common_options(options, common);
  options.add_options()("run", po::value(&target), "a run directory, or a model.safetensors inside one")(
      "prompt,p", po::value(&prompt)->default_value(""), "the text to continue; empty: a new document")(
      "max-new-tokens,n", po::value(&sampling.max_new_tokens)->default_value(200), "tokens to generate (>= 0)")(
      "temperature,t", po::value(&sampling.temperature)->default_value(0.8), "sampling temperature (>= 0); 0: greedy")(
      "top-k,k", po::value(&sampling.top_k)->default_value(0), "sample among the k most likely tokens (>= 0); 0: all")(
      "top-p", po::value(&sampling.top_p)->default_value(1.0),
      "sample among the most likely tokens whose probability adds up to p, in (0, 1]")(
      "greedy", po::bool_switch(&greedy), "always take the most likely token (temperature 0)")(
      "stop-at-context", po::bool_switch(&stop_at_context),
      "stop, with a message, when the model's context is full, instead of dropping the oldest tokens")(
      "seed", po::value(&seed)->default_value(0), "random seed of the sampling")(
      "weights", po::value(&weights)->default_value("ema"),
      "of a run trained with trainer.ema_decay: ema (its weight average, what its final model.safetensors holds) "
      "or live (the weights the optimizer updated, from its checkpoint of the last step)");
  po::positional_options_description pos;
  pos.add("run", 1);
  po::variables_map vm;
  if (!parse(args, options, pos, vm,
             "usage: loom generate RUN_DIR [--prompt TEXT] [--max-new-tokens N] [--temperature T] [--top-k K]\n"
             "                     [--top-p P] [--greedy] [--stop-at-context] [--seed S] [--weights ema|live]\n\n"
             "Continues the prompt with the model a `loom train` run saved, one token at a time with a KV cache.\n"
             "Past the model's context, the oldest quarter of the tokens is dropped and generation goes on."))
    return 0;
  if (target.empty()) throw UserError("no run given: `loom generate RUN_DIR --prompt TEXT`");
  SamplingOptionNames names;
  names.max_new_tokens = "--max-new-tokens (-n)";
  names.temperature = "--temperature (-t)";
  names.top_k = "--top-k (-k)";
  check_sampling_options(sampling, names);
  if (greedy) sampling.temperature = 0;
  sampling.seed = static_cast<std::uint64_t>(seed);
  if (stop_at_context) sampling.at_context_end = ContextPolicy::stop;
  const WeightsChoice choice = parse_weights_choice(weights, "--weights");

  const fs::path config = run_directory(target) / "config.yaml";
  Runtime runtime(runtime_options(common, {config.string()}, true));
  LoadedRun run = load_run(runtime, target, /*merge_lora=*/true, choice, RunMemory::backend, "loom generate");
  // A LoRA run with a quantized base (lora.base_dtype): the adapters apply in the products.
  std::optional<LinearAdaptersScope> adapters;
  if (run.lora && run.lora->base_stored()) adapters.emplace(&run.lora->table());
  // Which weights, where there was a choice (stderr: stdout is the text).
  if (run.weights.has_average) std::cerr << "loom generate: " << run.weights.description << "\n";

  std::cout << prompt << std::flush;
  const GeneratedText generated =
      generate_text(*run.model, *run.backend, *run.tokenizer, run.documents, prompt, sampling,
                    [](std::string_view text) { std::cout << text << std::flush; });
  std::cout << "\n";
  if (generated.stop == StopReason::context)
    std::cerr << "loom generate: stopped after " << generated.tokens << " of " << sampling.max_new_tokens
              << " tokens: the model's context of " << run.model->max_seq_len()
              << " tokens is full (--stop-at-context; without it the oldest tokens are dropped)\n";
  return 0;
}

}  // namespace loom::app
