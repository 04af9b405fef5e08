// BOOST_ASSERT in builds with assertions on (Debug, ASan, fuzzing; the server layer is compiled with
// BOOST_ENABLE_ASSERT_DEBUG_HANDLER, so NDEBUG builds keep Boost's asserts off as before): the same as
// assert() — message, then abort — except for one documented false positive in Boost.Beast 1.74.
//
// basic_parser::parse_chunk_header asserts `n >= 5` when it re-enters after the last chunk ("0\r\n")
// with the trailer still incomplete, but a client that sends "0\r\n" and then one more byte in a separate
// segment gets there with n == 4; the code after the assert handles that correctly (it looks for the end
// of the trailer and asks for more). Upstream fixed the assert (boostorg/beast#2861, Boost 1.86). Found
// by fuzz/fuzz_http_request.cpp; without this, one client could abort a Debug server.
// Thread-safety: stateless.
#include <boost/assert.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

bool ends_with(const char* s, const char* suffix) {
  const size_t n = std::strlen(s), m = std::strlen(suffix);
  return n >= m && std::strcmp(s + n - m, suffix) == 0;
}

// Assertions known to be wrong in the Boost version Debian ships (see the file comment).
bool known_false_positive(const char* expr, const char* file) {
  return std::strcmp(expr, "n >= 5") == 0 && ends_with(file, "boost/beast/http/impl/basic_parser.ipp");
}

}  // namespace

namespace boost {

void assertion_failed(char const* expr, char const* function, char const* file, long line) {
  if (known_false_positive(expr, file)) return;
  std::fprintf(stderr, "%s:%ld: %s: Boost assertion `%s' failed.\n", file, line, function, expr);
  std::abort();
}

void assertion_failed_msg(char const* expr, char const* msg, char const* function, char const* file, long line) {
  std::fprintf(stderr, "%s:%ld: %s: Boost assertion `%s' failed: %s\n", file, line, function, expr, msg);
  std::abort();
}

}  // namespace boost
