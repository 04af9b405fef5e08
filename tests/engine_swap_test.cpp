// Swap preemption and prefix-cache spill through the real scheduler on the real model (stories260K),
// with the real cold tiers (host memory, and files in a temporary directory): greedy outputs under any
// load equal the solo run for every policy when preempted sequences swap; the tier full or a corrupted
// file falls back to recompute and never yields wrong tokens; a spilled prefix comes back from the cold
// tier; a randomized schedule over policies x prefix cache x pool size x batching x tier checks pool,
// cache and tier invariants at every step.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/calibrate.h"
#include "engine/engine.h"
#include "engine/scheduler.h"
#include "kv/cold_tier_file.h"

using namespace kvpack;

namespace {

const std::string kShared = KVPACK_SHARED_DIR;
const std::vector<std::string> kPrompts = {
    "Once upon a time", "The little dog", "Lily and Ben went to the park", "One day, a big bird",
    "Tom had a red ball", "The sun was hot and", "Sara wanted a cookie", "In a small house there lived",
};
constexpr int32_t kStreams = 20;  // stories260K: 5 layers x 4 KV heads

struct Outcome {
  std::string text;
  FinishReason finish = FinishReason::Length;
  RequestStats stats;
  bool finished = false;
};

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/kvpack-swap-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

class SwapTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = Model::load(kShared + "/models/stories260K.gguf").release();
    std::vector<int32_t> text;
    for (int i = 0; i < 40; ++i)
      for (int32_t t : model_->tokenizer().encode(kPrompts[static_cast<size_t>(i % 8)] + ". ", i == 0)) text.push_back(t);
    calib_ = new compress::QueryStats(calibrate(*model_, text, EngineOptions{}));
  }
  static void TearDownTestSuite() {
    delete calib_;
    delete model_;
  }

  static Request request(const std::string& prompt, int32_t n, compress::PolicyKind pol) {
    Request r;
    r.prompt = model_->tokenizer().encode(prompt, true);
    r.max_tokens = n;
    r.sampling.temperature = 0;
    if (pol != compress::PolicyKind::Full) {
      r.kv.policy = pol;
      r.kv.budget = 40;
      r.kv.interval = 16;
    }
    return r;
  }
  // The request alone on a fresh engine with the same prefix-cache setting (a compressed sequence's
  // registered prompt blocks are protected from eviction, so the setting is part of the configuration).
  static std::string solo(const Request& r, bool prefix_cache = true) {
    SchedulerOptions so;
    so.prefix_cache = prefix_cache;
    return alone(r, EngineOptions{}, so).text;
  }
  // The request alone (max_running 1) on a fresh engine with these options; `pages_left`: the pool's used
  // pages once it finished.
  static Outcome alone(const Request& r, const EngineOptions& eo, SchedulerOptions so, int64_t* pages_left = nullptr) {
    Engine e(*model_, eo);
    e.set_calibration(*calib_);
    so.max_running = 1;
    Scheduler sched(e, so);
    std::map<uint64_t, Outcome> out;
    const uint64_t id = submit(sched, r, out);
    run(sched, out);
    if (pages_left != nullptr) *pages_left = e.kv().pool().used_pages();
    return out[id];
  }
  static uint64_t submit(Scheduler& s, Request r, std::map<uint64_t, Outcome>& out) {
    auto id = std::make_shared<uint64_t>(0);
    *id = s.submit(std::move(r), [&out, id](const RequestEvent& ev) {
      Outcome& o = out[*id];
      if (ev.kind == RequestEvent::Kind::Text) {
        o.text += ev.text;
        return;
      }
      o.finished = true;
      o.finish = ev.finish;
      o.stats = ev.stats;
      if (ev.finish == FinishReason::Error) ADD_FAILURE() << "request failed: " << ev.error;
    });
    out[*id];
    return *id;
  }
  // Every prompt with full KV (which recomputes exactly); returns each request's solo output.
  static std::map<uint64_t, std::string> submit_all_full(Scheduler& sched, std::map<uint64_t, Outcome>& out) {
    std::map<uint64_t, std::string> want;
    for (const auto& p : kPrompts) {
      Request r = request(p, 120, compress::PolicyKind::Full);
      want[submit(sched, r, out)] = solo(r, false);
    }
    return want;
  }
  static void run(Scheduler& s, const std::map<uint64_t, Outcome>& out) {
    for (int i = 0; i < 100000; ++i) {
      bool all = true;
      for (const auto& [id, o] : out) all &= o.finished;
      if (all) return;
      s.step();
      ASSERT_EQ(s.check_invariants(), "") << "step " << i;
    }
    FAIL() << "requests did not finish";
  }

  static Model* model_;
  static compress::QueryStats* calib_;
};
Model* SwapTest::model_ = nullptr;
compress::QueryStats* SwapTest::calib_ = nullptr;

