// The blocks a decoder-only transformer is drawn with (header-only, help for implementing
// kinds/model.hpp like model_support.hpp): each declares its parameters into a ParameterStore,
// under the names and in the layouts of the checkpoints it loads, and computes its part of a
// layer. A model file then reads like its paper's diagram: norms, residual adds and the order of
// the blocks are the model's; what is inside a block is written once.
//   * AttentionBlock: fused q/k/v projection (rows [q heads | k heads | v heads], or GPT-2's
//     Conv1D [in, out] columns), optional biases, per-head q/k RMSNorm (scaled by the weight as
//     Qwen3's, or by 1 + weight as Gemma 3's), RoPE, grouped key/value heads, the layer's window,
//     soft-cap and scale, the KV cache, the output projection;
//   * MlpBlock: GPT-2's two-matrix GELU MLP, Llama's SwiGLU and Gemma's GeGLU;
//   * MoeBlock: a sparse mixture of SwiGLU experts (Mixtral): router, top-k, dropless experts,
//     with RouterRecords for moe_auxiliary_loss (load balancing, z-loss) and run_moe_layer for
//     activation checkpointing;
//   * linear_rope: the RopeConfig of linear position scaling (transformers' rope_type "linear");
//   * the option reading and Hugging Face mapping these blocks share across models.
// Each block also writes its parameters' parallel plan (parallel_plan.hpp): declared into a store
// split over a tensor group (ParameterStore::set_tensor_split), it allocates this member's shard
// and its forward pass communicates through Ops' tensor collectives (Megatron-LM's layout:
// attention by heads, the MLP by its width, experts whole, each block's input through f =
// tensor_copy and its output through g = tensor_reduce). Over one member every path is the
// single-process one.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "loom/autograd.hpp"
#include "loom/error.hpp"
#include "loom/hf_interop.hpp"
#include "loom/kinds/attention.hpp"
#include "loom/model_support.hpp"
#include "loom/option_binding.hpp"
#include "loom/options.hpp"

