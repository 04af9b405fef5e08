// Budget splits (pyramid, Ada-KV) and prompt protection.
#include <gtest/gtest.h>

#include "compress/selection.h"  // pyramid_budgets only (checked against hand-computed values)
#include "compress_test_refs.h"

using namespace kvpack;
using namespace kvpack::compress;
using namespace kvpack::compress_test;

// ===================================================================================================
// Budget splits

TEST(CompressSplits, PyramidBudgetsMatchHandComputedSchedule) {
  // policies.md §1.6 with base = budget, T = n, β = 20:
  //   min = base/β, max = 2·base − min; if max ≥ T − w: max = T − w, min = 2·base − max;
  //   unless T ≥ max ≥ min ≥ w → uniform; else budget_l = round(max − l·(max − min)/(L − 1)).
  // (100, 4 layers, T 228, w 2): min 5, max 195 → 195, 131.67, 68.33, 5.
  EXPECT_EQ(pyramid_budgets(100, 4, 228, 2), (std::vector<int32_t>{195, 132, 68, 5}));
  // (60, 4, 188, 3): min 3, max 117, step 38.
  EXPECT_EQ(pyramid_budgets(60, 4, 188, 3), (std::vector<int32_t>{117, 79, 41, 3}));
  // (100, 3, 150, 8): max 195 ≥ 142 → max 142, min 58.
  EXPECT_EQ(pyramid_budgets(100, 3, 150, 8), (std::vector<int32_t>{142, 100, 58}));
  // (40, 4, 64, 2): max 78 ≥ 62 → max 62, min 18; step 14.67 → 62, 47.33, 32.67, 18.
  EXPECT_EQ(pyramid_budgets(40, 4, 64, 2), (std::vector<int32_t>{62, 47, 33, 18}));
  // (40, 2, 64, 2): max 62, min 18.
  EXPECT_EQ(pyramid_budgets(40, 2, 64, 2), (std::vector<int32_t>{62, 18}));
  // Fallbacks to uniform: min = 3.2 < w = 4; and capped max 30 < min 50.
  EXPECT_EQ(pyramid_budgets(64, 4, 192, 4), (std::vector<int32_t>{64, 64, 64, 64}));
  EXPECT_EQ(pyramid_budgets(40, 2, 60, 30), (std::vector<int32_t>{40, 40}));
  // One layer: nothing to spread.
  EXPECT_EQ(pyramid_budgets(40, 1, 64, 2), (std::vector<int32_t>{40}));
}

TEST(CompressSplits, PyramidPerLayerKeepCounts) {
  for (int32_t layers : {2, 4}) {
    const ModelConfig mc = tiny_model(true, layers);
    kv::PagePool pool(pool_config());
    Seq seq(pool, mc, 300 + layers);
    CompressConfig cfg = make_cfg(PolicyKind::KNorm, 40, 2, -1, 24);
    cfg.split = BudgetSplit::Pyramid;
    ASSERT_EQ(cfg.effective_window(), 2);
    SequenceCompressor comp(cfg, mc, nullptr, 0);
    const std::vector<int32_t> per_layer =
        layers == 2 ? std::vector<int32_t>{62, 18} : std::vector<int32_t>{62, 47, 33, 18};
    std::vector<int32_t> budgets;
    for (int32_t l = 0; l < layers; ++l)
      for (int32_t h = 0; h < mc.n_head_kv; ++h) budgets.push_back(per_layer[static_cast<size_t>(l)]);
    // Decode one token at a time: the first event comes exactly at budget + interval = 64 slots.
    ASSERT_TRUE(seq.append(1));
    int events = 0;
    for (int step = 0; step < 200 && events < 3; ++step) {
      Snapshot sn = snapshot(seq);
      const CompressionStats before = comp.stats();
      if (comp.after_forward(seq.kv(), step == 0)) {
        ++events;
        if (events == 1) {
          EXPECT_EQ(sn.pos[0].size(), 64u);
        }
        EXPECT_GE(sn.total_slots, static_cast<int64_t>(mc.n_layer) * mc.n_head_kv * 64);
        EXPECT_TRUE(seq.check_content());
        expect_stats(seq, sn, before, comp.stats());
        expect_keep_sets(seq, sn, ref_knorm(sn), budgets, cfg, 0, 0.0, "pyramid event " + std::to_string(events));
        for (int32_t s = 0; s < seq.kv().n_streams(); ++s)
          EXPECT_EQ(seq.kv().n_slots(s), std::min<int32_t>(budgets[static_cast<size_t>(s)], static_cast<int32_t>(sn.pos[static_cast<size_t>(s)].size())))
              << "layer " << s / mc.n_head_kv;
      } else {
        EXPECT_LT(sn.total_slots, static_cast<int64_t>(mc.n_layer) * mc.n_head_kv * 64);
      }
      ASSERT_TRUE(seq.append(1));
    }
    EXPECT_EQ(events, 3);
  }
}

