// The real server on a loopback port (in-process, port 0), driven by httplib::Client (a client only: the
// server is Beast / Asio, src/server/http_server.h), on stories260K:
// batched/streamed greedy outputs equal single-request runs and Engine::generate; a shared system prompt
// hits the prefix cache; a tiny page pool forces preemption without changing any output; a client that
// disconnects (streaming or not) gets its request cancelled and its pages freed; bad requests get the
// right 4xx; /metrics agrees with the pool's and the scheduler's own accounting.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "server/api.h"
#include "server/chat_template.h"
#include "server/server.h"
#include "server_model_fixture.h"

using namespace kvpack;
using json = nlohmann::json;

namespace {

// The client side may write to a socket the server has closed; that must not kill the test.
const bool kNoSigpipe = [] { return signal(SIGPIPE, SIG_IGN) != SIG_ERR; }();

const std::vector<std::string> kPrompts = {
    "Once upon a time", "The little dog", "Lily and Ben went to the park", "One day, a big bird",
    "Tom had a red ball", "Sara wanted a cookie",
};

struct Reply {
  int status = 0;
  json body;
  std::string raw;
  httplib::Headers headers;
};

std::unique_ptr<httplib::Client> client(int port) {
  auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
  c->set_read_timeout(120, 0);  // generous for sanitizer builds; every test bounds its own work
  c->set_write_timeout(10, 0);
  return c;
}

Reply to_reply(const httplib::Result& r) {
  Reply out;
  if (!r) return out;  // status 0: transport error
  out.status = r->status;
  out.raw = r->body;
  out.headers = r->headers;
  out.body = json::parse(r->body, nullptr, false);
  return out;
}

Reply post(int port, const std::string& path, const std::string& body, const httplib::Headers& h = {}) {
  return to_reply(client(port)->Post(path.c_str(), h, body, "application/json"));
}
Reply post(int port, const std::string& path, const json& body, const httplib::Headers& h = {}) {
  return post(port, path, body.dump(), h);
}
Reply get(int port, const std::string& path, const httplib::Headers& h = {}) { return to_reply(client(port)->Get(path.c_str(), h)); }

struct Streamed {
  int status = 0;
  std::string text, finish_reason, error;
  json usage;
  int chunks = 0;
  bool done = false;
  bool transport_ok = false;
};

// Streams a request; `keep_going(chunks so far)` returning false disconnects.
Streamed stream(int port, const std::string& path, json body, const std::function<bool(int)>& keep_going = nullptr) {
  body["stream"] = true;
  Streamed s;
  std::string buf;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = {{"Content-Type", "application/json"}};
  req.body = body.dump();
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    buf.append(d, n);
    for (size_t end; (end = buf.find("\n\n")) != std::string::npos;) {
      const std::string ev = buf.substr(0, end);
      buf.erase(0, end + 2);
      if (ev.rfind("data: ", 0) != 0) continue;  // comments (keep-alive)
      const std::string data = ev.substr(6);
      if (data == "[DONE]") {
        s.done = true;
        continue;
      }
      const json j = json::parse(data);
      if (j.contains("error")) {
        s.error = j["error"]["message"];
        continue;
      }
      if (j.contains("usage") && !j["usage"].is_null()) s.usage = j["usage"];
      if (j["choices"].empty()) continue;
      const json& c = j["choices"][0];
      if (c.contains("text")) s.text += c["text"].get<std::string>();
      if (c.contains("delta") && c["delta"].contains("content")) s.text += c["delta"]["content"].get<std::string>();
      if (!c["finish_reason"].is_null()) s.finish_reason = c["finish_reason"];
      ++s.chunks;
    }
    return !keep_going || keep_going(s.chunks);
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  s.transport_ok = client(port)->send(req, res, err);
  s.status = res.status;
  return s;
}

double metric(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
  ADD_FAILURE() << "metric " << name << " not found";
  return NAN;
}

// Polls `f` every 10 ms for at most `seconds`.
template <class F>
bool eventually(F f, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return f();
}

// One thread per engine: the shared CI cores are often busy, and a descheduled pool thread stalls
// every forward pass of a multi-threaded engine. The references use the same options.
EngineOptions engine_options() {
  EngineOptions eo;
  eo.threads = 1;
  return eo;
}

class ServerTest : public test::StoriesModelTest {
 protected:
  void TearDown() override {
    if (srv) {
      srv->stop();
      // Idle now: the scheduler thread is gone, so its state can be read from here.
      EXPECT_EQ(srv->scheduler().check_invariants(), "");
    }
    srv.reset();
    engine.reset();
  }

