// A Hugging Face model directory into a loom model: config.json checked against the model's
// options by its plugin, then every tensor found by the plugin's layout (single or sharded
// safetensors), checked, and only then copied.
#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "loom/allocator.hpp"
#include "loom/core/json_value.hpp"
#include "loom/error.hpp"
#include "loom/execution.hpp"
#include "loom/hf_interop.hpp"
#include "loom/run/hf_interop.hpp"
#include "loom/safetensors.hpp"

namespace fs = std::filesystem;

namespace loom {

namespace {

nlohmann::ordered_json read_json(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("cannot read '" + path.string() + "'");
  std::stringstream text;
  text << in.rdbuf();
  try {
    return nlohmann::ordered_json::parse(text.str());
  } catch (const nlohmann::json::parse_error& e) {
    throw UserError("'" + path.string() + "' is not valid JSON: " + json_parse_error(e.what(), e.byte, text.str()));
  }
}

// The safetensors files of a Hugging Face directory: model.safetensors, or the shards its
// model.safetensors.index.json names.
std::vector<fs::path> weight_files(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir / "model.safetensors", ec)) return {dir / "model.safetensors"};
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (fs::exists(index_path, ec)) {
    const nlohmann::ordered_json index = read_json(index_path);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      throw UserError("'" + index_path.string() + "' has no \"weight_map\" object (tensor name -> shard file)");
    std::vector<fs::path> files;
    std::set<std::string> seen;
    for (const auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string())
        throw UserError("'" + index_path.string() + "': the shard of '" + name + "' is " + file.dump() +
                        ", not a file name");
      const std::string shard = file.get<std::string>();
      if (shard.find('/') != std::string::npos || shard == ".." || !seen.insert(shard).second) continue;
      if (!fs::exists(dir / shard, ec))
        throw UserError("'" + index_path.string() + "' names the shard '" + shard + "', which is not in '" +
                        dir.string() + "'");
      files.push_back(dir / shard);
    }
    return files;
  }
  if (fs::exists(dir / "pytorch_model.bin", ec) || fs::exists(dir / "pytorch_model.bin.index.json", ec))
    throw UserError("'" + dir.string() +
                    "' holds PyTorch pickle weights (pytorch_model.bin) only, and loom reads safetensors; in Python, "
                    "AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(NEW_DIR) writes them");
  throw UserError("'" + dir.string() + "' has a config.json but no model.safetensors or model.safetensors.index.json");
}

// "model.layers.*.self_attn.q_proj.weight": a name with its layer numbers replaced, so a
// message names a tensor of every layer once.
std::string name_pattern(const std::string& name) {
  std::string out;
  std::size_t i = 0;
  while (i < name.size()) {
    const bool at_start = i == 0 || name[i - 1] == '.';
    std::size_t j = i;
    while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
    if (at_start && j > i && (j == name.size() || name[j] == '.')) {
      out += '*';
      i = j;
    } else {
      out += name[i++];
    }
  }
  return out;
}

// "h.*.attn.bias (12 tensors), h.3.mlp.c_fc.weight": names of every layer folded into one.
std::string grouped(const std::vector<std::string>& names) {
  struct Group {
    std::string pattern, first;
    int count;
  };
  std::vector<Group> groups;
  for (const auto& n : names) {
    const std::string p = name_pattern(n);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) { return g.pattern == p; });
    if (it == groups.end())
      groups.push_back({p, n, 1});
    else
      ++it->count;
  }
  std::string out;
  for (const auto& g : groups)
    out +=
        (out.empty() ? "" : ", ") + (g.count == 1 ? g.first : g.pattern + " (" + std::to_string(g.count) + " tensors)");
  return out;
}

bool ends_with_any(const std::string& name, const std::vector<std::string>& suffixes) {
  for (const auto& s : suffixes)
    if (name.ends_with(s)) return true;
  return false;
}

}  // namespace

