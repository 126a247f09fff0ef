// The `model` kind: a transformer architecture composed from loom's autograd operations.
//
// A model owns its parameters and builds its forward pass from loom::Ops (autograd.hpp); it
// never writes a backward pass. It selects its attention kernel by name from its config (a
// `component` option of kind `attention`, created through CreateContext), never by linking one.
//
// Life cycle, driven by the trainer (or `loom generate`):
//   1. the factory validates options (shapes, head counts) and keeps the attention kernel;
//   2. build(setup) fixes the vocabulary size and allocates every parameter;
//   3. initialize(seed) fills them (or a checkpoint overwrites them through parameters());
//   4. loss() / logits() / the cache methods, any number of times.
// Calls come from one thread (the one running the step).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/autograd.hpp"
#include "loom/component.hpp"
#include "loom/parallel_plan.hpp"

namespace loom {

// What the trainer knows that a model's own options may not.
struct ModelSetup {
  std::int64_t vocab_size = 0;  // from the tokenizer; a model may round it up (padding)
  // false: declare the parameters without allocating them, so that num_parameters() (and
  // nothing else) answers for shapes too large for this machine (a model may ignore it and
  // allocate anyway).
  bool allocate = true;
  // Tensor parallelism (trainer.mesh's tensor axis): this process is member tensor_rank of
  // tensor_size that split the model as its parallel_plan() says. The model allocates and
  // initialises only this member's shard of each split parameter, and its forward pass
  // communicates through Ops::tensor_group. 0 and 1: the whole model (every model accepts
  // those; one without a plan may ignore the fields, and the run layer refuses tensor_size > 1
  // for it).
  int tensor_rank = 0;
  int tensor_size = 1;
  // The backend the model will compute on, or null (host memory). A model may allocate its
  // parameters in this backend's memory (its device) and initialise them through its kernels
  // (model_support.hpp: ParameterStore::allocate, fill_normal and fill_constant with the
  // backend), so that a device backend's parameters never visit the host.
  Backend* backend = nullptr;
};

// How a parameter is used, so the trainer can mask weight decay (none on norms, biases and
// embeddings unless configured).
enum class ParameterRole : std::uint8_t { weight, bias, norm, embedding };

struct ModelParameter {
  Parameter* parameter = nullptr;  // owned by the model; name() is its checkpoint key
  ParameterRole role = ParameterRole::weight;
};

// The keys and values of past positions, for generation one token at a time.
class KvCache {
 public:
  virtual ~KvCache();
  // Positions held so far.
  virtual std::int64_t length() const = 0;
  // Forgets every position (keeps the memory).
  virtual void reset() = 0;
};

// A group of parameters that fully sharded data parallelism gathers, frees and reduces together
// (docs/distributed.md): a transformer block, the embeddings, the output layer. Units list
// disjoint parameters in the order the forward pass first takes them.
struct ShardingUnit {
  std::string name;  // "embeddings", "layer 3", "output": for messages and the log
  std::vector<Parameter*> parameters;
};

// A model's own estimate of its memory, for the trainer's start-up memory estimate
// (docs/training.md, "Memory estimate"). Bytes.
struct ModelMemory {
  // What one training micro-batch of [batch, seq] keeps for its backward pass (the recorded
  // activations and the peak of the transient buffers of one layer), without and with remat.
  std::int64_t activation_bytes = 0;
  std::int64_t activation_bytes_remat = 0;
  bool remat = false;  // whether the model is configured to rematerialise (which of the two applies)
  // The KV cache of one sequence position of one sequence (generation, samples).
  std::int64_t kv_cache_bytes_per_position = 0;
  // The sum over the linear weights LoRA can adapt of (in + out): rank times it is the adapters'
  // values when every linear weight is adapted.
  std::int64_t lora_in_out = 0;
  // The values of its three largest sharding units (sharding_units()), largest first, for fully
  // sharded data parallelism's gathered units; 0 where unknown (the whole model is then one unit).
  std::int64_t largest_units[3] = {0, 0, 0};
};

class Model : public Component {
 public:
  static constexpr std::string_view kind = "model";
  ~Model() override;

  // Allocates every parameter for `setup`. Called once, before anything else. Throws
  // UserError when the setup contradicts the options (a vocabulary larger than a fixed one).
  virtual void build(const ModelSetup& setup) = 0;
  // Fills every parameter with the model's initialisation, drawn from the initialisation stream
  // of `seed` (random.hpp: stream 1). Deterministic.
  virtual void initialize(std::uint64_t seed) = 0;
  // Every parameter, in a stable order, with unique names: the checkpoint keys
  // ("h.0.attn.c_attn.weight").
  virtual std::vector<ModelParameter> parameters() = 0;

