#include "analyze/request_log.h"

#include <fstream>
#include <limits>

namespace kvpack::analyze {
namespace {

constexpr int kMaxJsonDepth = 64;  // request bodies nest 4-6 deep; deeper input is refused before parsing

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument(what); }

// Reads one line (without its '\n'; a trailing '\r' is kept: it is part of the JSON text's whitespace).
// Returns false at end of input. Throws when the line exceeds `max` bytes, before storing more.
bool next_line(std::streambuf& sb, std::string& out, size_t max, int64_t line_no) {
  out.clear();
  using traits = std::streambuf::traits_type;
  int c = sb.sbumpc();
  if (c == traits::eof()) return false;
  while (c != traits::eof() && c != '\n') {
    if (out.size() >= max)
      throw LogError(line_no, "the line is longer than " + std::to_string(max) + " bytes (--max-line-bytes)");
    out.push_back(static_cast<char>(c));
    c = sb.sbumpc();
  }
  return true;
}

bool blank(const std::string& s) { return s.find_first_not_of(" \t\r") == std::string::npos; }

// Nesting depth of brackets outside strings: bounds the parser's and the destructor's recursion.
int json_depth(const std::string& s) {
  int depth = 0, worst = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      worst = std::max(worst, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return worst;
}

const ordered_json* field(const ordered_json& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string as_string(const ordered_json& v, const std::string& name) {
  if (!v.is_string()) bad("'" + name + "' must be a string");
  return v.get<std::string>();
}

// An id or session may be a string or an integer (some logs number them).
std::string as_label(const ordered_json& v, const std::string& name) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer()) return v.dump();
  bad("'" + name + "' must be a string or an integer");
}

int64_t as_count(const ordered_json& v, const std::string& name) {
  if (v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return v.get<int64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<int64_t>();
  bad("'" + name + "' must be a non-negative integer");
}

int32_t as_token_id(const ordered_json& v, const std::string& name) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > std::numeric_limits<int32_t>::max())
    bad("'" + name + "' must be a list of token ids (non-negative integers)");
  return static_cast<int32_t>(v.get<int64_t>());
}

std::string content_text(const ordered_json& c, const std::string& at) {
  if (c.is_string()) return c.get<std::string>();
  if (c.is_array()) {  // content parts: the text ones are the prompt (images etc. are not rendered)
    std::string s;
    for (size_t i = 0; i < c.size(); ++i) {
      const ordered_json& part = c[i];
      if (!part.is_object()) bad(at + "[" + std::to_string(i) + "] must be an object");
      if (part.value("type", "") != "text") continue;
      const ordered_json* t = field(part, "text");
      if (!t || !t->is_string()) bad(at + "[" + std::to_string(i) + "].text must be a string");
      s += t->get<std::string>();
    }
    return s;
  }
  bad(at + " must be a string or a list of content parts");
}

void parse_chat(const ordered_json& body, LoggedRequest& r) {
  const ordered_json& m = body["messages"];
  if (!m.is_array() || m.empty()) bad("'messages' must be a non-empty list");
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string at = "messages[" + std::to_string(i) + "]";
    const ordered_json& x = m[i];
    if (!x.is_object()) bad(at + " must be an object");
    const ordered_json* role = field(x, "role");
    if (!role || !role->is_string()) bad(at + ".role must be a string");
    Message msg;
    msg.role = role->get<std::string>();
    if (msg.role != "system" && msg.role != "developer" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool")
      bad(at + ".role must be one of system, developer, user, assistant, tool (got \"" + msg.role + "\")");
    if (const ordered_json* c = field(x, "content")) msg.content = content_text(*c, at + ".content");
    else if (msg.role != "assistant") bad(at + ".content is required");
    r.messages.push_back(std::move(msg));
  }
  if (const ordered_json* t = field(body, "tools")) {
    if (!t->is_array()) bad("'tools' must be a list");
    for (size_t i = 0; i < t->size(); ++i) {
      if (!(*t)[i].is_object()) bad("tools[" + std::to_string(i) + "] must be an object");
      r.tools.push_back((*t)[i]);
    }
  }
}

void parse_completion(const ordered_json& p, LoggedRequest& r) {
  if (p.is_string()) {
    r.prompt = p.get<std::string>();
  } else if (p.is_array() && !p.empty() && (p[0].is_string() || p[0].is_array())) {
    if (p.size() != 1) bad("'prompt' holds a batch of " + std::to_string(p.size()) + " prompts: one prompt per request");
    parse_completion(p[0], r);
    return;
  } else if (p.is_array()) {
    for (const auto& t : p) r.prompt_ids.push_back(as_token_id(t, "prompt"));
  } else {
    bad("'prompt' must be a string or a list of token ids");
  }
  if (r.prompt.empty() && r.prompt_ids.empty()) bad("the prompt is empty");
}

}  // namespace