  int start(server::ServerOptions opt = {}, EngineOptions eo = engine_options()) {
    engine = std::make_unique<Engine>(*model_, eo);
    opt.host = "127.0.0.1";
    opt.port = 0;
    srv = std::make_unique<server::Server>(*engine, opt);
    port = srv->start();
    return port;
  }

  const Tokenizer& tok() const { return model_->tokenizer(); }

  // What a single request gives on its own engine: the reference for every comparison.
  GenerateResult reference(std::vector<int32_t> prompt, int32_t n, bool ignore_eos = false,
                           std::vector<std::string> stop = {}) const {
    Engine e(*model_, engine_options());
    Request r;
    r.prompt = std::move(prompt);
    r.max_tokens = n;
    r.sampling.temperature = 0;
    r.ignore_eos = ignore_eos;
    r.stop = std::move(stop);
    return e.generate(r, nullptr);
  }
  GenerateResult reference(const std::string& prompt, int32_t n, bool ignore_eos = false) const {
    return reference(tok().encode(prompt, tok().add_bos_default()), n, ignore_eos);
  }

  // Waits until the scheduler has nothing running or waiting (bounded).
  bool wait_idle(double seconds = 30) {
    return eventually([&] {
      const auto m = srv->scheduler().metrics();
      return m.running == 0 && m.waiting == 0;
    }, seconds);
  }

  std::unique_ptr<Engine> engine;
  std::unique_ptr<server::Server> srv;
  int port = 0;
};

json completion(const std::string& prompt, int n, bool ignore_eos = false) {
  return json{{"prompt", prompt}, {"max_tokens", n}, {"temperature", 0}, {"ignore_eos", ignore_eos}};
}

}  // namespace

TEST_F(ServerTest, ConcurrentStreamsGiveTheSingleRequestGreedyTokens) {
  start();
  constexpr int kN = 120;
  std::map<std::string, GenerateResult> want;
  for (const auto& p : kPrompts) want[p] = reference(p, kN, true);

  // Each prompt alone, not streamed: equal to Engine::generate.
  std::map<std::string, std::string> alone;
  for (const auto& p : kPrompts) {
    const Reply r = post(port, "/v1/completions", completion(p, kN, true));
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["object"], "text_completion");
    EXPECT_EQ(r.body["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(r.body["usage"]["completion_tokens"], kN);
    EXPECT_EQ(r.body["usage"]["prompt_tokens"], want[p].prompt_tokens);
    alone[p] = r.body["choices"][0]["text"];
    EXPECT_EQ(alone[p], want[p].text) << p;
  }

  // All at once, streamed, from concurrent clients: the same text, token for token.
  std::vector<Streamed> got(kPrompts.size());
  std::vector<std::thread> threads;
  std::atomic<bool> go{false};
  for (size_t i = 0; i < kPrompts.size(); ++i)
    threads.emplace_back([&, i] {
      while (!go) std::this_thread::yield();
      json body = completion(kPrompts[i], kN, true);
      body["stream_options"] = {{"include_usage", true}};
      got[i] = stream(port, "/v1/completions", body);
    });
  go = true;
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    const std::string& p = kPrompts[i];
    EXPECT_EQ(got[i].status, 200);
    EXPECT_TRUE(got[i].done) << p;
    EXPECT_EQ(got[i].text, alone[p]) << p;
    EXPECT_EQ(got[i].finish_reason, "length");
    EXPECT_GT(got[i].chunks, 10);
    EXPECT_EQ(got[i].usage["completion_tokens"], kN);
    EXPECT_EQ(got[i].usage["total_tokens"], kN + want[p].prompt_tokens);
  }
  EXPECT_GE(srv->scheduler().metrics().peak_running, 2) << "the streams were never batched together";

  // Natural stops (EOS / a stop string) map to "stop".
  const GenerateResult eos = reference("Once upon a time", 300);
  const Reply r = post(port, "/v1/completions", completion("Once upon a time", 300));
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.body["choices"][0]["text"], eos.text);
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], eos.finish == FinishReason::Eos ? "stop" : "length");
  json with_stop = completion("Once upon a time", 100);
  with_stop["stop"] = ".";
  const Reply s = post(port, "/v1/completions", with_stop);
  ASSERT_EQ(s.status, 200);
  EXPECT_EQ(s.body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(s.body["choices"][0]["text"], eos.text.substr(0, eos.text.find('.')));
}

