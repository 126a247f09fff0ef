// The safetensors reader and writer (format: sdk/include/loom/safetensors.hpp).
#include "loom/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "loom/autograd.hpp"
#include "loom/error.hpp"

namespace fs = std::filesystem;

namespace loom::safetensors {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; so is every host loom targets");

namespace {

// The specification's limit, which also keeps a corrupt length from allocating gigabytes.
constexpr std::uint64_t max_header_bytes = 100ull << 20;

std::string quoted(const fs::path& p) {
  return "'" + p.string() + "'";
}

[[noreturn]] void fail(const fs::path& path, const std::string& message) {
  throw UserError("safetensors file " + quoted(path) + ": " + message);
}

[[noreturn]] void fail_tensor(const fs::path& path, const std::string& name, const std::string& message) {
  throw UserError("safetensors file " + quoted(path) + ", tensor '" + name + "': " + message);
}

std::string errno_text() {
  return std::strerror(errno);
}

bool parse_dtype(const std::string& code, DType* out) {
  if (code == "F32")
    *out = DType::f32;
  else if (code == "BF16")
    *out = DType::bf16;
  else if (code == "I32")
    *out = DType::i32;
  else
    return false;
  return true;
}

// Codes other writers use that loom does not read, so the message can say "unsupported" rather
// than "unknown".
bool known_unsupported_dtype(const std::string& code) {
  static const std::set<std::string> codes = {"BOOL", "U8",  "I8",  "I16",     "U16",     "F16",    "U32",
                                              "I64",  "U64", "F64", "F8_E4M3", "F8_E5M2", "F8_E8M0"};
  return codes.count(code) > 0;
}

std::uint64_t as_offset(const nlohmann::json& j, const fs::path& path, const std::string& name, const char* what) {
  if (!j.is_number_unsigned() && !(j.is_number_integer() && j.get<std::int64_t>() >= 0))
    fail_tensor(path, name, std::string(what) + " must be a non-negative integer, not " + j.dump());
  return j.get<std::uint64_t>();
}

void read_fully(int fd, void* buffer, std::size_t n, std::uint64_t offset, const fs::path& path) {
  auto* p = static_cast<char*>(buffer);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      fail(path, "cannot read: " + errno_text());
    }
    if (got == 0) fail(path, "is truncated");
    p += got;
    n -= static_cast<std::size_t>(got);
    offset += static_cast<std::uint64_t>(got);
  }
}

void write_fully(int fd, const void* buffer, std::size_t n, const fs::path& path) {
  const auto* p = static_cast<const char*>(buffer);
  while (n > 0) {
    const ssize_t put = ::write(fd, p, n);
    if (put < 0) {
      if (errno == EINTR) continue;
      throw UserError("cannot write " + quoted(path) + ": " + errno_text());
    }
    p += put;
    n -= static_cast<std::size_t>(put);
  }
}

// Widens bf16 to f32 (exact) or copies same-dtype bytes into a contiguous destination.
void convert_into(const std::byte* src, DType src_dtype, const Tensor& dst, std::size_t count) {
  if (src_dtype == dst.dtype()) {
    std::memcpy(dst.raw_data(), src, count * dtype_size(src_dtype));
    return;
  }
  // The only conversion read_into admits: BF16 data into an f32 tensor.
  float* out = dst.data<float>();
  for (std::size_t i = 0; i < count; ++i) {
    bfloat16 v;
    std::memcpy(&v.bits, src + 2 * i, 2);
    out[i] = to_float(v);
  }
}

}  // namespace

std::string_view dtype_code(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::i32:
      return "I32";
  }
  return "?";
}

// ---- Reader ----

struct Reader::Mapping {
  const std::byte* base = nullptr;
  std::size_t bytes = 0;
  std::uint64_t data_start = 0;  // 8 + header length
  ~Mapping() {
    if (base) ::munmap(const_cast<std::byte*>(base), bytes);
  }
};

Reader::~Reader() = default;
Reader::Reader(Reader&&) noexcept = default;
Reader& Reader::operator=(Reader&&) noexcept = default;

