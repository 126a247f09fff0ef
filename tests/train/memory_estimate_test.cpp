// The start-up memory estimate's arithmetic (core/run/src/train/memory_estimate.cpp) on a small
// model whose every term is worked out by hand, and the memory it compares with.
#include "train/memory_estimate.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>

#include "loom/model_support.hpp"

namespace loom::training {
namespace {

// hidden 64, 2 layers, 4 heads of 16 over 2 kv heads, MLP 256 (two matrices), vocabulary 100.
models::TransformerShape small_shape() {
  models::TransformerShape s;
  s.num_layers = 2;
  s.hidden_dim = 64;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.head_dim = 16;
  s.intermediate_dim = 256;
  s.vocab_size = 100;
  return s;
}

TEST(MemoryEstimate, TransformerTermsAreTheDocumentedFormula) {
  const ModelMemory m = models::transformer_memory(small_shape(), RematPolicy::none, 2, 8);
  // 16 tokens; per layer and token 9 * 64 + 3 * 32 + 1.5 * 256 = 1056 floats.
  const std::int64_t per_layer = 16 * 4 * 1056;
  // One chunk of logits (16 tokens x 100), the output projection's gradient (100 x 64) and 2
  // hidden-wide values per token.
  const std::int64_t outside = 16 * 100 * 4 + 100 * 64 * 4 + 16 * 4 * 128;
  EXPECT_EQ(m.activation_bytes, 2 * per_layer + outside);
  EXPECT_EQ(m.activation_bytes_remat, 2 * 16 * 4 * 128 + 5 * per_layer / 4 + outside);
  EXPECT_FALSE(m.remat);
  EXPECT_EQ(m.kv_cache_bytes_per_position, 2 * 2 * 32 * 4);
  // q, k, v: 64 + 64 + 2 * 32; o: 64 + 64; MLP: 2 * (64 + 256); two layers.
  EXPECT_EQ(m.lora_in_out, 2 * (192 + 128 + 640));
  EXPECT_TRUE(models::transformer_memory(small_shape(), RematPolicy::full, 2, 8).remat);
}

TEST(MemoryEstimate, AMixtureOfExpertsCountsItsDispatchCopies) {
  models::TransformerShape moe = small_shape();
  moe.experts_per_token = 2;
  const ModelMemory dense = models::transformer_memory(small_shape(), RematPolicy::none, 2, 8);
  const ModelMemory m = models::transformer_memory(moe, RematPolicy::none, 2, 8);
  // Per layer and token 3 k hidden = 3 * 2 * 64 floats more: each token's input to, output of and
  // output gathered from its 2 experts; 16 tokens, 2 layers.
  EXPECT_EQ(m.activation_bytes - dense.activation_bytes, 2 * 16 * 4 * 3 * 2 * 64);
}

MemoryInputs small_inputs() {
  MemoryInputs in;
  in.num_parameters = 100000;
  in.parameter_bytes = 400000;
  in.model = models::transformer_memory(small_shape(), RematPolicy::none, 2, 8);
  in.micro_batch = 2;
  in.seq_len = 8;
  in.optimizer_bytes_per_parameter = 8;
  return in;
}

TEST(MemoryEstimate, EveryTermOfOneProcess) {
  const MemoryEstimate e = estimate_memory(small_inputs());
  EXPECT_EQ(e.parameters, 400000);
  EXPECT_EQ(e.matmul_copies, 0);
  EXPECT_EQ(e.gradients, 400000);
  EXPECT_EQ(e.optimizer_state, 800000);
  EXPECT_EQ(e.activations, small_inputs().model->activation_bytes);
  EXPECT_EQ(e.ema, 0);
  EXPECT_EQ(e.buckets, 0);
  EXPECT_EQ(e.kv_cache, 0);
  EXPECT_EQ(e.overhead, kProcessOverheadBytes);
  EXPECT_EQ(e.total(), 400000 + 400000 + 800000 + e.activations + kProcessOverheadBytes);
  EXPECT_NE(e.describe().find("memory estimate per rank: "), std::string::npos);
}

TEST(MemoryEstimate, TensorParallelismDividesTheSplitWeightsTheirGradientsAndState) {
  MemoryInputs in = small_inputs();
  in.ranks = 4;
  in.tensor = 2;
  in.ema = true;
  in.grad_bucket_bytes = 1 << 20;
  const MemoryEstimate e = estimate_memory(in);
  EXPECT_EQ(e.parameters, 200000);
  EXPECT_EQ(e.gradients, 200000);
  EXPECT_EQ(e.optimizer_state, 400000);
  EXPECT_EQ(e.ema, 200000);
  EXPECT_EQ(e.buckets, 200000) << "a bucket is never larger than the gradients it sums";
  EXPECT_EQ(e.activations, in.model->activation_bytes) << "counted whole: an upper bound";
}

TEST(MemoryEstimate, RematCopiesEmaSamplesAndDataParallelTerms) {
  MemoryInputs in = small_inputs();
  in.model->remat = true;
  in.bf16_matmuls = true;
  in.ema = true;
  in.sample_positions = 10;
  in.ranks = 2;
  in.grad_bucket_bytes = 1000;
  const MemoryEstimate e = estimate_memory(in);
  EXPECT_EQ(e.activations, in.model->activation_bytes_remat);
  EXPECT_EQ(e.matmul_copies, 200000);
  EXPECT_EQ(e.ema, 400000);
  EXPECT_EQ(e.kv_cache, 10 * 512);
  EXPECT_EQ(e.buckets, 1000);
  EXPECT_EQ(e.optimizer_state, 800000);  // replicated on every rank
  in.shard_optimizer_state = true;       // ZeRO-1: divided by the ranks
  EXPECT_EQ(estimate_memory(in).optimizer_state, 400000);
}

TEST(MemoryEstimate, LoraTrainsTheAdaptersAlone) {
  MemoryInputs in = small_inputs();
  in.lora_rank = 4;
  const MemoryEstimate e = estimate_memory(in);
  const std::int64_t adapters = 4 * in.model->lora_in_out;
  EXPECT_EQ(e.trained_values, adapters);
  EXPECT_EQ(e.parameters, 400000 + adapters * 4);  // the frozen base and the adapters
  EXPECT_EQ(e.gradients, adapters * 4);
  EXPECT_EQ(e.optimizer_state, adapters * 8);
}

// Fully sharded data parallelism: values, gradients, state and average divided by the fsdp axis,
// no buckets, the gathered units (values of the two largest, gradients of the three largest), the
// bf16 rounding of the largest unit only, whole copies for a whole-matrix optimizer, and the
// start-up peak of the whole model; the refusal of a data-parallel run offers the fsdp mesh.
TEST(MemoryEstimate, FullyShardedTermsAndTheRefusalOffersTheFsdpMesh) {
  MemoryInputs in = small_inputs();
  in.model->largest_units[0] = 10000;
  in.model->largest_units[1] = 3000;
  in.model->largest_units[2] = 2000;
  in.ranks = 2;
  in.fsdp = 2;
  in.grad_bucket_bytes = 1000;
  in.bf16_matmuls = true;
  in.ema = true;
  MemoryEstimate e = estimate_memory(in);
  EXPECT_EQ(e.parameters, 200000);
  EXPECT_EQ(e.gradients, 200000);
  EXPECT_EQ(e.optimizer_state, 400000);
  EXPECT_EQ(e.ema, 200000);
  EXPECT_EQ(e.buckets, 0);
  EXPECT_EQ(e.gathered, 4 * (10000 + 3000) + 4 * (10000 + 3000 + 2000));
  EXPECT_EQ(e.matmul_copies, 2 * 10000);
  EXPECT_EQ(e.setup, 400000 + 2 * 200000 + kProcessOverheadBytes);
  EXPECT_NE(e.describe().find("gathered units"), std::string::npos) << e.describe();
  in.elementwise_optimizer = false;  // Muon: each rank's whole copies of what it owns
  EXPECT_EQ(estimate_memory(in).optimizer_state, 400000 + 100000 * 8 / 2);

  // A data-parallel run that does not fit where the fsdp one does: the refusal says so.
  in.elementwise_optimizer = true;
  const MemoryEstimate sharded = estimate_memory(in);
  in.fsdp = 1;
  const MemoryEstimate replicated = estimate_memory(in);
  ASSERT_LT(sharded.total(), replicated.total());
  const std::string text = memory_refusal(in, replicated, AvailableMemory{sharded.total(), "test"});
  EXPECT_NE(text.find("trainer.mesh: {data: 1, fsdp: 2}"), std::string::npos) << text;
}

// lora.base_dtype: the frozen base in its stored bits, one dequantization panel instead of bf16
// copies, and the float32 base's loading peak, which the total covers.
TEST(MemoryEstimate, AQuantizedBaseCountsInItsStoredBits) {
  MemoryInputs in = small_inputs();
  in.lora_rank = 4;
  in.bf16_matmuls = true;
  const std::int64_t adapters = 4 * in.model->lora_in_out;
  for (const auto& [format, bytes] :
       {std::pair{quant::StorageFormat::bf16, 200000}, std::pair{quant::StorageFormat::int8, 100000},
        std::pair{quant::StorageFormat::nf4, 51587}}) {
    in.base_format = format;
    const MemoryEstimate e = estimate_memory(in);
    EXPECT_EQ(e.parameters, bytes + adapters * 4) << quant::storage_format_name(format);
    EXPECT_EQ(e.matmul_copies, 400000);  // one panel: at most 8 MiB, here the whole model
    EXPECT_EQ(e.loading, 400000);
    EXPECT_GE(e.total(), e.loading + e.overhead);
    EXPECT_NE(e.describe().find(std::string("with the frozen base in ") + quant::storage_format_name(format)),
              std::string::npos)
        << e.describe();
  }
  // From a Hugging Face directory the base goes straight into its format: no float32 peak, but
  // the stored base and the tensors the loading threads hold as the files hold them.
  in.base_streams = true;
  in.stream_in_flight = 300000;
  EXPECT_EQ(estimate_memory(in).loading, 51587 + 300000);
  EXPECT_EQ(estimate_memory(in).describe().find("the float32 base"), std::string::npos);
  EXPECT_NE(estimate_memory(in).describe().find("the tensors being read"), std::string::npos);
  in.stream_in_flight = 0;
  in.base_streams = false;
  in.lora_rank = 0;  // full training stores nothing
  EXPECT_EQ(estimate_memory(in).parameters, 400000);
}

// Gradient accumulation: while the next micro-batch's gradients are computed, the earlier ones'
// sum is set aside, a second copy of the trained values' gradients (FSDP sums them into its
// shards instead); a LoRA run's are its adapters'.
TEST(MemoryEstimate, GradientAccumulationCountsTheSetAsideGradients) {
  MemoryInputs in = small_inputs();
  EXPECT_EQ(estimate_memory(in).set_aside, 0) << "one micro-batch";
  const std::int64_t one = estimate_memory(in).total();
  in.micro_batches = 2;
  const MemoryEstimate e = estimate_memory(in);
  EXPECT_EQ(e.set_aside, 400000);
  EXPECT_EQ(e.total(), one + 400000);
  EXPECT_NE(e.describe().find("set-aside gradients"), std::string::npos) << e.describe();
  in.lora_rank = 4;
  EXPECT_EQ(estimate_memory(in).set_aside, 4 * in.model->lora_in_out * 4);
  in.lora_rank = 0;
  in.ranks = in.fsdp = 2;
  EXPECT_EQ(estimate_memory(in).set_aside, 0) << "FSDP reduces each micro-batch into the shards";
  in.fsdp = 1;
  in.tensor = 2;
  EXPECT_EQ(estimate_memory(in).set_aside, 200000) << "a tensor member's gradients";
}

// FSDP and tensor parallelism together: each rank holds 1/(fsdp * tensor) of the values, their
// gradients and the optimizer state; the gathered units are the member's parts of them.
TEST(MemoryEstimate, FsdpTimesTensorDividesTheOptimizerStateByBoth) {
  MemoryInputs in = small_inputs();
  in.model->largest_units[0] = 10000;
  in.model->largest_units[1] = 3000;
  in.model->largest_units[2] = 2000;
  in.ranks = 4;
  in.fsdp = 2;
  in.tensor = 2;
  const MemoryEstimate e = estimate_memory(in);
  EXPECT_EQ(e.parameters, 100000);
  EXPECT_EQ(e.gradients, 100000);
  EXPECT_EQ(e.optimizer_state, 200000);
  EXPECT_EQ(e.gathered, (4 * (10000 + 3000) + 4 * (10000 + 3000 + 2000)) / 2);
  EXPECT_EQ(e.setup, 200000 + 2 * 100000 + kProcessOverheadBytes) << "each member builds its part of the model";
}

// An int8 or nf4 base keeps the vocabulary tables (embedding, output head) in bf16 unless they
// are quantized too (lora.quantize_embeddings).
TEST(MemoryEstimate, AQuantizedBaseKeepsTheVocabularyTablesInBf16) {
  MemoryInputs in = small_inputs();
  in.lora_rank = 4;
  in.vocab_table_values = 20000;
  const std::int64_t adapters = 4 * in.model->lora_in_out * 4;
  in.base_format = quant::StorageFormat::nf4;
  EXPECT_EQ(estimate_memory(in).parameters, static_cast<std::int64_t>(80000 * 4.127 / 8) + 20000 * 2 + adapters);
  in.base_format = quant::StorageFormat::int8;
  EXPECT_EQ(estimate_memory(in).parameters, 80000 + 20000 * 2 + adapters);
  in.quantize_vocab_tables = true;
  EXPECT_EQ(estimate_memory(in).parameters, 100000 + adapters);
  in.base_format = quant::StorageFormat::bf16;
  in.quantize_vocab_tables = false;
  EXPECT_EQ(estimate_memory(in).parameters, 200000 + adapters);
}

// Shapes too large for 64 bits give a capped figure, never one wrapped around to a negative size
// (which every machine would "fit").
TEST(MemoryEstimate, AbsurdShapesSaturateInsteadOfWrappingAround) {
  models::TransformerShape huge = small_shape();
  huge.num_layers = std::int64_t{1} << 40;
  huge.hidden_dim = huge.intermediate_dim = std::int64_t{1} << 40;
  const ModelMemory m = models::transformer_memory(huge, RematPolicy::none, std::int64_t{1} << 40, 1 << 20);
  EXPECT_GT(m.activation_bytes, 0);
  EXPECT_GT(m.activation_bytes_remat, 0);
  EXPECT_GT(m.lora_in_out, 0);
  MemoryInputs in;
  in.num_parameters = in.parameter_bytes = std::numeric_limits<std::int64_t>::max() / 2;
  in.model = m;
  in.micro_batch = std::int64_t{1} << 40;
  in.lora_rank = std::int64_t{1} << 40;
  in.micro_batches = 2;
  in.ema = true;
  for (const int ranks : {1, 4}) {
    in.ranks = in.fsdp = ranks;
    const MemoryEstimate e = estimate_memory(in);
    EXPECT_GT(e.total(), e.overhead);
    EXPECT_LE(e.total(), kMemoryEstimateCap * 16);
    for (const std::int64_t term : {e.parameters, e.gradients, e.set_aside, e.optimizer_state, e.ema, e.activations})
      EXPECT_GE(term, 0) << e.describe();
    EXPECT_FALSE(memory_refusal(in, e, AvailableMemory{std::int64_t{64} << 30, "test"}).empty());
  }
}

TEST(MemoryEstimate, AModelWithoutItsOwnEstimateGetsTheGenericFormula) {
  MemoryInputs in = small_inputs();
  in.model.reset();
  const MemoryEstimate e = estimate_memory(in);
  EXPECT_EQ(e.activations, generic_model_memory(100000, 2, 8).activation_bytes);
  EXPECT_GT(e.activations, 0);
}

TEST(MemoryEstimate, AvailableMemoryFromTheTestVariableIsSharedByTheRanksOfAHost) {
  ::setenv("LOOM_MEMORY_AVAILABLE", "8G", 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  auto a = available_memory(4);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->bytes, (std::int64_t{8} << 30) / 2);
  EXPECT_NE(a->source.find("2 ranks on this host"), std::string::npos) << a->source;
  ::unsetenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  ::setenv("LOOM_MEMORY_AVAILABLE", "eight", 1);
  EXPECT_THROW(available_memory(1), UserError);
  ::unsetenv("LOOM_MEMORY_AVAILABLE");
  a = available_memory(1);  // the machine's: cgroup or MemAvailable
  ASSERT_TRUE(a);
  EXPECT_GT(a->bytes, 0);
}

TEST(MemoryEstimate, TheRefusalGivesTheFiguresAndWhatWouldFit) {
  MemoryInputs in = small_inputs();
  in.model = models::transformer_memory(small_shape(), RematPolicy::none, 64, 512);
  in.micro_batch = 64;
  in.seq_len = 512;
  const MemoryEstimate e = estimate_memory(in);
  AvailableMemory plenty{e.total(), "test"};
  EXPECT_EQ(memory_refusal(in, e, plenty), "");
  // Room for the remat activations, not for the recorded ones.
  AvailableMemory tight{e.total() - e.activations + e.activations_remat + 1, "test"};
  const std::string text = memory_refusal(in, e, tight);
  EXPECT_NE(text.find("model.remat: full"), std::string::npos) << text;
  EXPECT_NE(text.find("trainer.microbatch_size: "), std::string::npos) << text;
  EXPECT_NE(text.find(format_bytes(e.total())), std::string::npos) << text;
  EXPECT_NE(text.find("memory_check: warn"), std::string::npos) << text;
}

}  // namespace
}  // namespace loom::training
