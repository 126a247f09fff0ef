// The `preference` dataset: JSON lines {"prompt": ..., "chosen": ..., "rejected": ...}, one
// preference pair per line, for preference objectives (objective `dpo`).
//
// A batch of batch_size rows holds batch_size / 2 pairs, each as two consecutive rows: row 2i is
// the prompt followed by the chosen response, row 2i + 1 the prompt followed by the rejected one
// (each response ended by the tokenizer's end-of-text token when it has one). Targets are -1 on
// the prompt and on the padding, so that a row's counted targets are exactly its response's
// tokens; each row is one segment (the padding another). The training pairs come in a new order
// each epoch, drawn from the data seed and the epoch alone, so batch(split, index) is a pure
// function of its arguments; validation pairs come in file order.
#include <algorithm>
#include <fstream>
#include <loom/error.hpp>
#include <loom/kinds/dataset.hpp>
#include <loom/plugin.hpp>
#include <loom/random.hpp>
#include <loom/text_corpus.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

namespace {

struct Record {
  std::string prompt, chosen, rejected;
  std::string where;  // "file:line", for messages
};

// A pair, tokenized: the prompt and the two responses.
struct Pair {
  std::vector<std::int32_t> prompt, chosen, rejected;
};

class PreferenceDataset final : public loom::Dataset {
 public:
  explicit PreferenceDataset(const loom::Options& o)
      : paths_(o.get<std::vector<std::string>>("paths")),
        validation_paths_(o.get<std::vector<std::string>>("validation_paths")),
        validation_fraction_(o.get<double>("validation_fraction")),
        prompt_field_(o.get<std::string>("prompt_field")),
        chosen_field_(o.get<std::string>("chosen_field")),
        rejected_field_(o.get<std::string>("rejected_field")),
        shuffle_(o.get<bool>("shuffle")),
        path_(o.path()) {}

  void prepare(const loom::DatasetSetup& setup) override {
    if (!setup.tokenizer)
      throw loom::UserError(path_ + ": the preference dataset needs a tokenizer (the `tokenizer` section)");
    if (setup.batch_size % 2 != 0)
      throw loom::UserError(path_ + ": trainer.train_batch_size is " + std::to_string(setup.batch_size) +
                            "; the preference dataset puts a pair (chosen, rejected) in two rows, so it must be even");
    seq_len_ = setup.seq_len;
    rows_ = setup.batch_size;
    seed_ = setup.seed;
    std::vector<Record> train = read(loom::expand_paths(paths_, path_ + ".paths"));
    std::vector<Record> validation;
    if (!validation_paths_.empty()) {
      validation = read(loom::expand_paths(validation_paths_, path_ + ".validation_paths"));
    } else if (validation_fraction_ > 0) {
      const auto held = static_cast<std::size_t>(static_cast<double>(train.size()) * validation_fraction_);
      validation.assign(train.end() - static_cast<std::ptrdiff_t>(held), train.end());
      train.resize(train.size() - held);
    }
    if (train.empty()) throw loom::UserError(path_ + ".paths: no preference pairs left for training");
    loom::Tokenizer& tokenizer = *setup.tokenizer;
    if (tokenizer.needs_fit()) {
      std::string text;
      for (const auto& r : train) text += r.prompt + r.chosen + "\n" + r.prompt + r.rejected + "\n";
      tokenizer.fit(text);
    }
    train_ = tokenize(train, tokenizer, setup.vocab_size);
    validation_ = tokenize(validation, tokenizer, setup.vocab_size);
  }

