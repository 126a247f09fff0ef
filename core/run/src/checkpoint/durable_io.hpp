// Files that survive a crash: written, flushed to disk (fsync), and only then made visible under
// their name. What the checkpoint protocol (checkpoint_store.hpp) is built from.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace loom::checkpoint {

// Creates `path` (which must not exist), writes `contents` and fsyncs it. UserError on failure.
void write_synced(const std::filesystem::path& path, std::string_view contents);

// fsyncs a file or directory: after a rename, fsyncing the directory makes the new name durable.
void sync_path(const std::filesystem::path& path);

// Replaces `path` by `contents` atomically and durably: a temporary file beside it is written
// and fsynced, renamed over `path`, and the directory fsynced. A crash at any instant leaves
// either the old contents or the new ones.
void replace_atomically(const std::filesystem::path& path, std::string_view contents);

// A whole file as bytes. UserError when it cannot be read.
std::string read_whole(const std::filesystem::path& path);

}  // namespace loom::checkpoint