std::vector<std::int64_t> hf_tensor_bytes(const fs::path& dir) {
  std::vector<std::int64_t> out;
  for (const auto& file : weight_files(dir)) {
    const safetensors::Reader reader(file);
    for (const auto& t : reader.tensors()) out.push_back(static_cast<std::int64_t>(t.end - t.begin));
  }
  return out;
}

bool is_hf_model_dir(const fs::path& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::exists(dir / "config.json", ec);
}

std::vector<std::string> import_hf(Model& model, const fs::path& dir, const StoredWeights* stored) {
  auto* hf = dynamic_cast<HfModel*>(&model);
  if (!hf)
    throw UserError(
        "the model has no Hugging Face mapping (its plugin does not implement loom::HfModel), so it "
        "cannot load the Hugging Face model in '" +
        dir.string() + "'");
  const fs::path config_path = dir / "config.json";
  const Value config = interop::to_value(read_json(config_path));
  if (const auto mismatches = hf->hf_config_mismatches(config); !mismatches.empty()) {
    std::string message = "'" + config_path.string() + "' does not describe the configured model (" +
                          std::to_string(mismatches.size()) +
                          (mismatches.size() == 1 ? " difference" : " differences") + "):";
    for (const auto& m : mismatches) message += "\n  " + m;
    message += "\nset the model's options to match the checkpoint";
    throw UserError(message);
  }

  std::vector<safetensors::Reader> readers;
  std::map<std::string, std::size_t> where;  // tensor name -> reader
  for (const auto& file : weight_files(dir)) {
    readers.emplace_back(file);
    for (const auto& t : readers.back().tensors())
      if (!where.emplace(t.name, readers.size() - 1).second)
        throw UserError("tensor '" + t.name + "' is in two files of '" + dir.string() + "'");
  }

  const HfTensorLayout layout = hf->hf_tensors();
  std::map<std::string, Parameter*> parameters;
  for (const auto& p : model.parameters()) parameters[p.parameter->name()] = p.parameter;
  const std::string prefix = layout.base_model_prefix.empty() ? "" : layout.base_model_prefix + ".";

  struct Copy {
    std::size_t reader;
    std::string name;  // in the file
    Tensor destination;
    Parameter* parameter;
    std::int64_t begin, end;  // the parameter's rows it fills
  };
  std::vector<Copy> copies;
  std::vector<std::string> missing, mismatched, unexpected, ignored;
  std::set<std::string> used;
  for (const auto& t : layout.tensors) {
    const auto param = parameters.find(t.parameter);
    if (param == parameters.end())
      throw InternalError("the model's Hugging Face layout maps '" + t.name + "' to '" + t.parameter +
                          "', which is not one of its parameters");
    // Saved with transformers' base_model_prefix or without it (older hub files).
    std::string found = t.name;
    if (!where.count(found) && !prefix.empty() && t.name.starts_with(prefix)) found = t.name.substr(prefix.size());
    if (!where.count(found)) {
      missing.push_back(t.name);
      continue;
    }
    used.insert(found);
    const Tensor data = param->second->data();
    const Tensor destination = t.begin == 0 && t.end == data.size(0) ? data : data.slice(0, t.begin, t.end);
    const safetensors::TensorInfo& info = readers[where[found]].info(found);
    if (!(info.shape == destination.shape()) || (info.dtype != DType::f32 && info.dtype != DType::bf16)) {
      mismatched.push_back(found + ": the file has " + info.stored_dtype + " " + info.shape.str() +
                           ", the model needs F32, BF16 or F16 " + destination.shape().str());
      continue;
    }
    copies.push_back({where[found], found, destination, param->second, t.begin, t.end});
  }
  for (const auto& [name, reader] : where) {
    if (used.count(name)) continue;
    (ends_with_any(name, layout.ignored_suffixes) ? ignored : unexpected).push_back(name);
  }
  if (!missing.empty() || !mismatched.empty() || !unexpected.empty()) {
    std::string message = "the weights in '" + dir.string() + "' do not fit the configured model:";
    if (!missing.empty()) message += "\n  missing: " + grouped(missing);
    for (const auto& m : mismatched) message += "\n  " + m;
    if (!unexpected.empty()) message += "\n  not used by the model: " + grouped(unexpected);
    throw UserError(message);
  }
  if (!stored || stored->format == quant::StorageFormat::f32) {
    for (const auto& c : copies) readers[c.reader].read_into(c.name, c.destination);
  } else {
    // The weights to store go straight from the mapped files into their format, a parameter at a
    // time per thread (one tensor as the file has it, or a fused one assembled in float32), and
    // the files' pages are given back once read: the float32 value of a stored weight is never
    // written, so its pages are never allocated.
    std::map<Parameter*, std::vector<const Copy*>> parts;
    std::vector<Parameter*> to_store;
    for (const auto& c : copies) {
      if (!stored->stores(c.parameter)) {
        readers[c.reader].read_into(c.name, c.destination);
        readers[c.reader].release(c.name);
        continue;
      }
      auto& list = parts[c.parameter];
      if (list.empty()) to_store.push_back(c.parameter);
      list.push_back(&c);
    }
    default_execution_context().parallel_for(
        static_cast<std::int64_t>(to_store.size()), 1, [&](std::int64_t b, std::int64_t e) {
          for (std::int64_t i = b; i < e; ++i) {
            Parameter& p = *to_store[static_cast<std::size_t>(i)];
            const auto& list = parts.at(&p);
            const std::int64_t rows = p.shape()[0], cols = p.shape()[1];
            const quant::StorageFormat format = stored->format_of ? stored->format_of(&p) : stored->format;
            quant::StoredMatrix m;
            const Copy& first = *list.front();
            if (list.size() == 1 && first.begin == 0 && first.end == rows) {
              const Tensor t = readers[first.reader].read(first.name);  // bf16 or f32 (f16 widened)
              m = t.dtype() == DType::bf16
                      ? quant::store_bf16(
                            std::span<const std::uint16_t>(static_cast<const std::uint16_t*>(t.raw_data()),
                                                           static_cast<std::size_t>(t.numel())),
                            rows, cols, format, p.name())
                      : quant::store(std::span<const float>(t.data<float>(), static_cast<std::size_t>(t.numel())), rows,
                                     cols, format, p.name());
            } else {
              const Tensor whole = Tensor::empty(p.shape(), DType::f32);
              // Each tensor of the fused weight is its own part (nf4's statistics, as bitsandbytes).
              std::vector<std::int64_t> parts;
              for (const Copy* c : list) {
                readers[c->reader].read_into(c->name, whole.slice(0, c->begin, c->end));
                parts.push_back(c->begin);
              }
              std::sort(parts.begin(), parts.end());
              parts.push_back(rows);
              m = quant::store(std::span<const float>(whole.data<float>(), static_cast<std::size_t>(whole.numel())),
                               rows, cols, format, p.name(), parts);
            }
            for (const Copy* c : list) readers[c->reader].release(c->name);
            p.set_stored(std::make_shared<const quant::StoredMatrix>(std::move(m)));
          }
        });
    // The tensors read in flight went back to the allocator's cache: give them to the system, so
    // that the run holds the stored base alone (the loading peak is the start-up estimate's).
    allocator_release_cached();
  }

  std::vector<std::string> notes;
  const Value* type = config.find("model_type");
  notes.push_back("read " + std::to_string(copies.size()) + " tensors of the Hugging Face " +
                  (type && type->is_string() ? type->as_string() + " " : std::string()) + "model in " + dir.string() +
                  " (" + std::to_string(readers.size()) + (readers.size() == 1 ? " file" : " files") + ")");
  if (!ignored.empty()) notes.push_back("ignored tensors the model does not use: " + grouped(ignored));
  return notes;
}

}  // namespace loom