// A pool with room for about two of eight sequences and optimistic admission: preemption all the time.
EngineOptions tight_engine(const std::string& cold) {
  EngineOptions eo;
  eo.kv_pages = kStreams * 14;
  eo.kv_cold = cold;
  return eo;
}
SchedulerOptions busy_scheduler(bool prefix_cache) {
  SchedulerOptions so;
  so.max_running = 8;
  so.reserve_admission = false;
  so.watermark = 0;
  so.prefix_cache = prefix_cache;
  so.step_tokens = 32;
  return so;
}

}  // namespace

TEST_F(SwapTest, SwapPreemptionGivesTheSoloOutputForEveryPolicy) {
  TempDir dir;
  using P = compress::PolicyKind;
  for (P pol : {P::Full, P::Streaming, P::KNorm, P::TriAttention, P::SnapKV, P::RKV, P::TOVA, P::H2O}) {
    for (const std::string& cold : {std::string("host:64M"), "dir:" + dir.path + ":64M"}) {
      Engine engine(*model_, tight_engine(cold));
      engine.set_calibration(*calib_);
      Scheduler sched(engine, busy_scheduler(true));
      std::map<uint64_t, Outcome> out;
      std::map<uint64_t, std::string> want;
      for (const auto& p : kPrompts) {
        Request r = request("A long time ago. " + p, 120, pol);
        want[submit(sched, r, out)] = solo(r);
      }
      run(sched, out);
      int swaps = 0;
      for (const auto& [id, o] : out) {
        EXPECT_EQ(o.finish, FinishReason::Length);
        EXPECT_EQ(o.text, want[id]) << compress::policy_name(pol) << " " << cold;
        swaps += o.stats.swap_outs;
        EXPECT_EQ(o.stats.swap_outs, o.stats.swap_ins);
        EXPECT_EQ(o.stats.recomputes, 0);
      }
      EXPECT_GT(swaps, 0) << compress::policy_name(pol) << " " << cold;
      const auto m = sched.metrics();
      EXPECT_EQ(m.recomputes, 0);
      EXPECT_EQ(m.cold.swap_outs, swaps);
      EXPECT_EQ(engine.kv().pool().used_pages(), 0);
      engine.kv().cold_tier()->flush();
      EXPECT_EQ(m.cold.pages_swapped_in, m.cold.pages_swapped_out);
      EXPECT_LE(engine.kv().cold_tier()->stats().records, static_cast<uint64_t>(m.prefix.blocks_spilled) * kStreams)
          << "swap records left behind";
    }
  }
}

