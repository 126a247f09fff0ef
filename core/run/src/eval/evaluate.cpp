// Requests in tokens, tasks scored, and their metrics with the harness's standard errors: see
// loom/run/eval.hpp.
#include <chrono>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>

#include "loom/error.hpp"
#include "loom/run/eval.hpp"
#include "python_random.hpp"
#include "python_text.hpp"

namespace loom::eval {

namespace {

// The harness's count_words: len(re.split(r"\s+", text)), re's \s being Python's Unicode whitespace.
double count_words(const std::string& text) {
  return static_cast<double>(python::split_count(text));
}

double mean(std::span<const double> xs) {
  return xs.empty() ? 0.0 : std::accumulate(xs.begin(), xs.end(), 0.0) / static_cast<double>(xs.size());
}

// The harness's pooled_sample_stderr: a group's standard error from its tasks' (mmlu's subjects).
double pooled_stderr(const std::vector<double>& stderrs, const std::vector<double>& sizes) {
  double var = 0, total = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    var += (sizes[i] - 1) * stderrs[i] * stderrs[i] * sizes[i];
    total += sizes[i];
  }
  var /= total - static_cast<double>(sizes.size());
  return std::sqrt(var / total);
}

// The harness's bootstrap_stderr of its perplexity metric, draw for draw: 100000 resamples in
// chunks of 1000, chunk i drawn by random.Random(i).choices(xs, k=len(xs)); the sample standard
// deviation of their exp(-mean).
double bootstrap_perplexity_stderr(const std::vector<double>& xs) {
  const std::size_t iters = 100000, chunk = 1000;
  const auto n = static_cast<double>(xs.size());
  std::vector<double> res;
  res.reserve(iters);
  for (std::uint32_t i = 0; i < iters / chunk; ++i) {
    PythonRandom rnd(i);
    for (std::size_t c = 0; c < chunk; ++c) {
      double sum = 0;
      for (std::size_t k = 0; k < xs.size(); ++k) sum += xs[static_cast<std::size_t>(std::floor(rnd.random() * n))];
      res.push_back(std::exp(-(sum / n)));
    }
  }
  double mu = 0;
  for (const double r : res) mu += r;
  mu /= static_cast<double>(res.size());
  double ss = 0;
  for (const double r : res) ss += (r - mu) * (r - mu);
  return std::sqrt(ss / static_cast<double>(res.size() - 1));
}

}  // namespace

std::optional<double> mean_stderr(std::span<const double> values) {
  if (values.size() < 2) return std::nullopt;
  const double mu = mean(values);
  double ss = 0;
  for (const double v : values) ss += (v - mu) * (v - mu);
  const auto n = static_cast<double>(values.size());
  return std::sqrt(ss / (n - 1)) / std::sqrt(n);
}

TokenRequest encode_request(const Tokenizer& tokenizer, const TextRequest& request, std::int32_t prefix) {
  TokenRequest out;
  if (request.context.empty()) {
    out.context = {prefix};
    out.continuation = tokenizer.encode(request.continuation);
    return out;
  }
  // Trailing whitespace of the context belongs to the continuation (Python's rstrip(): Unicode's).
  std::string context = request.context, continuation = request.continuation;
  const std::size_t end = python::rstrip_size(context);
  if (end < context.size()) {
    continuation = context.substr(end) + continuation;
    context.resize(end);
  }
  const std::vector<std::int32_t> whole = tokenizer.encode(context + continuation);
  out.context = tokenizer.encode(context);
  const std::size_t split = std::min(out.context.size(), whole.size());
  out.continuation.assign(whole.begin() + static_cast<std::ptrdiff_t>(split), whole.end());
  // An empty context after rstrip: the harness scores it as it stands (no prefix); the model needs
  // one position of input, which the prefix token gives.
  if (out.context.empty()) out.context = {prefix};
  return out;
}

std::vector<TokenRequest> rolling_windows(std::span<const std::int32_t> tokens, std::int32_t prefix,
                                          std::int64_t max_len) {
  std::vector<TokenRequest> out;
  const auto n = static_cast<std::int64_t>(tokens.size());
  if (n == 0) return out;
  auto range = [&](std::int64_t b, std::int64_t e) {
    return std::vector<std::int32_t>(tokens.begin() + b, tokens.begin() + e);
  };
  const std::int64_t first = std::min(max_len, n);
  out.push_back({{prefix}, range(0, first)});
  for (std::int64_t predicted = first; predicted < n;) {
    const std::int64_t length = std::min(n - predicted, max_len);
    const std::int64_t end = predicted + length;
    out.push_back({range(end - max_len - 1, end - length), range(end - length, end)});
    predicted += length;
  }
  return out;
}