namespace loom::models {

// A parameter's tensor, or an undefined one for a parameter the model does not have (a bias).
inline Tensor tensor_or_none(const Parameter* p) {
  return p ? p->tensor() : Tensor();
}

// The bias of a row-parallel layer, whose members' partial products g sums: member 0 adds it, so
// that it is added once; the others add it times 0, so that its (partial, zero) gradient exists
// on every member for the run layer's sum over the group.
inline Tensor row_parallel_bias(Ops& ops, int rank, const Parameter* bias) {
  if (!bias) return Tensor();
  return rank == 0 ? bias->tensor() : ops.scale(bias->tensor(), 0.0f);
}

// ---------------------------------------------------------------------------------------------
// Attention

// What the q/k norms (AttentionConfig::qk_norm) multiply each normalised head by.
enum class QkNormScale {
  weight,           // the weight itself (Qwen3's RMSNorm; its weights start at 1)
  one_plus_weight,  // 1 + weight (Gemma 3's Gemma3RMSNorm; its weights start at 0): the block
                    // adds its weights to a tensor of 1 that the model sets (set_qk_norm_ones)
};

struct AttentionConfig {
  std::int64_t hidden_dim = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  // The fused projection's layout: false: [q + 2 kv, hidden] (rows q heads | k heads | v heads,
  // nn.Linear's [out, in]); true: GPT-2's Conv1D [hidden, q + 2 kv], the same order in columns.
  // The output projection follows the same convention ([hidden, q] or [q, hidden]).
  bool weight_in_out = false;
  bool qkv_bias = false, out_bias = false;
  bool qk_norm = false;  // RMSNorm of each query and key head (weights [head_dim]) before RoPE
  QkNormScale qk_norm_scale = QkNormScale::weight;  // with qk_norm: the norms' scale
  float norm_eps = 1e-6f;
  AttentionParams params;  // this layer's: causal, window, soft-cap, scale
  // Parameter names under the block's prefix: "<qkv_name>.weight", "<out_name>.weight",
  // "q_norm.weight", "k_norm.weight".
  std::string qkv_name = "qkv_proj", out_name = "o_proj";
  std::string model = "model";  // "model (llama)", for messages
};

// RoPE with linear position scaling (transformers' rope_type "linear", Chen et al. 2023's
// position interpolation): every inverse frequency base^(-2i / head_dim) divided by `factor`,
// which is every position divided by it. RopeConfig has no field of its own for it (one would
// change its layout, which crosses the plugin boundary into RopeTable's constructor), so it is
// written as its Llama 3.1 rule with a low-frequency bound below every wavelength: the rule then
// divides each frequency by `factor`, the same single division. The bound is the least normal
// double, below 2 pi / f for every finite frequency f, whatever the base.
inline RopeConfig linear_rope(double base, double factor) {
  RopeConfig rope;
  rope.base = base;
  rope.llama3_scaling = true;
  rope.factor = factor;
  rope.low_freq_factor = 1.0;
  rope.high_freq_factor = 2.0;
  rope.original_max_positions = std::numeric_limits<double>::min();
  return rope;
}

// Where the tokens of one forward call sit and what they see.
struct AttentionInput {
  std::int64_t batch = 0, seq = 0;
  std::int64_t offset = 0;        // position of the first token (the cache's length)
  Tensor segments;                // undefined: each row is one document
  LayerKvCache* cache = nullptr;  // with a cache, keys and values are appended to `layer`'s
  std::int64_t layer = 0;
  const RopeTable* rope = nullptr;  // null: no rotary embedding
};

class AttentionBlock {
 public:
  // Declares, in this order, the fused q/k/v projection (and its bias), the q and k norms, the
  // output projection (and its bias) under `prefix` ("layers.3.self_attn.").
  //
  // Tensor parallelism over T members: the query heads are split (T divides num_heads), each
  // member computing heads [r H/T, (r + 1) H/T); the key/value heads are split too when T
  // divides num_kv_heads, else (T a multiple of num_kv_heads) the fused projection is
  // replicated and each member slices the one key/value head its query heads share: the
  // replicated rows' gradients are then partial (replicated_partial), summed by the run layer.
  // The q/k norms see only the member's heads: partial too. The output projection is
  // row-parallel; its bias, added by member 0 alone before g's sum, has a partial gradient.
  void declare(ParameterStore& store, const std::string& prefix, AttentionConfig config) {
    c_ = std::move(config);
    rank_ = store.tensor_rank();
    size_ = store.tensor_size();
    const std::int64_t heads = c_.num_heads, kv_heads = c_.num_kv_heads, d = c_.head_dim;
    if (size_ > 1) {
      const std::string t = std::to_string(size_);
      if (heads % size_ != 0)
        throw UserError(c_.model + ": tensor parallelism over " + t +
                        " ranks splits attention by query heads, and num_heads (" + std::to_string(heads) +
                        ") is not a multiple of " + t);
      if (kv_heads % size_ != 0 && size_ % kv_heads != 0)
        throw UserError(c_.model + ": tensor parallelism over " + t + " ranks splits the " + std::to_string(kv_heads) +
                        " key/value heads (num_kv_heads) when " + t +
                        " divides them, or replicates them when they "
                        "divide " +
                        t + "; " + std::to_string(kv_heads) + " does neither");
    }
    replicated_kv_ = size_ > 1 && kv_heads % size_ != 0;
    if (replicated_kv_ && c_.weight_in_out)
      throw InternalError("AttentionBlock: replicated key/value heads in a Conv1D layout");
    local_heads_ = heads / size_;
    local_kv_heads_ = replicated_kv_ ? 1 : kv_heads / size_;
    const std::int64_t q = heads * d, kv = kv_heads * d, qkv = q + 2 * kv, c = c_.hidden_dim;
    const std::string in = prefix + c_.qkv_name, out = prefix + c_.out_name;
    const bool split = size_ > 1;
    const TensorPlacement partial = TensorPlacement::replicated_partial();
    // By heads: the q, k and v rows (Conv1D: columns) are three parts, each split evenly.
    const auto by_heads = [&](int dim) {
      if (!split) return TensorPlacement::replicated();
      return replicated_kv_ ? partial : TensorPlacement::split_along(dim, "column", {q, kv, kv});
    };
    const TensorPlacement row =
        split ? TensorPlacement::split_along(c_.weight_in_out ? 0 : 1, "row") : TensorPlacement::replicated();
    store.declare(in + ".weight", c_.weight_in_out ? Shape{c, qkv} : Shape{qkv, c}, ParameterRole::weight, &qkv_weight_,
                  by_heads(c_.weight_in_out ? 1 : 0));
    if (c_.qkv_bias) store.declare(in + ".bias", Shape{qkv}, ParameterRole::bias, &qkv_bias_, by_heads(0));
    if (c_.qk_norm) {
      const TensorPlacement norm = split ? partial : TensorPlacement::replicated();
      store.declare(prefix + "q_norm.weight", Shape{d}, ParameterRole::norm, &q_norm_, norm);
      store.declare(prefix + "k_norm.weight", Shape{d}, ParameterRole::norm, &k_norm_, norm);
    }
    store.declare(out + ".weight", c_.weight_in_out ? Shape{q, c} : Shape{c, q}, ParameterRole::weight, &out_weight_,
                  row);
    if (c_.out_bias)
      store.declare(out + ".bias", Shape{c}, ParameterRole::bias, &out_bias_,
                    split ? partial : TensorPlacement::replicated());
  }

