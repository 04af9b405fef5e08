#include "server/chat_template.h"

#include <string_view>

namespace kvpack::server {
namespace {

// A prompt is a list of segments: special markers (one vocabulary token each) and plain text.
struct Segment {
  bool special;
  std::string text;
};

std::string trim(std::string_view s) {
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(ws);
  return std::string(s.substr(b, e - b + 1));
}

std::string normalized_role(const std::string& role) { return role == "developer" ? "system" : role; }

std::vector<Segment> render(ChatFormat f, const std::vector<ChatMessage>& msgs) {
  std::vector<Segment> out;
  auto sp = [&](const char* t) { out.push_back({true, t}); };
  auto tx = [&](std::string t) {
    if (!out.empty() && !out.back().special) out.back().text += t;  // adjacent text is one fragment
    else out.push_back({false, std::move(t)});
  };
  switch (f) {
    case ChatFormat::ChatML:
      for (const auto& m : msgs) {
        sp("<|im_start|>");
        tx(normalized_role(m.role) + "\n" + m.content);
        sp("<|im_end|>");
        tx("\n");
      }
      sp("<|im_start|>");
      tx("assistant\n");
      break;
    case ChatFormat::Llama3:  // the official template trims message content
      for (const auto& m : msgs) {
        sp("<|start_header_id|>");
        tx(normalized_role(m.role));
        sp("<|end_header_id|>");
        tx("\n\n" + trim(m.content));
        sp("<|eot_id|>");
      }
      sp("<|start_header_id|>");
      tx("assistant");
      sp("<|end_header_id|>");
      tx("\n\n");
      break;
    case ChatFormat::Gemma: {  // no system role: its text opens the first user turn
      std::string system;
      bool first_user = true;
      for (const auto& m : msgs) {
        const std::string role = normalized_role(m.role);
        if (role == "system") {
          system += (system.empty() ? "" : "\n\n") + trim(m.content);
          continue;
        }
        std::string content = trim(m.content);
        if (role == "user" && first_user && !system.empty()) content = system + "\n\n" + content;
        if (role == "user") first_user = false;
        sp("<start_of_turn>");
        tx((role == "assistant" ? std::string("model") : role) + "\n" + content);
        sp("<end_of_turn>");
        tx("\n");
      }
      sp("<start_of_turn>");
      tx("model\n");
      break;
    }
    case ChatFormat::Plain:
      for (const auto& m : msgs) tx(normalized_role(m.role) + ": " + m.content + "\n");
      tx("assistant:");
      break;
  }
  return out;
}

}  // namespace

ChatFormat detect_chat_format(const std::string& t) {
  if (t.find("<|im_start|>") != std::string::npos) return ChatFormat::ChatML;
  if (t.find("<|start_header_id|>") != std::string::npos) return ChatFormat::Llama3;
  if (t.find("<start_of_turn>") != std::string::npos) return ChatFormat::Gemma;
  return ChatFormat::Plain;
}

const char* chat_format_name(ChatFormat f) {
  switch (f) {
    case ChatFormat::ChatML: return "chatml";
    case ChatFormat::Llama3: return "llama3";
    case ChatFormat::Gemma: return "gemma";
    case ChatFormat::Plain: return "plain";
  }
  return "?";
}

std::string render_chat_text(ChatFormat f, const std::vector<ChatMessage>& msgs) {
  std::string s;
  for (const auto& seg : render(f, msgs)) s += seg.text;
  return s;
}

std::vector<int32_t> render_chat_tokens(ChatFormat f, const std::vector<ChatMessage>& msgs, const Tokenizer& tok) {
  std::vector<int32_t> out;
  if (tok.add_bos_default() && tok.bos() >= 0) out.push_back(tok.bos());
  for (const auto& seg : render(f, msgs)) {
    const int32_t id = seg.special ? tok.find_token(seg.text) : -1;
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    // Text (or a marker this vocabulary lacks): special-token parsing off, see the header.
    const auto ids = tok.encode(seg.text, false, false);
    out.insert(out.end(), ids.begin(), ids.end());
  }
  return out;
}

std::vector<std::string> chat_default_stops(ChatFormat f) {
  if (f == ChatFormat::Plain) return {"\nuser:"};
  return {};
}

}  // namespace kvpack::server