TEST_F(ServerTest, SharedSystemPromptHitsThePrefixCacheWithIdenticalOutputs) {
  start();
  const std::string system =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her dog, "
      "Max. Every day they ran and jumped and played in the sun. One day, Lily found a big red ball under a tree.";
  const std::vector<std::string> users = {"Tell me what happened next.", "Who was Max?", "What did Lily find?", "Where did they play?"};
  auto body = [&](const std::string& u) {
    return json{{"messages", {{{"role", "system"}, {"content", system}}, {{"role", "user"}, {"content", u}}}},
                {"max_tokens", 40},
                {"temperature", 0}};
  };
  auto want = [&](const std::string& u) {
    const auto prompt = server::render_chat_tokens(server::ChatFormat::Plain, {{"system", system}, {"user", u}}, tok());
    EXPECT_GT(prompt.size(), 48u);  // at least three full 16-token blocks to share
    return reference(prompt, 40, false, server::chat_default_stops(server::ChatFormat::Plain)).text;
  };
  // The first request fills the cache; the others share its system prompt blocks.
  Reply first = post(port, "/v1/chat/completions", body(users[0]));
  ASSERT_EQ(first.status, 200) << first.raw;
  EXPECT_EQ(first.body["object"], "chat.completion");
  EXPECT_EQ(first.body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(first.body["choices"][0]["message"]["content"], want(users[0]));
  std::vector<Streamed> got(users.size());
  std::vector<std::thread> threads;
  for (size_t i = 1; i < users.size(); ++i)
    threads.emplace_back([&, i] {
      json b = body(users[i]);
      b["stream_options"] = {{"include_usage", true}};
      got[i] = stream(port, "/v1/chat/completions", b);
    });
  for (auto& t : threads) t.join();
  for (size_t i = 1; i < users.size(); ++i) {
    EXPECT_TRUE(got[i].done);
    EXPECT_EQ(got[i].text, want(users[i])) << users[i];
    EXPECT_GE(got[i].usage["prompt_tokens_details"]["cached_tokens"].get<int>(), 48) << users[i];
  }
  const std::string m = get(port, "/metrics").raw;
  EXPECT_GE(metric(m, "kvpack_prefix_cache_hits_total"), 3);
  EXPECT_GE(metric(m, "kvpack_prefix_cache_hit_tokens_total"), 3 * 48);
  EXPECT_GE(metric(m, "kvpack_prefix_cache_queries_total"), 4);
}

TEST_F(ServerTest, TinyPagePoolForcesPreemptionAndEveryRequestCompletesCorrectly) {
  server::ServerOptions opt;
  opt.scheduler.max_running = 8;
  opt.scheduler.reserve_admission = false;  // optimistic admission: preemption does the work
  opt.scheduler.watermark = 0;
  opt.scheduler.prefix_cache = false;
  opt.scheduler.preempt = PreemptPolicy::LRU;
  EngineOptions eo = engine_options();
  eo.kv_pages = 20 * 15;  // 20 streams: room for ~2.5 sequences of ~90 tokens
  start(opt, eo);
  constexpr int kN = 80;
  std::vector<Reply> got(kPrompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < kPrompts.size(); ++i)
    threads.emplace_back([&, i] { got[i] = post(port, "/v1/completions", completion(kPrompts[i], kN, true)); });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    ASSERT_EQ(got[i].status, 200) << got[i].raw;
    EXPECT_EQ(got[i].body["choices"][0]["text"], reference(kPrompts[i], kN, true).text) << kPrompts[i];
    EXPECT_EQ(got[i].body["choices"][0]["finish_reason"], "length");
  }
  ASSERT_TRUE(wait_idle());
  const std::string m = get(port, "/metrics").raw;
  EXPECT_GT(metric(m, "kvpack_preemptions_total{reason=\"lru\"}"), 0);
  EXPECT_EQ(metric(m, "kvpack_kv_pages_total"), 300);
  EXPECT_EQ(metric(m, "kvpack_kv_pages_used"), 0);
  EXPECT_EQ(metric(m, "vllm:request_success_total{model_name=\"" + srv->options().model_id + "\",finished_reason=\"length\"}"),
            static_cast<double>(kPrompts.size()));
  EXPECT_EQ(metric(m, "vllm:num_preemptions_total{model_name=\"" + srv->options().model_id + "\"}"),
            metric(m, "kvpack_preemptions_total{reason=\"lru\"}"));
}

