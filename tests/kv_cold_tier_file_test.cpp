// The file cold tier's on-disk behaviour (kv/cold_tier_file.h): coalesced reads, corruption and
// truncation of the data file, a directory left by a killed process, a second tier on one directory,
// write errors, the writer's stage. Files live in a mkdtemp directory under /tmp, removed at the end.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kv/cold_tier_file.h"
#include "kv_cold_tier_util.h"

namespace kvpack::kv {
namespace {

using namespace testing_cold;
namespace fs = std::filesystem;

constexpr size_t kRecordBytes = 8192 + 64;
constexpr size_t kSlotBytes = sizeof(FileColdTier::SlotHeader) + kRecordBytes;

class FileColdTierTest : public ::testing::Test {
 protected:
  std::unique_ptr<FileColdTier> make(int64_t slots, FileTierOptions opts = {}) {
    return std::make_unique<FileColdTier>(dir_.path(), slots * kSlotBytes, kRecordBytes, opts);
  }
  // A 64-slot tier that reads everything around the page cache, holding keys [0, n) (written, flushed).
  std::unique_ptr<FileColdTier> all_direct_with(size_t n) {
    FileTierOptions opts;
    opts.direct_even_if_cached = true;
    auto tier = make(64, opts);
    put_run(*tier, 0, n);
    tier->flush();
    return tier;
  }
  // put_many of keys [first, first + n), counter `counter`.
  static void put_run(FileColdTier& tier, uint64_t first, size_t n, uint64_t counter = 0) {
    std::vector<uint64_t> keys;
    std::vector<std::vector<uint8_t>> records;
    std::vector<const uint8_t*> data;
    for (uint64_t k = first; k < first + n; ++k) {
      keys.push_back(k);
      records.push_back(make_record(k, counter, kRecordBytes));
    }
    for (const auto& r : records) data.push_back(r.data());
    std::unique_ptr<bool[]> ok(new bool[n]);
    tier.put_many(keys, data, {ok.get(), n});
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(ok[i]) << keys[i];
  }
  // get_many of `keys`; returns how many hit with exactly make_record(key, counter).
  static size_t get_keys(FileColdTier& tier, const std::vector<uint64_t>& keys, uint64_t counter = 0) {
    std::vector<std::vector<uint8_t>> out(keys.size(), std::vector<uint8_t>(kRecordBytes));
    std::vector<uint8_t*> ptrs;
    for (auto& o : out) ptrs.push_back(o.data());
    std::unique_ptr<bool[]> ok(new bool[keys.size()]);
    tier.get_many(keys, ptrs, {ok.get(), keys.size()});
    size_t exact = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      EXPECT_TRUE(!ok[i] || out[i] == make_record(keys[i], counter, kRecordBytes)) << "wrong bytes for " << keys[i];
      exact += ok[i] && out[i] == make_record(keys[i], counter, kRecordBytes);
    }
    return exact;
  }
  // Overwrites one byte of the data file at `offset` (behind the tier's back).
  static void flip_byte(const std::string& path, int64_t offset) {
    const int fd = ::open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    uint8_t b = 0;
    ASSERT_EQ(::pread(fd, &b, 1, offset), 1);
    b ^= 0x10;
    ASSERT_EQ(::pwrite(fd, &b, 1, offset), 1);
    ::close(fd);
  }
  // The child's side of AFailedBackgroundWriteDropsTheRecord: 0 when everything held, else which check failed.
  int write_failure_scenario() {
    ::signal(SIGXFSZ, SIG_IGN);
    auto tier = make(16);
    put_run(*tier, 0, 2);  // slots 0, 1
    tier->flush();
    if (::truncate(tier->data_path().c_str(), 0) != 0) return 10;
    const rlimit limit{2 * kSlotBytes, 2 * kSlotBytes};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 11;
    put_run(*tier, 0, 1, 5);  // rewrite of slot 0: within the limit, succeeds
    put_run(*tier, 10, 4);    // slots 2..5: beyond it, fail
    tier->flush();
    if (tier->stats().put_failures != 4 || tier->io_stats().write_errors != 4) return 12;
    if (tier->contains(10) || tier->contains(13)) return 13;
    if (get_keys(*tier, {10, 11, 12, 13}) != 0) return 14;
    if (get_keys(*tier, {0}, 5) != 1) return 15;
    if (get_keys(*tier, {1}) != 0 || tier->stats().checksum_failures != 1) return 16;  // truncated away
    return 0;
  }
  // The child's side of ADiskTooSmallForTheCapIsAnErrorAtStart: 0 when it held.
  int reserve_failure_scenario() {
    ::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{1 << 20, 1 << 20};  // as if the disk had 1 MiB left
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 11;
    try {
      make(1000);  // ~8 MiB
      return 12;
    } catch (const std::runtime_error& e) {
      if (std::string(e.what()).find("cannot reserve") == std::string::npos) return 13;
      if (std::string(e.what()).find(dir_.path()) == std::string::npos) return 14;
    }
    return fs::exists(dir_.path() + "/" + FileColdTier::kDataFileName) ? 15 : 0;  // not left behind
  }
  TempDir dir_;
};

TEST_F(FileColdTierTest, GetManyCoalescesConsecutiveSlotsIntoOneRead) {
  auto tier = make(256);
  put_run(*tier, 5000, 64);
  tier->flush();
  const int64_t first = tier->slot_of(5000);
  for (uint64_t i = 0; i < 64; ++i) ASSERT_EQ(tier->slot_of(5000 + i), first + static_cast<int64_t>(i));  // put_many: consecutive
  std::vector<uint64_t> reversed;
  for (uint64_t k = 5063; k >= 5000; --k) reversed.push_back(k);
  uint64_t calls = tier->io_stats().read_calls;
  EXPECT_EQ(get_keys(*tier, reversed), 64u);
  EXPECT_EQ(tier->io_stats().read_calls - calls, 1u);  // one preadv for the whole run, any request order
  std::vector<uint64_t> scattered;
  for (uint64_t k = 5000; k < 5064; k += 4) scattered.push_back(k);
  calls = tier->io_stats().read_calls;
  EXPECT_EQ(get_keys(*tier, scattered), scattered.size());
  EXPECT_EQ(tier->io_stats().read_calls - calls, scattered.size());  // nothing to coalesce
  EXPECT_EQ(tier->io_stats().stage_hits, 0u);  // flushed: everything came from the file
  EXPECT_EQ(tier->stats().bytes_read, (64 + scattered.size()) * kRecordBytes);
  tier->drop_page_cache();  // from the device this time: same bytes, same single call
  calls = tier->io_stats().read_calls;
  EXPECT_EQ(get_keys(*tier, reversed), 64u);
  EXPECT_EQ(tier->io_stats().read_calls - calls, 1u);
}

TEST_F(FileColdTierTest, WritesOfARunAreCoalescedToo) {
  auto tier = make(2048);
  put_run(*tier, 0, 1000);
  tier->flush();
  const FileTierIoStats io = tier->io_stats();
  EXPECT_EQ(io.disk_bytes_written, 1000 * kSlotBytes);
  EXPECT_GE(io.write_calls, 1u);  // runs of consecutive slots: how long they get depends on scheduling
  RecordProperty("write_calls", static_cast<int>(io.write_calls));
  EXPECT_EQ(get_keys(*tier, {0, 999, 500}), 3u);
}

TEST_F(FileColdTierTest, ACorruptedRecordOnDiskIsACountedMissNeverWrongBytes) {
  auto tier = make(64);
  put_run(*tier, 0, 16);
  tier->flush();
  flip_byte(tier->data_path(), tier->slot_of(3) * static_cast<int64_t>(kSlotBytes) + 32 + 1000);  // record bytes
  flip_byte(tier->data_path(), tier->slot_of(9) * static_cast<int64_t>(kSlotBytes) + 16);         // header key
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(get_keys(*tier, {2, 3, 4}), 2u);
  EXPECT_EQ(get_keys(*tier, {9}), 0u);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("[kvpack] cold tier: checksum mismatch in " + tier->data_path() + " slot " +
                     std::to_string(tier->slot_of(2) + 1) + " (record dropped)"), std::string::npos) << log;
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1);  // logged once
  EXPECT_FALSE(tier->contains(3));
  EXPECT_FALSE(tier->contains(9));
  EXPECT_EQ(get_keys(*tier, {3}), 0u);  // dropped: now a plain miss
  const ColdTierStats st = tier->stats();
  EXPECT_EQ(st.checksum_failures, 2u);
  EXPECT_EQ(st.misses, 3u);
  EXPECT_EQ(st.hits, 2u);
  EXPECT_EQ(st.records, 14u);
  put_run(*tier, 3, 1, 7);  // the key can be stored again
  EXPECT_EQ(get_keys(*tier, {3}, 7), 1u);
}

