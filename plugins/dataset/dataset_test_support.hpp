// What the dataset plugins' tests share: a small in-process tokenizer (so the tests do not depend
// on the tokenizer plugins), temporary files, loading a dataset plugin through the real host, and
// the invariants every batch must satisfy.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "loom/core/plugin_host.hpp"
#include "loom/core/registry.hpp"
#include "loom/error.hpp"
#include "loom/kinds/dataset.hpp"
#include "loom/kinds/tokenizer.hpp"

namespace loom::test {

// Bytes as ids. `byte` mode: 256 ids, plus an end-of-text id 256 when `with_eot`. `char` mode
// (fit = true): the distinct bytes of the fitted text, sorted, like nanoGPT's shakespeare_char.
class TestTokenizer final : public Tokenizer {
 public:
  explicit TestTokenizer(bool fit = false, bool with_eot = false) : fit_(fit), with_eot_(with_eot) {
    if (!fit_)
      for (int i = 0; i < 256; ++i) table_[i] = i;
  }
  std::int64_t vocab_size() const override {
    return (fit_ ? static_cast<std::int64_t>(chars_.size()) : 256) + (with_eot_ ? 1 : 0);
  }
  std::vector<std::int32_t> encode(std::string_view text) const override {
    std::vector<std::int32_t> out;
    out.reserve(text.size());
    for (const char c : text) {
      const int id = table_[static_cast<unsigned char>(c)];
      if (id < 0) throw UserError(std::string("test tokenizer: character '") + c + "' is not in the vocabulary");
      out.push_back(id);
    }
    return out;
  }
  std::string decode(std::span<const std::int32_t> ids) const override {
    std::string out;
    for (const auto id : ids) {
      if (id < 0 || id >= vocab_size()) throw UserError("test tokenizer: id " + std::to_string(id) + " out of range");
      if (with_eot_ && id == vocab_size() - 1) {
        out += "<|eot|>";
      } else {
        out += fit_ ? chars_[static_cast<std::size_t>(id)] : static_cast<char>(id);
      }
    }
    return out;
  }
  std::optional<std::int32_t> end_of_text() const override {
    if (!with_eot_) return std::nullopt;
    return static_cast<std::int32_t>(vocab_size() - 1);
  }
  // Like the real `char` tokenizer: needs a fit until it has a vocabulary.
  bool needs_fit() const override { return fit_ && !fitted_; }
  void fit(std::string_view text) override {
    std::set<char> seen(text.begin(), text.end());
    load_state(std::string(seen.begin(), seen.end()));
    ++fits;
  }
  std::string state() const override { return fit_ ? chars_ : ""; }
  void load_state(std::string_view state) override {
    chars_ = std::string(state);
    std::fill(std::begin(table_), std::end(table_), -1);
    for (std::size_t i = 0; i < chars_.size(); ++i) table_[static_cast<unsigned char>(chars_[i])] = static_cast<int>(i);
    fitted_ = !chars_.empty();
  }

  int fits = 0;

 private:
  bool fit_, with_eot_;
  bool fitted_ = false;
  std::string chars_;
  int table_[256];
};

// A fresh directory, removed with the object.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("loom-dataset-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path write(const std::string& name, const std::string& text) const {
    const auto p = path_ / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }

 private:
  std::filesystem::path path_;
};

// The registry with the plugins of `plugin_dir` loaded (once per test binary).
inline Registry& plugin_registry(const std::string& plugin_dir) {
  static Registry registry;
  static bool loaded = [&] {
    PluginHost host;
    host.load({{plugin_dir, "test"}}, registry);
    return true;
  }();
  (void)loaded;
  return registry;
}

// Creates dataset `name` with the options of `node` (a map; `type` is added).
inline Handle<Dataset> make_dataset(const std::string& plugin_dir, const std::string& name, Value node) {
  if (node.is_null()) node = Value::map();
  node.set("type", Value(name));
  return plugin_registry(plugin_dir).create<Dataset>(ComponentRef{"dataset", name, node, "data"});
}

