#include "loom/run/tokenize.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>

#include "loom/core/config.hpp"
#include "loom/error.hpp"
#include "loom/run/run_config.hpp"
#include "loom/text_corpus.hpp"
#include "loom/token_shard.hpp"
#include "loom/token_windows.hpp"
#include "train/mixture.hpp"

namespace fs = std::filesystem;

namespace loom {

namespace {

CorpusFormat format_of(const fs::path& file, CorpusFormat requested) {
  if (requested != CorpusFormat::automatic) return requested;
  const std::string ext = file.extension().string();
  return ext == ".jsonl" || ext == ".ndjson" || ext == ".json" ? CorpusFormat::jsonl : CorpusFormat::text;
}

std::int64_t bytes_of(const fs::path& file) {
  std::error_code ec;
  const auto n = fs::file_size(file, ec);
  return ec ? 0 : static_cast<std::int64_t>(n);
}

std::string shard_name(const std::string& split, std::size_t index) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%s-%05zu.bin", split.c_str(), index);
  return buffer;
}

// Calls `on_document(text, bytes read so far in this file)` for every document of `file`.
void for_each_document(const fs::path& file, CorpusFormat format, const std::string& text_field,
                       const std::function<void(std::string&&, std::int64_t)>& on_document) {
  if (format_of(file, format) == CorpusFormat::jsonl) {
    read_jsonl(file, text_field, [&](JsonlDocument&& d) { on_document(std::move(d.text), d.end_offset); });
  } else {
    std::string text = read_text_file(file);
    const auto n = static_cast<std::int64_t>(text.size());
    on_document(std::move(text), n);
  }
}

// Writes one split's documents into shards of at most `shard_tokens` tokens, encoding documents
// in batches in parallel and appending them in order.
class SplitWriter {
 public:
  SplitWriter(const Tokenizer& tokenizer, const TokenizeRequest& request, std::string split,
              const ExecutionContext* execution, TokenizeProgress& progress,
              const std::function<void(const TokenizeProgress&)>& report)
      : tokenizer_(tokenizer),
        request_(request),
        split_(std::move(split)),
        execution_(execution),
        progress_(progress),
        report_(report) {}

  void add(std::string&& document, std::int64_t bytes_done) {
    pending_bytes_ += static_cast<std::int64_t>(document.size());
    pending_.push_back(std::move(document));
    progress_bytes_ = bytes_done;
    if (pending_bytes_ >= (4 << 20) || pending_.size() >= 4096) flush();
  }

  void end_file(std::int64_t file_bytes) {
    flush();
    bytes_before_file_ += file_bytes;
    progress_bytes_ = 0;
  }

  void flush() {
    if (!pending_.empty()) {
      std::vector<std::vector<std::int32_t>> encoded(pending_.size());
      auto encode = [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t i = begin; i < end; ++i) encoded[i] = tokenizer_.encode(pending_[i]);
      };
      const auto n = static_cast<std::int64_t>(pending_.size());
      if (execution_) {
        execution_->parallel_for(n, 1, encode);
      } else {
        encode(0, n);
      }
      for (const auto& ids : encoded) {
        if (ids.empty()) continue;
        if (documents_ > 0) {
          // Computed on first use: a fitted vocabulary need not hold "\n" if there is one document.
          if (separator_.empty()) separator_ = document_separator(tokenizer_);
          emit(separator_);
          // No writer: the separator filled a shard, whose end ends the document.
          if (writer_) writer_->end_document();
        }
        emit(ids);
        ++documents_;
        ++progress_.documents;
      }
      pending_.clear();
      pending_bytes_ = 0;
    }
    progress_.bytes_done = bytes_before_split_ + bytes_before_file_ + progress_bytes_;
    if (report_) report_(progress_);
  }

  // Finishes the last shard; returns the shards with their token counts.
  std::vector<std::pair<fs::path, std::int64_t>> finish() {
    flush();
    if (writer_ && writer_->num_tokens() > 0) close_shard();
    writer_.reset();
    return shards_;
  }

  void set_bytes_before(std::int64_t bytes) { bytes_before_split_ = bytes; }
  std::int64_t tokens() const { return tokens_; }

