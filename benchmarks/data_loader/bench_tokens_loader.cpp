// Tokens per second of the `tokens` dataset: batch() over a 64M-token shard (128 MB of uint16
// ids, GPT-2-sized vocabulary, documents of ~1000 tokens), every batch a new index, so the
// windows are spread over the whole file in the shuffled order a run sees. The shard is written
// once per process into the system temp directory, so it sits in the page cache: this measures
// the loader (window lookup, copy, widening, targets and segment ids), not the disk.
//
//   bench_data_loader [--benchmark_filter=...]      items_per_second is tokens per second
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "loom/core/plugin_host.hpp"
#include "loom/core/registry.hpp"
#include "loom/error.hpp"
#include "loom/kinds/dataset.hpp"
#include "loom/token_shard.hpp"

namespace {

constexpr std::int64_t kTokens = 64ll << 20;
constexpr std::int64_t kVocab = 50257;

struct Fixture {
  std::filesystem::path dir, shard;
  loom::Registry registry;
  loom::PluginHost host;

  Fixture() {
    dir = std::filesystem::temp_directory_path() / ("loom-bench-data-loader-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    shard = dir / "train-00000.bin";
    loom::TokenShardWriter writer(shard, kVocab, static_cast<std::int32_t>(kVocab - 1));
    std::mt19937_64 rng(1);
    std::vector<std::int32_t> chunk(1 << 16);
    for (std::int64_t written = 0; written < kTokens; written += static_cast<std::int64_t>(chunk.size())) {
      for (auto& id : chunk) id = static_cast<std::int32_t>(rng() % (kVocab - 1));
      for (std::size_t d = 0; d < chunk.size(); d += 1000) {
        writer.append(std::span(chunk).subspan(d, std::min<std::size_t>(1000, chunk.size() - d)));
        writer.end_document();
      }
    }
    writer.finish();
    host.load({{LOOM_PLUGIN_DIR, "benchmark"}}, registry);
  }
  ~Fixture() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  loom::Handle<loom::Dataset> dataset(std::int64_t seq_len, std::int64_t batch_size) {
    loom::Value node = loom::Value::map();
    node.set("type", loom::Value("tokens"));
    node.set("paths", loom::Value(loom::Value::List{loom::Value(shard.string())}));
    node.set("validation_fraction", loom::Value(0.0));
    auto ds = registry.create<loom::Dataset>(loom::ComponentRef{"dataset", "tokens", node, "data"});
    loom::DatasetSetup setup;
    setup.seq_len = seq_len;
    setup.batch_size = batch_size;
    setup.seed = 1234;
    setup.vocab_size = kVocab;
    ds->prepare(setup);
    return ds;
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

// Args: seq_len, batch_size.
void BM_TokensLoader(benchmark::State& state) {
  const std::int64_t seq_len = state.range(0), batch_size = state.range(1);
  auto ds = fixture().dataset(seq_len, batch_size);
  loom::Batch batch;
  std::int64_t index = 0;
  for (auto _ : state) {
    ds->batch(loom::Split::train, index++, batch);
    benchmark::DoNotOptimize(batch.inputs.data());
  }
  state.SetItemsProcessed(state.iterations() * seq_len * batch_size);
  state.counters["tokens_per_second"] =
      benchmark::Counter(static_cast<double>(state.iterations() * seq_len * batch_size), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_TokensLoader)
    ->ArgNames({"seq_len", "batch"})
    ->Args({64, 12})   // the shakespeare-char recipe
    ->Args({256, 4})   // GPT-2 small, short context
    ->Args({1024, 8})  // GPT-2 small, full context
    ->Args({2048, 16})
    ->MinTime(1.0)
    ->UseRealTime();  // wall-clock rates: what a training step would wait

// Opening and verifying the shard (checksum and id scan), per byte.
void BM_OpenAndVerify(benchmark::State& state) {
  const auto& shard = fixture().shard;
  for (auto _ : state) {
    const loom::TokenShard s = loom::TokenShard::open(shard, true);
    benchmark::DoNotOptimize(s.info().checksum);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(std::filesystem::file_size(shard)));
}
BENCHMARK(BM_OpenAndVerify)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
