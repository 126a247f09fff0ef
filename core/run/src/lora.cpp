// LoRA adapters on any model, freezing by parameter-name pattern, and PEFT's adapter files.
#include "loom/run/lora.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_set>

#include "checkpoint/sharded_checkpoint.hpp"
#include "loom/error.hpp"
#include "loom/execution.hpp"
#include "loom/hf_interop.hpp"
#include "loom/model_support.hpp"
#include "loom/random.hpp"
#include "loom/run/hf_interop.hpp"
#include "loom/safetensors.hpp"

namespace fs = std::filesystem;

namespace loom {

namespace {

// The adapters' initialisation stream: the init stream's tag (1) with a counter no model uses.
constexpr std::uint64_t lora_init_counter = 0x10ea;

bool glob_matches(std::string_view pattern, std::string_view text) {
  std::size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

bool matches_any_suffix(std::string_view pattern, std::string_view name) {
  for (std::size_t start = 0;;) {
    if (glob_matches(pattern, name.substr(start))) return true;
    const std::size_t dot = name.find('.', start);
    if (dot == std::string_view::npos) return false;
    start = dot + 1;
  }
}

// "h.0.attn.c_attn.weight" -> "h.0.attn.c_attn.lora_A.weight"
std::string adapter_name(const std::string& weight, const char* which) {
  const std::string stem = weight.ends_with(".weight") ? weight.substr(0, weight.size() - 7) : weight;
  return stem + "." + which + ".weight";
}

std::string some_names(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < 6; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 6) out += ", ... (" + std::to_string(names.size()) + " in all)";
  return out;
}

void check_patterns_match(const std::vector<std::string>& patterns, const std::vector<std::string>& names,
                          const std::string& option, const std::string& what) {
  for (const auto& pattern : patterns) {
    const bool any = std::any_of(names.begin(), names.end(),
                                 [&](const std::string& n) { return parameter_pattern_matches(pattern, n); });
    if (!any)
      throw UserError(option + ": '" + pattern + "' matches no " + what + "; they are named like " + some_names(names) +
                      " (a pattern matches a whole name or a dot-separated end of it, with * and ?)");
  }
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) throw UserError("cannot write '" + path.string() + "'");
}

}  // namespace

OptionSchema lora_schema() {
  OptionSchema s;
  s.integer("rank", 0,
            "Rank of the low-rank adapters (PEFT's r) on the model's linear weights; 0: no LoRA (full training).")
      .min(0);
  s.number("alpha", 16.0, "The adapters' product is scaled by alpha / rank (PEFT's lora_alpha).").min(0.0, false);
  s.number("dropout", 0.0, "Dropout on the adapters' input during training (PEFT's lora_dropout).")
      .min(0.0)
      .max(1.0, false);
  s.list("target_modules", OptionType::string, Value::List{},
         "Name patterns of the weights that get adapters, loom's or PEFT's (\"c_attn\", \"q_proj\", \"lm_head\", "
         "\"h.*.mlp.*\"); empty: every weight the model multiplies in a linear layer, embeddings and the output "
         "head excepted.");
  s.string("base_dtype", "f32",
           "How the frozen base weights are stored (QLoRA): f32; bf16; int8 (per-row absmax); nf4 (NormalFloat-4, "
           "blocks of 64, double-quantized absmax). Every weight multiplied whole in a linear layer and every "
           "embedding table; adapters, norms and optimizer state stay f32.")
      .one_of({"f32", "bf16", "int8", "nf4"});
  s.boolean("quantize_embeddings", false,
            "With base_dtype int8 or nf4: store the token embedding and the output head in that format too; false "
            "keeps them in bf16, as QLoRA with transformers and bitsandbytes does (its 4- and 8-bit layers replace "
            "the linear layers only).");
  return s;
}

