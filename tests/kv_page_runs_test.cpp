// Page runs (kv/page_pool.h): a stream's pages follow each other in memory however its sequence grows,
// soft reservations cost no capacity, and the pool's invariants hold throughout.
#include <gtest/gtest.h>

#include <random>
#include <span>
#include <string>
#include <vector>

#include "kv/page_pool.h"
#include "kv/sequence_kv.h"

using namespace kvpack;
using namespace kvpack::kv;

namespace {

PoolConfig pool_config(int64_t pages, bool runs = true) {
  PoolConfig c;
  c.page_size = 16;
  c.head_dim = 128;
  c.kv_type = DType::F16;  // 8 KiB pages: runs of 16 (>= 128 KiB)
  c.max_pages = pages;
  c.page_runs = runs;
  return c;
}

// Share of page-table neighbours (across all streams) that are not consecutive page ids.
double broken_share(const SequenceKv& s) {
  int64_t broken = 0, total = 0;
  for (int32_t i = 0; i < s.n_streams(); ++i) {
    const auto t = s.page_table(i);
    for (size_t j = 1; j < t.size(); ++j, ++total) broken += t[j] != t[j - 1] + 1 ? 1 : 0;
  }
  return total > 0 ? static_cast<double>(broken) / static_cast<double>(total) : 0.0;
}

std::string check(const PagePool& pool, const std::vector<const SequenceKv*>& seqs) {
  std::vector<std::span<const PageId>> tables;
  for (auto* s : seqs)
    for (int32_t i = 0; i < s->n_streams(); ++i) tables.push_back(s->page_table(i));
  return pool.check(tables);
}

TEST(PageRuns, RunLengthCoversAtLeast128KiB) {
  PagePool pool(pool_config(4096));
  EXPECT_EQ(pool.run_pages(), 16);
  PagePool off(pool_config(4096, false));
  EXPECT_EQ(off.run_pages(), 1);
}

// Decode: every stream of the sequence takes a page at the same step. Without runs each stream's pages
// are n_streams apart; with them only the step from one run to the next (1 in 16) or into another chunk
// breaks the order.
TEST(PageRuns, StreamsGrowingTokenByTokenGetPagesInRuns) {
  for (const bool runs : {false, true}) {
    PagePool pool(pool_config(8 * 4 * 70, runs));
    SequenceKv seq(pool, 4, 2);
    for (int32_t t = 0; t < 16 * 64; ++t) ASSERT_TRUE(seq.append(1, t));
    ASSERT_EQ(check(pool, {&seq}), "");
    const double broken = broken_share(seq);
    if (runs) {
      EXPECT_LT(broken, 0.09) << "runs of 16 pages, plus chunk boundaries";
    } else {
      EXPECT_GT(broken, 0.95);
    }
  }
}

// A refill of released pages: LIFO order would hand a stream its pages from the top of a freed run down
// (every page breaking address order); runs start at the lowest free page of the run instead.
TEST(PageRuns, RefillOfReleasedPagesAscends) {
  PagePool pool(pool_config(8 * 200));
  {
    SequenceKv a(pool, 4, 2);
    ASSERT_TRUE(a.append(16 * 150, 0));
    EXPECT_LT(broken_share(a), 0.02);
  }
  SequenceKv b(pool, 4, 2);
  ASSERT_TRUE(b.append(16 * 100, 0));
  EXPECT_LT(broken_share(b), 0.05);
  SequenceKv c(pool, 4, 2);
  for (int32_t t = 0; t < 16 * 60; ++t) ASSERT_TRUE(c.append(1, t));
  EXPECT_LT(broken_share(c), 0.12);
  EXPECT_EQ(check(pool, {&b, &c}), "");
}

// Soft-reserved pages are free pages: another sequence can take every one of them, and the pool
// reaches exactly its capacity.
TEST(PageRuns, SoftReservationsCostNoCapacity) {
  const int64_t cap = 8 * 40;
  PagePool pool(pool_config(cap));
  SequenceKv grow(pool, 4, 2);
  for (int32_t t = 0; t < 16 * 3; ++t) ASSERT_TRUE(grow.append(1, t));  // 3 pages per stream, runs of 16 held
  EXPECT_GT(pool.soft_reserved_pages(), 0);
  EXPECT_EQ(pool.free_pages(), cap - 8 * 3);
  SequenceKv fill(pool, 4, 2);
  ASSERT_TRUE(fill.append(16 * 37, 0)) << "the reserved pages are part of the free count";
  EXPECT_EQ(pool.free_pages(), 0);
  EXPECT_EQ(pool.soft_reserved_pages(), 0);
  EXPECT_FALSE(grow.append(16, 48)) << "a full pool refuses cleanly";
  EXPECT_EQ(check(pool, {&grow, &fill}), "");
  fill.clear();
  for (int32_t t = 48; t < 16 * 20; ++t) ASSERT_TRUE(grow.append(1, t));
  EXPECT_EQ(check(pool, {&grow, &fill}), "");
}

// A stream that shrinks or ends gives its held pages back to the free list (a reservation only ever follows
// its stream's last page), so finished sequences leave nothing held.
TEST(PageRuns, ReservationsGoBackWhenStreamsShrinkOrEnd) {
  PagePool pool(pool_config(8 * 100));
  {
    SequenceKv a(pool, 4, 2);
    for (int32_t t = 0; t < 16 * 3; ++t) ASSERT_TRUE(a.append(1, t));
    EXPECT_EQ(pool.soft_reserved_pages(), 8 * 13) << "16-page runs, 3 pages taken per stream";
    a.truncate_tail(16);  // one page per stream fewer
    EXPECT_EQ(pool.soft_reserved_pages(), 0);
    EXPECT_EQ(check(pool, {&a}), "");
    for (int32_t t = 32; t < 16 * 4; ++t) ASSERT_TRUE(a.append(1, t));
    EXPECT_LT(broken_share(a), 0.01) << "the stream grows back into the freed pages after its last one";
    EXPECT_GT(pool.soft_reserved_pages(), 0);
  }
  EXPECT_EQ(pool.soft_reserved_pages(), 0);
  EXPECT_EQ(pool.free_pages(), pool.capacity());
}

// Random appends (token by token and in chunks), truncations, clears and compactions over several
// sequences: the pool's invariants (free + soft-reserved + cached-free + referenced = total, every
// refcount matches the tables) after every step, and every slot still holds its own row.
TEST(PageRuns, RandomGrowthAndReleaseKeepInvariants) {
  PoolConfig c = pool_config(8 * 120);
  c.head_dim = 32;
  c.kv_type = DType::F32;
  c.pages_per_chunk = 50;
  PagePool pool(c);
  std::mt19937 rng(3);
  std::vector<std::unique_ptr<SequenceKv>> seqs;
  for (int i = 0; i < 3; ++i) seqs.push_back(std::make_unique<SequenceKv>(pool, 4, 2));
  auto stamp = [](SequenceKv& s, int32_t slot0, int32_t n) {
    for (int32_t st = 0; st < s.n_streams(); ++st)
      for (int32_t j = slot0; j < slot0 + n; ++j) reinterpret_cast<float*>(s.k_slot(st, j))[0] = static_cast<float>(s.position(st, j));
  };
  for (int step = 0; step < 3000; ++step) {
    SequenceKv& s = *seqs[rng() % seqs.size()];
    const uint32_t op = rng() % 10;
    const int32_t have = s.n_slots(0);
    if (op < 6) {
      const int32_t n = op < 4 ? 1 : 1 + static_cast<int32_t>(rng() % 40);
      if (s.append(n, have)) stamp(s, have, n);
    } else if (op < 8 && have > 0) {
      s.truncate_tail(1 + static_cast<int32_t>(rng() % std::min(have, 20)));
    } else if (op == 8 && have > 4) {
      std::vector<int32_t> keep;
      for (int32_t j = 0; j < have; ++j)
        if (rng() % 3 != 0) keep.push_back(j);
      for (int32_t st = 0; st < s.n_streams(); ++st) s.compact_stream(st, keep);
    } else if (op == 9 && rng() % 8 == 0) {
      s.clear();
    }
    const std::string err = check(pool, {seqs[0].get(), seqs[1].get(), seqs[2].get()});
    ASSERT_EQ(err, "") << "step " << step;
    for (auto& q : seqs)
      for (int32_t st = 0; st < q->n_streams(); ++st)
        for (int32_t j = 0; j < q->n_slots(st); ++j)
          ASSERT_EQ(reinterpret_cast<const float*>(q->k_slot(st, j))[0], static_cast<float>(q->position(st, j))) << "step " << step;
  }
}

}  // namespace
