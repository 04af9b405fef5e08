// Event mechanics: protection and counts for every policy, the schedule as the compressor applies it,
// key-mass buffers, shared prefix pages, disabled compression.
#include <gtest/gtest.h>

#include "compress_test_refs.h"

using namespace kvpack;
using namespace kvpack::compress;
using namespace kvpack::compress_test;


class EveryPolicyTest : public ::testing::TestWithParam<PolicyKind> {};

TEST_P(EveryPolicyTest, SinksWindowOrderCountsAndStats) {
  const PolicyKind p = GetParam();
  const ModelConfig mc = tiny_model(true);
  const QueryStats qs = make_stats(mc, 700);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 701 + static_cast<uint32_t>(p));
  Queries qf(mc, 702);
  const int32_t sinks = 3, window = 5, budget = 17;
  const CompressConfig cfg = make_cfg(p, budget, sinks, window, 10);
  SequenceCompressor comp(cfg, mc, &qs, 0);
  const PreparedAppend item = prepared_append(comp, seq, 40);
  ASSERT_TRUE(item.ok);
  if (item.key_mass != nullptr)
    for (int32_t s = 0; s < seq.kv().n_streams(); ++s)
      for (int32_t j = 0; j < 40; ++j) item.key_mass[static_cast<size_t>(s) * item.key_mass_stride + j] = static_cast<float>((j * 7919 + s * 31) % 97);
  qf.feed(comp, 40);
  for (int round = 0; round < 3; ++round) {
    Snapshot sn = snapshot(seq);
    compress_and_check(comp, seq, sn);
    for (int32_t s = 0; s < seq.kv().n_streams(); ++s) {
      const auto got = kept_slots(seq, sn, s);
      const auto n = static_cast<int32_t>(sn.pos[static_cast<size_t>(s)].size());
      ASSERT_EQ(static_cast<int32_t>(got.size()), budget) << "stream " << s;
      for (int32_t j = 0; j < sinks; ++j) EXPECT_EQ(got[static_cast<size_t>(j)], j) << "sink " << j << " stream " << s;
      for (int32_t j = 0; j < window; ++j)
        EXPECT_EQ(got[static_cast<size_t>(budget - window + j)], n - window + j) << "window slot, stream " << s;
      for (size_t i = 1; i < got.size(); ++i) EXPECT_LT(got[i - 1], got[i]);
    }
    for (int i = 0; i < 6 + round; ++i) {
      ASSERT_TRUE(prepared_append(comp, seq, 1).ok);
      qf.feed(comp, 1);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, EveryPolicyTest,
                         ::testing::Values(PolicyKind::Streaming, PolicyKind::KNorm, PolicyKind::TriAttention, PolicyKind::SnapKV,
                                           PolicyKind::RKV, PolicyKind::TOVA, PolicyKind::H2O),
                         [](const ::testing::TestParamInfo<PolicyKind>& i) { return std::string(policy_name(i.param)); });

// ===================================================================================================
// Schedule

TEST(CompressEvents, AfterForwardTriggersExactlyAtBudgetPlusInterval) {
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 800);
  const int32_t budget = 12, interval = 8;
  const CompressConfig cfg = make_cfg(PolicyKind::Streaming, budget, 4, 0, interval);
  SequenceCompressor comp(cfg, mc, nullptr, 5);
  const int64_t streams = mc.n_layer * mc.n_head_kv;
  ASSERT_TRUE(seq.append(5));
  EXPECT_FALSE(comp.after_forward(seq.kv(), true));  // short prompt: nothing to cut
  int events = 0;
  for (int step = 0; step < 60; ++step) {
    ASSERT_TRUE(seq.append(1));
    const int64_t total = seq.kv().total_slots();
    Snapshot sn = snapshot(seq);
    const bool did = comp.after_forward(seq.kv(), false);
    EXPECT_EQ(did, total >= streams * (budget + interval)) << "step " << step << " total " << total;
    if (did) {
      ++events;
      EXPECT_EQ(total, streams * (budget + interval));  // one token per step: exactly at the threshold
      EXPECT_EQ(seq.kv().total_slots(), streams * budget);
      std::vector<int32_t> want = {0, 1, 2, 3};
      for (int64_t p = sn.next_pos - (budget - 4); p < sn.next_pos; ++p) want.push_back(static_cast<int32_t>(p));
      for (int32_t s = 0; s < seq.kv().n_streams(); ++s) EXPECT_EQ(seq.positions(s), want);
    }
  }
  EXPECT_EQ(events, (5 + 60 - budget) / interval);
  EXPECT_EQ(comp.stats().events, events);
}