 private:
  void emit(std::span<const std::int32_t> ids) {
    while (!ids.empty()) {
      if (!writer_) open_shard();
      const std::int64_t room = request_.shard_tokens - writer_->num_tokens();
      const auto n = static_cast<std::size_t>(std::min<std::int64_t>(room, static_cast<std::int64_t>(ids.size())));
      writer_->append(ids.first(n));
      tokens_ += static_cast<std::int64_t>(n);
      progress_.tokens += static_cast<std::int64_t>(n);
      ids = ids.subspan(n);
      if (writer_->num_tokens() >= request_.shard_tokens) close_shard();
    }
  }

  void open_shard() {
    writer_ =
        std::make_unique<TokenShardWriter>(request_.output_dir / shard_name(split_, shards_.size()),
                                           tokenizer_.vocab_size(), tokenizer_.end_of_text(), request_.token_bytes);
  }

  void close_shard() {
    const std::int64_t n = writer_->num_tokens();
    writer_->finish();
    shards_.emplace_back(request_.output_dir / shard_name(split_, shards_.size()), n);
    writer_.reset();
  }

  const Tokenizer& tokenizer_;
  const TokenizeRequest& request_;
  std::string split_;
  const ExecutionContext* execution_;
  std::vector<std::int32_t> separator_;
  TokenizeProgress& progress_;
  const std::function<void(const TokenizeProgress&)>& report_;
  std::vector<std::string> pending_;
  std::int64_t pending_bytes_ = 0;
  std::int64_t progress_bytes_ = 0, bytes_before_file_ = 0, bytes_before_split_ = 0;
  std::unique_ptr<TokenShardWriter> writer_;
  std::vector<std::pair<fs::path, std::int64_t>> shards_;
  std::int64_t documents_ = 0, tokens_ = 0;
};

// Copies tokens [begin, end) of `shard`, with their document boundaries, into a new shard.
void copy_range(const TokenShard& shard, std::int64_t begin, std::int64_t end, const fs::path& file) {
  const TokenShardInfo& info = shard.info();
  TokenShardWriter out(file, info.vocab_size, info.end_of_text, info.token_bytes);
  std::vector<std::int32_t> buffer;
  std::int64_t at = begin;
  for (const std::int64_t doc_end : shard.document_ends()) {
    if (doc_end <= begin) continue;
    const std::int64_t stop = std::min(doc_end, end);
    while (at < stop) {
      const std::int64_t n = std::min<std::int64_t>(stop - at, 1 << 20);
      buffer.resize(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) buffer[i] = shard.token(at + i);
      out.append(buffer);
      at += n;
    }
    out.end_document();
    if (doc_end >= end) break;
  }
  out.finish();
}

void rename_or_throw(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  if (ec) throw UserError("cannot rename " + from.string() + " to " + to.string() + ": " + ec.message());
}

// Moves the last `fraction` of the training tokens into validation shards: shards wholly past the
// split point are renamed, the one that straddles it is cut in two.
std::vector<std::pair<fs::path, std::int64_t>> split_tail(std::vector<std::pair<fs::path, std::int64_t>>& train,
                                                          double fraction, const fs::path& dir) {
  std::int64_t total = 0;
  for (const auto& s : train) total += s.second;
  const auto keep = static_cast<std::int64_t>(static_cast<double>(total) * (1.0 - fraction));
  if (keep >= total)
    throw UserError("validation_fraction " + std::to_string(fraction) + " of " + std::to_string(total) +
                    " tokens leaves no validation tokens; raise it or add validation files");
  if (keep <= 0)
    throw UserError("validation_fraction " + std::to_string(fraction) + " of " + std::to_string(total) +
                    " tokens leaves no training tokens");
  std::vector<std::pair<fs::path, std::int64_t>> kept, validation;
  std::int64_t start = 0;
  for (auto& [file, n] : train) {
    const std::int64_t end = start + n;
    if (end <= keep) {
      kept.emplace_back(file, n);
    } else if (start >= keep) {
      const fs::path to = dir / shard_name("validation", validation.size());
      rename_or_throw(file, to);
      validation.emplace_back(to, n);
    } else {
      const std::int64_t cut = keep - start;
      const fs::path to = dir / shard_name("validation", validation.size());
      {
        const TokenShard shard = TokenShard::open(file, false);
        copy_range(shard, cut, n, to);
        copy_range(shard, 0, cut, file);  // replaces the file; the mapping keeps the old one readable
      }
      kept.emplace_back(file, cut);
      validation.emplace_back(to, n - cut);
    }
    start = end;
  }
  train = std::move(kept);
  return validation;
}

