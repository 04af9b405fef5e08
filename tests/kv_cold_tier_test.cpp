// The cold KV tier (kv/cold_tier.h): both backends against the contract, the host backend's memory, the
// slot index, spec parsing, the bandwidth probes. The file backend's on-disk behaviour (coalescing,
// corruption, truncation, a killed process's leftovers, write errors) is in kv_cold_tier_file_test.cpp.
// Files live in a mkdtemp directory under /tmp, removed at the end. No wall-clock assertions.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kv/cold_tier.h"
#include "kv/cold_tier_file.h"
#include "kv/cold_tier_host.h"
#include "kv/cold_tier_index.h"
#include <xxhash.h>
#include "kv_cold_tier_util.h"

namespace kvpack::kv {
namespace {

using namespace testing_cold;
namespace fs = std::filesystem;

constexpr size_t kRecordBytes = 8192 + 64;  // a f16 page plus its positions: not a power of two on purpose
constexpr size_t kFileSlotBytes = sizeof(FileColdTier::SlotHeader) + kRecordBytes;

// Both backends, built for a cap of exactly `records` records.
class ColdTierContract : public ::testing::TestWithParam<std::string> {
 protected:
  // "host" and "dir" with their defaults; "host-threads" splits batches over 3 threads and "dir-1reader"
  // reads with the caller alone (the batched paths with and without parallel parts); "dir-direct" reads
  // every run with O_DIRECT, "dir-buffered" none.
  std::unique_ptr<ColdTier> make(int64_t records, size_t record_bytes = kRecordBytes, FileTierOptions opts = {}) {
    if (GetParam() == "host") return std::make_unique<HostColdTier>(records * record_bytes, record_bytes);
    if (GetParam() == "host-threads") return std::make_unique<HostColdTier>(records * record_bytes, record_bytes, 3);
    if (GetParam() == "dir-1reader") opts.read_threads = 1;
    if (GetParam() == "dir-direct") opts.direct_even_if_cached = true;  // every read around the page cache
    if (GetParam() == "dir-buffered") opts.direct_reads = false;       // every read through it
    return std::make_unique<FileColdTier>(dir_.path() + "/tier", records * (sizeof(FileColdTier::SlotHeader) + record_bytes),
                                          record_bytes, opts);
  }
  static bool get_equals(ColdTier& t, uint64_t key, const std::vector<uint8_t>& expected) {
    std::vector<uint8_t> out(t.record_bytes());
    return t.get(key, out) && out == expected;
  }
  TempDir dir_;
};

TEST_P(ColdTierContract, RoundTripOfManyRecordsIsBitExact) {
  auto tier = make(600);
  for (uint64_t k = 0; k < 500; ++k) ASSERT_TRUE(tier->put(k * 7919, make_record(k * 7919, 1, kRecordBytes)));
  tier->flush();
  for (uint64_t k = 0; k < 500; ++k) EXPECT_TRUE(get_equals(*tier, k * 7919, make_record(k * 7919, 1, kRecordBytes))) << k;
  const ColdTierStats st = tier->stats();
  EXPECT_EQ(st.puts, 500u);
  EXPECT_EQ(st.put_failures, 0u);
  EXPECT_EQ(st.records, 500u);
  EXPECT_EQ(st.used_bytes, 500u * kRecordBytes);
  EXPECT_EQ(st.gets, 500u);
  EXPECT_EQ(st.hits, 500u);
  EXPECT_EQ(st.misses, 0u);
  EXPECT_EQ(st.evictions, 0u);
  EXPECT_EQ(st.bytes_written, 500u * kRecordBytes);
  EXPECT_EQ(st.bytes_read, 500u * kRecordBytes);
  EXPECT_STREQ(tier->kind(), GetParam().starts_with("host") ? "host" : "dir");
  EXPECT_EQ(tier->record_bytes(), kRecordBytes);
}

TEST_P(ColdTierContract, EvictsLeastRecentlyUsedAtTheCap) {
  auto tier = make(8);
  for (uint64_t k = 0; k < 8; ++k) ASSERT_TRUE(tier->put(k, make_record(k, 0, kRecordBytes)));
  ASSERT_TRUE(get_equals(*tier, 0, make_record(0, 0, kRecordBytes)));  // 0 and 3 become recent
  ASSERT_TRUE(get_equals(*tier, 3, make_record(3, 0, kRecordBytes)));
  ASSERT_TRUE(tier->put(5, make_record(5, 1, kRecordBytes)));           // a replacement is a use too
  for (uint64_t k = 100; k < 104; ++k) ASSERT_TRUE(tier->put(k, make_record(k, 0, kRecordBytes)));
  // LRU order was 1 2 4 6 7 0 3 5: the four oldest go.
  for (uint64_t k : {1, 2, 4, 6}) EXPECT_FALSE(tier->contains(k)) << k;
  for (uint64_t k : {7, 0, 3, 5, 100, 101, 102, 103}) EXPECT_TRUE(tier->contains(k)) << k;
  EXPECT_TRUE(get_equals(*tier, 5, make_record(5, 1, kRecordBytes)));
  const ColdTierStats st = tier->stats();
  EXPECT_EQ(st.evictions, 4u);
  EXPECT_EQ(st.records, 8u);
  EXPECT_EQ(st.put_failures, 0u);
}

TEST_P(ColdTierContract, PinnedRecordsSurvivePressureAndAFullyPinnedTierFailsCleanly) {
  auto tier = make(4);
  for (uint64_t k = 0; k < 4; ++k) ASSERT_TRUE(tier->put(k, make_record(k, 0, kRecordBytes)));
  tier->pin(0, true);
  tier->pin(1, true);
  for (uint64_t k = 10; k < 20; ++k) ASSERT_TRUE(tier->put(k, make_record(k, 0, kRecordBytes)));
  EXPECT_TRUE(get_equals(*tier, 0, make_record(0, 0, kRecordBytes)));
  EXPECT_TRUE(get_equals(*tier, 1, make_record(1, 0, kRecordBytes)));
  tier->pin(18, true);
  tier->pin(19, true);
  const ColdTierStats before = tier->stats();
  EXPECT_FALSE(tier->put(77, make_record(77, 0, kRecordBytes)));  // everything pinned
  EXPECT_FALSE(tier->contains(77));
  EXPECT_TRUE(tier->put(18, make_record(18, 1, kRecordBytes)));   // replacing a pinned record needs no room
  ColdTierStats st = tier->stats();
  EXPECT_EQ(st.put_failures, before.put_failures + 1);
  EXPECT_EQ(st.records, 4u);
  EXPECT_EQ(st.evictions, before.evictions);
  tier->erase(0);  // erase removes pinned records
  EXPECT_FALSE(tier->contains(0));
  EXPECT_TRUE(tier->put(77, make_record(77, 0, kRecordBytes)));
  tier->pin(1, false);  // unpinned: evictable again (and the only candidate besides 77)
  tier->pin(77, true);
  EXPECT_TRUE(tier->put(78, make_record(78, 0, kRecordBytes)));
  EXPECT_FALSE(tier->contains(1));
  EXPECT_TRUE(get_equals(*tier, 18, make_record(18, 1, kRecordBytes)));  // the replacement stayed pinned
  st = tier->stats();
  EXPECT_EQ(st.records, 4u);
}

TEST_P(ColdTierContract, EraseContainsAndReplace) {
  auto tier = make(16);
  EXPECT_FALSE(tier->contains(42));
  tier->erase(42);  // absent: no-op
  ASSERT_TRUE(tier->put(42, make_record(42, 1, kRecordBytes)));
  EXPECT_TRUE(tier->contains(42));
  ASSERT_TRUE(tier->put(42, make_record(42, 2, kRecordBytes)));
  EXPECT_EQ(tier->stats().records, 1u);
  EXPECT_TRUE(get_equals(*tier, 42, make_record(42, 2, kRecordBytes)));
  tier->flush();
  EXPECT_TRUE(get_equals(*tier, 42, make_record(42, 2, kRecordBytes)));
  tier->erase(42);
  EXPECT_FALSE(tier->contains(42));
  std::vector<uint8_t> out(kRecordBytes);
  EXPECT_FALSE(tier->get(42, out));
  const ColdTierStats st = tier->stats();
  EXPECT_EQ(st.records, 0u);
  EXPECT_EQ(st.used_bytes, 0u);
  EXPECT_EQ(st.gets, 3u);
  EXPECT_EQ(st.hits, 2u);
  EXPECT_EQ(st.misses, 1u);
  EXPECT_EQ(st.checksum_failures, 0u);
}

TEST_P(ColdTierContract, GetManyOnConsecutiveAndScatteredKeys) {
  auto tier = make(64);
  std::vector<uint64_t> keys;
  std::vector<std::vector<uint8_t>> records;
  for (uint64_t k = 1000; k < 1032; ++k) {
    keys.push_back(k);
    records.push_back(make_record(k, 3, kRecordBytes));
  }
  std::vector<const uint8_t*> data;
  for (const auto& r : records) data.push_back(r.data());
  bool ok[32];
  tier->put_many(keys, data, ok);
  for (bool b : ok) ASSERT_TRUE(b);
  tier->flush();

  // Scattered, shuffled, with an absent key and a duplicate.
  std::vector<uint64_t> want = {1031, 1000, 5, 1017, 1003, 1017, 1020};
  std::vector<std::vector<uint8_t>> out(want.size(), std::vector<uint8_t>(kRecordBytes));
  std::vector<uint8_t*> out_ptrs;
  for (auto& o : out) out_ptrs.push_back(o.data());
  bool got[7];
  tier->get_many(want, out_ptrs, got);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i], want[i] != 5) << want[i];
    if (got[i]) {
      EXPECT_EQ(out[i], make_record(want[i], 3, kRecordBytes)) << want[i];
    }
  }
  // All of them, consecutive.
  std::vector<std::vector<uint8_t>> all(keys.size(), std::vector<uint8_t>(kRecordBytes));
  std::vector<uint8_t*> all_ptrs;
  for (auto& o : all) all_ptrs.push_back(o.data());
  bool all_ok[32];
  tier->get_many(keys, all_ptrs, all_ok);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_TRUE(all_ok[i]);
    EXPECT_EQ(all[i], records[i]);
  }
  EXPECT_THROW(tier->get_many(keys, std::span(all_ptrs).first(3), all_ok), std::invalid_argument);
  std::vector<uint8_t> short_record(kRecordBytes - 1);
  EXPECT_THROW(tier->put(1, short_record), std::invalid_argument);  // a caller bug, not a miss
  EXPECT_THROW(tier->get(1000, short_record), std::invalid_argument);
}

