// Evicted tokens in the cold tier (kv/evicted_kv.h): compaction's dropped slots come back bit-exact, in
// token order, page-sized, with their positions; the per-page key digest bounds q.k for every slot; a
// tier that refuses or loses records turns pages into counted "lost" pages, never wrong bytes; the
// destructor gives the tier its space back. Real tiers (host memory and a file in a temporary directory).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kv/cold_tier_file.h"
#include "kv/cold_tier_host.h"
#include "kv/evicted_kv.h"
#include "kv/page_pool.h"
#include "kv/sequence_kv.h"
#include "kv_cold_tier_util.h"
#include "util/thread_pool.h"

namespace kvpack::kv {
namespace {

constexpr int32_t kPage = 8;
constexpr int32_t kHeadDim = 32;  // Q8_0 needs a multiple of 32

PoolConfig pool_config(DType t) {
  PoolConfig c;
  c.page_size = kPage;
  c.head_dim = kHeadDim;
  c.kv_type = t;
  c.max_pages = 256;
  return c;
}

// One slot's K/V as the pool stores them (rows of the pool's type), and its position.
struct SlotBytes {
  std::vector<uint8_t> k, v;
  int32_t pos;
  std::vector<float> k_decoded;
};

// A sequence of `n` slots in `streams` streams with random keys / values, encoded in the pool's type.
std::unique_ptr<SequenceKv> random_sequence(PagePool& pool, int32_t streams, int32_t n, uint64_t seed) {
  auto kv = std::make_unique<SequenceKv>(pool, 1, streams);
  EXPECT_TRUE(kv->append(n, 100));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> row(kHeadDim);
  for (int32_t s = 0; s < streams; ++s)
    for (int32_t j = 0; j < n; ++j) {
      for (float& x : row) x = dist(rng);
      kernels::kv_encode_row(row.data(), pool.config().kv_type, kHeadDim, kv->k_slot(s, j));
      for (float& x : row) x = dist(rng);
      kernels::kv_encode_row(row.data(), pool.config().kv_type, kHeadDim, kv->v_slot(s, j));
    }
  return kv;
}

std::vector<SlotBytes> slots_of(SequenceKv& kv, int32_t stream, const std::vector<int32_t>& which) {
  std::vector<SlotBytes> out;
  const size_t row = kv.pool().slot_bytes();
  for (int32_t j : which) {
    SlotBytes b;
    b.k.assign(kv.k_slot(stream, j), kv.k_slot(stream, j) + row);
    b.v.assign(kv.v_slot(stream, j), kv.v_slot(stream, j) + row);
    b.pos = kv.position(stream, j);
    b.k_decoded.resize(kHeadDim);
    kernels::kv_decode_row(b.k.data(), kv.pool().config().kv_type, kHeadDim, b.k_decoded.data());
    out.push_back(std::move(b));
  }
  return out;
}

std::vector<int32_t> complement(int32_t n, const std::vector<int32_t>& keep) {
  std::vector<int32_t> out;
  for (int32_t j = 0; j < n; ++j)
    if (!std::binary_search(keep.begin(), keep.end(), j)) out.push_back(j);
  return out;
}

// Random strictly increasing keep set of `k` slots out of `n`.
std::vector<int32_t> random_keep(int32_t n, int32_t k, std::mt19937& rng) {
  std::vector<int32_t> all(static_cast<size_t>(n));
  for (int32_t j = 0; j < n; ++j) all[static_cast<size_t>(j)] = j;
  std::shuffle(all.begin(), all.end(), rng);
  all.resize(static_cast<size_t>(k));
  std::sort(all.begin(), all.end());
  return all;
}

// A host tier that counts its batched puts and remembers the largest (records).
class CountingTier final : public ColdTier {
 public:
  CountingTier(uint64_t cap, size_t record) : inner_(cap, record) {}
  const char* kind() const override { return inner_.kind(); }
  size_t record_bytes() const override { return inner_.record_bytes(); }
  bool put(uint64_t key, std::span<const uint8_t> data) override { return inner_.put(key, data); }
  bool get(uint64_t key, std::span<uint8_t> out) override { return inner_.get(key, out); }
  void erase(uint64_t key) override { inner_.erase(key); }
  bool contains(uint64_t key) const override { return inner_.contains(key); }
  void pin(uint64_t key, bool pinned) override { inner_.pin(key, pinned); }
  void put_many(std::span<const uint64_t> keys, std::span<const uint8_t* const> data, std::span<bool> ok) override {
    ++batches;
    largest = std::max(largest, keys.size());
    inner_.put_many(keys, data, ok);
  }
  ColdTierStats stats() const override { return inner_.stats(); }
  int batches = 0;
  size_t largest = 0;

