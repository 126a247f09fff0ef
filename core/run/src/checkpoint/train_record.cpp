#include "checkpoint/train_record.hpp"

#include <cmath>
#include <ctime>
#include <limits>
#include <nlohmann/json.hpp>

#include "loom/error.hpp"

namespace loom::checkpoint {

namespace {

using Json = nlohmann::ordered_json;
constexpr int kVersion = 1;

// JSON has no NaN or infinity (a loss may be either when crash_on_nan is off): those are strings.
Json number(double x) {
  if (std::isfinite(x)) return x;
  return std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf");
}

double to_double(const nlohmann::json& j, const std::string& what) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {
    const std::string s = j.get<std::string>();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
  }
  throw UserError("has " + what + " that is not a number");
}

const nlohmann::json& field(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) throw UserError("has no \"" + std::string(key) + "\"" + where);
  return j[key];
}

std::int64_t integer(const nlohmann::json& j, const char* key, const std::string& where = "") {
  const auto& v = field(j, key, where);
  if (!v.is_number_integer()) throw UserError("has a \"" + std::string(key) + "\"" + where + " that is not an integer");
  return v.get<std::int64_t>();
}

std::string string(const nlohmann::json& j, const char* key, const std::string& where = "") {
  const auto& v = field(j, key, where);
  if (!v.is_string()) throw UserError("has a \"" + std::string(key) + "\"" + where + " that is not a string");
  return v.get<std::string>();
}

std::vector<double> numbers(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto& v = field(j, key, where);
  if (!v.is_array()) throw UserError("has a \"" + std::string(key) + "\"" + where + " that is not a list");
  std::vector<double> out;
  for (const auto& x : v) out.push_back(to_double(x, "a \"" + std::string(key) + "\" entry"));
  return out;
}

}  // namespace

std::string utc_time(const char* format) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

std::string utc_now() {
  return utc_time("%Y-%m-%dT%H:%M:%SZ");
}

std::string to_json(const TrainRecord& r) {
  Json j;
  j["format"] = "loom-train-state";
  j["version"] = kVersion;
  j["step"] = r.step;
  j["saved_at"] = r.saved_at;
  j["loom_version"] = r.loom_version;
  j["run_id"] = r.run_id;
  j["config_hash"] = r.config_hash;
  j["num_train_steps"] = r.num_train_steps;
  j["threads"] = r.threads;
  j["rng"] = {{"seed", r.seed},
              {"streams",
               {{"init", {{"stream", 1}, {"counter", 0}}},
                {"data", {{"stream", 2}, {"counter", 0}, {"next_batch", r.next_batch}}},
                {"dropout", {{"stream", 3}, {"next_counter", r.step * r.micro_steps}, {"per_step", r.micro_steps}}},
                {"sample", {{"stream", 4}, {"counter", 0}}}}}};
  j["data"] = {{"next_batch", r.next_batch}, {"batch_size", r.batch_size}, {"seq_len", r.seq_len}};
  Json skip = {{"skipped_steps", r.skipped_steps}};
  if (r.has_skip_window) {
    Json losses = Json::array(), norms = Json::array();
    for (double x : r.skip_losses) losses.push_back(number(x));
    for (double x : r.skip_grad_norms) norms.push_back(number(x));
    skip["window"] = {{"losses", losses}, {"grad_norms", norms}};
  } else {
    skip["window"] = nullptr;
  }
  j["skip_bad_steps"] = skip;
  j["optimizer"] = {{"type", r.optimizer_type}, {"updates", r.optimizer_updates}};
  j["tokenizer"] = {{"type", r.tokenizer_type}, {"vocab_size", r.vocab_size}};
  j["trackers"] = {{"names", r.trackers}, {"records_through_step", r.step}};
  j["log_interval"] = {{"steps", r.interval_steps},
                       {"loss_sum", number(r.interval_loss)},
                       {"seconds", number(r.interval_seconds)},
                       {"trained_tokens", r.interval_trained_tokens}};
  j["clock"] = {{"train_seconds", number(r.train_seconds)}, {"elapsed_seconds", number(r.elapsed_seconds)}};
  return j.dump(2) + "\n";
}