  void batch(loom::Split split, std::int64_t index, loom::Batch& out) const override {
    const auto& pairs = split == loom::Split::train ? train_ : validation_;
    if (pairs.empty()) throw loom::InternalError("preference dataset: batch of an empty split");
    const std::int64_t rows = rows_, seq = seq_len_;
    out.batch_size = rows;
    out.seq_len = seq;
    out.inputs.assign(static_cast<std::size_t>(rows * seq), 0);
    out.targets.assign(static_cast<std::size_t>(rows * seq), -1);
    out.segment_ids.assign(static_cast<std::size_t>(rows * seq), 1);
    const auto n = static_cast<std::int64_t>(pairs.size());
    std::int64_t cached_epoch = -1;
    std::vector<std::int64_t> order;
    for (std::int64_t j = 0; j < rows / 2; ++j) {
      const std::int64_t global = index * (rows / 2) + j, epoch = global / n, position = global % n;
      std::int64_t pick = position;
      if (split == loom::Split::train && shuffle_) {
        if (epoch != cached_epoch) {
          order = permutation(n, epoch);
          cached_epoch = epoch;
        }
        pick = order[static_cast<std::size_t>(position)];
      }
      const Pair& p = pairs[static_cast<std::size_t>(pick)];
      write_row(p.prompt, p.chosen, 2 * j, out);
      write_row(p.prompt, p.rejected, 2 * j + 1, out);
    }
  }

  std::vector<std::string> batch_traits() const override { return {std::string(loom::batch_traits::preference_pairs)}; }

  std::int64_t num_tokens(loom::Split split) const override {
    std::int64_t total = 0;
    for (const auto& p : split == loom::Split::train ? train_ : validation_)
      total += static_cast<std::int64_t>(2 * p.prompt.size() + p.chosen.size() + p.rejected.size());
    return total;
  }

 private:
  std::vector<Record> read(const std::vector<std::filesystem::path>& files) const {
    std::vector<Record> records;
    for (const auto& file : files) {
      std::ifstream in(file, std::ios::binary);
      if (!in) throw loom::UserError("cannot read " + file.string());
      std::string line;
      std::int64_t number = 0;
      while (std::getline(in, line)) {
        ++number;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.find_first_not_of(" \t") == std::string::npos) continue;
        const std::string at = file.string() + ":" + std::to_string(number);
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(line);
        } catch (const nlohmann::json::parse_error& e) {
          throw loom::UserError(at + ": not valid JSON: " + loom::json_parse_error(e.what(), e.byte, line));
        }
        if (!j.is_object())
          throw loom::UserError(at + ": expected a JSON object with \"" + prompt_field_ + "\", \"" + chosen_field_ +
                                "\" and \"" + rejected_field_ + "\", found a " + j.type_name());
        Record r;
        r.where = at;
        for (auto [field, slot] : {std::pair{&prompt_field_, &r.prompt}, std::pair{&chosen_field_, &r.chosen},
                                   std::pair{&rejected_field_, &r.rejected}}) {
          const auto it = j.find(*field);
          if (it == j.end() || !it->is_string())
            throw loom::UserError(at + ": " + (it == j.end() ? "no" : "a non-string") + " \"" + *field +
                                  "\" field; each line needs string fields \"" + prompt_field_ + "\", \"" +
                                  chosen_field_ + "\" and \"" + rejected_field_ +
                                  "\" (other names: data.prompt_field, chosen_field, rejected_field)");
          *slot = it->get<std::string>();
        }
        records.push_back(std::move(r));
      }
    }
    return records;
  }

  std::vector<Pair> tokenize(const std::vector<Record>& records, const loom::Tokenizer& tokenizer,
                             std::int64_t vocab) const {
    const auto eot = tokenizer.end_of_text();
    std::vector<Pair> pairs;
    pairs.reserve(records.size());
    for (const auto& r : records) {
      Pair p{tokenizer.encode(r.prompt), tokenizer.encode(r.chosen), tokenizer.encode(r.rejected)};
      for (auto* response : {&p.chosen, &p.rejected}) {
        if (eot) response->push_back(*eot);
        const char* name = response == &p.chosen ? "chosen" : "rejected";
        if (response->empty())
          throw loom::UserError(r.where + ": the " + std::string(name) +
                                " response is empty: a pair needs a token to learn from in each response");
        // The row holds prompt + response less its last token (the inputs; that token is a target).
        const auto length = static_cast<std::int64_t>(p.prompt.size() + response->size());
        if (length - 1 > seq_len_)
          throw loom::UserError(r.where + ": the prompt and " + name + " response take " + std::to_string(length) +
                                " tokens, more than the model's seq_len + 1 (" + std::to_string(seq_len_ + 1) +
                                "); shorten the record or raise model.seq_len");
        if (p.prompt.empty() && response->size() < 2)
          throw loom::UserError(r.where + ": with an empty prompt the " + std::string(name) +
                                " response needs two tokens (the first one has nothing to be predicted from)");
      }
      if (vocab > 0)
        for (const auto* ids : {&p.prompt, &p.chosen, &p.rejected})
          for (const auto id : *ids)
            if (id < 0 || id >= vocab)
              throw loom::UserError(r.where + ": token id " + std::to_string(id) +
                                    " is outside the model's vocabulary [0, " + std::to_string(vocab) + ")");
      pairs.push_back(std::move(p));
    }
    return pairs;
  }

  // Row `row` of `out`: prompt + response shifted by one, targets only on the response.
  void write_row(const std::vector<std::int32_t>& prompt, const std::vector<std::int32_t>& response, std::int64_t row,
                 loom::Batch& out) const {
    const auto prompt_len = static_cast<std::int64_t>(prompt.size());
    const auto length = prompt_len + static_cast<std::int64_t>(response.size());
    auto token = [&](std::int64_t i) {
      return i < prompt_len ? prompt[static_cast<std::size_t>(i)] : response[static_cast<std::size_t>(i - prompt_len)];
    };
    const auto base = static_cast<std::size_t>(row * seq_len_);
    for (std::int64_t t = 0; t + 1 < length; ++t) {
      out.inputs[base + static_cast<std::size_t>(t)] = token(t);
      out.segment_ids[base + static_cast<std::size_t>(t)] = 0;
      if (t + 1 >= prompt_len) out.targets[base + static_cast<std::size_t>(t)] = token(t + 1);
    }
  }

  // The order of the training pairs in `epoch`: a Fisher-Yates shuffle from the data seed.
  std::vector<std::int64_t> permutation(std::int64_t n, std::int64_t epoch) const {
    std::vector<std::int64_t> order(static_cast<std::size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    const std::uint64_t key = loom::stream_key(seed_, 7, static_cast<std::uint64_t>(epoch));
    for (std::int64_t i = n - 1; i > 0; --i) {
      const std::uint64_t bits =
          (static_cast<std::uint64_t>(loom::random_bits(key, static_cast<std::uint32_t>(2 * i))) << 32) |
          loom::random_bits(key, static_cast<std::uint32_t>(2 * i + 1));
      const auto j = static_cast<std::int64_t>(bits % static_cast<std::uint64_t>(i + 1));
      std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
    }
    return order;
  }

  std::vector<std::string> paths_, validation_paths_;
  double validation_fraction_;
  std::string prompt_field_, chosen_field_, rejected_field_;
  bool shuffle_;
  std::string path_;
  std::int64_t seq_len_ = 0, rows_ = 0;
  std::uint64_t seed_ = 0;
  std::vector<Pair> train_, validation_;
};

