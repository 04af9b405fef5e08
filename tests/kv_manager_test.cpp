// KV manager: the page pool and the prefix cache behind one owner. Cached-free pages (registered blocks
// nobody holds) count as free, come back on a hit, and are reused lazily — least recently freed first,
// only after plain free and never-used pages — dropping their block from the cache; a cached page is
// shared (read-only) even with a single holder. Invariants are checked after every operation, and a
// randomized test mixes sequences, hits, registration, compaction and pool pressure.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "kv/kv_manager.h"

using namespace kvpack;
using namespace kvpack::kv;

namespace {

constexpr int32_t kPage = 4;

PoolConfig pool_of(int64_t pages) {
  PoolConfig c;
  c.page_size = kPage;
  c.head_dim = 8;
  c.kv_type = DType::F32;
  c.max_pages = pages;
  c.pages_per_chunk = 3;
  return c;
}

// A sequence of `n` tokens whose K rows hold the token id (so a reused page can be recognised).
std::unique_ptr<SequenceKv> filled(KvManager& m, const std::vector<int32_t>& toks, int32_t n) {
  auto kv = m.new_sequence();
  EXPECT_TRUE(kv->append(n, 0));
  for (int32_t s = 0; s < kv->n_streams(); ++s)
    for (int32_t j = 0; j < n; ++j) {
      auto* k = reinterpret_cast<float*>(kv->k_slot(s, j));
      for (int e = 0; e < 8; ++e) k[e] = static_cast<float>(toks[static_cast<size_t>(j)] * 100 + s);
    }
  return kv;
}

std::vector<int32_t> tokens(int32_t n, int32_t base) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = base + i;
  return t;
}

std::string check(const KvManager& m, std::initializer_list<const SequenceKv*> live) {
  std::vector<const SequenceKv*> v(live);
  return m.check(v);
}

}  // namespace

TEST(KvManager, CachedFreePagesCountAsFreeAndComeBackOnAHit) {
  KvManager m(pool_of(12), 1, 2);  // 2 streams
  const auto t = tokens(9, 10);    // 2 full blocks + 1 token
  auto a = filled(m, t, 9);
  EXPECT_EQ(m.usage().pages_used, 6);
  m.register_blocks(*a, t, 2, 0);
  EXPECT_EQ(m.prefix_stats().cached_blocks, 2);
  EXPECT_TRUE(m.pool().is_shared(a->page_table(0)[0]));   // cached: read-only for its single holder
  EXPECT_FALSE(m.pool().is_shared(a->page_table(0)[2]));  // the partial page is private
  EXPECT_EQ(check(m, {a.get()}), "");
  a.reset();
  const KvUsage u = m.usage();
  EXPECT_EQ(u.pages_used, 0);
  EXPECT_EQ(u.pages_cached_free, 4);  // 2 blocks x 2 streams keep their K/V
  EXPECT_EQ(u.pages_free, 12);        // and still count as free
  EXPECT_EQ(check(m, {}), "");

  auto b = m.new_sequence();
  EXPECT_EQ(m.attach_cached_prefix(*b, t, 0), 8);
  EXPECT_EQ(m.usage().pages_cached_free, 0);
  EXPECT_EQ(m.usage().pages_used, 4);
  EXPECT_EQ(reinterpret_cast<const float*>(m.pool().data(b->page_table(1)[1]))[0], 14 * 100 + 1);  // token 14, stream 1
  EXPECT_EQ(check(m, {b.get()}), "");
  // Another salt is another namespace.
  auto c = m.new_sequence();
  EXPECT_EQ(m.attach_cached_prefix(*c, t, 7), 0);
  EXPECT_EQ(check(m, {b.get(), c.get()}), "");
}

TEST(KvManager, ReuseTakesPlainAndFreshPagesFirstThenLeastRecentlyFreedBlock) {
  KvManager m(pool_of(8), 1, 1);  // 1 stream: one page per block
  const auto t1 = tokens(9, 100), t2 = tokens(9, 200);
  auto a = filled(m, t1, 8);
  auto b = filled(m, t2, 8);
  m.register_blocks(*a, t1, 2, 0);
  m.register_blocks(*b, t2, 2, 0);
  a.reset();  // a's blocks freed first: least recently freed
  b.reset();
  EXPECT_EQ(m.usage().pages_cached_free, 4);
  // 4 never-used pages go first: the cache keeps all 4 blocks.
  auto x = filled(m, tokens(16, 0), 16);
  EXPECT_EQ(m.prefix_stats().cached_blocks, 4);
  EXPECT_EQ(m.prefix_stats().evictions, 0);
  // The next page reuses the least recently freed cached page (a's first-freed page): one block goes.
  ASSERT_TRUE(x->append(1, 16));
  EXPECT_EQ(m.prefix_stats().cached_blocks, 3);
  EXPECT_EQ(m.prefix_stats().evictions, 1);
  EXPECT_EQ(check(m, {x.get()}), "");
  // b's prefix is intact; a's is not whole any more (lookups stop at the first missing block).
  auto hb = m.new_sequence();
  EXPECT_EQ(m.attach_cached_prefix(*hb, t2, 0), 8);
  auto ha = m.new_sequence();
  EXPECT_LT(m.attach_cached_prefix(*ha, t1, 0), 8);
  EXPECT_EQ(check(m, {x.get(), hb.get(), ha.get()}), "");
  EXPECT_FALSE(m.can_allocate(m.free_pages() + 1));
}

