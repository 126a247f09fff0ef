#include "grammar.hpp"

#include <cctype>

#include "loom/random.hpp"

namespace loom::synthetic {

namespace {

// SplitMix64: a 64-bit counter through hash_u64 (its finaliser). Stateful: never call it twice
// in one expression (the order of the calls would be up to the compiler).
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() { return hash_u64(state_ += 0x9e3779b97f4a7c15ull); }
  // Uniform in [0, n); the modulo bias is below 2^-50 for the small n used here.
  int below(std::size_t n) { return static_cast<int>(next() % n); }
  bool chance(int percent) { return below(100) < percent; }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[static_cast<std::size_t>(below(v.size()))];
  }

 private:
  std::uint64_t state_;
};

const std::vector<const char*>& places() {
  static const std::vector<const char*> v = {"mat", "table", "hill", "river", "garden", "tree", "bridge", "house"};
  return v;
}
const std::vector<const char*>& prepositions() {
  static const std::vector<const char*> v = {"on", "under", "near", "behind", "beside"};
  return v;
}

// A noun phrase and whether it is plural: "the small cat", "a dog", "three red balls".
struct NounPhrase {
  std::string text;
  bool plural = false;
};

NounPhrase noun_phrase(Rng& rng, const std::vector<Word>& nouns) {
  NounPhrase np;
  const int det = rng.below(4);  // a / the (singular) / the (plural) / a number
  std::string determiner;
  switch (det) {
    case 0:
      determiner = "a";
      break;
    case 1:
      determiner = "the";
      break;
    case 2:
      determiner = "the";
      np.plural = true;
      break;
    default: {
      const int n = 1 + rng.below(number_words().size() - 1);  // two ... nine
      determiner = number_words()[static_cast<std::size_t>(n)];
      np.plural = true;
    }
  }
  std::string adjective;
  if (rng.chance(50)) adjective = rng.pick(adjectives());
  if (determiner == "a" && !adjective.empty() && std::string("aeiou").find(adjective[0]) != std::string::npos)
    determiner = "an";
  const Word& noun = rng.pick(nouns);
  np.text = determiner + " " + (adjective.empty() ? "" : adjective + " ") + (np.plural ? noun.plural : noun.singular);
  return np;
}

std::string verb(const Word& w, bool plural) {
  return plural ? w.plural : w.singular;
}

std::string transitive(Rng& rng) {
  const NounPhrase subject = noun_phrase(rng, animate_nouns());
  const NounPhrase object = noun_phrase(rng, rng.chance(60) ? thing_nouns() : animate_nouns());
  return subject.text + " " + verb(rng.pick(transitive_verbs()), subject.plural) + " " + object.text + ".";
}

std::string intransitive(Rng& rng) {
  const NounPhrase subject = noun_phrase(rng, animate_nouns());
  // One draw per statement: C++ leaves the order of calls within one expression unspecified, so
  // two compilers would otherwise draw in different orders and build different corpora. This is
  // the order GCC chose when the draws shared one expression, so the corpus stays what GCC builds
  // have always trained on.
  const char* place = rng.pick(places());
  const char* preposition = rng.pick(prepositions());
  const Word& v = rng.pick(intransitive_verbs());
  return subject.text + " " + verb(v, subject.plural) + " " + preposition + " the " + place + ".";
}

std::string counting(Rng& rng) {
  const int start = 1 + rng.below(40);
  const int length = 3 + rng.below(5);
  std::string s = "count from " + std::to_string(start) + ":";
  for (int i = 0; i < length; ++i) {
    s += ' ';
    s += std::to_string(start + i);
  }
  return s + ".";
}

std::string arithmetic(Rng& rng) {
  const int a = rng.below(10), b = rng.below(10);
  return std::to_string(a) + " plus " + std::to_string(b) + " is " + std::to_string(a + b) + ".";
}

std::string capitalized(std::string s) {
  if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  return s;
}

// "The red fox is behind the house. [distractor.] Where is the red fox? Behind the house."
std::string recall(Rng& rng) {
  const Word& noun = rng.pick(animate_nouns());
  std::string subject = "the ", place = rng.pick(prepositions());
  subject += rng.pick(adjectives());
  subject += ' ';
  subject += noun.singular;
  place += " the ";
  place += rng.pick(places());
  std::string s = capitalized(subject) + " is " + place + ".";
  if (rng.chance(50)) {
    s += ' ';
    s += capitalized(intransitive(rng));
  }
  return s + " Where is " + subject + "? " + capitalized(place) + ".";
}

}  // namespace

const std::vector<Word>& animate_nouns() {
  static const std::vector<Word> v = {{"cat", "cats"},         {"dog", "dogs"},       {"bird", "birds"},
                                      {"fox", "foxes"},        {"child", "children"}, {"farmer", "farmers"},
                                      {"teacher", "teachers"}, {"robot", "robots"},   {"horse", "horses"},
                                      {"mouse", "mice"},       {"wolf", "wolves"},    {"sailor", "sailors"}};
  return v;
}
const std::vector<Word>& thing_nouns() {
  static const std::vector<Word> v = {
      {"ball", "balls"}, {"book", "books"},   {"apple", "apples"},   {"box", "boxes"}, {"hat", "hats"},
      {"cup", "cups"},   {"stone", "stones"}, {"letter", "letters"}, {"key", "keys"},  {"flower", "flowers"}};
  return v;
}
const std::vector<Word>& transitive_verbs() {
  static const std::vector<Word> v = {{"sees", "see"},   {"likes", "like"},    {"chases", "chase"},
                                      {"finds", "find"}, {"carries", "carry"}, {"watches", "watch"},
                                      {"helps", "help"}, {"follows", "follow"}};
  return v;
}
const std::vector<Word>& intransitive_verbs() {
  static const std::vector<Word> v = {{"sleeps", "sleep"}, {"runs", "run"},   {"sings", "sing"},
                                      {"waits", "wait"},   {"plays", "play"}, {"rests", "rest"}};
  return v;
}
const std::vector<const char*>& adjectives() {
  static const std::vector<const char*> v = {"small", "big",   "red",   "blue",  "old",   "young",
                                             "happy", "quiet", "green", "brave", "tired", "clever"};
  return v;
}
const std::vector<const char*>& number_words() {
  static const std::vector<const char*> v = {"one", "two", "three", "four", "five", "six", "seven", "eight", "nine"};
  return v;
}

std::string document(std::uint64_t seed, std::uint64_t index, int max_sentences) {
  Rng rng(stream_key(seed, 0x53594e544845ull /* "SYNTHE" */, index));
  const int sentences = 1 + rng.below(static_cast<std::size_t>(max_sentences));
  std::string doc;
  for (int i = 0; i < sentences; ++i) {
    const int kind = rng.below(100);
    std::string s;
    if (kind < 30) {
      s = capitalized(transitive(rng));
    } else if (kind < 50) {
      s = capitalized(intransitive(rng));
    } else if (kind < 65) {
      s = capitalized(counting(rng));
    } else if (kind < 75) {
      s = arithmetic(rng);
    } else {
      s = recall(rng);
    }
    if (!doc.empty()) doc += ' ';
    doc += s;
  }
  return doc;
}

}  // namespace loom::synthetic
