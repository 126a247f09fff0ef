#include "train/run_setup.hpp"

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <iomanip>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "loom/error.hpp"
#include "loom/run/generate.hpp"
#include "loom/run/run_config.hpp"
#include "loom/run/trainer.hpp"
#include "train/memory_estimate.hpp"
#include "train/resume.hpp"

namespace loom::training {

namespace {

// trainer.microbatch_size, or Levanter's per_device_parallelism, or the whole batch: a rank's
// whole slice of it when `ranks` share each batch.
std::int64_t micro_batch_size(const Options& trainer, std::int64_t batch_size, int ranks) {
  std::int64_t micro_size = trainer.get<std::int64_t>("microbatch_size");
  const std::int64_t per_device = trainer.get<std::int64_t>("per_device_parallelism");
  if (per_device > 0 && micro_size > 0 && per_device != micro_size)
    throw UserError("trainer.microbatch_size (" + std::to_string(micro_size) +
                    ") and trainer.per_device_parallelism (" + std::to_string(per_device) +
                    ") disagree: set one of them");
  if (micro_size == 0) micro_size = per_device > 0 ? per_device : std::max<std::int64_t>(1, batch_size / ranks);
  if (batch_size % micro_size != 0)
    throw UserError("trainer.train_batch_size (" + std::to_string(batch_size) +
                    ") must be a multiple of the micro-batch size (" + std::to_string(micro_size) + ")");
  return micro_size;
}

// The objective's required batch traits against the dataset's: a dataset that does not give what
// the loss reads (DPO over plain text: unrelated rows taken as pairs) would train on nonsense and
// exit 0, so it is refused before anything trains, naming both.
void check_batch_traits(const Objective& objective, const Dataset& dataset, const Value& config) {
  const std::vector<std::string> given = dataset.batch_traits();
  const Value* data_type = config.at_path("data.type");
  const std::string data = data_type && data_type->is_string() ? "data.type '" + data_type->as_string() + "'"
                                                               : "a mixture of datasets (data.mixture)";
  for (const auto& trait : objective.required_batch_traits()) {
    if (std::find(given.begin(), given.end(), trait) != given.end()) continue;
    std::string declared;
    for (const auto& g : given) declared += (declared.empty() ? "'" : ", '") + g + "'";
    std::string message =
        "objective.type '" + config.at_path("objective.type")->as_string() + "' needs batches with the trait '" +
        trait + "', and " + data + " does not give them (its batches " +
        (declared.empty() ? std::string("are windows of tokens, with no trait") : "have the traits " + declared) + ")";
    if (trait == batch_traits::preference_pairs)
      message +=
          ": preference pairs are rows 2i and 2i + 1 holding one prompt with its chosen and its rejected response; "
          "use a dataset of them (data.type: preference)";
    throw UserError(message);
  }
}

// The state.json part of a resume: the step, the skip rule's window, the log interval.
void restore_state(Run& run, const checkpoint::TrainRecord& r) {
  TrainState& s = run.state;
  s.step = r.step;
  s.skipped_steps = r.skipped_steps;
  if (s.skip_rule && r.has_skip_window) s.skip_rule->restore(r.skip_losses, r.skip_grad_norms);
  s.interval.steps = r.interval_steps;
  s.interval.loss_sum = r.interval_loss;
  s.interval.trained_tokens = r.interval_trained_tokens;
  s.interval.seconds = r.interval_seconds;
  s.interval.train_seconds = r.train_seconds;
  s.interval.elapsed_before = r.elapsed_seconds;
}

// Stage 1: the ranks first, from the raw config's `collective` (the registry validates it): only
// rank 0 prints and writes files, and an error the ranks share is printed once, by rank 0. Then
// the config resolved, the mesh, and the components created and checked against each other.
Run resolve_and_check(Runtime& runtime, ProgressPrinter& progress, std::function<void(const Error&)> report_error) {
  Run run;
  run.world = std::make_shared<World>(create_collective(runtime.registry(), runtime.raw_config()));
  World& world = *run.world;
  world.set_error_reporter(std::move(report_error));
  if (!world.is_primary()) progress.silence();
  world.together([&] { run.config = resolved_run_config(runtime); });
  run.trainer = Options(*run.config.find("trainer"), "trainer");
  const Options& trainer = run.trainer;
  run.seed = static_cast<std::uint64_t>(trainer.get<std::int64_t>("seed"));
  run.num_steps = trainer.get<std::int64_t>("num_train_steps");
  run.batch_size = trainer.get<std::int64_t>("train_batch_size");
  // All must agree on the config (a difference is the same error on every rank), and on the mesh,
  // which is checked before anything is allocated (every rank finds the same fault).
  world.together([&] { world.check_same_config(run.config); });
  Mesh mesh;
  world.together([&] { mesh = resolve_mesh(trainer, world.size()); });
  world.set_mesh(mesh);

  RunComponents& c = run.components;
  world.together([&] {
    run.micro_size = micro_batch_size(trainer, run.batch_size, world.replicas());
    world.check_batch(run.batch_size, run.micro_size);
    c = create_components(runtime.registry(), run.config);
    check_batch_traits(*c.objective, *c.dataset, run.config);
    check_lora_training(lora_settings(run.config));
    // FSDP's units live in host memory (the caching allocator's blocks change under them).
    if (mesh.size(MeshAxis::tensor) > 1 && lora_settings(run.config).enabled())
      throw UserError(
          "trainer.mesh (" + mesh.describe() +
          "): LoRA (lora.rank > 0) does not combine with tensor parallelism yet; use trainer.mesh.tensor: 1");
    if (mesh.size(MeshAxis::tensor) > 1 && &c.backend->buffer_type() != &host_buffer_type())
      throw UserError("trainer.mesh (" + mesh.describe() +
                      "): tensor parallelism's collectives compute on host memory, but backend '" +
                      std::string(c.backend->name()) + "' computes in " + c.backend->buffer_type().device().str() +
                      " memory; use the cpu or reference backend, or trainer.mesh.tensor: 1");
    if (mesh.size(MeshAxis::tensor) > 1 && mesh.size(MeshAxis::fsdp) > 1 && !c.optimizer->elementwise())
      throw UserError("trainer.mesh (" + mesh.describe() + "): optimizer " +
                      run.config.at_path("optimizer.type")->as_string() +
                      " updates each matrix whole, which needs whole copies of the split matrices under tensor "
                      "parallelism and whole owners under an fsdp axis; the two together are not supported yet: use "
                      "an elementwise optimizer (adamw, sgd, lion), or drop one of the axes");
    if (mesh.size(MeshAxis::fsdp) > 1 && &c.backend->buffer_type() != &host_buffer_type())
      throw UserError("trainer.mesh (" + mesh.describe() +
                      "): fully sharded data parallelism keeps the units in host "
                      "memory, but backend '" +
                      std::string(c.backend->name()) + "' computes in " + c.backend->buffer_type().device().str() +
                      " memory; use the cpu or reference backend, or trainer.mesh.fsdp: 1");
    if (const std::int64_t group = c.objective->rows_per_example(); group > 1 && run.micro_size % group != 0)
      throw UserError(
          "the objective (" + run.config.at_path("objective.type")->as_string() + ") takes rows in groups of " +
          std::to_string(group) + " (a preference pair) that must stay in one micro-batch, but the " +
          "micro-batch size is " + std::to_string(run.micro_size) +
          ": set trainer.microbatch_size (and the batch size per rank) to a multiple of " + std::to_string(group));
  });
  return run;
}

// Stage 2: the memory estimate, before the run directory and the model exist: a run that cannot
// fit is refused with nothing allocated or written. Returns the estimate's line for the header.
std::string estimate_run_memory(Runtime& runtime, Run& run, ProgressPrinter& progress) {
  World& world = *run.world;
  const RunComponents& c = run.components;
  const Options& trainer = run.trainer;
  std::string memory_line;
  world.together([&] {
    const MemoryInputs inputs = with_context("while estimating the run's memory", [&] {
      return memory_inputs(runtime.registry(), run.config, c, trainer, run.micro_size, world.size(),
                           world.mesh().size(MeshAxis::fsdp), world.mesh().size(MeshAxis::tensor),
                           world.row_count(run.batch_size));
    });
    const MemoryEstimate estimate = estimate_memory(inputs);
    memory_line = estimate.describe();
    const std::string check = trainer.get<std::string>("memory_check");
    if (check == "off") return;
    const std::optional<AvailableMemory> available = available_memory(world.size(), c.backend->buffer_type());
    if (!available) return;
    const std::string refusal = memory_refusal(inputs, estimate, *available);
    if (refusal.empty()) return;
    if (check == "refuse") throw UserError(refusal);
    progress.say("warning: " + refusal);
  });
  return memory_line;
}

// Where a run goes and whether it continues one (stage 3's outcome).
struct ResumePlan {
  std::optional<ResumePoint> point;   // the checkpoint it resumes from
  std::vector<std::string> warnings;  // of its config against this one, printed once it has loaded
  bool finished = false;              // resumed at its last step: nothing to train
  // The name that the staging directory of a checkpoint's parts shares on every rank.
  std::string staging_token;
};

// Stage 3: the run directory opened (a new run) or resumed: rank 0 decides, and names the
// checkpoint to the other ranks (which read it from the same path: one machine, or a shared file
// system). Rank 0 gets its checkpoint writer (the ranks that write parts get theirs once the
// strategies say so: build_and_shard).
ResumePlan open_run_directory(Run& run, ProgressPrinter& progress) {
  World& world = *run.world;
  const Options& trainer = run.trainer;
  ResumePlan plan;
  std::string& staging_token = plan.staging_token;
  staging_token = std::to_string(::getpid());
  // Rank 0's alone; an error of it (a run directory in use) is printed by rank 0 once the others
  // know of it.
  world.together([&] {
    if (!world.is_primary()) return;
    std::vector<int> peers;
    for (const PeerProcess& p : world.same_host_peers()) peers.push_back(p.pid);
    run.directory = RunDirectory::open(trainer, run.config, peers);
    run.checkpoint = checkpoint_settings(trainer, run.directory.path());
    checkpoint::CheckpointStore store(run.checkpoint.dir, run.checkpoint.retention);
    store.remove_leftovers();
    ResumeDecision decision = decide_resume(trainer, run.directory, store, run.num_steps);
    for (const auto& w : decision.warnings) progress.say("warning: " + w);
    plan.point = std::move(decision.point);
    if (plan.point && trainer.get<std::string>("run_id").empty() && !plan.point->record.run_id.empty())
      run.directory.adopt_run_id(plan.point->record.run_id);
    if (decision.finished) {
      plan.finished = true;
      progress.say("run " + run.directory.run_id() + " in " + run.directory.path().string() + " finished at step " +
                   std::to_string(plan.point->record.step) + " (checkpoint " + plan.point->dir.string() +
                   "): nothing to train; raise trainer.num_train_steps to train it further");
    }
    // Printed once the checkpoint has loaded: a refusal comes without them.
    if (plan.point && !plan.finished)
      plan.warnings =
          check_resume_config(*plan.point, config_file_text(run.directory.run_id(), run.config), run.num_steps);
    if (!plan.finished)
      run.checkpoints =
          std::make_unique<checkpoint::CheckpointWriter>(std::move(store), run.checkpoint.async, staging_token);
  });
  std::string run_id = run.directory.run_id(), run_dir = run.directory.path().string(),
              from = plan.point ? plan.point->dir.string() : "";
  world.broadcast(run_id);
  world.broadcast(run_dir);
  world.broadcast(from);
  world.broadcast(staging_token);
  plan.finished = world.max_over_ranks(plan.finished ? 1 : 0) != 0;
  world.together([&] {
    if (world.is_primary()) return;
    // No directory of their own: the run's id and paths, for the config text a checkpoint is
    // compared with and for the messages.
    run.directory.adopt_run_id(run_id);
    // Every rank holds the run directory's lock while it lives: a second run is refused while any
    // rank of this one is still there (a launcher that died leaving its ranks running).
    run.directory.share_lock(run_dir);
    run.checkpoint = checkpoint_settings(trainer, run_dir);
    if (!from.empty())
      plan.point =
          with_context("while reading checkpoint " + from + " (named by rank 0)", [&] { return read_point(from); });
  });
  return plan;
}

// Gradient storage: flat buckets, or this rank's shard of a ZeRO-1 run; under FSDP the units'
// storage comes once the weights are loaded (shard_units).
void attach_gradients(Run& run) {
  World& world = *run.world;
  RunComponents& c = run.components;
  const auto bucket_bytes = static_cast<std::int64_t>(run.trainer.get<double>("grad_bucket_mb") * 1024 * 1024);
  c.data_parallel = std::make_shared<DataParallel>(world);
  DataParallel& data = *c.data_parallel;
  data.set_backend(*c.backend);
  if (world.fully_sharded()) {
    if (c.lora && c.lora->settings().base_dtype != quant::StorageFormat::f32)
      throw UserError("trainer.mesh (" + world.mesh().describe() + "): lora.base_dtype " +
                      quant::storage_format_name(c.lora->settings().base_dtype) +
                      " stores the frozen base whole on every rank, where fully sharded data parallelism shards "
                      "it; use one or the other (lora.base_dtype: f32 with trainer.mesh.fsdp > 1, or fsdp 1)");
    // The base is sharded in units like any frozen weight; the adapters are replicated, their
    // gradients summed over every rank in buckets (the adapters are small).
    if (c.lora) {
      data.attach(c.parameters, bucket_bytes);
      c.lora->evaluate_through_table();
    }
  } else if (run.trainer.get<bool>("shard_optimizer_state")) {
    data.shard(c.parameters);
  } else {
    data.attach(c.parameters, bucket_bytes);
  }
}

// FSDP, once the weights are initialised: every rank starts from the same weights before each
// keeps its shard of them. The model's trained parameters go into units; others (LoRA's
// adapters) stay whole.
void shard_units(Run& run) {
  World& world = *run.world;
  RunComponents& c = run.components;
  world.check_same_parameters(c.parameters);
  const Options fsdp = run.trainer.object("fsdp");
  std::vector<ModelParameter> model_trained, replicated;
  std::unordered_set<const Parameter*> of_model;
  for (const auto& p : c.model->parameters()) of_model.insert(p.parameter);
  for (const auto& p : c.parameters) (of_model.contains(p.parameter) ? model_trained : replicated).push_back(p);
  // The ranks of this rank's tensor coordinate sum what they computed (every rank without a
  // tensor axis); each fsdp group shards its tensor-parallel shards.
  c.fsdp = std::make_shared<FullySharded>(
      world.replica_group(), world.fsdp_group(), world.data_group(), *c.model, model_trained,
      FsdpSettings{fsdp.get<bool>("reshard_after_forward"), fsdp.get<bool>("prefetch"), c.optimizer->elementwise(),
                   c.tensor ? &world.collective() : nullptr});
  c.parameters = c.fsdp->trained();
  c.parameters.insert(c.parameters.end(), replicated.begin(), replicated.end());
  if (c.tensor)
    for (const ParameterSlice& sl : c.fsdp->slices()) c.tensor->alias(sl.piece, sl.model);
}

// The lines of the parameters a run trains and of its quantised base, once they hold their values.
void say_trained_parameters(const RunComponents& c, const std::string& trained_line, ProgressPrinter& progress) {
  // QLoRA: the frozen base weights, now holding their values, in lora.base_dtype.
  if (c.lora)
    if (const auto [stored, f32] = c.lora->store_base(); stored > 0) {
      std::ostringstream line;
      line << "lora.base_dtype " << quant::storage_format_name(c.lora->settings().base_dtype)
           << ": the frozen base weights take " << std::fixed << std::setprecision(1)
           << static_cast<double>(stored) / (1024.0 * 1024.0) << " MiB instead of "
           << static_cast<double>(f32) / (1024.0 * 1024.0) << " MiB";
      progress.say(line.str());
    }
  if (!trained_line.empty()) {
    std::int64_t state_bytes = 0;
    for (const auto& [name, tensor] : c.optimizer->state()) state_bytes += tensor.numel() * std::int64_t{4};
    std::ostringstream line;
    line << trained_line << "; optimizer state " << std::fixed << std::setprecision(1)
         << static_cast<double>(state_bytes) / (1024.0 * 1024.0) << " MiB";
    progress.say(line.str());
  }
}

// Stage 4: each rank builds its model and data, shards them over the mesh, and loads its weights
// and state: an error of one rank (a file missing on its node) is printed by that rank, one every
// rank has by rank 0. Then the weight average (trainer.ema_decay) starts at the weights, or
// continues the checkpoint's.
void build_and_shard(Runtime& runtime, Run& run, const ResumePlan& plan, ProgressPrinter& progress) {
  World& world = *run.world;
  RunComponents& c = run.components;
  const Options& trainer = run.trainer;
  const std::optional<ResumePoint>& resume = plan.point;
  std::vector<std::pair<std::string, Tensor>> saved_average;
  world.together([&] {
    run.seq_len = c.model->max_seq_len();
    build_model_and_data(c, run.batch_size, run.seed, world.tensor_group()->rank(), world.tensor_group()->size());
    if (world.tensor_parallel()) {
      c.tensor = std::make_shared<TensorParallel>(world.tensor_group(), *c.model,
                                                  run.config.at_path("model.type")->as_string());
      progress.say(c.tensor->describe());
      c.whole_model = whole_model_factory(runtime.registry(), run.config, c);
    }
    // A schedule whose options fit no run says so now; one it adapts to this run (a warmup clamped
    // to a shortened run) says what it changed.
    for (const auto& w :
         with_context("while checking the lr_schedule", [&] { return c.schedule->check(run.num_steps); }))
      progress.say("warning: " + w);
    // What is trained: the model's parameters, less the frozen ones, or under LoRA the adapters.
    const std::string trained_line = choose_trained_parameters(c, run.config, trainer);
    // A LoRA checkpoint holds the adapters alone: the base weights come from init_from again.
    const bool base_from_init = !resume || c.lora;
    if (!base_from_init && !trainer.get<std::string>("init_from").empty())
      progress.say("note: trainer.init_from is ignored: the run resumes from " + resume->dir.string());
    attach_gradients(run);
    if (const std::string note = c.data_parallel->staging_note(); !note.empty()) progress.say(note);
    for (const auto& note : initialize_parameters(
             c, trainer, run.seed, /*init_from=*/base_from_init,
             [&](const Parameter* p) { return c.data_parallel->owns(p); },
             world.fully_sharded() ? std::function<void()>([&] { shard_units(run); }) : std::function<void()>()))
      progress.say("init_from: " + note);
    say_trained_parameters(c, trained_line, progress);
    create_reference_model(c, runtime.registry(), run.config, trainer, run.seed);
    if (trainer.get<bool>("skip_bad_steps"))
      run.state.skip_rule.emplace(trainer.get<std::int64_t>("skip_step_window"),
                                  trainer.get<double>("skip_step_sigma"));
    // What the mesh's parallelisms do to each step, once the model is sharded.
    c.strategies = build_strategies(c, world, trainer.get<bool>("overlap_grad_reduce"));
    // The ranks that hold state of their own write their parts of each checkpoint beside rank 0's.
    if (!world.is_primary() && checkpoint_writing(c.strategies) == CheckpointWriting::parts) {
      checkpoint::CheckpointStore store(run.checkpoint.dir, run.checkpoint.retention);
      store.set_rank(world.rank());
      run.checkpoints =
          std::make_unique<checkpoint::CheckpointWriter>(std::move(store), run.checkpoint.async, plan.staging_token);
    }
    if (resume) {
      // What of the checkpoint this rank loads: each strategy's part of it.
      RankShare share;
      for (const auto& strategy : c.strategies) strategy->share(share);
      saved_average = load_checkpoint_tensors(*resume, c, config_file_text(run.directory.run_id(), run.config), share);
      for (const auto& strategy : c.strategies) strategy->checkpoint_loaded();
      with_context("while reading " + (resume->dir / "state.json").string(),
                   [&] { restore_state(run, resume->record); });
      run.resumed_from = resume->record.step;
      for (const auto& w : plan.warnings) progress.say("warning: " + w);
    }
  });

  if (std::none_of(c.strategies.begin(), c.strategies.end(),
                   [](const auto& strategy) { return strategy->holds_different_parameters(); }))
    world.together([&] { world.check_same_parameters(c.parameters); });
  if (const double decay = trainer.get<double>("ema_decay"); decay > 0)
    world.together([&] {
      run.state.ema = std::make_shared<ParameterEma>(decay, c.parameters, *c.backend);
      if (!saved_average.empty())
        with_context("while loading the weight average of " + resume->dir.string(),
                     [&] { run.state.ema->load_state(saved_average); });
      else if (resume)
        progress.say("note: trainer.ema_decay: checkpoint " + resume->dir.string() +
                     " holds no weight average (its run had none); the average starts from its weights");
    });
}

// Stage 5: the run directory changes only now, once a checkpoint to resume from has loaded: a
// refused resume leaves the run as it was. Rank 0's alone.
void write_run_files(Runtime& runtime, Run& run, const ResumePlan& plan, ProgressPrinter& progress) {
  if (!run.world->is_primary()) return;
  RunComponents& c = run.components;
  const std::int64_t from = plan.point ? plan.point->record.step : 0;
  const checkpoint::Discarded discarded = run.checkpoints->store().discard_after(from);
  for (const auto& a : discarded.set_aside) progress.say("warning: " + describe_set_aside(a));
  if (!discarded.removed.empty()) {
    std::string steps;
    for (auto s : discarded.removed) steps += " step-" + std::to_string(s);
    progress.say("note: removed the checkpoints past step " + std::to_string(from) + " in " +
                 run.checkpoints->store().dir().string() + ", which this run replaces:" + steps);
  }
  run.directory.write_config(run.config);
  run.directory.write_tokenizer_state(c.tokenizer->state());
  write_generation_info(run.directory.path(), c.dataset->separator_ends_documents());
  // Trackers keep what the run logged up to its checkpoint (records of steps <= the checkpoint's
  // step) and drop the rest: the resumed run logs those steps again.
  start_trackers(c, runtime.registry(), run.trainer,
                 RunInfo{run.directory.path().string(), run.directory.run_id(), run.config,
                         plan.point ? plan.point->record.step + 1 : 0});
}

// Stage 6: the throughput roof (trainer.peak_flops, else measured), and the header, printed and
// written (header.json).
void measure_and_write_header(Run& run, const std::string& memory_line, const ResumePlan& plan,
                              ProgressPrinter& progress) {
  World& world = *run.world;
  const RunComponents& c = run.components;
  run.flops_per_token = c.model->flops_per_token(run.seq_len);
  run.peak_flops = run.trainer.get<double>("peak_flops");
  const bool probed = run.peak_flops <= 0;
  double bf16_roof = 0;
  if (probed) {
    // The ranks probe together, sharing the host's cores as their steps will.
    world.max_over_ranks(0);
    const PeakFlops peak = probe_peak_flops(*c.backend);
    run.peak_flops = peak.matmul;
    bf16_roof = world.sum_over_ranks(peak.bf16);
  }
  // MFU of a run of several ranks is against every rank's roof together: the tensor axis's
  // members too, which split the model's FLOPs between them.
  run.peak_flops = world.sum_over_ranks(run.peak_flops);

  RunHeader header;
  header.run_id = run.directory.run_id();
  header.run_dir = run.directory.path().string();
  header.model_type = run.config.at_path("model.type")->as_string();
  header.num_parameters = c.model->num_parameters();
  header.vocab_size = c.model->vocab_size();
  header.seq_len = run.seq_len;
  header.flops_per_token = run.flops_per_token;
  header.train_tokens = c.dataset->num_tokens(Split::train);
  header.validation_tokens = c.dataset->num_tokens(Split::validation);
  header.batch_size = run.batch_size;
  header.micro_size = run.micro_size;
  header.num_steps = run.num_steps;
  header.peak_flops = run.peak_flops;
  header.peak_flops_probed = probed;
  header.bf16_peak_flops = bf16_roof;
  header.matmul_dtype = std::string(dtype_name(c.backend->matmul_dtype()));
  header.ranks = world.size();
  header.replicas = world.replicas();
  header.mesh = world.mesh().describe();
  header.sharded = c.data_parallel && c.data_parallel->sharded();
  for (const auto& strategy : c.strategies) strategy->describe(header);
  header.collective = world.collective().describe();
  header.memory = memory_line;
  for (const auto& [name, tensor] : c.optimizer->state())
    header.optimizer_state_bytes += tensor.numel() * static_cast<std::int64_t>(sizeof(float));
  progress.header(header);
  if (world.is_primary()) write_header_json(run.directory.path(), header);
  if (plan.point)
    progress.say("resumed from checkpoint " + plan.point->dir.string() + " at step " +
                 std::to_string(plan.point->record.step) + " of " + std::to_string(run.num_steps));
}

}  // namespace

Run set_up_run(Runtime& runtime, ProgressPrinter& progress, std::function<void(const Error&)> report_error) {
  Run run = resolve_and_check(runtime, progress, std::move(report_error));
  const std::string memory_line = estimate_run_memory(runtime, run, progress);
  const ResumePlan plan = open_run_directory(run, progress);
  if (plan.finished) {
    run.finished = true;
    run.resumed_from = plan.point->record.step;
    return run;
  }
  build_and_shard(runtime, run, plan, progress);
  write_run_files(runtime, run, plan, progress);
  measure_and_write_header(run, memory_line, plan, progress);
  return run;
}

}  // namespace loom::training
