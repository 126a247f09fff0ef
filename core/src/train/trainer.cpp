// The training loop. See core/include/loom/core/trainer.hpp for the shape of a step.
#include "loom/core/trainer.hpp"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

#include "loom/allocator.hpp"
#include "loom/autograd.hpp"
#include "loom/core/config.hpp"
#include "loom/core/generate.hpp"
#include "loom/error.hpp"
#include "loom/kinds/backend.hpp"
#include "loom/kinds/dataset.hpp"
#include "loom/kinds/lr_schedule.hpp"
#include "loom/kinds/model.hpp"
#include "loom/kinds/optimizer.hpp"
#include "loom/kinds/tokenizer.hpp"
#include "loom/kinds/tracker.hpp"
#include "loom/random.hpp"
#include "loom/safetensors.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace loom {

OptionSchema trainer_schema() {
  OptionSchema s;
  s.integer("seed", 0, "Seed of every random stream: initialisation, data order, dropout, sampling.").min(0);
  s.integer("num_train_steps", 1000, "Optimizer steps to run.").min(1);
  s.integer("train_batch_size", 8, "Sequences per optimizer step (Levanter's default is 512; loom's suits one CPU).")
      .min(1);
  s.integer("microbatch_size", 0,
            "Sequences per forward/backward pass; gradients accumulate over train_batch_size / microbatch_size "
            "passes. 0: the whole batch at once.")
      .min(0);
  s.integer("per_device_parallelism", -1, "Levanter's name for microbatch_size on one device; -1: the whole batch.")
      .min(-1);
  s.integer("log_every", 10, "Steps between log lines, metrics records and progress updates.").min(1);
  s.integer("steps_per_eval", 1000, "Steps between evaluations on the validation split; 0: only at the end.").min(0);
  s.integer("max_eval_batches", 10, "Validation batches per evaluation (the same ones every time); 0: none.").min(0);
  s.integer("sample_every", 0, "Steps between text samples printed during training; 0: only at the end.").min(0);
  s.integer("sample_length", 200, "Tokens per sample; 0: no samples.").min(0);
  s.string("sample_prompt", "", "Text the samples continue (empty: start from the end-of-text token, or a newline).");
  s.number("sample_temperature", 0.8, "Sampling temperature of the samples; 0: greedy.").min(0.0);
  s.integer("sample_top_k", 0, "Keep only the k most likely tokens when sampling; 0: all.").min(0);
  s.number("peak_flops", 0.0, "FLOP/s that MFU is measured against; 0: measure with a short sgemm probe at start-up.")
      .min(0.0);
  s.string("run_dir", "", "Directory of this run's files; empty: runs/<run_id>.");
  s.string("run_id", "", "Name of the run; empty: the config file's name and the start time.");
  s.boolean("crash_on_nan", true, "Stop with an error when the loss or a gradient is NaN.");
  s.boolean("crash_on_inf", true, "Stop with an error when the loss or a gradient is infinite.");
  s.boolean("skip_bad_steps", false,
            "Skip the update of a step whose loss or gradient norm exceeds the rolling mean by skip_step_sigma "
            "standard deviations (Levanter's SkipStepConfig).");
  s.integer("skip_step_window", 128, "Steps in the rolling window of skip_bad_steps.").min(2);
  s.number("skip_step_sigma", 6.0, "Standard deviations above the rolling mean that count as a bad step.")
      .min(0.0, false);
  s.boolean("decay_embeddings", false, "Apply weight decay to embedding tables.");
  s.boolean("decay_norms", false, "Apply weight decay to normalisation weights.");
  s.boolean("decay_biases", false, "Apply weight decay to biases.");
  s.list("trackers", OptionType::string, {"jsonl", "tensorboard"}, "Trackers that record the run's metrics.");
  s.boolean("save_final", true, "Write the final weights (model.safetensors) into the run directory.");
  s.integer("prefetch", 2, "Batches prepared ahead on a separate thread.").min(1).max(64);
  return s;
}

