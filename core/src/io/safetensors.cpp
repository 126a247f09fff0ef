// The safetensors reader and writer (format: sdk/include/loom/safetensors.hpp).
#include "loom/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "io/mapped_file.hpp"
#include "loom/autograd.hpp"
#include "loom/error.hpp"

namespace fs = std::filesystem;

namespace loom::safetensors {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; so is every host loom targets");

namespace {

using io::errno_text;

// The specification's limit, which also keeps a corrupt length from allocating gigabytes.
constexpr std::uint64_t max_header_bytes = 100ull << 20;

std::string quoted(const fs::path& p) {
  std::string out = "'";
  out += p.string();
  out += "'";
  return out;
}

std::string describe_file(const fs::path& path) {
  return "safetensors file " + quoted(path);
}

[[noreturn]] void fail(const fs::path& path, const std::string& message) {
  throw UserError(describe_file(path) + ": " + message);
}

[[noreturn]] void fail_tensor(const fs::path& path, const std::string& name, const std::string& message) {
  throw UserError(describe_file(path) + ", tensor '" + name + "': " + message);
}

// The element types loom reads: a file's code, its element size and the dtype loom holds it in.
// F16 has no loom dtype: it is widened to f32 (exactly: every binary16 value is a binary32 one).
struct StoredType {
  const char* code;
  std::size_t bytes;
  DType dtype;
};
constexpr StoredType stored_types[] = {
    {"F32", 4, DType::f32}, {"BF16", 2, DType::bf16}, {"F16", 2, DType::f32}, {"I32", 4, DType::i32}};

const StoredType* find_stored_type(const std::string& code) {
  for (const auto& t : stored_types)
    if (code == t.code) return &t;
  return nullptr;
}

// Codes other writers use that loom does not read, so the message can say "unsupported" rather
// than "unknown".
bool known_unsupported_dtype(const std::string& code) {
  static const std::set<std::string> codes = {"BOOL", "U8",  "I8",  "I16",     "U16",     "U32",
                                              "I64",  "U64", "F64", "F8_E4M3", "F8_E5M2", "F8_E8M0"};
  return codes.count(code) > 0;
}

// IEEE binary16 to binary32, exactly: subnormals become normal floats, infinities stay infinite
// and NaNs keep their sign and payload (shifted into the wider mantissa).
float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  std::uint32_t bits = 0;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  } else if (mantissa != 0) {
    // Subnormal: mantissa * 2^-24. Normalise: shift the leading 1 into the implicit bit.
    int shift = 0;
    std::uint32_t m = mantissa;
    while (!(m & 0x400u)) {
      m <<= 1;
      ++shift;
    }
    bits = sign | (static_cast<std::uint32_t>(127 - 15 + 1 - shift) << 23) | ((m & 0x3ffu) << 13);
  } else {
    bits = sign;
  }
  return std::bit_cast<float>(bits);
}

