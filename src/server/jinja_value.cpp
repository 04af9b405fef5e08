#include "server/jinja_value.h"

#include <charconv>
#include <cmath>
#include <stdexcept>

namespace kvpack::jinja {

bool truthy(const Value& v) {
  switch (v.type()) {
    case Value::value_t::null:
    case Value::value_t::discarded: return false;
    case Value::value_t::boolean: return v.get<bool>();
    case Value::value_t::number_integer: return v.get<int64_t>() != 0;
    case Value::value_t::number_unsigned: return v.get<uint64_t>() != 0;
    case Value::value_t::number_float: return v.get<double>() != 0.0;
    case Value::value_t::string: return !v.get_ref<const std::string&>().empty();
    case Value::value_t::array:
    case Value::value_t::object: return !v.empty();
    default: return true;
  }
}

namespace {

std::string float_str(double d) {  // Python's repr(float): shortest round trip, always with a '.' or 'e'
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string quote_py(const std::string& s) {  // Python repr of a str (the common cases)
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  std::string o(1, dq ? '"' : '\'');
  for (unsigned char c : s) {
    if (c == '\\') o += "\\\\";
    else if (c == '\n') o += "\\n";
    else if (c == '\r') o += "\\r";
    else if (c == '\t') o += "\\t";
    else if (c == '\'' && !dq) o += "\\'";
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      snprintf(b, sizeof b, "\\x%02x", c);
      o += b;
    } else o += static_cast<char>(c);
  }
  o += dq ? '"' : '\'';
  return o;
}

void json_str(std::string& o, const std::string& s) {
  o += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      case '\b': o += "\\b"; break;
      case '\f': o += "\\f"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char b[8];
          snprintf(b, sizeof b, "\\u%04x", c);
          o += b;
        } else o += static_cast<char>(c);
    }
  }
  o += '"';
}

void json_dump(std::string& o, const Value& v, int indent, int level) {
  auto newline = [&](int lv) {
    if (indent < 0) return;
    o += '\n';
    o.append(static_cast<size_t>(indent) * lv, ' ');
  };
  const char* item_sep = indent < 0 ? ", " : ",";  // Python's defaults for separators
  switch (v.type()) {
    case Value::value_t::object: {
      if (v.empty()) { o += "{}"; return; }
      o += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) o += item_sep;
        first = false;
        newline(level + 1);
        json_str(o, it.key());
        o += ": ";
        json_dump(o, it.value(), indent, level + 1);
      }
      newline(level);
      o += '}';
      return;
    }
    case Value::value_t::array: {
      if (v.empty()) { o += "[]"; return; }
      o += '[';
      bool first = true;
      for (const auto& x : v) {
        if (!first) o += item_sep;
        first = false;
        newline(level + 1);
        json_dump(o, x, indent, level + 1);
      }
      newline(level);
      o += ']';
      return;
    }
    case Value::value_t::string: json_str(o, v.get_ref<const std::string&>()); return;
    case Value::value_t::boolean: o += v.get<bool>() ? "true" : "false"; return;
    case Value::value_t::number_float: {
      const double d = v.get<double>();
      o += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : float_str(d);
      return;
    }
    case Value::value_t::number_integer:
    case Value::value_t::number_unsigned: o += v.dump(); return;
    default: o += "null"; return;  // none (and undefined, which Python could not serialise either)
  }
}

bool is_num(const Value& v) { return v.is_number() || v.is_boolean(); }
double num(const Value& v) { return v.is_boolean() ? (v.get<bool>() ? 1.0 : 0.0) : v.get<double>(); }

}  // namespace

std::string repr(const Value& v) {
  switch (v.type()) {
    case Value::value_t::string: return quote_py(v.get_ref<const std::string&>());
    case Value::value_t::array: {
      std::string o = "[";
      for (size_t i = 0; i < v.size(); ++i) o += (i ? ", " : "") + repr(v[i]);
      return o + "]";
    }
    case Value::value_t::object: {
      std::string o = "{";
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it, first = false)
        o += (first ? "" : ", ") + quote_py(it.key()) + ": " + repr(it.value());
      return o + "}";
    }
    default: return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.type()) {
    case Value::value_t::discarded: return "";
    case Value::value_t::null: return "None";
    case Value::value_t::boolean: return v.get<bool>() ? "True" : "False";
    case Value::value_t::string: return v.get<std::string>();
    case Value::value_t::number_float: return float_str(v.get<double>());
    case Value::value_t::number_integer:
    case Value::value_t::number_unsigned: return v.dump();
    default: return repr(v);
  }
}

std::string to_json(const Value& v, int indent) {
  std::string o;
  json_dump(o, v, indent, 0);
  return o;
}

bool equals(const Value& a, const Value& b) {
  if (is_num(a) && is_num(b)) {
    if ((a.is_number_integer() || a.is_boolean()) && (b.is_number_integer() || b.is_boolean()))
      return (a.is_boolean() ? a.get<bool>() : a.get<int64_t>()) == (b.is_boolean() ? b.get<bool>() : b.get<int64_t>());
    return num(a) == num(b);
  }
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!equals(a[i], b[i])) return false;
    return true;
  }
  if (a.is_discarded()) return true;
  return a == b;
}

bool less(const Value& a, const Value& b) {
  if (is_num(a) && is_num(b)) {
    if (a.is_number_integer() && b.is_number_integer()) return a.get<int64_t>() < b.get<int64_t>();
    return num(a) < num(b);
  }
  if (a.is_string() && b.is_string()) return a.get_ref<const std::string&>() < b.get_ref<const std::string&>();
  if (a.is_array() && b.is_array()) {
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (less(a[i], b[i])) return true;
      if (less(b[i], a[i])) return false;
    }
    return a.size() < b.size();
  }
  throw std::invalid_argument(std::string("cannot compare ") + type_name(a) + " with " + type_name(b));
}

const char* type_name(const Value& v) {
  switch (v.type()) {
    case Value::value_t::discarded: return "undefined";
    case Value::value_t::null: return "none";
    case Value::value_t::boolean: return "boolean";
    case Value::value_t::string: return "string";
    case Value::value_t::array: return "list";
    case Value::value_t::object: return "mapping";
    case Value::value_t::number_float: return "float";
    default: return "integer";
  }
}

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + n > s.size()) n = 1;  // a broken sequence: one byte at a time, never past the end
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

}  // namespace kvpack::jinja
