// Evaluator: walks the tree over Values with jinja2's scoping (a for loop's body is its own scope, so
// `set` inside a loop does not leak out; namespace() objects are how templates carry state out).
// Every evaluation step, loop iteration and output byte is counted against Limits.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>

#include "server/jinja_ast.h"
#include "server/jinja_value.h"

namespace kvpack::jinja {

Error::Error(int l, int c, const std::string& msg)
    : std::runtime_error("line " + std::to_string(l) + ", column " + std::to_string(c) + ": " + msg),
      line(l), col(c), message(msg) {}

namespace {

struct Eval {
  const Limits& lim;
  std::vector<std::map<std::string, Value>> scopes;
  std::string out;
  size_t steps = 0, iterations = 0;
  int depth = 0;

  [[noreturn]] static void fail(const Node& n, const std::string& m) { throw Error(n.line, n.col, m); }

  struct Depth {
    Eval& e;
    Depth(Eval& x, const Node& n) : e(x) {
      if (++e.depth > e.lim.max_depth) fail(n, "evaluation nests deeper than " + std::to_string(e.lim.max_depth));
      if (++e.steps > e.lim.max_steps) fail(n, "template exceeds " + std::to_string(e.lim.max_steps) + " evaluation steps");
    }
    ~Depth() { --e.depth; }
  };

  void emit(const Node& n, const std::string& s) {
    if (out.size() + s.size() > lim.max_output_bytes)
      fail(n, "output exceeds " + std::to_string(lim.max_output_bytes) + " bytes");
    out += s;
  }
  void count_iteration(const Node& n) {
    if (++iterations > lim.max_loop_iterations)
      fail(n, "loops exceed " + std::to_string(lim.max_loop_iterations) + " iterations");
  }

  Value* lookup(const std::string& name) {
    for (auto it = scopes.rbegin(); it != scopes.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return &f->second;
    }
    return nullptr;
  }

  // ---- statements ----

  void exec(const Node& n) {
    Depth d(*this, n);
    switch (n.kind) {
      case NodeKind::Body:
        for (const auto& c : n.children) exec(*c);
        return;
      case NodeKind::Text: emit(n, n.str); return;
      case NodeKind::Output: emit(n, to_str(eval(*n.a))); return;
      case NodeKind::If: {
        size_t i = 0;
        for (; i + 1 < n.children.size(); i += 2)
          if (truthy(eval(*n.children[i]))) return exec(*n.children[i + 1]);
        if (i < n.children.size()) exec(*n.children[i]);
        return;
      }
      case NodeKind::For: return exec_for(n);
      case NodeKind::Set: {
        Value v = eval(*n.a);
        if (n.attr.empty()) {
          scopes.back()[n.str] = std::move(v);
          return;
        }
        Value* ns = lookup(n.str);
        if (!ns || !ns->is_object()) fail(n, "'" + n.str + "' is not a namespace: cannot set '" + n.str + "." + n.attr + "'");
        (*ns)[n.attr] = std::move(v);
        return;
      }
      default: fail(n, "internal: not a statement");
    }
  }

  Value iterable(const Node& at, const Value& v) {
    if (v.is_array()) return v;
    if (is_undefined(v)) return Value::array();
    if (v.is_object()) {
      Value keys = Value::array();
      for (auto it = v.begin(); it != v.end(); ++it) keys.push_back(it.key());
      return keys;
    }
    if (v.is_string()) {
      Value a = Value::array();
      for (auto& c : code_points(v.get<std::string>())) a.push_back(c);
      return a;
    }
    fail(at, std::string("cannot iterate over a ") + type_name(v));
  }

  void bind_targets(const Node& n, const Value& item) {
    if (n.names.size() == 1) {
      scopes.back()[n.names[0]] = item;
      return;
    }
    if (!item.is_array() || item.size() != n.names.size())
      fail(n, "cannot unpack " + std::string(type_name(item)) + " into " + std::to_string(n.names.size()) + " loop variables");
    for (size_t i = 0; i < n.names.size(); ++i) scopes.back()[n.names[i]] = item[i];
  }

