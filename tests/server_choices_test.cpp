// n > 1 through the real server on a loopback port: n choices with index 0..n-1, each what a solo
// request with its seed gives (greedy: the n = 1 text), streamed and not, logprobs per choice, usage
// counting the prompt once and summing completion tokens, the shared prompt pages in usage.kvpack and
// in /metrics, and n beyond the batch a clear 400.
#include <gtest/gtest.h>
#include <httplib.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "live_server_fixture.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "server/server.h"
#include "server_model_fixture.h"

namespace kvpack {
namespace {

using json = nlohmann::json;

const std::string kPrompt =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
    "dog, Max. One day, Lily and Max found a big red ball under a tree.";

using test::Reply;

class ChoicesServerTest : public test::LiveServerTest {
 protected:
  void configure(server::ServerOptions& opt) override { opt.scheduler.max_running = 4; }
  static std::string content(const json& choice, bool chat) {
    return chat ? choice["message"]["content"].get<std::string>() : choice["text"].get<std::string>();
  }
};

TEST_F(ChoicesServerTest, GreedyChoicesEqualTheSingleAnswerAndReportTheSharedPages) {
  for (const bool compressed : {false, true}) {
    json body = {{"prompt", kPrompt}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}};
    if (compressed) body["kv_budget"] = 32;
    const Reply one = post("/v1/completions", body);
    ASSERT_EQ(one.status, 200) << one.body;
    body["n"] = 3;
    const Reply three = post("/v1/completions", body);
    ASSERT_EQ(three.status, 200) << three.body;
    ASSERT_EQ(three.body["choices"].size(), 3u);
    for (int i = 0; i < 3; ++i) {
      const json& c = three.body["choices"][static_cast<size_t>(i)];
      EXPECT_EQ(c["index"], i);
      EXPECT_EQ(c["text"], one.body["choices"][0]["text"]) << "choice " << i << (compressed ? " compressed" : "");
      EXPECT_EQ(c["finish_reason"], "length");
    }
    const json& u = three.body["usage"];
    EXPECT_EQ(u["prompt_tokens"], one.body["usage"]["prompt_tokens"]);  // counted once
    EXPECT_EQ(u["completion_tokens"], 3 * 24);
    EXPECT_EQ(u["total_tokens"], u["prompt_tokens"].get<int>() + 3 * 24);
    EXPECT_EQ(u["kvpack"]["choices"], 3);
    EXPECT_GT(u["kvpack"]["shared_prompt_pages"].get<int64_t>(), 0) << u;
    EXPECT_EQ(u["kvpack"]["pages_saved_by_sharing"], 2 * u["kvpack"]["shared_prompt_pages"].get<int64_t>()) << u;
    EXPECT_EQ(one.body["usage"]["kvpack"]["pages_saved_by_sharing"], 0);
  }
  auto m = client()->Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->body.find("kvpack_kv_forks_total 4"), std::string::npos);
  EXPECT_NE(m->body.find("kvpack_kv_fork_pages_saved_total "), std::string::npos);
  EXPECT_EQ(m->body.find("kvpack_kv_fork_pages_saved_total 0\n"), std::string::npos);
}

TEST_F(ChoicesServerTest, SeededChatChoicesEqualSoloRequestsWithTheDerivedSeedAndStreamTheSame) {
  const json messages = json::array({{{"role", "user"}, {"content", kPrompt}}});
  json body = {{"messages", messages}, {"max_tokens", 16}, {"temperature", 1.0}, {"seed", 99},
               {"logprobs", true}, {"top_logprobs", 1}, {"n", 2}};
  const Reply two = post("/v1/chat/completions", body);
  ASSERT_EQ(two.status, 200) << two.body;
  ASSERT_EQ(two.body["choices"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    json solo = body;
    solo.erase("n");
    solo["seed"] = static_cast<int64_t>(choice_seed(99, i));
    const Reply s = post("/v1/chat/completions", solo);
    ASSERT_EQ(s.status, 200);
    const json& c = two.body["choices"][static_cast<size_t>(i)];
    EXPECT_EQ(content(c, true), content(s.body["choices"][0], true)) << "choice " << i;
    EXPECT_EQ(c["logprobs"]["content"].size(), s.body["choices"][0]["logprobs"]["content"].size()) << i;
    EXPECT_EQ(c["logprobs"], s.body["choices"][0]["logprobs"]) << i;
  }
  // Streamed: the same texts, assembled per index; one finish chunk per choice; usage last.
  body["stream_options"] = {{"include_usage", true}};
  bool done = false;
  const std::vector<json> events = stream("/v1/chat/completions", body, &done);
  ASSERT_TRUE(done);
  std::map<int, std::string> text;
  std::map<int, int> finishes, roles, lp_tokens;
  json usage;
  for (const json& ev : events) {
    if (ev.contains("usage") && ev["usage"].is_object()) usage = ev["usage"];
    for (const json& c : ev["choices"]) {
      const int i = c["index"];
      if (c["delta"].contains("content")) text[i] += c["delta"]["content"].get<std::string>();
      if (c["delta"].contains("role")) ++roles[i];
      if (!c["finish_reason"].is_null()) ++finishes[i];
      if (c["logprobs"].is_object()) lp_tokens[i] += static_cast<int>(c["logprobs"]["content"].size());
    }
  }
  ASSERT_TRUE(usage.is_object());
  EXPECT_EQ(usage["completion_tokens"], two.body["usage"]["completion_tokens"]);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(text[i], content(two.body["choices"][static_cast<size_t>(i)], true)) << "streamed choice " << i;
    EXPECT_EQ(finishes[i], 1) << i;
    EXPECT_EQ(roles[i], 1) << i;
    EXPECT_EQ(lp_tokens[i], static_cast<int>(two.body["choices"][static_cast<size_t>(i)]["logprobs"]["content"].size())) << i;
  }
}

TEST_F(ChoicesServerTest, NBeyondTheBatchIsAClear400) {
  const Reply r = post("/v1/completions", {{"prompt", "Once"}, {"max_tokens", 2}, {"n", 5}});  // max_running 4
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"]["param"], "n") << r.body;
  const Reply b = post("/v1/completions", {{"prompt", "Once"}, {"max_tokens", 2}, {"n", 2}, {"best_of", 3}});
  EXPECT_EQ(b.status, 400);
  EXPECT_EQ(b.body["error"]["param"], "best_of") << b.body;
}

}  // namespace
}  // namespace kvpack
