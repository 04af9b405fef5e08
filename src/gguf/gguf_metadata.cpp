// Metadata and tensor lookup on a parsed File. Getters are strict about types: a key that exists
// with the wrong type is a malformed model, not a missing option, so it throws instead of
// silently falling back to a default.
#include <limits>

#include "gguf/gguf.h"

namespace kvpack::gguf {

std::string_view value_type_name(ValueType t) {
  switch (t) {
    case ValueType::UINT8: return "UINT8";
    case ValueType::INT8: return "INT8";
    case ValueType::UINT16: return "UINT16";
    case ValueType::INT16: return "INT16";
    case ValueType::UINT32: return "UINT32";
    case ValueType::INT32: return "INT32";
    case ValueType::FLOAT32: return "FLOAT32";
    case ValueType::BOOL: return "BOOL";
    case ValueType::STRING: return "STRING";
    case ValueType::ARRAY: return "ARRAY";
    case ValueType::UINT64: return "UINT64";
    case ValueType::INT64: return "INT64";
    case ValueType::FLOAT64: return "FLOAT64";
  }
  return "?";
}

namespace {

bool is_signed_int(ValueType t) {
  return t == ValueType::INT8 || t == ValueType::INT16 || t == ValueType::INT32 || t == ValueType::INT64;
}
bool is_unsigned_int(ValueType t) {
  return t == ValueType::UINT8 || t == ValueType::UINT16 || t == ValueType::UINT32 || t == ValueType::UINT64;
}
bool is_float(ValueType t) { return t == ValueType::FLOAT32 || t == ValueType::FLOAT64; }

std::string describe(const Value& v) {
  std::string s(value_type_name(v.type));
  if (v.type == ValueType::ARRAY) s += " of " + std::string(value_type_name(v.elem_type));
  return s;
}

}  // namespace

const Value* File::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].value;
}

const TensorInfo* File::tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

[[noreturn]] static void wrong_type(const File& f, std::string_view key, const Value& v, const char* expected) {
  throw Error(f.name() + ": metadata key '" + std::string(key) + "' has type " + describe(v) + ", expected " +
              expected);
}

std::optional<std::string> File::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != ValueType::STRING) wrong_type(*this, key, *v, "STRING");
  return v->s;
}

std::optional<int64_t> File::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (is_signed_int(v->type)) return v->i;
  if (is_unsigned_int(v->type)) {
    if (v->u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw Error(name_ + ": metadata key '" + std::string(key) + "' value " + std::to_string(v->u) +
                  " does not fit in int64");
    return static_cast<int64_t>(v->u);
  }
  wrong_type(*this, key, *v, "an integer");
}

std::optional<double> File::get_float(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (is_float(v->type)) return v->f;
  if (is_signed_int(v->type)) return static_cast<double>(v->i);
  if (is_unsigned_int(v->type)) return static_cast<double>(v->u);
  wrong_type(*this, key, *v, "a number");
}

std::optional<bool> File::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != ValueType::BOOL) wrong_type(*this, key, *v, "BOOL");
  return v->i != 0;
}

const std::vector<std::string>* File::get_string_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return nullptr;
  if (v->type != ValueType::ARRAY || v->elem_type != ValueType::STRING)
    wrong_type(*this, key, *v, "ARRAY of STRING");
  return &v->strs;
}

const std::vector<double>* File::get_float_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return nullptr;
  if (v->type != ValueType::ARRAY || !is_float(v->elem_type)) wrong_type(*this, key, *v, "ARRAY of FLOAT32/FLOAT64");
  return &v->floats;
}

const std::vector<int64_t>* File::get_int_array(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return nullptr;
  if (v->type != ValueType::ARRAY ||
      !(is_signed_int(v->elem_type) || is_unsigned_int(v->elem_type) || v->elem_type == ValueType::BOOL))
    wrong_type(*this, key, *v, "ARRAY of integers");
  // UINT64 elements are stored bit-for-bit; one above INT64_MAX would read back negative.
  if (v->elem_type == ValueType::UINT64)
    for (int64_t x : v->ints)
      if (x < 0)
        throw Error(name_ + ": metadata key '" + std::string(key) + "' has a UINT64 element " +
                    std::to_string(static_cast<uint64_t>(x)) + " that does not fit in int64");
  return &v->ints;
}

}  // namespace kvpack::gguf