TEST_F(ServerTest, ClientThatDisconnectsHasItsRequestCancelledAndPagesFreed) {
  server::ServerOptions opt;
  opt.scheduler.prefix_cache = false;  // so "no request" means "no pages in use"
  start(opt);
  const double baseline = metric(get(port, "/metrics").raw, "kvpack_kv_pages_used");

  // Streaming: the client reads two chunks, then goes away.
  const Streamed s = stream(port, "/v1/completions", completion("Once upon a time", 500, true), [](int chunks) { return chunks < 2; });
  EXPECT_FALSE(s.transport_ok);
  EXPECT_FALSE(s.done);
  ASSERT_TRUE(eventually([&] {
    const auto m = srv->scheduler().metrics();
    return m.requests_cancelled == 1 && m.running == 0;
  }, 10)) << "the stream's request was not cancelled";
  EXPECT_EQ(engine->kv().pool().used_pages(), 0);  // safe to read: the scheduler is idle (observed above)
  EXPECT_EQ(srv->scheduler().metrics().requests_finished, 0);
  EXPECT_LT(srv->scheduler().metrics().generated_tokens, 500);

  // Not streaming: a raw client sends the request and hangs up while it runs.
  {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    const std::string body = completion("The little dog", 500, true).dump();
    const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\n\r\n" + body;
    ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
    eventually([&] { return srv->scheduler().metrics().generated_tokens > 0; }, 5);
    ::close(fd);
  }
  ASSERT_TRUE(eventually([&] {
    const auto m = srv->scheduler().metrics();
    return m.requests_cancelled == 2 && m.running == 0;
  }, 10)) << "the blocking request was not cancelled";
  EXPECT_EQ(engine->kv().pool().used_pages(), 0);
  const std::string m1 = get(port, "/metrics").raw;
  const std::string model = "{model_name=\"" + srv->options().model_id + "\"";
  EXPECT_EQ(metric(m1, "vllm:num_requests_running" + model + "}"), 0);
  EXPECT_EQ(metric(m1, "vllm:request_success_total" + model + ",finished_reason=\"abort\"}"), 2);
  EXPECT_EQ(metric(m1, "kvpack_http_client_disconnects_total"), 2);

  // The pool gauges in /metrics are published at the end of a step that ran a batch; a cancel that
  // empties the batch leaves them stale until the next one (see the report), so run one tiny request.
  // (The client can have its answer a moment before that step publishes, hence the polling.)
  ASSERT_EQ(post(port, "/v1/completions", completion("Hi", 1)).status, 200);
  EXPECT_TRUE(eventually([&] { return metric(get(port, "/metrics").raw, "kvpack_kv_pages_used") == baseline; }, 10));
}

