// A seeded probabilistic grammar of short English-like sentences, for the `synthetic` dataset.
//
// Five kinds of sentence, each with structure a small model can pick up in a few hundred steps:
//   transitive     "The small cats chase a red ball."        subject-verb agreement in number
//   intransitive   "Two old farmers sleep under the bridge."  agreement, prepositional phrases
//   counting       "Count from 7: 7 8 9 10 11."               the successor function
//   arithmetic     "3 plus 4 is 7."                           one-digit sums
//   recall         "The red fox is behind the house. ... Where is the red fox? Behind the house."
//                  copying from earlier in the context (what attention is for)
// Document i depends only on (seed, i): generating more documents leaves the first ones as they
// were.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::synthetic {

struct Word {
  const char* singular;
  const char* plural;
};

// The grammar's vocabulary, exposed for tests.
const std::vector<Word>& animate_nouns();
const std::vector<Word>& thing_nouns();
const std::vector<Word>& transitive_verbs();  // {"sees", "see"}: third person singular, plural
const std::vector<Word>& intransitive_verbs();
const std::vector<const char*>& adjectives();
const std::vector<const char*>& number_words();  // "one" ... "nine"

// Document `index` of the corpus of `seed`: 1 to `max_sentences` templates' sentences joined by
// spaces (a recall template contributes several sentences).
std::string document(std::uint64_t seed, std::uint64_t index, int max_sentences);

}  // namespace loom::synthetic