TEST_F(FileColdTierTest, ATruncatedFileGivesMisses) {
  auto tier = make(64);
  put_run(*tier, 0, 8);
  tier->flush();
  ASSERT_EQ(::truncate(tier->data_path().c_str(), static_cast<off_t>(3 * kSlotBytes + 100)), 0);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(get_keys(*tier, {0, 1, 2, 3, 4, 5, 6, 7}), 3u);  // slots 0-2 are whole, 3 is cut, 4-7 gone
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("short read"), std::string::npos);
  const ColdTierStats st = tier->stats();
  EXPECT_EQ(st.checksum_failures, 5u);
  EXPECT_EQ(st.misses, 5u);
  EXPECT_EQ(st.records, 3u);
}

// Reads around the page cache (O_DIRECT) for runs it does not hold, buffered for runs it holds.
TEST_F(FileColdTierTest, CachedRunsAreReadBufferedAndOthersAroundThePageCache) {
  auto tier = make(256);
  if (!tier->direct_reads()) GTEST_SKIP() << "this file system refuses O_DIRECT: every read is buffered";
  put_run(*tier, 0, 100);
  tier->flush();  // written: in the page cache
  FileTierIoStats before = tier->io_stats();
  EXPECT_EQ(get_keys(*tier, {10, 11, 12, 13}), 4u);
  FileTierIoStats after = tier->io_stats();
  EXPECT_EQ(after.read_calls - before.read_calls, 1u);
  EXPECT_EQ(after.direct_read_calls, before.direct_read_calls);  // cached: buffered
  tier->drop_page_cache();
  before = after;
  std::vector<uint64_t> all(100);
  for (uint64_t k = 0; k < 100; ++k) all[k] = k;
  EXPECT_EQ(get_keys(*tier, all), 100u);
  after = tier->io_stats();
  EXPECT_GE(after.direct_read_calls - before.direct_read_calls, 1u);  // from the device, around the cache
  EXPECT_EQ(after.read_calls - before.read_calls, after.direct_read_calls - before.direct_read_calls);
  EXPECT_EQ(tier->stats().checksum_failures, 0u);
  // The same tier with direct reads off reads everything buffered.
  tier.reset();
  FileTierOptions buffered;
  buffered.direct_reads = false;
  tier = make(256, buffered);
  EXPECT_FALSE(tier->direct_reads());
  put_run(*tier, 0, 100);
  tier->drop_page_cache();
  EXPECT_EQ(get_keys(*tier, all), 100u);
  EXPECT_EQ(tier->io_stats().direct_read_calls, 0u);
}

