#include "server/jinja_lexer.h"

#include <cctype>

#include "server/jinja.h"

namespace kvpack::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

struct Lexer {
  const std::string& s;
  size_t i = 0;
  int line = 1, col = 1;
  std::vector<Token> out;
  bool strip_next_text = false;  // a "-%}" / "-}}" / "-#}" came before the coming text
  bool trim_newline = false;     // trim_blocks: a "%}" / "#}" came before the coming text

  [[noreturn]] void fail(const std::string& m) const { throw Error(line, col, m); }

  void advance(size_t n) {
    for (size_t k = 0; k < n && i < s.size(); ++k, ++i) {
      if (s[i] == '\n') ++line, col = 1;
      else ++col;
    }
  }

  // The text run before a tag at s[tag]; `strip` = the tag opens with "-", `lstrip` = lstrip_blocks applies.
  void emit_text(size_t start, size_t end, int l, int c, bool strip, bool lstrip) {
    std::string t = s.substr(start, end - start);
    bool removed_newline = false;
    if (strip_next_text) {
      size_t b = 0;
      while (b < t.size() && is_space(t[b])) ++b;
      t.erase(0, b);
    } else if (trim_newline) {
      const size_t n = t.starts_with("\r\n") ? 2 : t.starts_with("\n") ? 1 : 0;
      t.erase(0, n);
      removed_newline = n > 0;
    }
    if (strip) {
      while (!t.empty() && is_space(t.back())) t.pop_back();
    } else if (lstrip) {  // only the indentation of the tag's own line, and only if nothing else is on it
      size_t k = t.size();
      while (k > 0 && (t[k - 1] == ' ' || t[k - 1] == '\t')) --k;
      const bool line_start = k > 0 ? t[k - 1] == '\n' : start == 0 || s[start - 1] == '\n' || removed_newline;
      if (line_start) t.erase(k);
    }
    strip_next_text = trim_newline = false;
    if (!t.empty()) out.push_back({Tok::Text, std::move(t), l, c});
  }

  void lex_expr(const char* close, Tok close_kind) {
    // close is "}}", "%}"
    for (;;) {
      while (i < s.size() && is_space(s[i])) advance(1);
      if (i >= s.size()) fail(std::string("unterminated tag: expected '") + close + "'");
      const int l = line, c = col;
      const bool dash_close = s.compare(i, 3, std::string("-") + close) == 0;
      const bool plus_close = s.compare(i, 3, std::string("+") + close) == 0;
      if (dash_close || plus_close || s.compare(i, 2, close) == 0) {
        advance(dash_close || plus_close ? 3 : 2);
        out.push_back({close_kind, close, l, c});
        strip_next_text = dash_close;
        trim_newline = !dash_close && !plus_close && close_kind == Tok::BlockEnd;
        return;
      }
      const char ch = s[i];
      if (std::isalpha(static_cast<unsigned char>(ch)) || ch == '_') {
        size_t j = i;
        while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
        out.push_back({Tok::Name, s.substr(i, j - i), l, c});
        advance(j - i);
      } else if (std::isdigit(static_cast<unsigned char>(ch))) {
        size_t j = i;
        while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
        bool is_float = false;
        if (j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]))) {
          is_float = true;
          ++j;
          while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
        }
        std::string num;
        for (size_t k = i; k < j; ++k)
          if (s[k] != '_') num += s[k];
        out.push_back({is_float ? Tok::Float : Tok::Int, num, l, c});
        advance(j - i);
      } else if (ch == '\'' || ch == '"') {
        std::string v;
        size_t j = i + 1;
        for (;; ++j) {
          if (j >= s.size()) fail("unterminated string literal");
          if (s[j] == ch) break;
          if (s[j] == '\\' && j + 1 < s.size()) {
            const char e = s[++j];
            switch (e) {
              case 'n': v += '\n'; break;
              case 't': v += '\t'; break;
              case 'r': v += '\r'; break;
              case '\\': v += '\\'; break;
              case '\'': v += '\''; break;
              case '"': v += '"'; break;
              default: v += '\\'; v += e;  // Python keeps unknown escapes as written
            }
          } else {
            v += s[j];
          }
        }
        out.push_back({Tok::String, std::move(v), l, c});
        advance(j + 1 - i);
      } else {
        static const char* ops[] = {"**", "//", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{", "}", ".", ",",
                                    ":", "|", "~", "+", "-", "*", "/", "%", "<", ">", "="};
        bool found = false;
        for (const char* op : ops) {
          const size_t n = std::char_traits<char>::length(op);
          if (s.compare(i, n, op) == 0) {
            out.push_back({Tok::Op, op, l, c});
            advance(n);
            found = true;
            break;
          }
        }
        if (!found) fail(std::string("unexpected character '") + ch + "' in a tag");
      }
    }
  }

  void run() {
    size_t text_start = 0;
    int tl = 1, tc = 1;
    while (i < s.size()) {
      const size_t open = s.find('{', i);
      if (open == std::string::npos || open + 1 >= s.size()) break;
      const char k = s[open + 1];
      if (k != '{' && k != '%' && k != '#') {
        advance(open + 1 - i);
        continue;
      }
      const bool dash = open + 2 < s.size() && s[open + 2] == '-';
      const bool plus = open + 2 < s.size() && s[open + 2] == '+';
      emit_text(text_start, open, tl, tc, dash, k != '{' && !plus);
      advance(open - i);
      const int l = line, c = col;
      advance(dash || plus ? 3 : 2);
      if (k == '#') {
        const size_t e = s.find("#}", i);
        if (e == std::string::npos) fail("unterminated comment: expected '#}'");
        const bool dash_close = e > i && s[e - 1] == '-';
        advance(e + 2 - i);
        strip_next_text = dash_close;
        trim_newline = !dash_close;
      } else {
        out.push_back({k == '{' ? Tok::VarBegin : Tok::BlockBegin, k == '{' ? "{{" : "{%", l, c});
        lex_expr(k == '{' ? "}}" : "%}", k == '{' ? Tok::VarEnd : Tok::BlockEnd);
      }
      text_start = i;
      tl = line, tc = col;
    }
    advance(s.size() - i);
    emit_text(text_start, s.size(), tl, tc, false, false);
    out.push_back({Tok::End, "", line, col});
  }
};

}  // namespace

std::vector<Token> lex(const std::string& src) {
  Lexer lx{src};
  lx.run();
  return std::move(lx.out);
}

}  // namespace kvpack::jinja