  virtual std::int64_t vocab_size() const = 0;
  // The longest sequence it accepts (learned positions, or the RoPE table's length).
  // Valid from creation (before build): the trainer sizes the data with it.
  virtual std::int64_t max_seq_len() const = 0;
  // Parameters counted once (tied embeddings once). Valid after build, allocated or not.
  virtual std::int64_t num_parameters() const = 0;
  // Training FLOPs per token at sequence length `seq_len`: forward and backward, matmuls and
  // attention as documented in docs/models.md. The trainer's MFU uses it.
  virtual double flops_per_token(std::int64_t seq_len) const = 0;
  // Its memory for a training micro-batch of [batch, seq] (ModelMemory). Valid after build,
  // allocated or not. Default: none, and the trainer uses the generic formula of
  // docs/training.md ("Memory estimate").
  virtual std::optional<ModelMemory> memory(std::int64_t batch, std::int64_t seq) const {
    (void)batch;
    (void)seq;
    return std::nullopt;
  }

  // The mean cross-entropy of `targets` given `tokens` (both i32 [batch, seq]; targets equal to
  // -1 are ignored), with attention kept within equal `segments` (i32 [batch, seq], or
  // undefined). A scalar, recorded on ops' tape when it is recording. The model never
  // materialises a second logits-sized buffer (Ops::linear_cross_entropy).
  virtual Tensor loss(Ops& ops, const Tensor& tokens, const Tensor& targets, const Tensor& segments) = 0;
  // The cross-entropy of each target given `tokens`: f32 [batch, seq], 0 where the target is -1,
  // recorded on ops' tape like loss(); a backward pass seeds it with one gradient per target. For
  // objectives that weigh whole sequences (DPO sums a response's log-probabilities). Auxiliary
  // losses (a mixture of experts' router losses) are not part of it. The default computes
  // Ops::cross_entropy (Reduction::none) over logits(), holding every logit at once; CausalLm
  // (model_support.hpp) uses Ops::linear_cross_entropy, which does not.
  virtual Tensor token_losses(Ops& ops, const Tensor& tokens, const Tensor& targets, const Tensor& segments);
  // Logits [batch, seq, vocab] of every position: for evaluation tools and tests.
  virtual Tensor logits(Ops& ops, const Tensor& tokens, const Tensor& segments) = 0;

  // Its sharding units, in forward order, covering every parameter once (Model::parameters()),
  // for fully sharded data parallelism (trainer.mesh's fsdp axis). A model declares them and
  // nothing else: the run layer gathers a unit when an operation first takes one of its
  // parameters and frees it after, so a model never communicates. Valid after build. Default:
  // none, and the whole model is one unit (correct, but every rank then holds all the weights
  // while the forward and backward passes run).
  virtual std::vector<ShardingUnit> sharding_units() { return {}; }

  // Its parallel plan (parallel_plan.hpp): every parameter of parameters(), in the same order,
  // with its whole shape and its placement along the mesh's tensor axis (split by heads, by
  // width, by vocabulary, by experts, or replicated). The trainer, the optimizers, the gradient
  // norm, checkpoints and export read it; nothing else in the core knows a model's layout.
  // Valid after build. Default: none (nullopt), and the run layer refuses trainer.mesh.tensor > 1
  // naming the model.
  virtual std::optional<std::vector<PlannedParameter>> parallel_plan() { return std::nullopt; }

  // Scalars about the last loss() (a mixture of experts' auxiliary losses and per-expert load),
  // by name ("router_aux_loss", "expert_load/3"); the trainer logs them under "model/" with the
  // step's loss. Default: none.
  virtual std::vector<std::pair<std::string, double>> metrics() const { return {}; }

  // A cache for `batch` sequences of up to `max_len` positions.
  virtual std::unique_ptr<KvCache> new_cache(std::int64_t batch, std::int64_t max_len) = 0;
  // Runs `tokens` (i32 [batch, new]) after the positions already in `cache`, appends their keys
  // and values to it, and returns the logits of the last new position, [batch, vocab]. Costs
  // one forward over the new tokens only.
  virtual Tensor next_logits(Ops& ops, const Tensor& tokens, KvCache& cache) = 0;
};

}  // namespace loom