TEST(CompressSplits, PyramidTriAttentionSelectsPerStream) {
  // With a non-uniform split layers hold different counts, so TriAttention's per-layer scores are
  // used per stream (no mean over layers).
  const ModelConfig mc = tiny_model(false);
  const QueryStats qs = make_stats(mc, 401);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 402);
  CompressConfig cfg = make_cfg(PolicyKind::TriAttention, 40, 2, 2, 24);
  cfg.split = BudgetSplit::Pyramid;
  SequenceCompressor comp(cfg, mc, &qs, 0);
  ASSERT_TRUE(seq.append(64));
  Snapshot sn = snapshot(seq);
  compress_and_check(comp, seq, sn);
  std::vector<int32_t> budgets = {62, 62, 18, 18};
  expect_keep_sets(seq, sn, ref_triattention(mc, qs, sn, sn.next_pos, false), budgets, cfg, 0, 1e-4, "pyramid triattention");
}

namespace {
// Checks one layer of an Ada event against ref_ada and the stated properties.
void expect_ada_layer(Seq& seq, const Snapshot& sn, const ModelConfig& mc, const CompressConfig& cfg, int32_t layer,
                      const std::vector<std::vector<double>>& score, const std::string& what) {
  std::vector<std::vector<double>> sc;
  std::vector<std::vector<bool>> prot;
  int64_t candidates = 0, protected_total = 0;
  for (int32_t h = 0; h < mc.n_head_kv; ++h) {
    const size_t s = static_cast<size_t>(layer * mc.n_head_kv + h);
    sc.push_back(score[s]);
    prot.push_back(protect_mask(sn.pos[s], cfg.sinks, cfg.effective_window(), 0));
    candidates += static_cast<int64_t>(sn.pos[s].size());
    for (bool b : prot.back()) protected_total += b;
  }
  const auto want = ref_ada(sc, prot, cfg.budget);
  int64_t kept_total = 0;
  const int32_t n_safe = std::max(1, static_cast<int32_t>(0.2 * cfg.budget));
  for (int32_t h = 0; h < mc.n_head_kv; ++h) {
    const int32_t s = layer * mc.n_head_kv + h;
    const auto got = kept_slots(seq, sn, s);
    kept_total += static_cast<int64_t>(got.size());
    EXPECT_EQ(got, want[static_cast<size_t>(h)]) << what << ": layer " << layer << " head " << h;
    // Its protected slots plus at least its own n_safe best.
    std::vector<int32_t> own = ref_topk(sc[static_cast<size_t>(h)], prot[static_cast<size_t>(h)],
                                        static_cast<int32_t>(std::count(prot[static_cast<size_t>(h)].begin(), prot[static_cast<size_t>(h)].end(), true)) + n_safe);
    for (int32_t j : own)
      EXPECT_TRUE(std::binary_search(got.begin(), got.end(), j)) << what << ": layer " << layer << " head " << h << " lost own-best/protected slot " << j;
  }
  EXPECT_EQ(kept_total, std::min<int64_t>(candidates, std::max<int64_t>(protected_total, static_cast<int64_t>(mc.n_head_kv) * cfg.budget)))
      << what << ": layer " << layer << " kept total";
}
}  // namespace

TEST(CompressSplits, AdaSplitSingleEvent) {
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 500);
  seq.set_head_scale(1, 1.6);  // head 1 has larger keys: KNorm prefers head 0's, head 1 lives on its safeguard
  CompressConfig cfg = make_cfg(PolicyKind::KNorm, 20, 2, 2);
  cfg.split = BudgetSplit::Ada;
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  ASSERT_TRUE(seq.append(44));
  Snapshot sn = snapshot(seq);
  compress_and_check(comp, seq, sn);
  const auto score = ref_knorm(sn);
  for (int32_t l = 0; l < mc.n_layer; ++l) expect_ada_layer(seq, sn, mc, cfg, l, score, "ada event 1");
  // Ada really moved budget between heads here (otherwise this test would prove little).
  EXPECT_NE(seq.kv().n_slots(0), seq.kv().n_slots(1));
}

