#include "tiny_model.hpp"

#include <cmath>
#include <loom/random.hpp>
#include <string>
#include <vector>

namespace loom::test {

TinyModel::TinyModel(const TinyModelConfig& c, std::uint64_t seed, const Device& device)
    : config_(c),
      device_(device),
      rope_(RopeConfig{.base = 10000.0, .llama3_scaling = true, .original_max_positions = 16.0}, c.dim / c.heads,
            c.seq) {
  const auto ones = [&](std::int64_t n) { return Tensor::full(Shape{n}, 1.0f).to(device_); };
  const float s = 0.3f / std::sqrt(static_cast<float>(c.dim));
  std::uint64_t k = stream_key(seed, 1, 0);
  add("wte", {c.vocab, c.dim}, 0.5f, ++k);
  add("wpe", {c.seq, c.dim}, 0.1f, ++k);
  const std::int64_t hd = c.dim / c.heads, qkv = (c.heads + 2 * c.kv_heads) * hd;
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "layer" + std::to_string(l) + ".";
    params_.emplace_back(p + "ln1.w", ones(c.dim));
    add(p + "ln1.b", {c.dim}, 0.02f, ++k);
    add(p + "qkv.w", {qkv, c.dim}, s, ++k);
    add(p + "qkv.b", {qkv}, 0.02f, ++k);
    add(p + "proj.w", {c.dim, c.dim}, s, ++k);
    add(p + "proj.b", {c.dim}, 0.02f, ++k);
    params_.emplace_back(p + "ln2.w", ones(c.dim));
    add(p + "ln2.b", {c.dim}, 0.02f, ++k);
    add(p + "fc.w", {c.ffn, c.dim}, s, ++k);
    add(p + "fc.b", {c.ffn}, 0.02f, ++k);
    add(p + "fcproj.w", {c.dim, c.ffn}, s, ++k);
    add(p + "fcproj.b", {c.dim}, 0.02f, ++k);
    params_.emplace_back(p + "rms.w", ones(c.dim));
    add(p + "gate.w", {c.dim, c.ffn}, s, ++k);  // [in, out]
    add(p + "up.w", {c.ffn, c.dim}, s, ++k);
    add(p + "down.w", {c.dim, c.ffn}, s, ++k);
  }
  params_.emplace_back("lnf.w", ones(c.dim));
  add("lnf.b", {c.dim}, 0.02f, ++k);
  std::vector<std::int32_t> pos(static_cast<std::size_t>(c.batch * c.seq));
  for (std::size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<std::int32_t>(i % static_cast<std::size_t>(c.seq));
  positions_ = Tensor::from(std::span<const std::int32_t>(pos), Shape{c.batch, c.seq}).to(device_);
}

Parameter& TinyModel::add(const std::string& name, const Shape& shape, float scale, std::uint64_t key) {
  return params_.emplace_back(name, random_tensor(shape, key, scale).to(device_));
}

std::pair<Tensor, Tensor> TinyModel::batch(std::uint64_t step) const {
  const TinyModelConfig& c = config_;
  Tensor tokens = random_ids({c.batch, c.seq}, static_cast<std::int32_t>(c.vocab), stream_key(7, 2, step));
  Tensor targets = random_ids({c.batch, c.seq}, static_cast<std::int32_t>(c.vocab), stream_key(7, 2, step + 1000));
  targets.data<std::int32_t>()[3] = -100;
  return {tokens.to(device_), targets.to(device_)};
}

Tensor TinyModel::loss(Ops& ops, AttentionKernel& attention, const Tensor& tokens, const Tensor& targets) {
  const TinyModelConfig& c = config_;
  const std::int64_t hd = c.dim / c.heads;
  std::size_t i = 0;
  auto next = [&]() -> const Tensor& { return params_[i++].tensor(); };
  const Tensor& wte = next();
  const Tensor& wpe = next();
  Tensor x = ops.add(ops.embedding(wte, tokens), ops.embedding(wpe, positions_));
  x = ops.dropout(x, c.dropout);
  Tensor h;  // the branch output to add to the residual stream
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const Tensor& ln1w = next();
    const Tensor& ln1b = next();
    Tensor ln = h.defined() ? [&] {
      auto [sum, normed] = ops.add_layer_norm(x, h, ln1w, ln1b);
      x = sum;
      return normed;
    }()
                            : ops.layer_norm(x, ln1w, ln1b);
    const Tensor& wqkv = next();
    const Tensor& bqkv = next();
    Tensor qkv = ops.linear(ln, wqkv, bqkv).view({c.batch, c.seq, c.heads + 2 * c.kv_heads, hd});
    Tensor q = ops.rope(qkv.slice(2, 0, c.heads), rope_);
    Tensor k = ops.rope(qkv.slice(2, c.heads, c.heads + c.kv_heads), rope_);
    Tensor v = qkv.slice(2, c.heads + c.kv_heads, c.heads + 2 * c.kv_heads);
    Tensor a = ops.attention(attention, q, k, v, AttentionParams{.causal = true, .window = 16, .softcap = 30.0f})
                   .view({c.batch, c.seq, c.dim});
    const Tensor& wproj = next();
    const Tensor& bproj = next();
    a = ops.linear(a, wproj, bproj);
    const Tensor& ln2w = next();
    const Tensor& ln2b = next();
    auto [sum, ln2] = ops.add_layer_norm(x, a, ln2w, ln2b);
    x = sum;
    const Tensor& wfc = next();
    const Tensor& bfc = next();
    const Tensor& wfcp = next();
    const Tensor& bfcp = next();
    Tensor mlp = ops.linear(ops.linear(ln2, wfc, bfc, {.activation = Activation::gelu_tanh}), wfcp, bfcp);
    const Tensor& rmsw = next();
    const Tensor& wg = next();
    const Tensor& wu = next();
    const Tensor& wd = next();
    Tensor r = ops.rms_norm(x, rmsw);
    Tensor gate = ops.linear(r, wg, {}, {.weight_in_out = true});
    Tensor up = ops.silu(ops.linear(r, wu));
    Tensor glu = ops.linear(ops.swiglu(gate, up), wd);
    h = ops.add(ops.dropout(mlp, c.dropout), ops.scale(glu, 0.5f));
  }
  const Tensor& lnfw = next();
  const Tensor& lnfb = next();
  auto [final_x, lnf] = ops.add_layer_norm(x, h, lnfw, lnfb);
  (void)final_x;
  Tensor fused = ops.linear_cross_entropy(lnf, wte, targets, {.chunk_tokens = 7});
  Tensor logits = ops.matmul(lnf, wte, false, true);
  Tensor plain = ops.cross_entropy(logits, targets);
  logits.reset();
  return ops.add(ops.scale(fused, 0.75f), ops.scale(plain, 0.25f));
}

}  // namespace loom::test
