// Page pool and sequence KV: allocation, refcounts, invariants, compaction, copy-on-write — including a
// randomized property test over thousands of operations that checks the invariants after each step.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <random>
#include <vector>

#include "kv/page_pool.h"
#include "kv/sequence_kv.h"

using namespace kvpack;
using namespace kvpack::kv;

namespace {

PoolConfig small_pool(int64_t pages, int32_t page_size = 4, int32_t head_dim = 8) {
  PoolConfig c;
  c.page_size = page_size;
  c.head_dim = head_dim;
  c.kv_type = DType::F32;
  c.max_pages = pages;
  c.pages_per_chunk = 3;  // several chunks even in small tests
  return c;
}

std::string check_all(const PagePool& pool, const std::vector<const SequenceKv*>& seqs) {
  std::vector<std::span<const PageId>> tables;
  for (auto* s : seqs)
    for (int32_t i = 0; i < s->n_streams(); ++i) tables.push_back(s->page_table(i));
  return pool.check(tables);
}

// Writes a recognisable value into every K/V element of a slot: (position, stream, which).
void stamp(SequenceKv& kv, int32_t stream, int32_t slot, int32_t pos) {
  auto* k = reinterpret_cast<float*>(kv.k_slot(stream, slot));
  auto* v = reinterpret_cast<float*>(kv.v_slot(stream, slot));
  for (int32_t e = 0; e < kv.pool().config().head_dim; ++e) {
    k[e] = static_cast<float>(pos * 1000 + stream * 10 + 1);
    v[e] = static_cast<float>(pos * 1000 + stream * 10 + 2);
  }
}

bool stamped(SequenceKv& kv, int32_t stream, int32_t slot, int32_t pos) {
  auto* k = reinterpret_cast<float*>(kv.k_slot(stream, slot));
  auto* v = reinterpret_cast<float*>(kv.v_slot(stream, slot));
  return k[0] == static_cast<float>(pos * 1000 + stream * 10 + 1) && v[7] == static_cast<float>(pos * 1000 + stream * 10 + 2) &&
         kv.position(stream, slot) == pos;
}

// Random-operation tests, "compact": one stream keeps about two thirds of its slots, chosen at random;
// every survivor must hold its own position's row (`holds`) at its new slot.
template <class Holds>
void compact_randomly(SequenceKv& s, std::mt19937& rng, Holds holds) {
  const int32_t st = static_cast<int32_t>(rng() % static_cast<unsigned>(s.n_streams()));
  std::vector<int32_t> keep, before_pos;
  for (int32_t i = 0; i < s.n_slots(st); ++i)
    if (rng() % 3 != 0) keep.push_back(i);
  for (int32_t i : keep) before_pos.push_back(s.position(st, i));
  if (s.compact_stream(st, keep) >= 0) {
    ASSERT_EQ(s.n_slots(st), static_cast<int32_t>(keep.size()));
    for (size_t i = 0; i < keep.size(); ++i) ASSERT_TRUE(holds(s, st, static_cast<int32_t>(i), before_pos[i])) << "slot " << i;
  }
}

// Random-operation tests, "outside owner": takes a reference to a sequence's first page (a shared
// prefix stand-in), or drops one it holds.
void toggle_outside_reference(PagePool& pool, SequenceKv& s, std::vector<PageId>& outside, std::mt19937& rng) {
  auto t = s.page_table(0);
  if (!t.empty() && rng() % 2) {
    pool.retain(t[0]);
    outside.push_back(t[0]);
  } else if (!outside.empty()) {
    pool.release(outside.back());
    outside.pop_back();
  }
}

}  // namespace

