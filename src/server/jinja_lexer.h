// Jinja lexer: template text → a flat token stream (text runs, tag delimiters, expression tokens).
// Whitespace control is applied here: "-" on a tag strips the adjacent whitespace, and, as in
// apply_chat_template's environment, trim_blocks (drop the newline after a block/comment tag) and
// lstrip_blocks (drop the indentation before one; "+" opts out) are on.
#pragma once
#include <string>
#include <vector>

namespace kvpack::jinja {

enum class Tok {
  Text,        // literal template text
  VarBegin,    // {{
  VarEnd,      // }}
  BlockBegin,  // {%
  BlockEnd,    // %}
  Name,
  String,      // text holds the unescaped value
  Int,
  Float,
  Op,          // punctuation / operator, text holds it
  End,
};

struct Token {
  Tok kind;
  std::string text;
  int line, col;
};

// Throws Error on an unterminated tag, string or comment, or a character no expression can hold.
std::vector<Token> lex(const std::string& src);

}  // namespace kvpack::jinja