std::vector<Metric> task_metrics(const Task& task, std::span<const DocLog> docs) {
  std::vector<Metric> metrics;
  auto add_mean = [&](const std::string& name, const std::vector<double>& values) {
    metrics.push_back({name, mean(values), mean_stderr(values)});
  };
  switch (task.spec.family) {
    case TaskFamily::lambada: {
      std::vector<double> ll, acc;
      for (const DocLog& d : docs) {
        ll.push_back(d.results.at(0).logprob);
        acc.push_back(d.results.at(0).greedy ? 1.0 : 0.0);
      }
      // Perplexity's standard error is the harness's bootstrap, replayed with its random streams.
      metrics.push_back({"perplexity", std::exp(-mean(ll)),
                         ll.size() < 2 ? std::nullopt : std::optional<double>(bootstrap_perplexity_stderr(ll))});
      add_mean("acc", acc);
      break;
    }
    case TaskFamily::perplexity: {
      double ll = 0, words = 0, bytes = 0, tokens = 0;
      for (std::size_t i = 0; i < docs.size(); ++i) {
        ll += docs[i].results.empty() ? 0.0 : docs[i].results[0].logprob;
        words += count_words(task.docs[static_cast<std::size_t>(docs[i].index)].text);
        bytes += static_cast<double>(task.docs[static_cast<std::size_t>(docs[i].index)].text.size());
        tokens += static_cast<double>(docs[i].tokens);
      }
      // Weighted perplexities have no standard error in the harness.
      metrics.push_back({"word_perplexity", std::exp(-ll / words), std::nullopt});
      metrics.push_back({"byte_perplexity", std::exp(-ll / bytes), std::nullopt});
      metrics.push_back({"bits_per_byte", -ll / bytes / std::log(2.0), std::nullopt});
      metrics.push_back({"token_perplexity", std::exp(-ll / std::max(tokens, 1.0)), std::nullopt});
      break;
    }
    default: {
      std::vector<double> acc, acc_norm;
      std::map<std::string, std::vector<double>> by_group;
      for (const DocLog& d : docs) {
        acc.push_back(d.pred == d.gold ? 1.0 : 0.0);
        acc_norm.push_back(d.pred_norm == d.gold ? 1.0 : 0.0);
        by_group[task.docs[static_cast<std::size_t>(d.index)].group].push_back(acc.back());
      }
      add_mean("acc", acc);
      if (task.spec.family == TaskFamily::mmlu && by_group.size() > 1) {
        // The harness's mmlu is a group of one task per subject: its acc is the mean over every
        // question (weighted by size), its stderr pooled from the subjects'.
        std::vector<double> stderrs, sizes;
        bool all = true;
        for (const auto& [group, values] : by_group) {
          const auto se = mean_stderr(values);
          all = all && se.has_value();
          stderrs.push_back(se.value_or(0.0));
          sizes.push_back(static_cast<double>(values.size()));
        }
        metrics.back().stderr_value = all ? std::optional<double>(pooled_stderr(stderrs, sizes)) : std::nullopt;
      }
      // Winogrande and mmlu report acc alone, as the harness's tasks do.
      if (task.spec.family != TaskFamily::winogrande && task.spec.family != TaskFamily::mmlu)
        add_mean("acc_norm", acc_norm);
      break;
    }
  }
  return metrics;
}