TEST(PagePool, AllocateReleaseAndExhaustion) {
  PagePool pool(small_pool(5));
  EXPECT_EQ(pool.page_bytes(), 2u * 4 * 8 * 4);
  std::vector<PageId> got;
  for (int i = 0; i < 5; ++i) {
    const PageId p = pool.allocate();
    ASSERT_NE(p, kNoPage);
    got.push_back(p);
  }
  EXPECT_EQ(pool.allocate(), kNoPage);
  EXPECT_EQ(pool.used_pages(), 5);
  EXPECT_EQ(pool.free_pages(), 0);
  pool.retain(got[2]);
  pool.release(got[2]);
  EXPECT_EQ(pool.refcount(got[2]), 1);
  pool.release(got[2]);
  EXPECT_EQ(pool.refcount(got[2]), 0);
  EXPECT_EQ(pool.free_pages(), 1);
  EXPECT_EQ(pool.allocate(), got[2]);  // LIFO reuse of the freed page
}

TEST(PagePool, MemoryGrowsWithPagesUsedNotWithLimit) {
  PoolConfig c = small_pool(1'000'000, 16, 128);
  c.pages_per_chunk = 0;  // default ~2 MiB chunks
  PagePool pool(c);
  EXPECT_EQ(pool.reserved_bytes(), 0u);
  const PageId p = pool.allocate();
  ASSERT_NE(p, kNoPage);
  EXPECT_GT(pool.reserved_bytes(), 0u);
  EXPECT_LE(pool.reserved_bytes(), size_t{3} << 20);  // one chunk, not 16 GB for the limit
}

