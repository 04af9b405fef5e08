// Detectors and normalisers of the causes of lost prefix reuse: for each cause a log with a planted
// instance (flagged, with an example pair, and the normaliser removes it) and clean controls that look
// alike but must not be flagged.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "analyze/causes.h"

using namespace kvpack::analyze;

namespace {

LoggedRequest chat(std::vector<Message> msgs, std::string session = "", std::vector<ordered_json> tools = {}) {
  LoggedRequest r;
  r.chat = true;
  r.messages = std::move(msgs);
  r.session = std::move(session);
  r.tools = std::move(tools);
  return r;
}

std::vector<size_t> affected(Cause c, const Log& log) { return detect(c, log).affected; }

const std::string kDoc =
    "The harbour office opens at dawn and closes when the last boat is tied up. Parcels for the island go on the "
    "morning ferry, letters on the evening one, and anything heavier than a sack of potatoes waits for the Thursday barge.";
const std::string kDoc2 =
    "Tickets are sold at the window beside the station clock. A return ticket is valid for one month, a single for "
    "the day of travel only, and children under five travel free when they sit on a grown-up's lap.";

}  // namespace

// --- volatile spans --------------------------------------------------------------------------------

TEST(VolatileSpans, MasksTimestampsIdsAndCountersButNotWords) {
  EXPECT_EQ(mask_volatile("Now: 2026-12-02T10:31:07Z, id 3f2a9c1e-0b4d-4e6f-8a7b-1c2d3e4f5a6b."), "Now: <datetime>, id <uuid>.");
  EXPECT_EQ(mask_volatile("at 9:05 on 12/02/2026, turn 17 of 20.5"), "at <time> on <date>, turn <n> of <n>");
  EXPECT_EQ(mask_volatile("request req_8f3a2c91d0 on Tuesday, May 3"), "request req_<id> on <dateword>, <dateword> <n>");
  // Words, version tags and short hex-looking words stay.
  EXPECT_EQ(mask_volatile("May I help? Use v2 of the decaf cafe API."), "May I help? Use v2 of the decaf cafe API.");
  const auto spans = find_volatile_spans("x 2026-12-02 09:14:07 y");
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_STREQ(spans[0].kind, "date");
  EXPECT_STREQ(spans[1].kind, "time");
}

TEST(VolatileSpans, FlagsASystemPromptThatDiffersOnlyByItsTimestamp) {
  const Log log = {chat({{"system", "You help.\nNow: 2026-12-02 10:31:07 UTC, request 4821."}, {"user", "a"}}),
                   chat({{"system", "You help.\nNow: 2026-12-02 10:31:09 UTC, request 4822."}, {"user", "b"}}),
                   chat({{"system", "You help.\nNow: 2026-12-02 10:31:12 UTC, request 4823."}, {"user", "c"}})};
  const Detection d = detect(Cause::Volatile, log);
  EXPECT_EQ(d.affected, (std::vector<size_t>{1, 2}));
  ASSERT_TRUE(d.example);
  EXPECT_EQ(d.example->first, 0u);
  EXPECT_EQ(d.example->second, 1u);
  EXPECT_EQ(d.example->where, "system prompt");
  const Log fixed = normalise(Cause::Volatile, log);
  EXPECT_EQ(fixed[0].messages[0].content, fixed[2].messages[0].content);
  EXPECT_EQ(fixed[0].messages[1].content, "a");  // user text is not the system prompt: untouched
}

TEST(VolatileSpans, StableDatesAndDifferentPromptsAreNotFlagged) {
  const Log log = {chat({{"system", "Knowledge cutoff: 2024-06-01. Answer in 3 lines."}, {"user", "a 12:00"}}),
                   chat({{"system", "Knowledge cutoff: 2024-06-01. Answer in 3 lines."}, {"user", "b 13:00"}}),
                   chat({{"system", "You are a pirate."}, {"user", "c"}}),
                   chat({{"system", "You are a poet."}, {"user", "d"}}),
                   chat({{"user", "no system prompt at 10:00"}})};
  EXPECT_TRUE(affected(Cause::Volatile, log).empty());
}

// --- tool order ------------------------------------------------------------------------------------

namespace {
ordered_json tool(const std::string& name) {
  return {{"type", "function"}, {"function", {{"name", name}, {"parameters", {{"type", "object"}}}}}};
}
}  // namespace

TEST(ToolOrder, FlagsTheSameToolsInAnotherOrderOrKeyOrder) {
  ordered_json swapped_keys = {{"function", {{"parameters", {{"type", "object"}}}, {"name", "c"}}}, {"type", "function"}};
  const Log log = {chat({{"user", "x"}}, "", {tool("a"), tool("b"), tool("c")}),
                   chat({{"user", "y"}}, "", {tool("b"), tool("a"), tool("c")}),
                   chat({{"user", "z"}}, "", {tool("b"), tool("a"), swapped_keys})};
  const Detection d = detect(Cause::Tools, log);
  EXPECT_EQ(d.affected, (std::vector<size_t>{1, 2}));
  ASSERT_TRUE(d.example);
  EXPECT_EQ(d.example->first, 0u);
  const Log fixed = normalise(Cause::Tools, log);
  for (const auto& r : fixed) {
    ASSERT_EQ(r.tools.size(), 3u);
    EXPECT_EQ(r.tools[0].dump(), fixed[0].tools[0].dump());
    EXPECT_EQ(r.tools[2].dump(), fixed[0].tools[2].dump());
  }
  EXPECT_EQ(fixed[0].tools[0]["function"]["name"], "a");
}

