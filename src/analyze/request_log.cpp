#include "analyze/request_log.h"

#include <algorithm>
#include <cmath>
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

double as_seconds(const ordered_json& v, const std::string& name) {
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < 0) bad("'" + name + "' must be a non-negative number of seconds");
  return v.get<double>();
}

double as_time(const ordered_json& v, const std::string& name) {
  if (v.is_string()) {
    if (auto t = parse_utc_time(v.get<std::string>())) return *t;
    bad("'" + name + "' must be an ISO 8601 UTC time like 2026-12-02T04:49:34.411Z (got \"" + v.get<std::string>().substr(0, 40) + "\")");
  }
  return as_seconds(v, name);
}

// When the request arrived: the server log's end time minus its duration, or a given timestamp.
std::optional<double> arrival_time(const ordered_json& j) {
  const ordered_json* ts = field(j, "ts");
  const ordered_json* e2e = field(j, "e2e_s");
  if (ts && e2e) return as_time(*ts, "ts") - as_seconds(*e2e, "e2e_s");
  if (const ordered_json* t = field(j, "timestamp")) return as_time(*t, "timestamp");
  return std::nullopt;
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

std::optional<double> parse_utc_time(std::string_view s) {
  auto num = [&](size_t at, size_t n) -> int {
    if (at + n > s.size()) return -1;
    int v = 0;
    for (size_t i = at; i < at + n; ++i) {
      if (s[i] < '0' || s[i] > '9') return -1;
      v = v * 10 + (s[i] - '0');
    }
    return v;
  };
  const int y = num(0, 4), mo = num(5, 2), d = num(8, 2), h = num(11, 2), mi = num(14, 2), sec = num(17, 2);
  if (y < 0 || mo < 1 || mo > 12 || d < 1 || d > 31 || h < 0 || h > 23 || mi < 0 || mi > 59 || sec < 0 || sec > 60) return std::nullopt;
  if (s[4] != '-' || s[7] != '-' || (s[10] != 'T' && s[10] != ' ') || s[13] != ':' || s[16] != ':') return std::nullopt;
  size_t i = 19;
  double frac = 0;
  if (i < s.size() && s[i] == '.') {
    double scale = 0.1;
    size_t k = i + 1;
    while (k < s.size() && s[k] >= '0' && s[k] <= '9') {
      frac += (s[k] - '0') * scale;
      scale /= 10;
      ++k;
    }
    if (k == i + 1) return std::nullopt;
    i = k;
  }
  const std::string_view zone = s.substr(i);
  if (zone != "Z" && zone != "+00:00") return std::nullopt;
  // Days from 1970-01-01 to y-mo-d in the proleptic Gregorian calendar (H. Hinnant's days_from_civil).
  const int yy = y - (mo <= 2);
  const int era = yy / 400;
  const int yoe = yy - era * 400;
  const int doy = (153 * (mo + (mo > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const int doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  const int64_t days = static_cast<int64_t>(era) * 146097 + doe - 719468;
  return static_cast<double>(days * 86400 + h * 3600 + mi * 60 + sec) + frac;
}

bool order_by_arrival(std::vector<LoggedRequest>& log) {
  for (const auto& r : log)
    if (!r.arrival_s) return false;
  std::stable_sort(log.begin(), log.end(), [](const LoggedRequest& a, const LoggedRequest& b) { return *a.arrival_s < *b.arrival_s; });
  return true;
}

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
  r.arrival_s = arrival_time(j);
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
