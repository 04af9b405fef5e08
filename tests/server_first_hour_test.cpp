// The API pieces a user coming from llama-server or the OpenAI SDK reaches for first, through the real
// server on a loopback port: /tokenize, /detokenize, /v1/models/{id}, model ids without spaces,
// logprobs / top_logprobs (plain and streamed), echo, kv_budget alone per request, and the 400s for
// what stays unsupported.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "live_server_fixture.h"
#include "engine/engine.h"
#include "server/server.h"
#include "server_model_fixture.h"

namespace kvpack {
namespace {

using json = nlohmann::json;

using test::Reply;

using FirstHourServerTest = test::LiveServerTest;

TEST_F(FirstHourServerTest, TokenizeAndDetokenizeRoundTripWithTheModelsTokenizer) {
  const std::string text = "Once upon a time, there was a little dog.";
  const Reply t = post("/tokenize", {{"content", text}});
  ASSERT_EQ(t.status, 200) << t.body;
  std::vector<int32_t> ids;
  for (const auto& x : t.body["tokens"]) ids.push_back(x.get<int32_t>());
  EXPECT_EQ(ids, model_->tokenizer().encode(text, false));
  const Reply bos = post("/tokenize", {{"content", text}, {"add_special", true}});
  ASSERT_EQ(bos.status, 200);
  EXPECT_EQ(bos.body["tokens"][0].get<int32_t>(), model_->tokenizer().bos());
  const Reply pieces = post("/tokenize", {{"content", "little dog"}, {"with_pieces", true}});
  ASSERT_EQ(pieces.status, 200);
  std::string joined;
  for (const auto& p : pieces.body["tokens"]) {
    EXPECT_EQ(p["piece"].get<std::string>(), model_->tokenizer().piece(p["id"].get<int32_t>()));
    joined += p["piece"].get<std::string>();
  }
  EXPECT_NE(joined.find("dog"), std::string::npos) << joined;
  const Reply d = post("/detokenize", {{"tokens", t.body["tokens"]}});
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(d.body["content"], text);
  // Bad input: clear 400s naming the field.
  Reply e = post("/detokenize", {{"tokens", {1, 99999}}});
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.body["error"]["param"], "tokens");
  e = post("/tokenize", json::object());
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.body["error"]["param"], "content");
  auto raw = client()->Post("/tokenize", "{not json", "application/json");
  ASSERT_TRUE(raw);
  EXPECT_EQ(raw->status, 400);
  EXPECT_EQ(get("/tokenize").status, 405);
}

TEST_F(FirstHourServerTest, ModelIdHasNoSpacesAndModelsRetrieveFindsIt) {
  const Reply list = get("/v1/models");
  ASSERT_EQ(list.status, 200);
  const std::string id = list.body["data"][0]["id"];
  EXPECT_EQ(id.find(' '), std::string::npos) << id;
  EXPECT_EQ(id, server::model_id_slug(model_->config().name));
  const Reply one = get("/v1/models/" + id);
  ASSERT_EQ(one.status, 200) << one.body;
  EXPECT_EQ(one.body["id"], id);
  EXPECT_EQ(one.body["object"], "model");
  const Reply missing = get("/v1/models/no-such-model");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.body["error"]["code"], "model_not_found");
  EXPECT_EQ(server::model_id_slug("kvpack testbed  qwen3 6L"), "kvpack-testbed-qwen3-6L");
  EXPECT_EQ(server::model_id_slug(" /?"), "kvpack");
}

