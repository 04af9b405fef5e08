// Continuous batching on the real model (stories260K): batched greedy outputs equal single-request
// outputs; prefix-cache hits keep outputs identical; a tiny page pool forces preemption and every
// request still completes with the right text; cancellation frees pages; pool invariants hold.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "engine/scheduler.h"

using namespace kvpack;

namespace {

const std::string kShared = KVPACK_SHARED_DIR;

struct Collected {
  std::string text, reason;
  int32_t completion = 0, cached = 0, preemptions = 0;
  bool finished = false;
};
using Results = std::map<uint64_t, Collected>;

uint64_t submit(Scheduler& s, Request spec, Results& out) {
  auto holder = std::make_shared<uint64_t>(0);
  const uint64_t id = s.submit(std::move(spec), [&out, holder](const RequestEvent& ev) {
    Collected& c = out[*holder];
    if (ev.kind == RequestEvent::Kind::Text) {
      c.text += ev.text;
    } else {
      c.finished = true;
      c.reason = finish_reason_name(ev.finish);
      c.completion = ev.stats.completion_tokens;
      c.cached = ev.stats.cached_tokens;
      c.preemptions = ev.stats.preemptions;
    }
  });
  *holder = id;
  out[id];
  return id;
}

void run_until_done(Scheduler& s, const Results& out, int max_steps = 100000) {
  for (int i = 0; i < max_steps; ++i) {
    bool all = true;
    for (const auto& [id, c] : out) all &= c.finished;
    if (all) return;
    s.step();
    ASSERT_EQ(s.check_invariants(), "") << "step " << i;
  }
  FAIL() << "requests did not finish";
}

// Steps until every request finished (pool invariants checked at each step); returns the largest value
// `measure()` took after any step (by default the pages in use).
template <class Measure>
int64_t run_tracking_max(Scheduler& sched, const Results& out, Measure measure, int max_steps = 2000) {
  int64_t most = 0;
  for (int i = 0; i < max_steps; ++i) {
    bool all = true;
    for (const auto& [id, c] : out) all &= c.finished;
    if (all) break;
    sched.step();
    EXPECT_EQ(sched.check_invariants(), "") << "step " << i;
    most = std::max(most, measure());
  }
  return most;
}
int64_t run_tracking_peak(Scheduler& sched, Engine& engine, const Results& out) {
  return run_tracking_max(sched, out, [&] { return engine.kv().pool().used_pages(); });
}

const std::vector<std::string> kPrompts = {
    "Once upon a time", "The little dog", "Lily and Ben went to the park", "One day, a big bird",
    "Tom had a red ball", "The sun was hot and", "Sara wanted a cookie", "In a small house there lived",
};

}  // namespace

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override { model = Model::load(kShared + "/models/stories260K.gguf"); }

  Request spec(const std::string& prompt, int32_t n) const {
    Request s;
    s.prompt = model->tokenizer().encode(prompt, true);
    s.max_tokens = n;
    s.sampling.temperature = 0;
    return s;
  }
  std::string single_run(const std::string& prompt, int32_t n) const {
    Engine e(*model, EngineOptions{});
    Request r;
    r.prompt = model->tokenizer().encode(prompt, true);
    r.max_tokens = n;
    r.sampling.temperature = 0;
    return e.generate(r, nullptr).text;
  }
  std::unique_ptr<Model> model;
};

TEST_F(SchedulerTest, BatchedGreedyEqualsSingleRequests) {
  std::map<std::string, std::string> want;
  for (const auto& p : kPrompts) want[p] = single_run(p, 60);
  EngineOptions eo;
  eo.kv_pages = 20 * 32 * 8;  // room for all eight at full context
  Engine engine(*model, eo);
  SchedulerOptions so;
  so.max_running = 8;
  so.step_tokens = 64;
  Scheduler sched(engine, so);
  Results out;
  std::map<uint64_t, std::string> prompt_of;
  for (const auto& p : kPrompts) prompt_of[submit(sched, spec(p, 60), out)] = p;
  run_until_done(sched, out);
  for (const auto& [id, c] : out) {
    EXPECT_EQ(c.reason, "length");
    EXPECT_EQ(c.completion, 60);
    EXPECT_EQ(c.text, want[prompt_of[id]]) << prompt_of[id];
  }
  EXPECT_GE(sched.metrics().peak_running, 8);
}

