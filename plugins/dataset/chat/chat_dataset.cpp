// The `chat` dataset: conversations from JSON lines ({"messages": [...]} or {"prompt", "completion"}),
// rendered with a chat template (loom/chat_template.hpp), tokenized with a loss mask that trains
// only the assistant turns, and packed several to a row, each conversation its own segment.
//
// Rows. A conversation of m tokens takes m - 1 positions of a row (inputs t[0..m-1), targets
// t[1..m), a target -1 where its token is not trained). Conversations are packed in a seeded order (file order without
// `shuffle`), next-fit, into rows of seq_len positions; what a row has left is padding (target -1, a segment of its
// own). A conversation longer than seq_len + 1 tokens is cut to that length. The rows are fixed at prepare(); batch b
// takes samples b * batch_size ... of a seeded permutation of the rows per epoch (the identity for validation), so a
// batch is a pure function of (split, index).
#include <algorithm>
#include <fstream>
#include <iostream>
#include <loom/chat_template.hpp>
#include <loom/kinds/dataset.hpp>
#include <loom/plugin.hpp>
#include <loom/random.hpp>
#include <loom/text_corpus.hpp>
#include <loom/token_windows.hpp>
#include <memory>
#include <optional>

namespace {

// One split's conversations, tokenized and packed.
struct PackedChats {
  std::vector<std::int32_t> tokens;
  std::vector<std::uint8_t> trained;
  std::vector<std::int64_t> starts;      // conversation c is tokens [starts[c], starts[c + 1])
  std::vector<std::int64_t> order;       // conversations in packing order
  std::vector<std::int64_t> row_starts;  // row r holds order[row_starts[r] .. row_starts[r + 1])
  std::int64_t trained_tokens = 0;

  std::int64_t rows() const { return static_cast<std::int64_t>(row_starts.size()) - 1; }
  std::int64_t length(std::int64_t c) const {
    return starts[static_cast<std::size_t>(c) + 1] - starts[static_cast<std::size_t>(c)];
  }
};

// Where a record came from, and the conversation's messages.
struct ChatRecord {
  std::vector<loom::ChatMessage> messages;
  std::string where;  // "file:line"
};

class ChatDataset final : public loom::Dataset {
 public:
  explicit ChatDataset(const loom::Options& options)
      : paths_(options.get<std::vector<std::string>>("paths")),
        validation_paths_(options.get<std::vector<std::string>>("validation_paths")),
        validation_fraction_(options.get<double>("validation_fraction")),
        skip_bad_(options.get<std::string>("on_bad_record") == "skip"),
        pack_(options.get<bool>("pack")),
        shuffle_(options.get<bool>("shuffle")),
        require_special_tokens_(options.get<bool>("require_special_tokens")),
        path_(options.path()),
        template_(make_template(options)) {}