LoraSettings lora_settings(const Value& run_config) {
  LoraSettings s;
  const Value* node = run_config.find("lora");
  if (!node || !node->is_map()) return s;
  const Options o(*node, "lora");
  s.rank = o.get<std::int64_t>("rank");
  s.alpha = o.get<double>("alpha");
  s.dropout = o.get<double>("dropout");
  s.target_modules = o.get<std::vector<std::string>>("target_modules");
  s.quantize_embeddings = o.get<bool>("quantize_embeddings");
  const std::string base = o.get<std::string>("base_dtype");
  s.base_dtype = base == "bf16"   ? quant::StorageFormat::bf16
                 : base == "int8" ? quant::StorageFormat::int8
                 : base == "nf4"  ? quant::StorageFormat::nf4
                                  : quant::StorageFormat::f32;
  return s;
}

void check_lora_training(const LoraSettings& s) {
  if (s.enabled()) return;
  if (!s.target_modules.empty())
    throw UserError("lora.target_modules is set but lora.rank is 0, which turns LoRA off; give lora.rank (8 is usual)");
  if (s.base_dtype != quant::StorageFormat::f32) {
    const std::string format = quant::storage_format_name(s.base_dtype);
    throw UserError("lora.base_dtype: " + format +
                    " stores the frozen base of a LoRA run in fewer bits, but lora.rank is 0, which turns LoRA "
                    "off (the whole model would train in float32): set lora.rank (8 or 16 is usual) to train "
                    "adapters on the " +
                    format + " base, or lora.base_dtype: f32 for full fine-tuning");
  }
}

bool parameter_pattern_matches(std::string_view pattern, std::string_view name) {
  if (matches_any_suffix(pattern, name)) return true;
  const std::size_t dot = name.rfind('.');
  return dot != std::string_view::npos && matches_any_suffix(pattern, name.substr(0, dot));
}

struct LoraAdapters::Entry {
  Parameter* weight = nullptr;
  bool weight_in_out = false;
  std::int64_t in = 0, out = 0;  // the adapter's: out is rows_end - rows_begin
  // The weight's output features the adapter adds to: all of them (whole), or the rows of one
  // Hugging Face module of a fused weight (PEFT's q_proj within llama's qkv_proj).
  std::int64_t rows_begin = 0, rows_end = 0;
  bool whole = true;
  std::string module;  // a partial adapter's Hugging Face module: "model.layers.0.self_attn.q_proj"
  std::unique_ptr<Parameter> a, b;
  Tensor base;  // with_merged's copy of the weight
};

namespace {

// One PEFT module of an adapted weight: its Hugging Face module name and the rows of the loom
// weight it covers (a fused weight, such as llama's qkv_proj, is several modules).
struct PeftModule {
  std::string module;  // "transformer.h.0.attn.c_attn"
  std::int64_t begin = 0, end = 0;
  bool whole = true;
};

// The Hugging Face modules of each parameter of a model with a Hugging Face layout (none without).
std::map<std::string, std::vector<PeftModule>> hf_modules(Model& model) {
  std::map<std::string, std::vector<PeftModule>> out;
  auto* hf = dynamic_cast<HfModel*>(&model);
  if (!hf) return out;
  std::map<std::string, std::int64_t> rows;
  for (const auto& p : model.parameters()) rows[p.parameter->name()] = p.parameter->shape()[0];
  for (const auto& t : hf->hf_tensors().tensors) {
    std::string module = t.name.ends_with(".weight") ? t.name.substr(0, t.name.size() - 7) : t.name;
    out[t.parameter].push_back({module, t.begin, t.end, t.begin == 0 && t.end == rows[t.parameter]});
  }
  return out;
}

std::map<std::string, std::vector<PeftModule>> peft_modules(Model& model) {
  if (!dynamic_cast<HfModel*>(&model))
    throw UserError(
        "the model has no Hugging Face mapping (its plugin does not implement loom::HfModel), so its adapters "
        "cannot be named in PEFT's layout");
  return hf_modules(model);
}

bool any_matches(const std::vector<std::string>& patterns, const std::string& name) {
  return std::any_of(patterns.begin(), patterns.end(),
                     [&](const std::string& pattern) { return parameter_pattern_matches(pattern, name); });
}

// "model.layers.0.self_attn.q_proj" -> "q_proj"
std::string last_part(const std::string& module) {
  const std::size_t dot = module.rfind('.');
  return dot == std::string::npos ? module : module.substr(dot + 1);
}

}  // namespace

