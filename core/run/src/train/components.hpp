// The components of a training run, built from the config through the registry, and made ready
// to train: data prepared, model built and initialised, optimizer given its parameters.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/registry.hpp"
#include "loom/kinds/backend.hpp"
#include "loom/kinds/dataset.hpp"
#include "loom/kinds/lr_schedule.hpp"
#include "loom/kinds/model.hpp"
#include "loom/kinds/objective.hpp"
#include "loom/kinds/optimizer.hpp"
#include "loom/kinds/tokenizer.hpp"
#include "loom/kinds/tracker.hpp"
#include "loom/options.hpp"
#include "loom/run/lora.hpp"
#include "train/data_parallel.hpp"
#include "train/fsdp.hpp"
#include "train/memory_estimate.hpp"
#include "train/strategy.hpp"
#include "train/tensor_parallel.hpp"

namespace loom::training {

struct RunComponents {
  Handle<Backend> backend;
  Handle<Tokenizer> tokenizer;
  Handle<Dataset> dataset;
  Handle<Model> model;
  Handle<Optimizer> optimizer;
  Handle<LrSchedule> schedule;
  std::vector<Handle<Tracker>> trackers;
  Handle<Objective> objective;  // what the step minimises
  Handle<Model> reference;      // the frozen starting weights, when the objective needs them
  // The trained parameters: the model's (less those trainer.frozen / trainable freeze), or under
  // LoRA the adapters. Set by choose_trained_parameters (or initialize_parameters: all).
  std::vector<ModelParameter> parameters;
  std::shared_ptr<LoraAdapters> lora;  // under lora.rank > 0
  // The data axis: the gradients' buckets, or ZeRO-1's shards of the optimizer state, summed over
  // the world's data group (set_up_run's attach_gradients; a strategy's, train/strategy.hpp).
  std::shared_ptr<DataParallel> data_parallel;
  // Under trainer.mesh's fsdp axis: the model's parameters live in sharded units, `parameters`
  // are this rank's slices (or whole owned parameters), and every Ops that runs the model must be
  // attached to it (FullySharded::attach) on every rank.
  std::shared_ptr<FullySharded> fsdp;
  // Under trainer.mesh's tensor axis: the model holds this rank's shards of the split parameters,
  // and every Ops that runs it must carry the tensor group (TensorParallel::attach) on every
  // member.
  std::shared_ptr<TensorParallel> tensor;
  // What the mesh's parallelisms do to a step (train/strategy.hpp), built once from the mesh after
  // the model is sharded (build_strategies); the step, evaluation and the log iterate over them.
  Strategies strategies;
  // Under the tensor axis: a new whole model of the config (built, not initialised), into which
  // trainer.init_from is read before each rank copies its shards out of it.
  std::function<Handle<Model>()> whole_model;
  // What checkpoints and the final weights hold: every parameter of the model, or under LoRA the
  // adapters alone (the base comes from trainer.init_from).
  std::vector<ModelParameter> saved_parameters() const { return lora ? parameters : model->parameters(); }
  // The optimizer section's options that the trainer applies (not the optimizer plugin's).
  double peak_learning_rate = 0;  // optimizer.learning_rate, which the schedule shapes
  double max_grad_norm = 0;       // optimizer.max_grad_norm; 0 (or null in the config): no clip
};

// Backend, tokenizer, dataset, model, optimizer and lr_schedule from their sections of the
// resolved `config`, in that order. A missing section is a UserError.
RunComponents create_components(const Registry& registry, Value& config);

// What the start-up memory estimate needs (memory_estimate.hpp), from a declared but unallocated
// instance of the configured model and the options: nothing of the run is allocated. `rows` is
// the rows of a step on this rank (micro-batches of micro_size).
MemoryInputs memory_inputs(const Registry& registry, const Value& config, const RunComponents& c,
                           const Options& trainer, std::int64_t micro_size, int ranks, int fsdp = 1, int tensor = 1,
                           std::int64_t rows = 0);

// Prepares the data (batches of batch_size x the model's context, in the order of the data
// stream of `seed`) and builds the model for the tokenizer's vocabulary. A tokenizer that learns
// its vocabulary from the training text (char) is fitted when the dataset prepares, so the data
// comes first; otherwise the model is built first and the dataset checks every id against the
// model's vocabulary.
// `tensor_rank`, `tensor_size`: the model's shard along the mesh's tensor axis (ModelSetup).
void build_model_and_data(RunComponents& components, std::int64_t batch_size, std::uint64_t seed, int tensor_rank = 0,
                          int tensor_size = 1);

// Applies the `lora` section and trainer.trainable / trainer.frozen to the built model: the
// adapters are created, the frozen parameters stop requiring gradients, and `parameters` lists
// the trained ones. Returns a line for the log under LoRA, trainable or frozen (else empty).
std::string choose_trained_parameters(RunComponents& components, const Value& config, const Options& trainer);

// Initialises the model's weights from `seed`, then (when `init_from` and trainer.init_from is
// set) loads them from there, and hands the optimizer its parameters, each with the weight decay
// trainer.decay_embeddings, decay_norms and decay_biases give its role. Returns what init_from
// read, for the log. `optimizes`, when given, picks the parameters this process's optimizer
// updates (a rank's shard of a run with trainer.shard_optimizer_state); the others get no
// optimizer state here. `shard`, when given, runs once the weights are loaded and before the
// optimizer gets its parameters: fully sharded data parallelism moves the model into its units and
// replaces `parameters` with this rank's slices.
std::vector<std::string> initialize_parameters(RunComponents& components, const Options& trainer, std::uint64_t seed,
                                               bool init_from,
                                               const std::function<bool(const Parameter*)>& optimizes = {},
                                               const std::function<void()>& shard = {});

// When the objective needs one (Objective::needs_reference_model), a second instance of the
// model section, built like the first and holding the run's starting weights: the initialisation
// of `seed`, then trainer.init_from, also when the run resumes (the reference never trains).
// Its parameters take no gradient.
// What RunComponents::whole_model calls: the config's model, built whole (its vocabulary from
// the components' tokenizer), not initialised.
std::function<Handle<Model>()> whole_model_factory(const Registry& registry, const Value& config,
                                                   const RunComponents& components);

void create_reference_model(RunComponents& components, const Registry& registry, const Value& config,
                            const Options& trainer, std::uint64_t seed);

// Creates the trackers trainer.trackers names and starts them on the run.
void start_trackers(RunComponents& components, const Registry& registry, const Options& trainer, const RunInfo& run);

}  // namespace loom::training
