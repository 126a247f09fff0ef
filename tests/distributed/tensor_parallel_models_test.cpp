// The built-in models under tensor parallelism (sdk transformer_blocks.hpp's plans) against one
// process: every rank of `mpirun -np N` (LOOM_TEST_COLLECTIVE=mpi) is one member of a tensor
// group of N and builds each family twice, whole (tensor_size 1) and split (its shard of every
// split parameter), from the same seed. Loss, per-token losses, logits and next-token logits
// must agree, and each member's gradient must be the same slice of the whole model's gradient
// (summed over the group first where the plan says it is partial), to float32 rounding, with and
// without remat. One process (`single`) runs them as a group of one, and checks the refusals.
#include <gtest/gtest.h>

#include <cstdlib>
#include <loom/core/config.hpp>
#include <loom/core/registry.hpp>
#include <string>
#include <vector>

#include "loom/autograd.hpp"
#include "loom/kinds/collective.hpp"
#include "loom/kinds/model.hpp"
#include "loom/parallel_plan.hpp"
#include "numerics_test_support.hpp"
#include "tensor_group_support.hpp"

namespace {

using namespace loom;
using loom::test::all_close;
using loom::test::random_ids;

using loom::test::tensor_group::backend;
using loom::test::tensor_group::collective;

constexpr std::int64_t kVocab = 61;  // split unevenly over 2 and 4 members
constexpr double kTol = 1e-5;

Value parse(const std::string& yaml) {
  return config::load_string(yaml, "<test>");
}

struct Family {
  std::string name, options;
};

// Each family's features: gpt2 (Conv1D, biases, tied), llama with grouped key/value heads split
// (8 over 4: split over 2 and 4) and replicated (4 over 1), Qwen 3's q/k norms with every bias,
// Gemma 2 (soft-caps, query scaling, a window on the even layers, GeGLU), Mixtral (4 experts,
// top 2, both router losses).
std::vector<Family> families() {
  return {
      {"gpt2", "{type: gpt2, seq_len: 16, hidden_dim: 32, num_layers: 2, num_heads: 4, initializer_range: 0.2}"},
      {"llama_gqa_split",
       "{type: llama, seq_len: 16, hidden_dim: 32, intermediate_dim: 24, num_layers: 2, num_heads: 8, num_kv_heads: 4, "
       "head_dim: 4, initializer_range: 0.2}"},
      {"llama_gqa_replicated",
       "{type: llama, seq_len: 16, hidden_dim: 32, intermediate_dim: 40, num_layers: 2, num_heads: 4, num_kv_heads: 1, "
       "initializer_range: 0.2, tie_word_embeddings: true}"},
      {"qwen3_qk_norm_biases",
       "{type: llama, seq_len: 16, hidden_dim: 32, intermediate_dim: 40, num_layers: 2, num_heads: 4, num_kv_heads: 2, "
       "use_qk_norm: true, use_bias: true, initializer_range: 0.2}"},
      {"gemma2",
       "{type: gemma, seq_len: 16, hidden_dim: 32, intermediate_dim: 40, num_layers: 2, num_heads: 4, num_kv_heads: 2, "
       "head_dim: 8, query_pre_attn_scalar: 16, attn_logit_softcapping: 5, final_logit_softcapping: 3, "
       "sliding_window: 4, initializer_range: 0.2}"},
      {"mixtral",
       "{type: llama, seq_len: 16, hidden_dim: 32, intermediate_dim: 24, num_layers: 2, num_heads: 4, num_kv_heads: 2, "
       "initializer_range: 0.2, moe: {num_experts: 4, experts_per_token: 2, router_aux_loss_coef: 0.05, "
       "router_z_loss_coef: 0.01}}"},
  };
}

Handle<Model> make(const std::string& options, const std::string& remat, int rank, int size) {
  Value o = parse(options);
  o.set("attention", "flash");
  o.set("vocab_size", kVocab);
  o.set("remat", remat);
  const std::string type = o.find("type")->as_string();
  auto model = loom::test::plugin_registry().create<Model>(ComponentRef{"model", type, o, "model"});
  ModelSetup setup;
  setup.vocab_size = kVocab;
  setup.tensor_rank = rank;
  setup.tensor_size = size;
  model->build(setup);
  model->initialize(7);
  return model;
}

struct Results {
  float loss = 0;
  std::vector<float> token_losses, logits, next_logits;
  std::vector<std::vector<float>> grads;
};

Results run(Model& model, bool split, const Tensor& tokens, const Tensor& targets) {
  Results out;
  {
    Tape tape;
    Ops ops(backend(), &tape);
    if (split) ops.set_tensor_group(&collective());
    const Tensor loss = model.loss(ops, tokens, targets, Tensor());
    out.loss = loss.item();
    tape.backward(loss);
    for (const auto& p : model.parameters()) out.grads.push_back(p.parameter->grad().to_vector());
  }
  Ops ops(backend());
  if (split) ops.set_tensor_group(&collective());
  out.token_losses = model.token_losses(ops, tokens, targets, Tensor()).to_vector();
  out.logits = model.logits(ops, tokens, Tensor()).to_vector();
  auto cache = model.new_cache(tokens.size(0), tokens.size(1));
  model.next_logits(ops, tokens.slice(1, 0, tokens.size(1) - 1).clone(), *cache);
  out.next_logits =
      model.next_logits(ops, tokens.slice(1, tokens.size(1) - 1, tokens.size(1)).clone(), *cache).to_vector();
  return out;
}

std::vector<float> shard_values(const std::vector<float>& whole, const Shape& shape, const TensorPlacement& p) {
  std::vector<float> out(
      static_cast<std::size_t>(tensor_plan::shard_shape(shape, p, collective().rank(), collective().size()).numel()));
  tensor_plan::extract_shard(whole.data(), shape, p, collective().rank(), collective().size(), out.data());
  return out;
}

class TensorParallelModels : public ::testing::TestWithParam<std::tuple<Family, std::string>> {};

TEST_P(TensorParallelModels, AgreeWithOneProcess) {
  const auto& [family, remat] = GetParam();
  const int rank = collective().rank(), size = collective().size();
  const Tensor tokens = random_ids(Shape{2, 12}, static_cast<std::int32_t>(kVocab), 11);
  const Tensor targets = random_ids(Shape{2, 12}, static_cast<std::int32_t>(kVocab), 12);

  auto whole = make(family.options, remat, 0, 1);
  auto split = make(family.options, remat, rank, size);
  const auto plan = split->parallel_plan();
  ASSERT_TRUE(plan.has_value()) << family.name << " declares no parallel plan";
  const auto whole_params = whole->parameters(), split_params = split->parameters();
  ASSERT_EQ(plan->size(), split_params.size());
  ASSERT_EQ(whole_params.size(), split_params.size());
  for (std::size_t i = 0; i < plan->size(); ++i) {
    const PlannedParameter& p = (*plan)[i];
    ASSERT_EQ(p.parameter, split_params[i].parameter);
    ASSERT_EQ(p.whole, whole_params[i].parameter->data().shape()) << p.parameter->name();
    EXPECT_EQ(p.parameter->data().to_vector(),
              shard_values(whole_params[i].parameter->data().to_vector(), p.whole, p.placement))
        << p.parameter->name() << ": the shard holds the one-process initialisation";
  }

  const Results a = run(*whole, false, tokens, targets);
  const Results b = run(*split, true, tokens, targets);
  EXPECT_NEAR(b.loss, a.loss, kTol * std::abs(a.loss)) << family.name;
  EXPECT_TRUE(all_close(b.token_losses, a.token_losses, kTol)) << "token_losses";
  EXPECT_TRUE(all_close(b.logits, a.logits, kTol)) << "logits";
  EXPECT_TRUE(all_close(b.next_logits, a.next_logits, kTol)) << "next_logits through the KV cache";
  for (std::size_t i = 0; i < plan->size(); ++i) {
    const PlannedParameter& p = (*plan)[i];
    std::vector<float> grad = b.grads[i];
    // A parameter this member did not reach has no gradient: zeros. (A member none of whose experts
    // got a token reaches them on a zero row: their gradient is zeros.)
    if (grad.empty()) grad.assign(static_cast<std::size_t>(p.parameter->data().numel()), 0.0f);
    if (p.placement.split == TensorSplit::replicated_partial) collective().all_reduce(std::span<float>(grad));
    EXPECT_TRUE(all_close(grad, shard_values(a.grads[i], p.whole, p.placement), kTol))
        << p.parameter->name() << " ("
        << (p.placement.is_split()                                 ? p.placement.style
            : p.placement.split == TensorSplit::replicated_partial ? "replicated, partial"
                                                                   : "replicated")
        << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Families, TensorParallelModels,
                         ::testing::Combine(::testing::ValuesIn(families()), ::testing::Values("none", "full")),
                         [](const auto& info) {
                           return std::get<0>(info.param).name + "_remat_" + std::get<1>(info.param);
                         });

// Shapes the blocks cannot split: one UserError naming the model and the counts, at build.
TEST(TensorParallelModelsRefuse, HeadsAndExpertsThatDoNotSplit) {
  const auto refused = [](const std::string& options, int size) -> std::string {
    Value o = parse(options);
    o.set("attention", "flash");
    o.set("vocab_size", kVocab);
    const std::string type = o.find("type")->as_string();
    auto model = loom::test::plugin_registry().create<Model>(ComponentRef{"model", type, o, "model"});
    ModelSetup setup;
    setup.vocab_size = kVocab;
    setup.tensor_size = size;
    try {
      model->build(setup);
    } catch (const UserError& e) {
      return e.what();
    }
    return "no error";
  };
  const std::string heads =
      refused("{type: llama, hidden_dim: 24, intermediate_dim: 8, num_layers: 1, num_heads: 6, num_kv_heads: 6}", 4);
  EXPECT_NE(heads.find("model (llama)"), std::string::npos) << heads;
  EXPECT_NE(heads.find("num_heads (6) is not a multiple of 4"), std::string::npos) << heads;
  const std::string kv =
      refused("{type: gemma, hidden_dim: 24, intermediate_dim: 8, num_layers: 1, num_heads: 6, num_kv_heads: 3}", 2);
  EXPECT_NE(kv.find("model (gemma)"), std::string::npos) << kv;
  EXPECT_NE(kv.find("3 key/value heads"), std::string::npos) << kv;
  const std::string experts = refused(
      "{type: llama, hidden_dim: 16, intermediate_dim: 8, num_layers: 1, num_heads: 2, num_kv_heads: 2, moe: "
      "{num_experts: 3}}",
      2);
  EXPECT_NE(experts.find("moe.num_experts (3) is not a multiple of 2"), std::string::npos) << experts;
  const std::string gpt2 = refused("{type: gpt2, hidden_dim: 24, num_layers: 1, num_heads: 3}", 2);
  EXPECT_NE(gpt2.find("model (gpt2)"), std::string::npos) << gpt2;
}

}  // namespace