  // x [batch, seq, hidden] (normed) -> the output projection's [batch, seq, hidden].
  Tensor forward(Ops& ops, const Tensor& x, const AttentionInput& in) const {
    const std::int64_t heads = local_heads_, kv_heads = local_kv_heads_, d = c_.head_dim;
    LinearOptions layout;
    layout.weight_in_out = c_.weight_in_out;
    Tensor q, k, v;
    if (replicated_kv_) {
      // This member's query heads, and the key/value head they share, from the whole projection.
      const Tensor xin = ops.tensor_copy(x);
      const std::int64_t q_rows = c_.num_heads * d, kv_rows = c_.num_kv_heads * d;
      const std::int64_t kv_head = rank_ * c_.num_kv_heads / size_;
      const auto rows = [&](std::int64_t begin, std::int64_t count) {
        const Tensor w = qkv_weight_->tensor().slice(0, begin, begin + count);
        const Tensor b = qkv_bias_ ? qkv_bias_->tensor().slice(0, begin, begin + count) : Tensor();
        return ops.linear(xin, w, b, layout).view(Shape{in.batch, in.seq, count / d, d});
      };
      q = rows(rank_ * heads * d, heads * d);
      k = rows(q_rows + kv_head * d, d);
      v = rows(q_rows + kv_rows + kv_head * d, d);
    } else {
      // One GEMM for q, k and v; the three are slices of its output, which the attention kernel
      // reads in place (and whose gradients land in one buffer). Split, this member's shard is
      // [its q heads | its k heads | its v heads].
      const Tensor xin = size_ > 1 ? ops.tensor_copy(x) : x;
      const Tensor qkv = ops.linear(xin, qkv_weight_->tensor(), tensor_or_none(qkv_bias_), layout)
                             .view(Shape{in.batch, in.seq, heads + 2 * kv_heads, d});
      q = qkv.slice(2, 0, heads);
      k = qkv.slice(2, heads, heads + kv_heads);
      v = qkv.slice(2, heads + kv_heads, heads + 2 * kv_heads);
    }
    if (c_.qk_norm) {
      q = ops.rms_norm(q, qk_norm_scale(ops, q_norm_), c_.norm_eps);
      k = ops.rms_norm(k, qk_norm_scale(ops, k_norm_), c_.norm_eps);
    }
    if (in.rope) {
      q = ops.rope(q, *in.rope, Tensor(), in.offset);
      k = ops.rope(k, *in.rope, Tensor(), in.offset);
    }
    if (in.cache) std::tie(k, v) = in.cache->append(in.layer, k, v);
    const Tensor a =
        ops.attention(*kernel_, q, k, v, c_.params, in.segments, in.segments).view(Shape{in.batch, in.seq, heads * d});
    if (size_ == 1) return ops.linear(a, out_weight_->tensor(), tensor_or_none(out_bias_), layout);
    return ops.tensor_reduce(ops.linear(a, out_weight_->tensor(), row_parallel_bias(ops, rank_, out_bias_), layout));
  }

  // The kernel is the model's (one for every layer); set before the first forward pass.
  void set_kernel(AttentionKernel& kernel) { kernel_ = &kernel; }
  // With qk_norm_scale one_plus_weight: a float32 [head_dim] tensor of 1 in the parameters' memory
  // (made once the store is allocated; one may serve every layer), to which each forward pass adds
  // the q and k norms' weights. Set before the first forward pass, like the kernel.
  void set_qk_norm_ones(Tensor ones) { qk_norm_ones_ = std::move(ones); }
  const AttentionConfig& config() const { return c_; }
  // The key/value heads this member caches (all of them over one member).
  std::int64_t local_kv_heads() const { return local_kv_heads_; }

 private:
  AttentionConfig c_;
  AttentionKernel* kernel_ = nullptr;
  int rank_ = 0, size_ = 1;
  bool replicated_kv_ = false;
  std::int64_t local_heads_ = 0, local_kv_heads_ = 0;
  Parameter *qkv_weight_ = nullptr, *qkv_bias_ = nullptr, *q_norm_ = nullptr, *k_norm_ = nullptr;
  Parameter *out_weight_ = nullptr, *out_bias_ = nullptr;
  Tensor qk_norm_ones_;  // qk_norm_scale one_plus_weight: [head_dim] of 1

