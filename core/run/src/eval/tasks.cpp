// Task files and their requests, as lm-evaluation-harness (v0.4) builds them: see
// loom/run/eval.hpp and docs/evaluation.md.
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "loom/error.hpp"
#include "loom/run/eval.hpp"
#include "loom/utf8.hpp"
#include "python_random.hpp"
#include "python_text.hpp"

namespace fs = std::filesystem;

namespace loom::eval {

namespace {

const std::vector<std::pair<std::string, TaskFamily>>& families() {
  static const std::vector<std::pair<std::string, TaskFamily>> all{{"hellaswag", TaskFamily::hellaswag},
                                                                   {"arc_easy", TaskFamily::arc_easy},
                                                                   {"arc_challenge", TaskFamily::arc_challenge},
                                                                   {"piqa", TaskFamily::piqa},
                                                                   {"winogrande", TaskFamily::winogrande},
                                                                   {"mmlu", TaskFamily::mmlu},
                                                                   {"lambada", TaskFamily::lambada},
                                                                   {"perplexity", TaskFamily::perplexity},
                                                                   {"multiple_choice", TaskFamily::multiple_choice}};
  return all;
}

std::string family_list() {
  std::string out;
  for (const auto& [name, family] : families()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

using python::strip;

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  std::string out;
  std::size_t pos = 0;
  for (std::size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size())
    out += s.substr(pos, hit - pos) + to;
  return out + s.substr(pos);
}

// The harness's hellaswag preprocess(): strip, " [title]" -> ". ", drop "[...]" (within a line),
// "  " -> " ".
std::string hellaswag_preprocess(const std::string& text) {
  std::string s = replace_all(strip(text), " [title]", ". ");
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '[') {
      const std::size_t close = s.find_first_of("]\n", i + 1);
      if (close != std::string::npos && s[close] == ']') {
        i = close;
        continue;
      }
    }
    out += s[i];
  }
  return replace_all(out, "  ", " ");
}

struct Line {
  const nlohmann::json& doc;
  std::string where;  // file:line

