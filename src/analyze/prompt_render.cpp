#include "analyze/prompt_render.h"

#include <xxhash.h>

namespace kvpack::analyze {
namespace {

std::string tools_block(const std::vector<ordered_json>& tools) {
  std::string s = "# Tools\n<tools>\n";
  for (const auto& t : tools) s += t.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  return s + "</tools>";
}

bool is_system(const std::string& role) { return role == "system" || role == "developer"; }

}  // namespace

std::vector<server::ChatMessage> template_messages(const LoggedRequest& r) {
  std::vector<server::ChatMessage> msgs;
  msgs.reserve(r.messages.size() + 1);
  for (const auto& m : r.messages) msgs.push_back({m.role, m.content});
  if (!r.tools.empty()) {
    if (!msgs.empty() && is_system(msgs[0].role)) msgs[0].content += "\n\n" + tools_block(r.tools);
    else msgs.insert(msgs.begin(), {"system", tools_block(r.tools)});
  }
  return msgs;
}

std::string render_prompt_text(const LoggedRequest& r, server::ChatFormat f) {
  if (r.chat) return server::render_chat_text(f, template_messages(r));
  return r.prompt;
}

std::vector<int32_t> PromptRenderer::tokens(const LoggedRequest& r) const {
  if (r.chat) return server::render_chat_tokens(format_, template_messages(r), *tok_);
  if (!r.prompt_ids.empty()) return r.prompt_ids;  // sent as token ids: nothing to render
  return tok_->encode(r.prompt, tok_->add_bos_default());
}

const BlockedPrompt& PromptRenderer::blocks(const LoggedRequest& r, int32_t page_size) {
  if (page_size_ != page_size) {
    memo_.clear();
    page_size_ = page_size;
  }
  // Lengths before contents: no two different requests share a key.
  std::string key = r.chat ? "chat" : !r.prompt_ids.empty() ? "ids" : "text";
  if (r.chat) {
    for (const auto& m : template_messages(r))
      key += std::to_string(m.role.size()) + ":" + m.role + std::to_string(m.content.size()) + ":" + m.content;
  } else if (!r.prompt_ids.empty()) {
    key.append(reinterpret_cast<const char*>(r.prompt_ids.data()), r.prompt_ids.size() * sizeof(int32_t));
  } else {
    key += r.prompt;
  }
  const XXH128_hash_t h = XXH3_128bits(key.data(), key.size());
  auto [it, fresh] = memo_.try_emplace(Key{h.low64, h.high64});
  if (fresh) it->second = block_prompt(tokens(r), page_size);
  return it->second;
}

}  // namespace kvpack::analyze