// A read larger than one direct read (FileTierOptions::direct_read_bytes) is cut into pieces, each record
// whole in one of them, including records that straddle a piece's block-aligned edges.
TEST_F(FileColdTierTest, ADirectReadLargerThanItsBufferIsReadInPieces) {
  FileTierOptions opts;
  opts.direct_even_if_cached = true;
  opts.direct_read_bytes = 5 * kSlotBytes + 100;  // 5 slots per piece: edges fall inside slots
  opts.read_threads = 1;
  auto tier = make(128, opts);
  if (!tier->direct_reads()) GTEST_SKIP() << "this file system refuses O_DIRECT";
  put_run(*tier, 0, 23);
  tier->flush();
  std::vector<uint64_t> all(23);
  for (uint64_t k = 0; k < 23; ++k) all[k] = 22 - k;
  EXPECT_EQ(get_keys(*tier, all), 23u);
  EXPECT_EQ(tier->io_stats().direct_read_calls, 5u);  // ceil(23 / 5)
}

TEST_F(FileColdTierTest, ACorruptedRecordReadAroundThePageCacheIsAMissToo) {
  auto tier = all_direct_with(16);
  if (!tier->direct_reads()) GTEST_SKIP() << "this file system refuses O_DIRECT";
  flip_byte(tier->data_path(), tier->slot_of(3) * static_cast<int64_t>(kSlotBytes) + 32 + 8000);  // record bytes
  flip_byte(tier->data_path(), tier->slot_of(9) * static_cast<int64_t>(kSlotBytes) + 1);          // header magic
  ::testing::internal::CaptureStderr();
  std::vector<uint64_t> all(16);
  for (uint64_t k = 0; k < 16; ++k) all[k] = k;
  EXPECT_EQ(get_keys(*tier, all), 14u);  // never wrong bytes (get_keys checks every hit)
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("checksum mismatch"), std::string::npos) << log;
  EXPECT_GE(tier->io_stats().direct_read_calls, 1u);
  EXPECT_FALSE(tier->contains(3));
  EXPECT_FALSE(tier->contains(9));
  EXPECT_EQ(tier->stats().checksum_failures, 2u);
  EXPECT_EQ(tier->stats().records, 14u);
}