TEST_F(SchedulerTest, SharedPrefixHitsTheCacheAndKeepsOutputsIdentical) {
  const std::string system = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. ";
  const std::vector<std::string> users = {"One day", "Her mom said", "Lily saw a cat"};
  std::map<std::string, std::string> want;
  for (const auto& u : users) want[u] = single_run(system + u, 40);
  Engine engine(*model, EngineOptions{});
  Scheduler sched(engine, SchedulerOptions{});
  Results out;
  std::map<uint64_t, std::string> user_of;
  // First request alone (fills the cache), then the others.
  user_of[submit(sched, spec(system + users[0], 40), out)] = users[0];
  run_until_done(sched, out);
  for (size_t i = 1; i < users.size(); ++i) user_of[submit(sched, spec(system + users[i], 40), out)] = users[i];
  run_until_done(sched, out);
  for (const auto& [id, c] : out) EXPECT_EQ(c.text, want[user_of[id]]) << user_of[id];
  const auto m = sched.metrics();
  EXPECT_GE(m.prefix.hits, 2);
  EXPECT_GE(m.prefix.tokens_hit, 2 * 16);
  int hits_with_tokens = 0;
  for (const auto& [id, c] : out) hits_with_tokens += c.cached > 0;
  EXPECT_EQ(hits_with_tokens, 2);
}

TEST_F(SchedulerTest, TinyPoolForcesPreemptionAndEveryRequestCompletesCorrectly) {
  for (PreemptPolicy pol : {PreemptPolicy::LRU, PreemptPolicy::LFU, PreemptPolicy::Priority}) {
    std::map<std::string, std::string> want;
    for (const auto& p : kPrompts) want[p] = single_run(p, 80);
    EngineOptions eo;
    // 20 streams; room for ~2.5 sequences of ~90 tokens (6 pages per stream each).
    eo.kv_pages = 20 * 15;
    Engine engine(*model, eo);
    SchedulerOptions so;
    so.max_running = 8;
    so.reserve_admission = false;  // optimistic admission: preemption does the work
    so.watermark = 0.0;
    so.prefix_cache = false;
    so.preempt = pol;
    Scheduler sched(engine, so);
    Results out;
    std::map<uint64_t, std::string> prompt_of;
    int prio = 0;
    for (const auto& p : kPrompts) {
      Request s = spec(p, 80);
      s.priority = prio++ % 3;
      prompt_of[submit(sched, s, out)] = p;
    }
    run_until_done(sched, out);
    int preempted = 0;
    for (const auto& [id, c] : out) {
      EXPECT_EQ(c.reason, "length") << preempt_name(pol);
      EXPECT_EQ(c.text, want[prompt_of[id]]) << preempt_name(pol) << " " << prompt_of[id];
      preempted += c.preemptions;
    }
    EXPECT_GT(preempted, 0) << preempt_name(pol);
    EXPECT_GT(sched.metrics().preemptions_lru + sched.metrics().preemptions_lfu + sched.metrics().preemptions_priority, 0);
    EXPECT_EQ(engine.kv().pool().used_pages(), 0);
  }
}

// The pool's page runs (kv/page_pool.h) only place pages: batched decode with preemption gives the same
// text with them and without (the old one-page-at-a-time allocator), and the invariants hold at every step.
TEST_F(SchedulerTest, PageRunsChangeNoOutputUnderBatchingAndPreemption) {
  std::map<std::string, std::string> want;
  for (const auto& p : kPrompts) want[p] = single_run(p, 80);
  for (const bool runs : {false, true}) {
    EngineOptions eo;
    eo.kv_pages = 20 * 15;
    eo.page_runs = runs;
    Engine engine(*model, eo);
    SchedulerOptions so;
    so.max_running = 8;
    so.reserve_admission = false;
    so.watermark = 0.0;
    Scheduler sched(engine, so);
    Results out;
    std::map<uint64_t, std::string> prompt_of;
    for (const auto& p : kPrompts) prompt_of[submit(sched, spec(p, 80), out)] = p;
    // Soft-reserved pages at their most (a tiny pool hands them all out again once it is full).
    const int64_t most_held = run_tracking_max(sched, out, [&] { return engine.kv().pool().soft_reserved_pages(); }, 100000);
    int preempted = 0;
    for (const auto& [id, c] : out) {
      EXPECT_TRUE(c.finished);
      EXPECT_EQ(c.text, want[prompt_of[id]]) << "page runs " << runs << ": " << prompt_of[id];
      preempted += c.preemptions;
    }
    EXPECT_GT(preempted, 0) << "the pool was meant to force preemption";
    EXPECT_EQ(most_held > 0, runs) << "runs hold pages for growing streams";
  }
}

