#include "checkpoint/sharded_checkpoint.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/manifest.hpp"
#include "loom/error.hpp"

namespace fs = std::filesystem;

namespace loom::checkpoint {

namespace {

constexpr const char* kEntries = "loom.entries";

std::string range_text(std::int64_t begin, std::int64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

// The number of ranks whose files of `group` are in `dir` (0: none), from the first one found.
int rank_files_in(const fs::path& dir, std::string_view group) {
  std::error_code ec;
  const std::string prefix = std::string(group) + ".rank-";
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const auto of = name.find("-of-");
    if (of == std::string::npos) continue;
    try {
      const int shards = std::stoi(name.substr(of + 4));
      if (shards > 0) return shards;
    } catch (const std::exception&) {
    }
  }
  return 0;
}

}  // namespace

Entry::Entry(std::string name_, Tensor data_) : name(std::move(name_)), data(std::move(data_)) {
  global_shape = data.shape();
}

Entry::Entry(std::string name_, Tensor data_, Shape global_shape_, std::int64_t begin_, std::int64_t end_)
    : name(std::move(name_)),
      data(std::move(data_)),
      global_shape(std::move(global_shape_)),
      begin(begin_),
      end(end_) {}

void save_rank_file(const fs::path& path, std::span<const Entry> entries, std::map<std::string, std::string> metadata) {
  nlohmann::ordered_json index = nlohmann::ordered_json::object();
  std::vector<std::pair<std::string, Tensor>> tensors;
  tensors.reserve(entries.size());
  for (const Entry& e : entries) {
    const std::int64_t numel = e.global_shape.numel(), stop = e.stop();
    if (e.begin < 0 || stop < e.begin || stop > numel || e.data.numel() != stop - e.begin)
      throw InternalError("checkpoint entry '" + e.name + "': elements " + range_text(e.begin, stop) + " of " +
                          e.global_shape.str() + " with " + std::to_string(e.data.numel()) + " values");
    index[e.name] = {{"shape", std::vector<std::int64_t>(e.global_shape.begin(), e.global_shape.end())},
                     {"begin", e.begin},
                     {"end", stop}};
    // A slice is stored flat; a whole entry in its shape (the file then reads as any other).
    tensors.emplace_back(e.name, e.whole() ? e.data.view(e.global_shape) : e.data.view(Shape{stop - e.begin}));
  }
  metadata[kEntries] = index.dump();
  safetensors::save(path, tensors, metadata);
}

bool is_sharded_checkpoint(const fs::path& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && !fs::exists(dir / "model.safetensors", ec) && rank_files_in(dir, "model") > 0;
}

TensorSet::TensorSet(const fs::path& dir, std::string group) : dir_(dir), group_(std::move(group)) {
  std::error_code ec;
  if (fs::exists(dir / (group_ + ".safetensors"), ec)) {
    single_ = dir / (group_ + ".safetensors");
    add_file(single_, false);
    return;
  }
  shards_ = rank_files_in(dir, group_);
  if (shards_ == 0)
    throw UserError("checkpoint '" + dir.string() + "' holds neither " + group_ + ".safetensors nor the rank files " +
                    group_ + ".rank-*-of-*.safetensors of a sharded checkpoint");
  for (int r = 0; r < shards_; ++r) {
    const fs::path file = dir / rank_file_name(group_, r, shards_);
    if (!fs::exists(file, ec))
      throw UserError("checkpoint '" + dir.string() + "' was written by " + std::to_string(shards_) +
                      " ranks, but rank " + std::to_string(r) + "'s file " + file.filename().string() + " is missing");
    add_file(file, true);
  }
}

TensorSet TensorSet::open(const fs::path& file) {
  std::error_code ec;
  const fs::path dir = file.parent_path().empty() ? fs::path(".") : file.parent_path();
  const std::string name = file.filename().string();
  if (!fs::exists(file, ec) && name.size() > 12 && name.ends_with(".safetensors"))
    return TensorSet(dir, name.substr(0, name.size() - 12));
  TensorSet set;
  set.dir_ = dir;
  set.single_ = file;
  set.add_file(file, false);
  return set;
}

void TensorSet::add_file(const fs::path& path, bool rank_file) {
  readers_.emplace_back(path);
  const safetensors::Reader& reader = readers_.back();
  const std::size_t at = readers_.size() - 1;
  nlohmann::json index = nlohmann::json::object();
  if (rank_file) {
    const auto it = reader.metadata().find(kEntries);
    if (it == reader.metadata().end() || (index = nlohmann::json::parse(it->second, nullptr, false)).is_discarded() ||
        !index.is_object())
      throw UserError("'" + path.string() + "' is not a rank file of a loom checkpoint: its metadata has no \"" +
                      kEntries + "\" object");
  }
  for (const auto& t : reader.tensors()) {
    Info info{t.name, t.shape, t.dtype};
    std::int64_t begin = 0, end = t.shape.numel();
    if (rank_file) {
      const auto e = index.find(t.name);
      if (e == index.end() || !e->is_object() || !e->contains("shape") || !(*e)["shape"].is_array() ||
          !e->contains("begin") || !e->contains("end"))
        throw UserError("'" + path.string() + "': tensor '" + t.name + "' has no shape and range in its \"" + kEntries +
                        "\" metadata");
      info.shape = Shape((*e)["shape"].get<std::vector<std::int64_t>>());
      begin = (*e)["begin"].get<std::int64_t>();
      end = (*e)["end"].get<std::int64_t>();
      if (begin < 0 || end < begin || end > info.shape.numel() || end - begin != t.shape.numel())
        throw UserError("'" + path.string() + "': tensor '" + t.name + "' holds " + std::to_string(t.shape.numel()) +
                        " values for elements " + range_text(begin, end) + " of " + info.shape.str());
    }
    const auto known = index_.find(t.name);
    if (known == index_.end()) {
      index_.emplace(t.name, entries_.size());
      entries_.push_back(info);
    } else if (!(entries_[known->second].shape == info.shape)) {
      throw UserError("checkpoint '" + dir_.string() + "': the rank files disagree on the shape of '" + t.name + "' (" +
                      entries_[known->second].shape.str() + " and " + info.shape.str() + " in " +
                      path.filename().string() + ")");
    }
    if (end > begin) pieces_[t.name].push_back({at, begin, end});
  }
  // Sorted by name, and every entry's pieces by their first element.
  std::sort(entries_.begin(), entries_.end(), [](const Info& a, const Info& b) { return a.name < b.name; });
  for (std::size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].name] = i;
  for (auto& [name, pieces] : pieces_)
    std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
}

