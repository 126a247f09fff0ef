// The `gpt2` model: GPT-2 (Radford et al. 2019) as Levanter's Gpt2Config describes it. Learned
// position embeddings, pre-LayerNorm blocks, GELU (tanh form) MLP, tied input and output
// embeddings. Parameter names and layouts follow the Hugging Face / OpenAI checkpoints
// ("h.0.attn.c_attn.weight" is [hidden, 3 * hidden]: Conv1D's [in, out]), so the Hugging Face
// mapping (loom::HfModel) is the names under transformers' "transformer." prefix, unchanged.
#include <cmath>
#include <loom/decoder_options.hpp>
#include <loom/hf_interop.hpp>
#include <loom/kinds/attention.hpp>
#include <loom/kinds/model.hpp>
#include <loom/model_support.hpp>
#include <loom/plugin.hpp>
#include <loom/transformer_blocks.hpp>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

namespace {

using loom::Ops;
using loom::Parameter;
using loom::ParameterRole;
using loom::Shape;
using loom::Tensor;

struct Gpt2Options : loom::models::DecoderOptions {
  std::int64_t mlp_scale;
  double embed_pdrop, resid_pdrop, attn_pdrop;
  bool scale_attn_by_inverse_layer_idx, use_bias;
};

// One block: LayerNorm, attention, LayerNorm, MLP.
struct Block {
  Parameter *ln_1_weight = nullptr, *ln_1_bias = nullptr;
  loom::models::AttentionBlock attn;
  Parameter *ln_2_weight = nullptr, *ln_2_bias = nullptr;
  loom::models::MlpBlock mlp;
};

using loom::models::tensor_or_none;

class Gpt2Model final : public loom::models::TransformerLm {
 public:
  Gpt2Model(const Gpt2Options& o, loom::Handle<loom::AttentionKernel> kernel, loom::ExecutionContext& execution)
      : TransformerLm(o.path, {"gpt2"}, "GPT-2"),
        o_(o),
        kernel_(std::move(kernel)),
        execution_(&execution),
        head_dim_(o.hidden_dim / o.num_heads) {}

  void build(const loom::ModelSetup& setup) override {
    begin_build(o_.vocab_size, setup);
    const std::int64_t c = o_.hidden_dim;
    const bool bias = o_.use_bias;
    store_.declare("wte.weight", Shape{vocab_, c}, ParameterRole::embedding, &wte_, vocab_parallel());
    store_.declare("wpe.weight", Shape{o_.seq_len, c}, ParameterRole::embedding, &wpe_);
    blocks_.resize(static_cast<std::size_t>(o_.num_layers));
    for (std::int64_t l = 0; l < o_.num_layers; ++l) {
      Block& b = blocks_[static_cast<std::size_t>(l)];
      const std::string p = "h." + std::to_string(l) + ".";
      store_.declare(p + "ln_1.weight", Shape{c}, ParameterRole::norm, &b.ln_1_weight);
      if (bias) store_.declare(p + "ln_1.bias", Shape{c}, ParameterRole::norm, &b.ln_1_bias);
      b.attn.declare(store_, p + "attn.", attention_config(l));
      b.attn.set_kernel(*kernel_);
      store_.declare(p + "ln_2.weight", Shape{c}, ParameterRole::norm, &b.ln_2_weight);
      if (bias) store_.declare(p + "ln_2.bias", Shape{c}, ParameterRole::norm, &b.ln_2_bias);
      // Conv1D's [in, out] weights: "mlp.c_fc" widens, "mlp.c_proj" narrows.
      b.mlp.declare(store_, p + "mlp.",
                    {.hidden_dim = c,
                     .intermediate_dim = o_.hidden_dim * o_.mlp_scale,
                     .kind = loom::models::MlpKind::gelu,
                     .bias = bias,
                     .weight_in_out = true,
                     .up_name = "c_fc",
                     .down_name = "c_proj"});
    }
    store_.declare("ln_f.weight", Shape{c}, ParameterRole::norm, &ln_f_weight_);
    if (bias) store_.declare("ln_f.bias", Shape{c}, ParameterRole::norm, &ln_f_bias_);
    if (!o_.tie_word_embeddings)
      store_.declare("lm_head.weight", Shape{vocab_, c}, ParameterRole::weight, &lm_head_, vocab_parallel());
    finish_build(setup);
  }