// Compression's evicted slots go to the tier (kv/evicted_kv.h): every evicted slot is written, the
// greedy output is the one without a tier, and the records leave the tier when the request finishes.
TEST_F(SwapTest, EvictedTokensGoToTheTierWithoutChangingTheOutput) {
  using P = compress::PolicyKind;
  TempDir dir;
  for (P pol : {P::KNorm, P::TriAttention, P::H2O}) {
    for (const std::string& cold : {std::string("host:64M"), "dir:" + dir.path + ":64M"}) {
      const Request r = request(kPrompts[2], 100, pol);
      Engine e(*model_, tight_engine(cold));
      e.set_calibration(*calib_);
      SchedulerOptions so;
      so.max_running = 1;
      so.prefix_cache = false;
      Scheduler sched(e, so);
      std::map<uint64_t, Outcome> out;
      const uint64_t id = submit(sched, r, out);
      run(sched, out);
      const std::string what = std::string(compress::policy_name(pol)) + " " + cold;
      const RequestStats& st = out[id].stats;
      EXPECT_EQ(out[id].text, solo(r, false)) << what;
      EXPECT_GT(st.compression.evicted_slots, 0) << what;
      EXPECT_EQ(st.evicted.slots_written, st.compression.evicted_slots) << what;
      EXPECT_EQ(st.evicted.pages_refused, 0) << what;
      EXPECT_GE(st.evicted.pages_written * 16, st.evicted.slots_written) << what;
      EXPECT_EQ(e.kv().cold_tier()->stats().records, 0u) << what;  // erased at finish
    }
  }
}

// The drift guard at its most sensitive: the first check escalates, then falls back to full KV — every
// cold page back in the hot set, no more compression — so the request ends holding every token, as a
// full-KV run does, and says so in its stats.
TEST_F(SwapTest, TheDriftGuardFallsBackToFullKvWithEveryTokenHot) {
  for (const std::string& cold : {std::string("host:64M")}) {
    Request r = request(kPrompts[2], 100, compress::PolicyKind::KNorm);
    r.kv.recall.enabled = true;
    r.kv.recall.guard = 1e-6f;
    EngineOptions eo;  // room for the whole context: the fallback holds it
    eo.kv_cold = cold;
    Engine e(*model_, eo);
    SchedulerOptions so;
    so.max_running = 1;
    so.prefix_cache = false;
    Scheduler sched(e, so);
    // A long prompt, so that prefill compresses before the first check.
    std::string prompt;
    for (int i = 0; i < 16; ++i) prompt += kPrompts[static_cast<size_t>(i % 8)] + ". ";
    r.prompt = model_->tokenizer().encode(prompt, true);
    ASSERT_GT(r.prompt.size(), 100u);  // past the first event by more than the 32 rows the first check scores
    std::map<uint64_t, Outcome> out;
    const uint64_t id = submit(sched, r, out);
    run(sched, out);
    const RequestStats& st = out[id].stats;
    EXPECT_GT(st.compression.evicted_slots, 0);
    EXPECT_EQ(st.compression.recall.guard_escalations, 1);
    EXPECT_EQ(st.compression.recall.guard_fallbacks, 1);
    EXPECT_EQ(st.compression.recall.fallback_pages_lost, 0);
    Request plain = r;
    plain.kv = compress::CompressConfig{};
    Engine e2(*model_, EngineOptions{});
    Scheduler sched2(e2, so);
    std::map<uint64_t, Outcome> out2;
    const uint64_t id2 = submit(sched2, plain, out2);
    run(sched2, out2);
    EXPECT_EQ(st.kv_pages_in_use, out2[id2].stats.kv_pages_in_use);  // every token hot again
    // and every token since the first compression event computed again over them: full KV's output
    EXPECT_EQ(out[id].text, out2[id2].text);
  }
}