TEST_F(SchedulerTest, CancelFreesPagesAtTheNextStep) {
  Engine engine(*model, EngineOptions{});
  SchedulerOptions so;
  so.prefix_cache = false;
  Scheduler sched(engine, so);
  Results out;
  const uint64_t a = submit(sched, spec("Once upon a time", 400), out);
  const uint64_t b = submit(sched, spec("The little dog", 20), out);
  for (int i = 0; i < 30; ++i) sched.step();
  EXPECT_GT(engine.kv().pool().used_pages(), 0);
  EXPECT_TRUE(out[b].finished);
  sched.cancel(a);
  sched.step();
  EXPECT_TRUE(out[a].finished);
  EXPECT_EQ(out[a].reason, "cancelled");
  EXPECT_EQ(engine.kv().pool().used_pages(), 0);
  EXPECT_EQ(sched.metrics().requests_cancelled, 1);
}

// Prompts far longer than budget + interval, prefilled in 256-token steps: each chunk ends where the next
// compression event fires, so no sequence ever holds more than budget + interval slots (what admission
// projects for it), and the outputs are those of the single-request engine path.
TEST_F(SchedulerTest, LongPromptPrefillNeverOvershootsBudgetPlusInterval) {
  Engine engine(*model, EngineOptions{});
  SchedulerOptions so;
  so.prefix_cache = false;
  so.step_tokens = 256;
  Scheduler sched(engine, so);
  Results out;
  std::string longp;
  for (int i = 0; i < 40; ++i) longp += kPrompts[static_cast<size_t>(i % 8)] + ". ";
  for (int i = 0; i < 2; ++i) {
    Request s = spec(longp + kPrompts[static_cast<size_t>(i)], 40);
    ASSERT_GT(s.prompt.size(), 300u);
    s.kv.policy = compress::PolicyKind::KNorm;
    s.kv.budget = 64;
    s.kv.interval = 32;
    submit(sched, s, out);
  }
  const int64_t peak = run_tracking_peak(sched, engine, out);
  for (const auto& [id, c] : out) EXPECT_EQ(c.completion, 40);
  // 2 sequences x 20 streams x ceil((64 + 32) / 16) pages (a chunk of 256 would need 20 pages per stream).
  EXPECT_LE(peak, 2 * 20 * (96 / 16));
  EXPECT_GT(sched.metrics().compression.events, 2 * 300 / 32 - 4);
}

TEST_F(SchedulerTest, CompressedSequencesStayNearTheirBudget) {
  Engine engine(*model, EngineOptions{});
  SchedulerOptions so;
  so.prefix_cache = false;
  Scheduler sched(engine, so);
  Results out;
  for (int i = 0; i < 3; ++i) {
    Request s = spec(kPrompts[static_cast<size_t>(i)], 400);
    s.kv.policy = compress::PolicyKind::KNorm;
    s.kv.budget = 64;
    s.kv.interval = 32;
    submit(sched, s, out);
  }
  const int64_t peak = run_tracking_peak(sched, engine, out);
  for (const auto& [id, c] : out) EXPECT_EQ(c.completion, 400);
  // 3 sequences x 20 streams x ceil((64 + 32) / 16) pages, + one page per stream for the step's token.
  EXPECT_LE(peak, 3 * 20 * (96 / 16 + 1));
  const auto m = sched.metrics();
  EXPECT_GT(m.compression.events, 0);
  EXPECT_GT(m.compression.reclaim_efficiency(), 0.9);
}