  // The q or k norm's scale: its weight, or 1 + its weight (ones + weight, one add).
  Tensor qk_norm_scale(Ops& ops, const Parameter* norm) const {
    if (c_.qk_norm_scale == QkNormScale::weight) return norm->tensor();
    if (!qk_norm_ones_.defined())
      throw InternalError("AttentionBlock: qk_norm_scale one_plus_weight before set_qk_norm_ones");
    return ops.add(qk_norm_ones_, norm->tensor());
  }
};

// ---------------------------------------------------------------------------------------------
// MLP

enum class MlpKind {
  gelu,    // GPT-2: down(gelu_tanh(up x)), two matrices
  swiglu,  // Llama: down(silu(gate x) * up x)
  geglu,   // Gemma: down(gelu_tanh(gate x) * up x)
};

struct MlpConfig {
  std::int64_t hidden_dim = 0, intermediate_dim = 0;
  MlpKind kind = MlpKind::swiglu;
  bool bias = false;
  bool weight_in_out = false;  // GPT-2's Conv1D [in, out] weights
  // Parameter names under the block's prefix (gate only in the gated kinds).
  std::string gate_name = "gate_proj", up_name = "up_proj", down_name = "down_proj";
};

class MlpBlock {
 public:
  // Declares, in this order, the gate (gated kinds), up and down projections, each followed by
  // its bias. Tensor parallelism splits the intermediate width: gate and up column-parallel (and
  // their biases), down row-parallel, its bias added by member 0 alone before g's sum (a partial
  // gradient).
  void declare(ParameterStore& store, const std::string& prefix, MlpConfig config) {
    c_ = std::move(config);
    rank_ = store.tensor_rank();
    size_ = store.tensor_size();
    const bool split = size_ > 1;
    const std::int64_t c = c_.hidden_dim, f = c_.intermediate_dim;
    const Shape widen = c_.weight_in_out ? Shape{c, f} : Shape{f, c};
    const Shape narrow = c_.weight_in_out ? Shape{f, c} : Shape{c, f};
    const auto place = [&](int dim, const char* style) {
      return split ? TensorPlacement::split_along(dim, style) : TensorPlacement::replicated();
    };
    const TensorPlacement column = place(c_.weight_in_out ? 1 : 0, "column"), column_bias = place(0, "column");
    const TensorPlacement row = place(c_.weight_in_out ? 0 : 1, "row");
    const TensorPlacement row_bias = split ? TensorPlacement::replicated_partial() : TensorPlacement::replicated();
    const auto matrix = [&](const std::string& name, const Shape& shape, std::int64_t out, Parameter** w, Parameter** b,
                            const TensorPlacement& wp, const TensorPlacement& bp) {
      store.declare(prefix + name + ".weight", shape, ParameterRole::weight, w, wp);
      if (c_.bias) store.declare(prefix + name + ".bias", Shape{out}, ParameterRole::bias, b, bp);
    };
    if (c_.kind != MlpKind::gelu) matrix(c_.gate_name, widen, f, &gate_weight_, &gate_bias_, column, column_bias);
    matrix(c_.up_name, widen, f, &up_weight_, &up_bias_, column, column_bias);
    matrix(c_.down_name, narrow, c, &down_weight_, &down_bias_, row, row_bias);
  }

  // x [..., hidden] (normed) -> [..., hidden].
  Tensor forward(Ops& ops, const Tensor& input) const {
    if (size_ > 1) {
      return ops.tensor_reduce(product(ops, ops.tensor_copy(input), row_parallel_bias(ops, rank_, down_bias_)));
    }
    return product(ops, input, tensor_or_none(down_bias_));
  }

  const MlpConfig& config() const { return c_; }

 private:
  // The MLP of x with `down_bias` (this member's part under tensor parallelism).
  Tensor product(Ops& ops, const Tensor& x, const Tensor& down_bias) const {
    LinearOptions layout;
    layout.weight_in_out = c_.weight_in_out;
    if (c_.kind == MlpKind::gelu) {
      LinearOptions gelu = layout;
      gelu.activation = Activation::gelu_tanh;
      const Tensor m = ops.linear(x, up_weight_->tensor(), tensor_or_none(up_bias_), gelu);
      return ops.linear(m, down_weight_->tensor(), down_bias, layout);
    }
    Tensor hidden;
    if (c_.kind == MlpKind::swiglu) {
      const Tensor gate = ops.linear(x, gate_weight_->tensor(), tensor_or_none(gate_bias_), layout);
      const Tensor up = ops.linear(x, up_weight_->tensor(), tensor_or_none(up_bias_), layout);
      hidden = ops.swiglu(gate, up);
    } else {
      LinearOptions gelu = layout;
      gelu.activation = Activation::gelu_tanh;
      const Tensor gate = ops.linear(x, gate_weight_->tensor(), tensor_or_none(gate_bias_), gelu);
      const Tensor up = ops.linear(x, up_weight_->tensor(), tensor_or_none(up_bias_), layout);
      hidden = ops.mul(gate, up);
    }
    return ops.linear(hidden, down_weight_->tensor(), down_bias, layout);
  }