  [[noreturn]] void fail(const std::string& what, const std::string& format) const {
    throw UserError(where + ": " + what + " (" + format + ")");
  }
  const nlohmann::json& field(const char* name, const std::string& format) const {
    if (!doc.contains(name)) fail(std::string("no \"") + name + "\" field", format);
    return doc[name];
  }
  std::string string(const char* name, const std::string& format) const {
    const nlohmann::json& v = field(name, format);
    if (!v.is_string()) fail(std::string("\"") + name + "\" is not a string", format);
    return v.get<std::string>();
  }
  std::vector<std::string> strings(const nlohmann::json& v, const char* name, const std::string& format) const {
    if (!v.is_array() || v.empty()) fail(std::string("\"") + name + "\" is not a non-empty list of strings", format);
    std::vector<std::string> out;
    for (const auto& x : v) {
      if (!x.is_string()) fail(std::string("\"") + name + "\" is not a non-empty list of strings", format);
      out.push_back(x.get<std::string>());
    }
    return out;
  }
  // An integer in [first, last], or a string of its digits (the harness's datasets store labels
  // either way): anything else, or a value out of the range, is an error naming the field and
  // the range (`what` says what the value indexes).
  std::int64_t integer(const char* name, const std::string& format, std::int64_t first, std::int64_t last,
                       const std::string& what) const {
    const nlohmann::json& v = field(name, format);
    std::string shown;
    std::optional<std::int64_t> value;
    if (v.is_number_unsigned()) {
      const auto u = v.get<std::uint64_t>();
      shown = std::to_string(u);
      if (u <= static_cast<std::uint64_t>(last)) value = static_cast<std::int64_t>(u);
    } else if (v.is_number_integer()) {
      value = v.get<std::int64_t>();
      shown = std::to_string(*value);
    } else if (v.is_string()) {
      const std::string s = v.get<std::string>();
      if (s.empty() || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
        fail("\"" + std::string(name) + "\" is the string " + nlohmann::json(s).dump() + ", not an integer (" +
                 std::to_string(first) + " to " + std::to_string(last) + ": " + what + ")",
             format);
      shown = nlohmann::json(s).dump();
      if (s.size() <= 18) value = std::stoll(s);
    } else {
      fail("\"" + std::string(name) + "\" is " + (v.is_number() ? v.dump() : std::string(v.type_name())) +
               ", not an integer (" + std::to_string(first) + " to " + std::to_string(last) + ": " + what + ")",
           format);
    }
    if (!value || *value < first || *value > last)
      fail("\"" + std::string(name) + "\" is " + shown + ", out of range: it must be " + std::to_string(first) +
               " to " + std::to_string(last) + " (" + what + ")",
           format);
    return *value;
  }
  // The index of the right one of `count` choices.
  std::int64_t answer(const char* name, const std::string& format, std::size_t count) const {
    return integer(name, format, 0, static_cast<std::int64_t>(count) - 1,
                   "the right one of the " + std::to_string(count) + " choices, counted from 0");
  }
};

void add_choices(TaskDoc& doc, const std::string& context, const std::vector<std::string>& choices,
                 const std::string& delimiter = " ") {
  for (const auto& c : choices) {
    doc.requests.push_back({context, delimiter + c});
    doc.choice_lengths.push_back(static_cast<double>(python::length(c)));
  }
}

const char* format_of(TaskFamily family) {
  switch (family) {
    case TaskFamily::hellaswag:
      return "hellaswag: {\"activity_label\", \"ctx_a\", \"ctx_b\", \"endings\": [4 strings], \"label\"}";
    case TaskFamily::arc_easy:
    case TaskFamily::arc_challenge:
      return "arc: {\"question\", \"choices\": {\"text\": [...], \"label\": [\"A\", ...]}, \"answerKey\"}";
    case TaskFamily::piqa:
      return "piqa: {\"goal\", \"sol1\", \"sol2\", \"label\": 0 or 1}";
    case TaskFamily::winogrande:
      return "winogrande: {\"sentence\" with one \"_\", \"option1\", \"option2\", \"answer\": \"1\" or \"2\"}";
    case TaskFamily::mmlu:
      return "mmlu: {\"question\", \"subject\", \"choices\": [4 strings], \"answer\": 0-3 or \"A\"-\"D\"}";
    case TaskFamily::lambada:
      return "lambada: {\"text\"}, the last word (after the last space) is the target";
    case TaskFamily::perplexity:
      return "perplexity: a .txt file (one document), or JSON lines with \"text\" (or \"page\"), one document each";
    case TaskFamily::multiple_choice:
      return "multiple choice: {\"context\", \"choices\": [strings], \"label\": index of the right one}";
  }
  return "";
}

TaskDoc make_doc(TaskFamily family, const Line& line) {
  const std::string format = format_of(family);
  TaskDoc doc;
  switch (family) {
    case TaskFamily::hellaswag: {
      const std::string ctx = line.string("ctx_a", format) + " " + python::capitalize(line.string("ctx_b", format));
      const std::string query = hellaswag_preprocess(line.string("activity_label", format) + ": " + ctx);
      std::vector<std::string> endings = line.strings(line.field("endings", format), "endings", format);
      for (auto& e : endings) e = hellaswag_preprocess(e);
      add_choices(doc, query, endings);
      doc.gold = line.answer("label", format, endings.size());
      break;
    }
    case TaskFamily::arc_easy:
    case TaskFamily::arc_challenge: {
      const nlohmann::json& choices = line.field("choices", format);
      if (!choices.is_object() || !choices.contains("text") || !choices.contains("label"))
        line.fail("\"choices\" is not {\"text\": [...], \"label\": [...]}", format);
      const auto text = line.strings(choices["text"], "choices.text", format);
      const auto labels = line.strings(choices["label"], "choices.label", format);
      if (labels.size() != text.size()) line.fail("\"choices.text\" and \"choices.label\" differ in length", format);
      add_choices(doc, "Question: " + line.string("question", format) + "\nAnswer:", text);
      const std::string key = line.string("answerKey", format);
      const auto it = std::find(labels.begin(), labels.end(), key);
      if (it == labels.end()) line.fail("the answerKey \"" + key + "\" is not among choices.label", format);
      doc.gold = it - labels.begin();
      break;
    }
    case TaskFamily::piqa:
      add_choices(doc, "Question: " + line.string("goal", format) + "\nAnswer:",
                  {line.string("sol1", format), line.string("sol2", format)});
      doc.gold = line.answer("label", format, 2);
      break;
    case TaskFamily::winogrande: {
      // Partial scoring (Trinh & Le): each option completes the sentence up to the blank, and the
      // rest of the sentence is the continuation scored.
      const std::string sentence = line.string("sentence", format);
      const std::size_t blank = sentence.find('_');
      if (blank == std::string::npos) line.fail("the sentence has no \"_\"", format);
      const std::string target = " " + strip(sentence.substr(blank + 1));
      for (const char* option : {"option1", "option2"}) {
        const std::string context = sentence.substr(0, blank) + line.string(option, format);
        doc.requests.push_back({context, target});
        doc.choice_lengths.push_back(static_cast<double>(python::length(context)));
      }
      // The harness's answer_to_num: "1" or "2" (an integer 1 or 2 is taken too).
      const nlohmann::json& answer = line.field("answer", format);
      if (answer.is_string()) {
        if (answer != "1" && answer != "2")
          line.fail("\"answer\" is " + answer.dump() + ": it must be \"1\" (option1) or \"2\" (option2)", format);
        doc.gold = answer == "1" ? 0 : 1;
      } else {
        doc.gold = line.integer("answer", format, 1, 2, "1: option1, 2: option2") - 1;
      }
      break;
    }
    case TaskFamily::mmlu: {
      const auto choices = line.strings(line.field("choices", format), "choices", format);
      if (choices.size() != 4) line.fail("\"choices\" does not hold 4 strings", format);
      std::string subject =
          line.doc.contains("subject") && line.doc["subject"].is_string() ? line.doc["subject"].get<std::string>() : "";
      doc.group = subject;
      std::replace(subject.begin(), subject.end(), '_', ' ');
      const std::string description =
          subject.empty() ? ""
                          : "The following are multiple choice questions (with answers) about " + subject + ".\n\n";
      doc.description = description;
      const std::string context = strip(line.string("question", format)) + "\nA. " + choices[0] + "\nB. " + choices[1] +
                                  "\nC. " + choices[2] + "\nD. " + choices[3] + "\nAnswer:";
      add_choices(doc, context, {"A", "B", "C", "D"});
      const nlohmann::json& answer = line.field("answer", format);
      if (answer.is_string() && answer.get<std::string>().size() == 1 && answer.get<std::string>()[0] >= 'A' &&
          answer.get<std::string>()[0] <= 'D')
        doc.gold = answer.get<std::string>()[0] - 'A';
      else
        doc.gold = line.answer("answer", format, 4);
      break;
    }
    case TaskFamily::lambada: {
      const std::string text = line.string("text", format);
      const std::size_t space = text.rfind(' ');
      const std::string context = space == std::string::npos ? "" : text.substr(0, space);
      const std::string word = space == std::string::npos ? text : text.substr(space + 1);
      doc.requests.push_back({context, " " + word});
      doc.gold = 0;
      return doc;
    }
    case TaskFamily::perplexity:
      if (line.doc.contains("text") && line.doc["text"].is_string())
        doc.text = line.doc["text"].get<std::string>();
      else
        doc.text = line.string("page", format);
      return doc;
    case TaskFamily::multiple_choice: {
      std::string delimiter = " ";
      if (line.doc.contains("target_delimiter")) delimiter = line.string("target_delimiter", format);
      const auto choices = line.strings(line.field("choices", format), "choices", format);
      add_choices(doc, line.string("context", format), choices, delimiter);
      doc.gold = line.answer("label", format, choices.size());
      break;
    }
  }
  return doc;
}

}  // namespace

std::string family_name(TaskFamily family) {
  for (const auto& [name, f] : families())
    if (f == family) return name;
  return "?";
}

std::optional<TaskFamily> family_of(const std::string& name) {
  for (const auto& [n, f] : families())
    if (n == name) return f;
  return std::nullopt;
}

std::vector<TaskSpec> parse_task_specs(const std::vector<std::string>& entries, const fs::path& task_dir) {
  std::vector<std::string> items;
  for (const auto& entry : entries) {
    std::stringstream ss(entry);
    for (std::string item; std::getline(ss, item, ',');) {
      item = strip(item);
      if (!item.empty()) items.push_back(item);
    }
  }
  if (items.empty())
    throw UserError("no tasks given: name them (" + family_list() + ") or give task files (docs/evaluation.md)");
  std::vector<TaskSpec> specs;
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& item : items) {
    TaskSpec spec;
    const std::size_t colon = item.find(':');
    if (colon != std::string::npos && family_of(item.substr(0, colon))) {
      spec.family = *family_of(item.substr(0, colon));
      spec.file = item.substr(colon + 1);
      spec.name = spec.family == TaskFamily::multiple_choice || spec.family == TaskFamily::perplexity
                      ? spec.file.stem().string()
                      : family_name(spec.family);
    } else if (const auto family = family_of(item); family && item.find('/') == std::string::npos) {
      spec.family = *family;
      spec.name = item;
      spec.file = task_dir / (item + (spec.family == TaskFamily::perplexity ? ".txt" : ".jsonl"));
    } else {
      spec.file = item;
      const std::string stem = spec.file.stem().string();
      std::optional<TaskFamily> by_name;
      std::size_t longest = 0;
      for (const auto& [name, f] : families()) {
        if (f == TaskFamily::multiple_choice || f == TaskFamily::perplexity) continue;
        if (stem.rfind(name, 0) == 0 && name.size() > longest) {
          by_name = f;
          longest = name.size();
        }
      }
      if (by_name) {
        spec.family = *by_name;
        spec.name = family_name(*by_name);
      } else {
        spec.family = spec.file.extension() == ".txt" ? TaskFamily::perplexity : TaskFamily::multiple_choice;
        spec.name = stem;
      }
    }
    if (fs::is_directory(spec.file, ec))
      throw UserError("--tasks: '" + spec.file.string() + "' (" + spec.name +
                      ") is a directory; a task is one file (JSON lines, or a .txt text for perplexity)");
    if (!fs::is_regular_file(spec.file, ec)) {
      if (item.find('/') == std::string::npos && item.find('.') == std::string::npos && !family_of(item))
        throw UserError("--tasks: '" + item + "' is neither a task (" + family_list() + ") nor a file");
      throw UserError("--tasks: the task file '" + spec.file.string() + "' of " + spec.name +
                      " does not exist (a task's name reads <task dir>/<name>.jsonl; give FAMILY:PATH for a file "
                      "elsewhere)");
    }
    if (!names.insert(spec.name).second)
      throw UserError("--tasks: two tasks are named '" + spec.name +
                      "'; rename one of the files (a generic or perplexity task is named by its file)");
    specs.push_back(std::move(spec));
  }
  return specs;
}

