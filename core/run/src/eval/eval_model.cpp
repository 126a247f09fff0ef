// The model `loom eval` scores, and its results as JSON: see loom/run/eval.hpp.
#include <iomanip>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "loom/error.hpp"
#include "loom/run/eval.hpp"
#include "loom/run/hf_interop.hpp"
#include "loom/run/lora.hpp"
#include "loom/run/run_config.hpp"

namespace fs = std::filesystem;

namespace loom::eval {

EvalModel load_eval_model(Runtime& runtime, const fs::path& target, WeightsChoice choice) {
  EvalModel out;
  std::error_code ec;
  if (fs::is_directory(target, ec) && is_hf_model_dir(target)) {
    const Value config = resolved_run_config(runtime);
    auto create = [&](const char* section, std::string_view kind) {
      const Value* node = config.find(section);
      if (!node || node->is_null())
        throw UserError("scoring a Hugging Face directory needs a config whose `" + std::string(section) +
                        "` section describes it (loom eval HF_DIR CONFIG, as trainer.init_from)");
      return runtime.registry().create(kind, ComponentRef{std::string(kind), "", *node, section});
    };
    out.backend = std::static_pointer_cast<Backend>(create("backend", Backend::kind));
    out.tokenizer = std::static_pointer_cast<Tokenizer>(create("tokenizer", Tokenizer::kind));
    if (out.tokenizer->needs_fit())
      throw UserError(
          "the config's tokenizer learns its vocabulary from training data; a Hugging Face directory "
          "needs one that is complete (gpt2-bpe, sentencepiece, byte)");
    out.model = std::static_pointer_cast<Model>(create("model", Model::kind));
    ModelSetup setup{out.tokenizer->vocab_size()};
    setup.backend = out.backend.get();  // in the backend's memory, wherever that is
    out.model->build(setup);
    const std::vector<std::string> notes = load_initial_weights(*out.model, target, choice);
    out.description = "the Hugging Face model " + target.string();
    const DocumentBoundary documents = document_boundary(*out.tokenizer, false);
    out.prefix = documents.separator.back();
    // The harness's HFLM puts the tokenizer's BOS before an empty context (its prefix_token_id).
    if (const auto bos = hf_bos_token_id(target); bos && *bos >= 0 && *bos < out.model->vocab_size())
      out.prefix = static_cast<std::int32_t>(*bos);
    return out;
  }
  const RunFiles files = resolve_run_or_checkpoint(target, choice);
  LoadedRun run = load_run(runtime, files, /*merge_lora=*/true, RunMemory::backend, "loom eval");
  out.backend = run.backend;
  out.tokenizer = run.tokenizer;
  out.model = run.model;
  out.lora = run.lora;
  out.prefix = run.documents.separator.back();
  out.description = files.description.empty() ? files.weights.string() : files.description;
  if (run.lora)
    out.description += run.lora->base_stored()
                           ? std::string(", with its LoRA adapters applied to its ") +
                                 quant::storage_format_name(run.lora->settings().base_dtype) + " base"
                           : ", with its LoRA adapters merged";
  return out;
}

std::vector<TaskResult> evaluate_tasks(const EvalModel& model, const std::vector<Task>& tasks,
                                       const EvalOptions& options, ScorerStats* stats) {
  // The scorer makes its Ops on this thread: the scope gives each the adapters' table.
  std::optional<LinearAdaptersScope> adapters;
  if (model.lora && model.lora->base_stored()) adapters.emplace(&model.lora->table());
  return evaluate_tasks(*model.model, *model.backend, *model.tokenizer, model.prefix, tasks, options, stats);
}

namespace {

nlohmann::json number_or_null(double x) {
  return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr);
}

}  // namespace

std::string results_json(const std::vector<TaskResult>& results, const std::string& model_description) {
  nlohmann::json out;
  // A task's metrics and their standard errors, as the harness's results name them.
  auto add_metrics = [](nlohmann::json& entry, const std::vector<Metric>& metrics) {
    for (const Metric& m : metrics) {
      entry[m.name] = number_or_null(m.value);
      entry[m.name + "_stderr"] = m.stderr_value ? number_or_null(*m.stderr_value) : nlohmann::json(nullptr);
    }
  };
  out["model"] = model_description;
  out["results"] = nlohmann::json::object();
  for (const TaskResult& r : results) {
    nlohmann::json task;
    task["task"] = family_name(r.family);
    task["docs"] = r.docs;
    task["seconds"] = r.seconds;
    add_metrics(task, r.metrics);
    out["results"][r.name] = task;
    // mmlu's categories and subjects: entries of their own, as the harness's results hold them.
    for (const TaskResult& sub : r.subtasks) {
      nlohmann::json entry;
      entry["task"] = family_name(sub.family);
      entry["group"] = sub.group;
      entry["docs"] = sub.docs;
      add_metrics(entry, sub.metrics);
      out["results"][sub.name] = entry;
    }
    if (r.samples.empty()) continue;
    nlohmann::json samples = nlohmann::json::array();
    for (const DocLog& d : r.samples) {
      nlohmann::json s;
      s["doc"] = d.index;
      nlohmann::json lls = nlohmann::json::array(), greedy = nlohmann::json::array();
      for (const Scored& x : d.results) {
        lls.push_back(x.logprob);
        greedy.push_back(x.greedy);
      }
      s["loglikelihoods"] = lls;
      s["greedy"] = greedy;
      if (r.family == TaskFamily::perplexity) {
        s["tokens"] = d.tokens;
      } else if (r.family != TaskFamily::lambada) {
        s["gold"] = d.gold;
        s["pred"] = d.pred;
        s["pred_norm"] = d.pred_norm;
      }
      samples.push_back(s);
    }
    out["samples"][r.name] = samples;
  }
  return out.dump(2) + "\n";
}

}  // namespace loom::eval
