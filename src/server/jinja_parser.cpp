// Recursive-descent parser with jinja2's operator precedence, lowest first:
//   a if c else b  <  or  <  and  <  not  <  comparisons / in / not in  <  + -  <  ~  <  * / // %  <  **
//   <  unary - +  <  postfix (.attr, [i], [a:b:c], (args)) and filters (|f) / tests (is t).
#include <algorithm>

#include "server/jinja_ast.h"
#include "server/jinja_lexer.h"

namespace kvpack::jinja {
namespace {

using NodeP = std::unique_ptr<Node>;

struct Parser {
  std::vector<Token> t;
  size_t p = 0;
  int max_depth;
  int depth = 0;

  const Token& cur() const { return t[p]; }
  [[noreturn]] void fail(const std::string& m) const { throw Error(cur().line, cur().col, m); }
  [[noreturn]] void fail_at(const Token& k, const std::string& m) const { throw Error(k.line, k.col, m); }

  bool is_op(const char* op) const { return cur().kind == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().kind == Tok::Name && cur().text == n; }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    ++p;
    return true;
  }
  bool accept_name(const char* n) {
    if (!is_name(n)) return false;
    ++p;
    return true;
  }
  std::string describe(const Token& k) const {
    switch (k.kind) {
      case Tok::End: return "end of template";
      case Tok::Text: return "text";
      case Tok::String: return "string '" + k.text + "'";
      default: return "'" + k.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) fail(std::string("expected '") + op + "', found " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().kind != Tok::Name) fail("expected a name, found " + describe(cur()));
    return t[p++].text;
  }
  void expect_block_end() {
    if (cur().kind != Tok::BlockEnd) fail("expected '%}', found " + describe(cur()));
    ++p;
  }

  NodeP node(NodeKind k, const Token& at) {
    auto n = std::make_unique<Node>();
    n->kind = k;
    n->line = at.line;
    n->col = at.col;
    return n;
  }

  struct DepthGuard {
    Parser& ps;
    explicit DepthGuard(Parser& x) : ps(x) {
      if (++ps.depth > ps.max_depth) ps.fail("template nests deeper than " + std::to_string(ps.max_depth) + " levels");
    }
    ~DepthGuard() { --ps.depth; }
  };

  // ---- statements ----

  // Parses statements until a block tag whose keyword is one of `stops` (left unconsumed: p points at
  // the keyword) or the end of the template (allowed only when stops is empty).
  NodeP body(std::initializer_list<const char*> stops) {
    DepthGuard g(*this);
    auto b = node(NodeKind::Body, cur());
    for (;;) {
      const Token& k = cur();
      if (k.kind == Tok::End) {
        if (stops.size() == 0) return b;
        std::string want;
        for (const char* s : stops) want += (want.empty() ? "" : " or ") + std::string("'{% ") + s + " %}'";
        fail("unexpected end of template: expected " + want);
      }
      if (k.kind == Tok::Text) {
        auto n = node(NodeKind::Text, k);
        n->str = k.text;
        ++p;
        b->children.push_back(std::move(n));
      } else if (k.kind == Tok::VarBegin) {
        ++p;
        auto n = node(NodeKind::Output, k);
        n->a = expr();
        if (cur().kind != Tok::VarEnd) fail("expected '}}', found " + describe(cur()));
        ++p;
        b->children.push_back(std::move(n));
      } else if (k.kind == Tok::BlockBegin) {
        ++p;
        const Token& kw = cur();
        if (kw.kind != Tok::Name) fail("expected a tag name after '{%', found " + describe(kw));
        for (const char* s : stops)
          if (kw.text == s) return b;
        if (kw.text == "if") b->children.push_back(if_stmt());
        else if (kw.text == "for") b->children.push_back(for_stmt());
        else if (kw.text == "set") b->children.push_back(set_stmt());
        else if (kw.text == "generation" || kw.text == "endgeneration") {  // HF's training-mask marker: no output
          ++p;
          expect_block_end();
        } else fail_at(kw, "unsupported or unexpected tag '" + kw.text + "'");
      } else {
        fail("unexpected " + describe(k));
      }
    }
  }

  NodeP if_stmt() {
    auto n = node(NodeKind::If, cur());
    ++p;  // if
    n->children.push_back(expr());
    expect_block_end();
    for (;;) {
      n->children.push_back(body({"elif", "else", "endif"}));
      const std::string kw = t[p++].text;
      if (kw == "elif") {
        n->children.push_back(expr());
        expect_block_end();
      } else if (kw == "else") {
        expect_block_end();
        n->children.push_back(body({"endif"}));
        ++p;
        expect_block_end();
        return n;
      } else {
        expect_block_end();
        return n;
      }
    }
  }

