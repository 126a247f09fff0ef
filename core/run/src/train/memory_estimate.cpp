#include "train/memory_estimate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "loom/error.hpp"
#include "loom/model_support.hpp"

namespace loom::training {

namespace {

std::optional<std::int64_t> parse_size(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || value < 0) return std::nullopt;
  std::string unit(end);
  double scale = 1;
  if (unit == "K" || unit == "KiB")
    scale = 1024.0;
  else if (unit == "M" || unit == "MiB")
    scale = 1024.0 * 1024.0;
  else if (unit == "G" || unit == "GiB")
    scale = 1024.0 * 1024.0 * 1024.0;
  else if (!unit.empty())
    return std::nullopt;
  return static_cast<std::int64_t>(value * scale);
}

// The estimate's arithmetic is 128-bit and each term capped (kMemoryEstimateCap): absurd shapes
// give an absurd figure, which the memory check refuses, never one wrapped around to negative.
using Wide = __int128;

std::int64_t capped(Wide v) {
  return static_cast<std::int64_t>(std::clamp<Wide>(v, 0, kMemoryEstimateCap));
}

int ranks_on_this_host(int ranks) {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (const char* v = std::getenv(name); v && std::atoi(v) > 0) return std::atoi(v);
  return ranks;
}

}  // namespace

std::string format_bytes(std::int64_t bytes) {
  char text[32];
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1024.0 * 1024.0)
    std::snprintf(text, sizeof text, "%.2f GiB", b / (1024.0 * 1024.0 * 1024.0));
  else
    std::snprintf(text, sizeof text, "%.0f MiB", b / (1024.0 * 1024.0));
  return text;
}

std::int64_t MemoryEstimate::total() const {
  const Wide run = Wide{parameters} + matmul_copies + reference + gradients + set_aside + optimizer_state + ema +
                   buckets + gathered + overhead + std::max(activations, kv_cache);
  return capped(std::max({Wide{setup}, Wide{loading} + overhead, run}));
}

std::string MemoryEstimate::describe() const {
  std::ostringstream os;
  os << "memory estimate per rank: " << format_bytes(total()) << " (parameters " << format_bytes(parameters);
  if (base_format != quant::StorageFormat::f32) {
    os << " with the frozen base in " << quant::storage_format_name(base_format);
    if (loading > 0)
      os << ", loading peak " << format_bytes(loading)
         << (loading_streams ? " (the stored base and the tensors being read into it)"
                             : " (the float32 base before it is stored)");
  }
  if (matmul_copies > 0) os << ", bf16 weight copies " << format_bytes(matmul_copies);
  if (reference > 0) os << ", reference model " << format_bytes(reference);
  os << ", gradients " << format_bytes(gradients) << ", optimizer state " << format_bytes(optimizer_state)
     << ", activations " << format_bytes(activations) << (remat ? " with remat" : "") << " ("
     << format_bytes(remat ? activations_no_remat : activations_remat) << (remat ? " without" : " with remat") << ")";
  if (set_aside > 0) os << ", set-aside gradients " << format_bytes(set_aside);
  if (ema > 0) os << ", ema " << format_bytes(ema);
  if (buckets > 0) os << ", gradient buckets " << format_bytes(buckets);
  if (gathered > 0) os << ", gathered units " << format_bytes(gathered);
  if (kv_cache > 0) os << ", sample kv cache " << format_bytes(kv_cache);
  os << ", process " << format_bytes(overhead) << ")";
  return os.str();
}

ModelMemory generic_model_memory(std::int64_t num_parameters, std::int64_t batch, std::int64_t seq) {
  // 12 width^2 per layer and width / 64 layers: width^3 = 64 * P / 12.
  const double width = std::cbrt(64.0 * static_cast<double>(std::max<std::int64_t>(num_parameters, 1)) / 12.0);
  models::TransformerShape s;
  s.hidden_dim = std::max<std::int64_t>(64, static_cast<std::int64_t>(std::llround(width / 64.0)) * 64);
  s.num_layers = std::max<std::int64_t>(1, num_parameters / (12 * s.hidden_dim * s.hidden_dim));
  s.num_heads = s.num_kv_heads = s.hidden_dim / 64;
  s.head_dim = 64;
  s.intermediate_dim = 4 * s.hidden_dim;
  return models::transformer_memory(s, RematPolicy::none, batch, seq);
}