std::string TensorSet::describe() const {
  if (shards_ == 0) return "'" + single_.string() + "'";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%05d", shards_);
  return "checkpoint '" + dir_.string() + "' (" + group_ + ".rank-*-of-" + buf + ".safetensors)";
}

const std::map<std::string, std::string>& TensorSet::metadata() const {
  return readers_.front().metadata();
}

const TensorSet::Info& TensorSet::info(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) throw UserError(describe() + " has no tensor '" + name + "'");
  return entries_[it->second];
}

void TensorSet::walk(const std::string& name, std::int64_t begin, std::int64_t end,
                     const std::function<void(const Piece&, std::int64_t, std::int64_t)>& copy) const {
  const Info& entry = info(name);
  const std::int64_t numel = entry.shape.numel();
  if (begin < 0 || end < begin || end > numel)
    throw UserError(describe() + ": '" + name + "' (" + entry.shape.str() + ") has " + std::to_string(numel) +
                    " elements; elements " + range_text(begin, end) + " are not among them");
  static const std::vector<Piece> none;
  const auto found = pieces_.find(name);
  const std::vector<Piece>& pieces = found == pieces_.end() ? none : found->second;
  std::int64_t cursor = begin;
  for (const Piece& p : pieces) {
    if (cursor >= end) break;
    if (p.end <= cursor) continue;
    if (p.begin > cursor) break;  // a gap before this piece
    const std::int64_t stop = std::min(end, p.end);
    copy(p, cursor, stop);
    cursor = stop;
  }
  if (cursor < end) {
    std::int64_t gap_end = end;
    for (const Piece& p : pieces)
      if (p.begin > cursor) {
        gap_end = std::min(gap_end, p.begin);
        break;
      }
    throw UserError(describe() + " does not hold elements " + range_text(cursor, gap_end) + " of '" + name + "' (" +
                    entry.shape.str() + ", " + std::to_string(numel) + " elements; asked for " +
                    range_text(begin, end) + "): no rank's file covers them (was a rank's part lost?)");
  }
}

