// n > 1 choices on the real model (stories260K): one prefill whose KV pages the choices share
// copy-on-write. Every choice gives what a solo request with its seed gives (greedy: the n = 1 text),
// with and without compression (whose state forks with the pages), with the prefix cache on and off,
// under preemption (swap and recompute); pages are really shared (the pool holds fewer than n solo
// runs would), cancellation ends every choice, and the pool's invariants hold at every step.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "compress/calibration.h"
#include "engine/calibrate.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"

using namespace kvpack;

namespace {

const std::string kShared = KVPACK_SHARED_DIR;
constexpr int32_t kStreams = 20;  // stories260K: 5 layers x 4 KV heads
// 70-odd tokens: four full pages per stream, and a partly filled fifth (copied by each choice).
const std::string kPrompt =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
    "dog, Max. One day, Lily and Max found a big red ball under a tree. They played with it all day long.";

struct Choice {
  std::string text;
  FinishReason finish = FinishReason::Length;
  RequestStats stats;
  bool finished = false;
};
// (request id, choice index) -> what came back
using Out = std::map<std::pair<uint64_t, int32_t>, Choice>;

class ChoicesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = Model::load(kShared + "/models/stories260K.gguf").release();
    std::vector<int32_t> text;
    for (int i = 0; i < 20; ++i)
      for (int32_t t : model_->tokenizer().encode(kPrompt, i == 0)) text.push_back(t);
    calib_ = new compress::QueryStats(calibrate(*model_, text, EngineOptions{}));
  }
  static void TearDownTestSuite() {
    delete calib_;
    delete model_;
  }

  static Request request(int32_t n, compress::PolicyKind pol, int32_t max_tokens = 40) {
    Request r;
    r.prompt = model_->tokenizer().encode(kPrompt, true);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.n = n;
    if (pol != compress::PolicyKind::Full) {
      r.kv.policy = pol;
      r.kv.budget = 40;
      r.kv.interval = 16;
    }
    return r;
  }
  static uint64_t submit(Scheduler& s, Request r, Out& out) {
    const int32_t n = r.n;
    auto id = std::make_shared<uint64_t>(0);
    *id = s.submit(std::move(r), [&out, id](const RequestEvent& ev) {
      Choice& c = out[{*id, ev.index}];
      if (ev.kind == RequestEvent::Kind::Text) {
        c.text += ev.text;
        return;
      }
      EXPECT_FALSE(c.finished) << "choice " << ev.index << " finished twice";
      c.finished = true;
      c.finish = ev.finish;
      c.stats = ev.stats;
      if (ev.finish == FinishReason::Error) ADD_FAILURE() << "choice failed: " << ev.error;
    });
    for (int32_t i = 0; i < n; ++i) out[{*id, i}];
    return *id;
  }
  // Steps until every choice finished, checking the invariants at each step; returns the most pages in use.
  static int64_t run(Scheduler& s, Engine& e, const Out& out) {
    int64_t peak = 0;
    for (int i = 0; i < 20000; ++i) {
      bool all = true;
      for (const auto& [k, c] : out) all &= c.finished;
      if (all) return peak;
      s.step();
      EXPECT_EQ(s.check_invariants(), "") << "step " << i;
      peak = std::max(peak, e.kv().pool().used_pages());
    }
    ADD_FAILURE() << "choices did not finish";
    return peak;
  }
  // The request (all its choices) alone on a fresh engine with default options, run to the end; its id in
  // `out`, and the scheduler's metrics after it if asked.
  static uint64_t run_alone(const Request& r, Out& out, SchedulerMetrics* metrics = nullptr) {
    Engine e(*model_, EngineOptions{});
    e.set_calibration(*calib_);
    Scheduler sched(e, SchedulerOptions{});
    const uint64_t id = submit(sched, r, out);
    run(sched, e, out);
    if (metrics != nullptr) *metrics = sched.metrics();
    return id;
  }
  // The request with n = 1 alone on a fresh engine (same prefix-cache setting); its text and peak pages.
  static std::pair<std::string, int64_t> solo(Request r, bool prefix_cache, const std::string& cold = "") {
    auto [choice, peak] = solo_run(std::move(r), prefix_cache, cold);
    return {choice.text, peak};
  }
  // The same, with everything that came back (text, finish, stats).
  static std::pair<Choice, int64_t> solo_run(Request r, bool prefix_cache, const std::string& cold = "") {
    r.n = 1;
    EngineOptions eo;
    eo.kv_cold = cold;
    Engine e(*model_, eo);
    e.set_calibration(*calib_);
    SchedulerOptions so;
    so.max_running = 1;
    so.prefix_cache = prefix_cache;
    Scheduler sched(e, so);
    Out out;
    const uint64_t id = submit(sched, r, out);
    const int64_t peak = run(sched, e, out);
    return {out[{id, 0}], peak};
  }

  static Model* model_;
  static compress::QueryStats* calib_;
};
Model* ChoicesTest::model_ = nullptr;
compress::QueryStats* ChoicesTest::calib_ = nullptr;

}  // namespace

