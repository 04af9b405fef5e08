// Naive eviction (the --kv-naive demonstration) as bookkeeping: the cache is compacted as usual, and
// NaiveLayout reports the pages a non-compacting allocator would still hold. Checked on hand-computed
// layouts, and through the compressor against an independent replay of the hole layout (every
// original slot stays in its page; a page without a survivor is freed; new slots fill the last page).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "compress/naive_layout.h"
#include "compress_test_refs.h"

using namespace kvpack;
using namespace kvpack::compress;
using namespace kvpack::compress_test;

TEST(CompressNaive, LayoutFreesOnlyPagesWithoutSurvivors) {
  NaiveLayout lay(1, 4);
  lay.sync(0, 10);  // pages [4, 4, 2 slots], all live
  EXPECT_EQ(lay.pages(0, 10), 3);
  EXPECT_EQ(lay.evict(0, std::vector<int32_t>{0, 5, 9}), 0);  // one survivor in each page
  EXPECT_EQ(lay.pages(0, 3), 3);
  lay.sync(0, 5);  // two new slots fill the last page (2 -> 4 slots)
  EXPECT_EQ(lay.pages(0, 5), 3);
  EXPECT_EQ(lay.pages(0, 6), 4);  // a third one would open a page
  // Live slots 0 | 1 | 2 3 4 by page: keeping {2, 3, 4} empties the first two pages.
  EXPECT_EQ(lay.evict(0, std::vector<int32_t>{2, 3, 4}), 2);
  EXPECT_EQ(lay.pages(0, 3), 1);  // the full last page (1 hole, 3 live) remains
  lay.sync(0, 4);                 // ... so the next slot opens a new page
  EXPECT_EQ(lay.pages(0, 4), 2);
}

TEST(CompressNaive, LayoutRemovesALastPartialPageAndKeepsTheRestFull) {
  NaiveLayout lay(2, 4);
  lay.sync(1, 6);  // pages [4, 2]
  EXPECT_EQ(lay.evict(1, std::vector<int32_t>{0, 1}), 1);  // the partial last page goes
  EXPECT_EQ(lay.pages(1, 2), 1);
  lay.sync(1, 3);  // the first page is full (2 live, 2 holes): the new slot opens a page
  EXPECT_EQ(lay.pages(1, 3), 2);
  lay.sync(1, 2);  // a rolled-back append gives that page back
  EXPECT_EQ(lay.pages(1, 2), 1);
  EXPECT_EQ(lay.pages(0, 0), 0);  // the other stream is untouched
}

namespace {

// The hole layout of one stream, replayed from positions: virtual pages of original positions.
struct HoleReplay {
  std::vector<std::vector<int32_t>> pages;
  void append(std::span<const int32_t> positions) {
    for (int32_t p : positions) {
      if (pages.empty() || static_cast<int32_t>(pages.back().size()) == kPageSize) pages.emplace_back();
      pages.back().push_back(p);
    }
  }
  // Frees the pages none of whose positions survived; returns how many.
  int64_t evict(const std::vector<int32_t>& live) {
    const std::set<int32_t> alive(live.begin(), live.end());
    const size_t before = pages.size();
    std::erase_if(pages, [&](const std::vector<int32_t>& pg) {
      return std::none_of(pg.begin(), pg.end(), [&](int32_t p) { return alive.count(p) > 0; });
    });
    return static_cast<int64_t>(before - pages.size());
  }
};

}  // namespace