std::uint64_t as_offset(const nlohmann::json& j, const fs::path& path, const std::string& name, const char* what) {
  if (!j.is_number_unsigned() && !(j.is_number_integer() && j.get<std::int64_t>() >= 0))
    fail_tensor(path, name, std::string(what) + " must be a non-negative integer, not " + j.dump());
  return j.get<std::uint64_t>();
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

// Copies `count` stored elements into the contiguous `dst`: same-dtype bytes as they are, BF16
// and F16 data widened into an f32 tensor.
void convert_into(const std::byte* src, const std::string& stored, const Tensor& dst, std::size_t count) {
  const StoredType& type = *find_stored_type(stored);
  if (type.dtype == dst.dtype() && type.bytes == dtype_size(dst.dtype())) {
    std::memcpy(dst.raw_data(), src, count * type.bytes);
    return;
  }
  float* out = dst.data<float>();
  for (std::size_t i = 0; i < count; ++i) {
    std::uint16_t bits;
    std::memcpy(&bits, src + 2 * i, 2);
    out[i] = stored == "F16" ? f16_to_f32(bits) : to_float(bfloat16{bits});
  }
}

// The header's JSON: the length prefix checked against the file, then parsed.
nlohmann::json parse_header(const fs::path& path, std::span<const std::byte> file) {
  if (file.size() < 8)
    fail(path, "is truncated: " + std::to_string(file.size()) +
                   " bytes, fewer than the 8 of the header length that starts every safetensors file");
  std::uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, file.data(), 8);
  if (header_bytes > max_header_bytes)
    fail(path, "header length " + std::to_string(header_bytes) + " exceeds the format's limit of 100 MiB (" +
                   "not a safetensors file, or a corrupt one)");
  if (header_bytes > file.size() - 8)
    fail(path, "is truncated: the header alone needs " + std::to_string(header_bytes) + " bytes but only " +
                   std::to_string(file.size() - 8) + " follow the length");
  nlohmann::json doc;
  const auto* text = reinterpret_cast<const char*>(file.data() + 8);
  try {
    doc = nlohmann::json::parse(text, text + header_bytes);
  } catch (const nlohmann::json::parse_error& e) {
    fail(path, "header is not valid JSON: " +
                   json_parse_error(e.what(), e.byte, std::string_view(text, static_cast<std::size_t>(header_bytes))));
  }
  if (!doc.is_object()) fail(path, "header must be a JSON object, not " + std::string(doc.type_name()));
  return doc;
}

std::map<std::string, std::string> parse_metadata(const fs::path& path, const nlohmann::json& entry) {
  if (!entry.is_object()) fail(path, "__metadata__ must be an object of strings");
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : entry.items()) {
    if (!value.is_string()) fail(path, "__metadata__['" + key + "'] must be a string, not " + value.dump());
    out[key] = value.get<std::string>();
  }
  return out;
}

// One tensor's header entry, checked against itself and the size of the data section.
TensorInfo parse_tensor_entry(const fs::path& path, const std::string& name, const nlohmann::json& entry,
                              std::uint64_t data_bytes) {
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
  const StoredType* type = find_stored_type(code);
  if (!type)
    fail_tensor(
        path, name,
        (known_unsupported_dtype(code) ? "dtype " + code + " is not supported" : "unknown dtype '" + code + "'") +
            " (loom reads F32, BF16, F16 and I32)");
  info.dtype = type->dtype;
  info.stored_dtype = type->code;

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
  const std::string range = "data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) + "]";
  if (info.begin > info.end) fail_tensor(path, name, range + " run backwards");
  if (info.end > data_bytes)
    fail_tensor(path, name,
                range + " run past the end of the data (" + std::to_string(data_bytes) +
                    " bytes): the file is truncated or the offsets are wrong");
  const std::uint64_t expected = numel * type->bytes;
  if (overflow || numel > std::numeric_limits<std::uint64_t>::max() / type->bytes || info.end - info.begin != expected)
    fail_tensor(path, name,
                "holds " + std::to_string(info.end - info.begin) + " bytes but dtype " + code + " and shape " +
                    info.shape.str() + " need " +
                    (overflow ? std::string("more than 2^64") : std::to_string(expected)));
  return info;
}

