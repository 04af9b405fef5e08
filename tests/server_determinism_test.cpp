// Greedy output never depends on load, through the real HTTP server on loopback (stories260K): each
// round starts a server with a random configuration — prefix cache on or off, a host cold tier or none,
// a page pool small enough that sequences are preempted, random batch size, step size and victim policy —
// and fires random requests at it from concurrent clients (streamed or not; random per-request policy,
// budget, length, shared system prefixes so the prefix cache hits). Every greedy output must equal the
// same request run alone (a fresh engine, one request, the same prefix-cache setting: a compressed
// sequence's cached prompt blocks are protected from eviction, so that setting is part of the
// configuration, docs/kv-tier.md). The one documented exception: without a cold tier a preempted
// compressed sequence recomputes its KV from text and its compressor starts afresh, so its output may
// differ; those (usage.kvpack.recomputes > 0, policy not full) are counted, not compared.
//
// The seed is printed; KVPACK_DETERMINISM_SEED=N reproduces a run, KVPACK_DETERMINISM_ROUNDS=N runs more
// rounds (default 10, 4 in sanitizer builds: the divergence this test was written against — protection from the pages
// shared at the moment, see docs/reliability.md — showed up in about one prefix-cache round in three).
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/calibrate.h"
#include "engine/engine.h"
#include "engine/scheduler.h"
#include "server/server.h"
#include "server_model_fixture.h"

using namespace kvpack;
using json = nlohmann::json;

