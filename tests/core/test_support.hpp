// Helpers shared by the core and CLI tests.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace loom::test {

// A fresh directory under the system temp dir, removed with the object.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  // Writes `text` to path()/name (creating directories) and returns the full path.
  std::filesystem::path write(const std::string& name, const std::string& text) const;

 private:
  std::filesystem::path path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;        // stdout
  std::string err;        // stderr
  long peak_rss_kib = 0;  // the process's peak resident set (getrusage of the child)
};

// Runs `argv` with `env` added to the environment ("NAME=value"), capturing both streams.
CommandResult run_command(const std::vector<std::string>& argv, const std::vector<std::string>& env = {});

// The directory of a fixture scenario (good, broken, dup, shadow).
std::filesystem::path fixture_dir(const std::string& scenario);

}  // namespace loom::test
