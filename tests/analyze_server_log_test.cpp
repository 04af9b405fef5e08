// The analyzer on the real server's request log: chat traffic with two planted causes (a timestamp in
// the system prompt, documents after the question) goes through `kvpack serve`'s code (in-process, on a
// loopback port, stories260K) with --request-log-prompts; the analyzer reads that log and must render
// every prompt to the server's own token count and simulate exactly the cached tokens the server
// reported, request by request, and find both causes.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <map>

#include "analyze/analyzer.h"
#include "engine/engine.h"
#include "server/server.h"
#include "server_model_fixture.h"

using namespace kvpack;
using namespace kvpack::analyze;
using json = nlohmann::json;

namespace {

const bool kNoSigpipe = [] { return signal(SIGPIPE, SIG_IGN) != SIG_ERR; }();

const std::string kDocument =
    "Lily had a red ball. She liked to play with it in the park. One day the ball went into the pond and a big "
    "duck came to look at it. Lily was sad, but Ben came with a long stick and they got the ball back together.";

// Sessions of a small chat app and single document questions, in the order they are sent.
std::vector<json> traffic() {
  std::vector<json> out;
  const std::vector<std::string> users = {"Tell me about the cat.", "What did the dog do?", "Where is the park?"};
  for (int turn = 0; turn < 3; ++turn)
    for (int s = 0; s < 2; ++s) {
      json msgs = json::array();
      // The planted volatile span: the time of the request.
      msgs.push_back({{"role", "system"}, {"content", "You tell short stories. Time: 10:0" + std::to_string(out.size()) + " today."}});
      for (int t = 0; t <= turn; ++t) {
        msgs.push_back({{"role", "user"}, {"content", users[static_cast<size_t>(t)] + " (" + std::to_string(s) + ")"}});
        if (t < turn) msgs.push_back({{"role", "assistant"}, {"content", "Once upon a time there was a little girl."}});
      }
      out.push_back({{"messages", msgs}, {"max_tokens", 1}, {"temperature", 0}});
    }
  for (const char* q : {"Who had the ball?", "What came to look?", "Who helped Lily?"}) {
    json msgs = json::array({{{"role", "system"}, {"content", "Answer from the story."}},
                             {{"role", "user"}, {"content", std::string(q) + "\n\n" + kDocument}}});
    out.push_back({{"messages", msgs}, {"max_tokens", 1}, {"temperature", 0}});
  }
  return out;
}

}  // namespace

class AnalyzeServerLog : public test::StoriesModelTest {};

TEST_F(AnalyzeServerLog, SimulatesExactlyWhatTheServerReportedAndFindsThePlantedCauses) {
  const std::string path = ::testing::TempDir() + "kvpack-analyze-log-" + std::to_string(::getpid()) + ".jsonl";
  std::remove(path.c_str());
  EngineOptions eo;
  eo.threads = 1;
  eo.kv_pages = 1 << 14;  // every block stays cached: the simulation is unbounded
  Engine engine(*model_, eo);
  server::ServerOptions opt;
  opt.port = 0;
  opt.request_log = path;
  opt.request_log_prompts = true;
  server::Server srv(engine, opt);
  const int port = srv.start();
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  std::vector<std::string> sent_ids;  // one request at a time: the cache sees them in this order
  for (const json& body : traffic()) {
    const auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    sent_ids.push_back(json::parse(r->body)["id"]);
  }
  srv.stop();

  Log log = read_request_log_file(path);
  std::remove(path.c_str());
  ASSERT_EQ(log.size(), sent_ids.size());
  EXPECT_TRUE(order_by_arrival(log));  // every server line has ts and e2e_s
  std::map<std::string, const LoggedRequest*> by_id;
  for (const auto& r : log) by_id[r.id] = &r;
  Log in_sent_order;
  for (const auto& id : sent_ids) {
    ASSERT_TRUE(by_id.count(id)) << id;
    in_sent_order.push_back(*by_id[id]);
  }
  PromptRenderer renderer(model_->tokenizer(), server::detect_chat_format(model_->chat_template()));
  const SimOptions sim{eo.page_size, 0};
  const SimResult s = simulate_log(in_sent_order, renderer, sim);
  int64_t reused = 0;
  for (size_t i = 0; i < in_sent_order.size(); ++i) {
    const LoggedRequest& r = in_sent_order[i];
    ASSERT_TRUE(r.logged_prompt_tokens && r.logged_cached_tokens);
    EXPECT_EQ(renderer.blocks(r, sim.page_size).n_tokens, *r.logged_prompt_tokens) << "request " << i;
    EXPECT_EQ(s.cached[i], *r.logged_cached_tokens) << "request " << i;
    reused += *r.logged_cached_tokens;
  }
  EXPECT_GT(reused, 0);  // the traffic does reuse something (else the comparison says little)

  const Report rep = analyze_prefix_reuse(in_sent_order, renderer, {sim});
  EXPECT_EQ(rep.logged_cached_tokens, rep.prompt_tokens - rep.computed_tokens);
  for (const auto& c : rep.causes) {
    SCOPED_TRACE(cause_name(c.cause));
    if (c.cause == Cause::Volatile || c.cause == Cause::Documents) {
      EXPECT_GT(c.requests_affected, 0);
      EXPECT_GT(c.tokens_lost, 0);
    } else {
      EXPECT_EQ(c.requests_affected, 0);
    }
  }
}