TEST(KvManager, CompactionCopiesACachedPageInsteadOfRewritingIt) {
  KvManager m(pool_of(16), 1, 1);
  const auto t = tokens(9, 30);
  auto a = filled(m, t, 9);
  m.register_blocks(*a, t, 2, 0);
  const PageId first = a->page_table(0)[0];
  const std::vector<int32_t> keep = {0, 2, 4, 6, 8};  // rewrites slots from 1 on
  a->compact_stream(0, keep);
  EXPECT_NE(a->page_table(0)[0], first);  // copied: the cached page keeps its K/V
  EXPECT_EQ(reinterpret_cast<const float*>(m.pool().data(first) + m.pool().slot_bytes())[0], 31 * 100);
  EXPECT_EQ(check(m, {a.get()}), "");
  auto b = m.new_sequence();
  EXPECT_EQ(m.attach_cached_prefix(*b, t, 0), 8);
  EXPECT_EQ(reinterpret_cast<const float*>(m.pool().data(b->page_table(0)[0]) + 3 * m.pool().slot_bytes())[0], 33 * 100);
  EXPECT_EQ(check(m, {a.get(), b.get()}), "");
}

TEST(KvManager, ProjectionCountsPagesPerStream) {
  KvManager m(pool_of(64), 2, 3);
  EXPECT_EQ(m.pages_for_slots(9, false), 6 * 3);
  EXPECT_EQ(m.pages_for_slots(8, true), 6 * 3);
  EXPECT_EQ(m.pages_for_slots(0, false), 0);
}

TEST(KvManager, RandomOperationsKeepPoolAndCacheConsistent) {
  std::mt19937 rng(1234);
  KvManager m(pool_of(40), 1, 2);
  std::vector<std::unique_ptr<SequenceKv>> live;
  std::vector<std::vector<int32_t>> live_tokens;
  const std::vector<std::vector<int32_t>> prompts = {tokens(13, 0), tokens(17, 0), tokens(9, 500), tokens(21, 900)};
  for (int step = 0; step < 3000; ++step) {
    const int op = static_cast<int>(rng() % 5);
    if (op == 0 && live.size() < 6) {  // a new sequence: hit what it can, compute the rest
      const auto& p = prompts[rng() % prompts.size()];
      auto kv = m.new_sequence();
      const int32_t hit = m.attach_cached_prefix(*kv, p, 0);
      const int32_t rest = static_cast<int32_t>(p.size()) - hit;
      if (!m.can_allocate(kv->pages_needed(rest)) || !kv->append(rest, hit)) continue;
      live.push_back(std::move(kv));
      live_tokens.push_back(p);
    } else if (op == 1 && !live.empty()) {  // finish one
      const size_t i = rng() % live.size();
      live.erase(live.begin() + static_cast<long>(i));
      live_tokens.erase(live_tokens.begin() + static_cast<long>(i));
    } else if (op == 2 && !live.empty()) {  // register its full blocks
      const size_t i = rng() % live.size();
      if (live[i]->max_slots() == static_cast<int32_t>(live_tokens[i].size()))
        m.register_blocks(*live[i], live_tokens[i], static_cast<int32_t>(live_tokens[i].size()) / kPage, 0);
    } else if (op == 3 && !live.empty()) {  // decode a token (may reuse cached-free pages)
      const size_t i = rng() % live.size();
      if (m.can_allocate(live[i]->pages_needed(1)) && live[i]->append(1, live[i]->next_pos())) live_tokens[i].push_back(7777);
    } else if (op == 4 && !live.empty()) {  // compact one stream to every other slot
      const size_t i = rng() % live.size();
      std::vector<int32_t> keep;
      for (int32_t j = 0; j < live[i]->n_slots(0); j += 2) keep.push_back(j);
      if (live[i]->compact_stream(0, keep) >= 0) live_tokens[i].assign(1, -1);  // no longer registrable
    }
    std::vector<const SequenceKv*> v;
    for (auto& s : live) v.push_back(s.get());
    ASSERT_EQ(m.check(v), "") << "step " << step;
  }
  // The mix really exercised hits and lazy reuse of cached-free pages.
  EXPECT_GT(m.prefix_stats().blocks_hit, 100);
  EXPECT_GT(m.prefix_stats().evictions, 10);
}

