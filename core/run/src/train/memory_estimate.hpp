// The start-up memory estimate of one rank (docs/training.md, "Memory estimate"): what a run
// will hold at its peak, computed from the options and the model's shapes before anything is
// allocated, so that a run too large for the machine is refused with figures instead of being
// killed by the kernel. The frozen base of a LoRA run counts in its storage format
// (lora.base_dtype); sharding (FSDP's gathered units) adds terms here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "loom/device.hpp"
#include "loom/kinds/model.hpp"
#include "loom/quantization.hpp"

namespace loom::training {

struct MemoryInputs {
  std::int64_t num_parameters = 0;   // the model's values
  std::int64_t parameter_bytes = 0;  // their storage (float32 today: 4 each)
  bool bf16_matmuls = false;         // the backend multiplies in bf16: a bf16 copy of each weight
  std::optional<ModelMemory> model;  // the model's own estimate; none: the generic formula
  std::int64_t micro_batch = 1, seq_len = 1;
  // Micro-batches per step on this rank: above 1, the gradients of the earlier ones are set aside
  // (a second copy of every trained value's gradient) while the next one's are computed; FSDP
  // sums them into its shards instead.
  std::int64_t micro_batches = 1;
  std::int64_t lora_rank = 0;  // 0: every parameter is trained
  // lora.base_dtype: how the frozen base is stored (under LoRA only; not f32: no bf16 copies).
  quant::StorageFormat base_format = quant::StorageFormat::f32;
  // The values of the vocabulary-sized tables (the token embedding and an untied output head),
  // and whether a stored base quantizes them too (lora.quantize_embeddings): else an int8 or nf4
  // base keeps them in bf16, as QLoRA with transformers and bitsandbytes does.
  std::int64_t vocab_table_values = 0;
  bool quantize_vocab_tables = false;
  // trainer.init_from is a Hugging Face directory: a stored base is read straight into its format
  // (no float32 loading peak).
  bool base_streams = false;
  // Then what the loading threads hold at once besides the stored base: each the tensor it
  // stores, as the file holds it, mapped and read (twice its bytes in the file), the loading
  // threads' count of the largest.
  std::int64_t stream_in_flight = 0;
  double optimizer_bytes_per_parameter = 8;
  int ranks = 1;
  bool shard_optimizer_state = false;  // ZeRO-1: the state divided by the ranks
  int fsdp = 1;                        // trainer.mesh's fsdp axis: parameters, gradients, state divided
  int tensor = 1;                      // trainer.mesh's tensor axis: the split weights divided too
  bool elementwise_optimizer = true;   // else FSDP keeps whole copies of the parameters a rank updates
  bool ema = false;                    // trainer.ema_decay > 0
  std::int64_t grad_bucket_bytes = 0;  // data parallel: one bucket in flight
  std::int64_t sample_positions = 0;   // the KV cache of a sample; 0: no samples
  bool reference_model = false;        // a frozen copy of the model (DPO)
};

struct MemoryEstimate {
  // loading: the peak while the base is loaded into lora.base_dtype (the float32 base as it is
  // built, initialised and read from a loom init_from; from a Hugging Face init_from, read
  // straight into the format, the stored base and the tensors in flight; 0 with a float32 base).
  std::int64_t loading = 0;
  bool loading_streams = false;  // loading is the stored base and the tensors in flight
  quant::StorageFormat base_format = quant::StorageFormat::f32;
  std::int64_t parameters = 0, matmul_copies = 0, reference = 0, gradients = 0, optimizer_state = 0, activations = 0,
               ema = 0, buckets = 0, kv_cache = 0, overhead = 0;
  // Gradient accumulation's copy of the earlier micro-batches' gradients (MemoryInputs::micro_batches).
  std::int64_t set_aside = 0;
  // FSDP: the units gathered at once (values of the current and the prefetched unit, gradients of
  // the current one and of two being reduced), and the start-up peak (every rank builds the whole
  // model before keeping its shard).
  std::int64_t gathered = 0, setup = 0;
  std::int64_t activations_remat = 0, activations_no_remat = 0;  // both choices, for the advice
  bool remat = false;
  std::int64_t trained_values = 0;
  // Activations and the sampling KV cache are not held at once: the larger counts. The loading
  // peak comes before both: the larger of it and the run's. Every term saturates at
  // kMemoryEstimateCap (a model too large to describe in 64 bits is refused, not wrapped around).
  std::int64_t total() const;
  // "memory estimate per rank: 1.23 GiB (parameters 475 MiB, ...)".
  std::string describe() const;
};

// The process's own memory besides the run's tensors: code, plugins, BLAS and thread buffers,
// the allocator's slack (measured: docs/training.md).
inline constexpr std::int64_t kProcessOverheadBytes = std::int64_t{70} << 20;

// The largest figure a term of the estimate takes (2^58 bytes, 256 PiB: more than any machine
// holds), so that a sum of terms never overflows.
inline constexpr std::int64_t kMemoryEstimateCap = std::int64_t{1} << 58;

// The generic activation formula, for a model without Model::memory(): a GPT-2-like shape of
// `num_parameters` values (width 64 x layers, 12 width^2 per layer).
ModelMemory generic_model_memory(std::int64_t num_parameters, std::int64_t batch, std::int64_t seq);

MemoryEstimate estimate_memory(const MemoryInputs& inputs);

struct AvailableMemory {
  std::int64_t bytes = 0;  // for this rank (the host's, divided by its ranks)
  std::string source;      // "cgroup memory.max 24.0 GiB / 2 ranks on this host"
};
// LOOM_MEMORY_AVAILABLE (bytes, or with a K/M/G suffix: for tests), else the cgroup v2 limit,
// else /proc/meminfo's MemAvailable; divided by the ranks on this host
// (OMPI_COMM_WORLD_LOCAL_SIZE, else every rank). Nullopt when none can be read.
std::optional<AvailableMemory> available_memory(int ranks);
// The memory of the run's tensors: LOOM_MEMORY_AVAILABLE when set, else the free memory of
// `memory`'s device where its buffer type reports one (BufferType::memory: a GPU's), divided by
// the ranks on this host (they share the device), else the host's as above.
std::optional<AvailableMemory> available_memory(int ranks, const BufferType& memory);

// The refusal's text: the figures and what would fit. Empty when `estimate` fits `available`.
std::string memory_refusal(const MemoryInputs& inputs, const MemoryEstimate& estimate,
                           const AvailableMemory& available);

std::string format_bytes(std::int64_t bytes);

}  // namespace loom::training