TEST_F(ServerTest, BadRequestsGetTheRight4xx) {
  server::ServerOptions opt;
  opt.api_key = "sekrit";
  opt.limits.max_body_bytes = 64 * 1024;
  start(opt);
  const httplib::Headers auth = {{"Authorization", "Bearer sekrit"}};
  auto expect_error = [](const Reply& r, int status, const std::string& param = "", const std::string& code = "") {
    EXPECT_EQ(r.status, status) << r.raw;
    ASSERT_TRUE(r.body.is_object() && r.body.contains("error")) << r.raw;
    EXPECT_TRUE(r.body["error"]["message"].is_string());
    EXPECT_TRUE(r.body["error"]["type"].is_string());
    if (!param.empty()) {
      EXPECT_EQ(r.body["error"]["param"], param) << r.raw;
    }
    if (!code.empty()) {
      EXPECT_EQ(r.body["error"]["code"], code) << r.raw;
    }
  };
  // Authentication.
  EXPECT_EQ(get(port, "/health").status, 200);  // open: load balancers probe it
  expect_error(post(port, "/v1/completions", completion("x", 2)), 401, "", "invalid_api_key");
  expect_error(post(port, "/v1/completions", completion("x", 2), {{"Authorization", "Bearer wrong"}}), 401);
  expect_error(get(port, "/v1/models"), 401);
  expect_error(get(port, "/metrics"), 401);
  ASSERT_EQ(post(port, "/v1/completions", completion("x", 2), auth).status, 200);
  const Reply models = get(port, "/v1/models", auth);
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.body["object"], "list");
  EXPECT_EQ(models.body["data"][0]["object"], "model");
  EXPECT_FALSE(models.body["data"][0]["id"].get<std::string>().empty());

  // Validation.
  expect_error(post(port, "/v1/completions", std::string("{\"prompt\": \"x\", "), auth), 400, "", "invalid_json");
  expect_error(post(port, "/v1/completions", std::string("[1, 2]"), auth), 400);
  expect_error(post(port, "/v1/completions", json{{"prompt", 5}}, auth), 400, "prompt");
  expect_error(post(port, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", "many"}}, auth), 400, "max_tokens");
  expect_error(post(port, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", -3}}, auth), 400, "max_tokens");
  expect_error(post(port, "/v1/completions", json{{"prompt", "x"}, {"temperature", 9}}, auth), 400, "temperature");
  expect_error(post(port, "/v1/completions", json{{"prompt", ""}}, auth), 400, "prompt");
  expect_error(post(port, "/v1/completions", json{{"prompt", "x"}, {"kv_policy", "nope"}}, auth), 400, "kv_policy", "invalid_kv_policy");
  expect_error(post(port, "/v1/completions", json{{"prompt", "x"}, {"kv_policy", "knorm"}, {"kv_budget", 2}}, auth), 400, "kv_budget");
  std::string long_text;
  for (int i = 0; i < 600; ++i) long_text += "The dog ran. ";
  expect_error(post(port, "/v1/completions", json{{"prompt", long_text}}, auth), 400, "prompt", "context_length_exceeded");
  expect_error(post(port, "/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", long_text}}}}}, auth), 400, "messages",
               "context_length_exceeded");
  expect_error(post(port, "/v1/chat/completions", json{{"messages", json::array()}}, auth), 400, "messages");

  // Size limit: with Content-Length, and chunked (which httplib itself does not limit).
  const std::string huge = json{{"prompt", std::string(200 * 1024, 'a')}}.dump();
  expect_error(post(port, "/v1/completions", huge, auth), 413, "", "request_too_large");
  {
    auto c = client(port);
    size_t sent = 0;
    auto r = c->Post("/v1/completions", auth,
                     [&](size_t, httplib::DataSink& sink) {
                       if (sent >= huge.size()) {
                         sink.done();
                         return true;
                       }
                       const size_t n = std::min<size_t>(8192, huge.size() - sent);
                       sent += n;
                       return sink.write(huge.data() + sent - n, n);
                     },
                     "application/json");
    // The server answers 413 and closes as soon as the limit is passed; the client may see the
    // answer or, if it was still sending, a reset connection. It must never see a 200.
    if (r) {
      EXPECT_EQ(r->status, 413);
    }
  }

  // Unknown routes.
  expect_error(get(port, "/v1/nothing", auth), 404);
  expect_error(post(port, "/v2/completions", completion("x", 2), auth), 404);
  // The server still works.
  EXPECT_EQ(post(port, "/v1/completions", completion("x", 2), auth).status, 200);
}

TEST_F(ServerTest, OverloadGets429WithRetryAfter) {
  server::ServerOptions opt;
  opt.max_concurrent = 1;
  start(opt);
  // Eight simultaneous long requests through one slot: all either succeed or get a 429.
  std::vector<Reply> got(8);
  std::vector<std::thread> threads;
  std::atomic<bool> go{false};
  for (size_t i = 0; i < got.size(); ++i)
    threads.emplace_back([&, i] {
      while (!go) std::this_thread::yield();
      got[i] = post(port, "/v1/completions", completion(kPrompts[i % kPrompts.size()], 400, true));
    });
  go = true;
  for (auto& t : threads) t.join();
  int ok = 0, busy = 0;
  for (const auto& r : got) {
    if (r.status == 200) ++ok;
    if (r.status == 429) {
      ++busy;
      EXPECT_EQ(r.body["error"]["code"], "too_many_concurrent_requests");
      bool retry_after = false;
      for (const auto& [k, v] : r.headers) retry_after |= k == "Retry-After";
      EXPECT_TRUE(retry_after);
    }
  }
  EXPECT_EQ(ok + busy, 8);
  EXPECT_GE(ok, 1);
  EXPECT_GE(busy, 1);
  EXPECT_EQ(metric(get(port, "/metrics").raw, "kvpack_http_rejected_total{reason=\"concurrency\"}"), busy);
}

