// `loom export --format hf`: a model's weights in transformers' layout, sharded as
// save_pretrained shards them, with config.json and the tokenizer's files.
#include <algorithm>
#include <cctype>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <limits>
#include <map>
#include <sstream>

#include "loom/core/json_value.hpp"
#include "loom/error.hpp"
#include "loom/hf_interop.hpp"
#include "loom/run/hf_interop.hpp"
#include "loom/safetensors.hpp"

namespace fs = std::filesystem;

namespace loom {

namespace {

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) throw UserError("cannot write '" + path.string() + "'");
}

// A shard's file name as transformers writes it: model-00001-of-00003.safetensors.
std::string shard_name(std::size_t index, std::size_t count) {
  std::ostringstream os;
  os << "model-" << std::setw(5) << std::setfill('0') << index + 1 << "-of-" << std::setw(5) << std::setfill('0')
     << count << ".safetensors";
  return os.str();
}

// The tensors of `layout`, as views of the parameters. Checks that the plugin's layout covers
// every parameter's rows exactly once: a gap or an overlap is a bug in the plugin.
std::vector<std::pair<std::string, Tensor>> layout_tensors(const HfTensorLayout& layout,
                                                           const std::vector<ModelParameter>& parameters) {
  std::map<std::string, Parameter*> by_name;
  std::map<std::string, std::vector<std::pair<std::int64_t, std::int64_t>>> rows;
  for (const auto& p : parameters) by_name[p.parameter->name()] = p.parameter;
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& t : layout.tensors) {
    const auto it = by_name.find(t.parameter);
    if (it == by_name.end())
      throw InternalError("the model's Hugging Face layout maps '" + t.name + "' to '" + t.parameter +
                          "', which is not one of its parameters");
    const Tensor data = it->second->data();
    if (t.begin < 0 || t.end <= t.begin || t.end > data.size(0))
      throw InternalError("the model's Hugging Face layout maps '" + t.name + "' to rows [" + std::to_string(t.begin) +
                          ", " + std::to_string(t.end) + ") of '" + t.parameter + "' " + data.shape().str());
    rows[t.parameter].emplace_back(t.begin, t.end);
    out.emplace_back(t.name, t.begin == 0 && t.end == data.size(0) ? data : data.slice(0, t.begin, t.end));
  }
  for (const auto& [name, p] : by_name) {
    auto& r = rows[name];
    std::sort(r.begin(), r.end());
    std::int64_t next = 0;
    for (const auto& [begin, end] : r) {
      if (begin != next) break;
      next = end;
    }
    if (next != p->data().size(0))
      throw InternalError("the model's Hugging Face layout does not cover the rows of parameter '" + name +
                          "' exactly once");
  }
  return out;
}

// A float32 tensor (any strides) rounded to bf16, to nearest even (NaN stays NaN).
Tensor to_bf16(const Tensor& t) {
  const Tensor f = t.is_contiguous() && t.is_host_visible() ? t : t.clone().to(Device::host());
  Tensor out = Tensor::empty(t.shape(), DType::bf16);
  const auto* in = static_cast<const std::uint32_t*>(f.raw_data());
  auto* o = static_cast<std::uint16_t*>(out.raw_data());
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const std::uint32_t bits = in[i];
    o[i] = (bits & 0x7fffffffu) > 0x7f800000u
               ? static_cast<std::uint16_t>((bits >> 16) | 0x40u)
               : static_cast<std::uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
  }
  return out;
}

}  // namespace