TEST_F(ChoicesTest, GreedyChoicesEqualTheSoloRunAndShareThePromptPages) {
  using P = compress::PolicyKind;
  for (P pol : {P::Full, P::KNorm, P::SnapKV, P::H2O})
    for (bool prefix : {true, false})
      for (int32_t n : {2, 4}) {
        const std::string what = std::string(compress::policy_name(pol)) + (prefix ? " prefix" : " no-prefix") + " n=" + std::to_string(n);
        const Request r = request(n, pol);
        const auto [want, solo_peak] = solo(r, prefix);
        Engine e(*model_, EngineOptions{});
        e.set_calibration(*calib_);
        SchedulerOptions so;
        so.prefix_cache = prefix;
        Scheduler sched(e, so);
        Out out;
        const uint64_t id = submit(sched, r, out);
        const int64_t peak = run(sched, e, out);
        int64_t saved = 0;
        for (int32_t i = 0; i < n; ++i) {
          const Choice& c = out[{id, i}];
          EXPECT_EQ(c.text, want) << what << " choice " << i;
          EXPECT_EQ(c.stats.completion_tokens, 40) << what;
          EXPECT_EQ(c.stats.prompt_tokens, static_cast<int32_t>(r.prompt.size())) << what;
          // Uncompressed: every full prompt page; compressed: what the prompt's compaction left.
          if (i == 0 || pol == P::Full) {
            EXPECT_EQ(c.stats.fork_shared_pages, i == 0 ? 0 : kStreams * (static_cast<int64_t>(r.prompt.size()) / 16)) << what;
          } else {
            EXPECT_GT(c.stats.fork_shared_pages, 0) << what;
          }
          saved += c.stats.fork_shared_pages;
        }
        // Really shared: fewer pages than n solo runs (uncompressed: the shared prompt pages exactly once).
        EXPECT_LT(peak, n * solo_peak) << what;
        if (pol == P::Full) {
          EXPECT_LE(peak, n * solo_peak - saved) << what;
        }
        const SchedulerMetrics m = sched.metrics();
        EXPECT_EQ(m.forks, n - 1) << what;
        EXPECT_EQ(m.fork_pages_saved, saved) << what;
        if (pol == P::Full && prefix && n == 4) {
          std::printf("n=4 full KV: peak %lld pages shared vs %lld for 4 solo runs (%lld saved by sharing)\n",
                      static_cast<long long>(peak), static_cast<long long>(4 * solo_peak), static_cast<long long>(saved));
        }
      }
}

// A forked choice's compressor carries the prompt's history (it compresses as a solo run would), but its
// counts start at the fork: the request's choices and the scheduler's totals count the prompt's compaction
// once. Counts of the solo run: E(40 tokens) for choice 0, E(40) - E(1) (what happens after the first
// token, where the fork is) for every other choice.
TEST_F(ChoicesTest, ForkedChoicesCountCompressionFromTheFork) {
  auto solo_stats = [](Request r) { return solo_run(std::move(r), true).first.stats.compression; };
  const int32_t n = 3;
  const Request r = request(n, compress::PolicyKind::KNorm);
  const compress::CompressionStats whole = solo_stats(r);
  const compress::CompressionStats before_fork = solo_stats(request(1, compress::PolicyKind::KNorm, 1));
  ASSERT_GT(before_fork.events, 0) << "the prompt should be compressed before the fork";
  ASSERT_GT(whole.events, before_fork.events) << "decode should compress again after the fork";
  Out out;
  SchedulerMetrics m;
  const uint64_t id = run_alone(r, out, &m);
  int64_t events = 0, evicted = 0;
  for (int32_t i = 0; i < n; ++i) {
    const compress::CompressionStats& c = out[{id, i}].stats.compression;
    EXPECT_EQ(c.events, i == 0 ? whole.events : whole.events - before_fork.events) << "choice " << i;
    EXPECT_EQ(c.evicted_slots, i == 0 ? whole.evicted_slots : whole.evicted_slots - before_fork.evicted_slots) << "choice " << i;
    events += c.events;
    evicted += c.evicted_slots;
  }
  EXPECT_EQ(m.compression.events, events);
  EXPECT_EQ(m.compression.evicted_slots, evicted);
  EXPECT_EQ(events, whole.events + (n - 1) * (whole.events - before_fork.events));
}

