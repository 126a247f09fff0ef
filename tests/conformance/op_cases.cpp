#include "op_cases.hpp"

#include <loom/random.hpp>
#include <stdexcept>

namespace loom::test {

Dims::Dims(std::uint64_t seed) : key_(stream_key(seed, 9, 0)) {}

std::int64_t Dims::between(std::int64_t lo, std::int64_t hi) {
  return lo + static_cast<std::int64_t>(random_bits(key_, counter_++) % static_cast<std::uint32_t>(hi - lo + 1));
}

std::int64_t Dims::odd(std::int64_t lo, std::int64_t hi) {
  std::int64_t v = between(lo, hi) | 1;
  return v > hi ? v - 2 : v;
}

Tensor output_seed(const Shape& shape, std::size_t index) {
  return random_tensor(shape, stream_key(77, 4, index));
}

namespace {

Tensor rnd(Dims& d, const Shape& s, float scale = 1.0f) {
  return random_tensor(s, d.key(), scale);
}

// Targets in [0, vocab) with about one in five set to ignore_index (-100).
Tensor targets_with_ignored(Dims& d, const Shape& s, std::int32_t vocab) {
  Tensor t = random_ids(s, vocab, d.key());
  auto* p = t.data<std::int32_t>();
  for (std::int64_t i = 0; i < t.numel(); ++i)
    if (random_bits(d.key(), 0) % 5 == 0) p[i] = -100;
  p[0] = 0;  // at least one counted target
  return t;
}

// The fused loss's operands: hidden states [b, t, dim], an output matrix [vocab, dim] and targets
// with ignored positions, and (consts[1]) the chunk of tokens it computes at a time.
CaseData linear_cross_entropy_data(Dims& d) {
  const std::int64_t b = d.between(1, 2), t = d.odd(3, 13), dim = d.odd(5, 33), v = d.odd(29, 201);
  CaseData data;
  data.params = {rnd(d, {b, t, dim}), rnd(d, {v, dim}, 0.5f)};
  data.consts = {
      targets_with_ignored(d, {b, t}, static_cast<std::int32_t>(v)),
      Tensor::from(std::span<const std::int32_t>(std::vector<std::int32_t>{static_cast<std::int32_t>(d.between(1, 5))}),
                   Shape{1})};
  return data;
}

OpCase linear_case(std::string name, bool in_out, bool bias, Activation act) {
  OpCase c;
  c.name = std::move(name);
  c.make = [=](Dims& d) {
    const std::int64_t b = d.between(1, 3), t = d.odd(3, 9), k = d.odd(5, 37), n = d.odd(3, 41);
    CaseData data;
    data.params = {rnd(d, {b, t, k}), in_out ? rnd(d, {k, n}, 0.3f) : rnd(d, {n, k}, 0.3f)};
    if (bias) data.params.push_back(rnd(d, {n}));
    return data;
  };
  c.run = [=](CaseEnv& e) -> std::vector<Tensor> {
    return {e.ops.linear(e.p[0], e.p[1], bias ? e.p[2] : Tensor(), {.weight_in_out = in_out, .activation = act})};
  };
  return c;
}

OpCase matmul_case(std::string name, bool ta, bool tb, bool shared_b) {
  OpCase c;
  c.name = std::move(name);
  c.make = [=](Dims& d) {
    const std::int64_t b0 = d.between(1, 2), b1 = d.between(1, 3), m = d.odd(3, 13), k = d.odd(3, 17), n = d.odd(3, 15);
    CaseData data;
    const Shape a = ta ? Shape{b0, b1, k, m} : Shape{b0, b1, m, k};
    data.params.push_back(rnd(d, a));
    if (shared_b)
      data.params.push_back(rnd(d, tb ? Shape{n, k} : Shape{k, n}));
    else
      data.params.push_back(rnd(d, tb ? Shape{b0, b1, n, k} : Shape{b0, b1, k, n}));
    return data;
  };
  c.run = [=](CaseEnv& e) -> std::vector<Tensor> { return {e.ops.matmul(e.p[0], e.p[1], ta, tb)}; };
  return c;
}

OpCase norm_case(std::string name, bool rms, bool fused, bool affine) {
  OpCase c;
  c.name = std::move(name);
  c.make = [=](Dims& d) {
    const std::int64_t r = d.odd(1, 13), cols = d.odd(3, 77);
    CaseData data;
    Tensor x = rnd(d, {2, r, cols}, 2.0f);
    // An offset, so that LayerNorm's mean subtraction matters.
    for (float& v : std::span<float>(x.data<float>(), static_cast<std::size_t>(x.numel()))) v += 1.5f;
    if (fused) data.params.push_back(rnd(d, {2, r, cols}));
    data.params.push_back(x);
    if (affine) {
      Tensor w = rnd(d, {cols}, 0.3f);
      for (float& v : std::span<float>(w.data<float>(), static_cast<std::size_t>(cols))) v += 1.0f;
      data.params.push_back(w);
      if (!rms) data.params.push_back(rnd(d, {cols}, 0.3f));
    }
    return data;
  };
  c.run = [=](CaseEnv& e) -> std::vector<Tensor> {
    const int base = fused ? 1 : 0;
    const Tensor w = affine ? e.p[static_cast<std::size_t>(base + 1)] : Tensor();
    const Tensor b = affine && !rms ? e.p[static_cast<std::size_t>(base + 2)] : Tensor();
    const Tensor& x = e.p[static_cast<std::size_t>(base)];
    if (fused) {
      auto [sum, y] = rms ? e.ops.add_rms_norm(e.p[0], x, w) : e.ops.add_layer_norm(e.p[0], x, w, b);
      return {sum, y};
    }
    return {rms ? e.ops.rms_norm(x, w) : e.ops.layer_norm(x, w, b)};
  };
  c.fd_tol = 2e-2;
  return c;
}

OpCase pointwise_case(std::string name, int inputs, std::function<Tensor(CaseEnv&)> run) {
  OpCase c;
  c.name = std::move(name);
  c.make = [=](Dims& d) {
    const Shape s{d.odd(1, 5), d.odd(7, 61)};
    CaseData data;
    for (int i = 0; i < inputs; ++i) data.params.push_back(rnd(d, s, 2.5f));
    return data;
  };
  c.run = [run](CaseEnv& e) -> std::vector<Tensor> { return {run(e)}; };
  return c;
}

struct RopeVariant {
  bool interleaved, llama3, positions, strided;
};

OpCase rope_case(std::string name, RopeVariant v) {
  OpCase c;
  c.name = std::move(name);
  c.make = [=](Dims& d) {
    const std::int64_t b = d.between(1, 2), t = d.odd(3, 11), h = d.between(1, 3), hd = 2 * d.odd(1, 9);
    CaseData data;
    data.params.push_back(v.strided ? rnd(d, {b, t, 3 * h, hd}) : rnd(d, {b, t, h, hd}));
    RopeConfig cfg;
    cfg.interleaved = v.interleaved;
    if (v.llama3) {
      cfg.llama3_scaling = true;
      cfg.factor = 4.0;
      cfg.original_max_positions = 8.0;
    }
    data.rope = std::make_shared<RopeTable>(cfg, hd, 32);
    if (v.positions) data.consts.push_back(random_ids({b, t}, 32, d.key()));
    return data;
  };
  c.run = [=](CaseEnv& e) -> std::vector<Tensor> {
    Tensor x = e.p[0];
    if (v.strided) x = x.slice(2, x.size(2) / 3, 2 * (x.size(2) / 3));
    return {e.ops.rope(x, *e.data.rope, v.positions ? e.data.consts[0] : Tensor(), v.positions ? 0 : 3)};
  };
  return c;
}

struct AttentionVariant {
  bool causal;
  std::int64_t window;
  float softcap;
  bool segments;
  bool cache;  // fewer queries than keys
};

OpCase attention_case(std::string name, AttentionVariant v) {
  OpCase c;
  c.name = std::move(name);
  c.attention = true;
  c.make = [=](Dims& d) {
    const std::int64_t b = d.between(1, 2), s = d.odd(5, 11), kvh = d.between(1, 2), group = d.between(1, 2),
                       hd = d.odd(3, 9);
    const std::int64_t t = v.cache ? d.between(1, s - 1) : s;
    CaseData data;
    if (v.cache) {
      data.params = {rnd(d, {b, t, kvh * group, hd}), rnd(d, {b, s, kvh, hd}), rnd(d, {b, s, kvh, hd})};
    } else {
      data.params = {rnd(d, {b, s, kvh * group + 2 * kvh, hd})};  // a fused qkv projection
    }
    if (v.segments) {
      // Packed documents: segment ids non-decreasing along the sequence.
      std::vector<std::int32_t> seg(static_cast<std::size_t>(b * s));
      for (std::int64_t bi = 0; bi < b; ++bi) {
        std::int32_t id = 0;
        for (std::int64_t j = 0; j < s; ++j) {
          if (j > 0 && random_bits(d.key(), 0) % 3 == 0) ++id;
          seg[static_cast<std::size_t>(bi * s + j)] = id;
        }
      }
      data.consts.push_back(Tensor::from(std::span<const std::int32_t>(seg), Shape{b, s}));
    }
    return data;
  };
  c.run = [=](CaseEnv& e) -> std::vector<Tensor> {
    Tensor q, k, vv;
    if (v.cache) {
      q = e.p[0];
      k = e.p[1];
      vv = e.p[2];
    } else {
      const Tensor& qkv = e.p[0];
      const std::int64_t total = qkv.size(2);
      // total = kvh * group + 2 * kvh; recover kvh from the shape made above.
      std::int64_t kvh = 1;
      for (std::int64_t cand = 1; cand <= 2; ++cand)
        for (std::int64_t g = 1; g <= 2; ++g)
          if (cand * g + 2 * cand == total) kvh = cand;
      const std::int64_t qh = total - 2 * kvh;
      q = qkv.slice(2, 0, qh);
      k = qkv.slice(2, qh, qh + kvh);
      vv = qkv.slice(2, qh + kvh, total);
    }
    const Tensor seg = v.segments ? e.data.consts[0] : Tensor();
    const AttentionParams params{.causal = v.causal, .window = v.window, .softcap = v.softcap};
    if (!e.attention) throw std::runtime_error("no attention kernel computes on the backend's device");
    return {e.ops.attention(*e.attention, q, k, vv, params, seg, seg)};
  };
  return c;
}

std::vector<OpCase> build_cases() {
  std::vector<OpCase> cases;
  cases.push_back(linear_case("linear", false, true, Activation::none));
  cases.push_back(linear_case("linear_in_out_no_bias", true, false, Activation::none));
  cases.push_back(linear_case("linear_bias_gelu", false, true, Activation::gelu_tanh));
  cases.push_back(linear_case("linear_in_out_bias_silu", true, true, Activation::silu));
  {
    OpCase c;
    c.name = "linear_strided_operands";
    c.make = [](Dims& d) {
      const std::int64_t m = d.odd(3, 17), k = d.odd(5, 29), n = d.odd(3, 23);
      CaseData data;
      data.params = {rnd(d, {m, k + 5}), rnd(d, {n, k + 3}, 0.3f), rnd(d, {n})};
      data.consts.push_back(Tensor::from(
          std::span<const std::int32_t>(std::vector<std::int32_t>{static_cast<std::int32_t>(k)}), Shape{1}));
      return data;
    };
    c.run = [](CaseEnv& e) -> std::vector<Tensor> {
      const std::int64_t k = e.data.consts[0].to_int_vector()[0];
      return {e.ops.linear(e.p[0].slice(1, 2, 2 + k), e.p[1].slice(1, 1, 1 + k), e.p[2],
                           {.activation = Activation::gelu_tanh})};
    };
    cases.push_back(c);
  }
  cases.push_back(matmul_case("matmul_nn", false, false, false));
  cases.push_back(matmul_case("matmul_nt", false, true, false));
  cases.push_back(matmul_case("matmul_tn", true, false, false));
  cases.push_back(matmul_case("matmul_tt", true, true, false));
  cases.push_back(matmul_case("matmul_shared_b", false, false, true));
  cases.push_back(matmul_case("matmul_shared_b_tt", true, true, true));
  {
    OpCase c;
    c.name = "embedding";
    c.make = [](Dims& d) {
      const std::int64_t v = d.odd(5, 31), dim = d.odd(3, 67);
      CaseData data;
      data.params = {rnd(d, {v, dim})};
      data.consts = {random_ids({d.between(1, 3), d.odd(5, 33)}, static_cast<std::int32_t>(v), d.key())};
      return data;
    };
    c.run = [](CaseEnv& e) -> std::vector<Tensor> { return {e.ops.embedding(e.p[0], e.data.consts[0])}; };
    cases.push_back(c);
  }
  cases.push_back(norm_case("layer_norm", false, false, true));
  cases.push_back(norm_case("layer_norm_no_affine", false, false, false));
  cases.push_back(norm_case("rms_norm", true, false, true));
  cases.push_back(norm_case("rms_norm_no_weight", true, false, false));
  cases.push_back(norm_case("add_layer_norm", false, true, true));
  cases.push_back(norm_case("add_rms_norm", true, true, true));
  cases.push_back(pointwise_case("gelu", 1, [](CaseEnv& e) { return e.ops.gelu(e.p[0]); }));
  cases.push_back(pointwise_case("silu", 1, [](CaseEnv& e) { return e.ops.silu(e.p[0]); }));
  cases.push_back(pointwise_case("swiglu", 2, [](CaseEnv& e) { return e.ops.swiglu(e.p[0], e.p[1]); }));
  cases.push_back(pointwise_case("add", 2, [](CaseEnv& e) { return e.ops.add(e.p[0], e.p[1]); }));
  cases.push_back(pointwise_case("scale", 1, [](CaseEnv& e) { return e.ops.scale(e.p[0], -1.7f); }));
  cases.push_back(pointwise_case("dropout", 1, [](CaseEnv& e) { return e.ops.dropout(e.p[0], 0.3f); }));
  cases.push_back(pointwise_case("residual_chain", 2, [](CaseEnv& e) {
    // A residual stream: the gradient of each add passes through to the next without copies.
    Tensor x = e.p[0];
    for (int i = 0; i < 3; ++i) x = e.ops.add(x, e.ops.scale(e.ops.gelu(x), 0.5f));
    return e.ops.add(x, e.p[1]);
  }));
  cases.push_back(rope_case("rope", {false, false, true, false}));
  cases.push_back(rope_case("rope_interleaved_offset", {true, false, false, false}));
  cases.push_back(rope_case("rope_llama3_strided", {false, true, true, true}));
  // Logits [n, v] and targets (some ignored), for the cross-entropy cases.
  const auto logits_and_targets = [](Dims& d) {
    const std::int64_t n = d.odd(3, 19), v = d.odd(29, 301);
    CaseData data;
    data.params = {rnd(d, {n, v}, 3.0f)};
    data.consts = {targets_with_ignored(d, {n}, static_cast<std::int32_t>(v))};
    return data;
  };
  {
    OpCase c;
    c.name = "cross_entropy";
    c.make = logits_and_targets;
    c.run = [](CaseEnv& e) -> std::vector<Tensor> {
      // Through a copy nobody else holds: the in-place gradient path.
      Tensor logits = e.ops.scale(e.p[0], 1.0f);
      Tensor loss = e.ops.cross_entropy(logits, e.data.consts[0]);
      return {loss};
    };
    cases.push_back(c);
  }
  {
    OpCase c;
    c.name = "cross_entropy_sum_strided";
    c.make = [](Dims& d) {
      const std::int64_t n = d.odd(3, 19), v = d.odd(29, 301);
      CaseData data;
      data.params = {rnd(d, {n, v + 4}, 3.0f)};
      data.consts = {targets_with_ignored(d, {n}, static_cast<std::int32_t>(v))};
      return data;
    };
    c.run = [](CaseEnv& e) -> std::vector<Tensor> {
      const Tensor& p = e.p[0];
      return {e.ops.cross_entropy(p.slice(1, 1, p.size(1) - 3), e.data.consts[0], {.reduction = Reduction::sum})};
    };
    cases.push_back(c);
  }
  {
    OpCase c;
    c.name = "linear_cross_entropy";
    c.make = linear_cross_entropy_data;
    c.run = [](CaseEnv& e) -> std::vector<Tensor> {
      const std::int64_t chunk = e.data.consts[1].to_int_vector()[0];
      return {e.ops.linear_cross_entropy(e.p[0], e.p[1], e.data.consts[0], {.chunk_tokens = chunk})};
    };
    cases.push_back(c);
  }
  {
    // One loss per target (Reduction::none), each seeded with its own gradient: in place, and
    // from a strided view that others hold (the scratch path).
    OpCase c;
    c.name = "cross_entropy_none";
    c.make = [](Dims& d) {
      const std::int64_t n = d.odd(3, 19), v = d.odd(29, 301);
      CaseData data;
      data.params = {rnd(d, {n, v + 4}, 3.0f)};
      data.consts = {targets_with_ignored(d, {n}, static_cast<std::int32_t>(v))};
      return data;
    };
    c.run = [](CaseEnv& e) -> std::vector<Tensor> {
      const Tensor& p = e.p[0];
      const Tensor strided = p.slice(1, 1, p.size(1) - 3);
      Tensor copy = e.ops.scale(strided, 1.0f);
      return {e.ops.cross_entropy(strided, e.data.consts[0], {.reduction = Reduction::none}),
              e.ops.cross_entropy(copy, e.data.consts[0], {.reduction = Reduction::none})};
    };
    cases.push_back(c);
  }
  {
    OpCase c;
    c.name = "linear_cross_entropy_none";
    c.make = linear_cross_entropy_data;
    c.run = [](CaseEnv& e) -> std::vector<Tensor> {
      const std::int64_t chunk = e.data.consts[1].to_int_vector()[0];
      return {e.ops.linear_cross_entropy(e.p[0], e.p[1], e.data.consts[0],
                                         {.reduction = Reduction::none, .chunk_tokens = chunk})};
    };
    cases.push_back(c);
  }
  // Issue 25: the operations that computed on the host until they became kernel groups (mul,
  // softcap, softmax, logsumexp, sum; concat through the buffer types' copies; the losses'
  // reductions, z-loss and logit soft-cap). On the guarded device they prove it: no host access.
  cases.push_back(pointwise_case("mul", 2, [](CaseEnv& e) { return e.ops.mul(e.p[0], e.p[1]); }));
  cases.push_back(pointwise_case("mul_square", 1, [](CaseEnv& e) { return e.ops.mul(e.p[0], e.p[0]); }));
  cases.push_back(pointwise_case("softcap", 1, [](CaseEnv& e) { return e.ops.softcap(e.p[0], 1.7f); }));
  cases.push_back(pointwise_case("softmax", 1, [](CaseEnv& e) { return e.ops.softmax(e.p[0]); }));
  cases.push_back(pointwise_case("logsumexp", 1, [](CaseEnv& e) { return e.ops.logsumexp(e.p[0]); }));
  cases.push_back(pointwise_case("sum", 1, [](CaseEnv& e) { return e.ops.sum(e.p[0]); }));
  cases.push_back(pointwise_case("router_chain", 2, [](CaseEnv& e) {
    // A mixture's router: probabilities, a gate product, the z-loss's log-sum-exp and a sum.
    const Tensor probs = e.ops.softmax(e.p[0]);
    const Tensor z = e.ops.logsumexp(e.p[1]);
    return e.ops.add(e.ops.sum(e.ops.mul(probs, e.p[1])), e.ops.sum(e.ops.mul(z, z)));
  }));
  {
    OpCase c;
    c.name = "concat";
    c.make = [](Dims& d) {
      const std::int64_t cols = d.odd(3, 17);
      CaseData data;
      data.params = {rnd(d, {d.between(1, 4), cols}), rnd(d, {d.between(1, 3), cols}), rnd(d, {d.between(1, 5), cols})};
      return data;
    };
    c.run = [](CaseEnv& e) -> std::vector<Tensor> {
      // A part used twice, and the result scaled so that the backward's slices are accumulated.
      const std::vector<Tensor> parts{e.p[0], e.p[1], e.p[2], e.p[0]};
      return {e.ops.scale(e.ops.concat(parts), 1.5f)};
    };
    cases.push_back(c);
  }
  {
    // z-loss on the plain loss: a mean, and one loss per target (in place and through a copy).
    OpCase c;
    c.name = "cross_entropy_z_loss";
    c.make = logits_and_targets;
    c.run = [](CaseEnv& e) -> std::vector<Tensor> {
      e.ops.set_z_loss_weight(0.05f);
      Tensor logits = e.ops.scale(e.p[0], 1.0f);
      Tensor none = e.ops.cross_entropy(e.p[0], e.data.consts[0], {.reduction = Reduction::none});
      Tensor loss = e.ops.cross_entropy(logits, e.data.consts[0]);
      return {loss, none};
    };
    cases.push_back(c);
  }
  for (const bool per_target : {false, true}) {
    // The fused loss with Gemma 2's logit soft-cap and z-loss together.
    OpCase c;
    c.name = per_target ? "linear_cross_entropy_softcap_z_loss_none" : "linear_cross_entropy_softcap_z_loss";
    c.make = linear_cross_entropy_data;
    c.run = [per_target](CaseEnv& e) -> std::vector<Tensor> {
      e.ops.set_z_loss_weight(0.02f);
      const std::int64_t chunk = e.data.consts[1].to_int_vector()[0];
      return {e.ops.linear_cross_entropy(
          e.p[0], e.p[1], e.data.consts[0],
          {.reduction = per_target ? Reduction::none : Reduction::mean, .chunk_tokens = chunk, .logit_softcap = 2.0f})};
    };
    cases.push_back(c);
  }
  cases.push_back(attention_case("attention_causal_gqa", {true, 0, 0.0f, false, false}));
  cases.push_back(attention_case("attention_window_softcap_segments", {false, 3, 5.0f, true, false}));
  cases.push_back(attention_case("attention_kv_cache", {true, 4, 0.0f, false, true}));
  return cases;
}

}  // namespace

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = build_cases();
  return cases;
}

