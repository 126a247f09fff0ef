// loom bench TARGET ...: measurements of components. Targets: attention, gemm.
//
//   loom bench attention --kernels naive,flash [--dtypes f32,bf16] [--seq-lens 256,512,1024,2048]
//                        [--batch 4] [--heads 12] [--head-dim 64] [--repeats 3] [--threads N] [CONFIG]
//   loom bench gemm [--backends cpu] [--dtypes f32,bf16] [--tokens 1024] [--shapes qkv,...]
//                   [--no-libraries] [--repeats 3] [--threads N]
#include <algorithm>
#include <iostream>
#include <memory>
#include <sstream>

#include "command_line.hpp"
#include "loom/core/registry.hpp"
#include "loom/error.hpp"
#include "loom/execution.hpp"
#include "loom/run/attention_bench.hpp"
#include "loom/run/gemm_bench.hpp"

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
  std::string kernels, seq_lens = "256,512,1024,2048", dtypes = "f32";
  int threads = 0;
  bool bidirectional = false;
  po::options_description options("options");
  add_common_options(options, common);
  options.add_options()("kernels", po::value(&kernels),
                        "attention kernels to compare, comma-separated; the first is "
                        "the baseline of the ratios (after the config's, if given)")(
      "dtypes", po::value(&dtypes)->default_value(dtypes),
      "compute dtypes of the tile products, comma-separated: f32, bf16 (bfloat16 operands, float32 "
      "accumulation, where the kernel has such a path on this CPU); each kernel runs in each")(
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
             "usage: loom bench attention [--kernels K1,K2,...] [--dtypes f32,bf16] [CONFIG [a.b=c ...]] [options]\n\n"
             "Times the forward and the forward+backward pass of attention kernels and measures the extra memory\n"
             "each takes from the allocator, at several sequence lengths (GPT-2 small's heads by default), in\n"
             "each compute dtype (--dtypes f32,bf16: the tile products in float32, or in bfloat16 with float32\n"
             "accumulation), and prints a table per length with ratios against the first row and each dtype's\n"
             "speed-up over f32. A CONFIG contributes its model.attention (with its options) as the first kernel."))
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

  // `auto` (model.attention's default) is the kernel that `loom train` would pick on the host,
  // where the benchmark's problems live.
  auto chosen = [&](ComponentRef ref) {
    if (ref.name != Registry::auto_attention) return ref;
    const std::vector<std::string> host = runtime.registry().attention_kernels_on(Device::host());
    if (host.empty())
      throw UserError(ref.path + ": auto: no loaded attention kernel computes on the host (attention kernels: " +
                      runtime.registry().describe_attention_devices() + ")");
    return attention_ref(Value(host.front()), ref.path);
  };
  if (runtime.raw_config().at_path("model") != nullptr || !rest.empty()) {
    const Value* node = runtime.raw_config().at_path("model.attention");
    bench.kernels.push_back(
        chosen(attention_ref(node ? *node : Value(std::string(Registry::auto_attention)), "model.attention")));
  }
  for (const std::string& name : split_list(kernels))
    bench.kernels.push_back(chosen(attention_ref(Value(name), "--kernels")));
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
  bench.dtypes.clear();
  for (const std::string& name : split_list(dtypes)) bench.dtypes.push_back(parse_compute_dtype(name, "--dtypes"));

  const int pool_threads = runtime.registry().execution().num_threads();
  bool started = false;
  const auto results = run_attention_bench(runtime.registry(), bench, [&started](const AttentionBenchResult& r) {
    std::cerr << (started ? " " : "measured ") << r.kernel
              << (r.dtype == DType::f32 ? "" : "/" + std::string(dtype_name(r.dtype))) << "@" << r.seq_len
              << std::flush;
    started = true;
  });
  if (started) std::cerr << "\n";
  std::cout << format_attention_bench(bench, results, pool_threads);
  return 0;
}