namespace {

bool is_bad(double x, bool nan, bool inf) {
  return (nan && std::isnan(x)) || (inf && std::isinf(x));
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<std::int64_t>(seconds + 0.5);
  std::ostringstream os;
  if (s >= 3600)
    os << s / 3600 << "h" << std::setw(2) << std::setfill('0') << (s % 3600) / 60 << "m";
  else if (s >= 60)
    os << s / 60 << "m" << std::setw(2) << std::setfill('0') << s % 60 << "s";
  else
    os << s << "s";
  return os.str();
}

std::string format_rate(double tokens_per_second) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1);
  if (tokens_per_second >= 1e6)
    os << tokens_per_second / 1e6 << "M";
  else if (tokens_per_second >= 1e3)
    os << tokens_per_second / 1e3 << "k";
  else
    os << tokens_per_second;
  return os.str();
}

std::string now_stamp() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

// Batches from the dataset, prepared `depth` steps ahead on one thread so the step never
// waits on data (the dataset's batch() is const and deterministic in its index).
class Prefetcher {
 public:
  Prefetcher(const Dataset& dataset, std::int64_t first, std::int64_t last, std::size_t depth)
      : dataset_(dataset), next_(first), last_(last), depth_(depth), worker_([this] { run(); }) {}
  ~Prefetcher() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    worker_.join();
  }

  // The batch of `index` (indices are taken in order). Rethrows what the dataset threw.
  void take(std::int64_t index, Batch& out) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return !ready_.empty() || error_; });
    if (ready_.empty() && error_) std::rethrow_exception(error_);
    if (ready_.front().first != index) throw InternalError("prefetcher out of order");
    std::swap(out, ready_.front().second);
    spare_.push_back(std::move(ready_.front().second));
    ready_.pop_front();
    changed_.notify_all();
  }

 private:
  void run() {
    try {
      while (true) {
        Batch batch;
        std::int64_t index;
        {
          std::unique_lock lock(mutex_);
          changed_.wait(lock, [&] { return stop_ || (ready_.size() < depth_ && next_ < last_); });
          if (stop_) return;
          index = next_++;
          if (!spare_.empty()) {
            batch = std::move(spare_.back());
            spare_.pop_back();
          }
        }
        dataset_.batch(Split::train, index, batch);
        {
          std::lock_guard lock(mutex_);
          ready_.emplace_back(index, std::move(batch));
        }
        changed_.notify_all();
      }
    } catch (...) {
      std::lock_guard lock(mutex_);
      error_ = std::current_exception();
      changed_.notify_all();
    }
  }

  const Dataset& dataset_;
  std::int64_t next_, last_;
  std::size_t depth_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::pair<std::int64_t, Batch>> ready_;
  std::vector<Batch> spare_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread worker_;
};

// The training state of one run, and the step.
class Run {
 public:
  Run(Runtime& runtime, const TrainOptions& options) : runtime_(runtime), out_(options.out ? *options.out : std::cout) {
    interactive_ = options.interactive;
  }

  TrainSummary execute();

 private:
  template <class T>
  Handle<T> create(const Value& config, const char* section) {
    const Value* node = config.find(section);
    if (!node || node->is_null())
      throw UserError("the config has no `" + std::string(section) +
                      "` section: `loom train` needs one (see `loom config schema " + std::string(T::kind) +
                      "` for what is available)");
    return runtime_.registry().create<T>(ComponentRef{std::string(T::kind), "", *node, section});
  }

