#include "loom/error.hpp"

#include <algorithm>
#include <cctype>

namespace loom {

Error::Error(ErrorKind kind, std::string message) : kind_(kind), message_(std::move(message)) { rebuild(); }

void Error::add_context(std::string context) {
  context_.insert(context_.begin(), std::move(context));
  rebuild();
}

void Error::rebuild() {
  full_.clear();
  for (const auto& c : context_) full_ += c + ": ";
  full_ += message_;
}

namespace {
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t up = row[j];
      const bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) == std::tolower(static_cast<unsigned char>(b[j - 1]));
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (same ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}
}  // namespace

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_distance = static_cast<std::size_t>(-1);
  for (const auto& c : candidates) {
    std::size_t d = edit_distance(word, c);
    // A prefix or containment is a plausible typo too ("lr" for "learning_rate" is not).
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  if (best.empty()) return "";
  // Close enough: at most a third of the longer word, and at least one character in common.
  const std::size_t limit = std::max<std::size_t>(1, std::max(word.size(), best.size()) / 3);
  return best_distance <= limit ? best : "";
}

}  // namespace loom