namespace {

// What the harness's sampler draws for a task with num_fewshot K: mmlu's first_n sampler (the first
// K documents), the others' random one (random.Random(1234).sample, one draw per document in order).
// Tasks whose harness YAML has no test split (hellaswag, piqa, winogrande) draw K + 1, because its
// `fewshot_split == test_split` holds (both null) and it then expects to drop the document itself.
std::size_t fewshot_draws(TaskFamily family, std::size_t k) {
  switch (family) {
    case TaskFamily::hellaswag:
    case TaskFamily::piqa:
    case TaskFamily::winogrande:
      return k + 1;
    default:
      return k;
  }
}

// ContextSampler.get_context and ConfigurableTask.fewshot_context: the description, then each
// example (its text, the target delimiter, its answer and the few-shot delimiter "\n\n"; its text
// alone where its target is empty), before every request's context.
void add_fewshot(Task& task, const std::vector<TaskDoc>& pool, std::size_t docs, const FewShotOptions& fewshot) {
  const auto k = static_cast<std::size_t>(std::max<std::int64_t>(fewshot.num_fewshot, 0));
  const std::size_t draws = fewshot_draws(task.spec.family, k);
  if (k > 0 && draws > pool.size())
    throw UserError("--num-fewshot " + std::to_string(k) + ": " + task.spec.name + " draws " + std::to_string(draws) +
                    " examples from its file's documents and '" + task.spec.file.string() + "' holds " +
                    std::to_string(pool.size()));
  PythonRandom rnd(fewshot.seed);
  for (std::size_t d = 0; d < docs; ++d) {
    TaskDoc& doc = task.docs[d];
    std::string prefix = doc.description;
    if (k > 0) {
      std::vector<std::size_t> drawn;
      if (task.spec.family == TaskFamily::mmlu) {
        for (std::size_t i = 0; i < draws; ++i) drawn.push_back(i);
      } else {
        drawn = rnd.sample(pool.size(), draws);
      }
      std::size_t used = 0;
      for (const std::size_t i : drawn) {
        // `[x for x in fewshotex if x != doc][:num_fewshot]`: never the document itself (nor a copy of it).
        if (used == k || pool[i].identity == doc.identity) continue;
        prefix += pool[i].example;
        ++used;
      }
    }
    if (prefix.empty()) continue;
    for (TextRequest& r : doc.requests) r.context = prefix + r.context;
  }
}

}  // namespace

