#include "loom/text_corpus.hpp"

#include <glob.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "loom/error.hpp"

namespace fs = std::filesystem;

namespace loom {

namespace {

bool is_glob(const std::string& pattern) {
  return pattern.find_first_of("*?[") != std::string::npos;
}

std::string relative_note(const std::string& pattern) {
  if (fs::path(pattern).is_absolute()) return "";
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  return ec ? "" : " (relative paths are relative to the current directory, " + cwd.string() + ")";
}

std::string where(const std::string& option) {
  return option.empty() ? "" : " (in " + option + ")";
}

}  // namespace

std::vector<fs::path> expand_paths(const std::vector<std::string>& patterns, const std::string& option) {
  std::vector<fs::path> files;
  std::set<fs::path> seen;
  auto add = [&](const fs::path& p) {
    std::error_code ec;
    fs::path key = fs::weakly_canonical(p, ec);
    if (ec) key = p;
    if (seen.insert(key).second) files.push_back(p);
  };
  for (const auto& pattern : patterns) {
    if (pattern.empty()) throw UserError("an empty path" + where(option));
    if (is_glob(pattern)) {
      glob_t g{};
      const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
      std::vector<fs::path> matches;
      if (rc == 0)
        for (std::size_t i = 0; i < g.gl_pathc; ++i) matches.emplace_back(g.gl_pathv[i]);
      globfree(&g);
      if (rc == GLOB_ABORTED) throw UserError("cannot read the directories of '" + pattern + "'" + where(option));
      std::vector<fs::path> regular;
      for (const auto& m : matches)
        if (fs::is_regular_file(m)) regular.push_back(m);
      if (regular.empty())
        throw UserError("'" + pattern + "'" + where(option) + " matches no file" + relative_note(pattern));
      std::sort(regular.begin(), regular.end());
      for (const auto& m : regular) add(m);
      continue;
    }
    const fs::path p(pattern);
    std::error_code ec;
    const auto status = fs::status(p, ec);
    if (!fs::exists(status))
      throw UserError("no such file: '" + pattern + "'" + where(option) + relative_note(pattern));
    if (fs::is_directory(status)) {
      std::vector<fs::path> inside;
      for (const auto& entry : fs::directory_iterator(p, ec))
        if (entry.is_regular_file() && entry.path().filename().string().rfind('.', 0) != 0)
          inside.push_back(entry.path());
      if (inside.empty()) throw UserError("directory '" + pattern + "'" + where(option) + " holds no file");
      std::sort(inside.begin(), inside.end());
      for (const auto& f : inside) add(f);
      continue;
    }
    add(p);
  }
  return files;
}

std::string describe_files(const std::vector<fs::path>& files) {
  if (files.empty()) return "no files";
  if (files.size() == 1) return files.front().string();
  std::string out = std::to_string(files.size()) + " files (";
  for (std::size_t i = 0; i < files.size() && i < 2; ++i) out += (i ? ", " : "") + files[i].string();
  return out + (files.size() > 2 ? ", ...)" : ")");
}

std::string read_text_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    const std::string why = std::strerror(errno);
    if (!fs::exists(file)) throw UserError("no such file: " + file.string() + relative_note(file.string()));
    throw UserError("cannot read " + file.string() + ": " + why);
  }
  std::string text;
  in.seekg(0, std::ios::end);
  const auto size = in.tellg();
  if (size > 0) {
    text.resize(static_cast<std::size_t>(size));
    in.seekg(0);
    in.read(text.data(), size);
  }
  if (in.bad()) throw UserError("cannot read " + file.string() + ": " + std::strerror(errno));
  return text;
}

void read_jsonl(const fs::path& file, const std::string& field,
                const std::function<void(JsonlDocument&&)>& on_document) {
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    if (!fs::exists(file)) throw UserError("no such file: " + file.string() + relative_note(file.string()));
    throw UserError("cannot read " + file.string() + ": " + std::strerror(errno));
  }
  std::string line;
  std::int64_t number = 0, offset = 0;
  while (std::getline(in, line)) {
    ++number;
    offset += static_cast<std::int64_t>(line.size()) + 1;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string at = file.string() + ":" + std::to_string(number) + ": ";
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      throw UserError(at + "not valid JSON: " + json_parse_error(e.what(), e.byte, line));
    }
    if (!j.is_object())
      throw UserError(at + "expected a JSON object with a \"" + field + "\" field, found a " + j.type_name());
    const auto it = j.find(field);
    if (it == j.end()) {
      std::string keys;
      for (auto k = j.begin(); k != j.end(); ++k) {
        if (!keys.empty()) keys += ", ";
        keys += escape_input(k.key(), 40);
      }
      std::vector<std::string> names;
      for (auto k = j.begin(); k != j.end(); ++k) names.push_back(k.key());
      const std::string guess = closest_match(field, names);
      throw UserError(at + "no \"" + field + "\" field (the object has " + (keys.empty() ? "no fields" : keys) + ")" +
                      (guess.empty() ? "" : "; did you mean text_field: " + escape_input(guess, 40) + "?"));
    }
    if (!it->is_string())
      throw UserError(at + "field \"" + field + "\" is a " + it->type_name() + ", expected a string");
    on_document({it->get<std::string>(), number, offset});
  }
  if (in.bad()) throw UserError("cannot read " + file.string() + ": " + std::strerror(errno));
}

}  // namespace loom