TEST_F(ServerTest, MetricsAgreeWithThePoolAndTheScheduler) {
  server::ServerOptions opt;
  // Without the prefix cache: it registers decode blocks too, and shared blocks are protected from
  // compaction, which would leave nothing for compression to free (see the report).
  opt.scheduler.prefix_cache = false;
  start(opt);
  // A mixed workload: compressed long generations (evict + compact) and plain ones.
  std::vector<Reply> got(5);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i)
    threads.emplace_back([&, i] {
      json b = completion(kPrompts[i], i < 3 ? 300 : 60, true);
      if (i < 3) {
        b["kv_policy"] = "knorm";
        b["kv_budget"] = 64;
      }
      got[i] = post(port, "/v1/completions", b);
    });
  for (auto& t : threads) t.join();
  int64_t completion_tokens = 0;
  for (const auto& r : got) {
    ASSERT_EQ(r.status, 200) << r.raw;
    completion_tokens += r.body["usage"]["completion_tokens"].get<int64_t>();
  }
  ASSERT_TRUE(wait_idle());
  const SchedulerMetrics sm = srv->scheduler().metrics();
  const std::string m = get(port, "/metrics").raw;
  // Pool gauges equal the pool's own counters (idle: the prefix cache may still hold blocks).
  EXPECT_EQ(metric(m, "kvpack_kv_pages_total"), engine->kv().pool().capacity());
  EXPECT_EQ(metric(m, "kvpack_kv_pages_used"), engine->kv().pool().used_pages());
  EXPECT_EQ(metric(m, "kvpack_kv_pages_free"), engine->kv().pool().free_pages());
  EXPECT_EQ(metric(m, "kvpack_kv_resident_bytes"), static_cast<double>(engine->kv().pool().used_bytes()));
  // Compression counters equal the scheduler's, under the policy that ran (the plain requests ran none).
  EXPECT_GT(sm.compression.freed_pages, 0);
  ASSERT_EQ(sm.compression_by_policy.size(), 1u);
  EXPECT_EQ(sm.compression_by_policy.begin()->first, "knorm");
  const std::string knorm = "{policy=\"knorm\"}";
  EXPECT_EQ(metric(m, "kvpack_kv_freed_pages_total" + knorm), sm.compression.freed_pages);
  EXPECT_EQ(metric(m, "kvpack_kv_evicted_slots_total" + knorm), sm.compression.evicted_slots);
  EXPECT_EQ(metric(m, "kvpack_kv_evicted_tokens_total" + knorm), sm.compression.evicted_slots / 20);
  EXPECT_EQ(metric(m, "kvpack_kv_compactions_total" + knorm), sm.compression.events);
  EXPECT_DOUBLE_EQ(metric(m, "kvpack_kv_reclaim_efficiency" + knorm), sm.compression.reclaim_efficiency());
  EXPECT_GT(sm.compression.reclaim_efficiency(), 0.9);
  EXPECT_NEAR(metric(m, "kvpack_kv_compaction_seconds_total" + knorm), sm.compression.seconds, 1e-12);
  EXPECT_EQ(m.find("kvpack_kv_drift_max{"), std::string::npos) << "no recall check ran: no drift sample";
  // Requests, tokens and the request-level histograms (vLLM's names, with the model label).
  const std::string model = "{model_name=\"" + srv->options().model_id + "\"";
  EXPECT_EQ(metric(m, "vllm:request_success_total" + model + ",finished_reason=\"length\"}"), 5);
  EXPECT_EQ(metric(m, "vllm:generation_tokens_total" + model + "}"), completion_tokens);
  EXPECT_EQ(metric(m, "vllm:time_to_first_token_seconds_count" + model + "}"), 5);
  EXPECT_EQ(metric(m, "vllm:inter_token_latency_seconds_count" + model + "}"), completion_tokens - 5);
  EXPECT_EQ(metric(m, "vllm:e2e_request_latency_seconds_count" + model + "}"), 5);
  EXPECT_EQ(metric(m, "vllm:request_queue_time_seconds_count" + model + "}"), 5);
  EXPECT_EQ(metric(m, "vllm:request_generation_tokens_sum" + model + "}"), completion_tokens);
  EXPECT_EQ(metric(m, "vllm:kv_cache_usage_perc" + model + "}"),
            static_cast<double>(engine->kv().pool().used_pages()) / static_cast<double>(engine->kv().pool().capacity()));
  EXPECT_EQ(metric(m, "kvpack_kv_pages_by_state{state=\"active\"}") + metric(m, "kvpack_kv_pages_by_state{state=\"cached\"}") +
                metric(m, "kvpack_kv_pages_by_state{state=\"free\"}"),
            engine->kv().pool().capacity());
  // httplib logs a response after writing it, so the client may be a moment ahead of this counter.
  EXPECT_TRUE(eventually([&] { return metric(get(port, "/metrics").raw, "kvpack_http_responses_total{code=\"200\"}") >= 5; }, 5));
}