TEST_F(ChoicesTest, SeededChoicesAreReproducibleAndEqualSoloRunsWithTheirDerivedSeed) {
  for (compress::PolicyKind pol : {compress::PolicyKind::Full, compress::PolicyKind::KNorm}) {
    Request r = request(3, pol, 30);
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 1234;
    std::vector<std::string> first;
    for (int rep = 0; rep < 2; ++rep) {
      Out out;
      const uint64_t id = run_alone(r, out);
      std::vector<std::string> texts;
      for (int32_t i = 0; i < 3; ++i) texts.push_back(out[{id, i}].text);
      if (rep == 0) first = texts;
      else EXPECT_EQ(texts, first) << "run to run";
    }
    std::set<std::string> distinct(first.begin(), first.end());
    EXPECT_GT(distinct.size(), 1u) << "different seeds, different samples";
    for (int32_t i = 0; i < 3; ++i) {
      Request one = r;
      one.sampling.seed = choice_seed(1234, i);
      EXPECT_EQ(first[static_cast<size_t>(i)], solo(one, true).first) << compress::policy_name(pol) << " choice " << i;
    }
  }
}

TEST_F(ChoicesTest, ATightPoolPreemptsChoicesAndEveryOneStillGivesTheSoloText) {
  using P = compress::PolicyKind;
  for (const std::string& cold : {std::string(""), std::string("host:64M")})
    for (P pol : {P::Full, P::KNorm}) {
      // Recompute rebuilds a compressed KV differently from a solo run (as for n = 1): swap only.
      if (pol != P::Full && cold.empty()) continue;
      const std::string what = std::string(compress::policy_name(pol)) + " cold '" + cold + "'";
      Request r = request(3, pol, 60);
      if (pol != P::Full) r.kv.recall.enabled = !cold.empty();  // evicted records fork with the choices
      const std::string want = solo(r, true, cold).first;
      EngineOptions eo;
      eo.kv_pages = kStreams * 16;  // about two unshared sequences of prompt + 60 tokens
      eo.kv_cold = cold;
      Engine e(*model_, eo);
      e.set_calibration(*calib_);
      SchedulerOptions so;
      so.reserve_admission = false;
      so.watermark = 0;
      so.step_tokens = 32;
      Scheduler sched(e, so);
      Out out;
      std::vector<uint64_t> ids;
      for (int k = 0; k < 2; ++k) ids.push_back(submit(sched, r, out));
      run(sched, e, out);
      int32_t preemptions = 0;
      for (uint64_t id : ids)
        for (int32_t i = 0; i < 3; ++i) {
          const Choice& c = out[{id, i}];
          EXPECT_EQ(c.text, want) << what << " request " << id << " choice " << i;
          preemptions += c.stats.preemptions;
        }
      EXPECT_GT(preemptions, 0) << what << ": the pool was meant to force preemption";
      EXPECT_EQ(e.kv().pool().used_pages(), 0) << what;
    }
}

TEST_F(ChoicesTest, CancellingTheRequestEndsEveryChoice) {
  Engine e(*model_, EngineOptions{});
  Scheduler sched(e, SchedulerOptions{});
  Out out;
  const uint64_t id = submit(sched, request(3, compress::PolicyKind::Full, 200), out);
  for (int i = 0; i < 20 && out[std::make_pair(id, 2)].text.empty(); ++i) sched.step();  // forked and decoding
  ASSERT_FALSE(out[std::make_pair(id, 2)].text.empty());
  sched.cancel(id);
  sched.step();
  for (int32_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(out[std::make_pair(id, i)].finished) << i;
    EXPECT_EQ(out[std::make_pair(id, i)].finish, FinishReason::Cancelled) << i;
  }
  EXPECT_EQ(sched.check_invariants(), "");
  EXPECT_EQ(e.kv().pool().used_pages(), 0);
}

TEST_F(ChoicesTest, NOutsideOneToMaxRunningIsRefused) {
  Engine e(*model_, EngineOptions{});
  SchedulerOptions so;
  so.max_running = 4;
  Scheduler sched(e, so);
  Out out;
  EXPECT_THROW(submit(sched, request(0, compress::PolicyKind::Full), out), std::invalid_argument);
  EXPECT_THROW(submit(sched, request(5, compress::PolicyKind::Full), out), std::invalid_argument);
}