  void exec_for(const Node& n) {
    const Value all = iterable(*n.a, eval(*n.a));
    scopes.emplace_back();
    Value items = Value::array();
    if (n.b) {  // the loop filter decides which items the loop (and loop.length) sees
      for (const auto& x : all) {
        count_iteration(n);
        bind_targets(n, x);
        if (truthy(eval(*n.b))) items.push_back(x);
      }
    } else {
      items = all;
    }
    const size_t len = items.size();
    for (size_t i = 0; i < len; ++i) {
      count_iteration(n);
      bind_targets(n, items[i]);
      Value loop = Value::object();
      loop["index0"] = i;
      loop["index"] = i + 1;
      loop["revindex0"] = len - 1 - i;
      loop["revindex"] = len - i;
      loop["first"] = i == 0;
      loop["last"] = i + 1 == len;
      loop["length"] = len;
      loop["previtem"] = i > 0 ? items[i - 1] : undefined();
      loop["nextitem"] = i + 1 < len ? items[i + 1] : undefined();
      scopes.back()["loop"] = std::move(loop);
      exec(*n.children[0]);
    }
    scopes.pop_back();
    if (len == 0 && n.children.size() > 1) exec(*n.children[1]);
  }

  // ---- expressions ----

  std::vector<Value> args(const Node& n) {
    std::vector<Value> a;
    for (const auto& c : n.children) a.push_back(eval(*c));
    return a;
  }
  const Value* kwarg(const Node& n, const char* name, std::map<std::string, Value>& cache) {
    for (const auto& [k, v] : n.kwargs)
      if (k == name) return &(cache[k] = eval(*v));
    return nullptr;
  }
  // Positional argument i, else keyword `name`, else nullptr.
  struct Args {
    std::vector<Value> pos;
    std::map<std::string, Value> kw;
    const Value* get(size_t i, const char* name) const {
      if (i < pos.size()) return &pos[i];
      auto f = kw.find(name);
      return f == kw.end() ? nullptr : &f->second;
    }
  };
  Args all_args(const Node& n) {
    Args a;
    a.pos = args(n);
    for (const auto& [k, v] : n.kwargs) a.kw[k] = eval(*v);
    return a;
  }
  static std::string str_arg(const Node& n, const Value* v, const std::string& what) {
    if (!v || !v->is_string()) fail(n, what + " must be a string");
    return v->get<std::string>();
  }

  Value eval(const Node& n) {
    Depth d(*this, n);
    switch (n.kind) {
      case NodeKind::Literal: return n.value;
      case NodeKind::Name: {
        const Value* v = lookup(n.str);
        return v ? *v : undefined();
      }
      case NodeKind::List: {
        Value a = Value::array();
        for (const auto& c : n.children) a.push_back(eval(*c));
        return a;
      }
      case NodeKind::Dict: {
        Value o = Value::object();
        for (size_t i = 0; i + 1 < n.children.size(); i += 2) {
          const Value k = eval(*n.children[i]);
          o[k.is_string() ? k.get<std::string>() : to_str(k)] = eval(*n.children[i + 1]);
        }
        return o;
      }
      case NodeKind::Attr: {
        const Value o = eval(*n.a);
        if (is_undefined(o)) fail(n, "cannot read '." + n.str + "' of an undefined value");
        if (o.is_object()) {
          auto f = o.find(n.str);
          return f == o.end() ? undefined() : *f;
        }
        if (o.is_array() && !n.str.empty() && std::isdigit(static_cast<unsigned char>(n.str[0])))
          return index(n, o, Value(std::stoll(n.str)));
        return undefined();
      }
      case NodeKind::Index: return index(n, eval(*n.a), eval(*n.b));
      case NodeKind::Slice: return slice(n);
      case NodeKind::Call: return call(n);
      case NodeKind::Filter: return filter(n);
      case NodeKind::Test: {
        const bool r = test(n, eval(*n.a), n.str, args(n));
        return n.negate ? !r : r;
      }
      case NodeKind::Unary: {
        const Value v = eval(*n.a);
        if (n.str == "not") return !truthy(v);
        if (!v.is_number()) fail(n, std::string("unary ") + n.str + " needs a number, not a " + type_name(v));
        if (n.str == "+") return v;
        return v.is_number_float() ? Value(-v.get<double>()) : Value(-v.get<int64_t>());
      }
      case NodeKind::Binary: return binary(n);
      case NodeKind::Ternary:
        if (truthy(eval(*n.b))) return eval(*n.a);
        return n.children.empty() ? undefined() : eval(*n.children[0]);
      default: fail(n, "internal: not an expression");
    }
  }

