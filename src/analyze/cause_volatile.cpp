// Volatile spans in the system prompt: a value that changes per request (a timestamp, a request id, a
// counter) ends the shared prefix at its first character, so everything after it, history included,
// is recomputed on every request.
#include <cctype>
#include <unordered_map>

#include "analyze/causes_impl.h"

namespace kvpack::analyze {
namespace {

bool digit(char c) { return c >= '0' && c <= '9'; }
bool alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool alnum(char c) { return digit(c) || alpha(c); }
bool hex(char c) { return digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// Length of a run of `n` characters matching `pred` at `i` (exactly n), or 0.
template <class P>
size_t exactly(std::string_view s, size_t i, size_t n, P pred) {
  if (i + n > s.size()) return 0;
  for (size_t k = 0; k < n; ++k)
    if (!pred(s[i + k])) return 0;
  return n;
}

size_t run(std::string_view s, size_t i, bool (*pred)(char)) {
  size_t k = i;
  while (k < s.size() && pred(s[k])) ++k;
  return k - i;
}

bool ends_word(std::string_view s, size_t end) { return end >= s.size() || !alnum(s[end]); }

size_t match_uuid(std::string_view s, size_t i) {  // 8-4-4-4-12 hex digits
  size_t k = i;
  for (size_t part : {8, 4, 4, 4, 12}) {
    if (k != i) {
      if (k >= s.size() || s[k] != '-') return 0;
      ++k;
    }
    if (!exactly(s, k, part, hex)) return 0;
    k += part;
  }
  return ends_word(s, k) ? k - i : 0;
}

size_t match_date(std::string_view s, size_t i) {
  // 2026-12-02, 2026/12/02
  if (exactly(s, i, 4, digit) && i + 4 < s.size() && (s[i + 4] == '-' || s[i + 4] == '/') && exactly(s, i + 5, 2, digit) &&
      i + 7 < s.size() && s[i + 7] == s[i + 4] && exactly(s, i + 8, 2, digit))
    return 10;
  // 12/02/2026, 2/12/26
  const size_t a = run(s, i, digit);
  if (a < 1 || a > 2 || i + a >= s.size() || s[i + a] != '/') return 0;
  const size_t b = run(s, i + a + 1, digit);
  if (b < 1 || b > 2 || i + a + 1 + b >= s.size() || s[i + a + 1 + b] != '/') return 0;
  const size_t c = run(s, i + a + b + 2, digit);
  if (c != 2 && c != 4) return 0;
  return a + b + c + 2;
}

size_t match_time(std::string_view s, size_t i) {  // 9:05, 09:05:33, 09:05:33.123
  const size_t h = run(s, i, digit);
  if (h < 1 || h > 2 || i + h >= s.size() || s[i + h] != ':' || !exactly(s, i + h + 1, 2, digit)) return 0;
  size_t k = i + h + 3;
  if (k < s.size() && s[k] == ':' && exactly(s, k + 1, 2, digit)) {
    k += 3;
    if (k + 1 < s.size() && s[k] == '.' && digit(s[k + 1])) k += 1 + run(s, k + 1, digit);
  }
  return k - i;
}

size_t match_id(std::string_view s, size_t i) {  // opaque ids: 8+ letters and digits, 2+ of them digits
  const size_t n = run(s, i, alnum);
  if (n < 8) return 0;
  int digits = 0, letters = 0;
  for (size_t k = i; k < i + n; ++k) digit(s[k]) ? ++digits : ++letters;
  return digits >= 2 && letters >= 1 ? n : 0;
}

size_t match_number(std::string_view s, size_t i) {
  size_t n = run(s, i, digit);
  if (n == 0) return 0;
  if (i + n + 1 < s.size() && s[i + n] == '.' && digit(s[i + n + 1])) n += 1 + run(s, i + n + 1, digit);
  return n;
}

size_t match_date_word(std::string_view s, size_t i) {
  static const char* words[] = {"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday",
                                "January", "February", "March", "April", "June", "July", "August", "September",
                                "October", "November", "December"};
  const size_t n = run(s, i, alpha);
  for (const char* w : words)
    if (s.substr(i, n) == w) return n;
  // "May" is a month only before a day number ("May 3"), otherwise it is a verb.
  if (s.substr(i, n) == "May" && i + 4 < s.size() && s[i + 3] == ' ' && digit(s[i + 4])) return 3;
  return 0;
}

// The system messages, joined by a blank line.
std::string system_text(const LoggedRequest& r) {
  std::string s;
  for (size_t i = 0; i < first_history_message(r); ++i) s += (i ? "\n\n" : "") + r.messages[i].content;
  return s;
}

}  // namespace

std::vector<Span> find_volatile_spans(std::string_view s) {
  std::vector<Span> out;
  size_t i = 0;
  while (i < s.size()) {
    if (i > 0 && alnum(s[i - 1])) {  // spans start at a word boundary
      ++i;
      continue;
    }
    size_t n = 0;
    const char* kind = "";
    if ((n = match_uuid(s, i))) kind = "uuid";
    else if ((n = match_date(s, i))) {
      kind = "date";
      // ISO 8601 glues the time on with a 'T' (no word boundary): 2026-12-02T10:31:07Z is one span.
      if (i + n < s.size() && s[i + n] == 'T') {
        if (const size_t t = match_time(s, i + n + 1)) {
          n += 1 + t;
          if (i + n < s.size() && s[i + n] == 'Z') ++n;
          kind = "datetime";
        }
      }
    }
    else if ((n = match_time(s, i))) kind = "time";
    else if ((n = match_id(s, i))) kind = "id";
    else if ((n = match_number(s, i))) kind = "n";
    else if ((n = match_date_word(s, i))) kind = "dateword";
    if (n > 0) {
      out.push_back({i, i + n, kind});
      i += n;
    } else {
      ++i;
    }
  }
  return out;
}

std::string mask_volatile(std::string_view s) {
  std::string out;
  size_t at = 0;
  for (const Span& sp : find_volatile_spans(s)) {
    out.append(s.substr(at, sp.begin - at));
    out += std::string("<") + sp.kind + ">";
    at = sp.end;
  }
  out.append(s.substr(at));
  return out;
}

Detection detect_volatile(const Log& log) {
  Detection d;
  struct Seen {
    std::string raw;
    size_t index;
  };
  std::unordered_map<std::string, Seen> by_template;  // masked system text -> the latest raw text with it
  for (size_t i = 0; i < log.size(); ++i) {
    if (!log[i].chat || first_history_message(log[i]) == 0) continue;
    std::string raw = system_text(log[i]);
    auto [it, fresh] = by_template.try_emplace(mask_volatile(raw), Seen{raw, i});
    if (!fresh) {
      if (it->second.raw != raw) {
        d.affected.push_back(i);
        if (!d.example) d.example = Example{it->second.index, i, "system prompt", it->second.raw, raw, ""};
      }
      it->second = {std::move(raw), i};
    }
  }
  return d;
}

Log normalise_volatile(Log log) {
  for (auto& r : log)
    for (size_t i = 0; i < first_history_message(r); ++i) r.messages[i].content = mask_volatile(r.messages[i].content);
  return log;
}

}  // namespace kvpack::analyze