// The exact drift check (RecallConfig::exact): the newest token computed again over a fork holding every
// KV of the request. With nothing evicted the fork is the sequence itself, so it must give the same logits
// bit for bit (total variation exactly 0, no flip); with eviction it measures a difference, and in both
// cases the request's output is the one without the check and the fork's pages go back to the pool.
TEST_F(SwapTest, TheExactDriftCheckRecomputesOverEveryKvAndChangesNothing) {
  std::string prompt;
  for (int i = 0; i < 6; ++i) prompt += kPrompts[static_cast<size_t>(i)] + ". ";
  for (const int32_t budget : {40, 1000}) {
    Request r = request(prompt, 60, compress::PolicyKind::KNorm);
    r.kv.budget = budget;
    r.kv.recall.enabled = true;
    r.kv.recall.bring_back = false;  // drift only: the hot set is the compressor's alone
    r.kv.recall.every = 4;
    Request plain = r;
    r.kv.recall.exact = true;
    EngineOptions eo;
    eo.kv_cold = "host:64M";
    eo.contexts = 2;
    SchedulerOptions so;
    so.prefix_cache = false;
    int64_t left = -1;
    const Outcome with = alone(r, eo, so, &left), without = alone(plain, eo, so);
    const compress::RecallStats& rs = with.stats.compression.recall;
    EXPECT_EQ(with.text, without.text) << budget;
    EXPECT_GE(rs.checks, 60 / 4) << budget;  // end of prefill, then every 4 tokens
    EXPECT_EQ(rs.exact_checks, rs.checks) << budget;  // one exact check per recall check
    EXPECT_EQ(rs.exact_skipped, 0) << budget;
    EXPECT_EQ(without.stats.compression.recall.exact_checks, 0);
    EXPECT_EQ(left, 0) << budget;
    if (budget >= static_cast<int32_t>(r.prompt.size()) + 60) {  // nothing evicted
      EXPECT_EQ(with.stats.compression.evicted_slots, 0);
      EXPECT_EQ(rs.exact_tv_max, 0.0) << "first " << rs.exact_tv_first << " last " << rs.exact_tv_last;
      EXPECT_EQ(rs.exact_flips, 0);
    } else {
      EXPECT_GT(with.stats.compression.evicted_slots, 0);
      EXPECT_GT(rs.exact_tv_max, 0.0);
      EXPECT_LE(rs.exact_tv_max, 1.0);
    }
  }
  // A check that cannot see every KV is counted as skipped, and the output is unchanged: a cold tier too
  // small for the evicted pages drops the oldest (those pages are lost). (The check attends the cold pages
  // where they are read: the pool only has to hold the fork's newest token, one page per stream.)
  Request r = request(prompt, 20, compress::PolicyKind::KNorm);
  r.kv.recall.enabled = true;
  r.kv.recall.bring_back = false;
  r.kv.recall.exact = true;
  r.kv.recall.every = 4;
  EngineOptions eo;
  eo.kv_cold = "host:4K";
  SchedulerOptions so;
  so.prefix_cache = false;
  int64_t left = -1;
  const Outcome o = alone(r, eo, so, &left);
  EXPECT_GT(o.stats.compression.recall.exact_skipped, 0);
  EXPECT_EQ(o.stats.compression.recall.exact_checks + o.stats.compression.recall.exact_skipped, o.stats.compression.recall.checks);
  EXPECT_EQ(o.text, solo(request(prompt, 20, compress::PolicyKind::KNorm), false));
  EXPECT_EQ(left, 0);
}

// RecallConfig::exact_every: exact checks right after prefill and then every N decode steps, whatever the
// recall cadence; the output does not change.
TEST_F(SwapTest, TheExactCheckRunsAfterPrefillAndEveryNStepsOfItsOwn) {
  std::string prompt;
  for (int i = 0; i < 6; ++i) prompt += kPrompts[static_cast<size_t>(i)] + ". ";
  Request r = request(prompt, 40, compress::PolicyKind::KNorm);
  r.kv.budget = 40;
  r.kv.recall.enabled = true;
  r.kv.recall.bring_back = false;
  r.kv.recall.every = 4;
  r.kv.recall.exact = true;
  EngineOptions eo;
  eo.kv_cold = "host:64M";
  SchedulerOptions so;
  so.prefix_cache = false;
  const Outcome every_check = alone(r, eo, so);
  r.kv.recall.exact_every = 16;  // samples 0, 16, 32 of 40
  const Outcome own = alone(r, eo, so);
  r.kv.recall.exact_every = 1 << 20;  // after prefill only
  const Outcome once = alone(r, eo, so);
  EXPECT_EQ(every_check.stats.compression.recall.exact_checks, every_check.stats.compression.recall.checks);
  EXPECT_EQ(own.stats.compression.recall.exact_checks, 3);
  EXPECT_EQ(once.stats.compression.recall.exact_checks, 1);
  EXPECT_EQ(own.stats.compression.recall.checks, every_check.stats.compression.recall.checks);  // recall's own cadence
  EXPECT_EQ(own.text, every_check.text);
  EXPECT_EQ(once.text, every_check.text);
  // The first check of each is the same one (after prefill, the same KV): the same first total variation.
  EXPECT_EQ(once.stats.compression.recall.exact_tv_first, every_check.stats.compression.recall.exact_tv_first);
}