loom::OptionSchema options() {
  loom::OptionSchema s;
  s.list("paths", loom::OptionType::string, {},
         "JSON-lines files, directories or globs; each line is one pair {\"prompt\", \"chosen\", \"rejected\"}.")
      .required()
      .length(1, static_cast<std::size_t>(-1));
  s.list("validation_paths", loom::OptionType::string, {},
         "Files of held-out pairs; when empty, the last validation_fraction of the pairs is held out.");
  s.number("validation_fraction", 0.1,
           "Last fraction of the pairs held out for validation when validation_paths is empty (0: none).")
      .min(0.0)
      .max(1.0, false);
  s.string("prompt_field", "prompt", "The field that holds the prompt.");
  s.string("chosen_field", "chosen", "The field that holds the preferred response.");
  s.string("rejected_field", "rejected", "The field that holds the dispreferred response.");
  s.boolean("shuffle", true, "Draw the training pairs in a new order each epoch (from the data seed).");
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Dataset>(
      {.name = "preference",
       .description = "preference pairs (prompt, chosen, rejected) from JSON lines, as row pairs for dpo",
       .version = "1.0.0",
       .options = options()},
      [](const loom::Options& o, const loom::CreateContext&) { return std::make_unique<PreferenceDataset>(o); });
}

}  // namespace

LOOM_PLUGIN(register_components)