bool is_shard_name(const std::string& name) {
  return (name.rfind("train-", 0) == 0 || name.rfind("validation-", 0) == 0) && name.size() > 4 &&
         (name.ends_with(".bin") || name.ends_with(".bin.partial"));
}

void prepare_output(const TokenizeRequest& request) {
  const fs::path& dir = request.output_dir;
  if (dir.empty()) throw UserError("no output directory given");
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw UserError("output " + dir.string() + " exists and is not a directory");
  fs::create_directories(dir, ec);
  if (ec) throw UserError("cannot create output directory " + dir.string() + ": " + ec.message());
  std::vector<fs::path> existing;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (is_shard_name(entry.path().filename().string()) || entry.path().filename() == "tokenizer.state")
      existing.push_back(entry.path());
  if (existing.empty()) return;
  if (!request.overwrite)
    throw UserError("output directory " + dir.string() + " already holds shards (" +
                    existing.front().filename().string() + (existing.size() > 1 ? ", ..." : "") +
                    "); choose another directory or pass --overwrite to replace them");
  for (const auto& f : existing) fs::remove(f, ec);
}

}  // namespace

TokenizeSummary tokenize_corpus(Tokenizer& tokenizer, const TokenizeRequest& request, const ExecutionContext* execution,
                                const std::function<void(const TokenizeProgress&)>& progress) {
  if (request.inputs.empty()) throw UserError("no input files given");
  if (request.validation_fraction < 0 || request.validation_fraction >= 1)
    throw UserError("validation fraction " + std::to_string(request.validation_fraction) + " is not in [0, 1)");
  if (request.validation_fraction > 0 && !request.validation_inputs.empty())
    throw UserError("give validation files or a validation fraction, not both");
  if (request.shard_tokens <= 0)
    throw UserError("tokens per shard must be positive, not " + std::to_string(request.shard_tokens));
  if (request.token_bytes != 0 && request.token_bytes != 2 && request.token_bytes != 4)
    throw UserError("token bytes must be 2 or 4, not " + std::to_string(request.token_bytes));

  const std::vector<fs::path> train_files = expand_paths(request.inputs, "the inputs");
  const std::vector<fs::path> validation_files = request.validation_inputs.empty()
                                                     ? std::vector<fs::path>{}
                                                     : expand_paths(request.validation_inputs, "the validation inputs");
  TokenizeProgress state;
  for (const auto& f : train_files) state.bytes_total += bytes_of(f);
  for (const auto& f : validation_files) state.bytes_total += bytes_of(f);

  // Check the output before the (possibly long) work.
  prepare_output(request);

  if (tokenizer.needs_fit()) {
    // Fitted on all the text, validation included, as nanoGPT builds its character set from the
    // whole file: a vocabulary that cannot encode the validation text would be useless.
    TokenizeProgress fitting = state;
    fitting.fitting = true;
    std::string all;
    std::int64_t before = 0;
    for (const auto* files : {&train_files, &validation_files}) {
      for (const auto& f : *files) {
        fitting.file = f.string();
        for_each_document(f, request.format, request.text_field, [&](std::string&& text, std::int64_t done) {
          if (!all.empty()) all += '\n';
          all += text;
          fitting.bytes_done = before + done;
        });
        before += bytes_of(f);
        if (progress) progress(fitting);
      }
    }
    tokenizer.fit(all);
  }
  if (tokenizer.vocab_size() <= 0)
    throw InternalError("the tokenizer reports a vocabulary of " + std::to_string(tokenizer.vocab_size()) + " ids");

  TokenizeSummary summary;
  summary.vocab_size = tokenizer.vocab_size();
  summary.token_bytes = request.token_bytes ? request.token_bytes : token_bytes_for_vocab(summary.vocab_size);
  summary.bytes = state.bytes_total;

  auto write_split = [&](const std::vector<fs::path>& files, const std::string& split, std::int64_t bytes_before) {
    SplitWriter writer(tokenizer, request, split, execution, state, progress);
    writer.set_bytes_before(bytes_before);
    for (const auto& f : files) {
      state.file = f.string();
      for_each_document(f, request.format, request.text_field,
                        [&](std::string&& text, std::int64_t done) { writer.add(std::move(text), done); });
      writer.end_file(bytes_of(f));
    }
    return writer.finish();
  };

  std::int64_t train_bytes = 0;
  for (const auto& f : train_files) train_bytes += bytes_of(f);
  auto train = write_split(train_files, "train", 0);
  std::int64_t train_tokens = 0;
  for (const auto& s : train) train_tokens += s.second;
  if (train_tokens == 0)
    throw UserError("the inputs (" + std::to_string(train_files.size()) + " file" +
                    (train_files.size() == 1 ? "" : "s") + ", first " + train_files.front().string() +
                    ") hold no text: the corpus is empty");

  std::vector<std::pair<fs::path, std::int64_t>> validation;
  if (!validation_files.empty()) {
    validation = write_split(validation_files, "validation", train_bytes);
    if (validation.empty())
      throw UserError("the validation inputs (first " + validation_files.front().string() + ") hold no text");
  } else if (request.validation_fraction > 0) {
    validation = split_tail(train, request.validation_fraction, request.output_dir);
  }

  for (const auto& [f, n] : train) {
    summary.train_shards.push_back(f);
    summary.train_tokens += n;
  }
  for (const auto& [f, n] : validation) {
    summary.validation_shards.push_back(f);
    summary.validation_tokens += n;
  }
  summary.documents = state.documents;

  const std::string tokenizer_state = tokenizer.state();
  if (!tokenizer_state.empty()) {
    const fs::path file = request.output_dir / "tokenizer.state";
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out << tokenizer_state;
    if (!out) throw UserError("cannot write " + file.string());
    summary.tokenizer_state = file;
  }
  return summary;
}