TEST_F(ServerTest, StopEndsInFlightStreamsPromptly) {
  start();
  std::atomic<int> started{0};
  std::vector<Streamed> got(3);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i)
    threads.emplace_back([&, i] {
      bool counted = false;  // (one read can carry several SSE events: count the first read that has any)
      got[i] = stream(port, "/v1/completions", completion(kPrompts[i], 500, true), [&](int chunks) {
        if (chunks >= 1 && !counted) {
          counted = true;
          ++started;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a slow reader keeps its stream open
        return true;
      });
    });
  eventually([&] { return started == 3; }, 10);
  const auto t0 = std::chrono::steady_clock::now();
  srv->stop();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto& t : threads) t.join();
  EXPECT_LT(secs, 10);
  // Every stream ended: properly, with the shutdown error event, or by the connection closing.
  for (const auto& s : got) EXPECT_TRUE(s.done || !s.error.empty() || !s.transport_ok);
  EXPECT_EQ(get(port, "/health").status, 0);  // nothing listens any more
}

namespace {

std::vector<json> read_json_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));  // throws on a broken line
  return lines;
}

}  // namespace

TEST_F(ServerTest, RequestLogHasOneLinePerRequestWithItsKvFigures) {
  const std::string path = ::testing::TempDir() + "kvpack-request-log-" + std::to_string(::getpid()) + ".jsonl";
  std::remove(path.c_str());
  server::ServerOptions opt;
  opt.request_log = path;
  opt.request_log_prompts = true;
  start(opt);
  json compressed = completion(kPrompts[0], 200, true);
  compressed["kv_policy"] = "knorm";
  compressed["kv_budget"] = 48;
  const Reply a = post(port, "/v1/completions", compressed);
  const Reply b = post(port, "/v1/completions", completion(kPrompts[1], 8, true));
  ASSERT_EQ(a.status, 200) << a.raw;
  ASSERT_EQ(b.status, 200) << b.raw;
  // A stream whose client leaves after two chunks: logged as cancelled.
  const Streamed gone = stream(port, "/v1/completions", completion(kPrompts[2], 500, true), [](int chunks) { return chunks < 2; });
  EXPECT_FALSE(gone.done);
  // A refused request never reaches the scheduler: no line.
  EXPECT_EQ(post(port, "/v1/completions", json{{"prompt", 5}}).status, 400);
  ASSERT_TRUE(eventually([&] { return srv->request_log()->lines() == 3; }, 20)) << srv->request_log()->lines();
  srv->stop();

  const std::vector<json> lines = read_json_lines(path);
  ASSERT_EQ(lines.size(), 3u);
  std::map<std::string, json> by_id;
  for (const json& l : lines) by_id[l["id"].get<std::string>()] = l;
  ASSERT_TRUE(by_id.count(a.body["id"])) << lines[0].dump();
  const json& la = by_id[a.body["id"]];
  EXPECT_EQ(la["status"], "length");
  EXPECT_EQ(la["endpoint"], "completions");
  EXPECT_EQ(la["policy"], "knorm");
  EXPECT_EQ(la["budget"], 48);
  EXPECT_EQ(la["prompt_tokens"], a.body["usage"]["prompt_tokens"]);
  EXPECT_EQ(la["completion_tokens"], 200);
  EXPECT_EQ(la["kv"]["evicted_tokens"], a.body["usage"]["kvpack"]["evicted_tokens"]);
  EXPECT_EQ(la["kv"]["peak_hot_bytes"], a.body["usage"]["kvpack"]["peak_kv_bytes"]);
  EXPECT_GT(la["kv"]["freed_pages"].get<int64_t>(), 0);
  EXPECT_EQ(la["kv"]["freed_pages"], a.body["usage"]["kvpack"]["freed_pages"]);
  EXPECT_DOUBLE_EQ(la["kv"]["compaction_s"].get<double>(), a.body["usage"]["kvpack"]["compaction_seconds"].get<double>());
  EXPECT_DOUBLE_EQ(la["queue_s"].get<double>(), a.body["usage"]["kvpack"]["queue_seconds"].get<double>());
  EXPECT_GT(la["kv"]["compactions"].get<int64_t>(), 0);
  EXPECT_TRUE(la["kv"]["drift"].is_null());  // no recall ran
  EXPECT_EQ(la["request"]["kv_budget"], 48);  // the body, with --request-log-prompts
  EXPECT_LE(la["ttft_s"].get<double>(), la["e2e_s"].get<double>());
  EXPECT_EQ(la["cached_tokens_hot"].get<int>() + la["cached_tokens_cold"].get<int>(), la["cached_tokens"].get<int>());
  const json& lb = by_id[b.body["id"]];
  EXPECT_EQ(lb["policy"], "full");
  EXPECT_EQ(lb["budget"], 0);
  EXPECT_EQ(lb["kv"]["compactions"], 0);
  EXPECT_EQ(lb["kv"]["final_hot_bytes"], b.body["usage"]["kvpack"]["final_kv_bytes"]);
  int cancelled = 0;
  for (const json& l : lines)
    if (l["status"] == "cancelled") {
      ++cancelled;
      EXPECT_TRUE(l["stream"].get<bool>());
      EXPECT_LT(l["completion_tokens"].get<int>(), 500);
    }
  EXPECT_EQ(cancelled, 1);
  std::remove(path.c_str());
}