TEST(ToolOrder, AFixedOrderAndDifferentToolSetsAreNotFlagged) {
  const Log log = {chat({{"user", "x"}}, "", {tool("b"), tool("a")}), chat({{"user", "y"}}, "", {tool("b"), tool("a")}),
                   chat({{"user", "z"}}, "", {tool("a"), tool("c")}), chat({{"user", "w"}})};
  EXPECT_TRUE(affected(Cause::Tools, log).empty());
}

// --- whitespace ------------------------------------------------------------------------------------

TEST(Whitespace, NormalisesNewlinesTrailingBlanksRunsAndBlankLines) {
  EXPECT_EQ(normalise_whitespace("a\r\nb\rc"), "a\nb\nc");
  EXPECT_EQ(normalise_whitespace("  one \t\ntwo  three\n\n\n\nfour\n"), "one\ntwo three\n\nfour");
  EXPECT_EQ(normalise_whitespace("code:\n    indented  line"), "code:\n    indented line");  // indentation stays
  EXPECT_EQ(normalise_whitespace("no\xc2\xa0" "break"), "no break");
  EXPECT_EQ(normalise_whitespace(" \r\n "), "");
}

TEST(Whitespace, FlagsHistoryReSentWithOtherWhitespace) {
  const Log log = {chat({{"system", "S"}, {"user", "line one \r\nline two\r\n"}}, "s"),
                   chat({{"system", "S"}, {"user", "line one\nline two"}, {"assistant", "ok"}, {"user", "more"}}, "s")};
  const Detection d = detect(Cause::Whitespace, log);
  EXPECT_EQ(d.affected, (std::vector<size_t>{1}));
  ASSERT_TRUE(d.example);
  EXPECT_EQ(d.example->where, "messages[1] (user)");
  EXPECT_EQ(d.example->first_text, "line one \r\nline two\r\n");
  const Log fixed = normalise(Cause::Whitespace, log);
  EXPECT_EQ(fixed[0].messages[1].content, fixed[1].messages[1].content);
}

TEST(Whitespace, IdenticalAndGenuinelyDifferentTextsAreNotFlagged) {
  const Log log = {chat({{"system", "S\nT"}, {"user", "alpha beta"}}), chat({{"system", "S\nT"}, {"user", "alpha gamma"}}),
                   chat({{"system", "S\nT"}, {"user", "alpha beta"}, {"assistant", "x"}, {"user", "delta"}})};
  EXPECT_TRUE(affected(Cause::Whitespace, log).empty());
}

TEST(Whitespace, ComparesCompletionPromptsLineByLine) {
  LoggedRequest a, b, c;
  a.prompt = "Instructions: answer briefly and politely.\r\nQ: one";
  b.prompt = "Instructions: answer briefly and politely.\nQ: two";
  c.prompt = "Instructions: answer briefly and politely.\nQ: three";
  EXPECT_EQ(affected(Cause::Whitespace, {a, b, c}), (std::vector<size_t>{1}));
  EXPECT_TRUE(affected(Cause::Whitespace, {b, c}).empty());
}

// --- truncation ------------------------------------------------------------------------------------

namespace {
// Turn t of a conversation: system, then the full history u0 a0 ... u(t-1) a(t-1), then u(t).
std::vector<Message> turn(int t, const std::string& tag, int keep = -1) {
  std::vector<Message> hist;
  for (int i = 0; i < t; ++i) {
    hist.push_back({"user", tag + " question " + std::to_string(i)});
    hist.push_back({"assistant", tag + " answer " + std::to_string(i)});
  }
  if (keep >= 0 && static_cast<int>(hist.size()) > keep) hist.erase(hist.begin(), hist.end() - keep);
  hist.push_back({"user", tag + " question " + std::to_string(t)});
  std::vector<Message> msgs = {{"system", "S"}};
  msgs.insert(msgs.end(), hist.begin(), hist.end());
  return msgs;
}
}  // namespace

TEST(Truncation, FlagsASlidingWindowAndReanchorsTheWholeHistory) {
  Log log, full;
  for (int t = 0; t < 6; ++t) {
    log.push_back(chat(turn(t, "A", 4), "s1"));
    full.push_back(chat(turn(t, "A"), "s1"));
    log.push_back(chat(turn(t, "B"), "s2"));  // an append-only session in between
    full.push_back(chat(turn(t, "B"), "s2"));
  }
  const Detection d = detect(Cause::Truncation, log);
  // Session A sends 5 history messages from turn 2 on; turns 3, 4 and 5 (log 6, 8, 10) drop from the front.
  EXPECT_EQ(d.affected, (std::vector<size_t>{6, 8, 10}));
  ASSERT_TRUE(d.example);
  EXPECT_EQ(d.example->first, 4u);
  EXPECT_EQ(d.example->second, 6u);
  const Log fixed = normalise(Cause::Truncation, log);
  for (size_t i = 0; i < log.size(); ++i) EXPECT_EQ(fixed[i].messages, full[i].messages) << "request " << i;
}

