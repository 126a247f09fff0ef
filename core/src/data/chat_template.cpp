#include "loom/chat_template.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "loom/error.hpp"

namespace loom {

namespace {

constexpr std::string_view kContent = "{content}";

ChatTemplate::Role split_role(const std::string& text, const std::string& where) {
  const auto at = text.find(kContent);
  if (at == std::string::npos || text.find(kContent, at + 1) != std::string::npos)
    throw UserError(where + ": a chat template string holds {content} exactly once (where the message goes), got \"" +
                    text + "\"");
  return {text.substr(0, at), text.substr(at + kContent.size())};
}

// The `<|...|>` markers of `text`, in order.
void find_markers(const std::string& text, std::vector<std::string>& out) {
  std::size_t pos = 0;
  while ((pos = text.find("<|", pos)) != std::string::npos) {
    const auto end = text.find("|>", pos + 2);
    if (end == std::string::npos) return;
    std::string marker = text.substr(pos, end + 2 - pos);
    if (std::find(out.begin(), out.end(), marker) == out.end()) out.push_back(std::move(marker));
    pos = end + 2;
  }
}

std::string message_error(std::size_t index, const std::string& what) {
  return "message " + std::to_string(index) + " of \"messages\" " + what;
}

}  // namespace

ChatTemplate ChatTemplate::chatml() {
  return from_strings("<|im_start|>system\n{content}<|im_end|>\n", "<|im_start|>user\n{content}<|im_end|>\n",
                      "<|im_start|>assistant\n{content}<|im_end|>\n", "chatml");
}

ChatTemplate ChatTemplate::from_strings(const std::string& system, const std::string& user,
                                        const std::string& assistant, const std::string& where) {
  ChatTemplate t;
  t.system_ = split_role(system, where + ".system");
  t.user_ = split_role(user, where + ".user");
  t.assistant_ = split_role(assistant, where + ".assistant");
  return t;
}

const ChatTemplate::Role& ChatTemplate::role(std::string_view name) const {
  if (name == "system") return system_;
  if (name == "user") return user_;
  if (name == "assistant") return assistant_;
  throw UserError("unknown chat role \"" + std::string(name) + "\" (expected system, user or assistant)");
}

std::vector<ChatPiece> render_chat(const ChatTemplate& chat_template, std::span<const ChatMessage> messages) {
  std::vector<ChatPiece> pieces;
  auto add = [&](const std::string& text, bool trained) {
    if (text.empty()) return;
    if (!pieces.empty() && pieces.back().trained == trained)
      pieces.back().text += text;
    else
      pieces.push_back({text, trained});
  };
  for (const auto& m : messages) {
    const ChatTemplate::Role& r = chat_template.role(m.role);
    const bool trained = m.role == "assistant";
    add(r.prefix, false);
    add(m.content, trained);
    add(r.suffix, trained);
  }
  return pieces;
}

std::string render_prompt(const ChatTemplate& chat_template, std::span<const ChatMessage> messages) {
  std::string out;
  for (const auto& p : render_chat(chat_template, messages)) out += p.text;
  return out + chat_template.assistant().prefix;
}

ChatTokens tokenize_chat(const Tokenizer& tokenizer, std::span<const ChatPiece> pieces) {
  ChatTokens out;
  for (const auto& p : pieces) {
    const auto ids = tokenizer.encode(p.text);
    out.ids.insert(out.ids.end(), ids.begin(), ids.end());
    out.trained.insert(out.trained.end(), ids.size(), p.trained ? 1 : 0);
  }
  return out;
}

std::vector<std::string> missing_special_tokens(const ChatTemplate& chat_template, const Tokenizer& tokenizer) {
  std::vector<std::string> markers;
  for (const auto* r : {&chat_template.system(), &chat_template.user(), &chat_template.assistant()}) {
    find_markers(r->prefix, markers);
    find_markers(r->suffix, markers);
  }
  std::vector<std::string> missing;
  for (const auto& m : markers)
    if (tokenizer.encode(m).size() != 1) missing.push_back(m);
  return missing;
}

std::vector<ChatMessage> parse_chat_record(std::string_view json_line) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_line);
  } catch (const nlohmann::json::parse_error& e) {
    throw UserError("not valid JSON: " + json_parse_error(e.what(), e.byte, json_line));
  }
  if (!j.is_object()) throw UserError(std::string("expected a JSON object, found a ") + j.type_name());
  std::vector<ChatMessage> messages;
  if (const auto it = j.find("messages"); it != j.end()) {
    if (!it->is_array()) throw UserError(std::string("\"messages\" is a ") + it->type_name() + ", expected a list");
    for (std::size_t i = 0; i < it->size(); ++i) {
      const auto& m = (*it)[i];
      if (!m.is_object())
        throw UserError(message_error(i, std::string("is a ") + m.type_name() + ", expected an object"));
      const auto role = m.find("role"), content = m.find("content");
      if (role == m.end() || !role->is_string()) throw UserError(message_error(i, "has no string \"role\""));
      if (content == m.end() || !content->is_string()) throw UserError(message_error(i, "has no string \"content\""));
      const std::string r = role->get<std::string>();
      if (r != "system" && r != "user" && r != "assistant")
        throw UserError(message_error(i, "has role \"" + r + "\" (expected system, user or assistant)"));
      messages.push_back({r, content->get<std::string>()});
    }
  } else if (j.contains("prompt") || j.contains("completion")) {
    const auto prompt = j.find("prompt"), completion = j.find("completion");
    if (prompt == j.end() || !prompt->is_string()) throw UserError("has a \"completion\" but no string \"prompt\"");
    if (completion == j.end() || !completion->is_string())
      throw UserError("has a \"prompt\" but no string \"completion\"");
    messages.push_back({"user", prompt->get<std::string>()});
    messages.push_back({"assistant", completion->get<std::string>()});
  } else {
    throw UserError("has neither \"messages\" (a list of {\"role\", \"content\"}) nor \"prompt\" and \"completion\"");
  }
  const bool answered = std::any_of(messages.begin(), messages.end(),
                                    [](const ChatMessage& m) { return m.role == "assistant" && !m.content.empty(); });
  if (!answered) throw UserError("has no assistant turn with content: nothing to train on");
  return messages;
}

}  // namespace loom