Reader::Reader(const fs::path& path) : path_(path), mapping_(std::make_unique<Mapping>()) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open: " + errno_text());
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(path, "cannot stat: " + errno_text());
  if (!S_ISREG(st.st_mode)) fail(path, "is not a regular file");
  const auto file_bytes = static_cast<std::uint64_t>(st.st_size);
  if (file_bytes < 8)
    fail(path, "is truncated: " + std::to_string(file_bytes) +
                   " bytes, fewer than the 8 of the header length that starts every safetensors file");

  std::uint64_t header_bytes = 0;
  read_fully(fd, &header_bytes, 8, 0, path);
  if (header_bytes > max_header_bytes)
    fail(path, "header length " + std::to_string(header_bytes) + " exceeds the format's limit of 100 MiB (" +
                   "not a safetensors file, or a corrupt one)");
  if (header_bytes > file_bytes - 8)
    fail(path, "is truncated: the header alone needs " + std::to_string(header_bytes) + " bytes but only " +
                   std::to_string(file_bytes - 8) + " follow the length");
  std::string header(header_bytes, '\0');
  read_fully(fd, header.data(), header.size(), 8, path);

  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(header);
  } catch (const nlohmann::json::parse_error& e) {
    fail(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!doc.is_object()) fail(path, "header must be a JSON object, not " + std::string(doc.type_name()));

  const std::uint64_t data_bytes = file_bytes - 8 - header_bytes;
  for (const auto& [name, entry] : doc.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(path, "__metadata__ must be an object of strings");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) fail(path, "__metadata__['" + key + "'] must be a string, not " + value.dump());
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    if (name.empty()) fail(path, "a tensor has an empty name");
    if (!entry.is_object()) fail_tensor(path, name, "entry must be an object, not " + entry.dump());
    for (const auto& [key, value] : entry.items()) {
      (void)value;
      if (key != "dtype" && key != "shape" && key != "data_offsets")
        fail_tensor(path, name, "unknown field '" + key + "' (expected dtype, shape and data_offsets)");
    }
    if (!entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
      fail_tensor(path, name, "entry needs dtype, shape and data_offsets");
    TensorInfo info;
    info.name = name;
    const auto& dtype = entry["dtype"];
    if (!dtype.is_string()) fail_tensor(path, name, "dtype must be a string, not " + dtype.dump());
    const auto code = dtype.get<std::string>();
    if (!parse_dtype(code, &info.dtype))
      fail_tensor(
          path, name,
          (known_unsupported_dtype(code) ? "dtype " + code + " is not supported" : "unknown dtype '" + code + "'") +
              " (loom reads F32, BF16 and I32)");
    const auto& shape = entry["shape"];
    if (!shape.is_array()) fail_tensor(path, name, "shape must be a list of integers, not " + shape.dump());
    if (shape.size() > static_cast<std::size_t>(max_rank))
      fail_tensor(path, name,
                  "rank " + std::to_string(shape.size()) + " exceeds loom's maximum of " + std::to_string(max_rank));
    std::vector<std::int64_t> dims;
    // Element count with overflow checked: a forged shape must not wrap around to a small size.
    std::uint64_t numel = 1;
    bool overflow = false;
    for (const auto& d : shape) {
      const std::uint64_t extent = as_offset(d, path, name, "every extent of shape");
      if (extent > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) overflow = true;
      dims.push_back(static_cast<std::int64_t>(extent));
      if (extent != 0 && numel > std::numeric_limits<std::uint64_t>::max() / extent) overflow = true;
      numel *= extent;
    }
    info.shape = Shape(std::span<const std::int64_t>(dims));
    const auto& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2)
      fail_tensor(path, name, "data_offsets must be [begin, end], not " + offsets.dump());
    info.begin = as_offset(offsets[0], path, name, "data_offsets[0]");
    info.end = as_offset(offsets[1], path, name, "data_offsets[1]");
    if (info.begin > info.end)
      fail_tensor(path, name,
                  "data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) + "] run backwards");
    if (info.end > data_bytes)
      fail_tensor(path, name,
                  "data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) +
                      "] run past the end of the data (" + std::to_string(data_bytes) +
                      " bytes): the file is truncated or the offsets are wrong");
    const std::uint64_t expected = numel * dtype_size(info.dtype);
    if (overflow || numel > std::numeric_limits<std::uint64_t>::max() / dtype_size(info.dtype) ||
        info.end - info.begin != expected)
      fail_tensor(path, name,
                  "holds " + std::to_string(info.end - info.begin) + " bytes but dtype " + code + " and shape " +
                      info.shape.str() + " need " +
                      (overflow ? std::string("more than 2^64") : std::to_string(expected)));
    tensors_.push_back(std::move(info));
  }

  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // The data section must be covered exactly: no tensor overlaps another, no byte is left over.
  std::uint64_t covered = 0;
  const TensorInfo* previous = nullptr;
  for (const auto& t : tensors_) {
    if (t.begin < covered)
      fail(path, "tensors '" + previous->name + "' and '" + t.name + "' overlap (bytes [" + std::to_string(t.begin) +
                     ", " + std::to_string(covered) + ") of the data belong to both)");
    if (t.begin > covered)
      fail(path, "bytes [" + std::to_string(covered) + ", " + std::to_string(t.begin) +
                     ") of the data belong to no tensor (the format allows no gaps)");
    covered = t.end;
    if (t.end > t.begin || !previous) previous = &t;
  }
  if (covered != data_bytes)
    fail(path, "the last " + std::to_string(data_bytes - covered) +
                   " bytes of the file belong to no tensor (the format allows no trailing data)");
  for (std::size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);

  void* base = ::mmap(nullptr, static_cast<std::size_t>(file_bytes), PROT_READ, MAP_PRIVATE, fd, 0);
  if (base == MAP_FAILED) fail(path, "cannot map into memory: " + errno_text());
  mapping_->base = static_cast<const std::byte*>(base);
  mapping_->bytes = static_cast<std::size_t>(file_bytes);
  mapping_->data_start = 8 + header_bytes;
}