// The data section must be covered exactly: no tensor overlaps another, no byte is left over.
// `tensors` is sorted by offsets.
void check_coverage(const fs::path& path, const std::vector<TensorInfo>& tensors, std::uint64_t data_bytes) {
  std::uint64_t covered = 0;
  const TensorInfo* previous = nullptr;
  for (const auto& t : tensors) {
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
  io::MappedFile file;
  std::uint64_t data_start = 0;  // 8 + header length
  const std::byte* data(const TensorInfo& t) const { return file.data() + data_start + t.begin; }
};

Reader::~Reader() = default;
Reader::Reader(Reader&&) noexcept = default;
Reader& Reader::operator=(Reader&&) noexcept = default;

Reader::Reader(const fs::path& path) : path_(path), mapping_(std::make_unique<Mapping>()) {
  mapping_->file = io::MappedFile::open(path, describe_file(path));
  const std::span<const std::byte> file = mapping_->file.bytes();
  const nlohmann::json doc = parse_header(path, file);
  std::uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, file.data(), 8);
  mapping_->data_start = 8 + header_bytes;

  const std::uint64_t data_bytes = file.size() - mapping_->data_start;
  for (const auto& [name, entry] : doc.items()) {
    if (name == "__metadata__")
      metadata_ = parse_metadata(path, entry);
    else
      tensors_.push_back(parse_tensor_entry(path, name, entry, data_bytes));
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  check_coverage(path, tensors_, data_bytes);
  for (std::size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
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
  if (t.end > t.begin) convert_into(mapping_->data(t), t.stored_dtype, out, static_cast<std::size_t>(t.shape.numel()));
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
    fail_tensor(
        path_, name,
        "has dtype " + t.stored_dtype + " but " + std::string(dtype_code(destination.dtype())) + " is expected");
  const std::byte* src = mapping_->data(t);
  const auto count = static_cast<std::size_t>(t.shape.numel());
  if (destination.is_contiguous() && destination.is_host_visible()) {
    convert_into(src, t.stored_dtype, destination, count);
  } else {  // strided, or in a device's memory: through host memory, one explicit copy
    Tensor staging = Tensor::empty(t.shape, destination.dtype());
    convert_into(src, t.stored_dtype, staging, count);
    destination.copy_from(staging);
  }
}

Tensor Reader::read_elements(const std::string& name, std::int64_t begin, std::int64_t end) const {
  const TensorInfo& t = info(name);
  Tensor out = Tensor::empty(Shape{std::max<std::int64_t>(0, end - begin)}, t.dtype);
  read_elements_into(name, begin, end, out);
  return out;
}

void Reader::read_elements_into(const std::string& name, std::int64_t begin, std::int64_t end,
                                const Tensor& destination) const {
  const TensorInfo& t = info(name);
  if (begin < 0 || end < begin || end > t.shape.numel())
    fail_tensor(path_, name,
                "has " + std::to_string(t.shape.numel()) + " elements; elements [" + std::to_string(begin) + ", " +
                    std::to_string(end) + ") are not among them");
  if (!destination.defined() || destination.numel() != end - begin || !destination.is_contiguous() ||
      !destination.is_host_visible())
    throw InternalError("safetensors::Reader::read_elements_into: the destination is not a contiguous host tensor of " +
                        std::to_string(end - begin) + " elements");
  const bool convertible =
      t.dtype == destination.dtype() || (t.dtype == DType::bf16 && destination.dtype() == DType::f32);
  if (!convertible)
    fail_tensor(
        path_, name,
        "has dtype " + t.stored_dtype + " but " + std::string(dtype_code(destination.dtype())) + " is expected");
  const std::size_t element = find_stored_type(t.stored_dtype)->bytes;
  if (end > begin)
    convert_into(mapping_->data(t) + static_cast<std::size_t>(begin) * element, t.stored_dtype, destination,
                 static_cast<std::size_t>(end - begin));
}

void Reader::release(const std::string& name) const {
  const TensorInfo& t = info(name);
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(mapping_->data(t));
  const std::uintptr_t first = (begin + page - 1) / page * page;
  const std::uintptr_t last = (begin + (t.end - t.begin)) / page * page;
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
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
  // Hugging Face's from_pretrained refuses a file whose metadata names no framework; loom's
  // tensors are PyTorch's layout, so "pt" (unless the caller says otherwise).
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  meta["format"] = "pt";
  for (const auto& [k, v] : metadata) meta[k] = v;
  header["__metadata__"] = std::move(meta);
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
      // A device tensor (the final weights of a run on a device backend) through one explicit,
      // counted copy to the host; a strided host tensor through a contiguous copy.
      const Tensor contiguous = !tensor.is_host_visible() ? tensor.to(Device::host())
                                : tensor.is_contiguous()  ? tensor
                                                          : tensor.clone();
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
      mismatched.push_back(name + " (file: " + t.stored_dtype + " " + t.shape.str() + ", model: F32 " +
                           p.parameter->shape().str() + ")");
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
