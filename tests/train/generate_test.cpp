// Generation against training: a document generated from an empty prompt is scored exactly as
// the evaluation scores it, for a tokenizer with an end-of-text token and one without, for
// learned and rotary positions; past the context the cache slides as documented; the sampling
// options are checked.
#include "loom/run/generate.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "../core/test_support.hpp"
#include "loom/autograd.hpp"
#include "loom/core/runtime.hpp"
#include "loom/error.hpp"
#include "loom/run/run_config.hpp"
#include "loom/token_windows.hpp"

namespace loom {
namespace {

// Bytes as ids, with an end-of-text id 256 when `with_eot`: the two kinds of document separator
// (the end-of-text token; "\n" without one).
class ByteTokenizer final : public Tokenizer {
 public:
  explicit ByteTokenizer(bool with_eot) : with_eot_(with_eot) {}
  std::int64_t vocab_size() const override { return with_eot_ ? 257 : 256; }
  std::vector<std::int32_t> encode(std::string_view text) const override {
    std::vector<std::int32_t> ids;
    for (const char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }
  std::string decode(std::span<const std::int32_t> ids) const override {
    std::string text;
    for (const auto id : ids)
      if (id < 256) text += static_cast<char>(id);
    return text;
  }
  std::optional<std::int32_t> end_of_text() const override {
    return with_eot_ ? std::optional<std::int32_t>(256) : std::nullopt;
  }

 private:
  bool with_eot_;
};

// A model of the build's plugins with random weights, large enough (initializer_range 0.5) that
// what a position attends to changes its prediction by far more than rounding.
struct Lm {
  std::unique_ptr<Runtime> runtime;
  Handle<Backend> backend;
  Handle<Model> model;
};

Lm make_lm(const test::TempDir& dir, const std::string& model_yaml, std::int64_t vocab) {
  const auto file = dir.write("model.yaml", "model: " + model_yaml + "\nbackend: cpu\n");
  RuntimeOptions options;
  options.config = file;
  Lm lm;
  lm.runtime = std::make_unique<Runtime>(options);
  const Value config = resolved_run_config(*lm.runtime);
  lm.backend = lm.runtime->registry().create<Backend>(ComponentRef{"backend", "", *config.find("backend"), "backend"});
  lm.model = lm.runtime->registry().create<Model>(ComponentRef{"model", "", *config.find("model"), "model"});
  lm.model->build(ModelSetup{vocab});
  lm.model->initialize(3);
  return lm;
}

const char* gpt2_yaml =
    "{type: gpt2, seq_len: 64, hidden_dim: 32, num_layers: 2, num_heads: 2, initializer_range: 0.5}";
const char* llama_yaml =
    "{type: llama, seq_len: 64, hidden_dim: 32, intermediate_dim: 64, num_layers: 2, num_heads: 4, num_kv_heads: 2, "
    "head_dim: null, initializer_range: 0.5}";

// The evaluation loss (mean cross-entropy through Model::loss, as the trainer evaluates) of the
// tokens [begin, begin + seq_len + 1) of `packed`, cut into a window by the datasets' own code
// (segment ids included); targets before `first_target` are not counted. Returns the summed loss
// and the number of targets.
std::pair<double, std::int64_t> eval_loss(Model& model, Backend& backend, const PackedTokens& packed,
                                          std::int64_t begin, std::int64_t seq_len, std::int64_t first_target) {
  const TokenSequence all = packed.view("documents");
  TokenWindows windows({all.slice(begin, begin + seq_len + 1)}, seq_len, 0, Split::validation, {false, false},
                       "the documents");
  Batch batch;
  windows.fill(0, 1, batch);
  for (std::int64_t i = 0; i < first_target; ++i) batch.targets[static_cast<std::size_t>(i)] = -1;
  Tape tape;
  tape.set_enabled(false);
  Ops ops(backend, &tape);
  ops.set_training(false);
  const Shape shape{1, seq_len};
  const Tensor loss = model.loss(ops, Tensor::from(std::span<const std::int32_t>(batch.inputs), shape),
                                 Tensor::from(std::span<const std::int32_t>(batch.targets), shape),
                                 Tensor::from(std::span<const std::int32_t>(batch.segment_ids), shape));
  const std::int64_t counted = seq_len - first_target;
  return {static_cast<double>(loss.item()) * static_cast<double>(counted), counted};
}

const std::vector<std::string> documents = {
    "The small cat sees a red ball.",
    "2 plus 3 is 5.",
    "Count from 7: 7 8 9 10.",
    "Two old farmers sleep under the bridge. Where is the fox?",
    "A dog runs.",
    "The brave robot carries three blue boxes.",
};

// The documents between the first and the last (each has a separator before and after it), scored
// through the generation path from an empty prompt, and by the evaluation: a document's first
// token is predicted from the separator before it (a window that begins at the separator), its
// other tokens and the separator after it from the document alone (a window that begins at the
// document). Both in nats per token.
struct Scores {
  double generation = 0, generation_old = 0, evaluation = 0;
};

Scores score_documents(Model& model, Backend& backend, const Tokenizer& tokenizer) {
  const PackedTokens packed = pack_documents(tokenizer, documents, nullptr);
  const std::vector<std::int32_t> separator = document_separator(tokenizer);
  const auto m = static_cast<std::int64_t>(separator.size());
  double generation = 0, generation_old = 0, evaluation = 0;
  std::int64_t counted = 0;
  for (std::size_t d = 1; d + 1 < documents.size(); ++d) {
    const std::int64_t begin = packed.document_ends[d - 1];  // the document's first token
    const std::int64_t end = packed.document_ends[d];        // after its separator
    const std::vector<std::int32_t> scored(packed.tokens.begin() + begin, packed.tokens.begin() + end);
    const auto n = static_cast<std::int64_t>(scored.size());  // the document and its separator

    const auto first = eval_loss(model, backend, packed, begin - m, m, m - 1);
    const auto rest = eval_loss(model, backend, packed, begin, n - 1, 0);
    evaluation += first.first + rest.first;
    counted += first.second + rest.second;
    EXPECT_EQ(first.second + rest.second, n);

    for (const double ll : log_likelihoods(model, backend, document_boundary(tokenizer, true), {}, scored))
      generation -= ll;
    // What generation did before: the separator as a prompt, in the document's segment.
    const DocumentBoundary old{separator, false};
    for (const double ll : log_likelihoods(model, backend, old, separator, scored)) generation_old -= ll;
  }
  const auto c = static_cast<double>(counted);
  return {generation / c, generation_old / c, evaluation / c};
}

class GenerationMatchesEvaluation : public ::testing::TestWithParam<const char*> {};

TEST_P(GenerationMatchesEvaluation, ForBothKindsOfSeparator) {
  test::TempDir dir;
  for (const bool with_eot : {false, true}) {
    ByteTokenizer tokenizer(with_eot);
    Lm lm = make_lm(dir, GetParam(), tokenizer.vocab_size());
    const Scores s = score_documents(*lm.model, *lm.backend, tokenizer);
    SCOPED_TRACE(with_eot ? "end-of-text separator" : "newline separator");
    EXPECT_NEAR(s.generation, s.evaluation, 1e-5);
    // The test can tell: letting the document see the separator changes the score.
    EXPECT_GT(std::abs(s.generation_old - s.evaluation), 1e-3)
        << "generation " << s.generation_old << " vs evaluation " << s.evaluation;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GenerationMatchesEvaluation, ::testing::Values(gpt2_yaml, llama_yaml),
                         [](const auto& info) { return std::string(info.index == 0 ? "Gpt2" : "Llama"); });

// After a separator that ends documents (an end-of-text token; "\n" when the training data held
// no line break inside a document), the next document starts as in training: its first token is
// predicted by the separator (which sees the document it ends), and the document itself runs
// from position 0 without seeing the one before. A "\n" that the data also held inside documents
// ends nothing: what follows stays in the same segment.
TEST(Generation, ASeparatorThatEndsDocumentsStartsANewSegment) {
  test::TempDir dir;
  for (const bool with_eot : {false, true}) {
    SCOPED_TRACE(with_eot ? "end-of-text separator" : "newline separator");
    ByteTokenizer tokenizer(with_eot);
    Lm lm = make_lm(dir, gpt2_yaml, tokenizer.vocab_size());
    const PackedTokens packed = pack_documents(tokenizer, documents, nullptr);
    // Documents 0 and 1 and the separator after 1, from an empty prompt.
    const std::int64_t n = packed.document_ends[1];
    const std::vector<std::int32_t> scored(packed.tokens.begin(), packed.tokens.begin() + n);
    const DocumentBoundary boundary = document_boundary(tokenizer, true);
    double generation = 0;
    for (const double ll : log_likelihoods(*lm.model, *lm.backend, boundary, {}, scored)) generation -= ll;
    // The evaluation: document 0's first token from the separator alone (as an empty prompt
    // starts), then a window over document 0 and its separator, which predicts document 1's first
    // token, then a window that begins at document 1.
    const std::int64_t first_end = packed.document_ends[0];
    const std::vector<std::int32_t> first(packed.tokens.begin(), packed.tokens.begin() + 1);
    const double first_nll = -log_likelihoods(*lm.model, *lm.backend, boundary, {}, first)[0];
    const auto ending = eval_loss(*lm.model, *lm.backend, packed, 0, first_end, 0);
    const auto next = eval_loss(*lm.model, *lm.backend, packed, first_end, n - first_end - 1, 0);
    ASSERT_EQ(1 + ending.second + next.second, n);
    EXPECT_NEAR(generation / static_cast<double>(n), (first_nll + ending.first + next.first) / static_cast<double>(n),
                1e-5);
    if (with_eot) continue;
    // "\n" inside documents: one segment from document 0's first token on, as a row of one
    // document holds it.
    const DocumentBoundary inside = document_boundary(tokenizer, false);
    EXPECT_FALSE(inside.separator_ends_documents);
    double one_segment = 0;
    for (const double ll : log_likelihoods(*lm.model, *lm.backend, inside, {}, scored)) one_segment -= ll;
    PackedTokens one;
    one.tokens = packed.tokens;
    one.document_ends = {static_cast<std::int64_t>(one.tokens.size())};
    const auto row = eval_loss(*lm.model, *lm.backend, one, 0, n - 1, 0);
    EXPECT_NEAR(one_segment / static_cast<double>(n), (first_nll + row.first) / static_cast<double>(n), 1e-5);
  }
}

TEST(Generation, AnEndOfTextTokenAlwaysEndsADocument) {
  EXPECT_TRUE(document_boundary(ByteTokenizer(true), false).separator_ends_documents);
  EXPECT_EQ(document_boundary(ByteTokenizer(true), false).separator, std::vector<std::int32_t>{256});
  EXPECT_EQ(document_boundary(ByteTokenizer(false), true).separator, std::vector<std::int32_t>{'\n'});
}

// Past the context: the oldest quarter is dropped and the cache refilled from position 0, so the
// logits after a slide are those of a fresh forward pass over the kept tokens.
TEST(Generation, PastTheContextTheWindowSlides) {
  test::TempDir dir;
  ByteTokenizer tokenizer(false);
  Lm lm = make_lm(dir, "{type: gpt2, seq_len: 16, hidden_dim: 32, num_layers: 2, num_heads: 2, initializer_range: 0.5}",
                  tokenizer.vocab_size());
  std::vector<std::int32_t> text;
  for (int i = 0; i < 60; ++i) text.push_back(static_cast<std::int32_t>('a' + (i * 7) % 26));
  const std::vector<std::int32_t> prompt(text.begin(), text.begin() + 3);
  const std::vector<std::int32_t> rest(text.begin() + 3, text.end());
  const std::vector<double> got =
      log_likelihoods(*lm.model, *lm.backend, document_boundary(tokenizer, false), prompt, rest);
  ASSERT_EQ(got.size(), rest.size());

  // The documented policy, with a full forward pass over what the cache holds.
  std::vector<std::int32_t> held = prompt;
  Tape tape;
  tape.set_enabled(false);
  Ops ops(*lm.backend, &tape);
  ops.set_training(false);
  for (std::size_t i = 0; i < rest.size(); ++i) {
    const auto len = static_cast<std::int64_t>(held.size());
    ASSERT_LE(len, 16);
    const std::vector<float> logits =
        lm.model->logits(ops, Tensor::from(std::span<const std::int32_t>(held), Shape{1, len}), Tensor()).to_vector();
    const float* last = logits.data() + (len - 1) * 256;
    double max = -INFINITY, total = 0;
    for (int v = 0; v < 256; ++v) max = std::max(max, static_cast<double>(last[v]));
    for (int v = 0; v < 256; ++v) total += std::exp(static_cast<double>(last[v]) - max);
    const double expected = static_cast<double>(last[rest[i]]) - max - std::log(total);
    EXPECT_NEAR(got[i], expected, 1e-4) << "token " << i << " with " << len << " tokens held";
    if (held.size() == 16) held.erase(held.begin(), held.begin() + 4);
    held.push_back(rest[i]);
  }
}

TEST(Generation, GoesPastTheContextOrStopsThereWhenAsked) {
  test::TempDir dir;
  ByteTokenizer tokenizer(false);
  Lm lm =
      make_lm(dir, "{type: gpt2, seq_len: 16, hidden_dim: 32, num_layers: 2, num_heads: 2}", tokenizer.vocab_size());
  SamplingOptions options;
  options.max_new_tokens = 50;
  options.seed = 1;
  const std::vector<std::int32_t> prompt = tokenizer.encode("The ");
  const DocumentBoundary boundary = document_boundary(tokenizer, true);
  Generation g = generate(*lm.model, *lm.backend, tokenizer, boundary, prompt, options);
  EXPECT_EQ(g.tokens.size(), 50u);
  EXPECT_EQ(g.stop, StopReason::length);
  g = generate(*lm.model, *lm.backend, tokenizer, boundary, {}, options);
  EXPECT_EQ(g.tokens.size(), 50u);

  options.at_context_end = ContextPolicy::stop;
  g = generate(*lm.model, *lm.backend, tokenizer, boundary, prompt, options);
  // 12 tokens fill the context after the 4 of the prompt; the 13th is predicted at its last position.
  EXPECT_EQ(g.tokens.size(), 13u);
  EXPECT_EQ(g.stop, StopReason::context);

  options.max_new_tokens = 0;
  EXPECT_TRUE(generate(*lm.model, *lm.backend, tokenizer, boundary, prompt, options).tokens.empty());
}

// A model whose vocabulary is padded past its tokenizer's (as Hugging Face files often are): the
// padded ids have no text, and neither sampling nor greedy decoding picks them, even where their
// logits are the largest (the head's rows of real tokens zeroed, the padded rows random).
TEST(Generation, NeverPicksIdsPastTheTokenizersVocabulary) {
  test::TempDir dir;
  ByteTokenizer tokenizer(false);  // 256 ids
  Lm lm = make_lm(dir, llama_yaml, 320);
  for (const auto& p : lm.model->parameters()) {
    if (p.parameter->name() != "lm_head.weight") continue;
    Tensor head = p.parameter->data();
    ASSERT_EQ(head.size(0), 320);
    head.slice(0, 0, 256).copy_from(Tensor::zeros(Shape{256, head.size(1)}));
  }
  const DocumentBoundary boundary = document_boundary(tokenizer, true);
  const std::vector<std::int32_t> prompt = tokenizer.encode("The ");
  for (const double temperature : {0.0, 1.0, 50.0}) {
    SCOPED_TRACE(temperature);
    SamplingOptions options;
    options.max_new_tokens = 40;
    options.temperature = temperature;
    options.seed = 7;
    const Generation g = generate(*lm.model, *lm.backend, tokenizer, boundary, prompt, options);
    ASSERT_EQ(g.tokens.size(), 40u);
    for (const auto t : g.tokens) ASSERT_TRUE(t >= 0 && t < 256) << t;
  }
}

TEST(Generation, SamplingOptionsOutOfRangeAreUserErrors) {
  const auto message = [](const SamplingOptions& o) {
    try {
      check_sampling_options(o, SamplingOptionNames{"-n", "--temperature", "--top-k", "--top-p"});
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  SamplingOptions o;
  EXPECT_EQ(message(o), "no error");
  o.top_k = -3;
  EXPECT_EQ(message(o), "--top-k must be at least 0 (0: every token), got -3");
  o = {};
  o.top_p = 0;
  EXPECT_EQ(message(o), "--top-p must be in (0, 1] (1: every token), got 0");
  o.top_p = 1.5;
  EXPECT_EQ(message(o), "--top-p must be in (0, 1] (1: every token), got 1.5");
  o.top_p = NAN;
  EXPECT_NE(message(o).find("--top-p must be in (0, 1]"), std::string::npos);
  o = {};
  o.temperature = -0.5;
  EXPECT_EQ(message(o), "--temperature must be a number >= 0 (0: greedy), got -0.5");
  o = {};
  o.max_new_tokens = -1;
  EXPECT_EQ(message(o), "-n must be at least 0, got -1");
}

}  // namespace
}  // namespace loom
