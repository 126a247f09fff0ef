// The `adafactor` optimizer (Shazeer & Stern, 2018, "Adafactor: Adaptive Learning Rates with
// Sublinear Memory Cost"), with the semantics of Hugging Face's Adafactor (which follows the
// paper and Tensor2Tensor) and the option names of optax.adafactor where they differ.
//
// At step t (from 1), for a matrix G (the last two dimensions; leading ones are a batch):
//   R <- beta2t R + (1 - beta2t) mean_cols(G^2 + eps1)    C <- beta2t C + (1 - beta2t) mean_rows(G^2 + eps1)
//   U = G / sqrt((R / mean(R)) C)                         (vectors: V <- beta2t V + ..., U = G / sqrt(V))
//   U <- U / max(1, RMS(U) / clip_threshold)
//   step = rho * max(eps2, RMS(p)) (with scale_parameter), rho = lr, or min(1e-2, 1 / sqrt(t)) with
//   relative_step;  U <- step U;  with beta1: M <- beta1 M + (1 - beta1) U, U = M
//   p <- p - weight_decay step p - U
// with beta2t = 1 - t^decay_rate. So a matrix keeps rows + cols numbers instead of AdamW's
// 2 x rows x cols. Every reduction runs over chunks whose boundaries do not depend on the thread
// count, summed in order, so the result is the same on any number of threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <loom/optimizer_base.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace {

class Adafactor final : public loom::OptimizerBase {
 public:
  Adafactor(const loom::Options& options, loom::ExecutionContext& execution)
      : OptimizerBase("adafactor", execution),
        decay_rate_(options.get<double>("decay_rate")),
        clip_threshold_(options.get<double>("clip_threshold")),
        beta1_(options.get_optional<double>("beta1")),
        epsilon1_(options.get<double>("epsilon1")),
        epsilon2_(options.get<double>("epsilon2")),
        relative_step_(options.get<bool>("relative_step")),
        warmup_init_(options.get<bool>("warmup_init")),
        scale_parameter_(options.get<bool>("scale_parameter")),
        weight_decay_(options.get<double>("weight_decay")) {}

 private:
  // The first moment when beta1 is set; the factored second moments are rows plus columns.
  double state_bytes_per_parameter() const override { return beta1_ ? 4.0 : 0.0; }

  std::vector<loom::StateTensorSpec> state_tensors(const loom::OptimizerParameter& p) const override {
    const loom::Shape& shape = p.parameter->shape();
    std::vector<loom::StateTensorSpec> out;
    if (beta1_) out.push_back({"exp_avg", shape});
    const int rank = shape.rank();
    if (rank >= 2) {
      std::vector<std::int64_t> row, col;
      for (int d = 0; d < rank - 1; ++d) row.push_back(shape[d]);
      for (int d = 0; d < rank - 2; ++d) col.push_back(shape[d]);
      col.push_back(shape[rank - 1]);
      out.push_back({"exp_avg_sq_row", loom::Shape(std::span<const std::int64_t>(row))});
      out.push_back({"exp_avg_sq_col", loom::Shape(std::span<const std::int64_t>(col))});
    } else {
      out.push_back({"exp_avg_sq", shape});
    }
    return out;
  }

  void begin_step(double lr, std::int64_t step) override {
    lr_ = lr;
    t_ = static_cast<double>(step) + 1.0;
  }

  // sum(x^2) in double, over chunks whose boundaries depend on n only, added in chunk order.
  double sum_squares(const float* x, std::int64_t n) {
    partial_.assign(static_cast<std::size_t>((n + kChunk - 1) / kChunk), 0.0);
    parallel_chunks(n, [&](std::int64_t begin, std::int64_t end) {
      double s = 0;
      for (std::int64_t i = begin; i < end; ++i) s += static_cast<double>(x[i]) * x[i];
      partial_[static_cast<std::size_t>(begin / kChunk)] = s;
    });
    double total = 0;
    for (double s : partial_) total += s;
    return total;
  }