  void setup();
  void train_step(std::int64_t step, const Batch& batch);
  double evaluate();
  std::string sample(std::int64_t length);
  void log(std::int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  void say(const std::string& line);

  Runtime& runtime_;
  std::ostream& out_;
  bool interactive_ = false;
  bool progress_line_open_ = false;

  Value config_;
  Options trainer_;
  std::uint64_t seed_ = 0;
  std::int64_t num_steps_ = 0, batch_size_ = 0, micro_size_ = 0, seq_len_ = 0;
  fs::path run_dir_;
  std::string run_id_;

  Handle<Backend> backend_;
  Handle<Tokenizer> tokenizer_;
  Handle<Dataset> dataset_;
  Handle<Model> model_;
  Handle<Optimizer> optimizer_;
  Handle<LrSchedule> schedule_;
  std::vector<Handle<Tracker>> trackers_;
  std::vector<ModelParameter> parameters_;

  double peak_flops_ = 0;
  double flops_per_token_ = 0;
  std::unique_ptr<SkipStepRule> skip_rule_;
  std::int64_t skipped_ = 0;

  // Per-step results.
  double step_loss_ = 0, step_grad_norm_ = 0, step_lr_ = 0;
  bool step_skipped_ = false;
};

void Run::say(const std::string& line) {
  if (progress_line_open_) {
    out_ << "\r\033[K";
    progress_line_open_ = false;
  }
  out_ << line << "\n" << std::flush;
}

void Run::setup() {
  config_ = runtime_.resolved_config();
  trainer_ = Options(*config_.find("trainer"), "trainer");
  seed_ = static_cast<std::uint64_t>(trainer_.get<std::int64_t>("seed"));
  num_steps_ = trainer_.get<std::int64_t>("num_train_steps");
  batch_size_ = trainer_.get<std::int64_t>("train_batch_size");
  micro_size_ = trainer_.get<std::int64_t>("microbatch_size");
  const std::int64_t per_device = trainer_.get<std::int64_t>("per_device_parallelism");
  if (per_device > 0 && micro_size_ > 0 && per_device != micro_size_)
    throw UserError("trainer.microbatch_size (" + std::to_string(micro_size_) +
                    ") and trainer.per_device_parallelism (" + std::to_string(per_device) +
                    ") disagree: set one of them");
  if (micro_size_ == 0) micro_size_ = per_device > 0 ? per_device : batch_size_;
  if (batch_size_ % micro_size_ != 0)
    throw UserError("trainer.train_batch_size (" + std::to_string(batch_size_) +
                    ") must be a multiple of the micro-batch size (" + std::to_string(micro_size_) + ")");

  // Components, in dependency order.
  backend_ = create<Backend>(config_, "backend");
  require_host_memory(*backend_, "loom train");
  tokenizer_ = create<Tokenizer>(config_, "tokenizer");
  dataset_ = create<Dataset>(config_, "data");
  model_ = create<Model>(config_, "model");
  optimizer_ = create<Optimizer>(config_, "optimizer");
  schedule_ = create<LrSchedule>(config_, "lr_schedule");

  // The run directory. An existing run is never overwritten.
  run_id_ = trainer_.get<std::string>("run_id");
  if (run_id_.empty()) {
    const std::string& file = config_.location().file;
    const std::string stem = file.empty() ? "run" : fs::path(file).stem().string();
    run_id_ = stem + "-" + now_stamp();
  }
  run_dir_ = trainer_.get<std::string>("run_dir");
  if (run_dir_.empty()) run_dir_ = fs::path("runs") / run_id_;
  std::error_code ec;
  if (fs::exists(run_dir_ / "metrics.jsonl", ec) || fs::exists(run_dir_ / "model.safetensors", ec))
    throw UserError("run directory '" + run_dir_.string() +
                    "' already holds a run; choose another trainer.run_dir (or trainer.run_id), or remove it");
  fs::create_directories(run_dir_, ec);
  if (ec) throw UserError("cannot create run directory '" + run_dir_.string() + "': " + ec.message());
  {
    std::ofstream f(run_dir_ / "config.yaml");
    f << "# The resolved config of run " << run_id_ << " (loom config show prints the same).\n" << config_.to_yaml();
    if (!f) throw UserError("cannot write '" + (run_dir_ / "config.yaml").string() + "'");
  }

  // A tokenizer that learns its vocabulary from the training text (char) is fitted when the
  // dataset prepares, so the data comes before the model's vocabulary; otherwise the model is
  // built first and the dataset checks every id against the model's vocabulary.
  seq_len_ = model_->max_seq_len();
  auto prepare_data = [&](std::int64_t vocab_size) {
    with_context("while preparing the data (data)", [&] {
      dataset_->prepare(DatasetSetup{tokenizer_, seq_len_, batch_size_, stream_key(seed_, 2, 0), vocab_size});
    });
  };
  if (tokenizer_->needs_fit()) {
    prepare_data(0);
    model_->build(ModelSetup{tokenizer_->vocab_size()});
  } else {
    model_->build(ModelSetup{tokenizer_->vocab_size()});
    prepare_data(model_->vocab_size());
  }
  if (const std::string state = tokenizer_->state(); !state.empty()) {
    std::ofstream f(run_dir_ / "tokenizer.state", std::ios::binary);
    f << state;
    if (!f) throw UserError("cannot write '" + (run_dir_ / "tokenizer.state").string() + "'");
  }
  // A schedule whose options do not fit the run (a warmup longer than it) says so now.
  with_context("while checking the lr_schedule", [&] { schedule_->learning_rate(0, num_steps_, 1.0); });
  model_->initialize(seed_);
  parameters_ = model_->parameters();

  std::vector<OptimizerParameter> opt_params;
  const bool decay_emb = trainer_.get<bool>("decay_embeddings"), decay_norm = trainer_.get<bool>("decay_norms"),
             decay_bias = trainer_.get<bool>("decay_biases");
  for (const auto& p : parameters_) {
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
    opt_params.push_back({p.parameter, decay});
  }
  optimizer_->init(opt_params);

  for (const auto& name : trainer_.get<std::vector<std::string>>("trackers")) {
    auto tracker = runtime_.registry().create<Tracker>(ComponentRef{"tracker", name, Value(name), "trainer.trackers"});
    tracker->start(RunInfo{run_dir_.string(), run_id_, config_, 0});
    trackers_.push_back(std::move(tracker));
  }

  flops_per_token_ = model_->flops_per_token(seq_len_);
  peak_flops_ = trainer_.get<double>("peak_flops");
  const bool probed = peak_flops_ <= 0;
  if (probed) peak_flops_ = probe_peak_flops(*backend_);
  if (trainer_.get<bool>("skip_bad_steps"))
    skip_rule_ = std::make_unique<SkipStepRule>(trainer_.get<std::int64_t>("skip_step_window"),
                                                trainer_.get<double>("skip_step_sigma"));

  std::ostringstream os;
  os << "run " << run_id_ << " -> " << run_dir_.string() << "\n"
     << "model: " << config_.at_path("model.type")->as_string() << ", " << std::fixed << std::setprecision(2)
     << static_cast<double>(model_->num_parameters()) / 1e6 << "M parameters, vocab " << model_->vocab_size()
     << ", context " << seq_len_ << ", " << std::setprecision(3) << flops_per_token_ / 1e6 << " MFLOP/token\n"
     << "data: " << dataset_->num_tokens(Split::train) << " training tokens, "
     << dataset_->num_tokens(Split::validation) << " validation tokens\n"
     << "batch " << batch_size_ << " x " << seq_len_ << " tokens";
  if (micro_size_ != batch_size_) os << " in micro-batches of " << micro_size_;
  os << ", " << num_steps_ << " steps; peak " << std::setprecision(1) << peak_flops_ / 1e9 << " GFLOP/s"
     << (probed ? " (sgemm probe)" : " (trainer.peak_flops)");
  say(os.str());
}

void Run::train_step(std::int64_t step, const Batch& batch) {
  for (auto& p : parameters_) p.parameter->zero_grad();
  const std::int64_t micro_steps = batch_size_ / micro_size_;
  const std::int64_t row = seq_len_;

  // Each micro-batch's loss is a mean over its counted targets; weighting it by its share of
  // the batch's counted targets makes the accumulated gradient the gradient of the whole
  // batch's mean loss, as one big batch would give.
  std::int64_t total_counted = 0;
  for (auto t : batch.targets) total_counted += t >= 0;
  if (total_counted == 0) throw UserError("step " + std::to_string(step) + ": the batch has no targets to learn");

  double loss_sum = 0;
  for (std::int64_t m = 0; m < micro_steps; ++m) {
    const std::size_t begin = static_cast<std::size_t>(m * micro_size_ * row);
    const std::size_t count = static_cast<std::size_t>(micro_size_ * row);
    std::span<const std::int32_t> in(batch.inputs.data() + begin, count), tg(batch.targets.data() + begin, count);
    std::int64_t counted = 0;
    for (auto t : tg) counted += t >= 0;
    if (counted == 0) continue;
    Tensor tokens = Tensor::from(in, Shape{micro_size_, row});
    Tensor targets = Tensor::from(tg, Shape{micro_size_, row});
    Tensor segments;
    if (!batch.segment_ids.empty())
      segments =
          Tensor::from(std::span<const std::int32_t>(batch.segment_ids.data() + begin, count), Shape{micro_size_, row});
    Tape tape;
    Ops ops(*backend_, &tape);
    ops.set_dropout_seed(seed_, static_cast<std::uint64_t>(step * micro_steps + m));
    Tensor loss = model_->loss(ops, tokens, targets, segments);
    const double weight = static_cast<double>(counted) / static_cast<double>(total_counted);
    loss_sum += static_cast<double>(loss.item()) * weight;
    tape.backward(loss, static_cast<float>(weight));
  }

  // Global gradient norm, in double, in parameter order.
  double sum_squares = 0;
  for (const auto& p : parameters_) {
    if (!p.parameter->has_grad()) continue;
    const Tensor g = p.parameter->grad();
    const float* d = g.data<float>();
    const std::int64_t n = g.numel();
    double local = 0;
    for (std::int64_t i = 0; i < n; ++i) local += static_cast<double>(d[i]) * d[i];
    sum_squares += local;
  }
  const double grad_norm = std::sqrt(sum_squares);

  const bool crash_nan = trainer_.get<bool>("crash_on_nan"), crash_inf = trainer_.get<bool>("crash_on_inf");
  if (is_bad(loss_sum, crash_nan, crash_inf) || is_bad(grad_norm, crash_nan, crash_inf))
    throw UserError("step " + std::to_string(step) + ": the " +
                    (is_bad(loss_sum, crash_nan, crash_inf) ? "loss" : "gradient norm") + " is " +
                    (std::isnan(is_bad(loss_sum, crash_nan, crash_inf) ? loss_sum : grad_norm) ? "NaN" : "infinite") +
                    " (loss " + std::to_string(loss_sum) + ", gradient norm " + std::to_string(grad_norm) +
                    "): the run diverged. Lower optimizer.learning_rate, raise the warmup, or set "
                    "trainer.skip_bad_steps=true; trainer.crash_on_nan=false and crash_on_inf=false continue anyway");

  step_loss_ = loss_sum;
  step_grad_norm_ = grad_norm;
  step_lr_ = schedule_->learning_rate(step, num_steps_, optimizer_->learning_rate());
  step_skipped_ = skip_rule_ && skip_rule_->should_skip(loss_sum, grad_norm);
  if (step_skipped_ || !std::isfinite(grad_norm)) {
    ++skipped_;
    return;
  }

  const double max_norm = optimizer_->max_grad_norm();
  if (max_norm > 0 && grad_norm > max_norm) {
    const float factor = static_cast<float>(max_norm / (grad_norm + 1e-6));
    for (const auto& p : parameters_) {
      if (!p.parameter->has_grad()) continue;
      const Tensor g = p.parameter->grad();
      backend_->scale(g.data<float>(), factor, g.data<float>(), g.numel(), false);
    }
  }
  optimizer_->step(step_lr_, step - skipped_);
}

double Run::evaluate() {
  const std::int64_t batches = trainer_.get<std::int64_t>("max_eval_batches");
  if (batches == 0 || dataset_->num_tokens(Split::validation) == 0) return -1;
  Tape tape;
  tape.set_enabled(false);
  Ops ops(*backend_, &tape);
  ops.set_training(false);
  Batch batch;
  double weighted = 0;
  std::int64_t counted_total = 0;
  for (std::int64_t b = 0; b < batches; ++b) {
    dataset_->batch(Split::validation, b, batch);
    for (std::int64_t m = 0; m < batch.batch_size / micro_size_ + (batch.batch_size % micro_size_ != 0); ++m) {
      const std::int64_t rows = std::min(micro_size_, batch.batch_size - m * micro_size_);
      const std::size_t begin = static_cast<std::size_t>(m * micro_size_ * batch.seq_len);
      const std::size_t count = static_cast<std::size_t>(rows * batch.seq_len);
      std::span<const std::int32_t> tg(batch.targets.data() + begin, count);
      std::int64_t counted = 0;
      for (auto t : tg) counted += t >= 0;
      if (counted == 0) continue;
      Tensor tokens =
          Tensor::from(std::span<const std::int32_t>(batch.inputs.data() + begin, count), Shape{rows, batch.seq_len});
      Tensor targets = Tensor::from(tg, Shape{rows, batch.seq_len});
      Tensor segments;
      if (!batch.segment_ids.empty())
        segments = Tensor::from(std::span<const std::int32_t>(batch.segment_ids.data() + begin, count),
                                Shape{rows, batch.seq_len});
      weighted +=
          static_cast<double>(model_->loss(ops, tokens, targets, segments).item()) * static_cast<double>(counted);
      counted_total += counted;
    }
  }
  return counted_total ? weighted / static_cast<double>(counted_total) : -1;
}

std::string Run::sample(std::int64_t length) {
  std::vector<std::int32_t> prompt = tokenizer_->encode(trainer_.get<std::string>("sample_prompt"));
  const std::optional<std::int32_t> eot = tokenizer_->end_of_text();
  if (prompt.empty()) {
    if (eot)
      prompt.push_back(*eot);
    else
      prompt = tokenizer_->encode("\n");
    if (prompt.empty()) prompt.push_back(0);
  }
  SamplingOptions options;
  options.max_new_tokens = length;
  options.temperature = trainer_.get<double>("sample_temperature");
  options.top_k = trainer_.get<std::int64_t>("sample_top_k");
  options.seed = stream_key(seed_, 4, 0);
  const std::vector<std::int32_t> tokens = generate(*model_, *backend_, prompt, options, {}, eot);
  std::vector<std::int32_t> text_ids;
  for (auto t : tokens)
    if (!eot || t != *eot) text_ids.push_back(t);
  return trainer_.get<std::string>("sample_prompt") + tokenizer_->decode(text_ids);
}

void Run::log(std::int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  for (auto& t : trackers_) t->log_scalars(step, scalars);
}

TrainSummary Run::execute() {
  setup();
  TrainSummary summary;
  summary.run_dir = run_dir_.string();
  summary.peak_flops = peak_flops_;

  const std::int64_t log_every = trainer_.get<std::int64_t>("log_every");
  const std::int64_t steps_per_eval = trainer_.get<std::int64_t>("steps_per_eval");
  const std::int64_t sample_every = trainer_.get<std::int64_t>("sample_every");
  const std::int64_t sample_length = trainer_.get<std::int64_t>("sample_length");
  const double tokens_per_step = static_cast<double>(batch_size_ * seq_len_);

  Prefetcher prefetch(*dataset_, 0, num_steps_, static_cast<std::size_t>(trainer_.get<std::int64_t>("prefetch")));
  Batch batch;
  double train_seconds = 0, interval_seconds = 0, interval_loss = 0;
  std::int64_t interval_steps = 0;
  const auto run_start = Clock::now();

  for (std::int64_t step = 0; step < num_steps_; ++step) {
    prefetch.take(step, batch);
    if (batch.batch_size != batch_size_ || batch.seq_len != seq_len_)
      throw InternalError("the dataset returned a " + std::to_string(batch.batch_size) + " x " +
                          std::to_string(batch.seq_len) + " batch for a " + std::to_string(batch_size_) + " x " +
                          std::to_string(seq_len_) + " run");
    const auto t0 = Clock::now();
    train_step(step, batch);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    train_seconds += dt;
    interval_seconds += dt;
    interval_loss += step_loss_;
    ++interval_steps;

    const bool last = step + 1 == num_steps_;
    if ((step + 1) % log_every == 0 || last) {
      const double tps = tokens_per_step * static_cast<double>(interval_steps) / interval_seconds;
      const double mfu = flops_per_token_ * tps / peak_flops_;
      const double mean_loss = interval_loss / static_cast<double>(interval_steps);
      const double elapsed = std::chrono::duration<double>(Clock::now() - run_start).count();
      const double eta = train_seconds / static_cast<double>(step + 1) * static_cast<double>(num_steps_ - step - 1);
      log(step + 1, {{"train/loss", mean_loss},
                     {"train/lr", step_lr_},
                     {"train/grad_norm", step_grad_norm_},
                     {"throughput/tokens_per_second", tps},
                     {"throughput/mfu", mfu},
                     {"throughput/elapsed_seconds", elapsed},
                     {"train/skipped_steps", static_cast<double>(skipped_)}});
      std::ostringstream line;
      line << "step " << step + 1 << "/" << num_steps_ << "  loss " << std::fixed << std::setprecision(4) << mean_loss
           << "  lr " << std::scientific << std::setprecision(2) << step_lr_ << "  grad " << std::fixed
           << std::setprecision(3) << step_grad_norm_ << "  " << format_rate(tps) << " tok/s  MFU "
           << std::setprecision(1) << 100.0 * mfu << "%  ETA " << format_duration(eta);
      if (skipped_) line << "  skipped " << skipped_;
      if (interactive_) {
        out_ << "\r\033[K" << line.str() << std::flush;
        progress_line_open_ = true;
      } else {
        say(line.str());
      }
      summary.final_train_loss = mean_loss;
      interval_seconds = 0;
      interval_loss = 0;
      interval_steps = 0;
    }
    if (steps_per_eval > 0 && (step + 1) % steps_per_eval == 0 && !last) {
      const double eval_loss = evaluate();
      if (eval_loss >= 0) {
        log(step + 1, {{"eval/loss", eval_loss}, {"eval/perplexity", std::exp(eval_loss)}});
        std::ostringstream line;
        line << "eval at step " << step + 1 << ": loss " << std::fixed << std::setprecision(4) << eval_loss
             << ", perplexity " << std::setprecision(2) << std::exp(eval_loss);
        say(line.str());
      }
    }
    if (sample_every > 0 && sample_length > 0 && (step + 1) % sample_every == 0 && !last) {
      const std::string text = sample(sample_length);
      for (auto& t : trackers_) t->log_text(step + 1, "sample", text);
      say("sample at step " + std::to_string(step + 1) + ":\n" + text);
    }
  }
  if (progress_line_open_) say("");

  summary.steps = num_steps_;
  summary.skipped_steps = skipped_;
  summary.tokens_per_second = tokens_per_step * static_cast<double>(num_steps_) / train_seconds;
  summary.mfu = flops_per_token_ * summary.tokens_per_second / peak_flops_;

  summary.final_eval_loss = evaluate();
  if (summary.final_eval_loss >= 0) {
    log(num_steps_, {{"eval/loss", summary.final_eval_loss}, {"eval/perplexity", std::exp(summary.final_eval_loss)}});
    std::ostringstream line;
    line << "final eval: loss " << std::fixed << std::setprecision(4) << summary.final_eval_loss << ", perplexity "
         << std::setprecision(2) << std::exp(summary.final_eval_loss) << " ("
         << trainer_.get<std::int64_t>("max_eval_batches") << " validation batches)";
    say(line.str());
  }
  if (trainer_.get<bool>("save_final")) {
    safetensors::save_parameters(run_dir_ / "model.safetensors", parameters_,
                                 {{"loom.run_id", run_id_}, {"loom.step", std::to_string(num_steps_)}});
  }
  if (sample_length > 0) {
    summary.final_sample = sample(sample_length);
    for (auto& t : trackers_) t->log_text(num_steps_, "sample", summary.final_sample);
    say("sample:\n" + summary.final_sample);
  }
  for (auto& t : trackers_) t->flush();
  summary.wall_seconds = std::chrono::duration<double>(Clock::now() - run_start).count();
  std::ostringstream line;
  line << "done: " << num_steps_ << " steps in " << format_duration(summary.wall_seconds) << ", "
       << format_rate(summary.tokens_per_second) << " tok/s, MFU " << std::fixed << std::setprecision(1)
       << 100.0 * summary.mfu << "%; files in " << run_dir_.string();
  say(line.str());
  return summary;
}

}  // namespace