  MlpConfig c_;
  int rank_ = 0, size_ = 1;
  Parameter *gate_weight_ = nullptr, *gate_bias_ = nullptr, *up_weight_ = nullptr, *up_bias_ = nullptr;
  Parameter *down_weight_ = nullptr, *down_bias_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// Mixture of experts

struct MoeConfig {
  std::int64_t hidden_dim = 0, intermediate_dim = 0;
  std::int64_t num_experts = 0, experts_per_token = 2;
  bool softmax_after_top_k = true;  // Mixtral; false: DeepSeek's probabilities of the full softmax
  double aux_loss_coef = 0.0, z_loss_coef = 0.0;
  std::string model = "model";  // "model (llama)", for messages
};

// The `moe` options (a model's `moe:` object), bound to MoeConfig's fields (option_binding.hpp);
// num_experts 0 is a dense MLP. The widths and `model` are the model's to fill in. A model whose
// options are an OptionBinding declares and reads them as one object, then checks them where it
// checks its other combinations:
//   s.object("moe", &LlamaOptions::moe, loom::models::moe_options(), "Sparse mixture of experts ...");
//   s.then([](LlamaOptions& o, const loom::Options&) { loom::models::check_moe_options(o.moe, o.path); ... });
inline OptionBinding<MoeConfig> moe_options() {
  OptionBinding<MoeConfig> s;
  s.field("num_experts", &MoeConfig::num_experts, 0,
          "Experts per layer in place of the MLP (Mixtral: 8); 0: a dense MLP.")
      .min(0)
      .max(static_cast<double>(max_model_experts));
  s.field("experts_per_token", &MoeConfig::experts_per_token, 2, "Experts each token is routed to (top-k).")
      .min(1)
      .max(static_cast<double>(max_model_experts));
  s.choice("router_softmax", &MoeConfig::softmax_after_top_k, true,
           Choices<bool>{{"after_top_k", true}, {"before_top_k", false}},
           "after_top_k: gate weights are the softmax over the chosen experts' logits (Mixtral, whose softmax then "
           "renormalisation is the same); before_top_k: the full softmax's probabilities of the chosen experts, not "
           "renormalised (DeepSeek).");
  s.field("router_aux_loss_coef", &MoeConfig::aux_loss_coef, 0.001,
          "Weight of the load-balancing loss (Switch / transformers' Mixtral, over all layers' tokens).")
      .min(0.0);
  s.field("router_z_loss_coef", &MoeConfig::z_loss_coef, 0.0,
          "Weight of the router z-loss (ST-MoE): mean of logsumexp(logits)^2.")
      .min(0.0);
  return s;
}

// The declaration alone (moe_options().schema()), for a model that declares its options on an
// OptionSchema and reads them with read_moe_options.
inline OptionSchema moe_schema() {
  return moe_options().schema();
}

// What the `moe` options imply together, for the model's options at `at` ("model"): no more
// experts per token than experts.
inline void check_moe_options(const MoeConfig& m, const std::string& at) {
  if (m.num_experts > 0 && m.experts_per_token > m.num_experts)
    throw UserError(at + ".moe.experts_per_token (" + std::to_string(m.experts_per_token) +
                    ") exceeds moe.num_experts (" + std::to_string(m.num_experts) + ")");
}

// Reads moe_schema's options, the `moe` object of the model's options at `at` ("model"), and
// checks them (check_moe_options); the widths are the model's to fill in.
inline MoeConfig read_moe_options(const Options& moe, const std::string& at) {
  MoeConfig m = moe_options().read(moe);
  check_moe_options(m, at);
  return m;
}

// What one layer's router decided in a forward pass, for the auxiliary losses.
struct RouterRecord {
  Tensor logits, probs;              // [tokens, experts], recorded
  std::vector<std::int32_t> counts;  // [experts]: the tokens routed to each (a host copy)
};

class MoeBlock {
 public:
  // Declares the router "gate.weight" [experts, hidden] and every expert's w1 (gate), w3 (up) and
  // w2 (down) stacked along rows, Mixtral's names: "experts.w1.weight" [experts * intermediate,
  // hidden], "experts.w3.weight" the same, "experts.w2.weight" [experts * hidden, intermediate].
  //
  // Tensor parallelism places whole experts (expert parallelism within the tensor group): member
  // r holds experts [r E/T, (r + 1) E/T) (T divides E). The router is replicated and every
  // member routes every token alike (they hold the same tokens), runs its experts on their
  // tokens, and the members' partial outputs are summed as a row-parallel layer's (g). The gate
  // weights pass through f, so the router's gradient, summed from the members' experts, is the
  // same on every member.
  void declare(ParameterStore& store, const std::string& prefix, MoeConfig config) {
    c_ = std::move(config);
    rank_ = store.tensor_rank();
    size_ = store.tensor_size();
    const std::int64_t e = c_.num_experts, c = c_.hidden_dim, f = c_.intermediate_dim;
    if (size_ > 1 && e % size_ != 0)
      throw UserError(c_.model + ": tensor parallelism over " + std::to_string(size_) +
                      " ranks places whole experts on each, and moe.num_experts (" + std::to_string(e) +
                      ") is not a multiple of " + std::to_string(size_));
    const TensorPlacement experts =
        size_ > 1 ? TensorPlacement::split_along(0, "experts") : TensorPlacement::replicated();
    store.declare(prefix + "gate.weight", Shape{e, c}, ParameterRole::weight, &router_);
    store.declare(prefix + "experts.w1.weight", Shape{e * f, c}, ParameterRole::weight, &w1_, experts);
    store.declare(prefix + "experts.w3.weight", Shape{e * f, c}, ParameterRole::weight, &w3_, experts);
    store.declare(prefix + "experts.w2.weight", Shape{e * c, f}, ParameterRole::weight, &w2_, experts);
  }

