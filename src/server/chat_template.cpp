#include "server/chat_template.h"

#include <algorithm>
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

namespace kvpack::server {
namespace {

// A conversation every family's template accepts (no system turn: some refuse one), to find out at
// load time whether the template renders at all.
const std::vector<ChatMessage> kProbe = {{"user", "Hello"}, {"assistant", "Hi."}, {"user", "Bye"}};

}  // namespace

ChatRenderer::ChatRenderer(const std::string& jinja_template, const Tokenizer& tok, std::string* log)
    : tok_(&tok), fallback_(detect_chat_format(jinja_template)) {
  for (int32_t id = 0; id < tok.n_vocab(); ++id)
    if (tok.token_type(id) == Tokenizer::kTypeControl && !tok.token_text(id).empty())
      control_.emplace_back(tok.token_text(id), id);
  std::stable_sort(control_.begin(), control_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  if (jinja_template.empty()) {
    reason_ = "the model has no tokenizer.chat_template";
  } else {
    try {
      tmpl_ = std::make_shared<const jinja::Template>(jinja_template);
      std::string out, why;
      if (!render_template(kProbe, ChatOptions{}, false, out, why)) {
        tmpl_.reset();
        reason_ = "its tokenizer.chat_template does not render (" + why + ")";
      }
    } catch (const ChatRefused&) {
      // The template refuses the probe conversation on purpose: it renders, and will refuse such requests.
    } catch (const jinja::Error& e) {
      tmpl_.reset();
      reason_ = std::string("its tokenizer.chat_template cannot be parsed (") + e.what() + ")";
    }
  }
  if (log) {
    *log = tmpl_ ? "chat template: rendering the model's tokenizer.chat_template"
                 : "chat template: " + reason_ + "; using the built-in '" + chat_format_name(fallback_) + "' format";
  }
}

ChatRenderer::~ChatRenderer() = default;

std::string ChatRenderer::mask(const std::string& content) const {
  std::string m = content;
  for (const auto& [text, id] : control_)
    for (size_t p = m.find(text); p != std::string::npos; p = m.find(text, p + text.size()))
      std::fill(m.begin() + p, m.begin() + p + text.size(), '\x01');
  return m;
}

jinja::Value ChatRenderer::mask_strings(const jinja::Value& v) const {
  if (v.is_string()) return mask(v.get<std::string>());
  if (!v.is_structured()) return v;
  jinja::Value out = v;
  for (auto it = out.begin(); it != out.end(); ++it) *it = mask_strings(*it);
  return out;
}

// false (with the reason) for a render error that is ours to handle; RaisedError propagates as ChatRefused.
bool ChatRenderer::render_template(const std::vector<ChatMessage>& msgs, const ChatOptions& opts, bool masked,
                                   std::string& out, std::string& why) const {
  auto value = [&](const jinja::Value& v) { return masked ? mask_strings(v) : v; };
  jinja::Value ctx = jinja::Value::object();
  jinja::Value ms = jinja::Value::array();
  for (const auto& m : msgs) {
    jinja::Value x = jinja::Value::object();
    x["role"] = m.role == "developer" ? "system" : m.role;
    x["content"] = masked ? mask(m.content) : m.content;
    for (auto it = m.extra.begin(); it != m.extra.end(); ++it)
      if (it.key() != "role" && it.key() != "content") x[it.key()] = value(it.value());
    ms.push_back(std::move(x));
  }
  ctx["messages"] = std::move(ms);
  ctx["bos_token"] = tok_->bos() >= 0 ? tok_->token_text(tok_->bos()) : "";
  ctx["eos_token"] = tok_->eos() >= 0 ? tok_->token_text(tok_->eos()) : "";
  ctx["add_generation_prompt"] = true;
  if (!opts.tools.is_null()) ctx["tools"] = value(opts.tools);
  for (auto it = opts.kwargs.begin(); it != opts.kwargs.end(); ++it)
    if (it.key() != "messages") ctx[it.key()] = value(it.value());
  try {
    out = tmpl_->render(ctx);
    return true;
  } catch (const jinja::RaisedError& e) {
    throw ChatRefused("the model's chat template refused the conversation: " + e.message);
  } catch (const jinja::Error& e) {
    why = e.what();
    return false;
  }
}

std::string ChatRenderer::text(const std::vector<ChatMessage>& msgs, std::string* note, const ChatOptions& opts) const {
  std::string out, why;
  if (tmpl_ && render_template(msgs, opts, false, out, why)) return out;
  if (tmpl_ && note) *note = "chat template failed (" + why + "); rendered with the built-in '" +
                             std::string(chat_format_name(fallback_)) + "' format";
  return render_chat_text(fallback_, msgs);
}

std::vector<int32_t> ChatRenderer::tokens(const std::vector<ChatMessage>& msgs, std::string* note, const ChatOptions& opts) const {
  auto fall_back = [&](const std::string& why) {
    if (note) *note = "chat template: " + why + "; rendered with the built-in '" + chat_format_name(fallback_) + "' format";
    return render_chat_tokens(fallback_, msgs, *tok_);
  };
  if (!tmpl_) return render_chat_tokens(fallback_, msgs, *tok_);
  std::string plain, masked, why;
  if (!render_template(msgs, opts, false, plain, why)) return fall_back(why);
  bool any_control = mask_strings(opts.tools) != opts.tools || mask_strings(opts.kwargs) != opts.kwargs;
  for (const auto& m : msgs) any_control |= mask(m.content) != m.content || mask_strings(m.extra) != m.extra;
  if (!any_control) masked = plain;
  else if (!render_template(msgs, opts, true, masked, why)) return fall_back(why);
  if (masked.size() != plain.size()) return fall_back("the template treats marker text in messages specially");
  for (size_t i = 0; i < plain.size(); ++i)
    if (masked[i] != plain[i] && masked[i] != '\x01')
      return fall_back("the template treats marker text in messages specially");

  std::vector<int32_t> out;
  size_t text_from = 0;
  auto flush_text = [&](size_t end) {
    if (end > text_from) {
      const auto ids = tok_->encode(std::string_view(plain).substr(text_from, end - text_from), false, false);
      out.insert(out.end(), ids.begin(), ids.end());
    }
  };
  bool starts[256] = {};  // first bytes of control texts: most positions need no comparison at all
  for (const auto& c : control_) starts[static_cast<unsigned char>(c.first[0])] = true;
  for (size_t i = 0; i < masked.size();) {
    if (!starts[static_cast<unsigned char>(masked[i])]) {
      ++i;
      continue;
    }
    int32_t id = -1;
    size_t len = 0;
    for (const auto& [t, tid] : control_) {
      if (masked.compare(i, t.size(), t) == 0) {
        id = tid, len = t.size();
        break;
      }
    }
    if (id < 0) {
      ++i;
      continue;
    }
    flush_text(i);
    out.push_back(id);
    i += len;
    text_from = i;
  }
  flush_text(plain.size());
  // Templates usually write bos_token themselves; add it only when the vocabulary wants one and it is missing.
  if (tok_->add_bos_default() && tok_->bos() >= 0 && (out.empty() || out.front() != tok_->bos()))
    out.insert(out.begin(), tok_->bos());
  return out;
}

std::vector<std::string> ChatRenderer::default_stops() const {
  return tmpl_ ? std::vector<std::string>{} : chat_default_stops(fallback_);
}

}  // namespace kvpack::server
