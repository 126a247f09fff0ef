// loom export RUN_DIR_OR_CHECKPOINT --format hf OUT_DIR [--max-shard-size SIZE]
#include <iostream>

#include "command_line.hpp"
#include "loom/error.hpp"
#include "loom/run/generate.hpp"
#include "loom/run/hf_interop.hpp"

namespace fs = std::filesystem;

namespace loom::app {

int run_export(const std::vector<std::string>& args) {
  CommonOptions common;
  std::string source, out_dir, format, max_shard_size;
  po::options_description options("options");
  add_common_options(options, common);
  options.add_options()("source", po::value(&source), "a run directory, checkpoints/ directory or step-N/ checkpoint")(
      "out", po::value(&out_dir), "the directory to write (new or empty)")(
      "format", po::value(&format)->default_value("hf"), "the layout to write: hf (Hugging Face transformers)")(
      "max-shard-size", po::value(&max_shard_size)->default_value("5GB"),
      "split the weights into shards of at most this size (5GB, 500MB, 64KiB), as save_pretrained does");
  po::positional_options_description pos;
  pos.add("source", 1).add("out", 1);
  po::variables_map vm;
  if (!parse(args, options, pos, vm,
             "usage: loom export RUN_DIR_OR_CHECKPOINT --format hf OUT_DIR [--max-shard-size SIZE]\n\n"
             "Writes the run's model as Hugging Face transformers loads it: config.json, model.safetensors (or\n"
             "shards and model.safetensors.index.json) and, for a gpt2-bpe run, the tokenizer's files. A run\n"
             "directory means its latest checkpoint, or its final weights when it has no checkpoints."))
    return 0;
  if (source.empty() || out_dir.empty())
    throw UserError(
        "`loom export` needs a run or checkpoint and an output directory: "
        "`loom export RUN_DIR_OR_CHECKPOINT --format hf OUT_DIR`");
  if (format != "hf") throw UserError("--format " + format + " is not a format loom writes; the one there is: hf");
  HfExportOptions export_options;
  export_options.max_shard_bytes = parse_byte_size(max_shard_size, "--max-shard-size");

  const RunFiles run_files = resolve_run_or_checkpoint(source);
  const fs::path config = run_files.dir / "config.yaml";
  std::error_code ec;
  if (!fs::exists(config, ec))
    throw UserError("'" + source + "' is not a loom run: there is no " + config.string() +
                    " (give the directory `loom train` printed, such as runs/<run_id>, or one of its checkpoints)");
  Runtime runtime(runtime_options(common, {config.string()}, true));
  LoadedRun run = load_run(runtime, run_files.weights);
  const HfExportResult result = with_context("while exporting " + run_files.weights.string(), [&] {
    return export_hf(*run.model, run.tokenizer.get(), out_dir, export_options);
  });
  std::cout << "exported " << result.tensors << " tensors (" << result.weight_bytes / 1e6 << " MB"
            << (result.shards > 1 ? " in " + std::to_string(result.shards) + " shards" : std::string()) << ") of "
            << run_files.weights.string() << " to " << out_dir << ":";
  for (const auto& f : result.files) std::cout << " " << f;
  std::cout << "\n";
  if (!result.tokenizer_note.empty()) std::cout << result.tokenizer_note << "\n";
  return 0;
}

}  // namespace loom::app