TEST_F(FileColdTierTest, ATruncatedFileReadAroundThePageCacheGivesMisses) {
  auto tier = all_direct_with(8);
  if (!tier->direct_reads()) GTEST_SKIP() << "this file system refuses O_DIRECT";
  ASSERT_EQ(::truncate(tier->data_path().c_str(), static_cast<off_t>(3 * kSlotBytes + 100)), 0);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(get_keys(*tier, {0, 1, 2, 3, 4, 5, 6, 7}), 3u);  // slots 0-2 are whole, 3 is cut, 4-7 gone
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("short read"), std::string::npos);
  EXPECT_GE(tier->io_stats().direct_read_calls, 1u);
  EXPECT_EQ(tier->stats().checksum_failures, 5u);
  EXPECT_EQ(tier->stats().records, 3u);
}

// The slots a take_many frees are handed out again in ascending order, so the next batch of puts (the
// next swap-out) is one run of consecutive slots: one read to bring it back.
TEST_F(FileColdTierTest, SlotsFreedByATakeAreReusedAsOneAscendingRun) {
  auto tier = make(40);
  put_run(*tier, 0, 40);  // the tier is full: no fresh slots to fall back on
  tier->flush();
  std::vector<uint64_t> keys(40);
  for (uint64_t k = 0; k < 40; ++k) keys[k] = k;
  std::vector<std::vector<uint8_t>> out(40, std::vector<uint8_t>(kRecordBytes));
  std::vector<uint8_t*> ptrs;
  for (auto& o : out) ptrs.push_back(o.data());
  bool ok[40];
  tier->take_many(keys, ptrs, ok);
  for (bool b : ok) ASSERT_TRUE(b);
  put_run(*tier, 1000, 40, 3);
  const int64_t first = tier->slot_of(1000);
  for (uint64_t i = 0; i < 40; ++i) EXPECT_EQ(tier->slot_of(1000 + i), first + static_cast<int64_t>(i)) << i;
  tier->flush();
  std::vector<uint64_t> again(40);
  for (uint64_t k = 0; k < 40; ++k) again[k] = 1000 + k;
  const uint64_t calls = tier->io_stats().read_calls;
  EXPECT_EQ(get_keys(*tier, again, 3), 40u);
  EXPECT_EQ(tier->io_stats().read_calls - calls, 1u);
}

TEST_F(FileColdTierTest, StartsCleanOverWhatAKilledProcessLeft) {
  const std::string data = dir_.path() + "/" + FileColdTier::kDataFileName;
  {
    std::ofstream garbage(data, std::ios::binary);
    for (int i = 0; i < 300000; ++i) garbage << "garbage!";
  }
  std::ofstream(dir_.path() + "/unrelated.txt") << "keep me";
  auto tier = make(32);
  EXPECT_EQ(fs::file_size(data), 32 * kSlotBytes);  // recreated at its own size
  std::ifstream unrelated(dir_.path() + "/unrelated.txt");
  std::string text;
  std::getline(unrelated, text);
  EXPECT_EQ(text, "keep me");
  EXPECT_EQ(tier->stats().records, 0u);
  EXPECT_EQ(get_keys(*tier, {0, 1}), 0u);
  put_run(*tier, 0, 32);
  tier->flush();
  EXPECT_EQ(get_keys(*tier, {0, 31}), 2u);
  EXPECT_EQ(tier->stats().checksum_failures, 0u);
  tier.reset();
  EXPECT_FALSE(fs::exists(data));        // a clean shutdown gives the disk back
  EXPECT_TRUE(fs::exists(dir_.path() + "/unrelated.txt"));
}

TEST_F(FileColdTierTest, ASymlinkUnderTheDataFileNameIsRefusedNotFollowed) {
  const std::string victim = dir_.path() + "/victim.txt";
  std::ofstream(victim) << "precious";
  fs::create_symlink(victim, dir_.path() + "/" + FileColdTier::kDataFileName);
  EXPECT_THROW(make(8), std::runtime_error);
  EXPECT_EQ(fs::file_size(victim), 8u);  // not truncated
}

