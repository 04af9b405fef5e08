// Chat messages → prompt tokens. GGUF files carry a Jinja chat template; rather than embedding a Jinja
// engine, we recognise the common families by their marker tokens and render them natively:
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
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace kvpack::server {

enum class ChatFormat { Plain, ChatML, Llama3, Gemma };

ChatFormat detect_chat_format(const std::string& jinja_template);
const char* chat_format_name(ChatFormat f);

struct ChatMessage {
  std::string role;  // system, user, assistant, tool (developer is treated as system)
  std::string content;
};

// The rendered prompt as text (special markers written out), for logs and tests.
std::string render_chat_text(ChatFormat f, const std::vector<ChatMessage>& msgs);
// The prompt tokens (see above for how special markers and message text are tokenized).
std::vector<int32_t> render_chat_tokens(ChatFormat f, const std::vector<ChatMessage>& msgs, const Tokenizer& tok);
// Stop strings the format implies (plain: "\nuser:"); end-of-turn tokens are handled as EOG already.
std::vector<std::string> chat_default_stops(ChatFormat f);

}  // namespace kvpack::server