  // The sparse mixture of experts over x [batch, seq, hidden] (normed):
  //   router logits r = x W_r^T [tokens, experts]; each token's experts_per_token largest;
  //   gate weights: softmax over the chosen logits (after_top_k: Mixtral's renormalised top-k)
  //   or the full softmax's probabilities of the chosen (before_top_k: DeepSeek);
  //   out = sum over the chosen experts of gate * w2(silu(w1 x) * w3 x).
  // Dropless: every expert runs on exactly the tokens routed to it, gathered into one matrix
  // (three matrix products per expert over those rows); the outputs are concatenated and each
  // token's k rows combined with its gate weights in one batched product. The router's decision
  // is appended to `records`.
  Tensor forward(Ops& ops, const Tensor& x, std::vector<RouterRecord>& records) const {
    const std::int64_t c = c_.hidden_dim, f = c_.intermediate_dim, e_count = c_.num_experts;
    const std::int64_t k = c_.experts_per_token;
    const std::int64_t tokens = x.numel() / c;
    const Tensor xf = x.view(Shape{tokens, c});
    const Tensor logits = ops.linear(xf, router_->tensor());  // [tokens, experts]
    // This member's experts [first, last) (all of them over one member).
    const std::int64_t first = rank_ * e_count / size_, last = (rank_ + 1) * e_count / size_;
    const bool split = size_ > 1;
    // The choices, their expert-sorted order and the experts' counts, computed where the logits
    // are (Backend::route_top_k; ties: the lower expert id). The counts are the one copy to the
    // host of each forward: dropless routing gives every expert a number of rows that depends on
    // the data, and the host sizes the experts' matrix products (as MegaBlocks and PyTorch's
    // dropless implementations copy tokens_per_expert to the CPU). Everything else (the ids of
    // the gathers, each expert's slice of the sorted tokens) stays in the backend's memory.
    const TopKRouting route = ops.route_top_k(logits, k, first, last);
    RouterRecord record;
    record.counts = route.counts.to_int_vector();

    const Tensor probs = ops.softmax(logits);
    const Tensor gates =
        c_.softmax_after_top_k
            ? ops.softmax(ops.embedding_of_valid_ids(logits.view(Shape{tokens * e_count, 1}), route.chosen)
                              .view(Shape{tokens, k}))
            : ops.embedding_of_valid_ids(probs.view(Shape{tokens * e_count, 1}), route.chosen).view(Shape{tokens, k});

    std::vector<Tensor> outputs;
    const Tensor xin = split ? ops.tensor_copy(xf) : xf;
    // Expert `local` of this member (its rows in the member's shards) on the rows `xe` [n, hidden].
    const auto expert = [&](std::int64_t local, const Tensor& xe) {
      const Tensor gate = ops.linear(xe, w1_->tensor().slice(0, local * f, (local + 1) * f));
      const Tensor up = ops.linear(xe, w3_->tensor().slice(0, local * f, (local + 1) * f));
      return ops.linear(ops.swiglu(gate, up), w2_->tensor().slice(0, local * c, (local + 1) * c));
    };
    std::int64_t begin = 0;  // expert e's tokens in route.sorted: after those of experts [0, e)
    for (std::int64_t e = 0; e < last; begin += record.counts[static_cast<std::size_t>(e)], ++e) {
      const std::int64_t n = record.counts[static_cast<std::size_t>(e)];
      if (e < first || n == 0) continue;
      outputs.push_back(expert(e - first, ops.embedding_of_valid_ids(xin, route.sorted.slice(0, begin, begin + n))));
    }
    if (split) {
      // The zero row of the other members' choices, taken from xin so that f's backward pass (an
      // all-reduce every member must join) runs even on a member none of whose experts got tokens.
      const Tensor first_row = Tensor::zeros(Shape{1}, DType::i32, ops.device());
      Tensor zero_row = ops.scale(ops.embedding_of_valid_ids(xin, first_row), 0.0f);
      // A member none of whose experts got a token runs its first expert on that row (zeros in,
      // zeros out), so that its experts' weights are reached on every member whatever the routing,
      // their gradients (zeros here) final at the same point of the backward pass as where they
      // got tokens: the data axis's ranks then post their gradients' reductions in one order.
      if (outputs.empty()) zero_row = expert(0, zero_row);
      outputs.push_back(zero_row);
    }
    const Tensor expert_out = ops.concat(outputs);                            // [tokens * k, hidden]
    const Tensor mine = ops.embedding_of_valid_ids(expert_out, route.slots);  // [tokens, k, hidden]
    const Tensor weights = split ? ops.tensor_copy(gates) : gates;
    Tensor out = ops.matmul(weights.view(Shape{tokens, 1, k}), mine);  // [tokens, 1, hidden]
    if (split) out = ops.tensor_reduce(out);
    record.logits = logits;
    record.probs = probs;
    records.push_back(std::move(record));
    return out.view(x.shape());
  }

  const MoeConfig& config() const { return c_; }