TEST(CompressNaive, CompressorReportsTheHoleLayoutAndCompactsLikeNormalMode) {
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config()), pool_ref(pool_config());
  Seq seq(pool, mc, 960), plain(pool_ref, mc, 960);  // same seed: same keys
  CompressConfig cfg = make_cfg(PolicyKind::KNorm, 12, 2, 1, 8);
  SequenceCompressor comp_plain(cfg, mc, nullptr, 0);
  cfg.naive = true;
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  std::vector<HoleReplay> replay(static_cast<size_t>(seq.kv().n_streams()));
  auto append = [&](int32_t n) {
    const int32_t pos0 = seq.kv().next_pos();
    ASSERT_TRUE(seq.append(n));
    ASSERT_TRUE(plain.append(n));
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = pos0 + i;
    for (auto& r : replay) r.append(pos);
  };
  auto replay_pages = [&] {
    int64_t t = 0;
    for (const auto& r : replay) t += static_cast<int64_t>(r.pages.size());
    return t;
  };
  append(40);
  EXPECT_EQ(comp.accounted_pages(seq.kv()), seq.kv().pages_held());  // no event yet: the real pages
  for (int event = 1; event <= 3; ++event) {
    const Snapshot sn = snapshot(seq);
    const CompressionStats before = comp.stats();
    comp.compress(seq.kv());
    comp_plain.compress(plain.kv());
    EXPECT_TRUE(seq.check_content());
    EXPECT_EQ(check_pool(pool, {&seq.kv()}), "");
    expect_keep_sets(seq, sn, ref_knorm(sn), uniform_budgets(mc, 12), cfg, 0, 0.0, "naive event " + std::to_string(event));
    int64_t expect_freed = 0;
    for (int32_t s = 0; s < seq.kv().n_streams(); ++s) {
      EXPECT_EQ(seq.positions(s), plain.positions(s)) << "stream " << s;  // the same keep sets as compaction
      expect_freed += replay[static_cast<size_t>(s)].evict(seq.positions(s));
    }
    EXPECT_EQ(comp.stats().evicted_slots, comp_plain.stats().evicted_slots);
    EXPECT_EQ(comp.stats().evicted_bytes, comp_plain.stats().evicted_bytes);
    EXPECT_EQ(comp.stats().freed_pages - before.freed_pages, expect_freed);
    EXPECT_EQ(comp.stats().freed_bytes, static_cast<uint64_t>(comp.stats().freed_pages) * pool.page_bytes());
    EXPECT_EQ(comp.accounted_pages(seq.kv()), replay_pages());
    EXPECT_EQ(seq.kv().pages_held(), plain.kv().pages_held());  // the real cache is compacted
    EXPECT_EQ(comp_plain.accounted_pages(plain.kv()), plain.kv().pages_held());
    EXPECT_LT(comp.stats().reclaim_efficiency(), comp_plain.stats().reclaim_efficiency());
    // The schedule counts live slots: the next event comes after `interval` more tokens.
    int steps = 0;
    while (!comp.after_forward(seq.kv(), false)) {
      append(1);
      EXPECT_EQ(comp.accounted_pages(seq.kv()), replay_pages());  // appends fill the last virtual page
      ASSERT_LT(++steps, 100);
    }
    EXPECT_EQ(steps, 8);
    // after_forward compressed `seq`; do the same to the plain twin and the replay.
    comp_plain.compress(plain.kv());
    for (int32_t s = 0; s < seq.kv().n_streams(); ++s) replay[static_cast<size_t>(s)].evict(seq.positions(s));
    EXPECT_EQ(comp.accounted_pages(seq.kv()), replay_pages());
    append(9);
  }
}

// Naive mode scores the live slots only: after compaction there is nothing else to score, so
// TriAttention's per-head z-normalisation runs over exactly the keys that are still cached.
TEST(CompressNaive, TriAttentionKeepSetsMatchTheReferenceOverLiveKeys) {
  const ModelConfig mc = tiny_model(true);
  const QueryStats qs = make_stats(mc, 970);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 971);
  CompressConfig cfg = make_cfg(PolicyKind::TriAttention, 12, 2, 1, 8);
  cfg.naive = true;
  SequenceCompressor comp(cfg, mc, &qs, 0);
  ASSERT_TRUE(seq.append(40));
  for (int event = 1; event <= 3; ++event) {
    const Snapshot sn = snapshot(seq);
    comp.compress(seq.kv());
    EXPECT_TRUE(seq.check_content());
    expect_keep_sets(seq, sn, ref_triattention(mc, qs, sn, sn.next_pos, true), uniform_budgets(mc, 12), cfg, 0, 1e-4,
                     "naive triattention event " + std::to_string(event));
    ASSERT_TRUE(seq.append(17));
  }
}
