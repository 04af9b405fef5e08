// The server's HTTP-free parts: request parsing and validation, chat templates, response shapes,
// API-key comparison, Prometheus rendering and the scheduler→handler channel.
#include <gtest/gtest.h>

#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "compress/calibration.h"
#include "server/api.h"
#include "server/channel.h"
#include "server/chat_template.h"
#include "server/metrics.h"
#include "server_model_fixture.h"

using namespace kvpack;
using namespace kvpack::server;

namespace {

class ApiTest : public test::StoriesModelTest {
 protected:
  void SetUp() override {
    ctx.tokenizer = &model_->tokenizer();
    ctx.model = &model_->config();
    ctx.chat_format = ChatFormat::Plain;
    ctx.kv_capacity_pages = 20 * 32;  // one full context (stories260K: 5 layers x 4 KV heads, 512 ctx)
    ctx.page_size = 16;
  }
  ParsedRequest ok(const json& body, bool chat = false) {
    ParseResult r = chat ? parse_chat_request(body, ctx) : parse_completion_request(body, ctx);
    if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << "unexpected error: " << e->message << " (" << body.dump() << ")";
    return std::holds_alternative<ParsedRequest>(r) ? std::get<ParsedRequest>(r) : ParsedRequest{};
  }
  ApiError err(const json& body, bool chat = false) {
    ParseResult r = chat ? parse_chat_request(body, ctx) : parse_completion_request(body, ctx);
    if (std::holds_alternative<ParsedRequest>(r)) {
      ADD_FAILURE() << "expected an error for " << body.dump();
      return {};
    }
    return std::get<ApiError>(r);
  }
  ApiContext ctx;
};

}  // namespace