  void initialize(std::uint64_t seed) override {
    require_built("initialize");
    // GPT-2's initialisation: normal(0, initializer_range) for every matrix and embedding, the
    // two projections that write into the residual stream scaled down by 1/sqrt(2 * layers),
    // biases 0, LayerNorm weights 1.
    const double std = o_.initializer_range;
    const double residual_std = std / std::sqrt(2.0 * static_cast<double>(o_.num_layers));
    const auto& params = store_.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {
      Parameter* p = params[i].parameter;
      const std::uint64_t key = loom::stream_key(seed, 1, i);
      if (params[i].role == ParameterRole::norm) {
        const bool is_weight = p->name().ends_with(".weight");
        loom::models::fill_constant(p->data(), is_weight ? 1.0f : 0.0f, init_backend());
      } else if (params[i].role == ParameterRole::bias) {
        loom::models::fill_constant(p->data(), 0.0f, init_backend());
      } else {
        const bool residual = p->name().ends_with("c_proj.weight");
        loom::models::fill_normal(store_, i, key, residual ? residual_std : std, *execution_, init_backend());
      }
    }
  }

  std::int64_t max_seq_len() const override { return o_.seq_len; }

  // ---- Hugging Face (transformers' GPT2LMHeadModel, GPT2Config) ----

  loom::Value hf_config() const override {
    require_built("hf_config");
    if (!o_.use_bias)
      throw loom::UserError(o_.path +
                            ".use_bias is false, and Hugging Face's GPT-2 has biases in every linear layer and "
                            "LayerNorm; only a model with use_bias: true can be exported");
    loom::Value c = loom::Value::map();
    c.set("architectures", loom::Value::List{loom::Value("GPT2LMHeadModel")});
    c.set("model_type", "gpt2");
    c.set("vocab_size", vocab_);
    c.set("n_positions", o_.seq_len);
    c.set("n_embd", o_.hidden_dim);
    c.set("n_layer", o_.num_layers);
    c.set("n_head", o_.num_heads);
    c.set("n_inner", o_.hidden_dim * o_.mlp_scale);
    c.set("activation_function", "gelu_new");  // GELU's tanh form, as loom's gpt2 computes it
    c.set("resid_pdrop", o_.resid_pdrop);
    c.set("embd_pdrop", o_.embed_pdrop);
    c.set("attn_pdrop", 0.0);
    c.set("layer_norm_epsilon", o_.layer_norm_epsilon);
    c.set("initializer_range", o_.initializer_range);
    c.set("scale_attn_weights", true);
    c.set("scale_attn_by_inverse_layer_idx", o_.scale_attn_by_inverse_layer_idx);
    c.set("reorder_and_upcast_attn", false);
    c.set("tie_word_embeddings", o_.tie_word_embeddings);
    return c;
  }

  loom::HfTensorLayout hf_tensors() const override {
    require_built("hf_tensors");
    loom::HfTensorLayout layout;
    layout.base_model_prefix = "transformer";
    const auto& params = store_.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) {  // whole tensors: export assembles the shards
      const std::string& name = params[i].parameter->name();
      layout.tensors.push_back(
          {name == "lm_head.weight" ? name : "transformer." + name, name, 0, store_.whole_shape(i)[0]});
    }
    // OpenAI's files and older transformers keep each layer's causal mask ("attn.bias") and
    // masked-score constant ("attn.masked_bias") as tensors; transformers rebuilds both.
    layout.ignored_suffixes = {".attn.bias", ".attn.masked_bias"};
    if (o_.tie_word_embeddings) layout.ignored_suffixes.push_back("lm_head.weight");
    return layout;
  }

 private:
  loom::RematPolicy remat_policy() const override { return o_.remat; }

  // Block l's attention: as many key/value heads as query heads, no rotary embedding; q, k and v
  // from one Conv1D "attn.c_attn" [hidden, 3 * hidden], the output "attn.c_proj".
  loom::models::AttentionConfig attention_config(std::int64_t l) const {
    loom::models::AttentionConfig a;
    a.hidden_dim = o_.hidden_dim;
    a.num_heads = a.num_kv_heads = o_.num_heads;
    a.head_dim = head_dim_;
    a.weight_in_out = true;
    a.qkv_bias = a.out_bias = o_.use_bias;
    a.params.causal = true;
    if (o_.scale_attn_by_inverse_layer_idx)
      a.params.scale = 1.0f / (std::sqrt(static_cast<float>(head_dim_)) * static_cast<float>(l + 1));
    a.qkv_name = "c_attn";
    a.out_name = "c_proj";
    a.model = "model (gpt2)";
    return a;
  }
  loom::models::TransformerShape transformer_shape() const override {
    loom::models::TransformerShape s;
    s.num_layers = o_.num_layers;
    s.hidden_dim = o_.hidden_dim;
    s.num_heads = s.num_kv_heads = o_.num_heads;
    s.head_dim = head_dim_;
    s.intermediate_dim = o_.hidden_dim * o_.mlp_scale;
    s.vocab_size = vocab_;
    return s;
  }