SkipStepRule::SkipStepRule(std::int64_t window, double sigma)
    : capacity_(static_cast<std::size_t>(window) + 1), sigma_(sigma) {}

bool SkipStepRule::should_skip(double loss, double grad_norm) {
  bool skip = false;
  const std::size_t min_points = std::max<std::size_t>(2, (capacity_ - 1) / 2);
  if (losses_.size() >= min_points) skip = loss > threshold(losses_) || grad_norm > threshold(norms_);
  push(losses_, loss);
  push(norms_, grad_norm);
  return skip;
}

double SkipStepRule::threshold(const std::deque<double>& xs) const {
  double mean = 0;
  for (double x : xs) mean += x;
  mean /= static_cast<double>(xs.size());
  double var = 0;
  for (double x : xs) var += (x - mean) * (x - mean);
  var /= static_cast<double>(xs.size());
  return mean + sigma_ * std::max(std::sqrt(var), 1e-6);
}

void SkipStepRule::push(std::deque<double>& xs, double x) {
  xs.push_back(x);
  if (xs.size() > capacity_) xs.pop_front();
}

double probe_peak_flops(Backend& backend) {
  // A few square sgemms large enough for the backend's fastest path; the best of them.
  const std::int64_t n = 1536;
  Tensor a = Tensor::full(Shape{n, n}, 0.5f), b = Tensor::full(Shape{n, n}, 0.25f), c = Tensor::empty(Shape{n, n});
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = Clock::now();
    backend.gemm(Transpose::no, Transpose::no, n, n, n, 1.0f, a.data<float>(), n, b.data<float>(), n, 0.0f,
                 c.data<float>(), n);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (rep > 0) best = std::max(best, 2.0 * static_cast<double>(n) * n * n / dt);
  }
  return best;
}

TrainSummary train(Runtime& runtime, const TrainOptions& options) {
  Run run(runtime, options);
  return run.execute();
}

}  // namespace loom
