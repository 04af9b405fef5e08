// The request-log reader of `kvpack analyze-prefix`: both line shapes (a request body with log fields,
// a server log line with the body under "request"), and bad input — malformed JSON, wrong types, a line
// without a body, an over-long line, deep nesting — answered with an error naming the line, never a crash.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "analyze/request_log.h"

using namespace kvpack::analyze;

namespace {

std::vector<LoggedRequest> read(const std::string& text, ReadOptions opt = {}) {
  std::istringstream in(text);
  return read_request_log(in, opt);
}

// The error's line number and message for a log whose every line but `bad` is fine.
LogError error_of(const std::string& text, ReadOptions opt = {}) {
  try {
    read(text, opt);
  } catch (const LogError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for: " << text.substr(0, 200);
  return LogError(0, "none");
}

const std::string kGood = R"({"model":"m","messages":[{"role":"user","content":"hi"}]})";

}  // namespace

TEST(RequestLog, ReadsBodiesAndServerLogLinesInOrder) {
  const std::string text =
      R"({"id":"a1","session":"s1","cached_tokens":16,"prompt_tokens":40,"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hello "},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"there"}]}],"tools":[{"type":"function","function":{"name":"b","description":"d"}}]})"
      "\n\n"  // blank lines are skipped but counted
      R"({"id":7,"prompt_tokens":12,"cached_tokens":0,"status":200,"request":{"prompt":"Once upon a time","user":"u9"}})"
      "\n"
      R"({"request":{"prompt":[1,2,3],"cache_salt":"tenant-a"}})"
      "\r\n"
      R"({"prompt":["only one"]})";
  const auto log = read(text);
  ASSERT_EQ(log.size(), 4u);
  EXPECT_EQ(log[0].line, 1);
  EXPECT_EQ(log[0].id, "a1");
  EXPECT_EQ(log[0].session, "s1");
  EXPECT_TRUE(log[0].chat);
  ASSERT_EQ(log[0].messages.size(), 2u);
  EXPECT_EQ(log[0].messages[1].content, "Hello there");  // text parts only
  EXPECT_EQ(log[0].logged_cached_tokens, 16);
  EXPECT_EQ(log[0].logged_prompt_tokens, 40);
  ASSERT_EQ(log[0].tools.size(), 1u);
  EXPECT_EQ(log[0].tools[0].dump(), R"({"type":"function","function":{"name":"b","description":"d"}})");  // key order kept

  EXPECT_EQ(log[1].line, 3);
  EXPECT_EQ(log[1].id, "7");
  EXPECT_EQ(log[1].session, "u9");  // the body's "user" when the log has no session
  EXPECT_FALSE(log[1].chat);
  EXPECT_EQ(log[1].prompt, "Once upon a time");
  EXPECT_EQ(log[1].logged_prompt_tokens, 12);

  EXPECT_EQ(log[2].id, "line 4");
  EXPECT_EQ(log[2].prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(log[2].cache_salt, "tenant-a");
  EXPECT_EQ(log[3].prompt, "only one");
}

TEST(RequestLog, WritesLinesItReadsBackUnchanged) {
  const auto log = read(kGood + "\n" + R"({"id":"x","session":"s","request":{"messages":[{"role":"system","content":"a\r\nb"},{"role":"user","content":"q"}],"tools":[{"z":1,"a":2}]}})");
  std::string again;
  for (const auto& r : log) again += to_log_line(r) + "\n";
  const auto back = read(again);
  ASSERT_EQ(back.size(), log.size());
  for (size_t i = 0; i < log.size(); ++i) {
    EXPECT_EQ(back[i].messages, log[i].messages);
    EXPECT_EQ(back[i].session, log[i].session);
    ASSERT_EQ(back[i].tools.size(), log[i].tools.size());
    for (size_t t = 0; t < log[i].tools.size(); ++t) EXPECT_EQ(back[i].tools[t].dump(), log[i].tools[t].dump());
  }
}

TEST(RequestLog, MalformedJsonNamesTheLine) {
  const LogError e = error_of(kGood + "\n" + kGood + "\n" + R"({"messages":[{"role":"user","content":"hi"})" + "\n" + kGood);
  EXPECT_EQ(e.line, 3);
  EXPECT_NE(std::string(e.what()).find("line 3: invalid JSON"), std::string::npos) << e.what();
}

TEST(RequestLog, WrongTypesNameTheLineAndTheField) {
  struct Case {
    std::string line, says;
  };
  const std::vector<Case> cases = {
      {R"([1,2])", "must be a JSON object"},
      {R"({"messages":"hi"})", "'messages' must be a non-empty list"},
      {R"({"messages":[]})", "'messages' must be a non-empty list"},
      {R"({"messages":[{"role":"user","content":5}]})", "messages[0].content must be a string"},
      {R"({"messages":[{"role":"wizard","content":"x"}]})", "messages[0].role must be one of"},
      {R"({"messages":[{"content":"x"}]})", "messages[0].role must be a string"},
      {R"({"messages":[{"role":"user"}]})", "messages[0].content is required"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":{"a":1}})", "'tools' must be a list"},
      {R"({"messages":[{"role":"user","content":"x"}],"tools":[3]})", "tools[0] must be an object"},
      {R"({"prompt":true})", "'prompt' must be a string or a list of token ids"},
      {R"({"prompt":[1,-2]})", "token ids"},
      {R"({"prompt":""})", "the prompt is empty"},
      {R"({"prompt":["a","b"]})", "one prompt per request"},
      {R"({"prompt":"x","messages":[{"role":"user","content":"x"}]})", "both 'messages' and 'prompt'"},
      {R"({"prompt":"x","cached_tokens":-1})", "'cached_tokens' must be a non-negative integer"},
      {R"({"prompt":"x","prompt_tokens":"12"})", "'prompt_tokens' must be a non-negative integer"},
      {R"({"prompt":"x","id":[1]})", "'id' must be a string or an integer"},
      {R"({"prompt":"x","cache_salt":3})", "'cache_salt' must be a string"},
      {R"({"request":"x"})", "'request' must be an object"},
      {R"({"request":{"model":"m"}})", "'request' has neither 'messages' nor 'prompt'"},
  };
  for (const auto& c : cases) {
    const LogError e = error_of(kGood + "\n" + c.line + "\n");
    EXPECT_EQ(e.line, 2) << c.line;
    EXPECT_NE(std::string(e.what()).find("line 2: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << c.line << " -> " << e.what();
  }
}

TEST(RequestLog, ALogLineWithoutItsRequestSaysHowToGetOne) {
  const LogError e = error_of(R"({"id":"r1","prompt_tokens":40,"cached_tokens":16,"status":200})");
  EXPECT_EQ(e.line, 1);
  EXPECT_NE(std::string(e.what()).find("--request-log-prompts"), std::string::npos) << e.what();
}

TEST(RequestLog, AnOverlongLineIsAnErrorNotAnAllocation) {
  ReadOptions opt;
  opt.max_line_bytes = 1000;
  const std::string huge = R"({"prompt":")" + std::string(5000, 'x') + R"("})";
  const LogError e = error_of(kGood + "\n" + huge + "\n" + kGood, opt);
  EXPECT_EQ(e.line, 2);
  EXPECT_NE(std::string(e.what()).find("longer than 1000 bytes"), std::string::npos) << e.what();
  // Exactly at the limit is fine.
  const std::string fits = R"({"prompt":")" + std::string(1000 - 13, 'x') + R"("})";
  ASSERT_EQ(fits.size(), 1000u);
  EXPECT_EQ(read(fits, opt).size(), 1u);
}

TEST(RequestLog, DeepNestingIsRefusedBeforeParsing) {
  const std::string deep = R"({"prompt":"x","extra":)" + std::string(100000, '[') + std::string(100000, ']') + "}";
  const LogError e = error_of(kGood + "\n" + deep);
  EXPECT_EQ(e.line, 2);
  EXPECT_NE(std::string(e.what()).find("nested deeper"), std::string::npos) << e.what();
  // Brackets inside strings are text, not nesting.
  EXPECT_EQ(read(R"({"prompt":")" + std::string(1000, '[') + R"("})").size(), 1u);
}

TEST(RequestLog, InvalidUtf8AndBinaryGarbageAreErrors) {
  EXPECT_EQ(error_of(kGood + "\n" + "{\"prompt\":\"\xff\xfe\"}").line, 2);
  EXPECT_EQ(error_of(std::string("\x00\x01\x02garbage", 10)).line, 1);
}

TEST(RequestLog, AMissingFileIsAClearError) {
  try {
    read_request_log_file("/nonexistent/kvpack/requests.jsonl");
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open the request log"), std::string::npos);
  }
}

TEST(RequestLog, ServerLinesAreOrderedByArrivalNotByCompletion) {
  // The server writes a line when a request ends: here the long request b arrived first.
  auto log = read(
      R"({"id":"a","ts":"2026-12-02T04:49:35.000Z","e2e_s":0.5,"request":{"prompt":"x"}})"
      "\n"
      R"({"id":"b","ts":"2026-12-02T04:49:36.000Z","e2e_s":2.0,"request":{"prompt":"y"}})"
      "\n"
      R"({"id":"c","ts":"2026-12-02T04:49:36.000Z","e2e_s":1.5,"request":{"prompt":"z"}})");
  ASSERT_EQ(log.size(), 3u);
  EXPECT_DOUBLE_EQ(*log[1].arrival_s, *parse_utc_time("2026-12-02T04:49:34Z"));
  ASSERT_TRUE(order_by_arrival(log));
  EXPECT_EQ(log[0].id, "b");
  EXPECT_EQ(log[1].id, "a");
  EXPECT_EQ(log[2].id, "c");
  // Without a time on every line the file order stays.
  auto mixed = read(R"({"id":"a","timestamp":20,"prompt":"x"})" "\n" R"({"id":"b","prompt":"y"})");
  EXPECT_FALSE(order_by_arrival(mixed));
  EXPECT_EQ(mixed[0].id, "a");
}

TEST(RequestLog, UtcTimesParseAndBadOnesAreErrors) {
  EXPECT_DOUBLE_EQ(*parse_utc_time("1970-01-01T00:00:00Z"), 0.0);
  EXPECT_DOUBLE_EQ(*parse_utc_time("2000-03-01T00:00:00Z"), 951868800.0);  // after a leap day
  EXPECT_DOUBLE_EQ(*parse_utc_time("2026-12-02T04:49:34.25+00:00"), 1796186974.25);
  EXPECT_FALSE(parse_utc_time("2026-12-02T04:49:34"));  // no zone: not known to be UTC
  EXPECT_FALSE(parse_utc_time("2026-13-02T04:49:34Z"));
  EXPECT_FALSE(parse_utc_time("yesterday"));
  const LogError e = error_of(kGood + "\n" + R"({"ts":"soon","e2e_s":1,"request":{"prompt":"x"}})");
  EXPECT_EQ(e.line, 2);
  EXPECT_NE(std::string(e.what()).find("'ts' must be an ISO 8601 UTC time"), std::string::npos) << e.what();
  EXPECT_EQ(error_of(R"({"ts":"2026-12-02T04:49:34Z","e2e_s":-1,"prompt":"x"})").line, 1);
}
