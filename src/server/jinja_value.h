// Python-like operations on jinja values (ordered_json; a discarded json is jinja's "undefined").
#pragma once
#include <string>
#include <vector>

#include "server/jinja.h"

namespace kvpack::jinja {

inline Value undefined() { return Value(Value::value_t::discarded); }
inline bool is_undefined(const Value& v) { return v.is_discarded(); }

bool truthy(const Value& v);
// str(v) as jinja prints it: undefined → "", none → "None", true → "True", lists/dicts as Python repr.
std::string to_str(const Value& v);
std::string repr(const Value& v);
// json.dumps(v, ensure_ascii=False, indent=indent) (indent < 0: none), as HF's tojson filter.
std::string to_json(const Value& v, int indent);
bool equals(const Value& a, const Value& b);
// Python's a < b for numbers, strings and lists; throws std::invalid_argument for other pairs.
bool less(const Value& a, const Value& b);
const char* type_name(const Value& v);

// Strings are UTF-8; Python indexes them by code point.
std::vector<std::string> code_points(const std::string& s);

}  // namespace kvpack::jinja