  NodeP for_stmt() {
    auto n = node(NodeKind::For, cur());
    ++p;  // for
    n->names.push_back(expect_name());
    while (accept_op(",")) n->names.push_back(expect_name());
    if (!accept_name("in")) fail("expected 'in' in a for loop, found " + describe(cur()));
    n->a = or_expr();  // not a full expression: "if" here starts the loop filter
    if (accept_name("if")) n->b = or_expr();
    if (accept_name("recursive")) fail_at(t[p - 1], "recursive loops are not supported");
    expect_block_end();
    n->children.push_back(body({"else", "endfor"}));
    if (t[p++].text == "else") {
      expect_block_end();
      n->children.push_back(body({"endfor"}));
      ++p;
    }
    expect_block_end();
    return n;
  }

  NodeP set_stmt() {
    auto n = node(NodeKind::Set, cur());
    ++p;  // set
    n->str = expect_name();
    if (accept_op(".")) n->attr = expect_name();
    if (!is_op("=")) fail(cur().kind == Tok::BlockEnd ? "block form '{% set x %}...{% endset %}' is not supported"
                                                       : "expected '=' in set, found " + describe(cur()));
    ++p;
    n->a = expr();
    expect_block_end();
    return n;
  }

  // ---- expressions ----

  NodeP expr() {
    DepthGuard g(*this);
    NodeP v = or_expr();
    if (is_name("if")) {
      auto n = node(NodeKind::Ternary, cur());
      ++p;
      n->a = std::move(v);
      n->b = or_expr();
      if (accept_name("else")) n->children.push_back(expr());
      return n;
    }
    return v;
  }

  NodeP binary(const Token& at, std::string op, NodeP l, NodeP r) {
    auto n = node(NodeKind::Binary, at);
    n->str = std::move(op);
    n->a = std::move(l);
    n->b = std::move(r);
    return measured(std::move(n));
  }

  // Operator chains (a + b + c ..., x.y.z, x|f|g) are built in loops, not by recursion, so the parser's
  // depth guard does not see them: their height is checked here instead.
  NodeP measured(NodeP n) {
    int h = 0;
    if (n->a) h = std::max(h, n->a->height);
    if (n->b) h = std::max(h, n->b->height);
    for (const auto& c : n->children)
      if (c) h = std::max(h, c->height);
    for (const auto& kv : n->kwargs) h = std::max(h, kv.second->height);
    n->height = h + 1;
    if (n->height > max_depth)
      throw Error(n->line, n->col, "expression nests deeper than " + std::to_string(max_depth) + " levels");
    return n;
  }

  NodeP or_expr() {
    NodeP l = and_expr();
    while (is_name("or")) {
      const Token at = t[p++];
      l = binary(at, "or", std::move(l), and_expr());
    }
    return l;
  }
  NodeP and_expr() {
    NodeP l = not_expr();
    while (is_name("and")) {
      const Token at = t[p++];
      l = binary(at, "and", std::move(l), not_expr());
    }
    return l;
  }
  NodeP not_expr() {
    if (is_name("not")) {
      DepthGuard g(*this);
      auto n = node(NodeKind::Unary, cur());
      ++p;
      n->str = "not";
      n->a = not_expr();
      return n;
    }
    return compare();
  }
  NodeP compare() {
    NodeP l = add();
    for (;;) {
      const Token at = cur();
      std::string op;
      if (at.kind == Tok::Op && (at.text == "==" || at.text == "!=" || at.text == "<" || at.text == ">" ||
                                 at.text == "<=" || at.text == ">=")) {
        op = at.text;
        ++p;
      } else if (is_name("in")) {
        op = "in";
        ++p;
      } else if (is_name("not") && t[p + 1].kind == Tok::Name && t[p + 1].text == "in") {
        op = "not in";
        p += 2;
      } else {
        return l;
      }
      l = binary(at, op, std::move(l), add());
    }
  }
  NodeP add() {
    NodeP l = concat();
    while (is_op("+") || is_op("-")) {
      const Token at = t[p++];
      l = binary(at, at.text, std::move(l), concat());
    }
    return l;
  }
  NodeP concat() {
    NodeP l = mul();
    while (is_op("~")) {
      const Token at = t[p++];
      l = binary(at, "~", std::move(l), mul());
    }
    return l;
  }
  NodeP mul() {
    NodeP l = pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token at = t[p++];
      l = binary(at, at.text, std::move(l), pow());
    }
    return l;
  }
  NodeP pow() {
    NodeP l = unary();
    while (is_op("**")) {
      const Token at = t[p++];
      l = binary(at, "**", std::move(l), unary());
    }
    return l;
  }
  NodeP unary() {
    if (is_op("-") || is_op("+")) {
      DepthGuard g(*this);
      auto n = node(NodeKind::Unary, cur());
      n->str = t[p++].text;
      n->a = unary();
      return filters(measured(std::move(n)));
    }
    return filters(postfix(primary()));
  }