namespace {

// lm-evaluation-harness 0.4.5's mmlu categories: each subject's task (tasks/mmlu/default/
// mmlu_<subject>.yaml) is tagged mmlu_<category>_tasks, and the group mmlu_<category> aggregates them.
const std::map<std::string, std::string>& mmlu_categories() {
  static const std::map<std::string, std::string> categories = {
      {"abstract_algebra", "stem"},
      {"anatomy", "stem"},
      {"astronomy", "stem"},
      {"business_ethics", "other"},
      {"clinical_knowledge", "other"},
      {"college_biology", "stem"},
      {"college_chemistry", "stem"},
      {"college_computer_science", "stem"},
      {"college_mathematics", "stem"},
      {"college_medicine", "other"},
      {"college_physics", "stem"},
      {"computer_security", "stem"},
      {"conceptual_physics", "stem"},
      {"econometrics", "social_sciences"},
      {"electrical_engineering", "stem"},
      {"elementary_mathematics", "stem"},
      {"formal_logic", "humanities"},
      {"global_facts", "other"},
      {"high_school_biology", "stem"},
      {"high_school_chemistry", "stem"},
      {"high_school_computer_science", "stem"},
      {"high_school_european_history", "humanities"},
      {"high_school_geography", "social_sciences"},
      {"high_school_government_and_politics", "social_sciences"},
      {"high_school_macroeconomics", "social_sciences"},
      {"high_school_mathematics", "stem"},
      {"high_school_microeconomics", "social_sciences"},
      {"high_school_physics", "stem"},
      {"high_school_psychology", "social_sciences"},
      {"high_school_statistics", "stem"},
      {"high_school_us_history", "humanities"},
      {"high_school_world_history", "humanities"},
      {"human_aging", "other"},
      {"human_sexuality", "social_sciences"},
      {"international_law", "humanities"},
      {"jurisprudence", "humanities"},
      {"logical_fallacies", "humanities"},
      {"machine_learning", "stem"},
      {"management", "other"},
      {"marketing", "other"},
      {"medical_genetics", "other"},
      {"miscellaneous", "other"},
      {"moral_disputes", "humanities"},
      {"moral_scenarios", "humanities"},
      {"nutrition", "other"},
      {"philosophy", "humanities"},
      {"prehistory", "humanities"},
      {"professional_accounting", "other"},
      {"professional_law", "humanities"},
      {"professional_medicine", "other"},
      {"professional_psychology", "social_sciences"},
      {"public_relations", "social_sciences"},
      {"security_studies", "social_sciences"},
      {"sociology", "social_sciences"},
      {"us_foreign_policy", "social_sciences"},
      {"virology", "other"},
      {"world_religions", "humanities"},
  };
  return categories;
}

// A group of subjects as the harness aggregates it (aggregate_subtask_metrics weighted by size,
// pooled_sample_stderr): acc is the mean over every question of its subjects, its standard error
// pooled from theirs, none when a subject has fewer than two questions (the harness's "N/A").
TaskResult mmlu_group(const std::string& name, const std::vector<const std::vector<double>*>& subjects) {
  TaskResult out;
  out.name = name;
  out.family = TaskFamily::mmlu;
  std::vector<double> all, stderrs, sizes;
  bool every = true;
  for (const auto* values : subjects) {
    all.insert(all.end(), values->begin(), values->end());
    const auto se = mean_stderr(*values);
    every = every && se.has_value();
    stderrs.push_back(se.value_or(0.0));
    sizes.push_back(static_cast<double>(values->size()));
  }
  out.docs = static_cast<std::int64_t>(all.size());
  out.metrics.push_back(
      {"acc", mean(all),
       every && all.size() > sizes.size() ? std::optional<double>(pooled_stderr(stderrs, sizes)) : std::nullopt});
  return out;
}

}  // namespace

std::vector<TaskResult> mmlu_subtasks(const Task& task, std::span<const DocLog> docs) {
  std::map<std::string, std::vector<double>> by_subject;
  for (const DocLog& d : docs)
    by_subject[task.docs[static_cast<std::size_t>(d.index)].group].push_back(d.pred == d.gold ? 1.0 : 0.0);
  std::map<std::string, std::vector<std::string>> by_category;
  std::vector<std::string> uncategorised;
  for (const auto& [subject, values] : by_subject) {
    const auto c = mmlu_categories().find(subject);
    if (c != mmlu_categories().end())
      by_category[c->second].push_back(subject);
    else
      uncategorised.push_back(subject);
  }
  // The harness's order: each category (alphabetical), then its subjects (alphabetical).
  std::vector<TaskResult> out;
  auto subject_result = [&](const std::string& subject) {
    TaskResult r = mmlu_group(task.spec.name + "_" + subject, {&by_subject[subject]});
    r.group = task.spec.name + "_" + mmlu_categories().at(subject);
    return r;
  };
  for (const auto& [category, subjects] : by_category) {
    std::vector<const std::vector<double>*> members;
    for (const auto& subject : subjects) members.push_back(&by_subject[subject]);
    out.push_back(mmlu_group(task.spec.name + "_" + category, members));
    out.back().group = task.spec.name;
    for (const auto& subject : subjects) out.push_back(subject_result(subject));
  }
  // A subject the harness does not know (a user's own) belongs to no category.
  for (const auto& subject : uncategorised) {
    out.push_back(mmlu_group(task.spec.name + "_" + subject, {&by_subject[subject]}));
    out.back().group = task.spec.name;
  }
  return out;
}