std::uint64_t parse_byte_size(std::string_view text, std::string_view what) {
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  std::string unit(text.substr(digits));
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  static const std::map<std::string, std::uint64_t> units = {{"", 1ull},
                                                             {"B", 1ull},
                                                             {"KB", 1000ull},
                                                             {"MB", 1000'000ull},
                                                             {"GB", 1000'000'000ull},
                                                             {"TB", 1000'000'000'000ull},
                                                             {"KIB", 1ull << 10},
                                                             {"MIB", 1ull << 20},
                                                             {"GIB", 1ull << 30},
                                                             {"TIB", 1ull << 40}};
  const auto u = units.find(unit);
  // 18 digits always fit in 64 bits; the product must too.
  const std::uint64_t count = digits == 0 || digits > 18 ? 0 : std::stoull(std::string(text.substr(0, digits)));
  if (count == 0 || u == units.end() || count > std::numeric_limits<std::uint64_t>::max() / u->second)
    throw UserError(std::string(what) + ": '" + std::string(text) +
                    "' is not a size; write a positive whole number with an optional unit: B, KB, MB, GB, TB (powers "
                    "of 1000) or KiB, MiB, GiB, TiB (powers of 1024), as in 5GB");
  return count * u->second;
}

HfExportResult export_hf(Model& model, const Tokenizer* tokenizer, const fs::path& out_dir,
                         const HfExportOptions& options) {
  auto* hf = dynamic_cast<HfModel*>(&model);
  if (!hf)
    throw UserError(
        "the model has no Hugging Face mapping (its plugin does not implement loom::HfModel), so it cannot be "
        "exported with --format hf");
  std::error_code ec;
  if (fs::exists(out_dir, ec)) {
    if (!fs::is_directory(out_dir, ec))
      throw UserError("'" + out_dir.string() + "' exists and is not a directory; give a new directory to export into");
    if (!fs::is_empty(out_dir, ec))
      throw UserError("'" + out_dir.string() +
                      "' is not empty; give a new or empty directory (an export never mixes with older files)");
  }
  // Whatever can fail on the model or the tokenizer fails before the first file is written.
  Value config = hf->hf_config();
  // What config.json takes from the base's (HfExportOptions::base_dir).
  nlohmann::ordered_json base = nlohmann::ordered_json::object();
  if (!options.base_dir.empty()) {
    std::ifstream in(options.base_dir / "config.json");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto parsed = nlohmann::ordered_json::parse(text, nullptr, false);
    if (!in || !parsed.is_object())
      throw UserError("cannot read '" + (options.base_dir / "config.json").string() +
                      "' (the config.json of the run's trainer.init_from) as a JSON object");
    for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id", "max_position_embeddings"})
      if (parsed.contains(key) && !parsed[key].is_null()) base[key] = parsed[key];
  }
  const std::vector<std::pair<std::string, Tensor>> tensors = layout_tensors(hf->hf_tensors(), model.parameters());
  HfExportResult result;
  std::vector<HfFile> tokenizer_files;
  if (const auto* hf_tokenizer = dynamic_cast<const HfTokenizer*>(tokenizer))
    tokenizer_files = hf_tokenizer->hf_tokenizer_files(model.max_seq_len());
  else
    result.tokenizer_note = "no tokenizer files: the run's tokenizer has no Hugging Face form";
  fs::create_directories(out_dir, ec);
  if (ec) throw UserError("cannot create '" + out_dir.string() + "': " + ec.message());

  // Shards as save_pretrained cuts them: in order, a new one when the next tensor would overflow.
  std::vector<std::vector<std::size_t>> shards(1);
  std::uint64_t shard_bytes = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto bytes = static_cast<std::uint64_t>(tensors[i].second.numel()) * dtype_size(options.dtype);
    if (!shards.back().empty() && shard_bytes + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(i);
    shard_bytes += bytes;
    result.weight_bytes += bytes;
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  // bf16: each shard's tensors rounded (to nearest even) as it is written, so an export holds one
  // shard in bf16 besides the model.
  // A weight stored in fewer bits (lora.base_dtype) has no float32 value: its rows are dequantized
  // (plus options.add_to_stored) a tensor at a time, as its shard is written.
  std::map<std::string, std::pair<const Parameter*, std::int64_t>> stored_rows;  // name -> parameter, first row
  for (const auto& t : hf->hf_tensors().tensors)
    for (const auto& p : model.parameters())
      if (p.parameter->name() == t.parameter && p.parameter->stored()) stored_rows[t.name] = {p.parameter, t.begin};
  auto in_dtype = [&](std::vector<std::pair<std::string, Tensor>> part) {
    for (auto& [name, t] : part) {
      if (const auto it = stored_rows.find(name); it != stored_rows.end()) {
        const auto [p, first] = it->second;
        const std::int64_t rows = t.size(0), cols = t.size(1);
        Tensor value = Tensor::empty(t.shape(), DType::f32);
        quant::dequantize(*p->stored(), first, rows, 0, cols, value.data<float>(), cols);
        if (options.add_to_stored) options.add_to_stored(*p, first, first + rows, value.data<float>());
        t = value;
      }
      if (options.dtype == DType::bf16) t = to_bf16(t);
    }
    return part;
  };
  if (shards.size() == 1) {
    safetensors::save(out_dir / "model.safetensors", in_dtype(tensors), metadata);
    result.files.push_back("model.safetensors");
  } else {
    nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
    std::map<std::string, std::string> sorted;
    for (std::size_t s = 0; s < shards.size(); ++s) {
      const std::string file = shard_name(s, shards.size());
      std::vector<std::pair<std::string, Tensor>> part;
      for (const std::size_t i : shards[s]) {
        part.push_back(tensors[i]);
        sorted[tensors[i].first] = file;
      }
      safetensors::save(out_dir / file, in_dtype(std::move(part)), metadata);
      result.files.push_back(file);
    }
    for (const auto& [name, file] : sorted) weight_map[name] = file;
    const nlohmann::ordered_json index = {{"metadata", {{"total_size", result.weight_bytes}}},
                                          {"weight_map", weight_map}};
    write_text(out_dir / "model.safetensors.index.json", index.dump(2) + "\n");
    result.files.push_back("model.safetensors.index.json");
  }
  result.tensors = static_cast<std::int64_t>(tensors.size());
  result.shards = static_cast<std::int64_t>(shards.size());

  for (const auto& file : tokenizer_files) {
    write_text(out_dir / file.name, file.content);
    result.files.push_back(file.name);
  }

  // config.json last: a directory with a config.json is a complete export.
  nlohmann::ordered_json json = interop::to_json(config);
  for (const auto& item : base.items()) {
    const std::string& key = item.key();
    const auto& value = item.value();
    if (key == "max_position_embeddings") {
      if (json.contains(key) && json[key].is_number_integer() && value.is_number_integer() &&
          value.get<std::int64_t>() > json[key].get<std::int64_t>())
        json[key] = value;
    } else {
      json[key] = value;
    }
  }
  if (tokenizer && tokenizer->end_of_text()) {
    if (!json.contains("bos_token_id")) json["bos_token_id"] = *tokenizer->end_of_text();
    if (!json.contains("eos_token_id")) json["eos_token_id"] = *tokenizer->end_of_text();
  }
  json["torch_dtype"] = options.dtype == DType::bf16 ? "bfloat16" : "float32";
  write_text(out_dir / "config.json", json.dump(2) + "\n");
  result.files.push_back("config.json");
  return result;
}

}  // namespace loom