bool Reader::contains(const std::string& name) const {
  return index_.count(name) > 0;
}

const TensorInfo& Reader::info(const std::string& name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) {
    std::vector<std::string> names;
    for (const auto& t : tensors_) names.push_back(t.name);
    const std::string guess = closest_match(name, names);
    fail_tensor(path_, name, "no such tensor in the file" + (guess.empty() ? "" : "; did you mean '" + guess + "'?"));
  }
  return tensors_[it->second];
}

Tensor Reader::read(const std::string& name) const {
  const TensorInfo& t = info(name);
  Tensor out = Tensor::empty(t.shape, t.dtype);
  if (t.end > t.begin) std::memcpy(out.raw_data(), mapping_->base + mapping_->data_start + t.begin, t.end - t.begin);
  return out;
}

void Reader::read_into(const std::string& name, const Tensor& destination) const {
  const TensorInfo& t = info(name);
  if (!destination.defined()) throw InternalError("safetensors::Reader::read_into: undefined destination");
  if (!(destination.shape() == t.shape))
    fail_tensor(path_, name, "has shape " + t.shape.str() + " but " + destination.shape().str() + " is expected");
  const bool convertible =
      t.dtype == destination.dtype() || (t.dtype == DType::bf16 && destination.dtype() == DType::f32);
  if (!convertible)
    fail_tensor(path_, name,
                "has dtype " + std::string(dtype_code(t.dtype)) + " but " +
                    std::string(dtype_code(destination.dtype())) + " is expected");
  const std::byte* src = mapping_->base + mapping_->data_start + t.begin;
  const auto count = static_cast<std::size_t>(t.shape.numel());
  if (destination.is_contiguous()) {
    convert_into(src, t.dtype, destination, count);
  } else {
    Tensor staging = Tensor::empty(t.shape, destination.dtype());
    convert_into(src, t.dtype, staging, count);
    destination.copy_from(staging);
  }
}

// ---- Writer ----

