// Whitespace and newline variants: "\r\n" against "\n", trailing spaces, a doubled space, an extra blank
// line or a trailing newline tokenise differently, so the same text sent twice in two spellings (a
// client that trims the history it re-sends, two client versions) shares no blocks past the variant.
#include <unordered_map>

#include "analyze/causes_impl.h"

namespace kvpack::analyze {
namespace {

bool blank(char c) { return c == ' ' || c == '\t'; }

std::string_view trim(std::string_view s) {
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// A completion prompt is one text; its lines are compared instead (shorter lines are too common to
// say anything).
constexpr size_t kMinComparedLine = 16;

}  // namespace

std::string normalise_whitespace(std::string_view in) {
  std::string s;
  s.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {  // every newline as "\n"
    if (in[i] == '\r') {
      s.push_back('\n');
      if (i + 1 < in.size() && in[i + 1] == '\n') ++i;
    } else if (static_cast<unsigned char>(in[i]) == 0xC2 && i + 1 < in.size() && static_cast<unsigned char>(in[i + 1]) == 0xA0) {
      s.push_back(' ');  // no-break space
      ++i;
    } else {
      s.push_back(in[i]);
    }
  }
  std::string out;
  out.reserve(s.size());
  int newlines = 0;  // in a row, at the end of `out`
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t nl = std::min(s.find('\n', pos), s.size());
    std::string_view line(s.data() + pos, nl - pos);
    while (!line.empty() && blank(line.back())) line.remove_suffix(1);
    if (line.empty()) {
      if (nl < s.size() && newlines < 2 && !out.empty()) {
        out.push_back('\n');
        ++newlines;
      }
    } else {
      // Indentation stays; runs of blanks after it become one space.
      size_t k = 0;
      while (k < line.size() && blank(line[k])) out.push_back(line[k++]);
      for (; k < line.size(); ++k) {
        if (line[k] == ' ' && !out.empty() && out.back() == ' ') continue;
        out.push_back(line[k]);
      }
      newlines = 0;
      if (nl < s.size()) {
        out.push_back('\n');
        newlines = 1;
      }
    }
    pos = nl + 1;
  }
  return std::string(trim(out));
}

Detection detect_whitespace(const Log& log) {
  Detection d;
  struct Seen {
    std::string raw;
    size_t index;
    std::string where;
  };
  std::unordered_map<std::string, Seen> by_norm;  // role + normalised text -> the latest raw spelling
  for (size_t i = 0; i < log.size(); ++i) {
    const LoggedRequest& r = log[i];
    bool flagged = false;
    auto see = [&](const std::string& key_prefix, std::string_view raw, std::string where) {
      const std::string norm = key_prefix + normalise_whitespace(raw);
      auto [it, fresh] = by_norm.try_emplace(norm, Seen{std::string(raw), i, where});
      if (fresh) return;
      if (it->second.raw != raw && it->second.index != i && !flagged) {
        flagged = true;
        d.affected.push_back(i);
        if (!d.example) d.example = Example{it->second.index, i, where, it->second.raw, std::string(raw), "the same text, spelt with other whitespace"};
      }
      it->second = {std::string(raw), i, std::move(where)};
    };
    if (r.chat) {
      for (size_t m = 0; m < r.messages.size(); ++m)
        see(r.messages[m].role + '\0', r.messages[m].content, "messages[" + std::to_string(m) + "] (" + r.messages[m].role + ")");
    } else {
      size_t pos = 0, line = 0;
      while (pos < r.prompt.size()) {
        size_t nl = r.prompt.find('\n', pos);
        if (nl == std::string::npos) nl = r.prompt.size();
        const std::string_view raw(r.prompt.data() + pos, nl - pos);
        if (trim(raw).size() >= kMinComparedLine) see(std::string("prompt line\0", 12), raw, "prompt line " + std::to_string(line + 1));
        pos = nl + 1;
        ++line;
      }
    }
  }
  return d;
}

Log normalise_whitespace_log(Log log) {
  for (auto& r : log) {
    for (auto& m : r.messages) m.content = normalise_whitespace(m.content);
    if (!r.prompt.empty()) {
      std::string p = normalise_whitespace(r.prompt);
      if (!p.empty()) r.prompt = std::move(p);  // an all-blank prompt stays what it was: never empty
    }
  }
  return log;
}

}  // namespace kvpack::analyze
