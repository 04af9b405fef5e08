// The serving benchmark's parts: the seeded session mix is deterministic and well-formed, and a small
// replay against the real server over loopback completes every session and reads back the metrics.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "engine/engine.h"
#include "server/bench.h"
#include "server/server.h"

using namespace kvpack;
using namespace kvpack::server;

namespace {
const bool kNoSigpipe = [] { return signal(SIGPIPE, SIG_IGN) != SIG_ERR; }();
}

TEST(BenchMix, IsSeededAndWellFormed) {
  bench::MixOptions o;
  o.reasoning = 3;
  o.chats = 4;
  o.chat_turns = 2;
  o.documents = 1;
  o.arrival_rate = 5;
  const auto a = bench::generate_mix(o), b = bench::generate_mix(o);
  ASSERT_EQ(a.size(), 8u);
  int kinds[3] = {0, 0, 0};
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].kind, b[i].kind);
    EXPECT_EQ(a[i].arrival_s, b[i].arrival_s);
    ASSERT_EQ(a[i].turns.size(), b[i].turns.size());
    for (size_t t = 0; t < a[i].turns.size(); ++t) EXPECT_EQ(a[i].turns[t].text, b[i].turns[t].text);
    if (i > 0) {
      EXPECT_GE(a[i].arrival_s, a[i - 1].arrival_s);
    }
    ++kinds[static_cast<int>(a[i].kind)];
    if (a[i].kind == bench::Session::Kind::Chat) {
      EXPECT_EQ(a[i].turns.size(), 2u);
      EXPECT_FALSE(a[i].system.empty());
    } else {
      EXPECT_EQ(a[i].turns.size(), 1u);
    }
    EXPECT_EQ(a[i].ignore_eos, a[i].kind == bench::Session::Kind::Reasoning);
  }
  EXPECT_EQ(kinds[0], 3);
  EXPECT_EQ(kinds[1], 4);
  EXPECT_EQ(kinds[2], 1);
  EXPECT_GT(a.back().arrival_s, 0);
  o.seed = 7;
  const auto c = bench::generate_mix(o);
  bool differs = false;
  for (size_t i = 0; i < a.size(); ++i) differs |= a[i].turns[0].text != c[i].turns[0].text;
  EXPECT_TRUE(differs);
}

TEST(BenchReplay, CompletesEverySessionAgainstTheRealServer) {
  auto model = Model::load(std::string(KVPACK_SHARED_DIR) + "/models/stories260K.gguf");
  EngineOptions eo;
  eo.threads = 1;
  eo.kv_pages = 20 * 32;  // one full context: sessions must share it
  Engine engine(*model, eo);
  ServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  so.default_kv.policy = compress::PolicyKind::KNorm;
  so.default_kv.budget = 256;  // the chat prompts (system prompt included) fit in the budget, so they are registered and reused
  so.default_kv.interval = 32;
  Server srv(engine, so);
  const int port = srv.start();
  bench::MixOptions o;
  o.reasoning = 2;
  o.reasoning_tokens = 120;
  o.chats = 3;
  o.chat_turns = 2;
  o.chat_tokens = 16;
  o.system_words = 60;
  o.documents = 1;
  o.document_words = 150;
  o.document_tokens = 16;
  bench::ReplayOptions ro;
  ro.clients = 4;
  ro.timeout_s = 120;
  bench::RunStats st = bench::replay("127.0.0.1", port, bench::generate_mix(o), ro);
  srv.stop();
  st.label = "knorm";
  EXPECT_EQ(st.completed, 6);
  EXPECT_EQ(st.failed, 0);
  EXPECT_EQ(st.requests, 2 + 3 * 2 + 1);
  EXPECT_GE(st.completion_tokens, 2 * 120);
  EXPECT_EQ(static_cast<int64_t>(st.ttft_s.size()), st.requests);
  EXPECT_GT(st.ttft_quantile(0.99), 0);
  EXPECT_GE(st.ttft_quantile(0.99), st.ttft_quantile(0.5));
  EXPECT_GT(st.prefix_hit_rate(), 0);  // the chats share their system prompt
  EXPECT_GE(st.peak_running, 1);
  EXPECT_GE(st.peak_long_output, 1);  // two reasoning sessions, each streams 120 tokens
  EXPECT_LE(st.peak_long_output, 2);
  EXPECT_LE(st.peak_long_output, st.peak_running);
  const std::string table = bench::markdown_table({st});
  EXPECT_NE(table.find("| run | sessions completed |"), std::string::npos);
  EXPECT_NE(table.find("| knorm | 6/6 |"), std::string::npos);
}

// `kvpack bench serve --target`: the binary replays the mix against a server it did not start (here one
// in this process; in scripts/cluster_bench.py the HAProxy in front of replicas) and reports client-side
// figures only, as a table and as JSON.
TEST(BenchReplay, TargetModeReportsClientSideFiguresAgainstARunningServer) {
  auto model = Model::load(std::string(KVPACK_SHARED_DIR) + "/models/stories260K.gguf");
  EngineOptions eo;
  eo.threads = 1;
  Engine engine(*model, eo);
  ServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  Server srv(engine, so);
  const int port = srv.start();
  const std::string json_path = ::testing::TempDir() + "/bench_target_" + std::to_string(::getpid()) + ".json";
  const std::string cmd = std::string(KVPACK_BINARY) + " bench serve --target 127.0.0.1:" + std::to_string(port) +
                          " --label single --json " + json_path +
                          " --temp 0 --reasoning 1 --reasoning-tokens 24 --chats 2 --turns 2 --chat-tokens 8 --system-words 40"
                          " --documents 1 --document-words 40 --clients 2 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = pclose(p);
  srv.stop();
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("| single | 4/4 | 6 |"), std::string::npos) << out;  // 1 + 2 x 2 + 1 requests
  EXPECT_NE(out.find("(no header):6"), std::string::npos) << out;       // no router: no X-Kvpack-Replica
  std::ifstream f(json_path);
  const auto j = nlohmann::json::parse(f, nullptr, false);
  ASSERT_TRUE(j.is_object()) << "no JSON in " << json_path;
  EXPECT_EQ(j["completed"], 4);
  EXPECT_EQ(j["requests"], 6);
  EXPECT_EQ(j["shared_tokens"], 0);  // no shared tier
  EXPECT_GT(j["cached_tokens"].get<int64_t>(), 0);  // the second chat turns reuse their history
  EXPECT_EQ(j["recomputed_tokens"].get<int64_t>(), j["prompt_tokens"].get<int64_t>() - j["cached_tokens"].get<int64_t>());
  EXPECT_GE(j["completion_tokens"].get<int64_t>(), 24);
  EXPECT_GT(j["ttft_p50_ms"].get<double>(), 0);
  EXPECT_EQ(j["replica_requests"][""], 6);
  std::remove(json_path.c_str());
}

TEST(BenchReplay, TargetModeRefusesAMalformedTargetAndFailsWhenNothingAnswers) {
  const std::string bin = std::string(KVPACK_BINARY);
  EXPECT_NE(std::system((bin + " bench serve --target nohostport >/dev/null 2>&1").c_str()), 0);
  EXPECT_NE(std::system((bin + " bench serve --target 127.0.0.1:0 >/dev/null 2>&1").c_str()), 0);
  // A port nobody listens on: every session fails after its retries; exit status non-zero.
  EXPECT_NE(std::system((bin + " bench serve --target 127.0.0.1:1 --reasoning 1 --chats 0 --documents 0 --temp 0 >/dev/null 2>&1").c_str()), 0);
}