  Value index(const Node& n, const Value& o, const Value& i) {
    if (is_undefined(o)) fail(n, "cannot index an undefined value");
    if (o.is_object()) {
      if (!i.is_string()) return undefined();
      auto f = o.find(i.get<std::string>());
      return f == o.end() ? undefined() : *f;
    }
    if (o.is_array() || o.is_string()) {
      if (!i.is_number_integer()) fail(n, "a list or string index must be an integer");
      const auto cps = o.is_string() ? code_points(o.get<std::string>()) : std::vector<std::string>{};
      const int64_t len = o.is_string() ? static_cast<int64_t>(cps.size()) : static_cast<int64_t>(o.size());
      int64_t k = i.get<int64_t>();
      if (k < 0) k += len;
      if (k < 0 || k >= len) return undefined();
      return o.is_string() ? Value(cps[k]) : o[static_cast<size_t>(k)];
    }
    fail(n, std::string("cannot index a ") + type_name(o));
  }

  Value slice(const Node& n) {
    const Value o = eval(*n.a);
    auto part = [&](int k) -> std::pair<bool, int64_t> {
      if (!n.children[k]) return {false, 0};
      const Value v = eval(*n.children[k]);
      if (v.is_null()) return {false, 0};
      if (!v.is_number_integer()) fail(n, "slice bounds must be integers");
      return {true, v.get<int64_t>()};
    };
    const auto [has_start, start0] = part(0);
    const auto [has_stop, stop0] = part(1);
    const auto [has_step, step0] = part(2);
    const int64_t step = has_step ? step0 : 1;
    if (step == 0) fail(n, "slice step cannot be zero");
    std::vector<Value> items;
    if (o.is_string()) for (auto& c : code_points(o.get<std::string>())) items.emplace_back(c);
    else if (o.is_array()) for (const auto& x : o) items.push_back(x);
    else fail(n, std::string("cannot slice a ") + type_name(o));
    const int64_t len = static_cast<int64_t>(items.size());
    auto clamp = [&](bool has, int64_t v, int64_t dflt) {  // Python's slice.indices
      if (!has) return dflt;
      if (v < 0) v += len;
      if (step > 0) return std::clamp<int64_t>(v, 0, len);
      return std::clamp<int64_t>(v, -1, len - 1);
    };
    const int64_t start = clamp(has_start, start0, step > 0 ? 0 : len - 1);
    const int64_t stop = clamp(has_stop, stop0, step > 0 ? len : -1);
    Value r = o.is_string() ? Value("") : Value::array();
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (o.is_string()) r.get_ref<std::string&>() += items[i].get<std::string>();
      else r.push_back(items[i]);
    }
    return r;
  }

