// loom tokenize INPUT... -o DIR --tokenizer NAME [--tokenizer-option KEY=VALUE ...]
// loom tokenize CONFIG [a.b.c=value ...] -o DIR
//
// Text or JSON-lines files to token shards for the `tokens` dataset (core/src/data/tokenize.cpp
// does the work). A progress bar on a terminal, plain lines otherwise.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>

#include "command_line.hpp"
#include "loom/core/config.hpp"
#include "loom/error.hpp"
#include "loom/run/tokenize.hpp"

namespace loom::app {

namespace {

using Clock = std::chrono::steady_clock;

std::string megabytes(std::int64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return b;
}

std::string count(std::int64_t n) {
  std::string digits = std::to_string(n), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// Draws the progress: a bar redrawn in place on a terminal, a line per tenth otherwise.
class ProgressDisplay {
 public:
  ProgressDisplay() : tty_(isatty(fileno(stderr)) != 0), start_(Clock::now()) {}

  void update(const TokenizeProgress& p) {
    const auto now = Clock::now();
    const double seconds = std::chrono::duration<double>(now - start_).count();
    const double fraction =
        p.bytes_total > 0 ? static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total) : 1.0;
    const char* what = p.fitting ? "fitting the tokenizer" : "tokenizing";
    if (tty_) {
      if (now - last_ < std::chrono::milliseconds(100) && (fraction < 1.0 || p.tokens == last_tokens_)) return;
      last_tokens_ = p.tokens;
      last_ = now;
      const int width = 30;
      const int filled = static_cast<int>(fraction * width);
      char line[256];
      const double rate = seconds > 0 ? static_cast<double>(p.bytes_done) / 1e6 / seconds : 0.0;
      std::snprintf(line, sizeof line, "\r%-21s [%s%s] %3d%%  %s / %s  %s tokens  %.1f MB/s", what,
                    std::string(static_cast<std::size_t>(filled), '#').c_str(),
                    std::string(static_cast<std::size_t>(width - filled), '.').c_str(),
                    static_cast<int>(fraction * 100), megabytes(p.bytes_done).c_str(), megabytes(p.bytes_total).c_str(),
                    count(p.tokens).c_str(), rate);
      std::cerr << line << "\x1b[K" << std::flush;
      drawn_ = true;
    } else {
      const int tenth = static_cast<int>(fraction * 10);
      if (tenth <= last_tenth_ && p.fitting == last_fitting_) return;
      last_tenth_ = tenth;
      last_fitting_ = p.fitting;
      std::cerr << "loom tokenize: " << what << " " << tenth * 10 << "% (" << megabytes(p.bytes_done) << " of "
                << megabytes(p.bytes_total) << "), " << count(p.tokens) << " tokens, " << count(p.documents)
                << (p.documents == 1 ? " document\n" : " documents\n");
    }
  }

  void finish() {
    if (drawn_) std::cerr << "\n";
  }

 private:
  bool tty_;
  Clock::time_point start_, last_{};
  bool drawn_ = false;
  std::int64_t last_tokens_ = -1;
  int last_tenth_ = -1;
  bool last_fitting_ = false;
};

CorpusFormat parse_format(const std::string& s) {
  if (s == "auto") return CorpusFormat::automatic;
  if (s == "text") return CorpusFormat::text;
  if (s == "jsonl") return CorpusFormat::jsonl;
  throw UserError("--format '" + s + "': expected auto, text or jsonl");
}

bool is_config(const std::string& arg) {
  return arg.ends_with(".yaml") || arg.ends_with(".yml");
}

void print_summary(const TokenizeSummary& s, const std::filesystem::path& out, double seconds) {
  auto plural = [](std::size_t n, const char* word) { return std::to_string(n) + " " + word + (n == 1 ? "" : "s"); };
  std::cout << "wrote " << plural(s.train_shards.size(), "training shard") << " (" << count(s.train_tokens)
            << " tokens)";
  if (!s.validation_shards.empty())
    std::cout << " and " << plural(s.validation_shards.size(), "validation shard") << " (" << count(s.validation_tokens)
              << " tokens)";
  std::cout << " to " << out.string() << "\n";
  for (const auto* list : {&s.train_shards, &s.validation_shards})
    for (const auto& f : *list) std::cout << "  " << f.string() << "\n";
  if (s.tokenizer_state)
    std::cout << "  " << s.tokenizer_state->string() << " (the fitted tokenizer, which the tokens dataset loads)\n";
  char line[160];
  std::snprintf(line, sizeof line, "%s ids in %u-byte tokens; %s document%s, %s in %.1f s\n",
                count(s.vocab_size).c_str(), s.token_bytes, count(s.documents).c_str(), s.documents == 1 ? "" : "s",
                megabytes(s.bytes).c_str(), seconds);
  std::cout << line << "train on them with:\n  data:\n    type: tokens\n    paths: [" << (out / "train-*.bin").string()
            << "]\n";
  if (!s.validation_shards.empty())
    std::cout << "    validation_paths: [" << (out / "validation-*.bin").string() << "]\n";
  else
    std::cout << "    validation_fraction: 0.1\n";
}

}  // namespace

int run_tokenize(const std::vector<std::string>& args) {
  CommonOptions common;
  std::vector<std::string> positional, tokenizer_options, validation;
  std::string output, tokenizer, format = "auto", text_field;
  double validation_fraction = -1;
  std::int64_t shard_tokens = 100'000'000;
  unsigned token_bytes = 0;
  po::options_description options("options");
  add_common_options(options, common);
  options.add_options()("output,o", po::value(&output), "the directory to write the shards into (required)")(
      "tokenizer", po::value(&tokenizer), "the tokenizer to use, by name (byte, char, gpt2-bpe, ...)")(
      "tokenizer-option", po::value(&tokenizer_options)->composing(),
      "an option of the tokenizer, KEY=VALUE (repeatable): --tokenizer-option encoder_json=gpt2/encoder.json")(
      "format", po::value(&format), "auto (by extension: .jsonl, .ndjson, .json are JSON lines), text or jsonl")(
      "text-field", po::value(&text_field), "the field of each JSON line that holds its text (default text)")(
      "validation", po::value(&validation)->composing(),
      "a file, directory or glob of the validation split (repeatable)")(
      "validation-fraction", po::value(&validation_fraction),
      "hold out the last fraction of the training tokens as the validation split (default 0: none)")(
      "shard-tokens", po::value(&shard_tokens), "at most this many tokens per shard (default 100,000,000)")(
      "token-bytes", po::value(&token_bytes), "2 or 4 bytes per token (default: 2 when the vocabulary fits)")(
      "overwrite", "replace the shards (and tokenizer.state) already in the output directory")(
      "args", po::value(&positional), "INPUT files, or CONFIG and overrides");
  po::positional_options_description pos;
  pos.add("args", -1);
  po::variables_map vm;
  if (!parse(args, options, pos, vm,
             "usage: loom tokenize INPUT... -o DIR --tokenizer NAME [--tokenizer-option KEY=VALUE ...]\n"
             "       loom tokenize CONFIG.yaml [a.b.c=value ...] -o DIR\n\n"
             "Tokenizes text or JSON-lines files into token shards for the `tokens` dataset: train-NNNNN.bin\n"
             "(and validation-NNNNN.bin with --validation or --validation-fraction) in DIR. INPUTs are files,\n"
             "directories or globs; a text file is one document, a JSON line is one document. With a CONFIG,\n"
             "the tokenizer is its `tokenizer` section and the inputs those of its `data` section (a text or\n"
             "jsonl dataset: paths, validation_paths, validation_fraction, text_field). docs/datasets.md has\n"
             "the shard format."))
    return 0;
  if (output.empty()) throw UserError("no output directory: give -o DIR");
  if (positional.empty()) throw UserError("no inputs: give INPUT files (or a CONFIG.yaml), see `loom tokenize --help`");

  Handle<Tokenizer> tok;
  TokenizeRequest request;
  std::optional<Runtime> runtime;
  if (is_config(positional.front())) {
    for (const char* flag :
         {"tokenizer", "tokenizer-option", "format", "text-field", "validation", "validation-fraction"})
      if (vm.count(flag))
        throw UserError(std::string("--") + flag + " comes from the config when a CONFIG is given; override it " +
                        "there instead (data.validation_fraction=0.05, tokenizer.type=byte, ...)");
    runtime.emplace(runtime_options(common, positional, true));
    ConfiguredTokenize configured = tokenize_request_from_config(*runtime);
    tok = std::move(configured.tokenizer);
    request = std::move(configured.request);
  } else {
    for (const auto& p : positional)
      if (p.find('=') != std::string::npos && !std::filesystem::exists(p))
        throw UserError("'" + p + "' looks like an override, which only a CONFIG takes; INPUTs are files");
    if (tokenizer.empty())
      throw UserError("no tokenizer: give --tokenizer NAME (byte, char, gpt2-bpe, ...) or a CONFIG that names one");
    runtime.emplace(runtime_options(common, {}, false));
    Value node = Value::map();
    node.set("type", Value(tokenizer));
    for (const auto& o : tokenizer_options) {
      if (o.find('=') == std::string::npos) throw UserError("--tokenizer-option '" + o + "': expected KEY=VALUE");
      config::apply_override(node, config::parse_override(o));
    }
    tok = runtime->registry().create<Tokenizer>(ComponentRef{"tokenizer", tokenizer, node, "--tokenizer"});
    request.inputs = positional;
    request.validation_inputs = validation;
    request.format = parse_format(format);
    if (!text_field.empty()) request.text_field = text_field;
    if (validation_fraction >= 0) request.validation_fraction = validation_fraction;
  }
  request.output_dir = output;
  request.shard_tokens = shard_tokens;
  request.token_bytes = token_bytes;
  request.overwrite = vm.count("overwrite") > 0;

  ProgressDisplay display;
  const auto start = Clock::now();
  TokenizeSummary summary;
  try {
    summary = tokenize_corpus(*tok, request, &default_execution_context(),
                              [&](const TokenizeProgress& p) { display.update(p); });
  } catch (...) {
    display.finish();  // the error goes on a line of its own
    throw;
  }
  display.finish();
  print_summary(summary, request.output_dir, std::chrono::duration<double>(Clock::now() - start).count());
  return 0;
}

}  // namespace loom::app
