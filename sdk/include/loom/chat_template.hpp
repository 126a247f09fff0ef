// Chat and instruction data: the JSON-lines layouts of conversations, rendering them to text with a
// template, and tokenizing the rendering with a loss mask (which tokens are trained on). The
// `chat` dataset uses it to train; anything that prompts a model with a conversation (generation,
// a preference objective) renders its prompt with the same template, so that it sees what
// training saw.
//
// Records. One JSON object per line, in either layout:
//   {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}
//   {"prompt": "...", "completion": "..."}   (a user turn and an assistant turn)
//
// Templates. Each role has a template string holding `{content}` once: the text before it is the
// role's prefix, the text after it its suffix. ChatML (the default):
//   system:    "<|im_start|>system\n{content}<|im_end|>\n"
//   user:      "<|im_start|>user\n{content}<|im_end|>\n"
//   assistant: "<|im_start|>assistant\n{content}<|im_end|>\n"
// An assistant turn trains on its content and suffix (so the model learns to end its turn); its
// prefix and every other turn are context only. Markers such as <|im_start|> are encoded by the
// tokenizer like any text: a tokenizer that holds them as special tokens (a tokenizer.json's
// added tokens) gives one id each, any other spells them out in ordinary tokens
// (missing_special_tokens() says which).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/kinds/tokenizer.hpp"

namespace loom {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

class ChatTemplate {
 public:
  struct Role {
    std::string prefix, suffix;  // around the content
  };

  // The ChatML template above.
  static ChatTemplate chatml();
  // A template from one string per role, each holding `{content}` exactly once. A UserError
  // naming `where` (the option path) otherwise.
  static ChatTemplate from_strings(const std::string& system, const std::string& user, const std::string& assistant,
                                   const std::string& where);

  const Role& system() const { return system_; }
  const Role& user() const { return user_; }
  const Role& assistant() const { return assistant_; }
  // The role's parts; UserError for a role other than system, user and assistant.
  const Role& role(std::string_view name) const;

 private:
  Role system_, user_, assistant_;
};

// One stretch of a rendered conversation and whether its tokens are trained on.
struct ChatPiece {
  std::string text;
  bool trained = false;
};

// A conversation as pieces of text, in order: each message's prefix, content and suffix (empty
// pieces dropped). An assistant message's content and suffix are trained; everything else is not.
std::vector<ChatPiece> render_chat(const ChatTemplate& chat_template, std::span<const ChatMessage> messages);

// The text a model continues to answer: the messages rendered, then the assistant prefix.
std::string render_prompt(const ChatTemplate& chat_template, std::span<const ChatMessage> messages);

// Token ids and, for each, whether it is trained on (1) or context only (0).
struct ChatTokens {
  std::vector<std::int32_t> ids;
  std::vector<std::uint8_t> trained;
};

// Encodes each piece on its own (so that no token straddles a trained and an untrained stretch)
// and concatenates them.
ChatTokens tokenize_chat(const Tokenizer& tokenizer, std::span<const ChatPiece> pieces);

// The markers of the template that look like special tokens (`<|...|>`) and that `tokenizer`
// does not encode as one id, in order of first appearance, without duplicates.
std::vector<std::string> missing_special_tokens(const ChatTemplate& chat_template, const Tokenizer& tokenizer);

// The messages of one JSON line in either layout above. A UserError saying what is wrong (not
// JSON, not an object, neither layout, a message without a string role or content, a role other
// than system, user and assistant, no assistant turn): the caller adds the file and line.
std::vector<ChatMessage> parse_chat_record(std::string_view json_line);

}  // namespace loom
