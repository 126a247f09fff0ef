// loom eval RUN_DIR_OR_CHECKPOINT_OR_HF_DIR [HF_DIR's CONFIG] [a.b=c ...] --tasks NAMES_OR_FILES [--limit N]
//           [--num-fewshot K] [--batch-size B] [--output results.json] [--log-samples] [--task-dir DIR] [--kv-cache
//           auto|always|never]
#include <fstream>
#include <iomanip>
#include <iostream>
#include <memory>

#include "command_line.hpp"
#include "loom/error.hpp"
#include "loom/run/eval.hpp"
#include "loom/run/hf_interop.hpp"

namespace fs = std::filesystem;

namespace loom::app {

namespace {

void print_rows(const eval::TaskResult& r, const std::string& indent) {
  for (const auto& m : r.metrics) {
    std::cout << "| " << indent << r.name << " | " << r.docs << " | " << m.name << " | " << std::fixed
              << std::setprecision(4) << m.value << " | ";
    if (m.stderr_value)
      std::cout << *m.stderr_value;
    else
      std::cout << "-";
    std::cout << " |\n";
  }
}

void print_table(const std::vector<eval::TaskResult>& results) {
  std::cout << "| task | docs | metric | value | stderr |\n|---|---:|---|---:|---:|\n";
  for (const auto& r : results) {
    print_rows(r, "");
    // mmlu's categories under it and their subjects under them, as the harness's table shows them.
    for (const auto& sub : r.subtasks) print_rows(sub, sub.group == r.name ? " - " : "  - ");
  }
  std::cout.unsetf(std::ios::floatfield);
}

}  // namespace

int run_eval(const std::vector<std::string>& args) {
  CommonOptions common;
  std::vector<std::string> positional, tasks;
  std::string output, task_dir = "eval_data", weights = "ema";
  std::int64_t limit = 0;
  eval::EvalOptions options;
  eval::FewShotOptions fewshot;
  std::string kv_cache = "auto";
  po::options_description described("options");
  add_common_options(described, common);
  described.add_options()("tasks", po::value(&tasks)->multitoken(),
                          "tasks, comma-separated: a family's name (reads TASK_DIR/NAME.jsonl), FAMILY:FILE, or a "
                          "file (its name says the family: hellaswag*.jsonl, *.txt for perplexity, any other JSONL "
                          "is generic multiple choice)")("task-dir", po::value(&task_dir)->default_value("eval_data"),
                                                         "where a task given by name is read from")(
      "limit", po::value(&limit)->default_value(0), "score the first N documents of each task (0: all)")(
      "num-fewshot", po::value(&fewshot.num_fewshot)->default_value(0),
      "examples before each document, drawn from the task's file as the harness draws them (mmlu: the first K; "
      "others: at random, seed 1234)")("batch-size", po::value(&options.scorer.batch_size)->default_value(8),
                                       "sequences per forward pass")("output,o", po::value(&output),
                                                                     "write the results as JSON to this file")(
      "log-samples", po::bool_switch(&options.log_samples),
      "with --output: each document's log-likelihoods, greedy flags and predictions too")(
      "kv-cache", po::value(&kv_cache)->default_value("auto"),
      "multiple choice: run a context shared by the choices once into a KV cache that each choice continues "
      "from: auto (where the context is long enough to pay off), always, or never (every choice its own "
      "sequence, context included, as the harness does)")(
      "weights", po::value(&weights)->default_value("ema"),
      "of a run trained with trainer.ema_decay: ema (its weight average) or live");
  po::options_description hidden;
  hidden.add_options()("args", po::value(&positional), "the model, and a config with overrides");
  po::positional_options_description pos;
  pos.add("args", -1);
  po::variables_map vm;
  if (!parse(args, described, pos, vm,
             "usage: loom eval RUN_DIR_OR_CHECKPOINT --tasks NAMES_OR_FILES [--limit N] [--batch-size B] [-o "
             "results.json]\n"
             "       loom eval HF_DIR [CONFIG] [a.b=c ...] --tasks ...\n\n"
             "Scores a model on benchmark tasks read from local files, as EleutherAI's lm-evaluation-harness\n"
             "scores them: multiple choice by log-likelihood (hellaswag, arc_easy, arc_challenge, piqa,\n"
             "winogrande, mmlu, generic {\"context\", \"choices\", \"label\"}: acc, acc_norm), lambada (last-word\n"
             "accuracy, perplexity) and perplexity of a text (word, byte, token). A Hugging Face directory is\n"
             "read into the model its config.json describes (mapped by the model plugin that claims its model_type:\n"
             "gpt2, llama, mistral, qwen2, qwen3, mixtral, gemma2 among loom's own), with the tokenizer of its files,\n"
             "or into the one CONFIG describes (docs/evaluation.md).",
             &hidden))
    return 0;
  if (positional.empty()) throw UserError("no model given: `loom eval RUN_DIR --tasks hellaswag`");
  if (limit < 0) throw UserError("--limit must be at least 0 (0: every document), got " + std::to_string(limit));
  if (fewshot.num_fewshot < 0)
    throw UserError("--num-fewshot must be at least 0 (0: zero-shot), got " + std::to_string(fewshot.num_fewshot));
  if (options.scorer.batch_size < 1)
    throw UserError("--batch-size must be at least 1, got " + std::to_string(options.scorer.batch_size));
  if (options.log_samples && output.empty()) throw UserError("--log-samples writes into --output: give -o FILE");
  options.scorer.kv_cache = eval::parse_kv_cache_use(kv_cache, "--kv-cache");
  const WeightsChoice choice = parse_weights_choice(weights, "--weights");
  const fs::path target = positional.front();
  std::vector<std::string> rest(positional.begin() + 1, positional.end());

  // The tasks first: a typo costs no model load.
  const std::vector<eval::TaskSpec> specs = eval::parse_task_specs(tasks, task_dir);
  std::vector<eval::Task> loaded;
  for (const auto& spec : specs) loaded.push_back(eval::load_task(spec, limit, fewshot));

  std::error_code ec;
  const bool hf = fs::is_directory(target, ec) && is_hf_model_dir(target);
  bool config_given = true;
  if (hf) {
    if (rest.empty() || rest.front().find('=') != std::string::npos) {
      // No config: the directory's config.json and tokenizer files describe it, then the overrides.
      // The plugin that claims its model_type maps config.json, so the plugins are found first (on
      // the same path as the run's, with the overrides of `plugins` that may extend it).
      std::vector<std::string> plugin_overrides;
      for (const auto& a : rest)
        if (a.rfind("plugins.", 0) == 0 || a.rfind("plugins=", 0) == 0) plugin_overrides.push_back(a);
      const Runtime plugins(runtime_options(common, plugin_overrides, false));
      const std::vector<std::string> sections = hf_model_dir_overrides(plugins.registry(), target);
      rest.insert(rest.begin(), sections.begin(), sections.end());
      config_given = false;
    }
  } else {
    if (!fs::exists(target, ec))
      throw UserError("'" + target.string() +
                      "' does not exist: give a run directory, a checkpoint or a Hugging Face model directory");
    for (const auto& a : rest)
      if (a.find('=') == std::string::npos)
        throw UserError("unexpected argument '" + a + "': a loom run brings its own config (overrides a.b=c only)");
    rest.insert(rest.begin(), (resolve_run_or_checkpoint(target, choice).dir / "config.yaml").string());
  }
  // Float32 products unless the command line asks otherwise (backend.matmul_precision=bf16).
  auto runtime = std::make_unique<Runtime>(runtime_options(common, rest, config_given));
  if (const auto f32 = eval::float32_products_override(*runtime, rest)) {
    rest.push_back(*f32);
    runtime = std::make_unique<Runtime>(runtime_options(common, rest, config_given));
  }
  eval::EvalModel model = eval::load_eval_model(*runtime, target, choice);
  std::cerr << "loom eval: " << model.description << "\n";
  eval::ScorerStats stats;
  const std::vector<eval::TaskResult> results = eval::evaluate_tasks(model, loaded, options, &stats);
  print_table(results);
  double seconds = 0;
  std::int64_t docs = 0;
  for (const auto& r : results) {
    seconds += r.seconds;
    docs += r.docs;
  }
  std::cerr << "loom eval: " << docs << " documents, " << stats.requests << " requests in " << std::setprecision(3)
            << seconds << " s (" << (seconds > 0 ? static_cast<double>(docs) / seconds : 0.0) << " documents/s), "
            << stats.forward_passes << " forward passes over " << stats.tokens_run << " positions\n";
  if (!output.empty()) {
    std::ofstream out(output, std::ios::binary);
    out << eval::results_json(results, model.description);
    out.close();
    if (!out) throw UserError("cannot write '" + output + "'");
  }
  return 0;
}

}  // namespace loom::app