TEST(PagePool, DefaultChunksSitOnHugePageBoundaries) {
  // Default ~2 MiB chunks are placed on 2 MiB boundaries (offered to the kernel as transparent huge pages:
  // decode reads scattered pages, and with 4 KiB OS pages nearly each one cost a TLB miss). Every chunk's
  // first page is so aligned; pages inside a chunk keep their 64-byte alignment.
  PoolConfig c = small_pool(2'000, 16, 128);
  c.kv_type = DType::F16;  // 8 KiB of K/V + 64 B of positions per page: 254 pages per chunk
  c.pages_per_chunk = 0;
  PagePool pool(c);
  constexpr size_t kHuge = size_t{2} << 20;
  std::vector<PageId> pages;
  for (int i = 0; i < 600; ++i) pages.push_back(pool.allocate());  // 3 chunks
  // Each chunk takes exactly one 2 MiB huge page from the system (the pages fill all but 128 bytes of it).
  EXPECT_EQ(pool.reserved_bytes(), 3 * kHuge);
  const size_t chunks = 3;
  size_t aligned = 0;
  for (PageId p : pages) {
    ASSERT_NE(p, kNoPage);
    const auto addr = reinterpret_cast<uintptr_t>(pool.data(p));
    EXPECT_EQ(addr % 64, 0u);
    if (addr % kHuge == 0) ++aligned;  // only a chunk's first page can sit on a boundary
  }
  EXPECT_EQ(aligned, chunks);
  // Tiny chunks (tests, small shapes) are not rounded up to 2 MiB.
  PagePool small(small_pool(64));
  ASSERT_NE(small.allocate(), kNoPage);
  EXPECT_LT(small.reserved_bytes(), size_t{1} << 20);
}

TEST(SequenceKv, AppendTracksPagesPositionsAndReleasesOnDestruction) {
  PagePool pool(small_pool(64));
  {
    SequenceKv kv(pool, /*layers=*/2, /*kv_heads=*/3);
    ASSERT_TRUE(kv.append(5, 0));  // 5 slots -> 2 pages per stream
    EXPECT_EQ(kv.pages_held(), 2 * 6);
    EXPECT_EQ(kv.pages_needed(3), 0);  // 8 slots still fit in 2 pages
    EXPECT_EQ(kv.pages_needed(4), 6);
    for (int32_t s = 0; s < kv.n_streams(); ++s)
      for (int32_t i = 0; i < 5; ++i) EXPECT_EQ(kv.position(s, i), i);
    EXPECT_EQ(check_all(pool, {&kv}), "");
    EXPECT_EQ(kv.next_pos(), 5);
  }
  EXPECT_EQ(pool.used_pages(), 0);
  EXPECT_EQ(pool.check({}), "");
}

TEST(SequenceKv, AppendIsAllOrNothingWhenPoolRunsOut) {
  PagePool pool(small_pool(7));
  SequenceKv kv(pool, 1, 2);
  ASSERT_TRUE(kv.append(12, 0));  // 3 pages per stream = 6
  EXPECT_FALSE(kv.append(1, 12)); // needs 2 more pages, 1 free
  EXPECT_EQ(kv.n_slots(0), 12);
  EXPECT_EQ(kv.next_pos(), 12);
  EXPECT_EQ(check_all(pool, {&kv}), "");
}

TEST(SequenceKv, CompactionSlidesSurvivorsForwardAndFreesTailPages) {
  PagePool pool(small_pool(64));
  SequenceKv kv(pool, 1, 1);
  ASSERT_TRUE(kv.append(16, 100));  // 4 pages of 4
  for (int32_t i = 0; i < 16; ++i) stamp(kv, 0, i, 100 + i);
  const std::vector<int32_t> keep = {0, 1, 5, 9, 10, 15};
  const int64_t freed = kv.compact_stream(0, keep);
  EXPECT_EQ(freed, 2);  // 6 survivors fit in 2 pages
  EXPECT_EQ(kv.n_slots(0), 6);
  for (size_t i = 0; i < keep.size(); ++i) EXPECT_TRUE(stamped(kv, 0, static_cast<int32_t>(i), 100 + keep[i])) << i;
  EXPECT_EQ(pool.used_pages(), 2);
  EXPECT_EQ(check_all(pool, {&kv}), "");
}

// copy_positions returns what position() does slot by slot: full and partial last pages, after a
// compaction (positions no longer consecutive) and for an empty stream.
TEST(SequenceKv, CopyPositionsListsEverySlotsPosition) {
  PagePool pool(small_pool(64));
  SequenceKv kv(pool, 1, 2);
  ASSERT_TRUE(kv.append(14, 100));  // 4 pages of 4, the last one half full
  ASSERT_GE(kv.compact_stream(1, std::vector<int32_t>{0, 3, 4, 9, 13}), 0);
  std::vector<int32_t> got = {-7};
  for (int32_t s = 0; s < 2; ++s) {
    kv.copy_positions(s, got);
    ASSERT_EQ(static_cast<int32_t>(got.size()), kv.n_slots(s));
    for (int32_t j = 0; j < kv.n_slots(s); ++j) EXPECT_EQ(got[static_cast<size_t>(j)], kv.position(s, j)) << s << " " << j;
  }
  EXPECT_EQ(got, (std::vector<int32_t>{100, 103, 104, 109, 113}));
  ASSERT_GE(kv.compact_stream(0, std::vector<int32_t>{}), 0);
  kv.copy_positions(0, got);
  EXPECT_TRUE(got.empty());
}

TEST(SequenceKv, CompactionNeverWritesASharedPage) {
  PagePool pool(small_pool(64));
  SequenceKv a(pool, 1, 1);
  ASSERT_TRUE(a.append(8, 0));
  for (int32_t i = 0; i < 8; ++i) stamp(a, 0, i, i);
  const PageId first = a.page_table(0)[0];
  pool.retain(first);  // an outside owner (e.g. the prefix cache) now also holds page 0
  const std::vector<int32_t> keep = {0, 2, 4, 6};
  ASSERT_GE(a.compact_stream(0, keep), 0);
  // The shared page keeps its original content; a got a private copy.
  EXPECT_NE(a.page_table(0)[0], first);
  EXPECT_EQ(pool.refcount(first), 1);
  const auto* k = reinterpret_cast<const float*>(pool.data(first));
  EXPECT_EQ(k[8], 1.0f * 1000 + 1);  // slot 1 of the shared page still holds position 1
  for (int32_t i = 0; i < 4; ++i) EXPECT_TRUE(stamped(a, 0, i, keep[static_cast<size_t>(i)]));
  pool.release(first);
}

TEST(SequenceKv, RandomOperationsKeepPoolInvariants) {
  std::mt19937 rng(1234);
  PagePool pool(small_pool(200, 4, 8));
  std::vector<std::unique_ptr<SequenceKv>> seqs;
  std::vector<PageId> outside;  // pages retained by an "outside owner" (prefix cache stand-in)
  int ops = 0;
  for (int step = 0; step < 5000; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 2 && seqs.size() < 8) {
      seqs.push_back(std::make_unique<SequenceKv>(pool, 2, 2));
    } else if (op < 6 && !seqs.empty()) {
      auto& s = *seqs[rng() % seqs.size()];
      const int32_t n = 1 + static_cast<int32_t>(rng() % 9);
      const int32_t pos = s.next_pos();
      if (s.append(n, pos)) {
        for (int32_t st = 0; st < s.n_streams(); ++st)
          for (int32_t i = s.n_slots(st) - n; i < s.n_slots(st); ++i) stamp(s, st, i, s.position(st, i));
      }
    } else if (op < 8 && !seqs.empty()) {
      ASSERT_NO_FATAL_FAILURE(compact_randomly(*seqs[rng() % seqs.size()], rng, stamped)) << "step " << step;
    } else if (op == 8 && !seqs.empty()) {
      toggle_outside_reference(pool, *seqs[rng() % seqs.size()], outside, rng);
    } else if (!seqs.empty()) {
      seqs.erase(seqs.begin() + static_cast<long>(rng() % seqs.size()));
    }
    ++ops;
    std::vector<std::span<const PageId>> tables;
    for (auto& s : seqs)
      for (int32_t i = 0; i < s->n_streams(); ++i) tables.push_back(s->page_table(i));
    tables.push_back(outside);
    ASSERT_EQ(pool.check(tables), "") << "after op " << step;
  }
  seqs.clear();
  for (PageId p : outside) pool.release(p);
  EXPECT_EQ(pool.used_pages(), 0);
  EXPECT_EQ(ops, 5000);
}