EncodedTask encode_task(const Task& task, const Tokenizer& tokenizer, std::int32_t prefix, std::int64_t max_len) {
  EncodedTask out;
  for (const TaskDoc& doc : task.docs) {
    if (task.spec.family == TaskFamily::perplexity) {
      const std::vector<std::int32_t> tokens = tokenizer.encode(doc.text);
      out.tokens.push_back(static_cast<std::int64_t>(tokens.size()));
      std::vector<TokenRequest> windows = rolling_windows(tokens, prefix, max_len);
      out.sizes.push_back(windows.size());
      for (auto& w : windows) out.requests.push_back(std::move(w));
      continue;
    }
    out.tokens.push_back(0);
    out.sizes.push_back(doc.requests.size());
    for (std::size_t c = 0; c < doc.requests.size(); ++c) {
      const TextRequest& r = doc.requests[c];
      TokenRequest encoded = encode_request(tokenizer, r, prefix);
      const std::string which =
          doc.requests.size() > 1 ? "choice " + std::to_string(c) + "'s continuation " : "the continuation ";
      const std::string shown = nlohmann::json(r.continuation).dump();
      // What the harness's HFLM asserts of each request (len(continuation_enc) <= max_length).
      if (static_cast<std::int64_t>(encoded.continuation.size()) > max_len)
        throw UserError(doc.where + ": " + which + "is " + std::to_string(encoded.continuation.size()) +
                        " tokens, longer than the model's context of " + std::to_string(max_len) +
                        " tokens: the model cannot score it (neither can the harness, which asserts "
                        "len(continuation_enc) <= max_length); shorten the document or drop it from the task file");
      // A continuation that encodes to nothing on its own has nothing to score (the harness asserts
      // len(continuation_enc) > 0); one whose tokens merged into the context's last token scores
      // 0 and greedy, as the harness's one-token cache gives it (docs/evaluation.md).
      if (encoded.continuation.empty() && (r.continuation.empty() || tokenizer.encode(r.continuation).empty()))
        throw UserError(doc.where + ": " + which + shown +
                        (r.continuation.empty() ? " is empty" : " encodes to no token") +
                        ": nothing to score (the harness stops on it too: it asserts len(continuation_enc) > 0); "
                        "give every choice some text");
      out.requests.push_back(std::move(encoded));
    }
  }
  return out;
}

std::vector<TaskResult> evaluate_tasks(Model& model, Backend& backend, const Tokenizer& tokenizer, std::int32_t prefix,
                                       const std::vector<Task>& tasks, const EvalOptions& options, ScorerStats* stats) {
  // Every task's requests first: a document the model cannot score stops the run before any scoring.
  std::vector<EncodedTask> encoded;
  std::vector<double> encode_seconds;
  for (const Task& task : tasks) {
    const auto start = std::chrono::steady_clock::now();
    encoded.push_back(encode_task(task, tokenizer, prefix, model.max_seq_len()));
    encode_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  Scorer scorer(model, backend, options.scorer);
  std::vector<TaskResult> results;
  for (std::size_t t = 0; t < tasks.size(); ++t) {
    const Task& task = tasks[t];
    const auto start = std::chrono::steady_clock::now();
    TaskResult result;
    result.name = task.spec.name;
    result.family = task.spec.family;
    result.docs = static_cast<std::int64_t>(task.docs.size());
    std::vector<DocLog> logs(task.docs.size());
    const std::vector<TokenRequest>& requests = encoded[t].requests;
    const std::vector<std::size_t>& sizes = encoded[t].sizes;
    for (std::size_t d = 0; d < task.docs.size(); ++d) {
      logs[d].index = static_cast<std::int64_t>(d);
      logs[d].gold = task.docs[d].gold;
      logs[d].tokens = encoded[t].tokens[d];
    }
    const std::vector<Scored> scored =
        task.spec.family == TaskFamily::perplexity ? scorer.score(requests) : scorer.score_grouped(requests, sizes);
    std::size_t at = 0;
    for (std::size_t d = 0; d < task.docs.size(); ++d) {
      DocLog& log = logs[d];
      if (task.spec.family == TaskFamily::perplexity) {
        Scored total{0.0, true};
        for (std::size_t i = 0; i < sizes[d]; ++i) {
          total.logprob += scored[at + i].logprob;
          total.greedy = total.greedy && scored[at + i].greedy;
        }
        log.results = {total};
      } else {
        log.results.assign(scored.begin() + static_cast<std::ptrdiff_t>(at),
                           scored.begin() + static_cast<std::ptrdiff_t>(at + sizes[d]));
        // np.argmax: the first of equal maxima.
        const std::vector<double>& lengths = task.docs[d].choice_lengths;
        for (std::size_t c = 0; c < log.results.size(); ++c) {
          if (log.pred < 0 || log.results[c].logprob > log.results[static_cast<std::size_t>(log.pred)].logprob)
            log.pred = static_cast<std::int64_t>(c);
          if (c < lengths.size()) {
            const double norm = log.results[c].logprob / lengths[c];
            if (log.pred_norm < 0 || norm > log.results[static_cast<std::size_t>(log.pred_norm)].logprob /
                                                lengths[static_cast<std::size_t>(log.pred_norm)])
              log.pred_norm = static_cast<std::int64_t>(c);
          }
        }
      }
      at += sizes[d];
    }
    result.metrics = task_metrics(task, logs);
    if (task.spec.family == TaskFamily::mmlu) result.subtasks = mmlu_subtasks(task, logs);
    if (options.log_samples) result.samples = std::move(logs);
    result.seconds =
        encode_seconds[t] + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    results.push_back(std::move(result));
  }
  if (stats) *stats = scorer.stats();
  return results;
}

}  // namespace loom::eval