  Value binary(const Node& n) {
    const std::string& op = n.str;
    if (op == "and") {
      Value l = eval(*n.a);
      return truthy(l) ? eval(*n.b) : l;
    }
    if (op == "or") {
      Value l = eval(*n.a);
      return truthy(l) ? l : eval(*n.b);
    }
    const Value l = eval(*n.a), r = eval(*n.b);
    if (op == "~") return to_str(l) + to_str(r);
    if (op == "==") return equals(l, r);
    if (op == "!=") return !equals(l, r);
    if (op == "in" || op == "not in") {
      bool found = false;
      if (r.is_string()) {
        if (!l.is_string()) fail(n, "'in <string>' needs a string on the left");
        found = r.get_ref<const std::string&>().find(l.get<std::string>()) != std::string::npos;
      } else if (r.is_array()) {
        found = std::any_of(r.begin(), r.end(), [&](const Value& x) { return equals(x, l); });
      } else if (r.is_object()) {
        found = l.is_string() && r.contains(l.get<std::string>());
      } else if (!is_undefined(r)) {
        fail(n, std::string("cannot test membership in a ") + type_name(r));
      }
      return op == "in" ? found : !found;
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      try {
        if (op == "<") return less(l, r);
        if (op == ">") return less(r, l);
        if (op == "<=") return !less(r, l);
        return !less(l, r);
      } catch (const std::invalid_argument& e) {
        fail(n, e.what());
      }
    }
    if (op == "+") {
      if (l.is_string() && r.is_string()) return l.get<std::string>() + r.get<std::string>();
      if (l.is_array() && r.is_array()) {
        Value a = l;
        for (const auto& x : r) a.push_back(x);
        return a;
      }
    }
    if (op == "*" && l.is_string() && r.is_number_integer()) {
      const int64_t k = r.get<int64_t>();
      if (k > 0 && l.get_ref<const std::string&>().size() * static_cast<size_t>(k) > lim.max_output_bytes)
        fail(n, "string repetition exceeds the output limit");
      std::string s;
      for (int64_t i = 0; i < k; ++i) s += l.get<std::string>();
      return s;
    }
    if (!(l.is_number() || l.is_boolean()) || !(r.is_number() || r.is_boolean()))
      fail(n, "unsupported operand types for " + op + ": " + type_name(l) + " and " + type_name(r));
    const bool ints = !l.is_number_float() && !r.is_number_float();
    const double a = l.is_boolean() ? l.get<bool>() : l.get<double>(), b = r.is_boolean() ? r.get<bool>() : r.get<double>();
    if ((op == "/" || op == "//" || op == "%") && b == 0) fail(n, "division by zero");
    if (ints && op != "/" && op != "**") {
      const int64_t x = l.is_boolean() ? l.get<bool>() : l.get<int64_t>(), y = r.is_boolean() ? r.get<bool>() : r.get<int64_t>();
      if (op == "+") return x + y;
      if (op == "-") return x - y;
      if (op == "*") return x * y;
      const int64_t q = x / y - ((x % y != 0) && ((x < 0) != (y < 0)));  // Python floors
      if (op == "//") return q;
      if (op == "%") return x - q * y;
    }
    if (op == "+") return a + b;
    if (op == "-") return a - b;
    if (op == "*") return a * b;
    if (op == "/") return a / b;
    if (op == "//") return std::floor(a / b);
    if (op == "%") return a - std::floor(a / b) * b;
    if (op == "**") {
      const double p = std::pow(a, b);
      if (ints && b >= 0 && std::fabs(p) < 9e15) return static_cast<int64_t>(p);
      return p;
    }
    fail(n, "unknown operator " + op);
  }

  // ---- calls: globals and methods ----

  Value call(const Node& n) {
    const Node& f = *n.a;
    if (f.kind == NodeKind::Name && !lookup(f.str)) {
      Args a = all_args(n);
      if (f.str == "raise_exception") {
        const Value* m = a.get(0, "message");
        throw RaisedError(n.line, n.col, m ? to_str(*m) : "raise_exception() called");
      }
      if (f.str == "namespace" || f.str == "dict") {
        Value o = Value::object();
        for (const auto& [k, v] : n.kwargs) o[k] = a.kw[k];
        return o;
      }
      if (f.str == "range") {
        int64_t lo = 0, hi = 0, st = 1;
        for (const auto& v : a.pos)
          if (!v.is_number_integer()) fail(n, "range() takes integers");
        if (a.pos.size() == 1) hi = a.pos[0].get<int64_t>();
        else if (a.pos.size() >= 2) lo = a.pos[0].get<int64_t>(), hi = a.pos[1].get<int64_t>();
        if (a.pos.size() == 3) st = a.pos[2].get<int64_t>();
        if (st == 0) fail(n, "range() step cannot be zero");
        Value r = Value::array();
        for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) {
          count_iteration(n);
          r.push_back(i);
        }
        return r;
      }
      if (f.str == "strftime_now") {  // HF passes this global; the Llama 3.x templates print today's date
        const std::string fmt = str_arg(n, a.get(0, "format"), "strftime_now's format");
        const std::time_t t = std::time(nullptr);
        std::tm tm{};
        localtime_r(&t, &tm);
        char buf[256];
        const size_t len = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
        return std::string(buf, len);
      }
      fail(f, "unknown function '" + f.str + "'");
    }
    if (f.kind != NodeKind::Attr) fail(n, "only functions and methods can be called");
    const Value o = eval(*f.a);
    Args a = all_args(n);
    return method(n, o, f.str, a);
  }