LoraAdapters::LoraAdapters(Model& model, Backend& backend, const LoraSettings& settings)
    : settings_(settings), backend_(&backend) {
  if (!settings.enabled()) throw InternalError("LoraAdapters: lora.rank is 0");
  // The stored formats are host memory: the products dequantize them a panel at a time on the
  // host (quant::StoredMatrix), which a device backend's kernels cannot read.
  if (settings.base_dtype != quant::StorageFormat::f32 && !backend.buffer_type().host_visible())
    throw UserError("lora.base_dtype: " + std::string(quant::storage_format_name(settings.base_dtype)) +
                    " stores the frozen base weights in host memory, where the products dequantize them, but "
                    "backend '" +
                    std::string(backend.name()) + "' computes in " + backend.buffer_type().device().str() +
                    " memory; set lora.base_dtype: f32 on this backend, or choose a host backend (cpu, reference)");
  // Which weights the model multiplies, and how: one loss and one logits pass over a few tokens,
  // observed. The loss shows the weights inside the model (the default targets); the logits also
  // the output head (an untied lm_head), which the loss multiplies in its fused cross-entropy.
  // The values are zeros (the model may not be initialised yet): only the calls matter.
  // A weight that is zero already (as a model's fresh buffer is) is only read: its pages stay
  // unallocated for a weight that will be stored in fewer bits (lora.base_dtype).
  const std::vector<ModelParameter> params = model.parameters();
  for (const auto& p : params) {
    const Tensor value = p.parameter->data();
    if (!value.is_host_visible() || !value.is_contiguous()) {
      value.copy_from(Tensor::zeros(value.shape(), DType::f32, value.device()));
      continue;
    }
    const float* v = value.data<float>();
    const std::int64_t n = value.numel();
    if (std::any_of(v, v + n, [](float x) { return x != 0.0f; })) std::fill_n(value.data<float>(), n, 0.0f);
  }
  std::map<const Parameter*, bool> layout;  // weight -> [in, out]
  std::set<const Parameter*> in_loss;
  {
    Tape tape;
    tape.set_enabled(false);
    Ops ops(backend, &tape);
    ops.set_training(false);
    bool loss_pass = true;
    ops.set_linear_observer([&](Parameter& p, bool in_out) {
      layout.emplace(&p, in_out);
      if (loss_pass) in_loss.insert(&p);
    });
    const std::int64_t len = std::min<std::int64_t>(model.max_seq_len(), 4);
    const std::vector<std::int32_t> zeros(static_cast<std::size_t>(len), 0);
    const Tensor tokens = Tensor::from(std::span<const std::int32_t>(zeros), Shape{1, len}).to(backend.device());
    model.loss(ops, tokens, tokens, Tensor());
    loss_pass = false;
    model.logits(ops, tokens, Tensor());
  }
  for (const auto& p : params)
    if (p.parameter->shape().rank() == 2 && (layout.contains(p.parameter) || p.role == ParameterRole::embedding)) {
      storable_.push_back(p.parameter);
      // The embedding tables, and the output head: multiplied in the logits pass, not in the loss
      // pass (whose fused cross-entropy does not show it to the observer).
      if (p.role == ParameterRole::embedding || !in_loss.contains(p.parameter)) vocab_tables_.insert(p.parameter);
    }
  const auto modules = hf_modules(model);
  for (const auto& p : params) {
    const auto it = modules.find(p.parameter->name());
    if (it == modules.end() || it->second.size() < 2 || (layout.contains(p.parameter) && layout.at(p.parameter)))
      continue;
    std::vector<std::int64_t> rows;
    for (const PeftModule& m : it->second) rows.push_back(m.begin);
    rows.push_back(p.parameter->shape()[0]);
    std::sort(rows.begin(), rows.end());
    part_rows_[p.parameter] = std::move(rows);
  }
  // What a pattern may name: the weights' loom names, and their Hugging Face modules' names
  // (PEFT's target_modules: q_proj, v_proj, lm_head), with ".weight" so that a pattern matches
  // them as it matches a parameter's name.
  std::vector<std::string> linear_names, module_names;
  for (const auto& p : params) {
    if (!layout.contains(p.parameter) || p.role == ParameterRole::embedding) continue;
    linear_names.push_back(p.parameter->name());
    if (const auto it = modules.find(p.parameter->name()); it != modules.end())
      for (const auto& m : it->second) module_names.push_back(m.module + ".weight");
  }
  if (linear_names.empty())
    throw UserError("lora: the model multiplies no whole parameter in a linear layer, so no weight can get an adapter");
  for (const auto& pattern : settings.target_modules) {
    auto matches = [&](const std::string& n) { return parameter_pattern_matches(pattern, n); };
    if (std::any_of(linear_names.begin(), linear_names.end(), matches) ||
        std::any_of(module_names.begin(), module_names.end(), matches))
      continue;
    std::string message = "lora.target_modules: '" + pattern +
                          "' matches no weight the model multiplies in a linear layer; they are named like " +
                          some_names(linear_names);
    if (!module_names.empty()) {
      std::vector<std::string> short_names;
      std::set<std::string> seen;
      for (const auto& n : module_names)
        if (const std::string s = last_part(n.substr(0, n.size() - 7)); seen.insert(s).second) short_names.push_back(s);
      message += ", or by their Hugging Face (PEFT) module names " + some_names(short_names);
    }
    message += " (a pattern matches a whole name or a dot-separated end of it, with * and ?)";
    if (parameter_pattern_matches(pattern, "lm_head.weight"))
      message +=
          "; the output head has no weight of its own when the model ties it to the token embedding "
          "(set model.tie_word_embeddings: false to adapt lm_head)";
    throw UserError(message);
  }

  BufferType& memory = backend.buffer_type();
  auto add = [&](Parameter* weight, bool in_out, std::int64_t begin, std::int64_t end, const std::string& module) {
    auto e = std::make_unique<Entry>();
    e->weight = weight;
    e->weight_in_out = in_out;
    const Shape& shape = weight->shape();
    e->in = in_out ? shape[0] : shape[1];
    const std::int64_t outputs = in_out ? shape[1] : shape[0];
    e->whole = module.empty();
    e->rows_begin = e->whole ? 0 : begin;
    e->rows_end = e->whole ? outputs : end;
    e->out = e->rows_end - e->rows_begin;
    e->module = module;
    // A partial adapter is named after its module within the weight:
    // "layers.0.self_attn.qkv_proj.q_proj.lora_A.weight".
    const std::string& w = weight->name();
    const std::string stem =
        e->whole ? w : (w.ends_with(".weight") ? w.substr(0, w.size() - 7) : w) + "." + last_part(module) + ".weight";
    e->a = std::make_unique<Parameter>(adapter_name(stem, "lora_A"),
                                       Tensor::zeros(Shape{settings.rank, e->in}, DType::f32, memory.device()));
    e->b = std::make_unique<Parameter>(adapter_name(stem, "lora_B"),
                                       Tensor::zeros(Shape{e->out, settings.rank}, DType::f32, memory.device()));
    table_[weight].push_back(LinearAdapter{e->a.get(), e->b.get(), settings.scale(),
                                           static_cast<float>(settings.dropout), e->whole ? 0 : e->rows_begin,
                                           e->whole ? 0 : e->rows_end});
    entries_.push_back(std::move(e));
  };
  for (const auto& p : params) {
    const auto it = layout.find(p.parameter);
    if (it == layout.end() || p.role == ParameterRole::embedding) continue;
    const std::string& name = p.parameter->name();
    if (settings.target_modules.empty()) {
      if (in_loss.contains(p.parameter)) add(p.parameter, it->second, 0, 0, "");
      continue;
    }
    if (any_matches(settings.target_modules, name)) {
      add(p.parameter, it->second, 0, 0, "");
      continue;
    }
    const auto m = modules.find(name);
    if (m == modules.end()) continue;
    std::vector<const PeftModule*> named;
    for (const auto& module : m->second)
      if (any_matches(settings.target_modules, module.module + ".weight")) named.push_back(&module);
    if (named.empty()) continue;
    if (named.size() == 1 && named[0]->whole) {
      add(p.parameter, it->second, 0, 0, "");
      continue;
    }
    if (it->second)
      throw UserError("lora.target_modules names " + last_part(named[0]->module) + ", part of '" + name +
                      "', whose weight is [in, out]: an adapter covers whole output features, so it can only "
                      "adapt the whole weight ('" +
                      name.substr(0, name.size() - 7) + "')");
    for (const PeftModule* module : named) add(p.parameter, false, module->begin, module->end, module->module);
  }
}

