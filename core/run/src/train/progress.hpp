// What a training run tells the person watching it: a header, a line per log interval (a live
// line on a terminal), evaluations, samples and a closing line. Only the terminal: the trackers
// get the metrics.
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <string>

namespace loom::training {

// "42s", "3m07s", "1h05m"; "?" when unknown.
std::string format_duration(double seconds);
// Tokens per second as "950.0", "12.3k", "1.2M".
std::string format_rate(double tokens_per_second);
// MFU as "42.0%"; above 100% (the run computed more than the roof it is measured against, which
// is then too low) "116.9% (above the roof: too low)".
std::string format_mfu(double mfu);

// What the header of a run says about it.
struct RunHeader {
  std::string run_id, run_dir, model_type;
  std::int64_t num_parameters = 0, vocab_size = 0, seq_len = 0;
  double flops_per_token = 0;
  std::int64_t train_tokens = 0, validation_tokens = 0;
  std::int64_t batch_size = 0, micro_size = 0, num_steps = 0;
  double peak_flops = 0;
  bool peak_flops_probed = false;          // measured by the GEMM probe, not trainer.peak_flops
  double bf16_peak_flops = 0;              // the probe's bf16 GEMM roof (0: none, or not probed)
  std::string matmul_dtype = "f32";        // what the matrix products compute in (Backend::matmul_dtype)
  int ranks = 1;                           // of a data-parallel run
  int replicas = 1;                        // of them, those that take different rows (not a tensor group's)
  std::string mesh;                        // their layout, "data 2 x fsdp 1" (trainer.mesh)
  std::string collective;                  // what connects them
  bool sharded = false;                    // trainer.shard_optimizer_state
  std::string fully_sharded;               // FSDP: "12 units, the largest 148 MiB gathered"
  std::int64_t optimizer_state_bytes = 0;  // on this rank
  std::string memory;                      // the start-up memory estimate's line
};

// What the line of a log interval says.
struct StepReport {
  std::int64_t step = 0, num_steps = 0;   // steps done, of
  double mean_loss = 0;                   // over the interval
  double lr = 0, grad_norm = 0;           // of its last step
  double tokens_per_second = 0, mfu = 0;  // over the interval
  double trained_tokens_per_second = 0;   // of them, the tokens whose targets count toward the loss
  double eta_seconds = 0;
  std::int64_t skipped_steps = 0;  // in the whole run
  int ranks = 1;                   // processes the step ran on (shown when more than one)
  std::string mesh;                // their layout, shown with them
};

// What the header says, as the terminal shows it (the lines ProgressPrinter::header prints).
std::string header_text(const RunHeader& run);

// RUN_DIR/header.json: the header's text ("text") and its fields, for `loom report`.
void write_header_json(const std::filesystem::path& run_dir, const RunHeader& run);

class ProgressPrinter {
 public:
  // `interactive`: `out` is a terminal, so the step line is rewritten in place.
  ProgressPrinter(std::ostream& out, bool interactive) : out_(out), interactive_(interactive) {}

  void header(const RunHeader& run);
  void step(const StepReport& report);
  // `details`: what follows the loss ("perplexity 1.82", or an objective's metrics).
  void eval(std::int64_t step, double loss, const std::string& details);
  void final_eval(double loss, std::int64_t batches, const std::string& details);
  void sample(std::int64_t step, const std::string& text);
  void final_sample(const std::string& text);
  // Ends the live step line, if one is open, so what follows starts on a line of its own.
  void end_steps();
  // `peak_bytes`: the peak resident memory of the largest of `ranks` processes.
  void done(std::int64_t steps, double wall_seconds, double tokens_per_second, double mfu, std::int64_t peak_bytes,
            int ranks, const std::string& run_dir);

  // One line (or several), after clearing the live step line.
  void say(const std::string& line);
  // Prints nothing from now on: the ranks of a data-parallel run other than 0.
  void silence() { silent_ = true; }

 private:
  std::ostream& out_;
  bool interactive_ = false;
  bool line_open_ = false;
  bool silent_ = false;
  double roof_ = 0;             // the header's peak FLOP/s
  bool roof_probed_ = false;    // measured by the GEMM probe
  bool said_roof_low_ = false;  // the warning of an MFU above 100%, once
};

}  // namespace loom::training