  static std::string strip_chars(const std::string& s, const std::string& chars, bool left, bool right) {
    size_t b = 0, e = s.size();
    if (left) while (b < e && chars.find(s[b]) != std::string::npos) ++b;
    if (right) while (e > b && chars.find(s[e - 1]) != std::string::npos) --e;
    return s.substr(b, e - b);
  }
  static std::string replace_all(std::string s, const std::string& from, const std::string& to, int64_t count) {
    if (from.empty()) return s;  // Python inserts between characters; no chat template relies on that
    std::string r;
    size_t pos = 0;
    for (int64_t k = 0; count < 0 || k < count; ++k) {
      const size_t f = s.find(from, pos);
      if (f == std::string::npos) break;
      r.append(s, pos, f - pos);
      r += to;
      pos = f + from.size();
    }
    r.append(s, pos);
    return r;
  }
  static std::string case_map(const std::string& s, bool upper) {
    std::string r = s;
    for (char& c : r)
      if (static_cast<unsigned char>(c) < 0x80) c = static_cast<char>(upper ? std::toupper(c) : std::tolower(c));
    return r;
  }

  Value method(const Node& n, const Value& o, const std::string& m, const Args& a) {
    if (o.is_string()) {
      const std::string& s = o.get_ref<const std::string&>();
      static const std::string ws = " \t\n\r\f\v";
      if (m == "strip" || m == "lstrip" || m == "rstrip") {
        const Value* c = a.get(0, "chars");
        const std::string chars = c && !c->is_null() ? str_arg(n, c, "strip's chars") : ws;
        return strip_chars(s, chars, m != "rstrip", m != "lstrip");
      }
      if (m == "startswith" || m == "endswith") {
        const Value* p = a.get(0, "prefix");
        if (!p) fail(n, m + "() needs an argument");
        std::vector<std::string> opts;
        if (p->is_array()) for (const auto& x : *p) opts.push_back(str_arg(n, &x, m + "'s argument"));
        else opts.push_back(str_arg(n, p, m + "'s argument"));
        for (const auto& x : opts)
          if (m == "startswith" ? s.starts_with(x) : s.ends_with(x)) return true;
        return false;
      }
      if (m == "split" || m == "rsplit") {
        const Value* sep = a.get(0, "sep");
        const Value* mx = a.get(1, "maxsplit");
        const int64_t maxsplit = mx && mx->is_number_integer() ? mx->get<int64_t>() : -1;
        Value r = Value::array();
        if (!sep || sep->is_null()) {  // runs of whitespace, no empty parts
          size_t i = 0;
          int64_t splits = 0;
          while (i < s.size()) {
            while (i < s.size() && ws.find(s[i]) != std::string::npos) ++i;
            if (i >= s.size()) break;
            if (maxsplit >= 0 && splits == maxsplit) {
              r.push_back(strip_chars(s.substr(i), ws, false, true));
              break;
            }
            size_t j = i;
            while (j < s.size() && ws.find(s[j]) == std::string::npos) ++j;
            r.push_back(s.substr(i, j - i));
            ++splits;
            i = j;
          }
          return r;
        }
        const std::string d = str_arg(n, sep, "split's separator");
        if (d.empty()) fail(n, "empty separator");
        if (m == "rsplit" && maxsplit >= 0) {
          std::vector<std::string> parts;
          size_t end = s.size();
          for (int64_t k = 0; k < maxsplit; ++k) {
            const size_t f = end >= d.size() ? s.rfind(d, end - d.size()) : std::string::npos;
            if (f == std::string::npos) break;
            parts.push_back(s.substr(f + d.size(), end - f - d.size()));
            end = f;
          }
          parts.push_back(s.substr(0, end));
          for (auto it = parts.rbegin(); it != parts.rend(); ++it) r.push_back(*it);
          return r;
        }
        size_t pos = 0;
        for (int64_t k = 0; maxsplit < 0 || k < maxsplit; ++k) {
          const size_t f = s.find(d, pos);
          if (f == std::string::npos) break;
          r.push_back(s.substr(pos, f - pos));
          pos = f + d.size();
        }
        r.push_back(s.substr(pos));
        return r;
      }
      if (m == "replace") {
        const Value* c = a.get(2, "count");
        return replace_all(s, str_arg(n, a.get(0, "old"), "replace's old"), str_arg(n, a.get(1, "new"), "replace's new"),
                           c && c->is_number_integer() ? c->get<int64_t>() : -1);
      }
      if (m == "upper" || m == "lower") return case_map(s, m == "upper");
      if (m == "capitalize") return s.empty() ? s : case_map(s.substr(0, 1), true) + case_map(s.substr(1), false);
      if (m == "title") {
        std::string r = s;
        bool start = true;
        for (char& c : r) {
          const bool alpha = std::isalpha(static_cast<unsigned char>(c));
          if (alpha) c = static_cast<char>(start ? std::toupper(c) : std::tolower(c));
          start = !alpha;
        }
        return r;
      }
      if (m == "find") {
        const size_t f = s.find(str_arg(n, a.get(0, "sub"), "find's argument"));
        return f == std::string::npos ? int64_t{-1} : static_cast<int64_t>(code_points(s.substr(0, f)).size());
      }
      if (m == "count") {
        const std::string sub = str_arg(n, a.get(0, "sub"), "count's argument");
        int64_t k = 0;
        for (size_t p = s.find(sub); !sub.empty() && p != std::string::npos; p = s.find(sub, p + sub.size())) ++k;
        return k;
      }
      if (m == "join") {
        const Value* xs = a.get(0, "iterable");
        if (!xs) fail(n, "join() needs a list");
        std::string r;
        bool first = true;
        for (const auto& x : iterable(n, *xs)) r += (first ? "" : s) + to_str(x), first = false;
        return r;
      }
    }
    if (o.is_object()) {
      if (m == "items") {
        Value r = Value::array();
        for (auto it = o.begin(); it != o.end(); ++it) r.push_back(Value::array({it.key(), it.value()}));
        return r;
      }
      if (m == "keys" || m == "values") {
        Value r = Value::array();
        for (auto it = o.begin(); it != o.end(); ++it) r.push_back(m == "keys" ? Value(it.key()) : it.value());
        return r;
      }
      if (m == "get") {
        const Value* k = a.get(0, "key");
        const Value* dflt = a.get(1, "default");
        if (k && k->is_string() && o.contains(k->get<std::string>())) return o[k->get<std::string>()];
        return dflt ? *dflt : Value(nullptr);
      }
    }
    if (is_undefined(o)) fail(n, "cannot call '." + m + "()' on an undefined value");
    fail(n, std::string("unknown method '") + m + "' of a " + type_name(o));
  }