TEST(CompressEvents, CompressPrefillCutsLongPrompts) {
  const ModelConfig mc = tiny_model(true);
  const int64_t streams = mc.n_layer * mc.n_head_kv;
  for (bool prefill_cut : {true, false}) {
    kv::PagePool pool(pool_config());
    Seq seq(pool, mc, 810);
    CompressConfig cfg = make_cfg(PolicyKind::KNorm, 12, 2, 1, 8);
    cfg.compress_prefill = prefill_cut;
    SequenceCompressor comp(cfg, mc, nullptr, 15);
    ASSERT_TRUE(seq.append(10));  // first prefill chunk: not done yet, under budget + interval
    EXPECT_FALSE(comp.after_forward(seq.kv(), false));
    ASSERT_TRUE(seq.append(5));   // last chunk: 15 > budget
    Snapshot sn = snapshot(seq);
    EXPECT_EQ(comp.after_forward(seq.kv(), true), prefill_cut);
    EXPECT_EQ(seq.kv().total_slots(), prefill_cut ? streams * 12 : streams * 15);
    if (prefill_cut) expect_keep_sets(seq, sn, ref_knorm(sn), uniform_budgets(mc, 12), cfg, 0, 0.0, "prefill cut");
    // Decode: the next event at budget + interval = 20 slots either way.
    int steps = 0;
    while (!comp.after_forward(seq.kv(), false)) {
      ASSERT_TRUE(seq.append(1));
      ++steps;
      ASSERT_LT(steps, 100);
    }
    EXPECT_EQ(steps, prefill_cut ? 8 : 5);
  }
  // A prompt that ends exactly at the budget is not compressed.
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 811);
  SequenceCompressor comp(make_cfg(PolicyKind::KNorm, 12, 2, 1, 8), mc, nullptr, 12);
  ASSERT_TRUE(seq.append(12));
  EXPECT_FALSE(comp.after_forward(seq.kv(), true));
}

TEST(CompressEvents, BudgetAtLeastSlotCountNeverEvicts) {
  const ModelConfig mc = tiny_model(true);
  // (H2O: see H2OBudgetAtLeastSlotCountNeverEvicts.)
  for (PolicyKind p : {PolicyKind::Streaming, PolicyKind::KNorm, PolicyKind::TriAttention, PolicyKind::SnapKV, PolicyKind::RKV,
                       PolicyKind::TOVA}) {
    // (Pyramid is left out on purpose: its per-layer budgets go below the mean budget.)
    for (BudgetSplit split : {BudgetSplit::Uniform, BudgetSplit::Ada}) {
      kv::PagePool pool(pool_config());
      Seq seq(pool, mc, 820);
      Queries qf(mc, 821);
      const QueryStats qs = make_stats(mc, 822);
      CompressConfig cfg = make_cfg(p, 40, 4, -1, 16);
      cfg.split = split;
      SequenceCompressor comp(cfg, mc, &qs, 0);
      const PreparedAppend item = prepared_append(comp, seq, 40);
      ASSERT_TRUE(item.ok);
      qf.feed(comp, 8);
      Snapshot sn = snapshot(seq);
      EXPECT_FALSE(comp.after_forward(seq.kv(), true)) << policy_name(p);
      comp.compress(seq.kv());
      for (int32_t s = 0; s < seq.kv().n_streams(); ++s) EXPECT_EQ(seq.positions(s), sn.pos[static_cast<size_t>(s)]) << policy_name(p) << " " << split_name(split);
      EXPECT_EQ(comp.stats().evicted_slots, 0);
      EXPECT_EQ(comp.stats().freed_pages, 0);
      EXPECT_EQ(pool.used_pages(), sn.used_pages);
      EXPECT_TRUE(seq.check_content());
    }
  }
}

TEST(CompressEvents, H2OBudgetAtLeastSlotCountNeverEvicts) {
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 825);
  SequenceCompressor comp(make_cfg(PolicyKind::H2O, 40, 4, -1, 16), mc, nullptr, 0);
  const PreparedAppend item = prepared_append(comp, seq, 40);
  ASSERT_TRUE(item.ok);
  Snapshot sn = snapshot(seq);
  EXPECT_FALSE(comp.after_forward(seq.kv(), true));
  comp.compress(seq.kv());
  for (int32_t s = 0; s < seq.kv().n_streams(); ++s) EXPECT_EQ(seq.positions(s), sn.pos[static_cast<size_t>(s)]);
  EXPECT_EQ(comp.stats().evicted_slots, 0);
  EXPECT_EQ(pool.used_pages(), sn.used_pages);
}

