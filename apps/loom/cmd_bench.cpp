// loom bench TARGET ...: measurements of components. Targets: attention.
//
//   loom bench attention --kernels naive,flash [--seq-lens 256,512,1024,2048] [--batch 4]
//                        [--heads 12] [--head-dim 64] [--repeats 3] [--threads N] [CONFIG]
#include <iostream>
#include <memory>
#include <sstream>

#include "command_line.hpp"
#include "loom/error.hpp"
#include "loom/execution.hpp"
#include "loom/run/attention_bench.hpp"

namespace loom::app {

namespace {

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) items.push_back(item);
  return items;
}

ComponentRef attention_ref(const Value& node, const std::string& path) {
  if (node.is_string()) {
    Value map = Value::map();
    map.set("type", node);
    return {"attention", node.as_string(), map, path};
  }
  const Value* type = node.is_map() ? node.find("type") : nullptr;
  if (type == nullptr || !type->is_string())
    throw UserError(path + " must name an attention kernel (`attention: flash` or `attention: {type: flash, ...}`)");
  return {"attention", type->as_string(), node, path};
}

int run_bench_attention(const std::vector<std::string>& args) {
  CommonOptions common;
  AttentionBenchOptions bench;
  std::string kernels, seq_lens = "256,512,1024,2048";
  int threads = 0;
  bool bidirectional = false;
  po::options_description options("options");
  add_common_options(options, common);
  options.add_options()("kernels", po::value(&kernels),
                        "attention kernels to compare, comma-separated; the first is "
                        "the baseline of the ratios (after the config's, if given)")(
      "seq-lens", po::value(&seq_lens)->default_value(seq_lens), "sequence lengths, comma-separated")(
      "batch", po::value(&bench.batch)->default_value(bench.batch), "sequences per batch")(
      "heads", po::value(&bench.heads)->default_value(bench.heads), "query heads")(
      "kv-heads", po::value(&bench.kv_heads)->default_value(bench.kv_heads),
      "key/value heads (grouped-query attention); 0: as many as --heads")(
      "head-dim", po::value(&bench.head_dim)->default_value(bench.head_dim), "width of a head")(
      "bidirectional", po::bool_switch(&bidirectional), "no causal mask")(
      "window", po::value(&bench.params.window)->default_value(0), "sliding window in positions; 0: none")(
      "softcap", po::value(&bench.params.softcap)->default_value(0.0f), "logit soft-cap; 0: none")(
      "repeats", po::value(&bench.repeats)->default_value(bench.repeats), "timed runs per measurement (median)")(
      "threads", po::value(&threads)->default_value(0), "threads of the pool; 0: LOOM_NUM_THREADS or every core")(
      "positional", po::value<std::vector<std::string>>(), "CONFIG [a.b=c ...]");
  po::positional_options_description positional;
  positional.add("positional", -1);
  po::variables_map vm;
  if (!parse(args, options, positional, vm,
             "usage: loom bench attention [--kernels K1,K2,...] [CONFIG [a.b=c ...]] [options]\n\n"
             "Times the forward and the forward+backward pass of attention kernels and measures the extra memory\n"
             "each takes from the allocator, at several sequence lengths (GPT-2 small's heads by default), and\n"
             "prints a table per length with ratios against the first kernel. A CONFIG contributes its\n"
             "model.attention (with its options) as the first kernel."))
    return 0;
  if (vm.count("positional") == 0 && kernels.empty())
    throw UserError("name the kernels to measure (--kernels naive,flash) or give a config with model.attention");
  const std::vector<std::string> rest =
      vm.count("positional") ? vm["positional"].as<std::vector<std::string>>() : std::vector<std::string>{};
  Runtime runtime(runtime_options(common, rest, false));
  std::unique_ptr<ExecutionContext> pool;
  if (threads < 0) throw UserError("--threads must be positive (or 0 for the default), not " + std::to_string(threads));
  if (threads > 0) {
    pool = make_execution_context(threads);
    runtime.registry().set_execution_context(pool.get());
  }

  if (runtime.raw_config().at_path("model") != nullptr || !rest.empty()) {
    const Value* node = runtime.raw_config().at_path("model.attention");
    if (node == nullptr) throw UserError("the config sets no model.attention: name the kernel with --kernels");
    bench.kernels.push_back(attention_ref(*node, "model.attention"));
  }
  for (const std::string& name : split_list(kernels)) bench.kernels.push_back(attention_ref(Value(name), "--kernels"));
  bench.seq_lens.clear();
  for (const std::string& item : split_list(seq_lens)) {
    std::size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || value <= 0)
      throw UserError("--seq-lens takes positive integers separated by commas, not '" + item + "'");
    bench.seq_lens.push_back(value);
  }
  bench.params.causal = !bidirectional;

  const int pool_threads = runtime.registry().execution().num_threads();
  bool started = false;
  const auto results = run_attention_bench(runtime.registry(), bench, [&started](const AttentionBenchResult& r) {
    std::cerr << (started ? " " : "measured ") << r.kernel << "@" << r.seq_len << std::flush;
    started = true;
  });
  if (started) std::cerr << "\n";
  std::cout << format_attention_bench(bench, results, pool_threads);
  return 0;
}

}  // namespace

int run_bench(const std::vector<std::string>& args) {
  static const std::vector<std::string> targets = {"attention"};
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    (args.empty() ? std::cerr : std::cout)
        << "usage: loom bench TARGET [ARGS...]\n\ntargets:\n  attention  time and memory of attention kernels "
           "(`loom bench attention --help`)\n";
    return args.empty() ? 2 : 0;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "attention") return run_bench_attention(rest);
  const std::string guess = closest_match(args[0], targets);
  throw UserError("unknown bench target '" + args[0] + "'" + (guess.empty() ? "" : "; did you mean '" + guess + "'?") +
                  " (targets: attention)");
}

}  // namespace loom::app
