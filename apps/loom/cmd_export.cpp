// loom export RUN_DIR_OR_CHECKPOINT --format hf OUT_DIR [--max-shard-size SIZE] [--merge-lora]
#include <iostream>

#include "command_line.hpp"
#include "loom/error.hpp"
#include "loom/run/generate.hpp"
#include "loom/run/hf_interop.hpp"
#include "loom/run/run_config.hpp"

namespace fs = std::filesystem;

namespace loom::app {

int run_export(const std::vector<std::string>& args) {
  CommonOptions common;
  std::string source, out_dir, format, max_shard_size, weights, dtype;
  bool merge_lora = false;
  po::options_description options("options");
  add_common_options(options, common);
  options.add_options()("source", po::value(&source), "a run directory, checkpoints/ directory or step-N/ checkpoint")(
      "out", po::value(&out_dir), "the directory to write (new or empty)")(
      "format", po::value(&format)->default_value("hf"), "the layout to write: hf (Hugging Face transformers)")(
      "max-shard-size", po::value(&max_shard_size)->default_value("5GB"),
      "split the weights into shards of at most this size (5GB, 500MB, 64KiB), as save_pretrained does")(
      "dtype", po::value(&dtype)->default_value("f32"),
      "the weights' dtype in the files: f32, or bf16 (rounded to nearest even: half the size; what a LoRA run "
      "with a quantized base, lora.base_dtype, usually merges into)")(
      "weights", po::value(&weights)->default_value("ema"),
      "of a run trained with trainer.ema_decay: ema (its weight average, what its evaluations measured) or live "
      "(the weights the optimizer updated); a run without an average has only the live ones")(
      "merge-lora", po::bool_switch(&merge_lora),
      "a LoRA run: write the base model with the adapters merged into its weights (without it: the adapters "
      "alone, as PEFT's adapter_model.safetensors and adapter_config.json)");
  po::positional_options_description pos;
  pos.add("source", 1).add("out", 1);
  po::variables_map vm;
  if (!parse(args, options, pos, vm,
             "usage: loom export RUN_DIR_OR_CHECKPOINT --format hf OUT_DIR [--max-shard-size SIZE] [--weights "
             "ema|live]\n                   [--merge-lora] [--dtype f32|bf16]\n\n"
             "Writes the run's model as Hugging Face transformers loads it: config.json, model.safetensors (or\n"
             "shards and model.safetensors.index.json) and the tokenizer's files (gpt2-bpe, sentencepiece). A run\n"
             "directory means its latest checkpoint, or its final weights when it has no checkpoints. A LoRA run\n"
             "exports its adapters in PEFT's layout, or with --merge-lora the merged model. Of a run trained with\n"
             "trainer.ema_decay, the weight average is exported unless --weights live; the output says which."))
    return 0;
  if (source.empty() || out_dir.empty())
    throw UserError(
        "`loom export` needs a run or checkpoint and an output directory: "
        "`loom export RUN_DIR_OR_CHECKPOINT --format hf OUT_DIR`");
  if (format != "hf") throw UserError("--format " + format + " is not a format loom writes; the one there is: hf");
  HfExportOptions export_options;
  export_options.max_shard_bytes = parse_byte_size(max_shard_size, "--max-shard-size");
  if (dtype != "f32" && dtype != "bf16")
    throw UserError("--dtype " + dtype + " is not a dtype loom exports; give f32 or bf16");
  export_options.dtype = dtype == "bf16" ? DType::bf16 : DType::f32;

  const WeightsChoice choice = parse_weights_choice(weights, "--weights");
  const RunFiles run_files = resolve_run_or_checkpoint(source, choice);
  const fs::path config = run_files.dir / "config.yaml";
  std::error_code ec;
  if (!fs::exists(config, ec))
    throw UserError("'" + source + "' is not a loom run: there is no " + config.string() +
                    " (give the directory `loom train` printed, such as runs/<run_id>, or one of its checkpoints)");
  Runtime runtime(runtime_options(common, {config.string()}, true));
  LoadedRun run = load_run(runtime, run_files, merge_lora, RunMemory::host, "loom export");
  if (merge_lora && !run.lora)
    throw UserError("--merge-lora: '" + source +
                    "' is not a LoRA run (its config has no lora.rank > 0); export it "
                    "without --merge-lora");
  if (run.lora && !merge_lora) {
    std::error_code ec;
    if (fs::exists(out_dir, ec) && !fs::is_empty(out_dir, ec))
      throw UserError("'" + out_dir + "' is not empty; give a new or empty directory to export into");
    const std::string base = resolved_run_config(runtime).at_path("trainer.init_from")->as_string();
    const auto files = run.lora->save_peft(*run.model, out_dir, base);
    std::cout << "exported the LoRA adapters, " << run_files.description << ", to " << out_dir << ":";
    for (const auto& f : files) std::cout << " " << f;
    std::cout << "\n(PEFT: PeftModel.from_pretrained(base, '" << out_dir
              << "'); --merge-lora writes the merged model instead)\n";
    return 0;
  }
  // A quantized base (lora.base_dtype): each stored weight is written dequantized, with the
  // adapters added to its rows.
  if (run.lora && run.lora->base_stored())
    export_options.add_to_stored = [&](const Parameter& w, std::int64_t begin, std::int64_t end, float* rows) {
      run.lora->add_merged_rows(w, begin, end, rows);
    };
  if (const Value* from = resolved_run_config(runtime).at_path("trainer.init_from"); from && from->is_string())
    if (!from->as_string().empty()) export_options.base_dir = hf_source_dir(from->as_string());
  const HfExportResult result = with_context("while exporting " + run_files.weights.string(), [&] {
    return export_hf(*run.model, run.tokenizer.get(), out_dir, export_options);
  });
  std::cout << "exported " << result.tensors << " tensors (" << result.weight_bytes / 1e6 << " MB"
            << (result.shards > 1 ? " in " + std::to_string(result.shards) + " shards" : std::string()) << "), "
            << run_files.description << (run.lora ? ", merged into its base model," : ",") << " to " << out_dir << ":";
  for (const auto& f : result.files) std::cout << " " << f;
  std::cout << "\n";
  if (!result.tokenizer_note.empty()) std::cout << result.tokenizer_note << "\n";
  return 0;
}

}  // namespace loom::app
