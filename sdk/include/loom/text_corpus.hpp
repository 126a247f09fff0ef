// Reading text corpora: the file lists, plain-text files and JSON-lines files that the `text` and
// `jsonl` datasets and `loom tokenize` read. Every failure is a UserError naming the file (and
// the line, for JSON lines).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

// The files `patterns` name, in order, without duplicates. A pattern is a file, a directory (its
// regular files, sorted, hidden ones excepted) or a glob (`data/*.txt`, sorted matches). Relative
// paths are relative to the current directory. A missing file, an empty directory or a glob
// matching nothing is a UserError that quotes the pattern and `option` (where it was given, such
// as "data.paths").
std::vector<std::filesystem::path> expand_paths(const std::vector<std::string>& patterns, const std::string& option);

// Names a list of files for messages: "data/x.txt", or "3 files (data/a.txt, data/b.txt, ...)".
std::string describe_files(const std::vector<std::filesystem::path>& files);

// The whole file. A UserError when it is missing or unreadable.
std::string read_text_file(const std::filesystem::path& file);

// One document of a JSON-lines file.
struct JsonlDocument {
  std::string text;             // the value of the field
  std::int64_t line = 0;        // 1-based
  std::int64_t end_offset = 0;  // bytes of the file read so far, for progress
};

// Calls `on_document` for every line of `file` that is not blank, in order, with the string value
// of `field`. A line that is not a JSON object, lacks the field, or holds a non-string value in
// it is a UserError "file:line: ..." saying which.
void read_jsonl(const std::filesystem::path& file, const std::string& field,
                const std::function<void(JsonlDocument&&)>& on_document);

}  // namespace loom