// ---- KV element types: rows are kernels::kv_row_bytes(type, head_dim) bytes, moved whole ----------------

namespace {

// The f32 row a slot at `pos` of `stream` holds (K: which = 0, V: which = 1); distinct per (pos, stream,
// which) in every element, including after bf16 / Q8_0 rounding (the first element is a large, unique tag).
std::vector<float> row_values(int32_t hd, int32_t pos, int32_t stream, int32_t which) {
  std::vector<float> r(static_cast<size_t>(hd));
  for (int32_t e = 0; e < hd; ++e)
    r[static_cast<size_t>(e)] = std::sin(0.37f * static_cast<float>(e + 1) + 0.11f * static_cast<float>(pos) +
                                         1.3f * static_cast<float>(stream) + 2.1f * static_cast<float>(which));
  r[0] = static_cast<float>(pos * 16 + stream * 2 + which + 1);  // tag
  return r;
}

void stamp_typed(SequenceKv& kv, int32_t stream, int32_t slot, int32_t pos) {
  const auto& c = kv.pool().config();
  kernels::kv_encode_row(row_values(c.head_dim, pos, stream, 0).data(), c.kv_type, c.head_dim, kv.k_slot(stream, slot));
  kernels::kv_encode_row(row_values(c.head_dim, pos, stream, 1).data(), c.kv_type, c.head_dim, kv.v_slot(stream, slot));
}

// Byte-exact: the slot holds exactly the encoding of its position's row (compaction copies bytes).
bool stamped_typed(SequenceKv& kv, int32_t stream, int32_t slot, int32_t pos) {
  const auto& c = kv.pool().config();
  const size_t rb = kv.pool().slot_bytes();
  std::vector<uint8_t> want(rb);
  for (int which = 0; which < 2; ++which) {
    kernels::kv_encode_row(row_values(c.head_dim, pos, stream, which).data(), c.kv_type, c.head_dim, want.data());
    const uint8_t* got = which == 0 ? kv.k_slot(stream, slot) : kv.v_slot(stream, slot);
    if (std::memcmp(got, want.data(), rb) != 0) return false;
  }
  return kv.position(stream, slot) == pos;
}

class KvTypes : public ::testing::TestWithParam<DType> {};

}  // namespace