  void update(ParameterState& state, const loom::Tensor& grad) override {
    const loom::Shape& shape = state.parameter->shape();
    const std::int64_t n = grad.numel();
    float* p = state.parameter->data().data<float>();
    const float* g = grad.data<float>();
    const std::size_t first_sq = beta1_ ? 1 : 0;

    const double rms_p = std::sqrt(sum_squares(p, n) / static_cast<double>(n));
    const double rho = relative_step_ ? std::min(warmup_init_ ? 1e-6 * t_ : 1e-2, 1.0 / std::sqrt(t_)) : lr_;
    const double step_size = (scale_parameter_ ? std::max(epsilon2_, rms_p) : 1.0) * rho;
    const double beta2t = 1.0 - std::pow(t_, decay_rate_);
    const float b2 = static_cast<float>(beta2t), c2 = static_cast<float>(1.0 - beta2t);
    const float eps1 = static_cast<float>(epsilon1_);

    u_.resize(static_cast<std::size_t>(n));
    float* u = u_.data();
    if (shape.rank() >= 2) {
      const std::int64_t cols = shape[shape.rank() - 1], rows = shape[shape.rank() - 2];
      const std::int64_t batch = n / (rows * cols);
      float* row = state.tensors[first_sq].data<float>();      // [batch, rows]
      float* col = state.tensors[first_sq + 1].data<float>();  // [batch, cols]
      col_sum_.assign(static_cast<std::size_t>(cols), 0.0);
      for (std::int64_t b = 0; b < batch; ++b) {
        const float* gb = g + b * rows * cols;
        std::fill(col_sum_.begin(), col_sum_.end(), 0.0);
        for (std::int64_t r = 0; r < rows; ++r) {
          double s = 0;
          for (std::int64_t c = 0; c < cols; ++c) {
            const double sq = static_cast<double>(gb[r * cols + c]) * gb[r * cols + c] + eps1;
            s += sq;
            col_sum_[static_cast<std::size_t>(c)] += sq;
          }
          float& rv = row[b * rows + r];
          rv = rv * b2 + c2 * static_cast<float>(s / static_cast<double>(cols));
        }
        double row_total = 0;
        for (std::int64_t c = 0; c < cols; ++c) {
          float& cv = col[b * cols + c];
          cv = cv * b2 + c2 * static_cast<float>(col_sum_[static_cast<std::size_t>(c)] / static_cast<double>(rows));
        }
        for (std::int64_t r = 0; r < rows; ++r) row_total += row[b * rows + r];
        const float row_mean = static_cast<float>(row_total / static_cast<double>(rows));
        const float* rb = row + b * rows;
        const float* cb = col + b * cols;
        float* ub = u + b * rows * cols;
        parallel_chunks(rows * cols, [&](std::int64_t begin, std::int64_t end) {
          for (std::int64_t i = begin; i < end; ++i) {
            const float r_factor = 1.0f / std::sqrt(rb[i / cols] / row_mean);
            const float c_factor = 1.0f / std::sqrt(cb[i % cols]);
            ub[i] = r_factor * c_factor * gb[i];
          }
        });
      }
    } else {
      float* v = state.tensors[first_sq].data<float>();
      parallel_chunks(n, [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t i = begin; i < end; ++i) {
          const float gi = g[i];
          v[i] = v[i] * b2 + c2 * (gi * gi + eps1);
          u[i] = (1.0f / std::sqrt(v[i])) * gi;
        }
      });
    }

    const double rms_u = std::sqrt(sum_squares(u, n) / static_cast<double>(n));
    const float clip = static_cast<float>(std::max(1.0, rms_u / clip_threshold_));
    const float lr = static_cast<float>(step_size);
    const bool decay = state.weight_decay && weight_decay_ != 0.0;
    const float neg_decay = static_cast<float>(-weight_decay_ * step_size);
    float* m = beta1_ ? state.tensors[0].data<float>() : nullptr;
    const float beta1 = static_cast<float>(beta1_.value_or(0.0)), one_minus_beta1 = 1.0f - beta1;
    parallel_chunks(n, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) {
        float ui = (u[i] / clip) * lr;
        if (m) {
          m[i] = m[i] * beta1 + one_minus_beta1 * ui;
          ui = m[i];
        }
        float pi = p[i];
        if (decay) pi = pi + pi * neg_decay;
        p[i] = pi - ui;
      }
    });
  }

  double decay_rate_, clip_threshold_;
  std::optional<double> beta1_;
  double epsilon1_, epsilon2_;
  bool relative_step_, warmup_init_, scale_parameter_;
  double weight_decay_;
  double lr_ = 0, t_ = 1;
  std::vector<float> u_;
  std::vector<double> partial_, col_sum_;
};

loom::OptionSchema adafactor_options() {
  loom::OptionSchema s;
  s.number("decay_rate", -0.8, "Second-moment decay: beta2 at step t is 1 - t^decay_rate.").max(0.0, false);
  s.number("clip_threshold", 1.0, "Update clipping: the update is divided by max(1, RMS(update) / clip_threshold).")
      .min(0.0, false);
  const std::string beta1_doc = "First-moment decay; null (the default): no first moment, and no memory for one.";
  loom::OptionSpec& beta1 = s.number("beta1", 0.0, beta1_doc);
  beta1 = loom::OptionSpec("beta1", loom::OptionType::number, loom::Value(), beta1_doc);
  beta1.min(0.0).max(1.0, false).nullable();
  s.number("epsilon1", 1e-30, "Added to the squared gradient.").min(0.0);
  s.number("epsilon2", 1e-3, "Lower bound of the parameter's RMS in the step size (scale_parameter).").min(0.0);
  s.boolean("relative_step", false,
            "Step size min(1e-2, 1/sqrt(t)) (the paper's relative step) instead of the scheduled learning rate.");
  s.boolean("warmup_init", false, "With relative_step: min(1e-6 t, 1/sqrt(t)) instead (warm-up).");
  s.boolean("scale_parameter", true, "Multiply the step size by max(epsilon2, RMS of the parameter).");
  s.number("weight_decay", 0.0, "p -= weight_decay * step_size * p, on parameters the weight-decay mask selects.")
      .min(0.0);
  s.section_default("learning_rate", 1e-2);
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Optimizer>(
      {.name = "adafactor",
       .description = "Adafactor: factored second moments, update clipping, relative steps (Shazeer & Stern 2018)",
       .version = "1.0.0",
       .options = adafactor_options()},
      [](const loom::Options& options, const loom::CreateContext& context) {
        return std::make_unique<Adafactor>(options, context.execution());
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