LoraAdapters::~LoraAdapters() = default;

void LoraAdapters::initialize(std::uint64_t seed) {
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    Entry& e = *entries_[i];
    // PEFT: kaiming_uniform_(A, a=sqrt(5)), a bound of 1 / sqrt(fan_in).
    const std::uint64_t key = stream_key(seed, 1, lora_init_counter + i);
    const float bound = 1.0f / std::sqrt(static_cast<float>(e.in));
    // Drawn on the host (no backend kernel draws uniform values): in a device backend's memory
    // through one explicit copy per adapter, at start-up.
    Tensor a = Tensor::empty(e.a->shape());
    float* d = a.data<float>();
    for (std::int64_t j = 0; j < a.numel(); ++j)
      d[j] = (2.0f * random_uniform(key, static_cast<std::uint32_t>(j)) - 1.0f) * bound;
    e.a->data().copy_from(a);
    models::fill_constant(e.b->data(), 0.0f, backend_);
  }
}

std::vector<ModelParameter> LoraAdapters::parameters() const {
  std::vector<ModelParameter> out;
  for (const auto& e : entries_) {
    out.push_back({e->a.get(), ParameterRole::weight});
    out.push_back({e->b.get(), ParameterRole::weight});
  }
  return out;
}

std::vector<std::string> LoraAdapters::target_names() const {
  std::vector<std::string> out;
  for (const auto& e : entries_)
    out.push_back(e->whole ? e->weight->name() : e->weight->name() + " (" + last_part(e->module) + ")");
  return out;
}