  void call_args(Node& n) {  // after "(": positional and keyword arguments up to ")"
    while (!accept_op(")")) {
      if (cur().kind == Tok::Name && t[p + 1].kind == Tok::Op && t[p + 1].text == "=") {
        std::string k = t[p].text;
        p += 2;
        n.kwargs.emplace_back(std::move(k), expr());
      } else {
        if (!n.kwargs.empty()) fail("positional argument after a keyword argument");
        n.children.push_back(expr());
      }
      if (!is_op(")")) expect_op(",");
    }
  }

  NodeP filters(NodeP v) {
    for (;;) {
      if (is_op("|")) {
        ++p;
        auto n = node(NodeKind::Filter, cur());
        n->str = expect_name();
        n->a = std::move(v);
        if (accept_op("(")) call_args(*n);
        v = postfix(measured(std::move(n)));
      } else if (is_name("is")) {
        ++p;
        auto n = node(NodeKind::Test, cur());
        n->negate = accept_name("not");
        n->str = expect_name();
        n->a = std::move(v);
        if (accept_op("(")) call_args(*n);
        else if (cur().kind == Tok::String || cur().kind == Tok::Int || cur().kind == Tok::Float ||
                 (cur().kind == Tok::Name && (cur().text == "none" || cur().text == "true" || cur().text == "false")))
          n->children.push_back(primary());  // "x is sameas none", "x is divisibleby 3"
        v = measured(std::move(n));
      } else {
        return v;
      }
    }
  }

  NodeP postfix(NodeP v) {
    for (;;) {
      const Token at = cur();
      if (accept_op(".")) {
        auto n = node(NodeKind::Attr, at);
        if (cur().kind == Tok::Int) n->str = t[p++].text;  // x.0 is x[0]
        else n->str = expect_name();
        n->a = std::move(v);
        v = measured(std::move(n));
      } else if (accept_op("[")) {
        NodeP first;
        if (!is_op(":")) first = expr();
        if (accept_op("]")) {
          auto n = node(NodeKind::Index, at);
          n->a = std::move(v);
          n->b = std::move(first);
          v = measured(std::move(n));
          continue;
        }
        auto n = node(NodeKind::Slice, at);
        n->a = std::move(v);
        n->children.push_back(std::move(first));
        for (int part = 0; part < 2; ++part) {
          if (is_op("]")) {
            n->children.push_back(nullptr);
            continue;
          }
          expect_op(":");
          n->children.push_back(is_op(":") || is_op("]") ? nullptr : expr());
        }
        expect_op("]");
        v = measured(std::move(n));
      } else if (accept_op("(")) {
        auto n = node(NodeKind::Call, at);
        n->a = std::move(v);
        call_args(*n);
        v = measured(std::move(n));
      } else {
        return v;
      }
    }
  }

  NodeP primary() {
    DepthGuard g(*this);
    const Token k = cur();
    switch (k.kind) {
      case Tok::String: {
        auto n = node(NodeKind::Literal, k);
        std::string s;
        while (cur().kind == Tok::String) s += t[p++].text;  // adjacent literals concatenate
        n->value = s;
        return n;
      }
      case Tok::Int: {
        auto n = node(NodeKind::Literal, k);
        ++p;
        try {
          n->value = std::stoll(k.text);
        } catch (const std::exception&) {
          fail_at(k, "integer literal out of range");
        }
        return n;
      }
      case Tok::Float: {
        auto n = node(NodeKind::Literal, k);
        ++p;
        n->value = std::stod(k.text);
        return n;
      }
      case Tok::Name: {
        ++p;
        auto n = node(NodeKind::Literal, k);
        if (k.text == "true" || k.text == "True") n->value = true;
        else if (k.text == "false" || k.text == "False") n->value = false;
        else if (k.text == "none" || k.text == "None") n->value = nullptr;
        else {
          n->kind = NodeKind::Name;
          n->str = k.text;
        }
        return n;
      }
      case Tok::Op:
        if (k.text == "(") {
          ++p;
          NodeP first = expr();
          if (accept_op(")")) return first;
          auto n = node(NodeKind::List, k);  // a tuple: evaluated as a list
          n->children.push_back(std::move(first));
          while (accept_op(",")) {
            if (is_op(")")) break;
            n->children.push_back(expr());
          }
          expect_op(")");
          return n;
        }
        if (k.text == "[") {
          ++p;
          auto n = node(NodeKind::List, k);
          while (!accept_op("]")) {
            n->children.push_back(expr());
            if (!is_op("]")) expect_op(",");
          }
          return n;
        }
        if (k.text == "{") {
          ++p;
          auto n = node(NodeKind::Dict, k);
          while (!accept_op("}")) {
            n->children.push_back(expr());
            expect_op(":");
            n->children.push_back(expr());
            if (!is_op("}")) expect_op(",");
          }
          return n;
        }
        break;
      default: break;
    }
    fail("expected an expression, found " + describe(k));
  }
};

}  // namespace

std::unique_ptr<Node> parse(const std::string& source, int max_depth) {
  Parser ps{lex(source), 0, max_depth};
  return ps.body({});
}

}  // namespace kvpack::jinja
