// Jinja syntax tree: one node type for expressions and statements (the evaluator switches on kind).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "server/jinja.h"

namespace kvpack::jinja {

enum class NodeKind {
  // statements
  Body,    // children: statements in order
  Text,    // str: literal text
  Output,  // a: the expression to print
  If,      // children: condition, body, condition, body, ... [, else body] (odd count: last is else)
  For,     // names: loop targets; a: iterable; b: filter condition (optional); children[0]: body,
           // children[1]: else body (optional)
  Set,     // str: variable; attr: namespace attribute (optional); a: value
  // expressions
  Literal,    // value
  Name,       // str
  List,       // children
  Dict,       // children: key, value, key, value, ...
  Attr,       // a: object; str: attribute
  Index,      // a: object; b: index
  Slice,      // a: object; children: start, stop, step (each may be null)
  Call,       // a: callee (Name or Attr); children: positional; kwargs
  Filter,     // str: filter name; a: operand; children: arguments; kwargs
  Test,       // str: test name; a: operand; children: arguments; negate
  Unary,      // str: "not" / "-" / "+"; a
  Binary,     // str: operator ("and", "or", "==", "in", "not in", "~", "+", ...); a, b
  Ternary,    // a: value if true; b: condition; children[0]: value if false (optional)
};

struct Node {
  NodeKind kind;
  int line = 0, col = 0;
  int height = 1;  // longest chain of operands below: bounds evaluation (and destruction) recursion
  std::string str;
  std::string attr;
  bool negate = false;
  Value value;
  std::vector<std::string> names;
  std::unique_ptr<Node> a, b;
  std::vector<std::unique_ptr<Node>> children;
  std::vector<std::pair<std::string, std::unique_ptr<Node>>> kwargs;
};

// Throws Error naming the position of the first token it cannot use.
std::unique_ptr<Node> parse(const std::string& source, int max_depth);

}  // namespace kvpack::jinja
