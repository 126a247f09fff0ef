#include <gtest/gtest.h>

#include <regex>

#include "dataset_test_support.hpp"
#include "grammar.hpp"

namespace loom::test {
namespace {

namespace syn = loom::synthetic;

Handle<Dataset> synthetic_dataset(std::initializer_list<std::pair<const char*, Value>> items = {}) {
  Value v = Value::map();
  for (const auto& [k, x] : items) v.set(k, x);
  return make_dataset(LOOM_PLUGIN_DIR, "synthetic", v);
}

std::vector<std::string> sentences_of(const std::string& doc) {
  // Sentences end with '.' or '?' followed by a space or the end.
  std::vector<std::string> out;
  std::string current;
  for (std::size_t i = 0; i < doc.size(); ++i) {
    current += doc[i];
    if ((doc[i] == '.' || doc[i] == '?') && (i + 1 == doc.size() || doc[i + 1] == ' ')) {
      out.push_back(current);
      current.clear();
      if (i + 1 < doc.size()) ++i;
    }
  }
  EXPECT_TRUE(current.empty()) << "unterminated sentence: " << current;
  return out;
}

TEST(SyntheticGrammar, DocumentsDependOnlyOnSeedAndIndex) {
  EXPECT_EQ(syn::document(1, 5, 4), syn::document(1, 5, 4));
  EXPECT_NE(syn::document(1, 5, 4), syn::document(2, 5, 4));
  EXPECT_NE(syn::document(1, 5, 4), syn::document(1, 6, 4));
  std::set<std::string> distinct;
  for (int i = 0; i < 1000; ++i) distinct.insert(syn::document(0, i, 4));
  EXPECT_GT(distinct.size(), 990u) << "the grammar should rarely repeat a whole document";
}

// The corpus is part of a run's definition: the same config and seed must train on the same
// documents whichever compiler built loom. These values are what GCC 12 builds have produced since
// the grammar was written; a Clang build of the grammar drawing several words in one expression
// (an unspecified order) differed in 11,422 of the first 20,000 documents.
TEST(SyntheticGrammar, DocumentsArePinned) {
  EXPECT_EQ(syn::document(0, 0, 4),
            "A tired mouse rests behind the bridge. The mouse sings near the house. The small fox follows the "
            "mouse. The blue horse chases a letter.");
  std::uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a over the documents, each ended by "\n"
  for (int d = 0; d < 2000; ++d)
    for (const char c : syn::document(0, static_cast<std::uint64_t>(d), 4) + "\n") {
      hash ^= static_cast<unsigned char>(c);
      hash *= 0x100000001b3ull;
    }
  EXPECT_EQ(hash, 0x96cad1fe8ea396d2ull);
}

// Every subject agrees with its verb, every count counts, every sum is right, every recall
// answer matches the statement it recalls.
TEST(SyntheticGrammar, SentencesAreGrammaticalAndTrue) {
  std::map<std::string, bool> noun_plural, verb_plural;
  for (const auto* list : {&syn::animate_nouns(), &syn::thing_nouns()})
    for (const auto& w : *list) noun_plural[w.singular] = false, noun_plural[w.plural] = true;
  for (const auto* list : {&syn::transitive_verbs(), &syn::intransitive_verbs()})
    for (const auto& w : *list) verb_plural[w.singular] = false, verb_plural[w.plural] = true;
  std::set<std::string> adjectives(syn::adjectives().begin(), syn::adjectives().end());

  const std::regex count_re(R"(Count from (\d+):((?: \d+)+)\.)");
  const std::regex sum_re(R"((\d) plus (\d) is (\d+)\.)");
  const std::regex statement_re(R"(The (\w+ \w+) is (\w+ the \w+)\.)");
  const std::regex question_re(R"(Where is the (\w+ \w+)\?)");
  const std::regex answer_re(R"((\w+) the (\w+)\.)");
  std::map<std::string, int> kinds;
  for (int d = 0; d < 2000; ++d) {
    const auto sentences = sentences_of(syn::document(3, d, 4));
    std::string recalled_subject, recalled_place;
    bool expect_answer = false;
    for (const auto& s : sentences) {
      std::smatch m;
      ASSERT_TRUE(std::isupper(static_cast<unsigned char>(s[0])) || std::isdigit(static_cast<unsigned char>(s[0])))
          << s;
      if (expect_answer) {
        ASSERT_TRUE(std::regex_match(s, m, answer_re)) << s;
        std::string answer = s.substr(0, s.size() - 1);
        answer[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(answer[0])));
        EXPECT_EQ(answer, recalled_place) << "wrong recall answer in document " << d;
        expect_answer = false;
        ++kinds["recall"];
        continue;
      }
      if (std::regex_match(s, m, count_re)) {
        std::istringstream numbers(m[2].str());
        int expected = std::stoi(m[1].str()), n;
        while (numbers >> n) EXPECT_EQ(n, expected++) << s;
        ++kinds["count"];
      } else if (std::regex_match(s, m, sum_re)) {
        EXPECT_EQ(std::stoi(m[1].str()) + std::stoi(m[2].str()), std::stoi(m[3].str())) << s;
        ++kinds["sum"];
      } else if (std::regex_match(s, m, question_re)) {
        EXPECT_EQ(m[1].str(), recalled_subject) << "a question about something not stated: " << s;
        expect_answer = true;
      } else if (std::regex_match(s, m, statement_re) &&
                 !verb_plural.count(m[2].str().substr(0, m[2].str().find(' ')))) {
        recalled_subject = m[1].str();
        recalled_place = m[2].str();
      } else {
        // Determiner [adjective] noun verb ...: the verb agrees with the noun, which agrees with
        // the determiner.
        std::istringstream words(s);
        std::string det, word;
        words >> det;
        words >> word;
        if (adjectives.count(word)) words >> word;
        ASSERT_TRUE(noun_plural.count(word)) << "no subject noun in: " << s;
        const bool plural = noun_plural[word];
        std::string v;
        words >> v;
        ASSERT_TRUE(verb_plural.count(v)) << "no verb in: " << s;
        EXPECT_EQ(verb_plural[v], plural) << "agreement: " << s;
        const bool article = det == "A" || det == "An" || det == "The";
        if (det == "A" || det == "An") {
          EXPECT_FALSE(plural) << s;
        } else if (!article) {
          EXPECT_TRUE(plural) << "a number word other than one: " << s;
        }
        ++kinds["clause"];
      }
    }
    EXPECT_FALSE(expect_answer) << "a question without its answer";
  }
  for (const char* k : {"recall", "count", "sum", "clause"}) EXPECT_GT(kinds[k], 100) << k;
}

TEST(SyntheticDataset, DeterministicAndSplit) {
  auto tok = std::make_shared<TestTokenizer>(false, true);
  auto a = synthetic_dataset({{"num_documents", Value(500)}});
  auto b = synthetic_dataset({{"num_documents", Value(500)}});
  a->prepare(make_setup(tok, 64, 4, 2));
  b->prepare(make_setup(tok, 64, 4, 2));
  const std::int64_t total = a->num_tokens(Split::train) + a->num_tokens(Split::validation);
  EXPECT_EQ(a->num_tokens(Split::train), static_cast<std::int64_t>(static_cast<double>(total) * 0.9));
  Batch x, y;
  for (const auto split : {Split::train, Split::validation}) {
    a->batch(split, 4, x);
    b->batch(split, 4, y);
    EXPECT_EQ(x.inputs, y.inputs);
    expect_well_formed(x, 4, 64);
    expect_segments_follow(x, 256);
    a->batch(split, 5, y);
    EXPECT_NE(x.inputs, y.inputs);
  }
  auto other = synthetic_dataset({{"num_documents", Value(500)}, {"grammar_seed", Value(1)}});
  other->prepare(make_setup(tok, 64, 4, 2));
  other->batch(Split::train, 4, y);
  a->batch(Split::train, 4, x);
  EXPECT_NE(x.inputs, y.inputs) << "another grammar seed is another corpus";
}

TEST(SyntheticDataset, WithACharTokenizerNewlinesSeparateDocuments) {
  auto tok = std::make_shared<TestTokenizer>(true);
  auto ds = synthetic_dataset({{"num_documents", Value(300)}, {"validation_fraction", Value(0.0)}});
  ds->prepare(make_setup(tok, 128, 8, 4));
  EXPECT_EQ(tok->fits, 1);
  EXPECT_LT(tok->vocab_size(), 64) << "letters, digits, punctuation, space and newline";
  EXPECT_TRUE(ds->separator_ends_documents()) << "no document holds a line break";
  const auto newline = tok->encode("\n");
  Batch b;
  ds->batch(Split::train, 0, b);
  expect_well_formed(b, 8, 128);
  expect_segments_follow(b, newline.at(0));
  EXPECT_GT(std::count(b.inputs.begin(), b.inputs.end(), newline[0]), 0);
  EXPECT_EQ(ds->num_tokens(Split::validation), 0);
}

TEST(SyntheticDataset, BadSetupsAreUserErrors) {
  auto tok = std::make_shared<TestTokenizer>();
  std::string e = user_error([&] {
    synthetic_dataset({{"num_documents", Value(1)}, {"max_sentences", Value(1)}})->prepare(make_setup(tok, 512, 1));
  });
  EXPECT_NE(e.find("seq_len 512 needs 513"), std::string::npos) << e;
  e = user_error([&] { synthetic_dataset({{"num_documents", Value(50)}})->prepare(make_setup(tok, 16, 1, 1, 64)); });
  EXPECT_NE(e.find("outside the model's vocabulary of 64"), std::string::npos) << e;
  e = user_error([&] { synthetic_dataset({{"num_documents", Value(0)}}); });
  EXPECT_NE(e.find("num_documents"), std::string::npos) << e;
}

// The real `byte` and `char` tokenizer plugins, when they are built: the quickstart's setups.
TEST(SyntheticDataset, WorksWithTheTokenizerPlugins) {
  for (const char* name : {"byte", "char"}) {
    auto tok = plugin_tokenizer(LOOM_PLUGIN_DIR, name);
    if (!tok) GTEST_SKIP() << "the " << name << " tokenizer plugin is not built";
    auto ds = synthetic_dataset({{"num_documents", Value(2000)}});
    ds->prepare(make_setup(tok, 128, 16, 1));
    EXPECT_LE(tok->vocab_size(), 257);
    Batch b;
    ds->batch(Split::train, 3, b);
    expect_well_formed(b, 16, 128);
    const auto separator = tok->end_of_text() ? std::vector<std::int32_t>{*tok->end_of_text()} : tok->encode("\n");
    ASSERT_EQ(separator.size(), 1u);
    expect_segments_follow(b, separator[0]);
    const std::string row = tok->decode(window(b, 0));
    std::string corpus;
    for (int i = 0; i < 2000; ++i) corpus += syn::document(0, i, 4) + "\n";
    EXPECT_NE(corpus.find(row), std::string::npos) << name << ": " << row;
  }
}

}  // namespace
}  // namespace loom::test