int run_bench_gemm(const std::vector<std::string>& args) {
  CommonOptions common;
  GemmBenchOptions bench;
  std::string backends = "cpu", dtypes = "f32,bf16", shapes;
  std::int64_t tokens = 1024;
  int threads = 0;
  bool no_libraries = false;
  po::options_description options("options");
  add_common_options(options, common);
  options.add_options()("backends", po::value(&backends)->default_value(backends),
                        "backends to compare, comma-separated")(
      "dtypes", po::value(&dtypes)->default_value(dtypes),
      "dtypes, comma-separated: f32 (Backend::gemm), bf16 (Backend::gemm_bf16: bf16 products, float32 "
      "accumulation), int8 and nf4 (the product with B stored in that format, dequantized on the fly: "
      "lora.base_dtype)")("tokens", po::value(&tokens)->default_value(tokens),
                          "tokens per step (batch x sequence length): the m of GPT-2 small's products")(
      "shapes", po::value(&shapes),
      "only these of GPT-2 small's products, comma-separated (qkv, attn_out, mlp_up, mlp_down, mlp_up_dX, "
      "mlp_up_dW, lm_head, lm_head_dW); default all")("no-libraries", po::bool_switch(&no_libraries),
                                                      "skip the raw library calls (openblas, onednn)")(
      "repeats", po::value(&bench.repeats)->default_value(bench.repeats), "timed runs per measurement (median)")(
      "threads", po::value(&threads)->default_value(0), "threads of the pool; 0: LOOM_NUM_THREADS or every core");
  po::positional_options_description positional;
  po::variables_map vm;
  if (!parse(args, options, positional, vm,
             "usage: loom bench gemm [--backends cpu,...] [--dtypes f32,bf16,int8,nf4] [options]\n\n"
             "Times the matrix products of a GPT-2 small training step (width 768, vocabulary 50257, --tokens\n"
             "tokens) on each backend in each compute dtype, and the raw library calls in the same run: one\n"
             "single-threaded OpenBLAS sgemm for f32, oneDNN's bf16 GEMM for bf16 (when libdnnl.so.2 is\n"
             "installed). Prints GFLOP/s, the ratio to the library call and bf16's speed-up over f32."))
    return 0;
  if (tokens <= 0) throw UserError("--tokens must be positive, not " + std::to_string(tokens));
  Runtime runtime(runtime_options(common, {}, false));
  std::unique_ptr<ExecutionContext> pool;
  if (threads < 0) throw UserError("--threads must be positive (or 0 for the default), not " + std::to_string(threads));
  if (threads > 0) {
    pool = make_execution_context(threads);
    runtime.registry().set_execution_context(pool.get());
  }
  for (const std::string& name : split_list(backends)) {
    Value map = Value::map();
    map.set("type", Value(name));
    bench.backends.push_back({"backend", name, map, "--backends"});
  }
  parse_gemm_dtypes(split_list(dtypes), bench, "--dtypes");
  bench.libraries = !no_libraries;
  bench.shapes = gpt2_small_gemm_shapes(tokens);
  if (!shapes.empty()) {
    std::vector<GemmShape> chosen;
    std::vector<std::string> known;
    for (const GemmShape& s : bench.shapes) known.push_back(s.name);
    for (const std::string& name : split_list(shapes)) {
      const auto it = std::find(known.begin(), known.end(), name);
      if (it == known.end()) {
        const std::string guess = closest_match(name, known);
        throw UserError("--shapes: unknown GEMM '" + name + "'" +
                        (guess.empty() ? "" : "; did you mean '" + guess + "'?") +
                        " (qkv, attn_out, mlp_up, mlp_down, mlp_up_dX, mlp_up_dW, lm_head, lm_head_dW)");
      }
      chosen.push_back(bench.shapes[static_cast<std::size_t>(it - known.begin())]);
    }
    bench.shapes = chosen;
  }
  const int pool_threads = runtime.registry().execution().num_threads();
  bool started = false;
  const auto results = run_gemm_bench(runtime.registry(), bench, [&started](const GemmBenchResult& r) {
    std::cerr << (started ? " " : "measured ") << r.shape << ":" << r.backend << "/" << r.label() << std::flush;
    started = true;
  });
  if (started) std::cerr << "\n";
  std::cout << format_gemm_bench(bench, results, pool_threads);
  return 0;
}

}  // namespace

int run_bench(const std::vector<std::string>& args) {
  static const std::vector<std::string> targets = {"attention", "gemm"};
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    (args.empty() ? std::cerr : std::cout)
        << "usage: loom bench TARGET [ARGS...]\n\ntargets:\n  attention  time and memory of attention kernels "
           "(`loom bench attention --help`)\n"
           "  gemm       GFLOP/s of backends' matrix products, f32 and bf16, against raw library calls "
           "(`loom bench gemm --help`)\n";
    return args.empty() ? 2 : 0;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "attention") return run_bench_attention(rest);
  if (args[0] == "gemm") return run_bench_gemm(rest);
  const std::string guess = closest_match(args[0], targets);
  throw UserError("unknown bench target '" + args[0] + "'" + (guess.empty() ? "" : "; did you mean '" + guess + "'?") +
                  " (targets: attention, gemm)");
}

}  // namespace loom::app