 private:
  MoeConfig c_;
  int rank_ = 0, size_ = 1;
  Parameter *router_ = nullptr, *w1_ = nullptr, *w3_ = nullptr, *w2_ = nullptr;
};

// One decoder layer with a MoeBlock (its body appends one record to `records`), run under
// `policy`. Without remat it is run_layer. Under remat the router's logits are an output of the
// checkpointed segment, so that the auxiliary losses (computed after every layer, from the
// records) reach the router through the recomputation: the segment's record keeps the experts'
// counts, its logits and probabilities are replaced by the recorded output. A recomputation in
// the backward pass makes the same choices and leaves no record.
inline std::pair<Tensor, Tensor> run_moe_layer(Ops& ops, RematPolicy policy, const Tensor& h, const Tensor& x,
                                               LayerBody body, std::vector<RouterRecord>& records) {
  if (policy == RematPolicy::none) return run_layer(ops, policy, h, x, std::move(body));
  const Tensor inputs[2] = {h, x};
  auto first_run = std::make_shared<bool>(true);
  std::vector<RouterRecord>* log = &records;  // the model's, which outlives the backward pass
  const auto out = ops.checkpoint(
      inputs,
      [body = std::move(body), first_run, log](Ops& o, std::span<const Tensor> in) {
        auto [h2, x2] = body(o, in[0], in[1]);
        Tensor logits = log->back().logits;
        if (!*first_run) log->pop_back();
        *first_run = false;
        return std::vector<Tensor>{std::move(h2), std::move(x2), std::move(logits)};
      },
      policy);
  records.back().logits = out[2];
  records.back().probs = ops.softmax(out[2]);
  return {out[0], out[1]};
}

// The values moe_auxiliary_loss reports (Model::metrics: router_aux_loss, router_z_loss,
// expert_load/<e>), kept where they were computed until the trainer logs them.
struct MoeMetrics {
  Tensor losses;             // [2]: the unweighted load-balancing loss and z-loss; undefined: none
  std::vector<double> load;  // per expert: its share of the (token, choice) pairs