MemoryEstimate estimate_memory(const MemoryInputs& in) {
  MemoryEstimate e;
  const ModelMemory m = in.model ? *in.model : generic_model_memory(in.num_parameters, in.micro_batch, in.seq_len);
  const Wide values = in.num_parameters, f32_bytes = in.parameter_bytes;
  Wide parameters = f32_bytes, reference = in.reference_model ? f32_bytes : 0;
  Wide matmul_copies = in.bf16_matmuls ? values * 2 * (in.reference_model ? 2 : 1) : 0;
  if (in.lora_rank > 0 && in.base_format != quant::StorageFormat::f32) {
    // Every value counted in the stored format (norms and biases, which stay float32, are a
    // thousandth of a transformer), the vocabulary tables in bf16 unless they are quantized too;
    // the products dequantize one panel of at most 8 MiB at a time instead of keeping bf16
    // copies. The float32 base exists while it loads, unless it is read from a Hugging Face
    // directory straight into the format.
    e.base_format = in.base_format;
    const double bits = in.base_format == quant::StorageFormat::bf16   ? 16.0
                        : in.base_format == quant::StorageFormat::int8 ? 8.0
                                                                       : 4.127;
    const Wide tables = in.base_format == quant::StorageFormat::bf16 || in.quantize_vocab_tables
                            ? 0
                            : std::clamp<Wide>(in.vocab_table_values, 0, values);
    parameters = static_cast<Wide>(static_cast<double>(values - tables) * bits / 8.0) + tables * 2;
    e.loading = capped(in.base_streams ? parameters + in.stream_in_flight : f32_bytes);
    e.loading_streams = in.base_streams;
    matmul_copies = std::min<Wide>(Wide{8} << 20, f32_bytes) + (in.reference_model ? values * 2 : 0);
  }
  // LoRA: every linear weight adapted (the upper bound: target_modules may name fewer).
  const Wide trained = in.lora_rank > 0 ? Wide{in.lora_rank} * m.lora_in_out : values;
  Wide gradients = trained * 4;
  // LoRA's adapters are parameters of their own, float32, on top of the base.
  if (in.lora_rank > 0) parameters += trained * 4;
  const Wide state = static_cast<Wide>(static_cast<long double>(trained) * in.optimizer_bytes_per_parameter);
  Wide optimizer_state = in.shard_optimizer_state && in.ranks > 1 ? state / in.ranks : state;
  Wide ema = in.ema ? trained * 4 : 0;
  Wide buckets = in.ranks > 1 ? in.grad_bucket_bytes : 0;
  Wide gathered = 0, setup = 0;
  e.remat = m.remat;
  e.activations_no_remat = m.activation_bytes;
  e.activations_remat = m.activation_bytes_remat;
  e.activations = m.remat ? m.activation_bytes_remat : m.activation_bytes;
  Wide kv_cache = Wide{in.sample_positions} * m.kv_cache_bytes_per_position;
  e.overhead = kProcessOverheadBytes;
  // Each tensor-parallel member holds 1/tensor of the split weights (every matrix and the
  // embeddings; the norms it keeps whole are a thousandth of a transformer), with their
  // gradients, state and average. The activations are counted whole (an upper bound: the heads'
  // and the MLP's are split too). A whole-matrix optimizer updates whole copies of the split
  // matrices on every member: their values, gradients and state are whole.
  const Wide t = std::max(in.tensor, 1);
  const Wide state_split = in.elementwise_optimizer ? t : 1;
  if (in.tensor > 1) {
    parameters /= t;
    reference /= t;
    matmul_copies /= t;
    gradients /= t;
    optimizer_state = optimizer_state / state_split + (in.elementwise_optimizer ? 0 : trained * 8);
    ema /= t;
    buckets = std::min(buckets, gradients);
  }
  if (in.fsdp > 1) {
    // Each rank holds 1/fsdp of its member's values, gradients, state and average; no buckets.
    // Whole-matrix optimizers add the whole values and gradients of the parameters a rank updates.
    const Wide f = in.fsdp;
    const Wide whole = in.elementwise_optimizer ? 0 : trained * 8 / f;
    // Every rank builds its member's whole model before keeping its shard.
    setup = f32_bytes / t + f32_bytes / t / f * 2 + kProcessOverheadBytes;
    parameters /= f;
    gradients /= f;
    optimizer_state = state / state_split / f + whole;
    ema /= f;
    buckets = 0;
    // Gathered at once: the values of the unit computing and the one prefetched; the gradients of
    // the unit computing and of the two being reduced (none under LoRA: the base is frozen); of
    // the member's part of each unit under tensor parallelism.
    const std::int64_t* u = m.largest_units;
    const Wide largest = u[0] > 0 ? u[0] : values;
    gathered = (4 * (largest + u[1]) + (in.lora_rank > 0 ? 0 : 4 * (largest + u[1] + u[2]))) / t;
    // bf16 products round the weights of the unit computing (those of the next unit reuse the
    // buffers), not of the whole model; a reference model is whole on every rank.
    if (in.bf16_matmuls) matmul_copies = 2 * largest / t + (in.reference_model ? values * 2 : 0);
    kv_cache = 0;  // no samples under FSDP
  }
  // Gradient accumulation: the earlier micro-batches' sum, a second copy of the gradients.
  const Wide set_aside = in.micro_batches > 1 && in.fsdp <= 1 ? gradients : 0;
  e.parameters = capped(parameters);
  e.reference = capped(reference);
  e.matmul_copies = capped(matmul_copies);
  e.trained_values = capped(trained);
  e.gradients = capped(gradients);
  e.set_aside = capped(set_aside);
  e.optimizer_state = capped(optimizer_state);
  e.ema = capped(ema);
  e.buckets = capped(buckets);
  e.gathered = capped(gathered);
  e.setup = capped(setup);
  e.kv_cache = capped(kv_cache);
  return e;
}