bool LoraAdapters::any_in_out() const {
  return std::any_of(entries_.begin(), entries_.end(), [](const auto& e) { return e->weight_in_out; });
}

std::vector<std::string> LoraAdapters::save_peft(Model& model, const fs::path& dir,
                                                 const std::string& base_model) const {
  const auto modules = peft_modules(model);
  std::vector<std::pair<std::string, Tensor>> tensors;
  nlohmann::ordered_json targets = nlohmann::ordered_json::array();
  for (const auto& e : entries_) {
    if (!e->whole) {  // PEFT's adapter of one module of a fused weight: its own A and B
      tensors.emplace_back("base_model.model." + e->module + ".lora_A.weight", e->a->data());
      tensors.emplace_back("base_model.model." + e->module + ".lora_B.weight", e->b->data());
      targets.push_back(e->module);
      continue;
    }
    const auto it = modules.find(e->weight->name());
    if (it == modules.end())
      throw InternalError("the model's Hugging Face layout does not name '" + e->weight->name() + "'");
    for (const PeftModule& m : it->second) {
      if (!m.whole && e->weight_in_out)
        throw UserError("the adapter of '" + e->weight->name() +
                        "' cannot be written in PEFT's layout: the weight is [in, out] and Hugging Face splits it "
                        "into several modules");
      // B A's rows [begin, end) are B's rows [begin, end) times A: each module has A and its rows of B.
      tensors.emplace_back("base_model.model." + m.module + ".lora_A.weight", e->a->data());
      tensors.emplace_back("base_model.model." + m.module + ".lora_B.weight",
                           m.whole ? e->b->data() : e->b->data().slice(0, m.begin, m.end));
      targets.push_back(m.module);
    }
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UserError("cannot create '" + dir.string() + "': " + ec.message());
  safetensors::save(dir / "adapter_model.safetensors", tensors, {{"format", "pt"}});
  nlohmann::ordered_json config = {
      {"peft_type", "LORA"},        {"task_type", "CAUSAL_LM"},       {"base_model_name_or_path", base_model},
      {"r", settings_.rank},        {"lora_alpha", settings_.alpha},  {"lora_dropout", settings_.dropout},
      {"target_modules", targets},  {"fan_in_fan_out", any_in_out()}, {"bias", "none"},
      {"modules_to_save", nullptr}, {"init_lora_weights", true},      {"use_rslora", false},
      {"use_dora", false},          {"inference_mode", true}};
  write_text(dir / "adapter_config.json", config.dump(2) + "\n");
  return {"adapter_model.safetensors", "adapter_config.json"};
}

void LoraAdapters::load(Model& model, const fs::path& weights) {
  std::error_code ec;
  if (!fs::exists(weights, ec) && checkpoint::is_sharded_checkpoint(weights.parent_path())) {
    // A checkpoint whose ranks each wrote a part of the adapters (loom's names, never PEFT's).
    checkpoint::TensorSet::open(weights).load_parameters(parameters());
    return;
  }
  const safetensors::Reader reader(weights);
  const bool peft = std::any_of(reader.tensors().begin(), reader.tensors().end(),
                                [](const auto& t) { return t.name.starts_with("base_model.model."); });
  if (!peft) {
    safetensors::load_parameters(weights, parameters());
    return;
  }
  const auto modules = peft_modules(model);
  for (const auto& e : entries_) {
    if (!e->whole) {
      const std::string prefix = "base_model.model." + e->module;
      reader.read_into(prefix + ".lora_A.weight", e->a->data());
      reader.read_into(prefix + ".lora_B.weight", e->b->data());
      continue;
    }
    const auto it = modules.find(e->weight->name());
    if (it == modules.end())
      throw InternalError("the model's Hugging Face layout does not name '" + e->weight->name() + "'");
    for (const PeftModule& m : it->second) {
      const std::string prefix = "base_model.model." + m.module;
      reader.read_into(prefix + ".lora_A.weight", e->a->data());
      reader.read_into(prefix + ".lora_B.weight", m.whole ? e->b->data() : e->b->data().slice(0, m.begin, m.end));
    }
  }
}

void LoraAdapters::merge_into_weights(Backend& backend) {
  const float scale = settings_.scale();
  const std::int64_t r = settings_.rank;
  // The merge updates the float32 master weights, so it is a float32 product even where the
  // backend computes its own in bf16 (matmul_dtype()): rounding A and B to bf16 would put an
  // error of 2^-8 of the update into every merged (evaluated, exported) weight. One
  // single-threaded sgemm on the host memory then; it is a rank-r update, small beside a step.
  const bool host_f32 = backend.matmul_dtype() != DType::f32 && backend.buffer_type().host_visible();
  auto gemm = [&](Transpose ta, Transpose tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* x,
                  std::int64_t ldx, const float* y, std::int64_t ldy, float* w, std::int64_t ldw) {
    if (!host_f32) {
      backend.gemm(ta, tb, m, n, k, scale, x, ldx, y, ldy, 1.0f, w, ldw);
      return;
    }
    auto trans = [](Transpose t) { return t == Transpose::yes ? CblasTrans : CblasNoTrans; };
    cblas_sgemm(CblasRowMajor, trans(ta), trans(tb), static_cast<blasint>(m), static_cast<blasint>(n),
                static_cast<blasint>(k), scale, x, static_cast<blasint>(ldx), y, static_cast<blasint>(ldy), 1.0f, w,
                static_cast<blasint>(ldw));
  };
  for (const auto& e : entries_) {
    if (e->weight->stored()) continue;
    const float* a = e->a->data().device_data<float>();
    const float* b = e->b->data().device_data<float>();
    float* w = e->weight->data().device_data<float>();
    if (e->weight_in_out)  // W[in, out] += scale * A^T[in, r] B^T[r, out] (whole adapters only)
      gemm(Transpose::yes, Transpose::yes, e->in, e->out, r, a, e->in, b, r, w, e->out);
    else  // W[out, in] rows [begin, end) += scale * B[end - begin, r] A[r, in]
      gemm(Transpose::no, Transpose::no, e->out, e->in, r, b, r, a, e->in, w + e->rows_begin * e->in, e->in);
  }
}

bool LoraAdapters::stores(const Parameter* p) const {
  return settings_.base_dtype != quant::StorageFormat::f32 && !p->requires_grad() &&
         std::find(storable_.begin(), storable_.end(), p) != storable_.end();
}

void LoraAdapters::add_merged_rows(const Parameter& weight, std::int64_t row_begin, std::int64_t row_end,
                                   float* out) const {
  const float scale = settings_.scale();
  const auto r = static_cast<blasint>(settings_.rank);
  for (const auto& e : entries_) {
    if (e->weight != &weight) continue;
    const Tensor at = e->a->data().to(Device::host()), bt = e->b->data().to(Device::host());
    const float* a = at.data<float>();
    const float* b = bt.data<float>();
    if (e->weight_in_out) {
      // Rows are input features: out[i - row_begin, o] += scale * sum_k A[k, i] B[o, k].
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasTrans, static_cast<blasint>(row_end - row_begin),
                  static_cast<blasint>(e->out), r, scale, a + row_begin, static_cast<blasint>(e->in), b, r, 1.0f, out,
                  static_cast<blasint>(e->out));
      continue;
    }
    // Rows are output features; the adapter covers [rows_begin, rows_end) of them.
    const std::int64_t begin = std::max(row_begin, e->rows_begin), end = std::min(row_end, e->rows_end);
    if (end <= begin) continue;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<blasint>(end - begin),
                static_cast<blasint>(e->in), r, scale, b + (begin - e->rows_begin) * settings_.rank, r, a,
                static_cast<blasint>(e->in), 1.0f, out + (begin - row_begin) * e->in, static_cast<blasint>(e->in));
  }
}