// Several threads put / get / get_many / erase / pin at random under a cap that forces evictions.
// Each thread owns the keys k % kThreads == t, so for its own keys "the bytes last put" is well defined:
// a hit must return exactly them. Any hit on any key must be a record that was put under that key.
TEST_P(ColdTierContract, ConcurrentUseNeverReturnsWrongBytes) {
  constexpr int kThreads = 4;
  constexpr uint64_t kKeys = 256;
  constexpr size_t kBytes = 1024;
  FileTierOptions small_stage;
  small_stage.staging_bytes = 8 * (kBytes + 32);  // so puts also wait for the writer
  auto tier = make(48, kBytes, small_stage);
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1234 + t);
      std::map<uint64_t, uint64_t> last;  // own key -> counter of the record last put (absent: none stored)
      std::vector<uint64_t> pinned;
      uint64_t counter = 0;
      std::vector<uint8_t> out(kBytes);
      auto own_key = [&] { return (rng() % (kKeys / kThreads)) * kThreads + static_cast<uint64_t>(t); };
      auto fail = [&](const std::string& what) { if (failures[t].empty()) failures[t] = what; };
      for (int op = 0; op < 4000 && failures[t].empty(); ++op) {
        const int what = static_cast<int>(rng() % 10);
        if (what < 4) {
          const uint64_t k = own_key();
          if (tier->put(k, make_record(k, ++counter, kBytes))) last[k] = counter; else last.erase(k);
        } else if (what < 7) {
          const uint64_t k = own_key();
          const bool hit = tier->get(k, out);
          if (hit && (!last.contains(k) || out != make_record(k, last[k], kBytes))) fail("wrong bytes for own key");
        } else if (what == 7) {
          uint64_t keys[4];
          std::vector<std::vector<uint8_t>> outs(4, std::vector<uint8_t>(kBytes));
          uint8_t* ptrs[4];
          bool ok[4];
          for (int i = 0; i < 4; ++i) keys[i] = rng() % kKeys, ptrs[i] = outs[i].data();
          tier->get_many(keys, ptrs, ok);
          for (int i = 0; i < 4; ++i) {
            if (ok[i] && !self_consistent(keys[i], outs[i])) fail("get_many returned a record of another key");
          }
        } else if (what == 8) {
          const uint64_t k = own_key();
          if (rng() % 2 == 0) {
            tier->erase(k);
          } else {  // take: a hit must be the bytes last put, and the key is gone afterwards
            uint8_t* ptr = out.data();
            bool hit = false;
            tier->take_many({&k, 1}, {&ptr, 1}, {&hit, 1});
            if (hit && (!last.contains(k) || out != make_record(k, last[k], kBytes))) fail("take_many: wrong bytes");
            if (tier->contains(k)) fail("take_many left the record");
          }
          last.erase(k);
        } else {
          const uint64_t k = own_key();
          tier->pin(k, true);
          pinned.push_back(k);
          if (pinned.size() > 2) {
            tier->pin(pinned.front(), false);
            pinned.erase(pinned.begin());
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
  tier->flush();
  const ColdTierStats st = tier->stats();
  EXPECT_GT(st.evictions, 0u);
  EXPECT_EQ(st.checksum_failures, 0u);  // races are plain misses, never "corruption"
  EXPECT_EQ(st.hits + st.misses, st.gets);
  EXPECT_LE(st.records, 48u);
}

// put_many / take_many of a batch large enough to be cut into parallel parts (a swap of ~300 pages).
TEST_P(ColdTierContract, BatchesRoundTripAndTakeManyErasesWhatItReturns) {
  constexpr size_t kBatch = 300;
  auto tier = make(400);
  std::vector<uint64_t> keys;
  std::vector<std::vector<uint8_t>> records;
  for (uint64_t k = 0; k < kBatch; ++k) {
    keys.push_back(k * 31 + 5);
    records.push_back(make_record(keys.back(), 9, kRecordBytes));
  }
  std::vector<const uint8_t*> data;
  for (const auto& r : records) data.push_back(r.data());
  std::unique_ptr<bool[]> ok(new bool[kBatch + 2]);
  tier->put_many(keys, data, {ok.get(), kBatch});
  for (size_t i = 0; i < kBatch; ++i) ASSERT_TRUE(ok[i]) << i;
  tier->flush();
  // Take all but the first ten, plus an absent key and (at the end) a duplicate of a taken one.
  std::vector<uint64_t> take(keys.begin() + 10, keys.end());
  take.push_back(999999);
  take.push_back(keys[20]);
  std::vector<std::vector<uint8_t>> out(take.size(), std::vector<uint8_t>(kRecordBytes));
  std::vector<uint8_t*> ptrs;
  for (auto& o : out) ptrs.push_back(o.data());
  tier->take_many(take, ptrs, {ok.get(), take.size()});
  for (size_t i = 0; i + 2 < take.size(); ++i) {
    ASSERT_TRUE(ok[i]) << i;
    EXPECT_EQ(out[i], records[i + 10]) << i;
    EXPECT_FALSE(tier->contains(take[i])) << i;
  }
  EXPECT_FALSE(ok[take.size() - 2]);                                        // absent
  if (ok[take.size() - 1]) EXPECT_EQ(out.back(), records[20]);               // a duplicate: right bytes or a miss
  for (size_t i = 0; i < 10; ++i) EXPECT_TRUE(get_equals(*tier, keys[i], records[i])) << i;  // untouched
  const ColdTierStats st = tier->stats();
  EXPECT_EQ(st.records, 10u);
  EXPECT_EQ(st.checksum_failures, 0u);
  EXPECT_EQ(st.hits + st.misses, st.gets);
}

// A batch larger than the cap: the tier keeps at most the cap, every record it still has holds the bytes
// last put under its key (a key given twice keeps its newer record), and LRU keeps the newest records.
TEST_P(ColdTierContract, PutManyBeyondTheCapKeepsTheNewestWithTheirOwnBytes) {
  auto tier = make(10);
  std::vector<uint64_t> keys;
  std::vector<std::vector<uint8_t>> records;
  for (uint64_t k = 0; k < 25; ++k) {
    keys.push_back(k + 100);
    records.push_back(make_record(k + 100, 1, kRecordBytes));
  }
  keys.push_back(124);  // 124 again, newer bytes
  records.push_back(make_record(124, 2, kRecordBytes));
  std::vector<const uint8_t*> data;
  for (const auto& r : records) data.push_back(r.data());
  bool ok[26];
  tier->put_many(keys, data, ok);
  tier->flush();
  EXPECT_LE(tier->stats().records, 10u);
  for (size_t i = 0; i + 1 < 25; ++i) {
    if (tier->contains(keys[i])) EXPECT_TRUE(get_equals(*tier, keys[i], records[i])) << i;
  }
  EXPECT_TRUE(ok[25]);
  EXPECT_TRUE(get_equals(*tier, 124, records[25]));
  for (uint64_t k = 115; k < 124; ++k) EXPECT_TRUE(tier->contains(k)) << k;  // the nine newest besides 124
}

// A batch larger than cold::kStreamingCopyBytes: copied with streaming stores (host), hashed and copied
// out of a bounce buffer (dir, read direct), and still bit-exact.
TEST_P(ColdTierContract, ABatchLargerThanTheCachesRoundTripsBitExact) {
  const size_t n = cold::kStreamingCopyBytes / kRecordBytes + 40;
  auto tier = make(static_cast<int64_t>(n));
  std::vector<uint64_t> keys(n);
  std::vector<std::vector<uint8_t>> records;
  std::vector<const uint8_t*> data;
  for (size_t i = 0; i < n; ++i) {
    keys[i] = 77 + 3 * i;
    records.push_back(make_record(keys[i], 4, kRecordBytes));
  }
  for (const auto& r : records) data.push_back(r.data());
  std::unique_ptr<bool[]> ok(new bool[n]);
  tier->put_many(keys, data, {ok.get(), n});
  for (size_t i = 0; i < n; ++i) ASSERT_TRUE(ok[i]) << i;
  tier->flush();
  std::vector<std::vector<uint8_t>> out(n, std::vector<uint8_t>(kRecordBytes));
  std::vector<uint8_t*> ptrs;
  for (auto& o : out) ptrs.push_back(o.data());
  tier->take_many(keys, ptrs, {ok.get(), n});
  size_t exact = 0;
  for (size_t i = 0; i < n; ++i) exact += ok[i] && out[i] == records[i];
  EXPECT_EQ(exact, n);
  EXPECT_EQ(tier->stats().records, 0u);
  EXPECT_EQ(tier->stats().checksum_failures, 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, ColdTierContract, ::testing::Values("host", "host-threads", "dir", "dir-1reader", "dir-direct", "dir-buffered"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(HostColdTier, MemoryGrowsWithRecordsAndStaysWithinTheCap) {
  constexpr size_t kCapRecords = 1500;  // more than one 4 MiB slab of 8 KiB records
  HostColdTier tier(kCapRecords * kRecordBytes, kRecordBytes);
  EXPECT_EQ(tier.reserved_bytes(), 0u);
  ASSERT_TRUE(tier.put(1, make_record(1, 0, kRecordBytes)));
  EXPECT_GT(tier.reserved_bytes(), 0u);
  EXPECT_LT(tier.reserved_bytes(), kCapRecords * kRecordBytes);  // one slab, not the cap
  for (uint64_t k = 0; k < 5 * kCapRecords; ++k) ASSERT_TRUE(tier.put(k, make_record(k, 0, kRecordBytes)));
  EXPECT_EQ(tier.reserved_bytes(), kCapRecords * kRecordBytes);  // never beyond the cap
  EXPECT_EQ(tier.stats().records, kCapRecords);
  EXPECT_EQ(tier.stats().evictions, 4 * kCapRecords);
}

TEST(HostColdTier, AStrayWriteIntoARecordIsACountedMissNeverWrongBytes) {
  HostColdTier tier(8 * kRecordBytes, kRecordBytes);
  ASSERT_TRUE(tier.put(7, make_record(7, 0, kRecordBytes)));
  ASSERT_TRUE(tier.put(8, make_record(8, 0, kRecordBytes)));
  tier.record_for_testing(7)[100] ^= 0x40;
  std::vector<uint8_t> out(kRecordBytes);
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(tier.get(7, out));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("checksum mismatch"), std::string::npos) << log;
  EXPECT_FALSE(tier.contains(7));  // dropped
  EXPECT_TRUE(tier.get(8, out));
  const ColdTierStats st = tier.stats();
  EXPECT_EQ(st.checksum_failures, 1u);
  EXPECT_EQ(st.misses, 1u);
  EXPECT_EQ(st.hits, 1u);
  EXPECT_EQ(st.records, 1u);
}

TEST(ColdTierSlotIndex, RandomOperationsKeepListsAndMapConsistent) {
  cold::SlotIndex index(64);
  std::mt19937_64 rng(7);
  for (int op = 0; op < 20000; ++op) {
    const uint64_t key = rng() % 200;
    const cold::Slot s = index.find(key);
    switch (rng() % 4) {
      case 0:
        if (s == cold::kNoSlot) {
          const auto a = index.allocate(key, static_cast<cold::Slot>(rng() % 70) - 3);
          if (a.slot != cold::kNoSlot) {
            ASSERT_EQ(index.find(key), a.slot);
          }
          if (a.evicted) {
            ASSERT_EQ(index.find(a.evicted_key), cold::kNoSlot);
          }
        }
        break;
      case 1: if (s != cold::kNoSlot) index.touch(s); break;
      case 2: if (s != cold::kNoSlot) index.set_pinned(s, rng() % 3 != 0); break;
      case 3: if (s != cold::kNoSlot) index.release(s); break;
    }
    ASSERT_STREQ(index.check(), "") << "after op " << op;
  }
}

TEST(ColdTierSlotIndex, ABatchTakesConsecutiveSlotsWhileTheyAreFree) {
  cold::SlotIndex index(16);
  cold::Slot prev = index.allocate(100, cold::kNoSlot).slot;
  for (uint64_t k = 101; k < 110; ++k) {
    const cold::Slot s = index.allocate(k, prev + 1).slot;
    EXPECT_EQ(s, prev + 1);
    prev = s;
  }
  index.release(index.find(103));  // a recycled slot is preferred only when asked for
  index.release(index.find(104));
  EXPECT_EQ(index.allocate(200, index.find(102) + 1).slot, index.find(102) + 1);
  EXPECT_EQ(index.allocate(201, index.find(200) + 1).slot, index.find(200) + 1);
}

TEST(ColdTierSpec, GoodSpecs) {
  struct Case {
    std::string spec;
    uint64_t cap;
  };
  TempDir dir;
  const std::vector<Case> cases = {
      {"host:256M", 256ull << 20}, {"host:1GiB", 1ull << 30},  {"host:65536", 65536},
      {"host:64k", 64ull << 10},    {"host:3MiB", 3ull << 20},  {"host:1T", 1ull << 40},
      {"host:2tib", 2ull << 40},    {"host:40960B", 40960},     {"dir:" + dir.path() + "/a:2M", 2ull << 20},
      {"dir:" + dir.path() + "/b:c:1MiB", 1ull << 20},  // PATH may hold ':'
  };
  for (const Case& c : cases) {
    std::unique_ptr<ColdTier> tier = make_cold_tier(c.spec, 4096);
    EXPECT_EQ(tier->stats().cap_bytes, c.cap) << c.spec;
    EXPECT_STREQ(tier->kind(), c.spec.starts_with("host") ? "host" : "dir") << c.spec;
  }
  EXPECT_TRUE(fs::is_directory(dir.path() + "/b:c"));  // created
  EXPECT_TRUE(fs::is_empty(dir.path() + "/b:c"));      // and the destroyed tier deleted its data file
}

TEST(ColdTierSpec, BadSpecsNameTheSpecAndTheProblem) {
  TempDir dir;
  std::ofstream(dir.path() + "/plain-file") << "x";
  struct Case {
    std::string spec, message;
  };
  const std::vector<Case> cases = {
      {"dir:/tmp", "--kv-cold 'dir:/tmp' : expected dir:PATH:BYTES"},
      {"dir::1G", "expected dir:PATH:BYTES"},
      {"host", "expected host:BYTES or dir:PATH:BYTES"},
      {"ram:1G", "expected host:BYTES or dir:PATH:BYTES"},
      {"", "expected host:BYTES or dir:PATH:BYTES"},
      {"host:", "BYTES must be an integer"},
      {"host:12MB", "BYTES must be an integer"},
      {"host:1.5G", "BYTES must be an integer"},
      {"host:-1", "BYTES must be an integer"},
      {"host:99999999999999999999", "BYTES must be an integer"},  // overflows 64 bits
      {"host:17179869184T", "BYTES must be an integer"},           // so does the suffix
      {"host:4K", "holds no record of 8192 bytes"},                // cap below one record
      {"dir:" + dir.path() + ":8K", "holds no record of 8192 bytes (plus its header)"},
      {"dir:" + dir.path() + "/plain-file/sub:1M", dir.path() + "/plain-file/sub"},  // cannot be created
  };
  for (const Case& c : cases) {
    try {
      make_cold_tier(c.spec, 8192);
      ADD_FAILURE() << c.spec << " was accepted";
    } catch (const std::invalid_argument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'" + c.spec + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find(c.message), std::string::npos) << msg;
    }
  }
  EXPECT_THROW(make_cold_tier("host:1M", 0), std::invalid_argument);
}

// Leaves what looks like a used XXH3 state with seed `seed` and a scrambled secret on the stack, below
// the caller's frame, where the next call's own state will lie.
[[gnu::noinline]] void scribble_stack(uint64_t seed, size_t shift) {
  // A used state holds the seed and a null external secret 16 bytes apart (libxxhash 0.8's layout); a
  // period of three words puts them there for one of the three shifts.
  volatile uint64_t junk[1024];
  for (size_t i = 0; i < 1024; ++i) junk[i] = (i + shift) % 3 == 0 ? seed : 0;
}

// Both checksums are XXH3-64 of key || data with the seed, whatever the stack held before (libxxhash's
// reset_withSeed skips deriving the secret when the state already holds that seed: a state left
// uninitialised gave wrong checksums, i.e. counted misses, after unrelated calls had used the stack).
TEST(ColdTierChecksum, ChecksumsAreXxh3OfKeyAndDataWhateverTheStackHeld) {
  std::mt19937_64 rng(5);
  std::vector<uint8_t> data(5000), cat(8 + data.size()), dst(data.size());
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  const uint64_t key = 42;
  std::memcpy(cat.data(), &key, 8);
  std::memcpy(cat.data() + 8, data.data(), data.size());
  for (uint64_t seed : {uint64_t{1}, uint64_t{99}, uint64_t{0x1234567890ull}}) {
    for (size_t bytes : {size_t{100}, size_t{240}, size_t{4095}, size_t{5000}}) {
      const uint64_t want = XXH3_64bits_withSeed(cat.data(), 8 + bytes, seed);
      for (size_t shift = 0; shift < 3; ++shift) {
        scribble_stack(seed, shift);
        EXPECT_EQ(cold::record_checksum(key, {data.data(), bytes}, seed), want) << seed << " " << bytes << " " << shift;
        scribble_stack(seed, shift);
        EXPECT_EQ(cold::copy_with_checksum(key, data.data(), dst.data(), bytes, seed, shift == 1), want)
            << seed << " " << bytes << " " << shift;
      }
    }
  }
}

TEST(ColdTierChecksum, CopyWithChecksumIsACopyPlusTheRecordChecksumAtAnyAlignmentAndSize) {
  std::mt19937_64 rng(3);
  std::vector<uint8_t> src(3 * 4096 + 200), dst(src.size() + 64);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{63}, size_t{64}, size_t{4095}, size_t{4096},
                       size_t{4097}, size_t{8192 + 64}, size_t{3 * 4096 + 7}}) {
    for (size_t src_off : {0, 1, 8, 13}) {
      for (size_t dst_off : {0, 1, 5, 16, 33}) {
        for (bool streaming : {false, true}) {
          std::fill(dst.begin(), dst.end(), uint8_t{0xee});
          const uint8_t* s = src.data() + src_off;
          const uint64_t sum = cold::copy_with_checksum(42, s, dst.data() + dst_off, bytes, 99, streaming);
          EXPECT_EQ(sum, cold::record_checksum(42, {s, bytes}, 99)) << bytes << " " << src_off << " " << dst_off;
          EXPECT_TRUE(std::equal(s, s + bytes, dst.begin() + static_cast<std::ptrdiff_t>(dst_off)))
              << bytes << " " << src_off << " " << dst_off << " " << streaming;
          // Nothing outside the destination range is touched.
          EXPECT_TRUE(std::all_of(dst.begin(), dst.begin() + static_cast<std::ptrdiff_t>(dst_off), [](uint8_t b) { return b == 0xee; }));
          EXPECT_TRUE(std::all_of(dst.begin() + static_cast<std::ptrdiff_t>(dst_off + bytes), dst.end(),
                                  [](uint8_t b) { return b == 0xee; }));
        }
      }
    }
  }
  // The checksum changes with the key, the seed and any byte.
  std::vector<uint8_t> d(100);
  const uint64_t base = cold::copy_with_checksum(1, src.data(), d.data(), 100, 0, true);
  EXPECT_NE(base, cold::copy_with_checksum(2, src.data(), d.data(), 100, 0, true));
  EXPECT_NE(base, cold::copy_with_checksum(1, src.data(), d.data(), 100, 1, true));
  src[50] ^= 1;
  EXPECT_NE(base, cold::copy_with_checksum(1, src.data(), d.data(), 100, 0, true));
}

TEST(ColdTierProbes, BandwidthProbesReturnPositiveRates) {
  TempDir dir;
  EXPECT_GT(measure_memcpy_gbps(size_t{8} << 20), 0.0);
  const SequentialReadMeasurement m = measure_sequential_read(dir.path(), size_t{16} << 20);
  EXPECT_GT(m.gbps, 0.0);
  EXPECT_GT(m.buffered_gbps, 0.0);
  EXPECT_GE(m.direct_gbps, 0.0);  // 0 where O_DIRECT is refused
  EXPECT_EQ(m.gbps, std::max(m.buffered_gbps, m.direct_gbps));
  EXPECT_GE(m.resident_fraction, 0.0);
  EXPECT_LE(m.resident_fraction, 1.0);
  EXPECT_TRUE(fs::is_empty(dir.path()));  // the scratch file is gone
}

}  // namespace
}  // namespace kvpack::kv