TEST(CompressSplits, AdaSplitWithSnapKVScores) {
  const ModelConfig mc = tiny_model(false);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 510);
  Queries qf(mc, 511);
  CompressConfig cfg = make_cfg(PolicyKind::SnapKV, 20, 2, -1);
  cfg.split = BudgetSplit::Ada;
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  ASSERT_TRUE(seq.append(50));
  qf.feed(comp, 10);
  Snapshot sn = snapshot(seq);
  compress_and_check(comp, seq, sn);
  const auto score = ref_window_streams(mc, qf, sn, false);
  // (Max-pooling makes exact ties between neighbours; both sides break them towards the newer slot.)
  for (int32_t l = 0; l < mc.n_layer; ++l) expect_ada_layer(seq, sn, mc, cfg, l, score, "ada+snapkv");
}

// Regression (an earlier engine version: compressor.cpp compress(), the `if (!same)` branch of the Ada split,
// lines ~282-291): after one Ada event the KV heads of a layer hold different slot counts, so the
// next event does not pool them at all; every head falls back to select_keep with the uniform
// `budget`. The layer then is not re-balanced (heads keep their own top `budget`, no global top),
// and a head that had fewer than budget − interval slots keeps everything while its neighbour is
// cut to `budget`, leaving the layer below n_kv_heads × budget although candidates remain. Ada is
// thus only applied on every other event.
TEST(CompressSplits, AdaSplitRepeatedEvents) {
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 520);
  seq.set_head_scale(1, 1.6);
  CompressConfig cfg = make_cfg(PolicyKind::KNorm, 20, 2, 2, 6);
  cfg.split = BudgetSplit::Ada;
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  ASSERT_TRUE(seq.append(44));
  for (int event = 1; event <= 3; ++event) {
    Snapshot sn = snapshot(seq);
    compress_and_check(comp, seq, sn);
    const auto score = ref_knorm(sn);
    for (int32_t l = 0; l < mc.n_layer; ++l) expect_ada_layer(seq, sn, mc, cfg, l, score, "ada event " + std::to_string(event));
    ASSERT_TRUE(seq.append(6));
  }
}

// ===================================================================================================
// Protection, counts, every policy

TEST(CompressSplits, ProtectPromptNeverEvictsPromptPositions) {
  const ModelConfig mc = tiny_model(true);
  for (PolicyKind p : {PolicyKind::KNorm, PolicyKind::Streaming}) {
    kv::PagePool pool(pool_config());
    Seq seq(pool, mc, 600);
    CompressConfig cfg = make_cfg(p, 16, 2, 1);
    cfg.protect_prompt = true;
    const int32_t prompt = 10;
    SequenceCompressor comp(cfg, mc, nullptr, prompt);
    ASSERT_TRUE(seq.append(40));
    for (int round = 0; round < 3; ++round) {
      Snapshot sn = snapshot(seq);
      compress_and_check(comp, seq, sn);
      const auto score = p == PolicyKind::KNorm ? ref_knorm(sn) : ref_recency(sn);
      expect_keep_sets(seq, sn, score, uniform_budgets(mc, 16), cfg, prompt, 0.0, "protect prompt");
      for (int32_t s = 0; s < seq.kv().n_streams(); ++s) {
        const auto pos = seq.positions(s);
        ASSERT_GE(pos.size(), static_cast<size_t>(prompt));
        for (int32_t i = 0; i < prompt; ++i) EXPECT_EQ(pos[static_cast<size_t>(i)], i);
        EXPECT_EQ(seq.kv().n_slots(s), 16);
      }
      ASSERT_TRUE(seq.append(9));
    }
  }
  // Protection larger than the budget: everything protected stays (count = protected slots).
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 601);
  CompressConfig cfg = make_cfg(PolicyKind::KNorm, 16, 2, 3);
  cfg.protect_prompt = true;
  SequenceCompressor comp(cfg, mc, nullptr, 20);
  ASSERT_TRUE(seq.append(35));
  Snapshot sn = snapshot(seq);
  compress_and_check(comp, seq, sn);
  std::vector<int32_t> want;
  for (int32_t p = 0; p < 20; ++p) want.push_back(p);
  for (int32_t p = 32; p < 35; ++p) want.push_back(p);
  for (int32_t s = 0; s < seq.kv().n_streams(); ++s) EXPECT_EQ(seq.positions(s), want);
}
