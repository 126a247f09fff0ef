// Reading a run directory for `loom report`: see loom/run/report.hpp.
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "loom/core/config.hpp"
#include "loom/error.hpp"
#include "loom/run/report.hpp"
#include "report/escape.hpp"

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

// The 1-based column of the first byte that does not begin or continue a UTF-8 character, or of a
// control character other than tab and carriage return (binary data); 0 when the line is text.
std::size_t first_bad_byte(const std::string& line) {
  const auto* s = reinterpret_cast<const unsigned char*>(line.data());
  const std::size_t n = line.size();
  for (std::size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    std::size_t extra = 0;
    if (c < 0x80) {
      if ((c < 0x20 && c != '\t' && c != '\r') || c == 0x7f) return i + 1;
      ++i;
      continue;
    }
    if (c >= 0xc2 && c <= 0xdf)
      extra = 1;
    else if (c >= 0xe0 && c <= 0xef)
      extra = 2;
    else if (c >= 0xf0 && c <= 0xf4)
      extra = 3;
    else
      return i + 1;
    if (i + extra >= n) return i + 1;
    for (std::size_t k = 1; k <= extra; ++k)
      if ((s[i + k] & 0xc0) != 0x80) return i + 1;
    i += extra + 1;
  }
  return 0;
}

std::vector<MetricsRow> read_metrics(const fs::path& file, std::vector<std::string>& notes) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec))
    throw UserError("'" + file.string() +
                    "' is not a file: a run directory's metrics.jsonl is a file, one JSON object per line (written "
                    "by the jsonl tracker, docs/training.md)");
  std::ifstream in(file, std::ios::binary);
  if (!in) throw UserError("cannot read '" + file.string() + "'");
  std::ostringstream all;
  all << in.rdbuf();
  const std::string text = all.str();
  std::vector<MetricsRow> rows;
  std::size_t start = 0;
  for (std::size_t number = 1; start < text.size(); ++number) {
    const std::size_t end = text.find('\n', start);
    const bool complete = end != std::string::npos;
    const std::string line = text.substr(start, complete ? end - start : std::string::npos);
    start = complete ? end + 1 : text.size();
    const std::string where = file.string() + ":" + std::to_string(number);
    const std::string rule = "; each line of metrics.jsonl is one JSON object with a \"step\"";
    nlohmann::json object;
    std::string problem;
    if (const std::size_t bad = first_bad_byte(line)) {
      problem = "not UTF-8 text (byte " + hex_byte(static_cast<unsigned char>(line[bad - 1])) + " at column " +
                std::to_string(bad) + ")";
    } else if (line.find_first_not_of(" \t\r") == std::string::npos) {
      if (!complete) break;  // the file ends with its newline and some blanks
      problem = "empty line";
    } else {
      try {
        object = nlohmann::json::parse(line);
      } catch (const nlohmann::json::parse_error& e) {
        problem = "not a JSON object (a syntax error at column " + std::to_string(e.byte) + ": " +
                  printable(line.substr(0, 60)) + (line.size() > 60 ? "..." : "") + ")";
      }
    }
    if (!problem.empty()) {
      // The line the tracker is writing as we read: the run's next step, not a fault.
      if (!complete) {
        notes.push_back("line " + std::to_string(number) + " of " + file.string() +
                        " has no newline yet and does not parse: a line being written, left out");
        break;
      }
      throw UserError(where + ": " + problem + rule);
    }
    if (!object.is_object() || !object.contains("step") || !object["step"].is_number_integer())
      throw UserError(where + ": no integer \"step\"" + rule);
    MetricsRow row;
    row.step = object["step"].get<std::int64_t>();
    for (const auto& [key, value] : object.items()) {
      if (key == "step") continue;
      // NaN and infinities are written as null: a gap in the curve, not an error.
      if (value.is_number())
        row.values[key] = value.get<double>();
      else if (value.is_null())
        row.values[key] = std::numeric_limits<double>::quiet_NaN();
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string scalar_text(const Value* v) {
  if (!v || v->is_null() || v->is_map()) return "";
  if (v->is_string()) return v->as_string();
  std::string text = v->is_list() ? v->to_flow() : v->to_yaml();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

void flatten(const Value& v, const std::string& prefix, std::map<std::string, std::string>& out) {
  if (v.is_map() && !v.as_map().empty()) {
    for (const auto& [key, child] : v.as_map()) flatten(child, prefix.empty() ? key : prefix + "." + key, out);
    return;
  }
  std::string text = v.is_string() ? v.as_string() : v.to_flow();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  out[prefix] = text;
}

// Whether a process holds a lock on `file` (a training `loom train` holds its run directory's
// .lock with flock): read from /proc/locks, so that looking never takes the lock from a run.
bool lock_held(const fs::path& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return false;
  std::ifstream in("/proc/locks");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string id, kind, advisory, mode, pid, device;
    fields >> id >> kind;
    if (kind == "->") continue;  // a process waiting for the lock, not holding it
    fields >> advisory >> mode >> pid >> device;
    unsigned major_number = 0, minor_number = 0;
    unsigned long long inode = 0;
    if (std::sscanf(device.c_str(), "%x:%x:%llu", &major_number, &minor_number, &inode) != 3) continue;
    if (inode == static_cast<unsigned long long>(st.st_ino) && major_number == major(st.st_dev) &&
        minor_number == minor(st.st_dev))
      return true;
  }
  return false;
}

bool finite_at(const MetricsRow& row, const std::string& key, double* value = nullptr) {
  const auto it = row.values.find(key);
  if (it == row.values.end() || !std::isfinite(it->second)) return false;
  if (value) *value = it->second;
  return true;
}

bool nonfinite_at(const MetricsRow& row, const std::string& key) {
  const auto it = row.values.find(key);
  return it != row.values.end() && !std::isfinite(it->second);
}

std::string of_planned(const RunStatus& s) {
  return s.planned_steps > 0 ? " of " + std::to_string(s.planned_steps) : "";
}

// end.json, which the trainer writes as a run ends (older runs have none): its status, step,
// reason; empty status when there is none or it is unreadable.
struct RecordedEnd {
  std::string status;
  std::int64_t step = 0;
  std::string reason;
};

RecordedEnd read_end(const fs::path& file, std::vector<std::string>& notes) {
  std::error_code ec;
  if (!fs::exists(file, ec)) return {};
  const nlohmann::json j = nlohmann::json::parse(text_of(file), nullptr, /*allow_exceptions=*/false);
  static const std::set<std::string> statuses{"finished", "diverged", "stopped", "error"};
  if (!j.is_object() || !j.contains("status") || !j["status"].is_string() ||
      !statuses.count(j["status"].get<std::string>()) || !j.contains("step") || !j["step"].is_number_integer()) {
    notes.push_back(file.string() +
                    " is not a record of how the run ended (a JSON object with a status of finished, diverged, "
                    "stopped or error, and a step): left out, the status is read from the metrics");
    return {};
  }
  RecordedEnd end{j["status"].get<std::string>(), j["step"].get<std::int64_t>(), ""};
  if (j.contains("reason") && j["reason"].is_string()) end.reason = j["reason"].get<std::string>();
  return end;
}

void derive_status(RunRecord& run, bool final_weights, bool running, const RecordedEnd& end) {
  RunStatus& s = run.status;
  for (const auto& row : run.rows) s.last_step = std::max(s.last_step, row.step);
  // The first step whose loss or norm is NaN (logged as null) in the run's last stretch of them.
  std::int64_t bad_step = 0;
  std::string bad_metric;
  for (auto it = run.rows.rbegin(); it != run.rows.rend(); ++it) {
    const bool has = it->values.count("train/loss") || it->values.count("train/grad_norm");
    if (!has) continue;
    const bool bad = nonfinite_at(*it, "train/loss") || nonfinite_at(*it, "train/grad_norm");
    if (!bad) break;
    bad_step = it->step;
    bad_metric = nonfinite_at(*it, "train/loss") ? "train/loss" : "train/grad_norm";
  }
  if (running) {
    s.state = RunState::running;
    s.text = s.last_step > 0
                 ? "running, step " + std::to_string(s.last_step) + of_planned(s)
                 : "running, no step logged yet" +
                       (s.planned_steps > 0 ? " (" + std::to_string(s.planned_steps) + " planned)" : std::string());
    if (bad_step) s.text += "; " + bad_metric + " NaN or infinite since step " + std::to_string(bad_step);
  } else if (!end.status.empty()) {
    // How the run ended, as the trainer recorded it.
    std::int64_t saved = 0;
    if (run.checkpoints)
      for (const auto& c : run.checkpoints->checkpoints) saved = std::max(saved, c.step);
    const std::string resumes = saved > 0
                                    ? "; `loom train` resumes it from its checkpoint of step " + std::to_string(saved)
                                    : "; no checkpoint";
    const std::string reason = end.reason.empty() ? std::string() : ": " + end.reason;
    const std::string step = std::to_string(end.step);
    if (end.status == "finished") {
      s.state = RunState::finished;
      s.text = "finished, " + step + " steps";
    } else if (end.status == "diverged") {
      s.state = RunState::diverged;
      s.detail = (end.reason.empty() ? std::string("NaN or infinite") : end.reason) + " at step " + step;
      s.text = "diverged: " + s.detail + of_planned(s);
    } else if (end.status == "stopped") {
      s.state = RunState::stopped;
      s.detail = (end.reason.empty() ? std::string() : "by " + end.reason + " ") + "after step " + step;
      s.text = "stopped " + s.detail + of_planned(s) + resumes;
    } else {
      s.state = RunState::stopped;
      // The table's cell: the error's first line, cut at a character's start past 80 bytes.
      std::string first = end.reason.substr(0, end.reason.find('\n'));
      if (first.size() > 80) {
        std::size_t cut = 80;
        while (cut > 0 && (static_cast<unsigned char>(first[cut]) & 0xC0) == 0x80) --cut;
        first = first.substr(0, cut) + "...";
      }
      s.detail = "error after step " + step + (first.empty() ? std::string() : ": " + first);
      s.text = "error after step " + step + of_planned(s) + reason + resumes;
    }
  } else if (bad_step) {
    s.state = RunState::diverged;
    s.text = "diverged: " + bad_metric + " NaN or infinite at step " + std::to_string(bad_step) +
             (s.last_step > bad_step ? " and after, to step " + std::to_string(s.last_step) : "") + of_planned(s);
  } else if (final_weights || (s.planned_steps > 0 && s.last_step >= s.planned_steps)) {
    s.state = RunState::finished;
    s.text = "finished, " + std::to_string(s.last_step) + " steps";
  } else {
    s.state = RunState::stopped;
    std::int64_t saved = 0;
    if (run.checkpoints)
      for (const auto& c : run.checkpoints->checkpoints) saved = std::max(saved, c.step);
    s.text = (s.last_step > 0 ? "stopped at step " + std::to_string(s.last_step) + of_planned(s)
                              : "stopped before its first logged step" + of_planned(s)) +
             ": not running, no final weights" +
             (saved > 0 ? "; `loom train` resumes it from its checkpoint of step " + std::to_string(saved)
                        : "; no checkpoint") +
             " (interrupted, killed, or ended by an error such as a NaN loss, which `loom train` printed)";
  }
}

void summarise(RunRecord& run) {
  RunSummary& m = run.summary;
  std::vector<double> rates;
  for (const auto& row : run.rows) {
    double v = 0;
    if (finite_at(row, "eval/loss", &v)) {
      m.final_eval_loss = v;
      if (!m.best_eval_loss || v < *m.best_eval_loss) m.best_eval_loss = v, m.best_eval_step = row.step;
    }
    if (finite_at(row, "throughput/elapsed_seconds", &v)) m.wall_seconds = v;
    if (finite_at(row, "throughput/tokens_per_second", &v)) rates.push_back(v);
    if (finite_at(row, "throughput/mfu", &v) && (!m.max_mfu || v > *m.max_mfu))
      m.max_mfu = v, m.max_mfu_step = row.step;
  }
  if (!rates.empty()) {
    std::sort(rates.begin(), rates.end());
    const std::size_t n = rates.size();
    m.tokens_per_second = n % 2 ? rates[n / 2] : (rates[n / 2 - 1] + rates[n / 2]) / 2;
  }
  if (run.tokens_per_step > 0 && run.status.last_step > 0)
    m.tokens = static_cast<double>(run.status.last_step) * static_cast<double>(run.tokens_per_step);
}

}  // namespace

std::string run_state_name(RunState state) {
  switch (state) {
    case RunState::finished:
      return "finished";
    case RunState::running:
      return "running";
    case RunState::diverged:
      return "diverged";
    case RunState::stopped:
      return "stopped";
  }
  return "stopped";
}

std::string report_number(double v, bool count) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[48];
  const double a = std::abs(v);
  if (a >= 1e4) {
    const char* const prefixes[] = {"k", "M", count ? "B" : "G", "T", "P"};
    double scaled = v / 1e3;
    std::size_t i = 0;
    while (std::abs(scaled) >= 999.95 && i + 1 < std::size(prefixes)) scaled /= 1e3, ++i;
    if (a >= 1e18)
      std::snprintf(buf, sizeof buf, "%.4g", v);
    else
      std::snprintf(buf, sizeof buf, "%.4g%s", scaled, prefixes[i]);
    return buf;
  }
  if (a != 0 && a < 1e-4) {
    std::snprintf(buf, sizeof buf, "%.3e", v);
    // 1.000e-05 -> 1e-05; 2.500e-04 -> 2.5e-04
    std::string s = buf;
    const std::size_t e = s.find('e');
    std::string mantissa = s.substr(0, e), exponent = s.substr(e);
    if (mantissa.find('.') != std::string::npos) {
      while (mantissa.back() == '0') mantissa.pop_back();
      if (mantissa.back() == '.') mantissa.pop_back();
    }
    return mantissa + exponent;
  }
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

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
  run.label = run.name;
  // Whether a `loom train` is writing the directory, looked at before the metrics: a run that
  // ends while they are read is then reported as running, never as stopped short.
  const bool running = lock_held(dir / ".lock");
  run.rows = read_metrics(metrics, run.notes);
  const fs::path config_file = dir / "config.yaml";
  if (fs::exists(config_file, ec)) {
    run.config_yaml = text_of(config_file);
    const Value config = config::load_file(config_file);
    flatten(config, "", run.config_values);
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
                                                          {"seed", "trainer.seed"},
                                                          {"initialised from", "trainer.init_from"}}) {
      const std::string text = scalar_text(config.at_path(path));
      if (!text.empty()) run.header[label] = text;
    }
    // LoRA and its quantized base: only for a run that trains adapters (lora.rank > 0).
    const Value* rank = config.at_path("lora.rank");
    if (rank && rank->is_int() && rank->as_int() > 0) {
      for (const auto& [label, path] :
           std::vector<std::pair<std::string, std::string>>{{"lora rank", "lora.rank"},
                                                            {"lora alpha", "lora.alpha"},
                                                            {"lora dropout", "lora.dropout"},
                                                            {"lora targets", "lora.target_modules"},
                                                            {"lora base_dtype", "lora.base_dtype"}}) {
        const std::string text = scalar_text(config.at_path(path));
        if (!text.empty()) run.header[label] = text;
      }
      if (!run.header.count("lora base_dtype")) run.header["lora base_dtype"] = "f32";
    }
    const Value* batch = config.at_path("trainer.train_batch_size");
    const Value* seq = config.at_path("model.seq_len");
    if (batch && batch->is_int() && seq && seq->is_int()) run.tokens_per_step = batch->as_int() * seq->as_int();
    const Value* steps = config.at_path("trainer.num_train_steps");
    if (steps && steps->is_int()) run.status.planned_steps = steps->as_int();
  }
  run.header["run directory"] = dir.string();
  // What the trainer printed at start-up (header.json, written by runs since it existed): the
  // parameters, the context, the data, the matmul precision, the mesh, the memory estimate.
  if (fs::exists(dir / "header.json", ec)) {
    const nlohmann::json header = nlohmann::json::parse(text_of(dir / "header.json"), nullptr, false);
    if (header.is_object()) {
      if (header.contains("text") && header["text"].is_string()) run.trainer_header = header["text"].get<std::string>();
      auto number = [&](const char* key, const char* label, const char* unit, bool count) {
        if (!header.contains(key) || !header[key].is_number()) return;
        run.header[label] = report_number(header[key].get<double>(), count) + unit;
      };
      number("parameters", "parameters", "", true);
      number("flops_per_token", "FLOPs per token", "", false);
      number("train_tokens", "training tokens", "", true);
      number("peak_flops", "peak FLOP/s", "", false);
      for (const auto& [key, label] : std::vector<std::pair<std::string, std::string>>{
               {"matmul_dtype", "matmuls in"}, {"mesh", "mesh"}, {"memory", "memory estimate"}})
        if (header.contains(key) && header[key].is_string() && !header[key].get<std::string>().empty())
          run.header[label] = header[key].get<std::string>();
      if (run.status.planned_steps == 0 && header.contains("steps") && header["steps"].is_number_integer())
        run.status.planned_steps = header["steps"].get<std::int64_t>();
      if (header.contains("memory") && header["memory"].is_string()) {
        const std::string memory = header["memory"].get<std::string>();
        run.summary.memory = memory.substr(0, memory.find('\n'));
        const std::string lead = "memory estimate per rank: ";
        if (run.summary.memory.rfind(lead, 0) == 0) run.summary.memory = run.summary.memory.substr(lead.size());
        run.summary.memory = run.summary.memory.substr(0, run.summary.memory.find(" ("));
      }
    }
  }
  // A run without checkpoints is still a run to chart.
  try {
    run.checkpoints = list_checkpoints(dir);
  } catch (const UserError&) {
  }
  const bool final_weights =
      fs::exists(dir / "model.safetensors", ec) || fs::exists(dir / "adapter_model.safetensors", ec);
  derive_status(run, final_weights, running, read_end(dir / "end.json", run.notes));
  summarise(run);
  run.header["status"] = run.status.text;
  if (run.status.last_step > 0) run.header["last logged step"] = std::to_string(run.status.last_step);
  if (run.summary.wall_seconds) run.header["elapsed"] = report_number(*run.summary.wall_seconds) + " s";
  return run;
}