void TensorSet::check_covered(const std::string& name, std::int64_t begin, std::int64_t end) const {
  walk(name, begin, end, [](const Piece&, std::int64_t, std::int64_t) {});
}

void TensorSet::read_range_into(const std::string& name, std::int64_t begin, std::int64_t end,
                                const Tensor& destination) const {
  if (destination.numel() != end - begin)
    throw InternalError("checkpoint reader: elements [" + std::to_string(begin) + ", " + std::to_string(end) +
                        ") of '" + name + "' into a tensor of " + std::to_string(destination.numel()));
  // Straight into the destination when it is contiguous host memory; else through a copy.
  const bool direct = destination.is_contiguous() && destination.is_host_visible();
  const Tensor flat =
      direct ? destination.view(Shape{end - begin}) : Tensor::empty(Shape{end - begin}, info(name).dtype);
  check_covered(name, begin, end);  // before anything is written
  walk(name, begin, end, [&](const Piece& p, std::int64_t first, std::int64_t last) {
    readers_[p.reader].read_elements_into(name, first - p.begin, last - p.begin,
                                          flat.slice(0, first - begin, last - begin));
  });
  if (!direct) destination.copy_from(flat.view(destination.shape()));
}

Tensor TensorSet::read_range(const std::string& name, std::int64_t begin, std::int64_t end) const {
  Tensor out = Tensor::empty(Shape{std::max<std::int64_t>(0, end - begin)}, info(name).dtype);
  read_range_into(name, begin, end, out);
  return out;
}

Tensor TensorSet::read(const std::string& name) const {
  const Info& entry = info(name);
  return read_range(name, 0, entry.shape.numel()).view(entry.shape);
}

void TensorSet::read_into(const std::string& name, const Tensor& destination) const {
  if (shards_ == 0) {  // the file's own checks and widening
    readers_.front().read_into(name, destination);
    return;
  }
  const Info& entry = info(name);
  if (!(destination.shape() == entry.shape))
    throw UserError(describe() + ": '" + name + "' has shape " + entry.shape.str() + " but " +
                    destination.shape().str() + " is expected");
  read_range_into(name, 0, entry.shape.numel(), destination);
}

void TensorSet::load_parameters(std::span<const ModelParameter> parameters) const {
  if (shards_ == 0) {
    safetensors::load_parameters(single_, parameters);
    return;
  }
  std::set<std::string> wanted;
  std::vector<std::string> missing, mismatched, extra;
  for (const auto& p : parameters) {
    const std::string& name = p.parameter->name();
    wanted.insert(name);
    if (!contains(name))
      missing.push_back(name);
    else if (!(info(name).shape == p.parameter->shape()) || info(name).dtype != DType::f32)
      mismatched.push_back(name + " (checkpoint: " + info(name).shape.str() + ", model: " + p.parameter->shape().str() +
                           ")");
  }
  for (const auto& e : entries_)
    if (!wanted.contains(e.name)) extra.push_back(e.name);
  if (!missing.empty() || !extra.empty() || !mismatched.empty()) {
    auto list = [](const std::vector<std::string>& names) {
      std::string out;
      const std::size_t shown = std::min<std::size_t>(names.size(), 8);
      for (std::size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + names[i];
      if (names.size() > shown) out += " and " + std::to_string(names.size() - shown) + " more";
      return out;
    };
    std::string message = describe() + " does not match the model's parameters:";
    if (!missing.empty()) message += "\n  missing from the checkpoint: " + list(missing);
    if (!extra.empty()) message += "\n  in the checkpoint but not in the model: " + list(extra);
    if (!mismatched.empty()) message += "\n  with another shape or dtype: " + list(mismatched);
    throw UserError(message);
  }
  // Every parameter's coverage is checked before anything is modified.
  for (const auto& p : parameters) check_covered(p.parameter->name(), 0, p.parameter->shape().numel());
  for (const auto& p : parameters) read_into(p.parameter->name(), p.parameter->data());
}

}  // namespace loom::checkpoint
