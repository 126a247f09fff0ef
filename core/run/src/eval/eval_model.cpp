// The model `loom eval` scores, and its results as JSON: see loom/run/eval.hpp.
#include <fstream>
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

namespace {

nlohmann::json read_json(const fs::path& file) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return nullptr;
  std::ifstream in(file, std::ios::binary);
  nlohmann::json json = nlohmann::json::parse(in, nullptr, false);
  return json.is_discarded() ? nlohmann::json(nullptr) : json;
}

// A special token as transformers writes it: a string, or an AddedToken {"content": ...}; null
// (or anything else) for none.
std::optional<std::string> token_text(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string())
    return value["content"].get<std::string>();
  return std::nullopt;
}

// transformers 4.46's tokenizer's `role` ("bos_token", "eos_token"): special_tokens_map.json's
// entry over tokenizer_config.json's (from_pretrained's order), else the tokenizer class's default,
// as a plugin declares the class (Registrar::add_hf_tokenizer_class).
std::optional<std::string> special_token(const Registry& registry, const fs::path& dir, const std::string& role) {
  const nlohmann::json map = read_json(dir / "special_tokens_map.json");
  if (map.is_object() && map.contains(role)) return token_text(map[role]);
  const nlohmann::json config = read_json(dir / "tokenizer_config.json");
  if (config.is_object() && config.contains(role)) return token_text(config[role]);
  // The class: tokenizer_config.json's tokenizer_class, or AutoTokenizer's for config.json's model_type.
  const std::string name = config.is_object() ? config.value("tokenizer_class", std::string()) : std::string();
  const HfTokenizerClassEntry* tokenizer_class = nullptr;
  if (!name.empty()) {
    tokenizer_class = registry.find_hf_tokenizer_class(name);
  } else {
    const nlohmann::json model = read_json(dir / "config.json");
    const std::string type = model.is_object() ? model.value("model_type", std::string()) : std::string();
    if (!type.empty()) tokenizer_class = registry.find_hf_tokenizer_class_of(type);
  }
  if (!tokenizer_class) return std::nullopt;
  return role == "bos_token" ? tokenizer_class->decl.bos_token : tokenizer_class->decl.eos_token;
}

// The id of a token of the directory's vocabulary: tokenizer.json's added tokens and model
// vocabulary, vocab.json, else what `tokenizer` encodes it to when that is one token.
std::optional<std::int32_t> token_id(const fs::path& dir, const std::string& token, const Tokenizer& tokenizer) {
  const nlohmann::json json = read_json(dir / "tokenizer.json");
  if (json.is_object()) {
    if (json.contains("added_tokens") && json["added_tokens"].is_array())
      for (const auto& added : json["added_tokens"])
        if (added.is_object() && added.value("content", std::string()) == token && added.contains("id") &&
            added["id"].is_number_integer())
          return added["id"].get<std::int32_t>();
    if (json.contains("model") && json["model"].is_object() && json["model"].contains("vocab") &&
        json["model"]["vocab"].is_object() && json["model"]["vocab"].contains(token) &&
        json["model"]["vocab"][token].is_number_integer())
      return json["model"]["vocab"][token].get<std::int32_t>();
  }
  const nlohmann::json vocab = read_json(dir / "vocab.json");
  if (vocab.is_object() && vocab.contains(token) && vocab[token].is_number_integer())
    return vocab[token].get<std::int32_t>();
  const std::vector<std::int32_t> ids = tokenizer.encode(token);
  if (ids.size() == 1) return ids.front();
  return std::nullopt;
}

}  // namespace

std::optional<std::string> float32_products_override(const Runtime& runtime,
                                                     const std::vector<std::string>& overrides) {
  for (const std::string& o : overrides)
    if (o.rfind("backend.matmul_precision=", 0) == 0 || o.rfind("backend=", 0) == 0) return std::nullopt;
  const Value* backend = runtime.raw_config().find("backend");
  std::string type = "cpu";  // the run config's default backend
  if (backend && backend->is_string()) type = backend->as_string();
  if (backend && backend->is_map() && backend->find("type") && backend->find("type")->is_string())
    type = backend->find("type")->as_string();
  const ComponentEntry* entry = runtime.registry().find(Backend::kind, type);
  if (!entry || !entry->decl.options.find("matmul_precision")) return std::nullopt;
  return "backend.matmul_precision=f32";
}

std::optional<std::int32_t> hf_prefix_token(const Registry& registry, const fs::path& dir, const Tokenizer& tokenizer) {
  for (const char* role : {"bos_token", "eos_token"})
    if (const auto token = special_token(registry, dir, role))
      if (const auto id = token_id(dir, *token, tokenizer); id && *id >= 0) return id;
  return std::nullopt;
}

EvalModel load_eval_model(Runtime& runtime, const fs::path& target, WeightsChoice choice) {
  EvalModel out;
  std::error_code ec;
  if (fs::is_directory(target, ec) && is_hf_model_dir(target)) {
    Value config = resolved_run_config(runtime);
    auto create = [&](const char* section, std::string_view kind) {
      const Value* node = config.find(section);
      if (!node || node->is_null())
        throw UserError("scoring a Hugging Face directory needs a config whose `" + std::string(section) +
                        "` section describes it (loom eval HF_DIR CONFIG, as trainer.init_from)");
      return runtime.registry().create(kind, ComponentRef{std::string(kind), "", *node, section});
    };
    out.backend = std::static_pointer_cast<Backend>(create("backend", Backend::kind));
    resolve_attention_kernel(runtime.registry(), config, *out.backend);
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
    // The harness's HFLM puts its tokenizer's BOS before an empty context, or its EOS where it has
    // no BOS (its prefix_token_id).
    if (const auto prefix = hf_prefix_token(runtime.registry(), target, *out.tokenizer);
        prefix && *prefix < out.model->vocab_size())
      out.prefix = *prefix;
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
  // JSON is UTF-8: a description naming a path that is not (a directory name with byte 0xff)
  // shows U+FFFD there rather than failing the whole report.
  return out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace loom::eval