std::optional<AvailableMemory> available_memory(int ranks) {
  AvailableMemory a;
  std::optional<std::int64_t> host;
  if (const char* forced = std::getenv("LOOM_MEMORY_AVAILABLE"); forced && *forced) {
    host = parse_size(forced);
    if (!host)
      throw UserError(std::string("LOOM_MEMORY_AVAILABLE is '") + forced +
                      "': give bytes, or a number with K, M or G (\"8G\")");
    a.source = "LOOM_MEMORY_AVAILABLE";
  }
  if (!host) {
    std::ifstream limit("/sys/fs/cgroup/memory.max");
    std::string text;
    if (limit >> text && text != "max") {
      host = parse_size(text);
      if (host) a.source = "cgroup memory.max";
    }
  }
  if (!host) {
    std::ifstream meminfo("/proc/meminfo");
    std::string key, unit;
    std::int64_t kib = 0;
    while (meminfo >> key >> kib >> unit)
      if (key == "MemAvailable:") {
        host = kib * 1024;
        a.source = "MemAvailable";
        break;
      }
  }
  if (!host) return std::nullopt;
  const int local = std::max(1, ranks_on_this_host(ranks));
  a.bytes = *host / local;
  a.source += " " + format_bytes(*host);
  if (local > 1) a.source += " / " + std::to_string(local) + " ranks on this host";
  return a;
}

std::optional<AvailableMemory> available_memory(int ranks, const BufferType& memory) {
  const char* forced = std::getenv("LOOM_MEMORY_AVAILABLE");
  const std::optional<DeviceMemory> device = memory.memory();
  if ((forced && *forced) || !device) return available_memory(ranks);
  AvailableMemory a;
  const int local = std::max(1, ranks_on_this_host(ranks));
  a.bytes = device->free_bytes / local;
  a.source = memory.device().str() + " free memory " + format_bytes(device->free_bytes) + " of " +
             format_bytes(device->total_bytes);
  if (local > 1) a.source += " / " + std::to_string(local) + " ranks on this host";
  return a;
}