LogError::LogError(int64_t l, const std::string& what) : std::runtime_error("line " + std::to_string(l) + ": " + what), line(l) {}

LoggedRequest parse_logged_request(const ordered_json& j) {
  if (!j.is_object()) bad("a line must be a JSON object (one request per line)");
  LoggedRequest r;
  const ordered_json* body = &j;
  if (const ordered_json* req = field(j, "request")) {
    if (!req->is_object()) bad("'request' must be an object (the request body)");
    body = req;
  }
  if (const ordered_json* v = field(j, "id")) r.id = as_label(*v, "id");
  if (const ordered_json* v = field(j, "session")) r.session = as_label(*v, "session");
  else if (const ordered_json* u = field(j, "user")) r.session = as_label(*u, "user");
  else if (const ordered_json* bu = field(*body, "user")) r.session = as_label(*bu, "request.user");
  if (const ordered_json* v = field(j, "prompt_tokens")) r.logged_prompt_tokens = as_count(*v, "prompt_tokens");
  if (const ordered_json* v = field(j, "cached_tokens")) r.logged_cached_tokens = as_count(*v, "cached_tokens");
  if (const ordered_json* v = field(*body, "cache_salt")) r.cache_salt = as_string(*v, "cache_salt");
  const bool has_messages = field(*body, "messages") != nullptr;
  const ordered_json* prompt = field(*body, "prompt");
  if (has_messages && prompt) bad("the request has both 'messages' and 'prompt'");
  if (has_messages) {
    r.chat = true;
    parse_chat(*body, r);
  } else if (prompt) {
    parse_completion(*prompt, r);
  } else {
    bad(body == &j ? "no request body: neither 'messages' nor 'prompt' (a request log written without --request-log-prompts "
                     "has no prompts to analyze)"
                   : "'request' has neither 'messages' nor 'prompt'");
  }
  return r;
}

std::vector<LoggedRequest> read_request_log(std::istream& in, const ReadOptions& opt) {
  std::vector<LoggedRequest> out;
  std::streambuf* sb = in.rdbuf();
  if (sb == nullptr) throw std::runtime_error("the request log cannot be read");
  std::string line;
  for (int64_t line_no = 1; next_line(*sb, line, opt.max_line_bytes, line_no); ++line_no) {
    if (blank(line)) continue;
    if (json_depth(line) > kMaxJsonDepth)
      throw LogError(line_no, "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    ordered_json j;
    try {
      j = ordered_json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw LogError(line_no, std::string("invalid JSON: ") + e.what());
    }
    try {
      LoggedRequest r = parse_logged_request(j);
      r.line = line_no;
      if (r.id.empty()) r.id = "line " + std::to_string(line_no);
      out.push_back(std::move(r));
    } catch (const std::invalid_argument& e) {
      throw LogError(line_no, e.what());
    } catch (const nlohmann::json::exception& e) {  // a type we did not anticipate
      throw LogError(line_no, std::string("unexpected JSON: ") + e.what());
    }
  }
  return out;
}

std::vector<LoggedRequest> read_request_log_file(const std::string& path, const ReadOptions& opt) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open the request log " + path);
  return read_request_log(in, opt);
}

std::string to_log_line(const LoggedRequest& r) {
  ordered_json body;
  body["model"] = "kvpack";
  if (r.chat) {
    ordered_json msgs = ordered_json::array();
    for (const auto& m : r.messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
    body["messages"] = std::move(msgs);
    if (!r.tools.empty()) body["tools"] = r.tools;
  } else if (!r.prompt_ids.empty()) {
    body["prompt"] = r.prompt_ids;
  } else {
    body["prompt"] = r.prompt;
  }
  if (!r.cache_salt.empty()) body["cache_salt"] = r.cache_salt;
  ordered_json line;
  line["id"] = r.id;
  if (!r.session.empty()) line["session"] = r.session;
  if (r.logged_prompt_tokens) line["prompt_tokens"] = *r.logged_prompt_tokens;
  if (r.logged_cached_tokens) line["cached_tokens"] = *r.logged_cached_tokens;
  line["request"] = std::move(body);
  return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace kvpack::analyze
