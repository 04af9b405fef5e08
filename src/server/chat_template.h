// Chat messages → prompt tokens. GGUF files carry a Jinja chat template (tokenizer.chat_template).
// ChatRenderer renders it with our Jinja subset (jinja.h) when it parses and renders; otherwise it falls
// back to a native format chosen by recognising the family's marker tokens:
//   ChatML  (Qwen, many fine-tunes)  <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n
//   Llama-3                          <|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|> ...
//   Gemma                            <start_of_turn>{user|model}\n{content}<end_of_turn>\n ... (system
//                                    text is prepended to the first user turn, as Gemma's template does)
// Any other template, or none (base models such as stories260K), uses the documented plain format
//   "{role}: {content}\n" per message, then "assistant:"
// which also adds the stop string "\nuser:" so a base model does not write the user's next turn.
//
// Special markers are emitted as token ids, and message text is tokenized with special-token parsing
// OFF: a user who types "<|im_end|>" gets those characters, not a forged end of turn.
// BOS is prepended when the vocabulary asks for it (tokenizer.ggml.add_bos_token).
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "server/jinja.h"
#include "tokenizer/tokenizer.h"

namespace kvpack::server {

enum class ChatFormat { Plain, ChatML, Llama3, Gemma };

ChatFormat detect_chat_format(const std::string& jinja_template);
const char* chat_format_name(ChatFormat f);

struct ChatMessage {
  std::string role;  // system, user, assistant, tool (developer is treated as system)
  std::string content;
  // More fields of the message for the model's template, as the request gave them: tool_calls (an
  // assistant's calls), tool_call_id and name (a tool's answer), reasoning_content. The native formats
  // ignore them.
  jinja::Value extra = jinja::Value::object();
};

// What a request adds to the template's context besides messages, bos_token, eos_token and
// add_generation_prompt (true), as llama.cpp and vLLM pass them: `tools` (the request's JSON array; absent
// when null) and every key of chat_template_kwargs (e.g. Qwen3's enable_thinking), set last, so a kwarg
// may override add_generation_prompt but never messages. The native formats ignore both.
struct ChatOptions {
  jinja::Value tools;                            // null: none
  jinja::Value kwargs = jinja::Value::object();
};

// The rendered prompt as text (special markers written out), for logs and tests.
std::string render_chat_text(ChatFormat f, const std::vector<ChatMessage>& msgs);
// The prompt tokens (see above for how special markers and message text are tokenized).
std::vector<int32_t> render_chat_tokens(ChatFormat f, const std::vector<ChatMessage>& msgs, const Tokenizer& tok);
// Stop strings the format implies (plain: "\nuser:"); end-of-turn tokens are handled as EOG already.
std::vector<std::string> chat_default_stops(ChatFormat f);

// The model's own template, or the native fallback, chosen once per model.
//
// Special markers stay unforgeable with a template too: the template is rendered a second time with
// every control-token text inside message content (and inside tools, tool calls and kwargs) masked; control tokens are taken only where the
// masked rendering still has them (so only where the template itself wrote them), and everything else
// is tokenized with special-token parsing off. A template whose output depends on those characters in
// a way the two renderings disagree about falls back to the native format for that request.
class ChatRenderer {
 public:
  // Never throws: a template it cannot parse or render on a probe conversation selects the fallback
  // (detect_chat_format) and says why in fallback_reason(). `log` gets one line naming the choice.
  ChatRenderer(const std::string& jinja_template, const Tokenizer& tok, std::string* log = nullptr);
  ~ChatRenderer();

  bool uses_template() const { return tmpl_ != nullptr; }
  ChatFormat fallback() const { return fallback_; }
  const std::string& fallback_reason() const { return reason_; }

  // The prompt as text. Throws ChatRefused when the template raised an exception (raise_exception).
  // A template that fails on this conversation for another reason renders the fallback instead and
  // says why in *note (if given).
  std::string text(const std::vector<ChatMessage>& msgs, std::string* note = nullptr, const ChatOptions& opts = {}) const;
  std::vector<int32_t> tokens(const std::vector<ChatMessage>& msgs, std::string* note = nullptr, const ChatOptions& opts = {}) const;
  std::vector<std::string> default_stops() const;

 private:
  bool render_template(const std::vector<ChatMessage>& msgs, const ChatOptions& opts, bool masked, std::string& out,
                       std::string& why) const;
  std::string mask(const std::string& content) const;
  jinja::Value mask_strings(const jinja::Value& v) const;  // every string inside, masked (tools, tool calls)

  const Tokenizer* tok_;
  ChatFormat fallback_;
  std::string reason_;
  std::shared_ptr<const jinja::Template> tmpl_;
  std::vector<std::pair<std::string, int32_t>> control_;  // control-token texts, longest first
};

// The template refused the conversation (its raise_exception message, e.g. roles that must alternate).
class ChatRefused : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace kvpack::server