namespace {

const bool kNoSigpipe = [] { return signal(SIGPIPE, SIG_IGN) != SIG_ERR; }();

const std::vector<std::string> kStarts = {
    "Once upon a time", "The little dog", "Lily and Ben went to the park", "One day, a big bird",
    "Tom had a red ball", "The sun was hot and", "Sara wanted a cookie", "In a small house there lived",
};
const std::vector<std::string> kWords = {"happy", "tree", "ran", "big", "cat", "saw", "mom", "toy", "sad", "and"};
// Shared system prefixes of several 16-token blocks, so concurrent and later requests hit the cache.
const std::vector<std::string> kPrefixes = {
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her dog. ",
    "Tom and his friend Sam liked to build big towers with blocks. One day the tower fell down and they laughed. ",
    "The old man had a small boat. Every morning he went to the sea to catch fish for his family. He was kind. ",
};
const char* const kPolicies[] = {"full", "streaming", "knorm", "triattention", "trispan", "snapkv", "rkv", "tova", "h2o"};

uint64_t seed_from_env() {
  if (const char* s = std::getenv("KVPACK_DETERMINISM_SEED"); s && *s) return std::strtoull(s, nullptr, 10);
  return std::random_device{}();
}
// KVPACK_DETERMINISM_POLICIES=triattention,knorm narrows the mix (to chase one policy's divergence).
std::vector<std::string> policies_from_env() {
  std::vector<std::string> v;
  if (const char* s = std::getenv("KVPACK_DETERMINISM_POLICIES"); s && *s) {
    std::stringstream in(s);
    for (std::string p; std::getline(in, p, ',');)
      if (!p.empty()) v.push_back(p);
  }
  if (v.empty()) v.assign(std::begin(kPolicies), std::end(kPolicies));
  return v;
}
int rounds_from_env() {
  if (const char* s = std::getenv("KVPACK_DETERMINISM_ROUNDS"); s && *s) return std::max(1, std::atoi(s));
#ifdef KVPACK_DEBUG_CHECKS
  return 4;  // sanitizer builds: a round costs ~30 s under TSan
#else
  return 10;
#endif
}

struct Spec {
  std::string prompt, policy;
  int32_t budget = 0, max_tokens = 0;
  bool ignore_eos = true, stream = false;
  std::string key(bool cache) const {
    return prompt + "|" + policy + "|" + std::to_string(budget) + "|" + std::to_string(max_tokens) + "|" +
           std::to_string(ignore_eos) + (cache ? "|cache" : "");
  }
  json body() const {
    json b{{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}, {"ignore_eos", ignore_eos}, {"kv_policy", policy}};
    if (policy != "full") b["kv_budget"] = budget;
    return b;
  }
};

struct Got {
  int status = 0;
  std::string text, error;
  bool done = false;  // a stream ended with [DONE]
  json usage;
};

Got send(int port, const Spec& s) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(300, 0);
  Got g;
  json body = s.body();
  if (!s.stream) {
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    if (!r) return g;
    g.status = r->status;
    const json j = json::parse(r->body, nullptr, false);
    if (g.status != 200 || j.is_discarded()) {
      g.error = r->body;
      return g;
    }
    g.text = j["choices"][0]["text"];
    g.usage = j["usage"];
    return g;
  }
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  std::string buf;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = body.dump();
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    buf.append(d, n);
    for (size_t end; (end = buf.find("\n\n")) != std::string::npos;) {
      const std::string ev = buf.substr(0, end);
      buf.erase(0, end + 2);
      if (ev.rfind("data: ", 0) != 0) continue;
      const std::string data = ev.substr(6);
      if (data == "[DONE]") {
        g.done = true;
        continue;
      }
      const json j = json::parse(data, nullptr, false);
      if (j.is_discarded()) {
        g.error = "unparsable event: " + data;
        continue;
      }
      if (j.contains("error")) g.error = j["error"].dump();
      if (j.contains("usage") && !j["usage"].is_null()) g.usage = j["usage"];
      if (j.contains("choices") && !j["choices"].empty() && j["choices"][0].contains("text"))
        g.text += j["choices"][0]["text"].get<std::string>();
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  if (c.send(req, res, err)) g.status = res.status;
  return g;
}

double metric(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  double sum = 0;
  bool found = false;
  while (std::getline(in, line))  // `name` or `name{labels}`: summed over the labels
    if (line.rfind(name, 0) == 0 && (line[name.size()] == ' ' || line[name.size()] == '{')) {
      sum += std::stod(line.substr(line.rfind(' ') + 1));
      found = true;
    }
  if (!found) ADD_FAILURE() << "metric " << name << " not found";
  return sum;
}

class DeterminismTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = Model::load(test::kStoriesModel).release();
    std::vector<int32_t> text;
    for (int i = 0; i < 40; ++i)
      for (int32_t t : model_->tokenizer().encode(kStarts[static_cast<size_t>(i % 8)] + ". ", i == 0)) text.push_back(t);
    EngineOptions eo;
    eo.threads = 1;
    calib_ = new compress::QueryStats(calibrate(*model_, text, eo));
  }
  static void TearDownTestSuite() {
    delete calib_;
    delete model_;
  }

  static compress::CompressConfig default_kv() {
    compress::CompressConfig kv;
    kv.interval = 16;  // events every 16 tokens, so short generations compress many times
    return kv;
  }

  // The request alone: a fresh engine (empty cache, large pool), one sequence, the same cache setting.
  static std::string solo(const Spec& s, bool cache) {
    EngineOptions eo;
    eo.threads = 1;
    Engine e(*model_, eo);
    e.set_calibration(*calib_);
    SchedulerOptions so;
    so.max_running = 1;
    so.prefix_cache = cache;
    Scheduler sched(e, so);
    Request r;
    const Tokenizer& tok = model_->tokenizer();
    r.prompt = tok.encode(s.prompt, tok.add_bos_default());
    r.max_tokens = s.max_tokens;
    r.ignore_eos = s.ignore_eos;
    r.sampling.temperature = 0;
    r.kv = default_kv();
    r.kv.policy = compress::parse_policy(s.policy);
    if (s.policy != "full") r.kv.budget = s.budget;
    std::string text;
    bool finished = false;
    sched.submit(r, [&](const RequestEvent& ev) {
      if (ev.kind == RequestEvent::Kind::Text) text += ev.text;
      else finished = true;
      if (ev.kind == RequestEvent::Kind::Finished && ev.finish == FinishReason::Error) ADD_FAILURE() << "solo failed: " << ev.error;
    });
    while (!finished && sched.step()) {
    }
    EXPECT_TRUE(finished);
    return text;
  }

  static inline Model* model_ = nullptr;
  static inline compress::QueryStats* calib_ = nullptr;
};

}  // namespace