// n > 1 choices share their prompt's pages; compaction and recall of one choice copy a shared page before
// writing it. With no free page for that copy they refuse and change nothing (the parent's K/V and both
// page tables intact) instead of failing half-way; with a page free they go ahead.
TEST(KvManager, CopyOnWriteWithoutAFreePageRefusesAndChangesNothing) {
  KvManager m(pool_of(3), 1, 1);
  const auto t = tokens(8, 50);
  auto a = filled(m, t, 8);  // 2 pages
  auto b = m.fork_sequence(*a, 0);
  auto c = filled(m, tokens(4, 90), 4);  // the last page: none free
  ASSERT_EQ(m.pool().free_pages(), 0);
  const std::vector<PageId> a_pages(a->page_table(0).begin(), a->page_table(0).end());
  const std::vector<int32_t> keep = {0, 2, 4, 6};  // rewrites slots 1..3: page 0, shared with a
  EXPECT_EQ(b->compaction_copies(0, keep), 1);
  EXPECT_EQ(b->compact_stream(0, keep), -1);
  EXPECT_EQ(b->n_slots(0), 8);
  EXPECT_TRUE(std::equal(a_pages.begin(), a_pages.end(), b->page_table(0).begin()));
  std::vector<uint8_t> row(m.pool().slot_bytes(), 0);
  const SequenceKv::InsertedSlot in{row.data(), row.data(), 1000};
  EXPECT_FALSE(b->splice_stream(0, std::vector<int32_t>{0, 2, 3, 4, 5, 6, 7}, std::span(&in, 1)));
  EXPECT_EQ(b->n_slots(0), 8);
  EXPECT_EQ(check(m, {a.get(), b.get(), c.get()}), "");

  c.reset();  // one page free: the copy can be made
  EXPECT_EQ(b->compact_stream(0, keep), 1);
  EXPECT_EQ(b->n_slots(0), 4);
  EXPECT_NE(b->page_table(0)[0], a_pages[0]);
  for (int32_t j = 0; j < 8; ++j)  // the parent still reads its own tokens
    EXPECT_EQ(reinterpret_cast<const float*>(a->k_slot(0, j))[0], static_cast<float>(t[static_cast<size_t>(j)] * 100)) << j;
  for (int32_t j = 0; j < 4; ++j)
    EXPECT_EQ(reinterpret_cast<const float*>(b->k_slot(0, j))[0], static_cast<float>(t[static_cast<size_t>(keep[static_cast<size_t>(j)])] * 100)) << j;
  EXPECT_EQ(check(m, {a.get(), b.get()}), "");
}

// A recall exchange (as many slots in as out) writes only the slots whose source changes: a forked
// choice that swaps one slot of its middle page copies that page alone; the pages before and after stay
// shared with the parent, which still reads its own tokens.
TEST(KvManager, SpliceWritesOnlyTheChangedRangeAndKeepsLaterPagesShared) {
  KvManager m(pool_of(8), 1, 1);
  const auto t = tokens(12, 50);
  auto a = filled(m, t, 12);  // 3 full pages
  auto b = m.fork_sequence(*a, 0);
  const std::vector<PageId> a_pages(a->page_table(0).begin(), a->page_table(0).end());
  const int64_t free_before = m.pool().free_pages();
  std::vector<float> row(8, -7.0f);
  const SequenceKv::InsertedSlot in{reinterpret_cast<const uint8_t*>(row.data()), reinterpret_cast<const uint8_t*>(row.data()), 5};
  const std::vector<int32_t> keep = {0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11};  // slot 5 (page 1) goes, position 5 comes back
  ASSERT_TRUE(b->splice_stream(0, keep, std::span(&in, 1)));
  EXPECT_EQ(m.pool().free_pages(), free_before - 1);  // one copy-on-write page, no more
  EXPECT_EQ(b->page_table(0)[0], a_pages[0]);
  EXPECT_NE(b->page_table(0)[1], a_pages[1]);
  EXPECT_EQ(b->page_table(0)[2], a_pages[2]);
  EXPECT_EQ(reinterpret_cast<const float*>(b->k_slot(0, 5))[0], -7.0f);
  for (int32_t j = 0; j < 12; ++j) {
    EXPECT_EQ(b->position(0, j), j);
    EXPECT_EQ(reinterpret_cast<const float*>(a->k_slot(0, j))[0], static_cast<float>(t[static_cast<size_t>(j)] * 100)) << j;
    if (j != 5) {
      EXPECT_EQ(reinterpret_cast<const float*>(b->k_slot(0, j))[0], static_cast<float>(t[static_cast<size_t>(j)] * 100)) << j;
    }
  }
  EXPECT_EQ(check(m, {a.get(), b.get()}), "");
}
