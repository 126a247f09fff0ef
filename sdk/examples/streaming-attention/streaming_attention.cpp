// attention/streaming: an out-of-tree attention kernel. Each query row streams over its visible
// keys with an online softmax (a running maximum and sum, Milakov & Gimelshein 2018), so it
// never holds a score matrix: O(head_dim) memory per row. The backward pass recomputes each
// probability from the saved log-sum-exp. Plain loops with float64 accumulation: the point is
// the plugin's shape (the contract, the SDK's mask rule, the thread pool), not its speed.
//
// The mask (causal, sliding window, segment ids) is the SDK's loom::AttentionMask, the rule every
// kernel shares; `loom conformance libloom-attention-streaming.so` checks the rest.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <loom/attention_mask.hpp>
#include <loom/kinds/attention.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <vector>

namespace {

using std::int64_t;

constexpr float negative_infinity = -std::numeric_limits<float>::infinity();

// Row t of head h of a strided operand (AttentionOperand or AttentionGradient).
template <class Operand>
auto row(const Operand& x, int64_t b, int64_t t, int64_t h, int64_t head_dim) {
  return x.data + b * x.batch_stride + t * x.token_stride + h * head_dim;
}

class StreamingAttention final : public loom::AttentionKernel {
 public:
  explicit StreamingAttention(loom::ExecutionContext& execution) : execution_(execution) {}

  void forward(const loom::AttentionForwardArgs& a) override {
    const loom::AttentionMask mask(a);
    const int64_t group = a.q_heads / a.kv_heads;
    execution_.parallel_for(a.batch * a.q_heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<double> acc(static_cast<size_t>(a.head_dim));
      for (int64_t bh = begin; bh < end; ++bh) {
        const int64_t b = bh / a.q_heads, h = bh % a.q_heads, g = h / group;
        for (int64_t i = 0; i < a.q_len; ++i) {
          const float* q = row(a.q, b, i, h, a.head_dim);
          double max = -std::numeric_limits<double>::infinity(), sum = 0.0;
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int64_t j = 0; j < a.kv_len; ++j) {
            if (!mask.visible(b, i, j)) continue;
            const double s = score(a, q, row(a.k, b, j, g, a.head_dim));
            if (s > max) {  // rescale what was summed under the old maximum
              const double shrink = sum == 0.0 ? 0.0 : std::exp(max - s);
              sum *= shrink;
              for (double& x : acc) x *= shrink;
              max = s;
            }
            const double p = std::exp(s - max);
            sum += p;
            const float* v = row(a.v, b, j, g, a.head_dim);
            for (int64_t e = 0; e < a.head_dim; ++e) acc[static_cast<size_t>(e)] += p * v[e];
          }
          float* out = a.out + ((b * a.q_len + i) * a.q_heads + h) * a.head_dim;
          for (int64_t e = 0; e < a.head_dim; ++e)
            out[e] = sum > 0.0 ? static_cast<float>(acc[static_cast<size_t>(e)] / sum) : 0.0f;
          a.lse[bh * a.q_len + i] = sum > 0.0 ? static_cast<float>(max + std::log(sum)) : negative_infinity;
        }
      }
    });
  }

  void backward(const loom::AttentionBackwardArgs& args) override {
    const loom::AttentionForwardArgs& a = *args.forward;
    const loom::AttentionMask mask(a);
    const int64_t group = a.q_heads / a.kv_heads;
    // One task per (batch, kv head): the heads of a group add into the same dk and dv rows.
    execution_.parallel_for(a.batch * a.kv_heads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t bg = begin; bg < end; ++bg) {
        const int64_t b = bg / a.kv_heads, g = bg % a.kv_heads;
        // Overwrite means the buffers may hold anything: clear them, then add.
        for (const loom::AttentionGradient* grad : {&args.dk, &args.dv})
          if (grad->data != nullptr && !grad->accumulate)
            for (int64_t j = 0; j < a.kv_len; ++j) std::fill_n(row(*grad, b, j, g, a.head_dim), a.head_dim, 0.0f);
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          if (args.dq.data != nullptr && !args.dq.accumulate)
            for (int64_t i = 0; i < a.q_len; ++i) std::fill_n(row(args.dq, b, i, h, a.head_dim), a.head_dim, 0.0f);
          for (int64_t i = 0; i < a.q_len; ++i) backward_row(args, mask, b, h, g, i);
        }
      }
    });
  }

 private:
  // The soft-capped score of one query and one key.
  double score(const loom::AttentionForwardArgs& a, const float* q, const float* k) const {
    double dot = 0.0;
    for (int64_t e = 0; e < a.head_dim; ++e) dot += double{q[e]} * k[e];
    const double s = a.params.scale * dot;
    return a.params.softcap > 0.0f ? a.params.softcap * std::tanh(s / a.params.softcap) : s;
  }

  // dS = P * (dP - D) with D = dout . out; dq += scale dS k, dk += scale dS q, dv += P dout.
  void backward_row(const loom::AttentionBackwardArgs& args, const loom::AttentionMask& mask, int64_t b, int64_t h,
                    int64_t g, int64_t i) const {
    const loom::AttentionForwardArgs& a = *args.forward;
    const float lse = a.lse[(b * a.q_heads + h) * a.q_len + i];
    if (lse == negative_infinity) return;  // no visible key: no gradient
    const int64_t offset = ((b * a.q_len + i) * a.q_heads + h) * a.head_dim;
    const float* out = a.out + offset;
    const float* dout = args.dout + offset;
    const float* q = row(a.q, b, i, h, a.head_dim);
    double delta = 0.0;
    for (int64_t e = 0; e < a.head_dim; ++e) delta += double{dout[e]} * out[e];
    for (int64_t j = 0; j < a.kv_len; ++j) {
      if (!mask.visible(b, i, j)) continue;
      const float* k = row(a.k, b, j, g, a.head_dim);
      const float* v = row(a.v, b, j, g, a.head_dim);
      const double s = score(a, q, k);
      const double p = std::exp(s - lse);
      double dp = 0.0;
      for (int64_t e = 0; e < a.head_dim; ++e) dp += double{dout[e]} * v[e];
      double ds = p * (dp - delta);
      if (a.params.softcap > 0.0f) {  // d/dx cap * tanh(x / cap) = 1 - tanh^2
        const double t = s / a.params.softcap;
        ds *= 1.0 - t * t;
      }
      const double scaled = a.params.scale * ds;
      if (args.dv.data != nullptr) {
        float* dv = row(args.dv, b, j, g, a.head_dim);
        for (int64_t e = 0; e < a.head_dim; ++e) dv[e] += static_cast<float>(p * dout[e]);
      }
      if (args.dk.data != nullptr) {
        float* dk = row(args.dk, b, j, g, a.head_dim);
        for (int64_t e = 0; e < a.head_dim; ++e) dk[e] += static_cast<float>(scaled * q[e]);
      }
      if (args.dq.data != nullptr) {
        float* dq = row(args.dq, b, i, h, a.head_dim);
        for (int64_t e = 0; e < a.head_dim; ++e) dq[e] += static_cast<float>(scaled * k[e]);
      }
    }
  }

  loom::ExecutionContext& execution_;
};

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::AttentionKernel>(
      {.name = "streaming",
       .description = "one query row at a time with an online softmax: no score matrix (an out-of-tree example)",
       .version = "1.0.0"},
      [](const loom::Options&, const loom::CreateContext& context) {
        return std::make_unique<StreamingAttention>(context.execution());
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
