#include "train/progress.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

#include "loom/error.hpp"

namespace loom::training {

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

std::string format_mfu(double mfu) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << 100.0 * mfu << "%";
  if (mfu > 1.0) s << " (above the roof: too low)";
  return s.str();
}

void ProgressPrinter::say(const std::string& line) {
  if (silent_) return;
  if (line_open_) {
    out_ << "\r\033[K";
    line_open_ = false;
  }
  out_ << line << "\n" << std::flush;
}

std::string header_text(const RunHeader& run) {
  std::ostringstream os;
  os << "run " << run.run_id << " -> " << run.run_dir << "\n"
     << "model: " << run.model_type << ", " << std::fixed << std::setprecision(2)
     << static_cast<double>(run.num_parameters) / 1e6 << "M parameters, vocab " << run.vocab_size << ", context "
     << run.seq_len << ", " << std::setprecision(3) << run.flops_per_token / 1e6 << " MFLOP/token\n"
     << "data: " << run.train_tokens << " training tokens, " << run.validation_tokens << " validation tokens\n"
     << "batch " << run.batch_size << " x " << run.seq_len << " tokens";
  if (run.micro_size != run.batch_size) os << " in micro-batches of " << run.micro_size;
  os << ", " << run.num_steps << " steps; matmuls in " << run.matmul_dtype
     << (run.matmul_dtype == "bf16" ? " (float32 accumulation)" : "") << "; peak " << std::setprecision(1)
     << run.peak_flops / 1e9 << " GFLOP/s"
     << (run.peak_flops_probed ? " (" + run.matmul_dtype + " GEMM probe" : std::string(" (trainer.peak_flops"))
     << (run.ranks > 1 ? ", all ranks" : "");
  // A float32 run on a CPU that could do bf16: what the bf16 roof would be.
  if (run.bf16_peak_flops > 0 && run.matmul_dtype != "bf16")
    os << "; bf16 GEMM roof " << run.bf16_peak_flops / 1e9 << " GFLOP/s";
  os << ")";
  if (run.ranks > 1)
    os << "\ndata parallel: " << run.ranks << " ranks" << (run.mesh.empty() ? "" : ": " + run.mesh) << " ("
       << run.collective << "), " << run.batch_size / std::max(1, run.replicas)
       << (run.replicas == run.ranks ? " sequences of each batch per rank"
                                     : " sequences of each batch per tensor group")
       << "; optimizer state " << std::setprecision(1)
       << static_cast<double>(run.optimizer_state_bytes) / (1024.0 * 1024.0) << " MiB per rank"
       << (run.sharded ? " (sharded, ZeRO-1)" : "")
       << (run.fully_sharded.empty() ? "" : "\nfully sharded (ZeRO-3): " + run.fully_sharded);
  if (!run.memory.empty()) os << "\n" << run.memory;
  return os.str();
}

void write_header_json(const std::filesystem::path& run_dir, const RunHeader& run) {
  const nlohmann::json header{{"text", header_text(run)},
                              {"run_id", run.run_id},
                              {"model", run.model_type},
                              {"parameters", run.num_parameters},
                              {"vocab_size", run.vocab_size},
                              {"seq_len", run.seq_len},
                              {"flops_per_token", run.flops_per_token},
                              {"train_tokens", run.train_tokens},
                              {"validation_tokens", run.validation_tokens},
                              {"batch_size", run.batch_size},
                              {"micro_batch_size", run.micro_size},
                              {"steps", run.num_steps},
                              {"peak_flops", run.peak_flops},
                              {"matmul_dtype", run.matmul_dtype},
                              {"ranks", run.ranks},
                              {"mesh", run.mesh},
                              {"collective", run.collective},
                              {"memory", run.memory}};
  std::ofstream f(run_dir / "header.json");
  f << header.dump(2) << "\n";
  if (!f) throw UserError("cannot write '" + (run_dir / "header.json").string() + "'");
}

void ProgressPrinter::header(const RunHeader& run) {
  // mpirun relays rank 0's output through a terminal of its own: keep to whole lines.
  if (run.ranks > 1) interactive_ = false;
  roof_ = run.peak_flops;
  roof_probed_ = run.peak_flops_probed;
  say(header_text(run));
}

void ProgressPrinter::step(const StepReport& r) {
  std::ostringstream line;
  line << "step " << r.step << "/" << r.num_steps << "  loss " << std::fixed << std::setprecision(4) << r.mean_loss
       << "  lr " << std::scientific << std::setprecision(2) << r.lr << "  grad " << std::fixed << std::setprecision(3)
       << r.grad_norm << "  " << format_rate(r.tokens_per_second) << " tok/s";
  // Masked targets (chat data trains on the answers only): how many of them are trained.
  if (r.trained_tokens_per_second < r.tokens_per_second)
    line << " (" << format_rate(r.trained_tokens_per_second) << " trained)";
  line << "  MFU " << format_mfu(r.mfu) << "  ETA " << format_duration(r.eta_seconds);
  if (r.skipped_steps) line << "  skipped " << r.skipped_steps;
  if (r.ranks > 1) line << "  " << r.ranks << " ranks" << (r.mesh.empty() ? "" : ": " + r.mesh);
  if (silent_) return;
  if (r.mfu > 1.0 && !said_roof_low_) {
    // The FLOPs are the model's formula's, so the roof is what is wrong.
    said_roof_low_ = true;
    std::ostringstream why;
    why << std::fixed << std::setprecision(1) << "warning: MFU " << 100.0 * r.mfu << "%: the run computes "
        << r.mfu * roof_ / 1e9 << " GFLOP/s, above the roof of " << roof_ / 1e9 << " GFLOP/s it is measured against"
        << (roof_probed_ ? ", which the start-up GEMM probe measured low (the cores were busy while it ran)"
                         : ", trainer.peak_flops")
        << ": the roof is too low; set trainer.peak_flops to the hardware's peak (per rank) to measure MFU against "
           "it";
    say(why.str());
  }
  if (interactive_) {
    out_ << "\r\033[K" << line.str() << std::flush;
    line_open_ = true;
  } else {
    say(line.str());
  }
}

void ProgressPrinter::eval(std::int64_t step, double loss, const std::string& details) {
  std::ostringstream line;
  line << "eval at step " << step << ": loss " << std::fixed << std::setprecision(4) << loss;
  if (!details.empty()) line << ", " << details;
  say(line.str());
}

void ProgressPrinter::final_eval(double loss, std::int64_t batches, const std::string& details) {
  std::ostringstream line;
  line << "final eval: loss " << std::fixed << std::setprecision(4) << loss;
  if (!details.empty()) line << ", " << details;
  line << " (" << batches << " validation batches)";
  say(line.str());
}

void ProgressPrinter::sample(std::int64_t step, const std::string& text) {
  say("sample at step " + std::to_string(step) + ":\n" + text);
}

void ProgressPrinter::final_sample(const std::string& text) {
  say("sample:\n" + text);
}

void ProgressPrinter::end_steps() {
  if (line_open_) say("");
}

void ProgressPrinter::done(std::int64_t steps, double wall_seconds, double tokens_per_second, double mfu,
                           std::int64_t peak_bytes, int ranks, const std::string& run_dir) {
  std::ostringstream line;
  line << "done: " << steps << " steps in " << format_duration(wall_seconds) << ", " << format_rate(tokens_per_second)
       << " tok/s, MFU " << format_mfu(mfu) << ", peak memory " << (peak_bytes >> 20) << " MiB"
       << (ranks > 1 ? " (the largest rank's)" : "") << "; files in " << run_dir;
  say(line.str());
}

}  // namespace loom::training