void save(const fs::path& path, std::span<const std::pair<std::string, Tensor>> tensors,
          const std::map<std::string, std::string>& metadata) {
  std::set<std::string> seen;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty() || name == "__metadata__")
      throw InternalError("safetensors::save: invalid tensor name '" + name + "'");
    if (!seen.insert(name).second) throw InternalError("safetensors::save: tensor name '" + name + "' given twice");
    if (!tensor.defined()) throw InternalError("safetensors::save: tensor '" + name + "' is undefined");
  }
  // Wider elements first keeps every tensor aligned to its element size.
  std::vector<const std::pair<std::string, Tensor>*> order;
  for (const auto& t : tensors) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return dtype_size(a->second.dtype()) > dtype_size(b->second.dtype());
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::uint64_t offset = 0;
  for (const auto* t : order) {
    const Tensor& tensor = t->second;
    const std::uint64_t bytes = static_cast<std::uint64_t>(tensor.numel()) * dtype_size(tensor.dtype());
    header[t->first] = {{"dtype", dtype_code(tensor.dtype())},
                        {"shape", std::vector<std::int64_t>(tensor.shape().begin(), tensor.shape().end())},
                        {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::uint64_t header_bytes = text.size();

  // A unique temporary name in the target's directory, so the rename is atomic.
  static std::atomic<std::uint64_t> counter{0};
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  const fs::path temp = dir / ("." + path.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                               std::to_string(counter.fetch_add(1)));
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw UserError("cannot create " + quoted(temp) + " to write " + quoted(path) + ": " + errno_text());
  try {
    write_fully(fd, &header_bytes, 8, path);
    write_fully(fd, text.data(), text.size(), path);
    for (const auto* t : order) {
      const Tensor& tensor = t->second;
      if (tensor.numel() == 0) continue;
      const Tensor contiguous = tensor.is_contiguous() ? tensor : tensor.clone();
      write_fully(fd, contiguous.raw_data(), static_cast<std::size_t>(contiguous.numel()) * dtype_size(tensor.dtype()),
                  path);
    }
    if (::fsync(fd) != 0) throw UserError("cannot flush " + quoted(path) + " to disk: " + errno_text());
    if (::close(fd) != 0) throw UserError("cannot write " + quoted(path) + ": " + errno_text());
  } catch (...) {
    ::close(fd);
    ::unlink(temp.c_str());
    throw;
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string reason = errno_text();
    ::unlink(temp.c_str());
    throw UserError("cannot move " + quoted(temp) + " to " + quoted(path) + ": " + reason);
  }
}

void save_parameters(const fs::path& path, std::span<const ModelParameter> parameters,
                     const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  tensors.reserve(parameters.size());
  for (const auto& p : parameters) tensors.emplace_back(p.parameter->name(), p.parameter->data());
  save(path, tensors, metadata);
}

std::map<std::string, std::string> load_parameters(const fs::path& path, std::span<const ModelParameter> parameters) {
  const Reader reader(path);
  std::set<std::string> wanted;
  std::vector<std::string> missing, mismatched;
  for (const auto& p : parameters) {
    const std::string& name = p.parameter->name();
    if (!wanted.insert(name).second) throw InternalError("load_parameters: parameter name '" + name + "' repeats");
    if (!reader.contains(name)) {
      missing.push_back(name);
      continue;
    }
    const TensorInfo& t = reader.info(name);
    if (!(t.shape == p.parameter->shape()) || (t.dtype != DType::f32 && t.dtype != DType::bf16))
      mismatched.push_back(name + " (file: " + std::string(dtype_code(t.dtype)) + " " + t.shape.str() +
                           ", model: F32 " + p.parameter->shape().str() + ")");
  }
  std::vector<std::string> extra;
  for (const auto& t : reader.tensors())
    if (!wanted.count(t.name)) extra.push_back(t.name);
  if (!missing.empty() || !extra.empty() || !mismatched.empty()) {
    auto list = [](const std::vector<std::string>& names) {
      std::string out;
      const std::size_t shown = std::min<std::size_t>(names.size(), 8);
      for (std::size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + names[i];
      if (names.size() > shown) out += " and " + std::to_string(names.size() - shown) + " more";
      return out;
    };
    std::string message = "safetensors file " + quoted(path) + " does not match the model's parameters:";
    if (!missing.empty()) message += "\n  missing from the file: " + list(missing);
    if (!extra.empty()) message += "\n  in the file but not in the model: " + list(extra);
    if (!mismatched.empty()) message += "\n  with another shape or dtype: " + list(mismatched);
    throw UserError(message);
  }
  for (const auto& p : parameters) reader.read_into(p.parameter->name(), p.parameter->data());
  return reader.metadata();
}

}  // namespace loom::safetensors
