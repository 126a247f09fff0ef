// loom::Value <-> JSON, for config.json: the Hugging Face config a model plugin describes as a
// Value (plugins see no JSON library) and the one a Hugging Face directory holds.
#pragma once

#include <nlohmann/json.hpp>

#include "loom/value.hpp"

namespace loom::interop {

inline nlohmann::ordered_json to_json(const Value& v) {
  switch (v.type()) {
    case Value::Type::null:
      return nullptr;
    case Value::Type::boolean:
      return v.as_bool();
    case Value::Type::integer:
      return v.as_int();
    case Value::Type::number:
      return v.as_double();
    case Value::Type::string:
      return v.as_string();
    case Value::Type::list: {
      nlohmann::ordered_json out = nlohmann::ordered_json::array();
      for (const auto& e : v.as_list()) out.push_back(to_json(e));
      return out;
    }
    case Value::Type::map: {
      nlohmann::ordered_json out = nlohmann::ordered_json::object();
      for (const auto& [k, e] : v.as_map()) out[k] = to_json(e);
      return out;
    }
  }
  return nullptr;
}

inline Value to_value(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value(j.get<std::int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Value::List list;
      for (const auto& e : j) list.push_back(to_value(e));
      return Value(std::move(list));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value map = Value::map();
      for (const auto& [k, e] : j.items()) map.set(k, to_value(e));
      return map;
    }
    default:
      return Value();
  }
}

}  // namespace loom::interop