TEST_P(KvTypes, RowAndPageBytesFollowTheType) {
  const DType t = GetParam();
  PoolConfig c = small_pool(8, 16, 64);
  c.kv_type = t;
  PagePool pool(c);
  const size_t row = t == DType::F32 ? 256 : t == DType::Q8_0 ? 2 * 34 : 128;
  EXPECT_EQ(pool.slot_bytes(), row);
  EXPECT_EQ(pool.page_bytes(), 2 * 16 * row);
  EXPECT_EQ(pool.v_offset(), 16 * row);
  if (t == DType::Q8_0) {
    EXPECT_EQ(pool.page_bytes() * 64, (2u * 16 * 64 * 2) * 34);  // 34/64 of an f16 page
  }
}

TEST_P(KvTypes, CompactionCopyOnWriteAndSharedBlocksMoveWholeRows) {
  const DType t = GetParam();
  std::mt19937 rng(77 + static_cast<unsigned>(t));
  // head_dim 32: a Q8_0 row is 34 bytes, so rows are not even 4-byte aligned inside a page.
  PoolConfig c = small_pool(400, 4, 32);
  c.kv_type = t;
  PagePool pool(c);
  std::vector<std::unique_ptr<SequenceKv>> seqs;
  std::vector<PageId> outside;
  // A donor whose first full block is attached (shared) to new sequences, as the prefix cache does.
  SequenceKv donor(pool, 1, 2);
  ASSERT_TRUE(donor.append(4, 0));
  for (int32_t st = 0; st < 2; ++st)
    for (int32_t i = 0; i < 4; ++i) stamp_typed(donor, st, i, i);
  for (int step = 0; step < 1500; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 2 && seqs.size() < 6) {
      seqs.push_back(std::make_unique<SequenceKv>(pool, 1, 2));
      if (rng() % 2) seqs.back()->attach_shared_block(std::vector<PageId>{donor.block_page(0, 0), donor.block_page(1, 0)}, 0);
    } else if (op < 6 && !seqs.empty()) {
      auto& s = *seqs[rng() % seqs.size()];
      const int32_t n = 1 + static_cast<int32_t>(rng() % 7);
      const int32_t pos = s.next_pos();
      if (s.append(n, pos))
        for (int32_t st = 0; st < s.n_streams(); ++st)
          for (int32_t i = s.n_slots(st) - n; i < s.n_slots(st); ++i) stamp_typed(s, st, i, s.position(st, i));
    } else if (op < 8 && !seqs.empty()) {
      ASSERT_NO_FATAL_FAILURE(compact_randomly(*seqs[rng() % seqs.size()], rng, stamped_typed)) << "step " << step;
    } else if (op == 8 && !seqs.empty()) {
      toggle_outside_reference(pool, *seqs[rng() % seqs.size()], outside, rng);
    } else if (!seqs.empty()) {
      seqs.erase(seqs.begin() + static_cast<long>(rng() % seqs.size()));
    }
    // Every slot of every sequence still holds its own position's row, byte for byte, and the shared
    // donor block was never written (copy-on-write).
    for (auto& s : seqs)
      for (int32_t st = 0; st < s->n_streams(); ++st)
        for (int32_t i = 0; i < s->n_slots(st); ++i) ASSERT_TRUE(stamped_typed(*s, st, i, s->position(st, i))) << "step " << step;
    for (int32_t st = 0; st < 2; ++st)
      for (int32_t i = 0; i < 4; ++i) ASSERT_TRUE(stamped_typed(donor, st, i, i)) << "donor written at step " << step;
    std::vector<std::span<const PageId>> tables;
    for (auto& s : seqs)
      for (int32_t i = 0; i < s->n_streams(); ++i) tables.push_back(s->page_table(i));
    for (int32_t i = 0; i < donor.n_streams(); ++i) tables.push_back(donor.page_table(i));
    tables.push_back(outside);
    ASSERT_EQ(pool.check(tables), "") << "after op " << step;
  }
  seqs.clear();
  for (PageId p : outside) pool.release(p);
}