// The exact guard at its most sensitive (any change of the next-token distribution): the first check
// after the first compression event flags it (here the end-of-prefill check), the request falls back to
// full KV and every token since that event is computed again over every key — so every KV it holds was
// computed with full attention, and the greedy output is full KV's, bit for bit.
TEST_F(SwapTest, TheExactGuardFallsBackAtTheFirstChangedTokenAndGivesFullKvOutput) {
  std::string prompt;
  for (int i = 0; i < 16; ++i) prompt += kPrompts[static_cast<size_t>(i % 8)] + ". ";
  Request r = request(prompt, 60, compress::PolicyKind::KNorm);
  ASSERT_GT(r.prompt.size(), 100u);  // > budget + interval + a chunk: compresses during a chunked prefill
  r.kv.recall.enabled = true;
  r.kv.recall.bring_back = false;
  r.kv.recall.every = 1;
  r.kv.recall.exact = true;
  r.kv.recall.exact_guard = 1e-6f;
  EngineOptions eo;
  eo.kv_cold = "host:64M";
  eo.contexts = 2;
  SchedulerOptions so;
  so.prefix_cache = false;
  // The prompt compresses during prefill (chunks are clipped to the next event), so its later tokens were
  // computed with keys missing: the fallback computes them again (with only the newest token recomputed,
  // both runs below give other text). Default chunks, then chunks of 16.
  Outcome first;
  for (const int32_t chunk : {256, 16}) {
    SchedulerOptions opts = so;
    opts.step_tokens = chunk;
    int64_t used = -1;
    const Outcome o = alone(r, eo, opts, &used);
    const RequestStats& st = o.stats;
    EXPECT_GT(st.compression.evicted_slots, 0) << chunk;
    EXPECT_EQ(st.compression.recall.guard_fallbacks, 1) << chunk;
    EXPECT_EQ(st.compression.recall.exact_checks, 1) << chunk;  // none after the fallback
    EXPECT_EQ(o.text, alone(request(prompt, 60, compress::PolicyKind::Full), eo, opts).text) << chunk;
    EXPECT_EQ(used, 0) << chunk;
    if (chunk == 256) first = o;
  }
  EXPECT_EQ(first.stats.compression.recall.guard_fallbacks_incomplete, 0);
  EXPECT_EQ(first.stats.compression.recall.guard_fallbacks_refused, 0);
  // A pool with room for the compressed request but never for its whole KV: a fallback would fail the
  // request once it outgrew the pool, so the guard is refused (counted) and the request finishes
  // compressed, with the output it has without the guard, and every page returned.
  {
    EngineOptions small = eo;
    small.contexts = 1;
    small.kv_pages = kStreams * 8;  // the compressed peak (budget 40 + interval 16 = 4 pages) and the fork's page fit
    int64_t used = -1;
    const Outcome o = alone(r, small, so, &used);
    EXPECT_TRUE(o.finished);
    EXPECT_NE(o.finish, FinishReason::Error);
    EXPECT_EQ(o.stats.compression.recall.guard_fallbacks, 0);
    EXPECT_EQ(o.stats.compression.recall.guard_fallbacks_refused, 1);
    EXPECT_EQ(o.stats.compression.recall.exact_checks, 1) << "a refused guard stops checking (nothing left to act on)";
    Request unguarded = r;
    unguarded.kv.recall.exact_guard = 0;
    EXPECT_EQ(o.text, alone(unguarded, small, so).text);
    EXPECT_EQ(used, 0);
  }
  // Off (0), the same request keeps compressing and its output is the compressed one.
  r.kv.recall.exact_guard = 0;
  const Outcome off = alone(r, eo, so);
  EXPECT_EQ(off.stats.compression.recall.guard_fallbacks, 0);
  Request plain = r;
  plain.kv.recall = compress::RecallConfig{};
  EXPECT_EQ(off.text, solo(plain, false));
  EXPECT_NE(off.text, first.text) << "compression should change this output (else the test shows nothing)";
}

