// HfConfigFields (sdk/include/loom/hf_architecture.hpp): config.json's fields as the model
// plugins' mappings read them. A value in a message is shown as JSON, as the file has it.
#include "loom/hf_architecture.hpp"

#include <limits>

#include "loom/core/json_value.hpp"
#include "loom/error.hpp"

namespace loom {

namespace {

// A JSON value as a message shows it: its text, cut short.
std::string shown(const Value& value) {
  std::string text = interop::to_json(value).dump();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

}  // namespace

HfConfigFields::HfConfigFields(const Value& json, std::string file, std::string prefix)
    : json_(&json), file_(std::move(file)), prefix_(std::move(prefix)) {}

bool HfConfigFields::has(std::string_view key) const {
  return json_->find(key) != nullptr;
}

bool HfConfigFields::is_null(std::string_view key) const {
  const Value* v = json_->find(key);
  return v && v->is_null();
}

std::int64_t HfConfigFields::integer(std::string_view key, std::int64_t fallback) const {
  const Value* v = json_->find(key);
  if (!v || v->is_null()) return fallback;
  if (!v->is_int()) wrong(key, "an integer");
  return v->as_int();
}

double HfConfigFields::number(std::string_view key, double fallback) const {
  const Value* v = json_->find(key);
  if (!v || v->is_null()) return fallback;
  if (!v->is_number()) wrong(key, "a number");
  return v->as_double();
}

bool HfConfigFields::boolean(std::string_view key, bool fallback) const {
  const Value* v = json_->find(key);
  if (!v || v->is_null()) return fallback;
  if (!v->is_bool()) wrong(key, "true or false");
  return v->as_bool();
}

std::string HfConfigFields::string(std::string_view key, const std::string& fallback) const {
  const Value* v = json_->find(key);
  if (!v || v->is_null()) return fallback;
  if (!v->is_string()) wrong(key, "a string");
  return v->as_string();
}

std::int64_t HfConfigFields::size(std::string_view key, std::int64_t fallback) const {
  const std::int64_t n = integer(key, fallback);
  if (n < 1 || n > std::numeric_limits<std::int32_t>::max())
    wrong(key, "a positive integer of at most 2147483647 (2^31 - 1)");
  return n;
}

double HfConfigFields::number_or_off(std::string_view key, double fallback) const {
  return is_null(key) ? 0.0 : number(key, fallback);
}

std::int64_t HfConfigFields::positions_or_off(std::string_view key, double fallback) const {
  const double n = number_or_off(key, fallback);
  if (!(n >= 0 && n <= std::numeric_limits<std::int32_t>::max()))
    wrong(key, "null or a number of positions from 0 to 2147483647");
  return static_cast<std::int64_t>(n);
}

std::optional<HfConfigFields> HfConfigFields::object(std::string_view key) const {
  const Value* v = json_->find(key);
  if (!v || v->is_null()) return std::nullopt;
  if (!v->is_map()) wrong(key, "an object");
  return HfConfigFields(*v, file_, prefix_ + std::string(key) + ".");
}

void HfConfigFields::wrong(std::string_view key, std::string_view wanted) const {
  const Value* v = json_->find(key);
  throw UserError("'" + file_ + "': " + prefix_ + std::string(key) + " is " + (v ? shown(*v) : std::string("null")) +
                  ", expected " + std::string(wanted));
}

}  // namespace loom
