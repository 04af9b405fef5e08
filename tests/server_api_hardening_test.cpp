// Request bodies that the JSON API fuzzer (fuzz/fuzz_json_api.cpp) found escaping parse_request_body as
// exceptions; each must be a 400 with the invalid_json code instead.
#include <gtest/gtest.h>

#include "server/api.h"

namespace kvpack::server {
namespace {

TEST(ServerApiHardening, NumberOverflowIsInvalidJsonNotAnException) {
  const ApiContext ctx;  // the body is rejected before the model or tokenizer is consulted
  for (const char* body : {"5555000000064687e292679928compl%ti:2}", "{\"max_tokens\": 1e400}", "[-1e99999]"}) {
    for (bool chat : {false, true}) {
      const ParseResult r = parse_request_body(body, chat, ctx);
      ASSERT_TRUE(std::holds_alternative<ApiError>(r)) << body;
      EXPECT_EQ(std::get<ApiError>(r).status, 400);
      EXPECT_EQ(std::get<ApiError>(r).code, "invalid_json") << body;
    }
  }
}

}  // namespace
}  // namespace kvpack::server