TEST(Truncation, WorksWithoutSessionLabels) {
  Log log;
  for (int t = 0; t < 5; ++t) log.push_back(chat(turn(t, "A", 4)));
  EXPECT_EQ(affected(Cause::Truncation, log), (std::vector<size_t>{3, 4}));
}

TEST(Truncation, KeepingOnlyTheLastExchangeIsFoundWithinASession) {
  // The previous request and this one share one message (the previous question): enough in a session.
  Log log, unlabelled;
  for (int t = 0; t < 5; ++t) {
    log.push_back(chat(turn(t, "A", 2), "s1"));
    unlabelled.push_back(chat(turn(t, "A", 2)));
  }
  EXPECT_EQ(affected(Cause::Truncation, log), (std::vector<size_t>{2, 3, 4}));
  EXPECT_TRUE(affected(Cause::Truncation, unlabelled).empty());  // one message alone says nothing
  const Log fixed = normalise(Cause::Truncation, log);
  EXPECT_EQ(fixed[4].messages, turn(4, "A"));
}

TEST(Truncation, AppendOnlySessionsAndCommonOpeningsAreNotFlagged) {
  Log log;
  for (int t = 0; t < 5; ++t) log.push_back(chat(turn(t, "A"), "s1"));
  // Another conversation that opens with a message seen in the middle of session s1 (one message in
  // common is not a conversation), and one in another session that repeats two of s1's messages.
  log.push_back(chat({{"system", "S"}, {"user", "A question 2"}, {"assistant", "something else"}, {"user", "x"}}));
  log.push_back(chat({{"system", "S"}, {"user", "A question 2"}, {"assistant", "A answer 2"}, {"user", "y"}}, "s9"));
  EXPECT_TRUE(affected(Cause::Truncation, log).empty());
}

// --- documents -------------------------------------------------------------------------------------

TEST(Documents, FlagsASharedDocumentAfterDifferentQuestions) {
  const Log log = {chat({{"system", "S"}, {"user", "When does the office open?\n\n" + kDoc}}),
                   chat({{"system", "S"}, {"user", "What goes on the barge?\n\n" + kDoc}}),
                   chat({{"system", "S"}, {"user", "How long is a return valid?\n\n" + kDoc2}}),
                   chat({{"system", "S"}, {"user", "Who travels free?\n\n" + kDoc2}})};
  const Detection d = detect(Cause::Documents, log);
  EXPECT_EQ(d.affected, (std::vector<size_t>{0, 1, 2, 3}));
  ASSERT_TRUE(d.example);
  EXPECT_EQ(d.example->first, 0u);
  EXPECT_EQ(d.example->second, 1u);
  const Log fixed = normalise(Cause::Documents, log);
  EXPECT_EQ(fixed[0].messages[1].content, kDoc + "\n\nWhen does the office open?");
  EXPECT_EQ(fixed[3].messages[1].content, kDoc2 + "\n\nWho travels free?");
}

TEST(Documents, DocumentFirstUniqueTextAndRepeatedHistoryAreNotFlagged) {
  const Log log = {
      chat({{"system", "S"}, {"user", kDoc + "\n\nWhen does the office open?"}}),  // already document first
      chat({{"system", "S"}, {"user", kDoc + "\n\nWhat goes on the barge?"}}),
      // A long paragraph after a question, but no other request has it: nothing to share.
      chat({{"system", "S"}, {"user", "Is this right?\n\n" + kDoc2}}, "s5"),
      // The same message again as history in the next turn of its session: the same message, not a second use.
      chat({{"system", "S"}, {"user", "Is this right?\n\n" + kDoc2}, {"assistant", "Yes."}, {"user", "Thanks."}}, "s5")};
  EXPECT_TRUE(affected(Cause::Documents, log).empty());
  const Log fixed = normalise(Cause::Documents, log);
  for (size_t i = 0; i < log.size(); ++i) EXPECT_EQ(fixed[i].messages, log[i].messages);
}

TEST(Causes, NamesRoundTripAndBadListsAreRefused) {
  for (Cause c : kAttributionOrder) EXPECT_EQ(parse_cause(cause_name(c)), c);
  EXPECT_EQ(parse_cause_list("all").size(), 5u);
  EXPECT_TRUE(parse_cause_list("none").empty());
  EXPECT_EQ(parse_cause_list("tools,volatile,tools"), (std::vector<Cause>{Cause::Tools, Cause::Volatile}));
  EXPECT_THROW(parse_cause_list("tools,timestamps"), std::invalid_argument);
}