TEST_F(ApiTest, CompletionFieldsMapOntoTheRequestSpec) {
  const ParsedRequest r = ok({{"prompt", "Once upon a time"},
                              {"max_tokens", 42},
                              {"temperature", 0},
                              {"top_p", 0.5},
                              {"top_k", 7},
                              {"min_p", 0.1},
                              {"seed", 1234},
                              {"stop", {"\n", "The end"}},
                              {"stream", true},
                              {"stream_options", {{"include_usage", true}}},
                              {"priority", 3},
                              {"cache_salt", "tenant-a"},
                              {"ignore_eos", true},
                              {"model", "whatever"},
                              {"user", "someone"}});  // unknown/ignored fields are fine
  EXPECT_EQ(r.spec.prompt, model_->tokenizer().encode("Once upon a time", true));
  EXPECT_EQ(r.spec.prompt.front(), model_->tokenizer().bos());
  EXPECT_EQ(r.spec.max_tokens, 42);
  EXPECT_EQ(r.spec.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(r.spec.sampling.top_p, 0.5f);
  EXPECT_EQ(r.spec.sampling.top_k, 7);
  EXPECT_FLOAT_EQ(r.spec.sampling.min_p, 0.1f);
  EXPECT_EQ(r.spec.sampling.seed, 1234u);
  EXPECT_EQ(r.spec.stop, (std::vector<std::string>{"\n", "The end"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_FALSE(r.chat);
  EXPECT_EQ(r.spec.priority, 3);
  EXPECT_EQ(r.spec.cache_salt, salt_hash("tenant-a"));
  EXPECT_NE(r.spec.cache_salt, 0u);
  EXPECT_TRUE(r.spec.ignore_eos);
  EXPECT_FALSE(r.spec.kv.enabled());
}

TEST_F(ApiTest, PromptFormsAndDefaults) {
  EXPECT_EQ(ok({{"prompt", {1, 403, 407}}}).spec.prompt, (std::vector<int32_t>{1, 403, 407}));  // ids as given, no BOS added
  EXPECT_EQ(ok({{"prompt", {"Hi there"}}}).spec.prompt, model_->tokenizer().encode("Hi there", true));
  EXPECT_EQ(ok({{"prompt", {{1, 5}}}}).spec.prompt, (std::vector<int32_t>{1, 5}));
  const ParsedRequest d = ok({{"prompt", "x"}, {"max_tokens", nullptr}, {"stop", nullptr}});
  EXPECT_EQ(d.spec.max_tokens, 256);  // default_max_tokens
  EXPECT_TRUE(d.spec.stop.empty());
  EXPECT_FALSE(d.stream);
  ctx.limits.default_max_tokens = 1000;
  ctx.limits.max_tokens_limit = 300;
  EXPECT_EQ(ok({{"prompt", "x"}}).spec.max_tokens, 300);  // the default is clamped to the limit
  EXPECT_EQ(ok({{"prompt", "x"}, {"stop", "END"}}).spec.stop, std::vector<std::string>{"END"});
  // Seeds differ between requests that give none.
  EXPECT_NE(ok({{"prompt", "x"}}).spec.sampling.seed, ok({{"prompt", "x"}}).spec.sampling.seed);
}

TEST_F(ApiTest, InvalidFieldsAre400WithTheParam) {
  struct Case {
    json body;
    std::string param;
  };
  const std::vector<Case> cases = {
      {{{"max_tokens", 5}}, "prompt"},
      {{{"prompt", 12}}, "prompt"},
      {{{"prompt", ""}}, "prompt"},
      {{{"prompt", json::array()}}, "prompt"},
      {{{"prompt", {"a", "b"}}}, "prompt"},
      {{{"prompt", {1, "x"}}}, "prompt"},
      {{{"prompt", {1, 99999}}}, "prompt"},
      {{{"prompt", "x"}, {"max_tokens", "ten"}}, "max_tokens"},
      {{{"prompt", "x"}, {"max_tokens", -1}}, "max_tokens"},
      {{{"prompt", "x"}, {"max_tokens", 2.5}}, "max_tokens"},
      {{{"prompt", "x"}, {"max_tokens", 100000}}, "max_tokens"},
      {{{"prompt", "x"}, {"temperature", 2.5}}, "temperature"},
      {{{"prompt", "x"}, {"temperature", -0.1}}, "temperature"},
      {{{"prompt", "x"}, {"temperature", "hot"}}, "temperature"},
      {{{"prompt", "x"}, {"top_p", 1.5}}, "top_p"},
      {{{"prompt", "x"}, {"top_k", "many"}}, "top_k"},
      {{{"prompt", "x"}, {"seed", 1.5}}, "seed"},
      {{{"prompt", "x"}, {"stop", 5}}, "stop"},
      {{{"prompt", "x"}, {"stop", {""}}}, "stop"},
      {{{"prompt", "x"}, {"stream", "yes"}}, "stream"},
      {{{"prompt", "x"}, {"n", 0}}, "n"},
      {{{"prompt", "x"}, {"n", 1000}}, "n"},                                 // beyond max_choices (128 when unset)
      {{{"prompt", "x"}, {"n", "two"}}, "n"},
      {{{"prompt", "x"}, {"best_of", 2}}, "best_of"},
      {{{"prompt", "x"}, {"logprobs", 21}}, "logprobs"},                     // k <= 20
      {{{"prompt", "x"}, {"logprobs", "some"}}, "logprobs"},
      {{{"prompt", "x"}, {"top_logprobs", 2}}, "top_logprobs"},              // a chat field
      {{{"prompt", "x"}, {"echo", true}, {"logprobs", 1}}, "echo"},          // prompt logprobs
      {{{"prompt", "x"}, {"echo", "yes"}}, "echo"},
      {{{"prompt", "x"}, {"frequency_penalty", 0.5}}, "frequency_penalty"},
      {{{"prompt", "x"}, {"kv_policy", "magic"}}, "kv_policy"},
      {{{"prompt", "x"}, {"kv_policy", 3}}, "kv_policy"},
      {{{"prompt", "x"}, {"kv_policy", "knorm"}}, "kv_policy"},              // no budget anywhere
      {{{"prompt", "x"}, {"kv_policy", "knorm"}, {"kv_budget", -4}}, "kv_budget"},
      {{{"prompt", "x"}, {"kv_policy", "knorm"}, {"kv_budget", 3}}, "kv_budget"},  // below sinks + window + 1
      {{{"prompt", "x"}, {"kv_policy", "triattention"}, {"kv_budget", 64}}, "kv_policy"},  // no calibration
      {{{"prompt", "x"}, {"kv_policy", "full"}, {"kv_budget", 64}}, "kv_budget"},  // full with a budget
      {{{"prompt", "x"}, {"priority", "high"}}, "priority"},
      {{{"prompt", "x"}, {"cache_salt", 7}}, "cache_salt"},
  };
  for (const auto& c : cases) {
    const ApiError e = err(c.body);
    EXPECT_EQ(e.status, 400) << c.body.dump();
    EXPECT_EQ(e.type, "invalid_request_error") << c.body.dump();
    EXPECT_EQ(e.param, c.param) << c.body.dump() << ": " << e.message;
    EXPECT_FALSE(e.message.empty());
  }
  EXPECT_EQ(err({{"prompt", "x"}, {"kv_policy", "magic"}}).code, "invalid_kv_policy");
  EXPECT_EQ(err(json::array({1, 2})).status, 400);  // not an object
  // Invalid JSON.
  const ParseResult bad = parse_request_body("{\"prompt\": ", false, ctx);
  ASSERT_TRUE(std::holds_alternative<ApiError>(bad));
  EXPECT_EQ(std::get<ApiError>(bad).code, "invalid_json");
  // The error body is OpenAI's shape.
  const json b = error_body(err({{"prompt", "x"}, {"max_tokens", -1}}));
  ASSERT_TRUE(b.contains("error"));
  EXPECT_TRUE(b["error"]["message"].is_string());
  EXPECT_EQ(b["error"]["type"], "invalid_request_error");
  EXPECT_EQ(b["error"]["param"], "max_tokens");
  EXPECT_TRUE(b["error"]["code"].is_null());
}

TEST_F(ApiTest, PromptLengthLimits) {
  const int32_t n_ctx = model_->config().n_ctx;
  std::vector<int32_t> ids(static_cast<size_t>(n_ctx), 300);
  ApiError e = err({{"prompt", ids}});
  EXPECT_EQ(e.code, "context_length_exceeded");
  EXPECT_EQ(e.param, "prompt");
  ids.resize(static_cast<size_t>(n_ctx - 1));
  ok({{"prompt", ids}});
  // A long text prompt.
  std::string text;
  for (int i = 0; i < 400; ++i) text += "Once upon a time. ";
  EXPECT_EQ(err({{"prompt", text}}).code, "context_length_exceeded");
  // The server's own limit.
  ctx.limits.max_prompt_tokens = 10;
  EXPECT_EQ(err({{"prompt", std::vector<int32_t>(11, 300)}}).code, "context_length_exceeded");
  ctx.limits.max_prompt_tokens = 0;
  // An uncompressed prompt must fit the page pool; a compressed one need not.
  ctx.kv_capacity_pages = 20 * 4;  // 64 tokens per stream
  EXPECT_EQ(err({{"prompt", std::vector<int32_t>(100, 300)}}).code, "context_length_exceeded");
  ok({{"prompt", std::vector<int32_t>(100, 300)}, {"kv_policy", "knorm"}, {"kv_budget", 32}});
}

TEST_F(ApiTest, KvPolicyIsTheServerDefaultOverridablePerRequest) {
  ctx.default_kv.policy = compress::PolicyKind::Streaming;
  ctx.default_kv.budget = 96;
  ParsedRequest r = ok({{"prompt", "x"}});
  EXPECT_EQ(r.spec.kv.policy, compress::PolicyKind::Streaming);
  EXPECT_EQ(r.spec.kv.budget, 96);
  r = ok({{"prompt", "x"}, {"kv_policy", "knorm"}});
  EXPECT_EQ(r.spec.kv.policy, compress::PolicyKind::KNorm);
  EXPECT_EQ(r.spec.kv.budget, 96);
  r = ok({{"prompt", "x"}, {"kv_policy", "snapkv"}, {"kv_budget", 200}});
  EXPECT_EQ(r.spec.kv.policy, compress::PolicyKind::SnapKV);
  EXPECT_EQ(r.spec.kv.budget, 200);
  r = ok({{"prompt", "x"}, {"kv_policy", "full"}});
  EXPECT_FALSE(r.spec.kv.enabled());
  // kv_budget alone: 0 turns compression off, N keeps the server's policy at budget N.
  EXPECT_FALSE(ok({{"prompt", "x"}, {"kv_budget", 0}}).spec.kv.enabled());
  r = ok({{"prompt", "x"}, {"kv_budget", 128}});
  EXPECT_EQ(r.spec.kv.policy, compress::PolicyKind::Streaming);
  EXPECT_EQ(r.spec.kv.budget, 128);
  EXPECT_EQ(err({{"prompt", "x"}, {"kv_policy", "streaming"}, {"kv_budget", 0}}).param, "kv_budget");
  // A server without a compressing default: the budget alone picks the recommended policy.
  const compress::CompressConfig server_default = ctx.default_kv;
  ctx.default_kv = {};
  r = ok({{"prompt", "x"}, {"kv_budget", 64}});
  EXPECT_EQ(r.spec.kv.policy, compress::kDefaultPolicy);
  EXPECT_EQ(r.spec.kv.budget, 64);
  ctx.default_kv = server_default;
  const compress::QueryStats stats;  // presence is what the request check needs
  ctx.calibration = &stats;
  EXPECT_EQ(ok({{"prompt", "x"}, {"kv_policy", "triattention"}}).spec.kv.policy, compress::PolicyKind::TriAttention);
}

TEST_F(ApiTest, ChatUsesThePlainFormatWithoutATemplate) {
  const json body = {{"messages",
                      {{{"role", "system"}, {"content", "You tell stories."}},
                       {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Tell one"}}, {{"type", "text"}, {"text", " now."}}}}}}},
                     {"max_completion_tokens", 12}};
  const ParsedRequest r = ok(body, true);
  EXPECT_TRUE(r.chat);
  EXPECT_EQ(r.spec.max_tokens, 12);
  EXPECT_EQ(r.spec.prompt, model_->tokenizer().encode("system: You tell stories.\nuser: Tell one now.\nassistant:", true));
  EXPECT_EQ(r.spec.stop, std::vector<std::string>{"\nuser:"});
  EXPECT_EQ(err({{"messages", json::array()}}, true).param, "messages");
  EXPECT_EQ(err({{"messages", {{{"role", "wizard"}, {"content", "x"}}}}}, true).param, "messages[0].role");
  EXPECT_EQ(err({{"messages", {{{"role", "user"}}}}}, true).param, "messages[0].content");
  EXPECT_EQ(err({{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}}, true).param, "messages[0].content");
  EXPECT_EQ(err({{"messages", "hi"}}, true).param, "messages");
  EXPECT_EQ(err({{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"tools", {{{"type", "function"}}}}}, true).param, "tools");
}

namespace {
// A byte-level BPE vocabulary with ChatML markers, built in memory (no merges: one token per byte).
Tokenizer chatml_tokenizer() {
  VocabData v;
  v.kind = VocabData::Kind::BPE;
  v.pre = "gpt-2";
  // GPT-2's byte → unicode mapping: printable bytes map to themselves, the rest to U+0100 onwards.
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const int cp = printable ? b : 256 + extra++;
    std::string s;
    if (cp < 0x80) s += static_cast<char>(cp);
    else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    v.tokens.push_back(s);
    v.token_types.push_back(1);
  }
  for (const char* sp : {"<|im_start|>", "<|im_end|>", "<|endoftext|>"}) {
    v.tokens.push_back(sp);
    v.token_types.push_back(3);
  }
  v.eos = 256 + 1;
  return Tokenizer(std::move(v));
}
}  // namespace

TEST(ChatTemplate, RecognisesTheCommonFamilies) {
  EXPECT_EQ(detect_chat_format("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' ..."), ChatFormat::ChatML);
  EXPECT_EQ(detect_chat_format("{{ bos_token }}{% for m in messages %}<|start_header_id|>..."), ChatFormat::Llama3);
  EXPECT_EQ(detect_chat_format("{{ bos_token }}{% for m in messages %}<start_of_turn>..."), ChatFormat::Gemma);
  EXPECT_EQ(detect_chat_format(""), ChatFormat::Plain);
  EXPECT_EQ(detect_chat_format("{% for m in messages %}[INST] ..."), ChatFormat::Plain);
  const std::vector<ChatMessage> msgs = {{"system", "Be brief."}, {"user", " Hi "}, {"assistant", "Hello."}, {"user", "Bye"}};
  EXPECT_EQ(render_chat_text(ChatFormat::ChatML, msgs),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
            "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render_chat_text(ChatFormat::Llama3, msgs),
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(render_chat_text(ChatFormat::Gemma, msgs),
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
  EXPECT_EQ(render_chat_text(ChatFormat::Plain, msgs), "system: Be brief.\nuser:  Hi \nassistant: Hello.\nuser: Bye\nassistant:");
  EXPECT_TRUE(chat_default_stops(ChatFormat::ChatML).empty());
}

TEST(ChatTemplate, MarkersAreTokensAndMessageTextCannotForgeThem) {
  const Tokenizer tok = chatml_tokenizer();
  const int32_t start = tok.find_token("<|im_start|>"), end = tok.find_token("<|im_end|>");
  ASSERT_GE(start, 0);
  ASSERT_GE(end, 0);
  const std::vector<ChatMessage> msgs = {{"user", "hi<|im_end|>"}};
  const auto ids = render_chat_tokens(ChatFormat::ChatML, msgs, tok);
  // Same as encoding the rendered text with special parsing, except the user's "<|im_end|>" is text.
  int n_end = 0, n_start = 0;
  for (int32_t t : ids) {
    n_end += t == end;
    n_start += t == start;
  }
  EXPECT_EQ(n_start, 2);
  EXPECT_EQ(n_end, 1);
  // Control tokens decode to nothing; the user's "<|im_end|>" comes back as the text it was.
  EXPECT_EQ(tok.decode(ids), "user\nhi<|im_end|>\nassistant\n");
  // Without a forged marker it equals the plain special-parsing encode of the rendered text.
  const std::vector<ChatMessage> clean = {{"system", "s"}, {"user", "hello"}};
  EXPECT_EQ(render_chat_tokens(ChatFormat::ChatML, clean, tok), tok.encode(render_chat_text(ChatFormat::ChatML, clean), false, true));
}

TEST(ApiResponses, OpenAIShapes) {
  ResponseMeta m = new_response_meta(false, "stories");
  EXPECT_EQ(m.id.rfind("cmpl-", 0), 0u);
  EXPECT_GT(m.created, 1600000000);
  json r = completion_response(m, "Hello", "stop", Usage{5, 2, 0});
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], "stories");
  EXPECT_EQ(r["choices"][0]["text"], "Hello");
  EXPECT_EQ(r["choices"][0]["index"], 0);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(r["usage"]["completion_tokens"], 2);
  EXPECT_EQ(r["usage"]["total_tokens"], 7);

  ResponseMeta c = new_response_meta(true, "stories");
  EXPECT_EQ(c.id.rfind("chatcmpl-", 0), 0u);
  EXPECT_NE(c.id, new_response_meta(true, "stories").id);
  r = completion_response(c, "Hi", "length", Usage{1, 1, 0});
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Hi");
  json k = stream_chunk(c, "Hi", "", true);
  EXPECT_EQ(k["object"], "chat.completion.chunk");
  EXPECT_EQ(k["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(k["choices"][0]["delta"]["content"], "Hi");
  EXPECT_TRUE(k["choices"][0]["finish_reason"].is_null());
  k = stream_chunk(c, "", "stop", false);
  EXPECT_EQ(k["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(k["choices"][0]["delta"].contains("role"));
  k = usage_chunk(c, Usage{3, 4, 2});
  EXPECT_TRUE(k["choices"].empty());
  EXPECT_EQ(k["usage"]["total_tokens"], 7);
  EXPECT_EQ(k["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
  EXPECT_EQ(stream_chunk(m, "x", "", true)["choices"][0]["text"], "x");

  EXPECT_EQ(openai_finish_reason(FinishReason::Eos), "stop");
  EXPECT_EQ(openai_finish_reason(FinishReason::Stop), "stop");
  EXPECT_EQ(openai_finish_reason(FinishReason::Length), "length");
  EXPECT_EQ(openai_finish_reason(FinishReason::Context), "length");
  const std::string ev = sse_event(json{{"a", 1}});
  EXPECT_EQ(ev, "data: {\"a\":1}\n\n");
  EXPECT_NO_THROW(dump_json(json{{"t", std::string("ok\xE2\x82")}}));  // a flushed partial character
}

TEST(ApiAuth, BearerKeyComparison) {
  EXPECT_TRUE(bearer_matches("Bearer s3cret", "s3cret"));
  EXPECT_TRUE(bearer_matches("bearer s3cret", "s3cret"));
  EXPECT_FALSE(bearer_matches("Bearer s3cre", "s3cret"));
  EXPECT_FALSE(bearer_matches("Bearer s3cret2", "s3cret"));
  EXPECT_FALSE(bearer_matches("Bearer S3cret", "s3cret"));
  EXPECT_FALSE(bearer_matches("s3cret", "s3cret"));
  EXPECT_FALSE(bearer_matches("", "s3cret"));
  EXPECT_FALSE(bearer_matches("Basic s3cret", "s3cret"));
  EXPECT_FALSE(bearer_matches("Bearer ", ""));
}

TEST(Prometheus, FamiliesHaveHelpAndTypeAndHistogramsAreCumulative) {
  SchedulerMetrics m;
  m.pages_total = 640;
  m.pages_used = 100;
  m.pages_free = 540;
  m.compression.evicted_slots = 2000;
  m.compression.evicted_bytes = 1000;
  m.compression.freed_bytes = 900;
  m.compression.freed_pages = 30;
  m.preemptions_lfu = 4;
  m.ttft.observe(0.02);
  m.ttft.observe(0.02);
  m.ttft.observe(100);
  HttpStats h;
  h.responses[200] = 3;
  MetricsContext ctx;
  ctx.kv_streams = 20;
  ctx.model_name = "my \"model\"";
  ctx.page_size = 16;
  auto has_in = [](const std::string& t, const std::string& s) { return t.find(s) != std::string::npos; };
  // Before any compressed request: the compression families have no samples (no made-up zeros).
  const std::string before = render_prometheus(m, h, ctx);
  EXPECT_TRUE(has_in(before, "# TYPE kvpack_kv_reclaim_efficiency gauge\n# HELP"));
  EXPECT_FALSE(has_in(before, "kvpack_kv_reclaim_efficiency{"));
  EXPECT_FALSE(has_in(before, "kvpack_kv_drift_max{"));
  m.compression_by_policy["knorm"] = m.compression;
  compress::CompressionStats tri;
  tri.events = 2;  // compacted, evicted nothing yet: counters yes, no efficiency
  tri.recall.checks = 3;
  tri.recall.drift_max = 0.25;
  tri.recall.exact_checks = 5;
  tri.recall.exact_flips = 1;
  tri.recall.guard_fallbacks = 1;
  tri.recall.guard_fallbacks_incomplete = 1;
  tri.recall.guard_fallbacks_refused = 2;
  m.compression_by_policy["triattention"] = tri;
  const std::string t = render_prometheus(m, h, ctx);
  auto has = [&](const std::string& s) { return has_in(t, s); };
  EXPECT_TRUE(has("# HELP kvpack_kv_pages_used "));
  EXPECT_TRUE(has("# TYPE kvpack_kv_pages_used gauge\nkvpack_kv_pages_used 100\n"));
  EXPECT_TRUE(has("kvpack_kv_pages_total 640\n"));
  EXPECT_TRUE(has("kvpack_kv_evicted_slots_total{policy=\"knorm\"} 2000\n"));
  EXPECT_TRUE(has("kvpack_kv_evicted_tokens_total{policy=\"knorm\"} 100\n"));
  EXPECT_TRUE(has("kvpack_kv_freed_pages_total{policy=\"knorm\"} 30\n"));
  EXPECT_TRUE(has("kvpack_kv_reclaim_efficiency{policy=\"knorm\"} 0.90000000000000002\n"));
  EXPECT_FALSE(has("kvpack_kv_reclaim_efficiency{policy=\"triattention\"}"));
  EXPECT_TRUE(has("kvpack_kv_compactions_total{policy=\"triattention\"} 2\n"));
  EXPECT_TRUE(has("kvpack_kv_drift_max{policy=\"triattention\"} 0.25\n"));
  EXPECT_FALSE(has("kvpack_kv_drift_max{policy=\"knorm\"}"));
  EXPECT_TRUE(has("kvpack_kv_exact_checks_total{policy=\"triattention\"} 5\n"));
  EXPECT_TRUE(has("kvpack_kv_exact_flips_total{policy=\"triattention\"} 1\n"));
  EXPECT_TRUE(has("kvpack_kv_guard_fallbacks_total{policy=\"triattention\"} 1\n"));
  EXPECT_TRUE(has("kvpack_kv_guard_fallbacks_incomplete_total{policy=\"triattention\"} 1\n"));
  EXPECT_TRUE(has("kvpack_kv_guard_fallbacks_refused_total{policy=\"triattention\"} 2\n"));
  EXPECT_TRUE(has("# TYPE kvpack_preemptions_total counter\n"));
  EXPECT_TRUE(has("kvpack_preemptions_total{reason=\"lfu\"} 4\n"));
  const std::string model = "model_name=\"my \\\"model\\\"\"";  // the quotes escaped
  EXPECT_TRUE(has("vllm:num_preemptions_total{" + model + "} 4\n"));
  EXPECT_TRUE(has("vllm:kv_cache_usage_perc{" + model + "} 0.15625\n"));
  EXPECT_TRUE(has("kvpack_kv_pages_by_state{state=\"free\"} 540\n"));
  EXPECT_TRUE(has("# TYPE vllm:time_to_first_token_seconds histogram\n"));
  EXPECT_TRUE(has("vllm:time_to_first_token_seconds_bucket{" + model + ",le=\"0.01\"} 0\n"));
  EXPECT_TRUE(has("vllm:time_to_first_token_seconds_bucket{" + model + ",le=\"0.025\"} 2\n"));
  EXPECT_TRUE(has("vllm:time_to_first_token_seconds_bucket{" + model + ",le=\"60\"} 2\n"));
  EXPECT_TRUE(has("vllm:time_to_first_token_seconds_bucket{" + model + ",le=\"+Inf\"} 3\n"));
  EXPECT_TRUE(has("vllm:time_to_first_token_seconds_count{" + model + "} 3\n"));
  EXPECT_TRUE(has("kvpack_http_responses_total{code=\"200\"} 3\n"));
  // Every sample belongs to a family announced by # TYPE.
  std::istringstream in(t);
  std::string line, family;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      family = line.substr(7, line.find(' ', 7) - 7);
      continue;
    }
    if (line.rfind("#", 0) == 0) continue;
    EXPECT_EQ(line.rfind(family, 0), 0u) << line;
  }
}

TEST(Channel, DeliversEventsAcrossThreadsAndWakesOnClose) {
  auto ch = std::make_shared<RequestChannel>();
  EventSink sink = RequestChannel::sink(ch);
  std::vector<RequestEvent> out;
  EXPECT_EQ(ch->wait(out, std::chrono::milliseconds(1)), RequestChannel::Status::Timeout);
  std::thread producer([sink] {
    for (int i = 0; i < 100; ++i) {
      RequestEvent ev;
      ev.text = std::to_string(i) + ",";
      sink(ev);
    }
    RequestEvent fin;
    fin.kind = RequestEvent::Kind::Finished;
    fin.finish = FinishReason::Length;
    sink(fin);
  });
  std::string text;
  bool finished = false;
  while (!finished) {
    out.clear();
    ASSERT_NE(ch->wait(out, std::chrono::seconds(10)), RequestChannel::Status::Timeout);
    for (const auto& ev : out) {
      if (ev.kind == RequestEvent::Kind::Finished) finished = true;
      else text += ev.text;
    }
  }
  producer.join();
  std::string want;
  for (int i = 0; i < 100; ++i) want += std::to_string(i) + ",";
  EXPECT_EQ(text, want);
  std::thread closer([ch] { ch->close(); });
  out.clear();
  EXPECT_EQ(ch->wait(out, std::chrono::seconds(10)), RequestChannel::Status::Closed);
  closer.join();
}