  void check_hf_config(loom::HfConfigCheck& check, const std::string&, const loom::Value&) const override {
    // GPT2Config's defaults stand in for absent fields.
    check.expect_integer("vocab_size", 50257, vocab_, "vocab_size");
    check.expect_integer("n_positions", 1024, o_.seq_len, "seq_len");
    check.expect_integer("n_embd", 768, o_.hidden_dim, "hidden_dim");
    check.expect_integer("n_layer", 12, o_.num_layers, "num_layers");
    check.expect_integer("n_head", 12, o_.num_heads, "num_heads");
    const std::int64_t n_embd = check.integer("n_embd", 768);
    const std::int64_t inner = check.integer("n_inner", 4 * n_embd);
    if (inner != o_.hidden_dim * o_.mlp_scale)
      check.mismatch("n_inner is " + std::to_string(inner) + ", " + o_.path + ".hidden_dim * " + o_.path +
                     ".mlp_scale is " + std::to_string(o_.hidden_dim * o_.mlp_scale));
    const std::string act = check.string("activation_function", "gelu_new");
    if (act != "gelu_new" && act != "gelu_pytorch_tanh")
      check.mismatch("activation_function is " + loom::Value(act).describe() +
                     "; loom's gpt2 computes GELU's tanh form (\"gelu_new\")");
    check.expect_number("layer_norm_epsilon", 1e-5, o_.layer_norm_epsilon, "layer_norm_epsilon");
    if (!check.boolean("scale_attn_weights", true))
      check.mismatch("scale_attn_weights is false; loom's gpt2 divides attention scores by sqrt(head_dim)");
    check.expect_boolean("scale_attn_by_inverse_layer_idx", false, o_.scale_attn_by_inverse_layer_idx,
                         "scale_attn_by_inverse_layer_idx");
    check.expect_boolean("tie_word_embeddings", true, o_.tie_word_embeddings, "tie_word_embeddings");
    if (!o_.use_bias)
      check.mismatch(o_.path +
                     ".use_bias is false, and GPT-2 checkpoints have biases in every linear layer and "
                     "LayerNorm");
  }

  const char* name() const override { return "gpt2"; }
  CacheShape cache_shape() const override { return {o_.num_layers, blocks_.front().attn.local_kv_heads(), head_dim_}; }

  Tensor head() const override { return o_.tie_word_embeddings ? wte_->tensor() : lm_head_->tensor(); }