ConfiguredTokenize tokenize_request_from_config(const Runtime& runtime) {
  // Only the two sections tokenizing needs are validated: the model, backend or optimizer of the
  // config may come from plugins this command never loads.
  const Value& raw = runtime.raw_config();
  const std::string where =
      raw.location().known() ? "while reading " + raw.location().file : std::string("while reading the config");
  return with_context(where, [&] {
    const Value* data_node = raw.find("data");
    if (!data_node || data_node->is_null())
      throw UserError(
          "the config has no `data` section: `loom tokenize CONFIG` tokenizes the files of a text or "
          "jsonl dataset");
    if (training::is_mixture(*data_node))
      throw UserError(
          "data is a mixture of datasets: `loom tokenize CONFIG` tokenizes the files of one text or jsonl dataset "
          "(tokenize each dataset's files with `loom tokenize INPUT... -o DIR --tokenizer NAME` instead)");
    const Value data = config::validate_component("dataset", *data_node, "data", runtime.registry());
    const std::string type = data.find("type")->as_string();
    if (type != "text" && type != "jsonl")
      throw UserError("data.type is '" + type + "': `loom tokenize CONFIG` tokenizes the files of a `text` or " +
                      "`jsonl` dataset" + (type == "tokens" ? " (this one is already tokenized)" : ""));
    const Value* tokenizer = raw.find("tokenizer");
    const Value node =
        tokenizer && !tokenizer->is_null() ? *tokenizer : run_config_schema().find("tokenizer")->default_value();

    ConfiguredTokenize out;
    out.tokenizer = runtime.registry().create<Tokenizer>(ComponentRef{"tokenizer", "", node, "tokenizer"});
    TokenizeRequest& r = out.request;
    r.format = type == "jsonl" ? CorpusFormat::jsonl : CorpusFormat::text;
    auto strings = [](const Value* v) {
      std::vector<std::string> s;
      if (v && v->is_list())
        for (const auto& e : v->as_list()) s.push_back(e.as_string());
      return s;
    };
    r.inputs = strings(data.find("paths"));
    r.validation_inputs = strings(data.find("validation_paths"));
    // The dataset's split, unless it is by file.
    if (const Value* f = data.find("validation_fraction"); f && f->is_number() && r.validation_inputs.empty())
      r.validation_fraction = f->as_double();
    if (const Value* f = data.find("text_field"); f && f->is_string()) r.text_field = f->as_string();
    return out;
  });
}

}  // namespace loom