TEST_F(DeterminismTest, GreedyOutputsUnderRandomLoadEqualTheSoloRun) {
  const uint64_t seed = seed_from_env();
  const int rounds = rounds_from_env();
  const std::vector<std::string> policies = policies_from_env();
  std::cout << "[ seed     ] KVPACK_DETERMINISM_SEED=" << seed << " (rounds " << rounds << ")" << std::endl;
  RecordProperty("seed", std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  std::map<std::string, std::string> solo_of;
  double preemptions = 0, hits = 0;
  int compared = 0, recomputed = 0;
  // Past `rounds`, up to 8 more rounds until the load has preempted and hit the cache: a slow build
  // (ASan) serialises the clients enough that 4 random rounds sometimes never fill the pool.
  const int max_rounds = rounds + 8;
  for (int round = 0; round < rounds || ((preemptions == 0 || hits == 0) && round < max_rounds); ++round) {
    const bool cache = round % 2 == 0;
    const bool tier = round % 3 != 2;
    server::ServerOptions opt;
    opt.host = "127.0.0.1";
    opt.port = 0;
    opt.max_concurrent = 64;
    opt.default_kv = default_kv();
    opt.scheduler.prefix_cache = cache;
    opt.scheduler.max_running = 2 + pick(7);
    opt.scheduler.step_tokens = 16 + pick(113);
    opt.scheduler.preempt = static_cast<PreemptPolicy>(pick(3));
    opt.scheduler.reserve_admission = false;  // watermark admission: preemption does the work
    opt.scheduler.watermark = 0;
    EngineOptions eo;
    eo.threads = 1;
    eo.kv_pages = 20 * (12 + pick(12));  // 20 streams: 12..23 pages each, a few sequences' worth
    if (tier) eo.kv_cold = "host:64M";
    Engine engine(*model_, eo);
    engine.set_calibration(*calib_);
    server::Server srv(engine, opt);
    const int port = srv.start();
    std::ostringstream what;
    what << "seed " << seed << " round " << round << ": prefix cache " << cache << ", tier " << tier << ", pages "
         << eo.kv_pages << ", max_running " << opt.scheduler.max_running << ", step_tokens " << opt.scheduler.step_tokens
         << ", preempt " << preempt_name(opt.scheduler.preempt);

    // Clients send 1-3 requests each, one after the other: later ones find earlier prompts cached.
    const int n_clients = 4 + pick(7);
    std::vector<int> client_of;
    for (int c = 0; c < n_clients; ++c)
      for (int k = 1 + pick(3); k > 0; --k) client_of.push_back(c);
    std::vector<Spec> specs(client_of.size());
    for (Spec& s : specs) {
      if (pick(4) != 0) s.prompt = kPrefixes[static_cast<size_t>(pick(3))];
      s.prompt += kStarts[static_cast<size_t>(pick(8))];
      for (int w = pick(4); w > 0; --w) s.prompt += " " + kWords[static_cast<size_t>(pick(10))];
      s.policy = policies[static_cast<size_t>(pick(static_cast<int>(policies.size())))];
      s.budget = 32 + 16 * pick(3);
      s.max_tokens = 24 + pick(90);
      s.ignore_eos = pick(4) != 0;
      s.stream = pick(2) == 0;
    }
    std::vector<Got> got(specs.size());
    std::vector<std::thread> clients;
    std::atomic<bool> go{false};
    for (int c = 0; c < n_clients; ++c)
      clients.emplace_back([&, c] {
        while (!go) std::this_thread::yield();
        for (size_t i = 0; i < specs.size(); ++i)
          if (client_of[i] == c) got[i] = send(port, specs[i]);
      });
    go = true;
    for (auto& t : clients) t.join();
    // Idle: every page back, the cache and pool consistent.
    for (int i = 0; i < 3000; ++i) {
      const auto m = srv.scheduler().metrics();
      if (m.running == 0 && m.waiting == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const std::string metrics = srv.metrics_text();
    preemptions += metric(metrics, "kvpack_preemptions_total");
    hits += metric(metrics, "kvpack_prefix_cache_hits_total");
    EXPECT_EQ(metric(metrics, "kvpack_kv_pages_used"), 0) << what.str();
    EXPECT_EQ(metric(metrics, "kvpack_requests_failed_total"), 0) << what.str();
    srv.stop();
    EXPECT_EQ(srv.scheduler().check_invariants(), "") << what.str();

    for (size_t i = 0; i < specs.size(); ++i) {
      const Spec& s = specs[i];
      const Got& g = got[i];
      const std::string req = what.str() + ", request " + std::to_string(i) + " " + s.body().dump() + (s.stream ? " (stream)" : "");
      ASSERT_EQ(g.status, 200) << req << ": " << g.error;
      EXPECT_EQ(g.error, "") << req;
      if (s.stream) {
        EXPECT_TRUE(g.done) << req;
      }
      ASSERT_TRUE(g.usage.is_object()) << req;
      EXPECT_LE(g.usage["completion_tokens"].get<int>(), s.max_tokens) << req;
      if (s.ignore_eos) {
        EXPECT_EQ(g.usage["completion_tokens"].get<int>(), s.max_tokens) << req;
      }
      const int recomputes = g.usage["kvpack"]["recomputes"].get<int>();
      if (tier) {
        EXPECT_EQ(recomputes, 0) << req << ": with a cold tier a preempted sequence swaps";
      }
      if (recomputes > 0 && s.policy != "full") {  // the documented exception (file comment)
        ++recomputed;
        continue;
      }
      const std::string key = s.key(cache);
      if (!solo_of.count(key)) solo_of[key] = solo(s, cache);
      EXPECT_EQ(g.text, solo_of[key]) << req;
      ++compared;
    }
  }
  std::cout << "[ result   ] " << compared << " outputs compared with their solo run, " << recomputed
            << " recomputed compressed ones skipped; preemptions " << preemptions << ", prefix-cache hits " << hits << std::endl;
  // The load really preempted sequences and hit the prefix cache.
  EXPECT_GT(preemptions, 0) << "seed " << seed;
  EXPECT_GT(hits, 0) << "seed " << seed;
  EXPECT_GT(compared, recomputed) << "seed " << seed;
}