  // The final hidden states (after ln_f) of `tokens` [batch, seq]. With a cache, the tokens
  // follow the cached positions, and their keys and values are appended to it.
  Tensor forward(Ops& ops, const Tensor& tokens, const Tensor& segments, loom::models::LayerKvCache* cache) override {
    const std::int64_t batch = tokens.size(0), seq = tokens.size(1);
    const std::int64_t offset = cache ? cache->length() : 0;
    std::vector<std::int32_t> pos(static_cast<std::size_t>(batch * seq));
    for (std::int64_t i = 0; i < batch * seq; ++i)
      pos[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(offset + i % seq);
    // Made on the host, copied to a device backend's memory explicitly (a no-op on the host).
    const Tensor positions =
        Tensor::from(std::span<const std::int32_t>(pos), Shape{batch, seq}).to(ops.backend().device());

    const Tensor tok = embed(ops, wte_->tensor(), tokens);
    const Tensor pe = ops.embedding(wpe_->tensor(), positions);
    const Block& first = blocks_.front();
    Tensor h, x;
    const auto eps = static_cast<float>(o_.layer_norm_epsilon);
    const auto resid_pdrop = static_cast<float>(o_.resid_pdrop);
    if (o_.embed_pdrop > 0.0 && ops.training()) {
      h = ops.dropout(ops.add(tok, pe), static_cast<float>(o_.embed_pdrop));
      x = ops.layer_norm(h, tensor_or_none(first.ln_1_weight), tensor_or_none(first.ln_1_bias), eps);
    } else {
      std::tie(h, x) =
          ops.add_layer_norm(tok, pe, tensor_or_none(first.ln_1_weight), tensor_or_none(first.ln_1_bias), eps);
    }

    const loom::models::AttentionInput input{
        .batch = batch, .seq = seq, .offset = offset, .segments = segments, .cache = cache};
    for (std::size_t l = 0; l < blocks_.size(); ++l) {
      std::tie(h, x) = loom::models::run_layer(
          ops, cache ? loom::RematPolicy::none : o_.remat, h, x, [=, this](Ops& ops, Tensor h, Tensor x) {
            const Block& b = blocks_[l];
            loom::models::AttentionInput in = input;
            in.layer = static_cast<std::int64_t>(l);
            const Tensor attn_out = ops.dropout(b.attn.forward(ops, x, in), resid_pdrop);
            std::tie(h, x) = ops.add_layer_norm(h, attn_out, b.ln_2_weight->tensor(), tensor_or_none(b.ln_2_bias), eps);
            const Tensor mlp_out = ops.dropout(b.mlp.forward(ops, x), resid_pdrop);
            // The residual add fused with the next norm: the next block's ln_1, or ln_f after the last.
            const bool last = l + 1 == blocks_.size();
            const Parameter* norm_w = last ? ln_f_weight_ : blocks_[l + 1].ln_1_weight;
            const Parameter* norm_b = last ? ln_f_bias_ : blocks_[l + 1].ln_1_bias;
            return ops.add_layer_norm(h, mlp_out, norm_w->tensor(), tensor_or_none(norm_b), eps);
          });
    }
    if (cache) cache->advance(seq);
    return x;
  }

  Gpt2Options o_;
  loom::Handle<loom::AttentionKernel> kernel_;
  loom::ExecutionContext* execution_;
  std::int64_t head_dim_;
  Parameter *wte_ = nullptr, *wpe_ = nullptr, *ln_f_weight_ = nullptr, *ln_f_bias_ = nullptr, *lm_head_ = nullptr;
  std::vector<Block> blocks_;
};

loom::models::DecoderSchema<Gpt2Options> gpt2_options() {
  using O = Gpt2Options;
  loom::models::DecoderSchema<O> s;
  s.seq_len(1024, "Longest sequence: the number of learned positions.");
  s.hidden_dim(768, "Width of the residual stream (n_embd).");
  s.num_layers(12, "Transformer blocks (n_layer).");
  s.num_heads(12, "Attention heads; must divide hidden_dim.");
  s.field("mlp_scale", &O::mlp_scale, 4, "MLP width as a multiple of hidden_dim.").min(1).max(1024);
  s.initializer_range();
  s.field("embed_pdrop", &O::embed_pdrop, 0.0, "Dropout on the summed token and position embeddings.")
      .min(0.0)
      .max(1.0, false);
  s.field("resid_pdrop", &O::resid_pdrop, 0.0, "Dropout on each block's attention and MLP outputs.")
      .min(0.0)
      .max(1.0, false);
  s.field("attn_pdrop", &O::attn_pdrop, 0.0,
          "Dropout on attention probabilities: must be 0, loom's attention kernels have none.")
      .min(0.0)
      .max(1.0, false);
  s.layer_norm_epsilon(1e-5, "LayerNorm epsilon.");
  s.field("scale_attn_by_inverse_layer_idx", &O::scale_attn_by_inverse_layer_idx, false,
          "Divide attention scores of layer i (from 0) by i + 1 as well as by sqrt(head_dim) (Mistral's tweak).");
  s.field("use_bias", &O::use_bias, true, "Biases in every linear layer and LayerNorm.");
  s.tie_word_embeddings(true, "Use the token embedding (wte) as the output projection.");
  s.vocab_size();
  s.remat();
  s.attention();
  s.then([](O& o, const loom::Options&) {
    if (o.hidden_dim % o.num_heads != 0)
      throw loom::UserError(o.path + ": num_heads (" + std::to_string(o.num_heads) + ") must divide hidden_dim (" +
                            std::to_string(o.hidden_dim) + ")");
    if (o.attn_pdrop != 0.0)
      throw loom::UserError(o.path +
                            ".attn_pdrop: must be 0: loom's attention kernels apply no dropout to "
                            "attention probabilities (use resid_pdrop or embed_pdrop)");
  });
  return s;
}

void register_components(loom::Registrar& registrar) {
  const auto options = gpt2_options();
  registrar.add<loom::Model>({.name = "gpt2",
                              .description = "GPT-2: learned positions, pre-LayerNorm, GELU MLP, tied embeddings",
                              .version = "1.0.0",
                              .options = options.schema()},
                             [options](const loom::Options& given, const loom::CreateContext& ctx) {
                               const Gpt2Options o = options.read(given);
                               auto kernel = ctx.create<loom::AttentionKernel>(o.attention);
                               return std::make_unique<Gpt2Model>(o, std::move(kernel), ctx.execution());
                             });
}

}  // namespace

LOOM_PLUGIN(register_components)
