#include "train/components.hpp"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "loom/error.hpp"
#include "loom/execution.hpp"
#include "loom/random.hpp"
#include "loom/run/hf_interop.hpp"
#include "loom/run/run_config.hpp"
#include "train/mixture.hpp"

namespace loom::training {

namespace {

// The component of `section`, created from that section of the resolved config less the options
// the run config adds to the section (OptionSpec::section_options), which the run layer reads.
template <class T>
Handle<T> create(const Registry& registry, const Value& config, const char* section) {
  const Value* node = config.find(section);
  if (!node || node->is_null())
    throw UserError("the config has no `" + std::string(section) +
                    "` section: `loom train` needs one (see `loom config schema " + std::string(T::kind) +
                    "` for what is available)");
  Value own = *node;
  if (const OptionSpec* spec = run_config_schema().find(section); spec && spec->section_schema() && own.is_map())
    for (const auto& name : spec->section_schema()->names()) own.erase(name);
  return registry.create<T>(ComponentRef{std::string(T::kind), "", own, section});
}

}  // namespace

RunComponents create_components(const Registry& registry, Value& config) {
  RunComponents c;
  c.backend = create<Backend>(registry, config, "backend");
  // Before anything that creates the model (and with it the kernel): `auto` becomes the kernel for
  // the backend's device in the config the run directory records, and a kernel that computes
  // elsewhere is refused here, before the run directory, the memory estimate and the GEMM probe.
  resolve_attention_kernel(registry, config, *c.backend);
  c.tokenizer = create<Tokenizer>(registry, config, "tokenizer");
  if (const Value* data = config.find("data"); data && is_mixture(*data))
    c.dataset = std::make_shared<MixtureDataset>(registry, *data);
  else
    c.dataset = create<Dataset>(registry, config, "data");
  c.model = create<Model>(registry, config, "model");
  c.optimizer = create<Optimizer>(registry, config, "optimizer");
  const Options optimizer(*config.find("optimizer"), "optimizer");
  c.peak_learning_rate = optimizer.get<double>("learning_rate");
  c.max_grad_norm = optimizer.get_optional<double>("max_grad_norm").value_or(0.0);
  c.schedule = create<LrSchedule>(registry, config, "lr_schedule");
  c.objective = create<Objective>(registry, config, "objective");
  return c;
}

MemoryInputs memory_inputs(const Registry& registry, const Value& config, const RunComponents& c,
                           const Options& trainer, std::int64_t micro_size, int ranks, int fsdp, int tensor,
                           std::int64_t rows) {
  // A second instance of the model, declared but not allocated: its shapes, before the run's own
  // model allocates anything.
  const Handle<Model> probe = create<Model>(registry, config, "model");
  const std::int64_t vocab = c.tokenizer->needs_fit() ? 256 : c.tokenizer->vocab_size();
  probe->build(ModelSetup{vocab, /*allocate=*/false});
  MemoryInputs in;
  in.num_parameters = probe->num_parameters();
  in.parameter_bytes = in.num_parameters * 4;
  in.bf16_matmuls = c.backend->matmul_dtype() == DType::bf16;
  in.micro_batch = micro_size;
  in.seq_len = probe->max_seq_len();
  in.model = probe->memory(in.micro_batch, in.seq_len);
  in.micro_batches = rows > micro_size ? (rows + micro_size - 1) / micro_size : 1;
  const LoraSettings lora = lora_settings(config);
  in.lora_rank = lora.rank;
  in.base_format = lora.base_dtype;
  in.quantize_vocab_tables = lora.quantize_embeddings;
  if (lora.enabled() &&
      (lora.base_dtype == quant::StorageFormat::int8 || lora.base_dtype == quant::StorageFormat::nf4) &&
      !lora.quantize_embeddings) {
    // The vocabulary-sized tables (kept in bf16): the values one more vocabulary entry adds, times
    // the vocabulary, from a second declared instance (with model.vocab_size one larger if it is set).
    Value more = config;
    if (Value* model = more.find("model"); model && model->is_map())
      if (Value* v = model->find("vocab_size"); v && !v->is_null()) *v = Value(probe->vocab_size() + 1);
    const Handle<Model> wider = create<Model>(registry, more, "model");
    wider->build(ModelSetup{probe->vocab_size() + 1, /*allocate=*/false});
    in.vocab_table_values =
        std::max<std::int64_t>(0, wider->num_parameters() - in.num_parameters) * probe->vocab_size();
  }
  const std::filesystem::path hf_from = hf_source_dir(trainer.get<std::string>("init_from"));
  in.base_streams = !hf_from.empty();
  if (in.base_streams && lora.enabled() && lora.base_dtype != quant::StorageFormat::f32) {
    // Each loading thread holds a tensor mapped and read as the files hold it: the largest ones.
    std::vector<std::int64_t> bytes = hf_tensor_bytes(hf_from);
    std::sort(bytes.rbegin(), bytes.rend());
    const auto threads = static_cast<std::size_t>(std::max(1, default_execution_context().num_threads()));
    for (std::size_t i = 0; i < bytes.size() && i < threads; ++i) in.stream_in_flight += 2 * bytes[i];
  }
  in.optimizer_bytes_per_parameter = c.optimizer->state_bytes_per_parameter();
  in.ranks = ranks;
  in.shard_optimizer_state = trainer.get<bool>("shard_optimizer_state");
  in.fsdp = fsdp;
  in.tensor = tensor;
  in.elementwise_optimizer = c.optimizer->elementwise();
  in.ema = trainer.get<double>("ema_decay") > 0;
  in.grad_bucket_bytes = static_cast<std::int64_t>(trainer.get<double>("grad_bucket_mb") * 1024 * 1024);
  if (const std::int64_t length = trainer.get<std::int64_t>("sample_length"); length > 0)
    in.sample_positions = std::min(in.seq_len, length + 64);  // the prompt's tokens besides
  in.reference_model = c.objective->needs_reference_model();
  return in;
}

void build_model_and_data(RunComponents& c, std::int64_t batch_size, std::uint64_t seed, int tensor_rank,
                          int tensor_size) {
  const std::int64_t seq_len = c.model->max_seq_len();
  auto prepare_data = [&](std::int64_t vocab_size) {
    with_context("while preparing the data (data)", [&] {
      c.dataset->prepare(DatasetSetup{c.tokenizer, seq_len, batch_size, stream_key(seed, 2, 0), vocab_size});
    });
  };
  ModelSetup setup;
  setup.tensor_rank = tensor_rank;
  setup.tensor_size = tensor_size;
  // The parameters in the backend's memory, initialised by its kernels on a device.
  setup.backend = c.backend.get();
  if (c.tokenizer->needs_fit()) {
    prepare_data(0);
    setup.vocab_size = c.tokenizer->vocab_size();
    c.model->build(setup);
  } else {
    setup.vocab_size = c.tokenizer->vocab_size();
    c.model->build(setup);
    prepare_data(c.model->vocab_size());
  }
}

std::string choose_trained_parameters(RunComponents& c, const Value& config, const Options& trainer) {
  const LoraSettings lora = lora_settings(config);
  check_lora_training(lora);
  if (lora.enabled())
    c.lora = with_context("while attaching the LoRA adapters (lora)",
                          [&] { return std::make_shared<LoraAdapters>(*c.model, *c.backend, lora); });
  const std::vector<ModelParameter> all = c.model->parameters();
  c.parameters = select_trainable(all, trainer.get<std::vector<std::string>>("trainable"),
                                  trainer.get<std::vector<std::string>>("frozen"), lora.enabled());
  const bool chosen = !trainer.get<std::vector<std::string>>("trainable").empty() ||
                      !trainer.get<std::vector<std::string>>("frozen").empty();
  if (!c.lora && !chosen) return {};
  std::int64_t total = 0, trained = 0;
  for (const auto& p : all) total += p.parameter->shape().numel();
  if (c.lora)
    for (const auto& p : c.lora->parameters()) c.parameters.push_back(p);
  for (const auto& p : c.parameters) trained += p.parameter->shape().numel();
  std::string line = c.lora ? "lora: " + std::to_string(c.lora->target_names().size()) + " rank-" +
                                  std::to_string(lora.rank) + " adapters, "
                            : "frozen: " + std::to_string(all.size() - c.parameters.size()) + " of " +
                                  std::to_string(all.size()) + " parameters, ";
  char share[32];
  std::snprintf(share, sizeof share, "%.2f%%", 100.0 * static_cast<double>(trained) / static_cast<double>(total));
  return line + std::to_string(trained) + " trained values (" + share + " of the model's " + std::to_string(total) +
         ")";
}

namespace {

// trainer.init_from under tensor parallelism: the weights are read into a whole model (initialised
// first, as one process's is, for what the source does not hold), and each parameter's shard
// copied out of it. The whole model lives only while it loads.
std::vector<std::string> load_initial_shards(RunComponents& c, Model& target, const std::string& from,
                                             WeightsChoice choice, std::uint64_t seed) {
  const Handle<Model> whole = c.whole_model();
  whole->initialize(seed);
  std::vector<std::string> notes = load_initial_weights(*whole, from, choice);
  std::unordered_map<std::string, Parameter*> by_name;
  for (const auto& p : whole->parameters()) by_name[p.parameter->name()] = p.parameter;
  const auto plan = target.parallel_plan();
  if (!plan) throw InternalError("load_initial_shards: a model without a parallel plan");
  for (const PlannedParameter& e : *plan) {
    const auto it = by_name.find(e.parameter->name());
    if (it == by_name.end() || !(it->second->shape() == e.whole))
      throw InternalError("load_initial_shards: '" + e.parameter->name() + "' is not " + e.whole.str() +
                          " in the whole model");
    tensor_plan::extract_shard(it->second->data().data<float>(), e.whole, e.placement, c.tensor->rank(),
                               c.tensor->size(), e.parameter->data().data<float>());
  }
  notes.push_back("tensor rank " + std::to_string(c.tensor->rank()) + " took its shards of the whole weights");
  return notes;
}

}  // namespace

std::vector<std::string> initialize_parameters(RunComponents& c, const Options& trainer, std::uint64_t seed,
                                               bool init_from, const std::function<bool(const Parameter*)>& optimizes,
                                               const std::function<void()>& shard) {
  const std::string from = init_from ? trainer.get<std::string>("init_from") : std::string();
  // QLoRA from a Hugging Face directory: its weights go straight into lora.base_dtype. The
  // directory holds every parameter (import_hf refuses one that does not), so the model's own
  // initialisation, which would write every float32 value, is skipped.
  StoredWeights stored;
  const bool streams = c.lora && c.lora->settings().base_dtype != quant::StorageFormat::f32 && !from.empty() &&
                       !hf_source_dir(from).empty();
  if (streams) {
    stored.format = c.lora->settings().base_dtype;
    stored.stores = [&c](const Parameter* p) { return c.lora->stores(p); };
    stored.format_of = [&c](const Parameter* p) { return c.lora->format_of(p); };
  } else {
    c.model->initialize(seed);
  }
  std::vector<std::string> notes;
  if (!from.empty())
    notes = with_context("while loading trainer.init_from '" + from + "'", [&] {
      if (c.tensor)
        return load_initial_shards(
            c, *c.model, from,
            parse_weights_choice(trainer.get<std::string>("init_from_weights"), "trainer.init_from_weights"), seed);
      return load_initial_weights(
          *c.model, from,
          parse_weights_choice(trainer.get<std::string>("init_from_weights"), "trainer.init_from_weights"),
          streams ? &stored : nullptr);
    });
  if (c.lora) c.lora->initialize(seed);
  if (c.parameters.empty()) c.parameters = c.model->parameters();
  if (shard) shard();

  std::vector<OptimizerParameter> opt_params;
  const bool decay_emb = trainer.get<bool>("decay_embeddings"), decay_norm = trainer.get<bool>("decay_norms"),
             decay_bias = trainer.get<bool>("decay_biases");
  for (const auto& p : c.parameters) {
    if (optimizes && !optimizes(p.parameter)) continue;
    bool decay = true;
    switch (p.role) {
      case ParameterRole::weight:
        decay = true;
        break;
      case ParameterRole::bias:
        decay = decay_bias;
        break;
      case ParameterRole::norm:
        decay = decay_norm;
        break;
      case ParameterRole::embedding:
        decay = decay_emb;
        break;
    }
    // Under tensor parallelism a whole-matrix optimizer updates whole copies of the split matrices.
    Parameter* updated = c.tensor && !c.optimizer->elementwise() ? c.tensor->whole_copy(p.parameter) : p.parameter;
    opt_params.push_back({updated, decay, p.role});
  }
  c.optimizer->init(OptimizerSetup{std::move(opt_params), c.backend.get()});
  return notes;
}

std::function<Handle<Model>()> whole_model_factory(const Registry& registry, const Value& config,
                                                   const RunComponents& c) {
  return [&registry, config, &c] {
    Handle<Model> whole = create<Model>(registry, config, "model");
    whole->build(ModelSetup{c.tokenizer->vocab_size()});
    return whole;
  };
}

void create_reference_model(RunComponents& c, const Registry& registry, const Value& config, const Options& trainer,
                            std::uint64_t seed) {
  if (!c.objective->needs_reference_model()) return;
  with_context("while making the reference model of the objective", [&] {
    c.reference = create<Model>(registry, config, "model");
    ModelSetup setup;
    setup.vocab_size = c.tokenizer->vocab_size();
    setup.backend = c.backend.get();
    if (c.tensor) {  // split as the trained model is: the objective runs both through one Ops
      setup.tensor_rank = c.tensor->rank();
      setup.tensor_size = c.tensor->size();
    }
    c.reference->build(setup);
    c.reference->initialize(seed);
    if (const std::string from = trainer.get<std::string>("init_from"); !from.empty()) {
      const WeightsChoice choice =
          parse_weights_choice(trainer.get<std::string>("init_from_weights"), "trainer.init_from_weights");
      if (c.tensor)
        load_initial_shards(c, *c.reference, from, choice, seed);
      else
        load_initial_weights(*c.reference, from, choice);
    }
    for (auto& p : c.reference->parameters()) p.parameter->set_requires_grad(false);
  });
}

void start_trackers(RunComponents& c, const Registry& registry, const Options& trainer, const RunInfo& run) {
  for (const auto& name : trainer.get<std::vector<std::string>>("trackers")) {
    auto tracker = registry.create<Tracker>(ComponentRef{"tracker", name, Value(name), "trainer.trackers"});
    tracker->start(run);
    c.trackers.push_back(std::move(tracker));
  }
}

}  // namespace loom::training