  void prepare(const loom::DatasetSetup& setup) override {
    if (!setup.tokenizer)
      throw loom::UserError(path_ + ": the chat dataset needs a tokenizer (the `tokenizer` section)");
    seq_len_ = setup.seq_len;
    batch_size_ = setup.batch_size;
    seed_ = setup.seed;
    const auto files = loom::expand_paths(paths_, path_ + ".paths");
    std::vector<ChatRecord> train = read_records(files);
    std::vector<ChatRecord> validation;
    if (!validation_paths_.empty()) {
      validation = read_records(loom::expand_paths(validation_paths_, path_ + ".validation_paths"));
    } else if (validation_fraction_ > 0) {
      const auto held =
          static_cast<std::size_t>(std::max(1.0, static_cast<double>(train.size()) * validation_fraction_ + 0.5));
      if (held >= train.size())
        throw loom::UserError(path_ + ": validation_fraction " + std::to_string(validation_fraction_) + " of " +
                              std::to_string(train.size()) +
                              " conversations leaves none to train on: lower it or add conversations");
      validation.assign(std::make_move_iterator(train.end() - static_cast<std::ptrdiff_t>(held)),
                        std::make_move_iterator(train.end()));
      train.resize(train.size() - held);
    }
    if (train.empty())
      throw loom::UserError(path_ + ": " + loom::describe_files(files) + " holds no conversation to train on");

    loom::Tokenizer& tokenizer = *setup.tokenizer;
    if (tokenizer.needs_fit()) {
      std::string all;
      for (const auto* split : {&train, &validation})
        for (const auto& r : *split)
          for (const auto& p : loom::render_chat(template_, r.messages)) all += p.text;
      tokenizer.fit(all);
    }
    if (const auto missing = loom::missing_special_tokens(template_, tokenizer);
        !missing.empty() && require_special_tokens_) {
      std::string list;
      for (const auto& m : missing) list += (list.empty() ? "" : ", ") + m;
      throw loom::UserError(path_ + ": the tokenizer has no single token for " + list +
                            " of the chat template (require_special_tokens is true): use a tokenizer whose "
                            "vocabulary holds them (a tokenizer.json with these added tokens), or another template");
    }
    pad_ = tokenizer.end_of_text().value_or(0);

    train_ = pack(tokenizer, train, setup, "training", shuffle_);
    if (!validation.empty()) validation_ = pack(tokenizer, validation, setup, "validation", false);
    // Said once, on stderr: what was not trained on as written.
    if (bad_records_)
      std::cerr << path_ << ": " << bad_records_ << " bad record" << (bad_records_ == 1 ? "" : "s")
                << " skipped (on_bad_record: skip); the first: " << first_bad_ << "\n";
    if (truncated_)
      std::cerr << path_ << ": " << truncated_ << " conversation" << (truncated_ == 1 ? "" : "s")
                << " longer than the context, cut to its " << seq_len_ + 1 << " tokens\n";
  }

  void batch(loom::Split split, std::int64_t index, loom::Batch& out) const override {
    const bool train = split == loom::Split::train;
    const PackedChats& data = train ? train_ : validation_;
    if (data.rows() <= 0)
      throw loom::UserError(train ? path_ + ": batch() before prepare()"
                                  : path_ +
                                        ": there is no validation split (validation_fraction is 0 and no "
                                        "validation_paths are given)");
    const std::int64_t n = batch_size_ * seq_len_;
    out.batch_size = batch_size_;
    out.seq_len = seq_len_;
    out.inputs.assign(static_cast<std::size_t>(n), pad_);
    out.targets.assign(static_cast<std::size_t>(n), -1);
    out.segment_ids.assign(static_cast<std::size_t>(n), 0);
    const auto rows = static_cast<std::uint64_t>(data.rows());
    for (std::int64_t r = 0; r < batch_size_; ++r) {
      const auto sample = static_cast<std::uint64_t>(index * batch_size_ + r);
      const std::uint64_t epoch = sample / rows;
      std::uint64_t row = sample % rows;
      if (train && shuffle_) row = loom::permute_index(row, rows, loom::stream_key(seed_, 2, 1000 + epoch));
      fill_row(data, static_cast<std::int64_t>(row), static_cast<std::size_t>(r * seq_len_), out);
    }
  }

  std::int64_t num_tokens(loom::Split split) const override {
    return static_cast<std::int64_t>((split == loom::Split::train ? train_ : validation_).tokens.size());
  }

 private:
  static loom::ChatTemplate make_template(const loom::Options& o) {
    const auto system = o.get_optional<std::string>("system_template");
    const auto user = o.get_optional<std::string>("user_template");
    const auto assistant = o.get_optional<std::string>("assistant_template");
    if (o.get<std::string>("template") == "chatml") {
      if (system || user || assistant)
        throw loom::UserError(o.path() +
                              ": system_template, user_template and assistant_template are for template: custom "
                              "(template is chatml)");
      return loom::ChatTemplate::chatml();
    }
    if (!system || !user || !assistant)
      throw loom::UserError(o.path() +
                            ": template: custom needs system_template, user_template and assistant_template, each a "
                            "string holding {content} once (for example \"<|user|>\\n{content}\\n\")");
    return loom::ChatTemplate::from_strings(*system, *user, *assistant, o.path());
  }