TEST(RequestLog, AnUnopenablePathIsAClearError) {
  try {
    server::RequestLog log("/nonexistent-dir-kvpack/x.jsonl");
    FAIL() << "opened";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir-kvpack/x.jsonl"), std::string::npos) << e.what();
  }
}

TEST_F(ServerTest, KvStateShowsEachRunningSequencesPagesByStream) {
  server::ServerOptions opt;
  opt.scheduler.prefix_cache = false;  // every active page belongs to the one running sequence
  start(opt);
  EXPECT_EQ(get(port, "/kv").status, 200);
  EXPECT_NE(get(port, "/kv").raw.find("/kv/state"), std::string::npos);
  json seen;
  std::atomic<bool> done{false};
  std::thread t([&] {
    json b = completion(kPrompts[0], 400, true);
    b["kv_policy"] = "knorm";
    b["kv_budget"] = 48;
    post(port, "/v1/completions", b);
    done = true;
  });
  while (!done) {  // the map is at most one step old: poll until it shows the sequence decoding
    const Reply r = get(port, "/kv/state");
    ASSERT_EQ(r.status, 200);
    if (!r.body["sequences"].empty() && r.body["sequences"][0]["state"] == "decode" && r.body["sequences"][0]["compactions"] > 0) {
      seen = r.body;
      break;
    }
  }
  t.join();
  ASSERT_FALSE(seen.is_null()) << "the request finished before /kv/state showed it decoding after a compaction";
  const json& s = seen["sequences"][0];
  EXPECT_EQ(s["policy"], "knorm");
  EXPECT_EQ(s["budget"], 48);
  const int streams = seen["n_layers"].get<int>() * seen["n_kv_heads"].get<int>();
  ASSERT_EQ(s["pages"].size(), static_cast<size_t>(streams));
  int64_t pages = 0;
  for (int i = 0; i < streams; ++i) {
    pages += s["pages"][i].get<int64_t>();
    EXPECT_LE(s["slots"][i].get<int>(), s["pages"][i].get<int>() * seen["page_size"].get<int>());
    EXPECT_LE(s["slots"][i].get<int>(), 48 + compress::CompressConfig{}.interval) << "stream " << i << " beyond budget + interval";
  }
  EXPECT_EQ(pages, seen["pool"]["active"].get<int64_t>());  // one sequence, no prefix cache
  EXPECT_EQ(seen["pool"]["active"].get<int64_t>() + seen["pool"]["cached"].get<int64_t>() + seen["pool"]["free"].get<int64_t>(),
            seen["pool"]["total"].get<int64_t>());
  // After the request: the map empties.
  ASSERT_TRUE(wait_idle());
  EXPECT_TRUE(eventually([&] { return get(port, "/kv/state").body["sequences"].empty(); }, 5));
}