  // ---- filters and tests ----

  Value attribute_of(const Node& n, const Value& x, const std::string& path) {
    Value v = x;
    size_t pos = 0;
    while (pos <= path.size()) {  // "a.b" walks nested mappings, as jinja2's attribute= does
      const size_t dot = path.find('.', pos);
      const std::string key = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
      v = v.is_object() && v.contains(key) ? v[key] : undefined();
      if (dot == std::string::npos) break;
      pos = dot + 1;
    }
    (void)n;
    return v;
  }

  Value filter(const Node& n) {
    const std::string& f = n.str;
    const Value v = eval(*n.a);
    Args a = all_args(n);
    if (f == "default" || f == "d") {
      const Value* dflt = a.get(0, "default_value");
      const Value* boolean = a.get(1, "boolean");
      const bool use = is_undefined(v) || (boolean && truthy(*boolean) && !truthy(v));
      return use ? (dflt ? *dflt : Value("")) : v;
    }
    if (f == "length" || f == "count") {
      if (v.is_string()) return static_cast<int64_t>(code_points(v.get<std::string>()).size());
      if (v.is_array() || v.is_object()) return static_cast<int64_t>(v.size());
      if (is_undefined(v)) return int64_t{0};
      fail(n, std::string("a ") + type_name(v) + " has no length");
    }
    if (f == "tojson") {
      const Value* ind = a.get(0, "indent");
      return to_json(v, ind && ind->is_number_integer() ? static_cast<int>(ind->get<int64_t>()) : -1);
    }
    if (f == "string") return to_str(v);
    if (f == "safe" || f == "e" || f == "escape") {  // autoescape is off for chat templates: text stays as is
      if (f != "safe") fail(n, "filter '" + f + "' is not supported");
      return v;
    }
    if (f == "list") return iterable(n, v);
    if (f == "first" || f == "last") {
      const Value xs = iterable(n, v);
      if (xs.empty()) return undefined();
      return f == "first" ? xs.front() : xs.back();
    }
    if (f == "reverse") {
      if (v.is_string()) {
        auto cps = code_points(v.get<std::string>());
        std::string r;
        for (auto it = cps.rbegin(); it != cps.rend(); ++it) r += *it;
        return r;
      }
      Value xs = iterable(n, v);
      std::reverse(xs.begin(), xs.end());
      return xs;
    }
    if (f == "join") {
      const Value* sep = a.get(0, "d");
      const Value* attr = a.get(1, "attribute");
      std::string r;
      bool first = true;
      for (const auto& x : iterable(n, v)) {
        r += (first ? "" : (sep ? to_str(*sep) : "")) + to_str(attr ? attribute_of(n, x, to_str(*attr)) : x);
        first = false;
      }
      return r;
    }
    if (f == "map") {
      const Value* attr = a.get(99, "attribute");
      Value r = Value::array();
      for (const auto& x : iterable(n, v)) {
        if (attr) r.push_back(attribute_of(n, x, to_str(*attr)));
        else if (!a.pos.empty() && a.pos[0] == "string") r.push_back(to_str(x));
        else if (!a.pos.empty() && (a.pos[0] == "trim" || a.pos[0] == "lower" || a.pos[0] == "upper"))
          r.push_back(a.pos[0] == "trim" ? strip_chars(to_str(x), " \t\n\r\f\v", true, true)
                                         : case_map(to_str(x), a.pos[0] == "upper"));
        else fail(n, "map() supports attribute= and the string/trim/lower/upper filters");
      }
      return r;
    }
    if (f == "items") {
      if (is_undefined(v)) return Value::array();
      if (!v.is_object()) fail(n, std::string("items needs a mapping, not a ") + type_name(v));
      return method(n, v, "items", a);
    }
    if (f == "selectattr" || f == "rejectattr" || f == "select" || f == "reject") {
      const bool by_attr = f.ends_with("attr");
      const size_t t0 = by_attr ? 1 : 0;
      if (by_attr && (a.pos.empty() || !a.pos[0].is_string())) fail(n, f + " needs an attribute name");
      const std::string test_name = a.pos.size() > t0 ? to_str(a.pos[t0]) : "";
      std::vector<Value> targs(a.pos.begin() + std::min(a.pos.size(), t0 + 1), a.pos.end());
      const bool keep_if = f.starts_with("select");
      Value r = Value::array();
      for (const auto& x : iterable(n, v)) {
        count_iteration(n);
        const Value subject = by_attr ? attribute_of(n, x, a.pos[0].get<std::string>()) : x;
        const bool ok = test_name.empty() ? truthy(subject) : test(n, subject, test_name, targs);
        if (ok == keep_if) r.push_back(x);
      }
      return r;
    }
    if (f == "int") {
      if (v.is_number()) return static_cast<int64_t>(v.get<double>());
      if (v.is_string()) try { return static_cast<int64_t>(std::stoll(v.get<std::string>())); } catch (...) {}
      return int64_t{0};
    }
    if (f == "float") {
      if (v.is_number()) return v.get<double>();
      if (v.is_string()) try { return std::stod(v.get<std::string>()); } catch (...) {}
      return 0.0;
    }
    if (f == "abs") {
      if (v.is_number_integer()) return std::abs(v.get<int64_t>());
      if (v.is_number()) return std::fabs(v.get<double>());
      fail(n, "abs needs a number");
    }
    // String filters.
    const std::string s = to_str(v);
    if (f == "trim") {
      const Value* c = a.get(0, "chars");
      return strip_chars(s, c && !c->is_null() ? to_str(*c) : " \t\n\r\f\v", true, true);
    }
    if (f == "upper" || f == "lower") return case_map(s, f == "upper");
    if (f == "capitalize" || f == "title") return method(n, Value(s), f, a);
    if (f == "replace") {
      const Value* c = a.get(2, "count");
      if (a.pos.size() < 2) fail(n, "replace needs old and new");
      return replace_all(s, to_str(a.pos[0]), to_str(a.pos[1]), c && c->is_number_integer() ? c->get<int64_t>() : -1);
    }
    if (f == "indent") {
      const Value* w = a.get(0, "width");
      const Value* first = a.get(1, "first");
      const std::string pad = w && w->is_string() ? w->get<std::string>() : std::string(w && w->is_number_integer() ? w->get<int64_t>() : 4, ' ');
      std::string r;
      size_t line_no = 0;
      for (size_t i = 0; i < s.size(); ++line_no) {
        const size_t e = s.find('\n', i);
        const std::string line = s.substr(i, e == std::string::npos ? std::string::npos : e - i + 1);
        const bool blank = line == "\n";
        r += ((line_no > 0 || (first && truthy(*first))) && !blank ? pad : "") + line;
        if (e == std::string::npos) break;
        i = e + 1;
      }
      return r;
    }
    fail(n, "unknown filter '" + f + "'");
  }