  std::vector<ChatRecord> read_records(const std::vector<std::filesystem::path>& files) {
    std::vector<ChatRecord> records;
    for (const auto& file : files) {
      std::ifstream in(file, std::ios::binary);
      if (!in) throw loom::UserError(path_ + ": cannot read " + file.string());
      std::string line;
      std::int64_t number = 0;
      while (std::getline(in, line)) {
        ++number;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.find_first_not_of(" \t") == std::string::npos) continue;
        const std::string where = file.string() + ":" + std::to_string(number);
        try {
          records.push_back({loom::parse_chat_record(line), where});
        } catch (const loom::UserError& e) {
          bad(where + ": " + e.what());
        }
      }
    }
    return records;
  }

  // A record that cannot be trained on: an error, or counted under on_bad_record: skip.
  void bad(const std::string& what) {
    if (!skip_bad_)
      throw loom::UserError(path_ + ": " + what + " (on_bad_record: skip would skip such records and count them)");
    if (first_bad_.empty()) first_bad_ = what;
    ++bad_records_;
  }

  PackedChats pack(const loom::Tokenizer& tokenizer, const std::vector<ChatRecord>& records,
                   const loom::DatasetSetup& setup, const std::string& split, bool shuffle_order) {
    PackedChats p;
    p.starts.push_back(0);
    std::int32_t max_id = -1;
    for (const auto& r : records) {
      loom::ChatTokens t = loom::tokenize_chat(tokenizer, loom::render_chat(template_, r.messages));
      const auto limit = static_cast<std::size_t>(seq_len_ + 1);
      if (t.ids.size() > limit) {
        t.ids.resize(limit);
        t.trained.resize(limit);
        ++truncated_;
      }
      // Only targets count: the first token is never one.
      const auto trained = t.ids.size() < 2 ? 0 : std::count(t.trained.begin() + 1, t.trained.end(), 1);
      if (trained == 0) {
        bad(r.where + ": no assistant token within the first " + std::to_string(seq_len_ + 1) +
            " tokens (the conversation is longer than the model's context)");
        continue;
      }
      for (const auto id : t.ids) max_id = std::max(max_id, id);
      p.trained_tokens += trained;
      p.tokens.insert(p.tokens.end(), t.ids.begin(), t.ids.end());
      p.trained.insert(p.trained.end(), t.trained.begin(), t.trained.end());
      p.starts.push_back(static_cast<std::int64_t>(p.tokens.size()));
    }
    const auto count = static_cast<std::int64_t>(p.starts.size()) - 1;
    if (count == 0)
      throw loom::UserError(path_ + ": the " + split + " split holds no conversation with an assistant turn");
    loom::check_vocabulary(max_id, setup, path_ + " (" + split + " conversations)");

    // A seeded order, so that rows mix the conversations of different files and parts of a file.
    p.order.resize(static_cast<std::size_t>(count));
    const std::uint64_t key = loom::stream_key(seed_, 2, 999);
    for (std::int64_t i = 0; i < count; ++i)
      p.order[static_cast<std::size_t>(i)] =
          shuffle_order ? static_cast<std::int64_t>(loom::permute_index(static_cast<std::uint64_t>(i),
                                                                        static_cast<std::uint64_t>(count), key))
                        : i;
    p.row_starts.push_back(0);
    std::int64_t used = 0;
    for (std::int64_t i = 0; i < count; ++i) {
      const std::int64_t positions = p.length(p.order[static_cast<std::size_t>(i)]) - 1;
      if (i > 0 && (!pack_ || used + positions > seq_len_)) {
        p.row_starts.push_back(i);
        used = 0;
      }
      used += positions;
    }
    p.row_starts.push_back(count);
    return p;
  }