TrainRecord parse_train_record(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw UserError("is not valid JSON");
  if (!j.is_object() || j.value("format", "") != "loom-train-state")
    throw UserError("is not a loom train state (no \"format\": \"loom-train-state\")");
  if (integer(j, "version") != kVersion)
    throw UserError("has a version this loom does not read (expected " + std::to_string(kVersion) + ")");
  TrainRecord r;
  r.step = integer(j, "step");
  r.saved_at = string(j, "saved_at");
  r.loom_version = string(j, "loom_version");
  r.run_id = string(j, "run_id");
  r.config_hash = string(j, "config_hash");
  r.num_train_steps = integer(j, "num_train_steps");
  r.threads = static_cast<int>(integer(j, "threads"));
  const auto& rng = field(j, "rng", "");
  if (!field(rng, "seed", " in \"rng\"").is_number_unsigned())
    throw UserError("has an \"rng\".\"seed\" that is not unsigned");
  r.seed = rng["seed"].get<std::uint64_t>();
  const auto& dropout = field(field(rng, "streams", " in \"rng\""), "dropout", " in \"rng\".\"streams\"");
  r.micro_steps = integer(dropout, "per_step", " in the dropout stream");
  const auto& data = field(j, "data", "");
  r.next_batch = integer(data, "next_batch", " in \"data\"");
  r.batch_size = integer(data, "batch_size", " in \"data\"");
  r.seq_len = integer(data, "seq_len", " in \"data\"");
  const auto& skip = field(j, "skip_bad_steps", "");
  r.skipped_steps = integer(skip, "skipped_steps", " in \"skip_bad_steps\"");
  const auto& window = field(skip, "window", " in \"skip_bad_steps\"");
  if (!window.is_null()) {
    r.has_skip_window = true;
    r.skip_losses = numbers(window, "losses", " in the skip window");
    r.skip_grad_norms = numbers(window, "grad_norms", " in the skip window");
    if (r.skip_losses.size() != r.skip_grad_norms.size())
      throw UserError("has a skip window whose losses and gradient norms differ in number");
  }
  const auto& optimizer = field(j, "optimizer", "");
  r.optimizer_type = string(optimizer, "type", " in \"optimizer\"");
  r.optimizer_updates = integer(optimizer, "updates", " in \"optimizer\"");
  const auto& tokenizer = field(j, "tokenizer", "");
  r.tokenizer_type = string(tokenizer, "type", " in \"tokenizer\"");
  r.vocab_size = integer(tokenizer, "vocab_size", " in \"tokenizer\"");
  const auto& trackers = field(field(j, "trackers", ""), "names", " in \"trackers\"");
  if (!trackers.is_array()) throw UserError("has a \"trackers\".\"names\" that is not a list");
  for (const auto& t : trackers) {
    if (!t.is_string()) throw UserError("has a tracker name that is not a string");
    r.trackers.push_back(t.get<std::string>());
  }
  const auto& interval = field(j, "log_interval", "");
  r.interval_steps = integer(interval, "steps", " in \"log_interval\"");
  r.interval_loss = to_double(field(interval, "loss_sum", " in \"log_interval\""), "a log-interval loss sum");
  r.interval_seconds = to_double(field(interval, "seconds", " in \"log_interval\""), "a log-interval time");
  if (interval.contains("trained_tokens"))
    r.interval_trained_tokens = integer(interval, "trained_tokens", " in \"log_interval\"");
  const auto& clock = field(j, "clock", "");
  r.train_seconds = to_double(field(clock, "train_seconds", " in \"clock\""), "a train time");
  r.elapsed_seconds = to_double(field(clock, "elapsed_seconds", " in \"clock\""), "an elapsed time");
  if (r.step < 0 || r.next_batch != r.step)
    throw UserError("has data.next_batch " + std::to_string(r.next_batch) + " for step " + std::to_string(r.step) +
                    " (they are equal in every checkpoint loom writes)");
  return r;
}

}  // namespace loom::checkpoint