Task load_task(const TaskSpec& spec, std::int64_t limit, const FewShotOptions& fewshot) {
  if (fewshot.num_fewshot > 0 && spec.family == TaskFamily::perplexity)
    throw UserError("--num-fewshot: " + spec.name +
                    " is a perplexity task, which loom scores without examples (score it in a run of its own "
                    "without --num-fewshot)");
  Task task;
  task.spec = spec;
  std::ifstream in(spec.file, std::ios::binary);
  if (!in) throw UserError("cannot read the task file '" + spec.file.string() + "'");
  if (spec.family == TaskFamily::perplexity && spec.file.extension() == ".txt") {
    std::ostringstream os;
    os << in.rdbuf();
    TaskDoc doc;
    doc.text = os.str();
    doc.where = spec.file.string();
    // The harness reads text as UTF-8 (and would stop on this file).
    if (const std::size_t valid = valid_utf8_end(doc.text, 0); valid < doc.text.size())
      throw UserError("the task file '" + spec.file.string() + "' is not UTF-8 text: byte " +
                      std::to_string(valid + 1) + " (line " +
                      std::to_string(1 + std::count(doc.text.begin(),
                                                    doc.text.begin() + static_cast<std::ptrdiff_t>(valid), '\n')) +
                      ") starts no UTF-8 character");
    if (doc.text.empty())
      throw UserError("the task file '" + spec.file.string() +
                      "' is empty: a perplexity task needs text to score (its byte and word perplexities divide by "
                      "its length)");
    task.docs.push_back(std::move(doc));
    return task;
  }
  // Few-shot examples come from every document of the file, not only the first `limit`.
  const bool all = fewshot.num_fewshot > 0;
  std::string text;
  for (std::size_t number = 1; std::getline(in, text); ++number) {
    if (!all && limit > 0 && static_cast<std::int64_t>(task.docs.size()) >= limit) break;
    if (strip(text).empty()) continue;
    const std::string where = spec.file.string() + ":" + std::to_string(number);
    if (const std::size_t valid = valid_utf8_end(text, 0); valid < text.size())
      throw UserError(where + ": not UTF-8 text: byte " + std::to_string(valid + 1) +
                      " of the line starts no UTF-8 character (each line of a " + spec.name +
                      " task file is a JSON object: " + format_of(spec.family) + ")");
    nlohmann::json doc = nlohmann::json::parse(text, nullptr, false);
    if (doc.is_discarded() || !doc.is_object())
      throw UserError(where + ": not a JSON object (each line of a " + spec.name +
                      " task file is one: " + format_of(spec.family) + ")");
    TaskDoc made = make_doc(spec.family, Line{doc, where});
    made.where = where;
    if (spec.family != TaskFamily::perplexity) {
      // As a few-shot example: the context and continuation of its answer (lambada's target " word"
      // follows the default target delimiter " " there, as in the harness's get_context), then the
      // few-shot delimiter. A winogrande sentence whose blank ends it has an empty target: the
      // harness's sampler then writes the example's text alone (`if doc_target != ""`).
      const TextRequest& answer = made.requests.at(static_cast<std::size_t>(made.gold));
      if (spec.family == TaskFamily::winogrande && answer.continuation == " ")
        made.example = answer.context;
      else
        made.example = answer.context + (spec.family == TaskFamily::lambada ? " " : "") + answer.continuation + "\n\n";
      made.identity = doc.dump();
    }
    task.docs.push_back(std::move(made));
  }
  if (task.docs.empty())
    throw UserError("the task file '" + spec.file.string() + "' holds no documents (" + format_of(spec.family) + ")");
  const std::size_t docs = limit > 0 ? std::min(task.docs.size(), static_cast<std::size_t>(limit)) : task.docs.size();
  const std::vector<TaskDoc> pool = all ? task.docs : std::vector<TaskDoc>{};
  add_fewshot(task, pool, docs, fewshot);
  task.docs.resize(docs);
  if (spec.family == TaskFamily::perplexity &&
      std::all_of(task.docs.begin(), task.docs.end(), [](const TaskDoc& d) { return d.text.empty(); }))
    throw UserError(
        "the task file '" + spec.file.string() + "' holds no text" +
        (limit > 0 ? " in its first " + std::to_string(docs) + " documents" : "") +
        ": every \"text\" is empty, and a perplexity task's byte and word perplexities divide by its length");
  return task;
}

}  // namespace loom::eval