quant::StorageFormat LoraAdapters::format_of(const Parameter* p) const {
  const quant::StorageFormat base = settings_.base_dtype;
  const bool quantized = base == quant::StorageFormat::int8 || base == quant::StorageFormat::nf4;
  return quantized && !settings_.quantize_embeddings && vocab_tables_.contains(p) ? quant::StorageFormat::bf16 : base;
}

std::vector<std::int64_t> LoraAdapters::part_rows(const Parameter* p) const {
  const auto it = part_rows_.find(p);
  return it == part_rows_.end() ? std::vector<std::int64_t>{} : it->second;
}

std::pair<std::int64_t, std::int64_t> LoraAdapters::store_base() {
  std::int64_t stored_bytes = 0, f32_bytes = 0;
  if (settings_.base_dtype == quant::StorageFormat::f32) return {0, 0};
  std::vector<Parameter*> chosen;
  for (Parameter* p : storable_)
    if (!p->requires_grad() && !p->stored()) chosen.push_back(p);
  // One weight per task (the codecs are scalar and thread-safe), each float32 value given back as
  // soon as its weight is stored: the peak is the float32 model plus the weights in flight.
  default_execution_context().parallel_for(
      static_cast<std::int64_t>(chosen.size()), 1, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) {
          Parameter& p = *chosen[static_cast<std::size_t>(i)];
          const Tensor value = p.data();
          const std::vector<std::int64_t> parts = part_rows(&p);
          auto m = std::make_shared<quant::StoredMatrix>(
              quant::store(std::span<const float>(value.data<float>(), static_cast<std::size_t>(value.numel())),
                           value.size(0), value.size(1), format_of(&p), p.name(), parts));
          p.set_stored(std::move(m));
        }
      });
  // Every stored weight: these, and those trainer.init_from read straight into the format.
  for (Parameter* p : storable_)
    if (p->stored()) {
      stored_bytes += p->stored()->storage_bytes();
      f32_bytes += p->shape().numel() * std::int64_t{4};
    }
  base_stored_ = base_stored_ || stored_bytes > 0;
  return {stored_bytes, f32_bytes};
}