// Checks a completions-style logprobs object against the text and the request's k.
void expect_completion_logprobs(const json& lp, const std::string& text, size_t k, size_t n_tokens) {
  ASSERT_TRUE(lp.is_object()) << lp;
  ASSERT_EQ(lp["tokens"].size(), n_tokens);
  std::string joined;
  for (size_t i = 0; i < lp["tokens"].size(); ++i) {
    joined += lp["tokens"][i].get<std::string>();
    const double l = lp["token_logprobs"][i];
    EXPECT_LE(l, 0.0);
    const json& top = lp["top_logprobs"][i];
    EXPECT_LE(top.size(), k);
    EXPECT_GE(top.size(), std::min<size_t>(k, 1));
    // Greedy: the chosen token is the most likely one.
    double best = -INFINITY, mass = 0;
    for (const auto& [piece, v] : top.items()) {
      best = std::max(best, v.get<double>());
      mass += std::exp(v.get<double>());
    }
    if (k > 0) EXPECT_NEAR(l, best, 1e-6);
    EXPECT_LE(mass, 1.0 + 1e-5);
  }
  // SPM drops the leading space of the first piece after BOS in the text, not in the piece.
  EXPECT_NE(joined.find(text.substr(text.size() > 8 ? text.size() - 8 : 0)), std::string::npos) << joined << " | " << text;
}

TEST_F(FirstHourServerTest, CompletionLogprobsPlainAndStreamedAgree) {
  const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 12}, {"temperature", 0}, {"logprobs", 3}, {"ignore_eos", true}};
  const Reply r = post("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string text = r.body["choices"][0]["text"];
  const json& lp = r.body["choices"][0]["logprobs"];
  expect_completion_logprobs(lp, text, 3, 12);
  EXPECT_EQ(lp["text_offset"][0], 0);
  // Streamed: the same tokens and values, spread over the chunks.
  bool done = false;
  const auto events = stream("/v1/completions", body, &done);
  EXPECT_TRUE(done);
  json tokens = json::array(), values = json::array();
  for (const json& ev : events) {
    const json& c = ev["choices"][0];
    if (c["logprobs"].is_null()) continue;
    for (const auto& t : c["logprobs"]["tokens"]) tokens.push_back(t);
    for (const auto& v : c["logprobs"]["token_logprobs"]) values.push_back(v);
  }
  EXPECT_EQ(tokens, lp["tokens"]);
  ASSERT_EQ(values.size(), lp["token_logprobs"].size());
  for (size_t i = 0; i < values.size(); ++i) EXPECT_NEAR(values[i].get<double>(), lp["token_logprobs"][i].get<double>(), 1e-6);
  // Without logprobs the field stays null.
  const Reply plain = post("/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 4}, {"temperature", 0}});
  ASSERT_EQ(plain.status, 200);
  EXPECT_TRUE(plain.body["choices"][0]["logprobs"].is_null());
}

TEST_F(FirstHourServerTest, ChatLogprobsHaveTheOpenAiShapeStreamedToo) {
  const json body = {{"messages", {{{"role", "user"}, {"content", "Tell me a story."}}}},
                     {"max_tokens", 10},
                     {"temperature", 0},
                     {"logprobs", true},
                     {"top_logprobs", 2},
                     {"ignore_eos", true}};
  const Reply r = post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json& content = r.body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 10u);
  for (const auto& e : content) {
    ASSERT_EQ(e["top_logprobs"].size(), 2u);
    EXPECT_NEAR(e["logprob"].get<double>(), e["top_logprobs"][0]["logprob"].get<double>(), 1e-6);  // greedy
    EXPECT_GE(e["top_logprobs"][0]["logprob"].get<double>(), e["top_logprobs"][1]["logprob"].get<double>());
    std::string bytes;
    for (const auto& b : e["bytes"]) bytes += static_cast<char>(b.get<int>());
    EXPECT_EQ(bytes, e["token"].get<std::string>());
  }
  bool done = false;
  size_t streamed = 0;
  for (const json& ev : stream("/v1/chat/completions", body, &done)) {
    if (ev["choices"].empty() || ev["choices"][0]["logprobs"].is_null()) continue;
    for (const auto& e : ev["choices"][0]["logprobs"]["content"]) {
      ASSERT_LT(streamed, content.size());
      EXPECT_EQ(e["token"], content[streamed]["token"]);
      EXPECT_NEAR(e["logprob"].get<double>(), content[streamed]["logprob"].get<double>(), 1e-6);
      ++streamed;
    }
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(streamed, content.size());
  // top_logprobs without logprobs, or beyond 20: 400 naming the field.
  json bad = body;
  bad["logprobs"] = false;
  Reply e = post("/v1/chat/completions", bad);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.body["error"]["param"], "top_logprobs");
  bad = body;
  bad["top_logprobs"] = 21;
  EXPECT_EQ(post("/v1/chat/completions", bad).status, 400);
}