TEST_F(SwapTest, AFullTierFallsBackToRecomputeAndLosesNothing) {
  // Room for a few pages only: most swap-outs fail and recompute instead (full KV recomputes exactly).
  Engine engine(*model_, tight_engine("host:" + std::to_string(8 * 1088)));
  Scheduler sched(engine, busy_scheduler(false));
  std::map<uint64_t, Outcome> out;
  const std::map<uint64_t, std::string> want = submit_all_full(sched, out);
  run(sched, out);
  for (const auto& [id, o] : out) EXPECT_EQ(o.text, want.at(id));
  const auto m = sched.metrics();
  EXPECT_GT(m.cold.swap_out_failures, 0);
  EXPECT_GT(m.recomputes, 0);
  EXPECT_EQ(engine.kv().pool().used_pages(), 0);
}

TEST_F(SwapTest, ACorruptedColdFileIsAMissAndARecomputeNeverWrongTokens) {
  TempDir dir;
  Engine engine(*model_, tight_engine("dir:" + dir.path + ":64M"));
  Scheduler sched(engine, busy_scheduler(false));
  std::map<uint64_t, Outcome> out;
  const std::map<uint64_t, std::string> want = submit_all_full(sched, out);
  auto* tier = dynamic_cast<kv::FileColdTier*>(engine.kv().cold_tier());
  ASSERT_NE(tier, nullptr);
  bool corrupted = false;
  for (int i = 0; i < 100000; ++i) {
    bool all = true;
    for (const auto& [id, o] : out) all &= o.finished;
    if (all) break;
    sched.step();
    ASSERT_EQ(sched.check_invariants(), "");
    if (!corrupted && tier->stats().records > 0) {  // something is swapped out: flip bytes of every slot
      tier->flush();
      const int fd = ::open(tier->data_path().c_str(), O_RDWR);
      ASSERT_GE(fd, 0);
      const std::string junk(64, '\x5a');
      for (int64_t s = 0; s < tier->capacity_slots(); ++s)
        ASSERT_EQ(::pwrite(fd, junk.data(), junk.size(), static_cast<off_t>(s * tier->slot_bytes() + 100)), 64);
      ::close(fd);
      corrupted = true;
    }
  }
  ASSERT_TRUE(corrupted);
  for (const auto& [id, o] : out) EXPECT_EQ(o.text, want.at(id));
  const auto m = sched.metrics();
  EXPECT_GT(m.cold.swap_in_misses, 0);
  EXPECT_GT(m.cold.tier.checksum_failures, 0u);
  EXPECT_EQ(engine.kv().pool().used_pages(), 0);
}

TEST_F(SwapTest, ASpilledPrefixComesBackFromTheColdTier) {
  TempDir dir;
  std::string doc;
  for (int i = 0; i < 12; ++i) doc += kPrompts[static_cast<size_t>(i % 8)] + ". ";
  for (const bool with_tier : {true, false}) {
    EngineOptions eo;
    eo.kv_pages = kStreams * 24;
    if (with_tier) eo.kv_cold = "dir:" + dir.path + ":64M";
    Engine engine(*model_, eo);
    SchedulerOptions so;
    so.max_running = 1;
    Scheduler sched(engine, so);
    std::map<uint64_t, Outcome> out;
    const Request first = request(doc + "The end.", 8, compress::PolicyKind::Full);
    submit(sched, first, out);
    run(sched, out);
    // Other traffic takes every page: the document's cached-free blocks are reused (spilled).
    for (const auto& p : kPrompts) submit(sched, request(p + " and then", 200, compress::PolicyKind::Full), out);
    run(sched, out);
    const Request again = request(doc + "The end. Again", 8, compress::PolicyKind::Full);
    const uint64_t id = submit(sched, again, out);
    run(sched, out);
    EXPECT_EQ(out[id].text, solo(again));
    const auto m = sched.metrics();
    if (with_tier) {
      EXPECT_GT(m.prefix.blocks_spilled, 0);
      EXPECT_GT(out[id].stats.cached_tokens_cold, 0);
      EXPECT_GT(m.prefix.tokens_hit_cold, 0);
    } else {
      EXPECT_EQ(out[id].stats.cached_tokens, 0);  // nothing left hot: recomputed
    }
  }
}

