// Reading a run directory for `loom report`: see loom/run/report.hpp.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loom/core/config.hpp"
#include "loom/error.hpp"
#include "loom/run/report.hpp"

namespace fs = std::filesystem;

namespace loom {

namespace {

std::string run_name(const fs::path& dir) {
  fs::path p = dir.lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  const std::string name = p.filename().string();
  return name.empty() || name == "." ? fs::absolute(dir).lexically_normal().filename().string() : name;
}

std::string text_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

std::vector<MetricsRow> read_metrics(const fs::path& file) {
  std::ifstream in(file);
  if (!in) throw UserError("cannot read '" + file.string() + "'");
  std::vector<MetricsRow> rows;
  std::string line;
  for (std::size_t number = 1; std::getline(in, line); ++number) {
    const std::string where = file.string() + ":" + std::to_string(number);
    if (line.find_first_not_of(" \t\r") == std::string::npos)
      throw UserError(where + ": empty line; each line of metrics.jsonl is one JSON object with a \"step\"");
    nlohmann::json object;
    try {
      object = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      throw UserError(where + ": not a JSON object (" + e.what() +
                      "); each line of metrics.jsonl is one JSON object with a \"step\"");
    }
    if (!object.is_object() || !object.contains("step") || !object["step"].is_number_integer())
      throw UserError(where + ": no integer \"step\"; each line of metrics.jsonl is one JSON object with a \"step\"");
    MetricsRow row;
    row.step = object["step"].get<std::int64_t>();
    for (const auto& [key, value] : object.items()) {
      // NaN and infinities are written as null: a gap in the curve, not an error.
      if (key != "step" && value.is_number()) row.values[key] = value.get<double>();
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string scalar_text(const Value* v) {
  if (!v || v->is_null() || v->is_map() || v->is_list()) return "";
  if (v->is_string()) return v->as_string();
  return v->to_yaml();
}

}  // namespace

RunRecord read_run(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw UserError("'" + dir.string() + "' is not a directory (a run directory)");
  const fs::path metrics = dir / "metrics.jsonl";
  if (!fs::exists(metrics, ec))
    throw UserError("'" + dir.string() +
                    "' is not a run directory: it has no metrics.jsonl (a run of `loom train` with the jsonl "
                    "tracker writes one, docs/training.md)");
  RunRecord run;
  run.dir = dir;
  run.name = run_name(dir);
  run.rows = read_metrics(metrics);
  const fs::path config_file = dir / "config.yaml";
  if (fs::exists(config_file, ec)) {
    run.config_yaml = text_of(config_file);
    const Value config = config::load_file(config_file);
    for (const auto& [label, path] :
         std::vector<std::pair<std::string, std::string>>{{"model", "model.type"},
                                                          {"context", "model.seq_len"},
                                                          {"hidden", "model.hidden_dim"},
                                                          {"layers", "model.num_layers"},
                                                          {"tokenizer", "tokenizer.type"},
                                                          {"data", "data.type"},
                                                          {"optimizer", "optimizer.type"},
                                                          {"learning rate", "optimizer.learning_rate"},
                                                          {"schedule", "lr_schedule.type"},
                                                          {"batch", "trainer.train_batch_size"},
                                                          {"steps", "trainer.num_train_steps"},
                                                          {"seed", "trainer.seed"}}) {
      const std::string text = scalar_text(config.at_path(path));
      if (!text.empty()) run.header[label] = text;
    }
    const Value* batch = config.at_path("trainer.train_batch_size");
    const Value* seq = config.at_path("model.seq_len");
    if (batch && batch->is_int() && seq && seq->is_int()) run.tokens_per_step = batch->as_int() * seq->as_int();
  }
  run.header["run directory"] = dir.string();
  // What the trainer printed at start-up (header.json, written by runs since it existed): the
  // parameters, the context, the data, the matmul precision, the mesh, the memory estimate.
  if (fs::exists(dir / "header.json", ec)) {
    const nlohmann::json header = nlohmann::json::parse(text_of(dir / "header.json"), nullptr, false);
    if (header.is_object()) {
      if (header.contains("text") && header["text"].is_string()) run.trainer_header = header["text"].get<std::string>();
      auto number = [&](const char* key, const char* label, double scale, const char* unit) {
        if (!header.contains(key) || !header[key].is_number()) return;
        std::ostringstream os;
        os.precision(4);
        os << header[key].get<double>() / scale << unit;
        run.header[label] = os.str();
      };
      number("parameters", "parameters", 1e6, "M");
      number("flops_per_token", "FLOPs per token", 1e6, "M");
      number("train_tokens", "training tokens", 1, "");
      number("peak_flops", "peak FLOP/s", 1e9, "G");
      for (const auto& [key, label] : std::vector<std::pair<std::string, std::string>>{
               {"matmul_dtype", "matmuls in"}, {"mesh", "mesh"}, {"memory", "memory estimate"}})
        if (header.contains(key) && header[key].is_string() && !header[key].get<std::string>().empty())
          run.header[label] = header[key].get<std::string>();
    }
  }
  if (!run.rows.empty()) {
    const auto& last = run.rows.back();
    run.header["last logged step"] = std::to_string(last.step);
    const auto elapsed = last.values.find("throughput/elapsed_seconds");
    if (elapsed != last.values.end()) {
      std::ostringstream os;
      os.precision(4);
      os << elapsed->second << " s";
      run.header["elapsed"] = os.str();
    }
  }
  // A run without checkpoints is still a run to chart.
  try {
    run.checkpoints = list_checkpoints(dir);
  } catch (const UserError&) {
  }
  return run;
}

ReportAxis parse_report_axis(const std::string& text) {
  if (text == "step") return ReportAxis::step;
  if (text == "tokens") return ReportAxis::tokens;
  throw UserError("--x '" + text + "': the x axis is step or tokens");
}

}  // namespace loom