void label_runs(std::vector<RunRecord>& runs) {
  std::vector<std::vector<std::string>> parts(runs.size());
  for (std::size_t i = 0; i < runs.size(); ++i) {
    fs::path p = fs::absolute(runs[i].dir).lexically_normal();
    if (p.filename().empty()) p = p.parent_path();
    for (const auto& part : p) parts[i].push_back(part.string());
    std::reverse(parts[i].begin(), parts[i].end());  // the last component first
    if (!parts[i].empty() && parts[i].back() == "/") parts[i].pop_back();
  }
  auto ending = [&](std::size_t i, std::size_t k) {
    std::string s;
    for (std::size_t j = std::min(k, parts[i].size()); j-- > 0;) s += parts[i][j] + (j ? "/" : "");
    return s;
  };
  for (std::size_t i = 0; i < runs.size(); ++i) {
    std::size_t k = 1;
    for (; k < parts[i].size(); ++k) {
      bool unique = true;
      for (std::size_t j = 0; j < runs.size() && unique; ++j)
        if (j != i && parts[j] != parts[i] && ending(j, k) == ending(i, k)) unique = false;
      if (unique) break;
    }
    runs[i].label = parts[i].empty() ? runs[i].name : ending(i, k);
    std::size_t same = 1;
    for (std::size_t j = 0; j < i; ++j)
      if (parts[j] == parts[i]) ++same;
    if (same > 1) runs[i].label += " (" + std::to_string(same) + ")";
  }
}

std::vector<std::string> config_differences(const std::vector<RunRecord>& runs) {
  std::set<std::string> keys;
  for (const auto& run : runs)
    for (const auto& [key, value] : run.config_values) keys.insert(key);
  std::vector<std::string> out;
  for (const auto& key : keys) {
    // The run's own name and place differ by construction: not a difference of the experiment.
    if (key == "trainer.run_dir" || key == "trainer.run_id") continue;
    std::set<std::string> seen;
    for (const auto& run : runs) {
      const auto it = run.config_values.find(key);
      seen.insert(it == run.config_values.end() ? std::string("\x01"
                                                              "absent")
                                                : it->second);
    }
    if (seen.size() > 1) out.push_back(key);
  }
  return out;
}

ReportAxis parse_report_axis(const std::string& text) {
  if (text == "step") return ReportAxis::step;
  if (text == "tokens") return ReportAxis::tokens;
  if (text == "time") return ReportAxis::time;
  throw UserError("--x '" + printable(text) + "': the x axis is step, tokens or time");
}

}  // namespace loom