void LoraAdapters::keep_base() {
  for (const auto& e : entries_) {
    e->base = Tensor::empty(e->weight->shape(), DType::f32, e->weight->tensor().device());
    e->base.copy_from(e->weight->data());
  }
}

// The copies go back to the allocator: between evaluations a LoRA run holds no second base.
void LoraAdapters::restore_base() {
  for (const auto& e : entries_) {
    e->weight->data().copy_from(e->base);
    e->base = Tensor();
  }
}

std::vector<ModelParameter> select_trainable(const std::vector<ModelParameter>& parameters,
                                             const std::vector<std::string>& trainable,
                                             const std::vector<std::string>& frozen, bool lora) {
  if (lora && !trainable.empty())
    throw UserError(
        "trainer.trainable cannot be used with lora: a LoRA run trains its adapters alone (PEFT's adapter files "
        "hold nothing else); freeze by pattern without lora, or adapt those weights too (lora.target_modules)");
  std::vector<std::string> names;
  for (const auto& p : parameters) names.push_back(p.parameter->name());
  check_patterns_match(trainable, names, "trainer.trainable", "parameter of the model");
  check_patterns_match(frozen, names, "trainer.frozen", "parameter of the model");
  auto any = [](const std::vector<std::string>& patterns, const std::string& name) {
    return std::any_of(patterns.begin(), patterns.end(),
                       [&](const std::string& pattern) { return parameter_pattern_matches(pattern, name); });
  };
  std::vector<ModelParameter> out;
  for (const auto& p : parameters) {
    const std::string& name = p.parameter->name();
    const bool train = !lora && (trainable.empty() || any(trainable, name)) && !any(frozen, name);
    p.parameter->set_requires_grad(train);
    if (train) out.push_back(p);
  }
  if (out.empty() && !lora)
    throw UserError("trainer.trainable and trainer.frozen leave no parameter of the model to train");
  return out;
}