TEST_F(SwapTest, RandomSchedulesKeepInvariantsAndSoloOutputs) {
  TempDir dir;
  std::mt19937 rng(20261201);
  using P = compress::PolicyKind;
  const P policies[] = {P::Full, P::Streaming, P::KNorm, P::TriAttention, P::SnapKV, P::RKV, P::TOVA, P::H2O};
  std::map<std::string, std::string> solo_cache;
  int64_t swaps = 0, recomputes = 0, hits = 0;
  for (int round = 0; round < 30; ++round) {
    const P pol = policies[rng() % 8];
    const int tier = static_cast<int>(rng() % 3);  // none, host, dir
    const std::string cold = tier == 0 ? "" : tier == 1 ? "host:32M" : "dir:" + dir.path + ":32M";
    EngineOptions eo;
    eo.kv_pages = kStreams * (10 + static_cast<int64_t>(rng() % 30));
    eo.kv_cold = cold;
    Engine engine(*model_, eo);
    engine.set_calibration(*calib_);
    const bool cache = rng() % 2 == 0;
    SchedulerOptions so = busy_scheduler(cache);
    so.max_running = 1 + static_cast<int32_t>(rng() % 8);
    so.step_tokens = 8 + static_cast<int32_t>(rng() % 56);
    so.preempt = static_cast<PreemptPolicy>(rng() % 3);
    Scheduler sched(engine, so);
    std::map<uint64_t, Outcome> out;
    std::map<uint64_t, std::string> key_of;
    const int n = 3 + static_cast<int>(rng() % 6);
    for (int i = 0; i < n; ++i) {
      const std::string p = "A long time ago. " + kPrompts[rng() % kPrompts.size()];
      const int32_t len = 40 + static_cast<int32_t>(rng() % 100);
      Request r = request(p, len, pol);
      r.priority = static_cast<int32_t>(rng() % 3);
      const std::string key = p + "|" + std::to_string(len) + "|" + compress::policy_name(pol) + (cache ? "|cache" : "");
      if (!solo_cache.count(key)) solo_cache[key] = solo(r, cache);
      key_of[submit(sched, r, out)] = key;
    }
    run(sched, out);
    const std::string what = std::string(compress::policy_name(pol)) + " tier '" + cold + "' pages " + std::to_string(eo.kv_pages);
    for (const auto& [id, o] : out) {
      EXPECT_NE(o.finish, FinishReason::Error) << what;
      // Equal to the solo run whenever the KV was never recomputed (or is recomputed exactly: full KV).
      if (o.stats.recomputes == 0 || pol == P::Full) {
        EXPECT_EQ(o.text, solo_cache[key_of[id]]) << what;
      }
      if (!cold.empty()) {
        EXPECT_EQ(o.stats.recomputes, 0) << what;
      }
      swaps += o.stats.swap_outs;
      recomputes += o.stats.recomputes;
      hits += o.stats.cached_tokens > 0;
    }
    EXPECT_EQ(engine.kv().pool().used_pages(), 0) << what;
  }
  // The mix really preempted both ways and hit the prefix cache.
  EXPECT_GT(swaps, 20);
  EXPECT_GT(recomputes, 5);
  EXPECT_GT(hits, 5);
}