TEST_F(FirstHourServerTest, EchoReturnsThePromptFirstAndRefusesPromptLogprobs) {
  const std::string prompt = "Once upon a time";
  const Reply plain = post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}});
  const Reply echo = post("/v1/completions", {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}, {"echo", true}});
  ASSERT_EQ(echo.status, 200) << echo.body;
  EXPECT_EQ(echo.body["choices"][0]["text"].get<std::string>(), prompt + plain.body["choices"][0]["text"].get<std::string>());
  bool done = false;
  std::string streamed;
  for (const json& ev : stream("/v1/completions", {{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}, {"echo", true}}, &done))
    if (!ev["choices"].empty()) streamed += ev["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(streamed, echo.body["choices"][0]["text"].get<std::string>());
  const Reply e = post("/v1/completions", {{"prompt", prompt}, {"echo", true}, {"logprobs", 1}});
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.body["error"]["param"], "echo");
  EXPECT_EQ(post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"echo", true}}).status, 400);
}

TEST_F(FirstHourServerTest, KvBudgetAloneCompressesWithTheRecommendedPolicy) {
  const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 200}, {"temperature", 0}, {"ignore_eos", true}, {"kv_budget", 48}};
  const Reply r = post("/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_GT(r.body["usage"]["kvpack"]["compactions"].get<int64_t>(), 0) << r.body["usage"];
  // The same request with the policy named gives the same text: the budget alone picked trispan.
  json named = body;
  named["kv_policy"] = "trispan";
  const Reply n = post("/v1/completions", named);
  ASSERT_EQ(n.status, 200);
  EXPECT_EQ(n.body["choices"][0]["text"], r.body["choices"][0]["text"]);
  EXPECT_EQ(n.body["usage"]["kvpack"]["evicted_tokens"], r.body["usage"]["kvpack"]["evicted_tokens"]);
  // kv_budget 0 alone: no compression; kv_policy full with a budget: still a clear 400.
  json off = body;
  off["kv_budget"] = 0;
  const Reply o = post("/v1/completions", off);
  ASSERT_EQ(o.status, 200);
  EXPECT_EQ(o.body["usage"]["kvpack"]["compactions"], 0);
  json full = body;
  full["kv_policy"] = "full";
  const Reply f = post("/v1/completions", full);
  EXPECT_EQ(f.status, 400);
  EXPECT_EQ(f.body["error"]["param"], "kv_budget");
  // triattention on a server started without statistics: a 400 that says how to get them.
  json tri = body;
  tri["kv_policy"] = "triattention";
  const Reply t = post("/v1/completions", tri);
  EXPECT_EQ(t.status, 400);
  EXPECT_NE(t.body["error"]["message"].get<std::string>().find("--kv-calib"), std::string::npos) << t.body;
}

TEST_F(FirstHourServerTest, StillUnsupportedFieldsKeepTheirClear400) {
  for (const auto& [k, v] : std::vector<std::pair<std::string, json>>{{"n", 0}, {"best_of", 2}, {"logit_bias", {{"1", 5}}}}) {
    json b = {{"prompt", "Once"}, {"max_tokens", 2}};
    b[k] = v;
    const Reply r = post("/v1/completions", b);
    EXPECT_EQ(r.status, 400) << k;
    EXPECT_EQ(r.body["error"]["param"], k) << r.body;
  }
}

}  // namespace
}  // namespace kvpack