std::shared_ptr<LoraAdapters> load_lora_model(Model& model, Backend& backend, const Value& run_config,
                                              const RunFiles& files, bool merge) {
  const LoraSettings settings = lora_settings(run_config);
  auto adapters = std::make_shared<LoraAdapters>(model, backend, settings);
  const Value* trainer = run_config.find("trainer");
  const Options o(trainer ? *trainer : Value::map(), "trainer");
  const std::string from = o.get<std::string>("init_from");
  // The base as the run stored it (lora.base_dtype), as run_setup loads it: frozen, then read
  // straight into the format from a Hugging Face directory, or initialised, read and stored.
  const bool stored = settings.base_dtype != quant::StorageFormat::f32;
  if (stored) select_trainable(model.parameters(), {}, {}, /*lora=*/true);
  StoredWeights straight;
  const bool streams = stored && !from.empty() && !hf_source_dir(from).empty();
  if (streams) {
    straight.format = settings.base_dtype;
    straight.stores = [&adapters](const Parameter* p) { return adapters->stores(p); };
    straight.format_of = [&adapters](const Parameter* p) { return adapters->format_of(p); };
  } else {
    model.initialize(static_cast<std::uint64_t>(o.get<std::int64_t>("seed")));
  }
  if (!from.empty())
    with_context("while loading the base weights (trainer.init_from '" + from + "')", [&] {
      load_initial_weights(model, from,
                           parse_weights_choice(o.get<std::string>("init_from_weights"), "trainer.init_from_weights"),
                           streams ? &straight : nullptr);
    });
  if (stored) adapters->store_base();
  with_context("while loading the adapters from " + files.weights.string(), [&] {
    adapters->load(model, files.weights);
    // A checkpoint's average of the adapters, in loom's names, over what it read.
    if (!files.average.empty()) load_run_weights(files, adapters->parameters());
  });
  if (merge) adapters->merge_into_weights(backend);
  return adapters;
}

}  // namespace loom