  void fill_row(const PackedChats& data, std::int64_t row, std::size_t at, loom::Batch& out) const {
    std::int32_t segment = 0;
    std::size_t pos = at;
    for (std::int64_t i = data.row_starts[static_cast<std::size_t>(row)];
         i < data.row_starts[static_cast<std::size_t>(row) + 1]; ++i, ++segment) {
      const std::int64_t c = data.order[static_cast<std::size_t>(i)];
      const auto begin = static_cast<std::size_t>(data.starts[static_cast<std::size_t>(c)]);
      const auto end = static_cast<std::size_t>(data.starts[static_cast<std::size_t>(c) + 1]);
      for (std::size_t k = begin; k + 1 < end; ++k, ++pos) {
        out.inputs[pos] = data.tokens[k];
        out.targets[pos] = data.trained[k + 1] ? data.tokens[k + 1] : -1;
        out.segment_ids[pos] = segment;
      }
    }
    // Padding: a segment of its own, no targets.
    for (const std::size_t row_end = at + static_cast<std::size_t>(seq_len_); pos < row_end; ++pos)
      out.segment_ids[pos] = segment;
  }

  std::vector<std::string> paths_, validation_paths_;
  double validation_fraction_;
  bool skip_bad_, pack_, shuffle_, require_special_tokens_;
  std::string path_;
  loom::ChatTemplate template_;
  std::int64_t seq_len_ = 0, batch_size_ = 0;
  std::uint64_t seed_ = 0;
  std::int32_t pad_ = 0;
  PackedChats train_, validation_;
  std::int64_t bad_records_ = 0, truncated_ = 0;
  std::string first_bad_;
};

loom::OptionSchema options() {
  loom::OptionSchema s;
  s.list("paths", loom::OptionType::string, {},
         "JSON-lines files, directories or globs of conversations, relative to the current directory; each line is "
         "{\"messages\": [{\"role\", \"content\"}, ...]} or {\"prompt\", \"completion\"}.")
      .required()
      .length(1, static_cast<std::size_t>(-1));
  s.list("validation_paths", loom::OptionType::string, {},
         "Files of conversations for the validation split; when empty, the last validation_fraction of the "
         "conversations is held out.");
  s.number("validation_fraction", 0.1,
           "Last fraction of the conversations held out for validation when validation_paths is empty (0: no "
           "validation split).")
      .min(0.0)
      .max(1.0, false);
  s.string("template", "chatml",
           "How a conversation becomes text: chatml (<|im_start|>ROLE\\n...<|im_end|>\\n), or custom (the three "
           "*_template strings).")
      .one_of({"chatml", "custom"});
  s.string("system_template", std::nullopt, "template: custom: a system turn, holding {content} once.");
  s.string("user_template", std::nullopt,
           "template: custom: a user turn (and a record's prompt), holding {content} once.");
  s.string("assistant_template", std::nullopt,
           "template: custom: an assistant turn (and a record's completion), holding {content} once; its text "
           "before {content} is not trained, the content and the text after it are.");
  s.boolean("require_special_tokens", false,
            "Fail when a <|...|> marker of the template is not one token of the tokenizer (false: it is spelled "
            "out in ordinary tokens).");
  s.string("on_bad_record", "error",
           "A line that is not a conversation (not JSON, neither layout, no assistant turn) or leaves no assistant "
           "token within the context: error (a UserError naming file and line), or skip (skipped and counted).")
      .one_of({"error", "skip"});
  s.boolean("pack", true,
            "Pack several conversations into one sequence (each its own segment); false: one per sequence.");
  s.boolean("shuffle", true,
            "Pack the training conversations in a seeded order and visit the sequences in a new seeded order "
            "each epoch (false: file order).");
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Dataset>(
      {.name = "chat",
       .description = "conversations (messages or prompt/completion JSON lines), loss on assistant turns only",
       .version = "1.0.0",
       .options = options()},
      [](const loom::Options& o, const loom::CreateContext&) { return std::make_unique<ChatDataset>(o); });
}

}  // namespace

LOOM_PLUGIN(register_components)