const OpCase& op_case(const std::string& name) {
  for (const auto& c : op_cases())
    if (c.name == name) return c;
  throw std::runtime_error("no op case " + name);
}

std::optional<std::string> case_cannot_run(Backend& backend, const OpCase& c) {
  if (c.attention && !attention_for(backend))
    return "no attention kernel computes on " + backend.device().str() + " (backend " + std::string(backend.name()) +
           ") yet: the attention cases need one";
  return std::nullopt;
}

std::vector<std::string> op_case_names() {
  std::vector<std::string> names;
  for (const auto& c : op_cases()) names.push_back(c.name);
  return names;
}

Evaluation evaluate(Backend& backend, const OpCase& c, const CaseData& data, Mode mode, bool backward) {
  std::vector<std::unique_ptr<Parameter>> params;
  for (std::size_t i = 0; i < data.params.size(); ++i) {
    std::string name = std::to_string(i);
    name.insert(name.begin(), 'p');
    params.push_back(std::make_unique<Parameter>(std::move(name), on_backend(data.params[i], backend)));
    if (mode == Mode::frozen && i % 2 == 1) params.back()->set_requires_grad(false);
  }
  CaseData device_data = data;
  for (Tensor& t : device_data.consts) t = on_backend(t, backend);
  const Handle<AttentionKernel> attention = attention_for(backend);
  if (c.attention && !attention) throw std::runtime_error("no attention kernel computes on " + backend.device().str());
  Tape tape;
  Ops ops(backend, backward ? &tape : nullptr);
  ops.set_dropout_seed(3, 1);
  CaseEnv env{ops, {}, device_data, attention.get()};
  for (auto& p : params) env.p.push_back(p->tensor());
  std::vector<Tensor> outs = c.run(env);
  if (mode == Mode::twice) {
    std::vector<Tensor> more = c.run(env);
    outs.insert(outs.end(), more.begin(), more.end());
  }
  Evaluation r;
  for (const Tensor& t : outs) r.outputs.push_back(t.to_vector());
  if (backward) {
    std::vector<Tensor> roots, seeds;
    for (std::size_t i = 0; i < outs.size(); ++i)
      if (outs[i].requires_grad()) {
        roots.push_back(outs[i]);
        seeds.push_back(on_backend(output_seed(outs[i].shape(), i), backend));
      }
    outs.clear();
    if (!roots.empty()) tape.backward(roots, seeds);
    for (auto& p : params) r.grads.push_back(p->has_grad() ? p->grad().to_vector() : std::vector<float>());
  }
  return r;
}

}  // namespace loom::test