// The checksum is seeded by a per-instance generation: a slot holding a record an earlier process wrote
// under the same key (here put back by hand, as if the file had not been truncated) does not verify.
TEST_F(FileColdTierTest, ARecordOfAnEarlierTierInstanceNeverVerifies) {
  auto first = make(8);
  put_run(*first, 0, 1, 1);  // key 0, counter 1, slot 0
  first->flush();
  std::vector<char> image(kSlotBytes);
  std::ifstream(first->data_path(), std::ios::binary).read(image.data(), static_cast<std::streamsize>(image.size()));
  first.reset();
  auto second = make(8);
  put_run(*second, 0, 1, 2);  // key 0, counter 2, slot 0 again
  second->flush();
  std::fstream(second->data_path(), std::ios::binary | std::ios::in | std::ios::out)
      .write(image.data(), static_cast<std::streamsize>(image.size()));  // the first instance's slot 0
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(get_keys(*second, {0}, 1), 0u);  // neither the old bytes nor anything else
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(second->stats().checksum_failures, 1u);
}

TEST_F(FileColdTierTest, ASecondTierOnTheSameDirectoryIsRefused) {
  auto tier = make(8);
  try {
    make(8);
    ADD_FAILURE() << "a second tier opened " << tier->data_path();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(tier->data_path() + " is in use"), std::string::npos) << e.what();
  }
}

TEST_F(FileColdTierTest, AnUnusableDirectoryIsAnErrorNamingIt) {
  std::ofstream(dir_.path() + "/file") << "x";
  const std::string bad = dir_.path() + "/file/sub";
  try {
    FileColdTier tier(bad, 1 << 20, kRecordBytes);
    ADD_FAILURE() << "opened " << bad;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
  }
  EXPECT_THROW(FileColdTier(dir_.path() + "/x", kSlotBytes - 1, kRecordBytes), std::invalid_argument);
}

// A write that fails in the background (here EFBIG: the file is truncated and RLIMIT_FSIZE stops it
// growing again, as a full disk would) drops the record: put_failures, then a plain miss, never stale
// bytes. Runs in a child process so the limit does not touch the test runner.
TEST_F(FileColdTierTest, AFailedBackgroundWriteDropsTheRecord) {
  EXPECT_EXIT(std::_Exit(write_failure_scenario()), ::testing::ExitedWithCode(0), "write to .* failed");
}

// fallocate reserves the whole cap at start, so a disk too small for it is a clear error there rather
// than failed puts later (simulated with RLIMIT_FSIZE in a child process, which fallocate honours).
TEST_F(FileColdTierTest, ADiskTooSmallForTheCapIsAnErrorAtStart) {
  EXPECT_EXIT(std::_Exit(reserve_failure_scenario()), ::testing::ExitedWithCode(0), "");
}

TEST_F(FileColdTierTest, ASmallStageMakesPutsWaitAndLosesNothing) {
  FileTierOptions opts;
  opts.staging_bytes = 0;  // the minimum: two records in flight
  auto tier = make(512, opts);
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 400; ++k) keys.push_back(k);
  // Whether a put finds the stage full depends on how the writer thread is scheduled; a round of 400
  // puts usually does, and 20 rounds practically always. What must hold every round: nothing is lost.
  for (uint64_t round = 0; round < 20 && tier->io_stats().put_waits == 0; ++round) {
    put_run(*tier, 0, keys.size(), round);
    EXPECT_EQ(get_keys(*tier, keys, round), keys.size());  // some may still be staged: served from the stage
    tier->flush();
    EXPECT_EQ(get_keys(*tier, keys, round), keys.size());
  }
  EXPECT_GT(tier->io_stats().put_waits, 0u);
  EXPECT_EQ(tier->stats().put_failures, 0u);
}

TEST_F(FileColdTierTest, StagedRecordsAreReadableAndSupersededWritesAreSkipped) {
  auto tier = make(64);
  for (uint64_t c = 0; c < 50; ++c) put_run(*tier, 1, 1, c);  // one key, rewritten
  EXPECT_EQ(get_keys(*tier, {1}, 49), 1u);                      // the newest, from stage or file
  tier->flush();
  EXPECT_EQ(get_keys(*tier, {1}, 49), 1u);
  EXPECT_LE(tier->io_stats().disk_bytes_written, 50 * kSlotBytes);
  EXPECT_EQ(tier->stats().records, 1u);
}

}  // namespace
}  // namespace kvpack::kv