// Regression: the first prepare() grows an empty buffer; copying "0 bytes from nullptr" is undefined
// behaviour that the sanitizer build aborts on (fixed in compressor.cpp by skipping the copy).
TEST(CompressEvents, H2OFirstPrepareIsDefined) {
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  kv::SequenceKv kv(pool, mc.n_layer, mc.n_head_kv);
  SequenceCompressor comp(make_cfg(PolicyKind::H2O, 16, 4, -1), mc, nullptr, 0);
  std::vector<int32_t> toks(5, 1);
  BatchItem item;
  item.tokens = toks;
  comp.prepare(kv, item);
  ASSERT_NE(item.key_mass, nullptr);
  EXPECT_GE(item.key_mass_stride, 5);
  for (int64_t i = 0; i < item.key_mass_stride * kv.n_streams(); ++i) ASSERT_EQ(item.key_mass[i], 0.0f);
}

// TOVA scores a layer once and gives every KV head the same row; under Ada the heads of a layer then
// tie everywhere, take equal shares and must keep sharing one set (policies.md §1.4) across events.
TEST(CompressEvents, TovaWithAdaKeepsOneSetPerLayer) {
  const ModelConfig mc = tiny_model(true, 2, 6, 3);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 840);
  Queries qf(mc, 841);
  CompressConfig cfg = make_cfg(PolicyKind::TOVA, 21, 2, -1, 8);
  cfg.split = BudgetSplit::Ada;
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  ASSERT_TRUE(seq.append(40));
  qf.feed(comp, 40);
  for (int event = 1; event <= 4; ++event) {
    Snapshot sn = snapshot(seq);
    compress_and_check(comp, seq, sn);
    const auto ref = ref_tova(mc, qf, sn);
    for (int32_t l = 0; l < mc.n_layer; ++l) {
      for (int32_t h = 1; h < mc.n_head_kv; ++h)
        ASSERT_EQ(seq.positions(seq.kv().stream_index(l, h)), seq.positions(seq.kv().stream_index(l, 0))) << "event " << event << " layer " << l;
      EXPECT_EQ(seq.kv().n_slots(seq.kv().stream_index(l, 0)), 21);
    }
    expect_keep_sets(seq, sn, ref, uniform_budgets(mc, 21), cfg, 0, 1e-7, "tova+ada event " + std::to_string(event));
    ASSERT_TRUE(decode_steps(seq, qf, comp, 8));
  }
}

// ===================================================================================================
// Prefix sharing: leading pages shared with another sequence are protected (read-only) and never
// written; once the other owner is gone they compete again.

// The scheduler tells the compressor how far the prefix-cache blocks reach (set_protected_prefix): those
// slots act as sinks and their shared pages stay untouched (copy on write is tested in kv_page_pool_test).
TEST(CompressEvents, SharedPrefixPagesAreProtectedAndUntouched) {
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  Seq a(pool, mc, 950), b(pool, mc, 951);
  ASSERT_TRUE(a.append(8));
  b.attach_shared_from(a, 0);
  b.attach_shared_from(a, 1);
  ASSERT_TRUE(b.append(30));
  const CompressConfig cfg = make_cfg(PolicyKind::KNorm, 16, 2, 1);
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  comp.set_protected_prefix(8);  // the two attached blocks
  Snapshot sn = snapshot(b);
  const CompressionStats before = comp.stats();
  comp.compress(b.kv());
  EXPECT_TRUE(a.check_content());
  EXPECT_TRUE(b.check_content());
  EXPECT_EQ(check_pool(pool, {&a.kv(), &b.kv()}), "");
  expect_stats(b, sn, before, comp.stats());
  CompressConfig shared_cfg = cfg;
  shared_cfg.sinks = 8;  // the two shared pages act as sinks
  expect_keep_sets(b, sn, ref_knorm(sn), uniform_budgets(mc, 16), shared_cfg, 0, 0.0, "shared prefix");
  for (int32_t s = 0; s < b.kv().n_streams(); ++s) {
    EXPECT_EQ(b.kv().block_page(s, 0), a.kv().block_page(s, 0));
    EXPECT_EQ(b.kv().block_page(s, 1), a.kv().block_page(s, 1));
  }
  // The other owner finishes and the prefix is no longer protected: its slots compete like any other.
  a.clear();
  comp.set_protected_prefix(0);
  ASSERT_TRUE(b.append(10));
  sn = snapshot(b);
  compress_and_check(comp, b, sn);
  expect_keep_sets(b, sn, ref_knorm(sn), uniform_budgets(mc, 16), cfg, 0, 0.0, "prefix not protected");
}

TEST(CompressEvents, DisabledCompressionDoesNothing) {
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 830);
  for (const CompressConfig& cfg : {make_cfg(PolicyKind::Full, 8, 4, -1), make_cfg(PolicyKind::KNorm, 0, 4, -1)}) {
    SequenceCompressor comp(cfg, mc, nullptr, 0);
    ASSERT_TRUE(seq.append(50));
    EXPECT_FALSE(comp.after_forward(seq.kv(), true));
    comp.compress(seq.kv());
    EXPECT_EQ(seq.kv().n_slots(0), seq.kv().next_pos());
    EXPECT_EQ(comp.stats().events, 0);
  }
}