INSTANTIATE_TEST_SUITE_P(Types, KvTypes, ::testing::Values(DType::F32, DType::F16, DType::BF16, DType::Q8_0),
                         [](const auto& info) { return std::string(kernels::kv_type_name(info.param)); });

TEST(PagePool, Q8_0NeedsWholeBlocksPerRow) {
  PoolConfig c = small_pool(8, 16, 8);
  c.kv_type = DType::Q8_0;
  try {
    PagePool pool(c);
    FAIL() << "Q8_0 with head_dim 8 must be rejected";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 32"), std::string::npos) << e.what();
  }
  c.kv_type = DType::Q4_0;
  EXPECT_THROW(PagePool{c}, std::invalid_argument);
}

TEST(SequenceKvWindow, DropPagesBeforeReleasesWholeOutOfWindowPagesOnly) {
  PagePool pool(small_pool(64, 4));
  SequenceKv a(pool, 1, 2);
  ASSERT_TRUE(a.append(14, 0));  // 4 pages per stream: positions 0..13
  for (int32_t st = 0; st < 2; ++st)
    for (int32_t i = 0; i < 14; ++i) stamp(a, st, i, i);
  const PageId p2 = a.block_page(0, 2);
  SequenceKv b(pool, 1, 2);
  b.share_from(a);  // page 0 of each stream is shared now
  EXPECT_EQ(a.drop_pages_before(0, 3), 0) << "page 0 still holds position 3";
  EXPECT_EQ(a.drop_pages_before(0, 9), 2) << "pages 0 and 1 (positions 0..7) are out";
  EXPECT_EQ(a.n_slots(0), 6);
  EXPECT_EQ(a.dropped_pages(0), 2);
  EXPECT_EQ(a.block_page(0, 0), kNoPage);
  EXPECT_EQ(a.block_page(0, 1), kNoPage);
  EXPECT_EQ(a.block_page(0, 2), p2);
  for (int32_t i = 0; i < 6; ++i) EXPECT_TRUE(stamped(a, 0, i, 8 + i)) << i;
  EXPECT_EQ(a.n_slots(1), 14) << "other streams untouched";
  EXPECT_EQ(a.drop_pages_before(0, 100), 1) << "the partly filled last page stays";
  EXPECT_EQ(a.n_slots(0), 2);
  ASSERT_TRUE(a.append(3, 14));
  EXPECT_TRUE(a.position(0, 4) == 16 && a.position(1, 16) == 16);
  EXPECT_EQ(check_all(pool, {&a, &b}), "");
  for (int32_t i = 0; i < 14; ++i) EXPECT_TRUE(stamped(b, 0, i, i)) << "the sharer keeps its pages: " << i;
  SequenceKv c(pool, 1, 2);
  c.share_from(a);
  EXPECT_EQ(c.dropped_pages(0), 3);
  EXPECT_EQ(c.block_page(0, 3), a.block_page(0, 3));
  a.clear();
  EXPECT_EQ(a.dropped_pages(0), 0);
  EXPECT_EQ(check_all(pool, {&b, &c}), "");
}
