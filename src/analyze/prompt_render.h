// A logged request rendered to prompt tokens the way `kvpack serve` renders it: chat messages through
// server/chat_template (the model's chat format, special markers as single tokens, BOS when the vocab
// asks for it), completion prompts through the tokenizer with the vocab's BOS default.
//
// Tools: the server does not accept "tools" yet, so their rendering follows the chat templates that do
// (Qwen's and Hermes-style ones): one compact JSON object per tool, in the order sent, inside a
// "# Tools / <tools>...</tools>" block at the end of the system message (a system message is added in
// front when the request has none). Order and key order are kept as sent, as a real template keeps them.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "analyze/prefix_sim.h"
#include "analyze/request_log.h"
#include "server/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kvpack::analyze {

// The messages the chat template sees (tools folded into the system message).
std::vector<server::ChatMessage> template_messages(const LoggedRequest& r);
// The prompt as text (chat: the template's text, special markers written out).
std::string render_prompt_text(const LoggedRequest& r, server::ChatFormat f);

// Renders requests to tokens, and to cache blocks remembered per distinct prompt: the analyzer renders
// the same log once per what-if scenario and most prompts do not change between scenarios.
class PromptRenderer {
 public:
  PromptRenderer(const Tokenizer& tok, server::ChatFormat f) : tok_(&tok), format_(f) {}
  std::vector<int32_t> tokens(const LoggedRequest& r) const;
  // The prompt's blocks for the cache simulation (page_size must stay the same for one renderer).
  const BlockedPrompt& blocks(const LoggedRequest& r, int32_t page_size);
  server::ChatFormat format() const { return format_; }
  const Tokenizer& tokenizer() const { return *tok_; }

 private:
  struct Key {
    uint64_t lo, hi;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return static_cast<size_t>(k.lo); }
  };
  const Tokenizer* tok_;
  server::ChatFormat format_;
  int32_t page_size_ = 0;
  // 128-bit hash of an unambiguous prompt key (collisions: ~2^-128 per pair) -> its blocks.
  std::unordered_map<Key, BlockedPrompt, KeyHash> memo_;
};

}  // namespace kvpack::analyze