  bool test(const Node& n, const Value& v, const std::string& t, const std::vector<Value>& a) {
    auto arg = [&]() -> const Value& {
      if (a.empty()) fail(n, "test '" + t + "' needs an argument");
      return a[0];
    };
    if (t == "defined") return !is_undefined(v);
    if (t == "undefined") return is_undefined(v);
    if (t == "none") return v.is_null();
    if (t == "string") return v.is_string();
    if (t == "mapping") return v.is_object();
    if (t == "sequence" || t == "iterable") return v.is_array() || v.is_string() || v.is_object();
    if (t == "number") return v.is_number() && !v.is_boolean();
    if (t == "integer") return v.is_number_integer();
    if (t == "float") return v.is_number_float();
    if (t == "boolean") return v.is_boolean();
    if (t == "true") return v.is_boolean() && v.get<bool>();
    if (t == "false") return v.is_boolean() && !v.get<bool>();
    if (t == "odd" || t == "even") {
      if (!v.is_number_integer()) fail(n, "test '" + t + "' needs an integer");
      return (v.get<int64_t>() % 2 != 0) == (t == "odd");
    }
    if (t == "divisibleby") {
      const Value& d = arg();
      if (!v.is_number_integer() || !d.is_number_integer() || d.get<int64_t>() == 0) fail(n, "divisibleby needs non-zero integers");
      return v.get<int64_t>() % d.get<int64_t>() == 0;
    }
    if (t == "equalto" || t == "eq" || t == "==" || t == "sameas") return equals(v, arg());
    if (t == "ne" || t == "!=") return !equals(v, arg());
    if (t == "in") {
      const Value& c = arg();
      if (c.is_array()) return std::any_of(c.begin(), c.end(), [&](const Value& x) { return equals(x, v); });
      if (c.is_object()) return v.is_string() && c.contains(v.get<std::string>());
      if (c.is_string()) return v.is_string() && c.get_ref<const std::string&>().find(v.get<std::string>()) != std::string::npos;
      return false;
    }
    if (t == "lower" || t == "upper") return v.is_string() && case_map(v.get<std::string>(), t == "upper") == v.get<std::string>();
    fail(n, "unknown test '" + t + "'");
  }
};

}  // namespace

Template::Template(const std::string& source, Limits limits) : root_(parse(source, limits.max_depth)), limits_(limits) {}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;

std::string Template::render(const Value& context) const {
  Eval e{limits_};
  e.scopes.emplace_back();
  if (context.is_object())
    for (auto it = context.begin(); it != context.end(); ++it) e.scopes.back()[it.key()] = it.value();
  e.scopes.emplace_back();  // the template's own top-level sets shadow, never overwrite, the context
  e.exec(*root_);
  return std::move(e.out);
}

}  // namespace kvpack::jinja