  // By name: one copy of two floats to the host (none when the losses are host memory).
  std::vector<std::pair<std::string, double>> read() const {
    std::vector<std::pair<std::string, double>> out;
    if (!losses.defined()) return out;
    const std::vector<float> v = losses.to_vector();
    out.emplace_back("router_aux_loss", v[0]);
    out.emplace_back("router_z_loss", v[1]);
    for (std::size_t e = 0; e < load.size(); ++e) out.emplace_back("expert_load/" + std::to_string(e), load[e]);
    return out;
  }
};

// The routers' auxiliary losses of a forward pass's `records` (every MoE layer's, cleared here),
// and their values in `metrics`:
//   load balancing (Switch; transformers' load_balancing_loss_func over every layer's tokens
//   together): experts * sum_e f_e * P_e, f_e the share of the (token, choice) pairs routed to
//   expert e, P_e its mean router probability;
//   z-loss (ST-MoE): the mean over layers and tokens of logsumexp(router logits)^2.
// Returns the weighted sum, recorded, or undefined without records.
//
// Computed in the backend's memory: the shares f_e come from the records' counts (on the host
// already), the probabilities and log-sum-exps stay where they are. The load-balancing loss is
// linear in the probabilities (the shares are constants), so each layer contributes
// sum(probs * w) with w[t, e] = coef * experts * count_e / all^2: the host makes w's one row
// [experts] (and the metric's, without coef) and copies the two rows to the device in one copy,
// and an embedding of a row with id 0 for every token broadcasts it to [tokens, experts] (Ops
// has no broadcasting product, and the sum must run over the same [tokens, experts] products as
// ever to keep its bits). The metrics
// are computed without recording, in float32, and read only when logged (MoeMetrics::read).
inline Tensor moe_auxiliary_loss(Ops& ops, const MoeConfig& config, std::vector<RouterRecord>& records,
                                 MoeMetrics& metrics) {
  metrics = MoeMetrics();
  if (records.empty()) return Tensor();
  const std::int64_t e_count = config.num_experts, k = config.experts_per_token;
  const std::int64_t tokens = records.front().probs.size(0);
  const auto all = static_cast<double>(tokens * static_cast<std::int64_t>(records.size()));
  std::vector<double> counts(static_cast<std::size_t>(e_count), 0.0);
  for (const auto& r : records)
    for (std::size_t e = 0; e < counts.size(); ++e) counts[e] += r.counts[e];
  // Per-expert load: the share of (token, choice) pairs routed to each expert (1 / experts when
  // balanced).
  for (const double count : counts) metrics.load.push_back(count / (all * static_cast<double>(k)));

  // Row 0: the loss's weights per expert; row 1: the metric's (coef 1).
  std::vector<float> rows(static_cast<std::size_t>(2 * e_count));
  for (std::size_t e = 0; e < counts.size(); ++e) {
    const double unit = static_cast<double>(e_count) * counts[e] / (all * all);
    rows[e] = static_cast<float>(config.aux_loss_coef * unit);
    rows[counts.size() + e] = static_cast<float>(unit);
  }
  const Tensor table = Tensor::from(std::span<const float>(rows), Shape{2, e_count}).to(ops.device());
  const Tensor every_token = Tensor::zeros(Shape{tokens}, DType::i32, ops.device());  // row 0 of a row
  const auto broadcast = [&](std::int64_t row) {
    return ops.embedding_of_valid_ids(table.slice(0, row, row + 1), every_token);  // [tokens, experts]
  };

  // The metrics' operations are not recorded; the recorded ones (the losses) run in the order
  // they always have, which fixes the order of the gradients' sums in the backward pass.
  const auto unrecorded = [&](const auto& compute) {
    std::optional<NoGradGuard> guard;
    if (ops.tape()) guard.emplace(*ops.tape());
    compute();
  };
  const auto accumulate = [&](Tensor& sum, const Tensor& t) { sum = sum.defined() ? ops.add(sum, t) : t; };
  Tensor total, balance, z_sum;
  if (config.aux_loss_coef > 0.0) {
    const Tensor weights = broadcast(0);
    for (const auto& r : records) accumulate(total, ops.sum(ops.mul(r.probs, weights)));
  }
  unrecorded([&] {
    const Tensor unit = broadcast(1);
    for (const auto& r : records) accumulate(balance, ops.sum(ops.mul(r.probs, unit)));
  });
  for (const auto& r : records) {
    const auto squares = [&] {
      const Tensor lse = ops.logsumexp(r.logits);
      return ops.sum(ops.mul(lse, lse));
    };
    if (config.z_loss_coef > 0.0) {
      const Tensor layer = squares();
      accumulate(total, ops.scale(layer, static_cast<float>(config.z_loss_coef / all)));
      unrecorded([&] { accumulate(z_sum, layer); });
    } else {
      unrecorded([&] { accumulate(z_sum, squares()); });
    }
  }
  unrecorded([&] {
    const Tensor parts[2] = {balance.view(Shape{1}), ops.scale(z_sum, static_cast<float>(1.0 / all)).view(Shape{1})};
    metrics.losses = ops.concat(parts);
  });
  records.clear();
  return total;
}

// ---------------------------------------------------------------------------------------------
// Option reading and the Hugging Face mapping the built-in models share

// Where a component's options sit in the config, for messages ("model").
inline std::string options_path(const Options& options) {
  return options.path().empty() ? "model" : options.path();
}

// The UserError of grouped-query attention whose key/value heads do not divide the query heads.
inline void check_kv_heads(const std::string& at, std::int64_t num_heads, std::int64_t num_kv_heads) {
  if (num_heads % num_kv_heads != 0)
    throw UserError(at + ": num_kv_heads (" + std::to_string(num_kv_heads) + ") must divide num_heads (" +
                    std::to_string(num_heads) + ")");
}

// The UserError of an odd head width under rotary embeddings.
inline void check_rotary_head_dim(const std::string& at, std::int64_t head_dim) {
  if (head_dim % 2 != 0)
    throw UserError(at + ": head_dim is " + std::to_string(head_dim) +
                    "; rotary embeddings rotate pairs of features, so it must be even");
}

// The Hugging Face tensors of a Llama-layout model (base_model_prefix "model"): "lm_head.weight"
// as is, a MoeBlock's stacked experts as one tensor per expert ("experts.3.w1.weight", rows
// [3 n, 4 n) of the stacked parameter), the fused q/k/v projection split into q_proj, k_proj and
// v_proj (add_llama_layout_tensors), every other parameter "model." + its name.
inline HfTensorLayout llama_layout(const ParameterStore& store, std::int64_t vocab, std::int64_t num_heads,
                                   std::int64_t num_kv_heads, std::int64_t head_dim, std::int64_t num_experts = 0) {
  static const std::string experts_name = "block_sparse_moe.experts.";
  HfTensorLayout layout;
  layout.base_model_prefix = "model";
  const std::int64_t q = num_heads * head_dim, kv = num_kv_heads * head_dim;
  const auto& params = store.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::string& name = params[i].parameter->name();
    const std::int64_t rows = store.whole_shape(i)[0];  // the whole tensor's: export assembles shards
    if (name == "lm_head.weight") {
      layout.tensors.push_back({name, name, 0, vocab});
      continue;
    }
    const auto experts = name.find(experts_name);
    if (experts != std::string::npos && num_experts > 0) {
      const std::string head = "model." + name.substr(0, experts) + experts_name;
      const std::string tail = name.substr(experts + experts_name.size());  // w1.weight
      const std::int64_t n = rows / num_experts;
      for (std::int64_t e = 0; e < num_experts; ++e)
        layout.tensors.push_back({head + std::to_string(e) + "." + tail, name, e * n, (e + 1) * n});
      continue;
    }
    add_llama_layout_tensors(layout, name, rows, q, kv);
  }
  return layout;
}

}  // namespace loom::models
