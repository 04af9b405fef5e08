// Checked arithmetic for sizes computed from untrusted files (model headers, GGUF metadata). Every
// helper names the quantity it computes, so an overflow reads "llama2.c checkpoint: weight count
// overflows (1048576 * 10485758)" instead of a wrapped product that later passes a size check.
#pragma once
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace kvpack {

// Thrown for arithmetic that does not fit its type; a std::runtime_error like every loader error.
class OverflowError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace checked_detail {
template <class T>
[[noreturn]] void overflow(std::string_view what, const char* op, T a, T b) {
  throw OverflowError(std::string(what) + " overflows (" + std::to_string(a) + " " + op + " " + std::to_string(b) + ")");
}
}  // namespace checked_detail

template <class T>
concept CheckedInt = std::is_same_v<T, uint64_t> || std::is_same_v<T, int64_t>;

template <CheckedInt T>
T checked_mul(T a, T b, std::string_view what) {
  T r;
  if (__builtin_mul_overflow(a, b, &r)) checked_detail::overflow(what, "*", a, b);
  return r;
}

template <CheckedInt T>
T checked_add(T a, T b, std::string_view what) {
  T r;
  if (__builtin_add_overflow(a, b, &r)) checked_detail::overflow(what, "+", a, b);
  return r;
}

// Product of all factors, checked at every step.
template <CheckedInt T, class... Rest>
T checked_product(std::string_view what, T first, Rest... rest) {
  T r = first;
  ((r = checked_mul(r, static_cast<T>(rest), what)), ...);
  return r;
}

// `v` converted to To when it is representable; otherwise an error naming `what` and the value
// (a 64-bit key_length of 2^32 + 8 must be rejected, never truncated to 8).
template <class To, class From>
To checked_cast(From v, std::string_view what) {
  static_assert(std::is_integral_v<To> && std::is_integral_v<From>);
  if (!std::in_range<To>(v))
    throw OverflowError(std::string(what) + " = " + std::to_string(v) + " does not fit in a " +
                        std::to_string(sizeof(To) * 8) + "-bit " + (std::is_signed_v<To> ? "signed" : "unsigned") +
                        " integer");
  return static_cast<To>(v);
}

}  // namespace kvpack