// A tokenizer plugin of the build (the real `byte`, `char`, ...), or null when it is not built.
inline Handle<Tokenizer> plugin_tokenizer(const std::string& plugin_dir, const std::string& name) {
  Registry& r = plugin_registry(plugin_dir);
  if (!r.find("tokenizer", name)) return nullptr;
  return r.create<Tokenizer>(ComponentRef{"tokenizer", name, Value(name), "tokenizer"});
}

inline DatasetSetup make_setup(Handle<Tokenizer> tokenizer, std::int64_t seq_len, std::int64_t batch_size,
                               std::uint64_t seed = 1, std::int64_t vocab_size = 0) {
  DatasetSetup s;
  s.tokenizer = std::move(tokenizer);
  s.seq_len = seq_len;
  s.batch_size = batch_size;
  s.seed = seed;
  s.vocab_size = vocab_size;
  return s;
}

inline Value string_list(const std::vector<std::string>& items) {
  Value::List l;
  for (const auto& i : items) l.emplace_back(i);
  return Value(l);
}

// Shapes, and targets equal to the inputs shifted by one inside each row (the last target is the
// window's extra token, checked against `stream` when given).
inline void expect_well_formed(const Batch& b, std::int64_t batch_size, std::int64_t seq_len) {
  ASSERT_EQ(b.batch_size, batch_size);
  ASSERT_EQ(b.seq_len, seq_len);
  ASSERT_EQ(b.inputs.size(), static_cast<std::size_t>(batch_size * seq_len));
  ASSERT_EQ(b.targets.size(), b.inputs.size());
  ASSERT_EQ(b.segment_ids.size(), b.inputs.size());
  for (std::int64_t r = 0; r < batch_size; ++r) {
    const std::size_t at = static_cast<std::size_t>(r * seq_len);
    EXPECT_EQ(b.segment_ids[at], 0) << "row " << r << " does not start in segment 0";
    for (std::int64_t i = 0; i + 1 < seq_len; ++i)
      ASSERT_EQ(b.targets[at + i], b.inputs[at + i + 1]) << "row " << r << " position " << i;
    for (std::int64_t i = 1; i < seq_len; ++i) {
      const int step = b.segment_ids[at + i] - b.segment_ids[at + i - 1];
      ASSERT_TRUE(step == 0 || step == 1) << "row " << r << " position " << i;
    }
    for (std::int64_t i = 0; i < seq_len; ++i) ASSERT_GE(b.targets[at + i], 0);
  }
}

// Segment ids change exactly after each occurrence of `separator` (a one-token separator).
inline void expect_segments_follow(const Batch& b, std::int32_t separator) {
  for (std::int64_t r = 0; r < b.batch_size; ++r) {
    const std::size_t at = static_cast<std::size_t>(r * b.seq_len);
    std::int32_t expected = 0;
    for (std::int64_t i = 0; i < b.seq_len; ++i) {
      ASSERT_EQ(b.segment_ids[at + i], expected) << "row " << r << " position " << i;
      if (b.inputs[at + i] == separator) ++expected;
    }
  }
}

// The row's input and last target as one seq_len + 1 window.
inline std::vector<std::int32_t> window(const Batch& b, std::int64_t row) {
  const auto at = static_cast<std::ptrdiff_t>(row * b.seq_len);
  std::vector<std::int32_t> w(b.inputs.begin() + at, b.inputs.begin() + at + b.seq_len);
  w.push_back(b.targets[static_cast<std::size_t>(at + b.seq_len - 1)]);
  return w;
}

// Runs `body` and returns the UserError's message it throws (failing when it throws none).
template <class F>
std::string user_error(F&& body) {
  try {
    body();
  } catch (const UserError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a UserError, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected a UserError, nothing was thrown";
  return "";
}

}  // namespace loom::test