 private:
  HostColdTier inner_;
};

// An event that evicts more than EvictedKv::kStageBytes goes to the tier in batches no larger than the
// stage, and every slot still comes back bit-exact: a long prompt's first event is not staged whole.
TEST(EvictedKvStage, AnEventLargerThanTheStageIsWrittenInBatches) {
  PoolConfig c;
  c.page_size = 16;
  c.head_dim = 128;
  c.kv_type = DType::F16;
  const size_t per_stage = EvictedKv::kStageBytes / (2 * 16 * 128 * 2 + 16 * 4);  // records that fit the stage
  const int32_t n = static_cast<int32_t>((per_stage + per_stage / 2) * 16 + 16);       // one stream: 1.5 stages
  c.max_pages = n / 16 + 4;
  PagePool pool(c);
  ASSERT_EQ(pool.record_bytes(), 2 * 16 * 128 * 2 + 16 * 4);
  CountingTier tier(static_cast<uint64_t>(c.max_pages) * pool.record_bytes(), pool.record_bytes());
  SequenceKv kv(pool, 1, 1);
  ASSERT_TRUE(kv.append(n, 0));
  const size_t row = pool.slot_bytes();
  for (int32_t j = 0; j < n; ++j)  // each slot's bytes name it
    for (size_t b = 0; b < row; b += 4) {
      std::memcpy(kv.k_slot(0, j) + b, &j, 4);
      const int32_t w = ~j;
      std::memcpy(kv.v_slot(0, j) + b, &w, 4);
    }
  std::vector<int32_t> keep;
  for (int32_t j = 0; j < 16; ++j) keep.push_back(j);  // the first page stays, everything else goes down
  EvictedKv ev(tier, pool, 3, 1);
  ev.add(kv, 0, keep);
  ev.commit();
  EXPECT_EQ(tier.batches, 2);
  EXPECT_LE(tier.largest * pool.record_bytes(), EvictedKv::kStageBytes);
  ASSERT_EQ(ev.stats().slots_written, n - 16);
  EXPECT_EQ(ev.stats().pages_lost, 0);
  std::vector<uint8_t> record(pool.record_bytes());
  int32_t want = 16;
  for (int32_t p = 0; p < static_cast<int32_t>(ev.pages(0).size()); ++p) {
    ASSERT_TRUE(ev.read(0, p, record)) << p;
    for (int32_t j = 0; j < ev.pages(0)[static_cast<size_t>(p)].n_slots; ++j, ++want) {
      int32_t k = 0, v = 0;
      std::memcpy(&k, record.data() + static_cast<size_t>(j) * row + row - 4, 4);
      std::memcpy(&v, record.data() + pool.v_offset() + static_cast<size_t>(j) * row, 4);
      ASSERT_EQ(k, want) << p << " " << j;
      ASSERT_EQ(v, ~want) << p << " " << j;
    }
  }
  EXPECT_EQ(want, n);
}

class EvictedKvTest : public ::testing::TestWithParam<std::tuple<DType, std::string>> {
 protected:
  std::unique_ptr<ColdTier> make_tier(const PagePool& pool, int64_t records) {
    if (std::get<1>(GetParam()) == "host") return std::make_unique<HostColdTier>(records * pool.record_bytes(), pool.record_bytes());
    return std::make_unique<FileColdTier>(dir_.path(), records * (sizeof(FileColdTier::SlotHeader) + pool.record_bytes()),
                                          pool.record_bytes());
  }
  testing_cold::TempDir dir_;
};

// Two compression events on three streams: every evicted slot comes back from the tier, bit-exact, in
// token order, packed page_size per record (the last of an event partial, its unused positions -1).
TEST_P(EvictedKvTest, EvictedSlotsComeBackBitExactInTokenOrder) {
  PagePool pool(pool_config(std::get<0>(GetParam())));
  auto tier = make_tier(pool, 200);
  constexpr int32_t kStreams = 3;
  auto kv = random_sequence(pool, kStreams, 61, 1);
  EvictedKv ev(*tier, pool, 7, kStreams);
  std::mt19937 rng(5);
  std::vector<std::vector<SlotBytes>> expected(kStreams);
  for (int event = 0; event < 2; ++event) {
    for (int32_t s = 0; s < kStreams; ++s) {
      const int32_t n = kv->n_slots(s);
      const auto keep = random_keep(n, n / 2 - s, rng);  // different lengths per stream
      for (auto& b : slots_of(*kv, s, complement(n, keep))) expected[static_cast<size_t>(s)].push_back(std::move(b));
      ev.add(*kv, s, keep);
      kv->compact_stream(s, keep);
    }
    ev.commit();
  }
  tier->flush();
  std::vector<uint8_t> record(pool.record_bytes());
  const size_t row = pool.slot_bytes();
  const size_t pos_off = pool.record_bytes() - sizeof(int32_t) * kPage;
  int64_t slots = 0;
  for (int32_t s = 0; s < kStreams; ++s) {
    size_t next = 0;  // into expected[s]
    for (int32_t p = 0; p < static_cast<int32_t>(ev.pages(s).size()); ++p) {
      const EvictedPage& page = ev.pages(s)[static_cast<size_t>(p)];
      ASSERT_FALSE(page.lost);
      ASSERT_GE(page.n_slots, 1);
      ASSERT_LE(page.n_slots, kPage);
      ASSERT_TRUE(ev.read(s, p, record));
      const auto* pos = reinterpret_cast<const int32_t*>(record.data() + pos_off);
      for (int32_t j = 0; j < kPage; ++j) {
        if (j >= page.n_slots) {
          EXPECT_EQ(pos[j], -1);
          continue;
        }
        const SlotBytes& want = expected[static_cast<size_t>(s)][next++];
        EXPECT_EQ(0, std::memcmp(record.data() + static_cast<size_t>(j) * row, want.k.data(), row)) << s << " " << p << " " << j;
        EXPECT_EQ(0, std::memcmp(record.data() + pool.v_offset() + static_cast<size_t>(j) * row, want.v.data(), row));
        EXPECT_EQ(pos[j], want.pos);
        if (j > 0) EXPECT_LT(pos[j - 1], pos[j]);  // token order within a page
      }
      EXPECT_EQ(page.first_pos, pos[0]);
      EXPECT_EQ(page.last_pos, pos[page.n_slots - 1]);
      slots += page.n_slots;
    }
    EXPECT_EQ(next, expected[static_cast<size_t>(s)].size());
  }
  EXPECT_EQ(ev.stats().slots_written, slots);
  EXPECT_EQ(ev.stats().pages_lost, 0);
  EXPECT_EQ(ev.stats().digest_bytes, static_cast<uint64_t>(ev.stats().pages_written) * 2 * kHeadDim * sizeof(uint16_t));
}

// The digest bound: for random queries, no slot of a page has q.k above upper_bound(page), and the bound
// of a one-slot page is that slot's q.k: exactly (to float rounding) where the key is an f16 value (F16
// KV), within the f16 widening of its box otherwise (each element at most 2^-10 of itself away).
TEST_P(EvictedKvTest, DigestBoundsEveryKeyOfItsPage) {
  PagePool pool(pool_config(std::get<0>(GetParam())));
  auto tier = make_tier(pool, 100);
  auto kv = random_sequence(pool, 1, 80, 2);
  EvictedKv ev(*tier, pool, 1, 1);
  std::mt19937 rng(9);
  const auto keep = random_keep(80, 23, rng);
  const auto gone = complement(80, keep);
  const auto expected = slots_of(*kv, 0, gone);
  ev.add(*kv, 0, keep);
  kv->compact_stream(0, keep);
  ev.commit();
  // A one-slot page as well: evict exactly one more slot.
  std::vector<int32_t> keep2;
  for (int32_t j = 1; j < kv->n_slots(0); ++j) keep2.push_back(j);
  auto expected_one = slots_of(*kv, 0, {0});
  ev.add(*kv, 0, keep2);
  kv->compact_stream(0, keep2);
  ev.commit();
  ASSERT_EQ(ev.pages(0).back().n_slots, 1);

  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> q(kHeadDim);
  for (int trial = 0; trial < 200; ++trial) {
    for (float& x : q) x = dist(rng);
    size_t next = 0;
    for (int32_t p = 0; p + 1 < static_cast<int32_t>(ev.pages(0).size()); ++p) {
      const float bound = ev.upper_bound(0, p, q.data());
      for (int32_t j = 0; j < ev.pages(0)[static_cast<size_t>(p)].n_slots; ++j) {
        const auto& k = expected[next++].k_decoded;
        double dot = 0;
        for (int i = 0; i < kHeadDim; ++i) dot += static_cast<double>(q[static_cast<size_t>(i)]) * k[static_cast<size_t>(i)];
        EXPECT_LE(dot, bound + 1e-4 * (1 + std::abs(bound))) << "page " << p << " slot " << j;
      }
    }
    EXPECT_EQ(next, expected.size());
    double dot = 0, slack = 0;
    for (int i = 0; i < kHeadDim; ++i) {
      const double qk = static_cast<double>(q[static_cast<size_t>(i)]) * expected_one[0].k_decoded[static_cast<size_t>(i)];
      dot += qk;
      slack += std::abs(qk) * 0x1p-10 + std::abs(q[static_cast<size_t>(i)]) * 0x1p-24;  // f16 ulp: relative, or subnormal
    }
    const float one = ev.upper_bound(0, static_cast<int32_t>(ev.pages(0).size()) - 1, q.data());
    if (std::get<0>(GetParam()) == DType::F16) {
      EXPECT_NEAR(one, dot, 1e-4 * (1 + std::abs(dot)));
    } else {
      EXPECT_GE(one, dot - 1e-4 * (1 + std::abs(dot)));
      EXPECT_LE(one, dot + slack + 1e-4 * (1 + std::abs(dot)));
    }
  }
}

// A tier full of pinned records refuses the puts: the pages are lost (counted) and reads say so; a record
// the tier later drops (LRU) is a lost page on read, never other bytes. The destructor erases the rest.
TEST_P(EvictedKvTest, RefusedAndDroppedRecordsAreLostPagesNotWrongBytes) {
  PagePool pool(pool_config(std::get<0>(GetParam())));
  auto tier = make_tier(pool, 6);
  std::vector<uint8_t> filler(pool.record_bytes(), 0x33);
  for (uint64_t k = 0; k < 6; ++k) {
    ASSERT_TRUE(tier->put(k, filler));
    tier->pin(k, true);
  }
  auto kv = random_sequence(pool, 1, 40, 3);
  std::vector<uint8_t> record(pool.record_bytes());
  {
    EvictedKv ev(*tier, pool, 2, 1);
    std::vector<int32_t> keep = {0, 1, 2, 3};
    ev.add(*kv, 0, keep);
    kv->compact_stream(0, keep);
    ev.commit();
    ASSERT_FALSE(ev.pages(0).empty());
    for (const EvictedPage& p : ev.pages(0)) EXPECT_TRUE(p.lost);
    EXPECT_EQ(ev.stats().pages_written, 0);
    EXPECT_EQ(ev.stats().pages_refused, static_cast<int64_t>(ev.pages(0).size()));
    EXPECT_FALSE(ev.read(0, 0, record));
  }
  for (uint64_t k = 0; k < 6; ++k) tier->pin(k, false);
  auto kv2 = random_sequence(pool, 1, 64, 4);
  EvictedKv ev(*tier, pool, 3, 1);
  std::vector<int32_t> keep = {0, 1, 2, 3, 4, 5, 6, 7};
  ev.add(*kv2, 0, keep);  // 56 slots: 7 pages, one more than the tier holds
  kv2->compact_stream(0, keep);
  ev.commit();
  tier->flush();
  int64_t readable = 0, lost = 0;
  for (int32_t p = 0; p < static_cast<int32_t>(ev.pages(0).size()); ++p) {
    if (ev.read(0, p, record)) {
      ++readable;
      EXPECT_NE(0, std::memcmp(record.data(), filler.data(), 16));  // never the other records' bytes
    } else {
      ++lost;
      EXPECT_TRUE(ev.pages(0)[static_cast<size_t>(p)].lost);
    }
  }
  EXPECT_EQ(readable + lost, 7);
  EXPECT_GE(lost, 1);
  EXPECT_EQ(ev.stats().pages_lost, lost);
  ev.clear();
  EXPECT_EQ(tier->stats().records, 0u);  // clear() (and the destructor) give the space back
}

// The recall exchange at the KV level: a cold page's slots come back into the hot stream by
// splice_stream, merged in position order, while as many kept slots go down; every slot then holds the
// exact rows of its position, and a shared page before the first change is left untouched.
// The batched read (recall's one tier call per check) returns what read() returns page by page: the same
// bytes for pages the tier holds, false and a lost page for one it dropped, without asking the tier for a
// page already lost.
TEST_P(EvictedKvTest, ReadManyReturnsWhatReadReturnsPageByPage) {
  PagePool pool(pool_config(std::get<0>(GetParam())));
  auto tier = make_tier(pool, 64);
  auto kv = random_sequence(pool, 2, 64, 5);
  EvictedKv ev(*tier, pool, 4, 2);
  const std::vector<int32_t> keep = {0, 1, 2, 3, 60, 61, 62, 63};
  for (int32_t s = 0; s < 2; ++s) {
    ev.add(*kv, s, keep);
    kv->compact_stream(s, keep);
  }
  ev.commit();
  tier->flush();
  const size_t rec = pool.record_bytes();
  std::vector<EvictedKv::PageRef> refs;
  for (int32_t s = 1; s >= 0; --s)  // any order, streams interleaved
    for (int32_t p = 0; p < static_cast<int32_t>(ev.pages(s).size()); ++p) refs.push_back({s, p});
  ASSERT_GE(refs.size(), 4u);
  tier->erase(ev.pages(0)[1].key);  // dropped by the tier: a miss
  std::vector<uint8_t> batch(refs.size() * rec), one(rec);
  std::vector<uint8_t*> out;
  for (size_t i = 0; i < refs.size(); ++i) out.push_back(batch.data() + i * rec);
  const std::span<const bool> ok = ev.read_many(refs, out);
  ASSERT_EQ(ok.size(), refs.size());
  int64_t hits = 0;
  for (size_t i = 0; i < refs.size(); ++i) {
    const bool dropped = refs[i].stream == 0 && refs[i].page == 1;
    EXPECT_EQ(ok[i], !dropped) << "ref " << i;
    if (dropped) {
      EXPECT_TRUE(ev.pages(0)[1].lost);
      continue;
    }
    ++hits;
    ASSERT_TRUE(ev.read(refs[i].stream, refs[i].page, one));
    EXPECT_EQ(0, std::memcmp(one.data(), out[i], rec)) << "ref " << i;
  }
  EXPECT_EQ(ev.stats().pages_lost, 1);
  EXPECT_EQ(ev.stats().pages_read, 2 * hits);  // the batch and the page-by-page reads
  const uint64_t gets = tier->stats().gets;
  const std::span<const bool> again = ev.read_many(std::span(refs).subspan(0, 0), {});
  EXPECT_TRUE(again.empty());
  std::vector<EvictedKv::PageRef> lost_only = {{0, 1}};
  std::vector<uint8_t*> lost_out = {one.data()};
  EXPECT_FALSE(ev.read_many(lost_only, lost_out)[0]);
  EXPECT_EQ(tier->stats().gets, gets);  // a lost page is not asked for again
  EXPECT_EQ(ev.stats().pages_lost, 1);
}

// add_many over a thread pool is add() stream by stream: the same pages (keys, slot counts, positions),
// the same digests and the same record bytes in the tier, over two events on five streams with random
// keep sets (some streams keep everything, one evicts all but one slot).
TEST_P(EvictedKvTest, AddManyOnAPoolIsAddStreamByStream) {
  PagePool pool_a(pool_config(std::get<0>(GetParam()))), pool_b(pool_config(std::get<0>(GetParam())));
  auto tier_a = make_tier(pool_a, 200);
  HostColdTier tier_b(200 * pool_b.record_bytes(), pool_b.record_bytes());
  constexpr int32_t kStreams = 5;
  auto kv_a = random_sequence(pool_a, kStreams, 40, 11);
  auto kv_b = random_sequence(pool_b, kStreams, 40, 11);
  EvictedKv ev_a(*tier_a, pool_a, 9, kStreams), ev_b(tier_b, pool_b, 9, kStreams);
  ThreadPool threads(2);
  std::mt19937 rng(17);
  for (int event = 0; event < 2; ++event) {
    std::vector<std::vector<int32_t>> keeps(kStreams);
    std::vector<int32_t> streams;
    for (int32_t s = 0; s < kStreams; ++s) {
      const int32_t n = kv_a->n_slots(s);
      const int32_t k = s == 1 ? n : s == 3 ? 1 : std::max<int32_t>(1, n / (2 + s));
      keeps[static_cast<size_t>(s)] = random_keep(n, k, rng);
      streams.push_back(s);
    }
    std::vector<std::span<const int32_t>> spans(keeps.begin(), keeps.end());
    for (int32_t s = 0; s < kStreams; ++s) ev_a.add(*kv_a, s, keeps[static_cast<size_t>(s)]);
    ev_b.add_many(*kv_b, streams, spans, &threads);
    for (int32_t s = 0; s < kStreams; ++s) {
      kv_a->compact_stream(s, keeps[static_cast<size_t>(s)]);
      kv_b->compact_stream(s, keeps[static_cast<size_t>(s)]);
    }
    ev_a.commit();
    ev_b.commit();
    ASSERT_TRUE(kv_a->append(13, 200 + 13 * event));  // fresh slots for the next event, the same bytes in both
    ASSERT_TRUE(kv_b->append(13, 200 + 13 * event));
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> row(kHeadDim);
    for (int32_t s = 0; s < kStreams; ++s)
      for (int32_t j = kv_a->n_slots(s) - 13; j < kv_a->n_slots(s); ++j) {
        for (float& x : row) x = dist(rng);
        kernels::kv_encode_row(row.data(), pool_a.config().kv_type, kHeadDim, kv_a->k_slot(s, j));
        kernels::kv_encode_row(row.data(), pool_b.config().kv_type, kHeadDim, kv_b->k_slot(s, j));
        kernels::kv_encode_row(row.data(), pool_a.config().kv_type, kHeadDim, kv_a->v_slot(s, j));
        kernels::kv_encode_row(row.data(), pool_b.config().kv_type, kHeadDim, kv_b->v_slot(s, j));
      }
  }
  tier_a->flush();
  std::vector<uint8_t> rec_a(pool_a.record_bytes()), rec_b(pool_b.record_bytes());
  EXPECT_EQ(ev_a.stats().slots_written, ev_b.stats().slots_written);
  EXPECT_GT(ev_b.stats().slots_written, 0);
  for (int32_t s = 0; s < kStreams; ++s) {
    ASSERT_EQ(ev_a.pages(s).size(), ev_b.pages(s).size()) << s;
    for (int32_t p = 0; p < static_cast<int32_t>(ev_a.pages(s).size()); ++p) {
      const EvictedPage& a = ev_a.pages(s)[static_cast<size_t>(p)];
      const EvictedPage& b = ev_b.pages(s)[static_cast<size_t>(p)];
      EXPECT_EQ(a.key, b.key);
      EXPECT_EQ(a.n_slots, b.n_slots);
      EXPECT_EQ(a.first_pos, b.first_pos);
      EXPECT_EQ(a.last_pos, b.last_pos);
      const auto da = ev_a.digest(s, p), db = ev_b.digest(s, p);
      EXPECT_TRUE(std::equal(da.begin(), da.end(), db.begin(), db.end())) << s << " " << p;
      ASSERT_TRUE(ev_a.read(s, p, rec_a));
      ASSERT_TRUE(ev_b.read(s, p, rec_b));
      EXPECT_EQ(0, std::memcmp(rec_a.data(), rec_b.data(), rec_a.size())) << s << " " << p;
    }
  }
}

TEST_P(EvictedKvTest, SpliceBringsSlotsBackInPositionOrderWithTheirOwnRows) {
  PagePool pool(pool_config(std::get<0>(GetParam())));
  auto tier = make_tier(pool, 64);
  auto kv = random_sequence(pool, 1, 48, 6);
  // The original rows by position, to check against at the end.
  std::vector<int32_t> all(48);
  for (int32_t j = 0; j < 48; ++j) all[static_cast<size_t>(j)] = j;
  const auto original = slots_of(*kv, 0, all);
  const PageId first_page = kv->page_table(0)[0];
  pool.retain(first_page);  // another holder: the page is shared (read-only)
  EvictedKv ev(*tier, pool, 4, 1);
  std::vector<int32_t> keep;  // keep the first page whole, then every third slot
  for (int32_t j = 0; j < 48; ++j)
    if (j < kPage || j % 3 == 0) keep.push_back(j);
  ev.add(*kv, 0, keep);
  kv->compact_stream(0, keep);
  ev.commit();
  tier->flush();
  // Bring the second cold page back, sending down the same number of kept slots from the end.
  std::vector<uint8_t> record(pool.record_bytes());
  ASSERT_TRUE(ev.read(0, 1, record));
  const EvictedPage page = ev.pages(0)[1];
  const size_t pos_off = pool.record_bytes() - sizeof(int32_t) * kPage;
  std::vector<SequenceKv::InsertedSlot> insert;
  for (int32_t j = 0; j < page.n_slots; ++j)
    insert.push_back({record.data() + static_cast<size_t>(j) * pool.slot_bytes(),
                      record.data() + pool.v_offset() + static_cast<size_t>(j) * pool.slot_bytes(),
                      reinterpret_cast<const int32_t*>(record.data() + pos_off)[j]});
  const int32_t n = kv->n_slots(0);
  std::vector<int32_t> keep2;
  for (int32_t j = 0; j < n - page.n_slots; ++j) keep2.push_back(j);
  ev.add(*kv, 0, keep2);
  ASSERT_TRUE(kv->splice_stream(0, keep2, insert));
  ev.forget(0, 1);
  ev.commit();
  EXPECT_EQ(kv->n_slots(0), n);
  EXPECT_EQ(kv->page_table(0)[0], first_page);  // untouched: the change starts after it
  const size_t row = pool.slot_bytes();
  for (int32_t j = 0; j < n; ++j) {
    const int32_t pos = kv->position(0, j);
    if (j > 0) EXPECT_LT(kv->position(0, j - 1), pos);
    const SlotBytes& want = original[static_cast<size_t>(pos - 100)];  // random_sequence starts at 100
    EXPECT_EQ(0, std::memcmp(kv->k_slot(0, j), want.k.data(), row)) << j;
    EXPECT_EQ(0, std::memcmp(kv->v_slot(0, j), want.v.data(), row)) << j;
  }
  EXPECT_TRUE(ev.pages(0)[1].recalled);
  EXPECT_FALSE(ev.read(0, 1, record));  // recalled pages are not recallable twice
  pool.release(first_page);
}

INSTANTIATE_TEST_SUITE_P(TypesAndTiers, EvictedKvTest,
                         ::testing::Combine(::testing::Values(DType::F32, DType::F16, DType::BF16, DType::Q8_0),
                                            ::testing::Values(std::string("host"), std::string("dir"))),
                         [](const auto& info) {
                           return std::string(kernels::kv_type_name(std::get<0>(info.param))) + "_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace kvpack::kv