std::string memory_refusal(const MemoryInputs& inputs, const MemoryEstimate& estimate,
                           const AvailableMemory& available) {
  if (estimate.total() <= available.bytes) return {};
  auto fits = [&](const MemoryInputs& changed) { return estimate_memory(changed).total() <= available.bytes; };
  std::vector<std::string> ways;
  if (!estimate.remat) {
    MemoryInputs with = inputs;
    ModelMemory m =
        with.model ? *with.model : generic_model_memory(with.num_parameters, with.micro_batch, with.seq_len);
    if (with.model) {
      m.remat = true;
      with.model = m;
      if (fits(with))
        ways.push_back("model.remat: full (activations " + format_bytes(estimate.activations_remat) + ")");
    }
  }
  if (inputs.micro_batch > 1 && inputs.model) {
    // The activations scale with the micro-batch: the largest that fits.
    const std::int64_t fixed = estimate.total() - std::max(estimate.activations, estimate.kv_cache);
    const double per_row = static_cast<double>(estimate.activations) / static_cast<double>(inputs.micro_batch);
    const auto rows = static_cast<std::int64_t>(static_cast<double>(available.bytes - fixed) / per_row);
    if (rows >= 1)
      ways.push_back("trainer.microbatch_size: " + std::to_string(std::min(rows, inputs.micro_batch - 1)) + " or less");
  }
  if (!inputs.shard_optimizer_state && inputs.lora_rank == 0) {
    for (int n = std::max(2, inputs.ranks); n <= 64; n *= 2) {
      MemoryInputs more = inputs;
      more.ranks = n;
      more.shard_optimizer_state = true;
      if (fits(more)) {
        ways.push_back("trainer.shard_optimizer_state: true on " + std::to_string(n) +
                       " ranks, one per host (mpirun -np " + std::to_string(n) + ")");
        break;
      }
    }
  }
  if (inputs.lora_rank == 0 && inputs.ranks > 1 && inputs.fsdp < inputs.ranks) {
    MemoryInputs sharded = inputs;
    sharded.fsdp = inputs.ranks;
    sharded.shard_optimizer_state = false;
    if (fits(sharded))
      ways.push_back("trainer.mesh: {data: 1, fsdp: " + std::to_string(inputs.ranks) +
                     "} (fully sharded: each rank holds 1/" + std::to_string(inputs.ranks) + " of the model)");
  }
  if (inputs.lora_rank == 0 && inputs.fsdp == 1) {
    for (int n = std::max(2, inputs.ranks * 2); n <= 64; n *= 2) {
      MemoryInputs more = inputs;
      more.ranks = more.fsdp = n;
      more.shard_optimizer_state = false;
      if (fits(more)) {
        ways.push_back("trainer.mesh: {data: 1, fsdp: " + std::to_string(n) + "} on " + std::to_string(n) +
                       " ranks, one per host (mpirun -np " + std::to_string(n) + ")");
        break;
      }
    }
  }
  if (inputs.lora_rank == 0) {
    MemoryInputs lora = inputs;
    lora.lora_rank = 16;
    if (fits(lora)) ways.push_back("lora.rank: 16 (train adapters, not the whole model)");
  }
  // A quantized base: the smallest format that fits (with LoRA at rank 16 when it is off).
  if (inputs.base_format == quant::StorageFormat::f32 || inputs.lora_rank == 0)
    for (const auto format : {quant::StorageFormat::bf16, quant::StorageFormat::int8, quant::StorageFormat::nf4}) {
      MemoryInputs quantized = inputs;
      quantized.lora_rank = inputs.lora_rank > 0 ? inputs.lora_rank : 16;
      quantized.base_format = format;
      if (!fits(quantized)) continue;
      ways.push_back(std::string(inputs.lora_rank > 0 ? "" : "lora.rank: 16 with ") +
                     "lora.base_dtype: " + quant::storage_format_name(format) + " (the frozen base in " +
                     format_bytes(estimate_memory(quantized).parameters) + ")");
      break;
    }
  std::string text = "the run needs about " + format_bytes(estimate.total()) + " per rank but " +
                     format_bytes(available.bytes) + " is available (" + available.source +
                     "): " + estimate.describe() + ". ";
  if (ways.empty())
    text += "Nothing this estimate knows of would make it fit: a smaller model, or a machine with more memory.";
  else {
    text += "What would fit: ";
    for (std::size_t i = 0; i < ways.size(); ++i) text += (i ? "; or " : "") + ways[i];
    text += ".";
  }
  text += " (trainer.memory_check: warn trains anyway)";
  return text;
}

}  // namespace loom::training
