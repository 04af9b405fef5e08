// The file cold tier ("dir:PATH:BYTES"): records in one data file, PATH/kvpack-cold-tier.data.
//
// Layout: capacity = BYTES / slot_bytes slots, slot_bytes = sizeof(SlotHeader) + record_bytes (no
// padding: the I/O is buffered, so alignment buys nothing and padding would cost disk and bandwidth).
// Slot s sits at offset s * slot_bytes: its header (magic, record size, this instance's generation, key,
// XXH3-64 over key + record seeded by the generation) followed by the record. The index (key -> slot,
// LRU over unpinned records, free list) lives in memory (cold::SlotIndex); a batch of puts takes
// consecutive free slots, so a swapped-out run comes back in one preadv.
//
// Start: PATH is created if missing; the data file is opened, locked (flock: a second live tier on the
// same PATH is refused with an error naming it), truncated — whatever a previous, possibly SIGKILLed,
// process left there is discarded (a cold tier is a cache, not a database) — and space for every slot
// reserved with fallocate, so "disk full" shows at start rather than mid-run; where the file system
// cannot reserve, the file is sized sparsely and a later ENOSPC fails the put it hits. Nothing else in
// PATH is touched. The destructor drains the writer and deletes the data file (it is useless to a
// later process, and this gives the disk back).
//
// Writes: put() copies the record (with its header) into a bounded stage and returns true once staged,
// so the caller may free its page at once; a background writer thread pwritev()s queued records,
// coalescing consecutive slots. When the stage is full, put() blocks until the writer frees an entry
// (bounded by the disk's write rate; counted in io_stats().put_waits). A get() of a staged record is
// served from the stage. A write that fails later (EIO, ENOSPC on a sparse file) drops that record: it
// becomes a miss and counts in put_failures (and io_stats().write_errors); nothing half-written is ever
// returned, because reads check the header and the checksum. flush() waits until every staged record is
// in the file (pwrite done, no fsync: the file is discarded at the next start anyway).
//
// Reads: get_many() sorts the records to read by slot and reads each run of consecutive slots with one
// preadv (headers into a scratch buffer, records straight into the caller's buffers); a large batch is cut
// into parts of about 1 MiB read by `read_threads` threads at once, so the device always has requests
// queued while a finished part is being verified (one reader alone leaves it idle during each checksum
// and system call). A record whose
// header or checksum does not match, or which a short read cut off, is a miss: checksum_failures++, the
// record is dropped, and the first one prints a line to stderr. A read that raced with the slot being
// reassigned (eviction, replacement by another thread) is a plain miss, not a checksum failure. On a
// miss the caller's buffer holds unspecified bytes (the read went straight into it): use it only on true.
//
// Stats: puts counts records offered to put/put_many, bytes_written the record bytes accepted (staged),
// bytes_read the record bytes returned by hits; io_stats() has the system-call level figures.
// Thread-safety: every member may be called from any thread. One mutex guards the index, the stage and
// the stats; it is not held during file I/O (reads, the writer's writes) nor while a put copies its
// record into the stage.
#pragma once
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kv/cold_tier.h"
#include "kv/cold_tier_index.h"
#include "kv/cold_tier_io.h"

namespace kvpack::kv {

struct FileTierOptions {
  size_t staging_bytes = size_t{16} << 20;  // the stage's size; at least 2 slots are staged whatever it says
  size_t max_write_batch = 256;             // records the writer takes per round (IOV_MAX caps one call)
  int read_threads = 4;                     // a get_many's reads in flight at once (the caller included)
  // Before a batch's reads, tell the kernel every run of consecutive slots it will read
  // (posix_fadvise WILLNEED): the device gets the whole batch queued at once instead of one read per
  // reader thread at a time, and the readers copy from the page cache as the data arrives.
  bool readahead_hint = true;
};

// System-call level figures of a file tier (tests check coalescing with them).
struct FileTierIoStats {
  uint64_t read_calls = 0;     // preadv calls by get/get_many (retries of EINTR / short reads included)
  uint64_t write_calls = 0;    // pwritev calls by the writer
  uint64_t write_errors = 0;   // records whose write failed (dropped)
  uint64_t stage_hits = 0;     // gets served from the stage
  uint64_t put_waits = 0;      // puts that had to wait for room in the stage
  uint64_t disk_bytes_read = 0, disk_bytes_written = 0;  // headers included
};

class FileColdTier final : public cold::IndexedTier {
 public:
  static constexpr uint32_t kMagic = 0x5443564b;  // "KVCT"
  struct SlotHeader {
    uint32_t magic;
    uint32_t record_bytes;
    uint64_t generation;  // random per tier instance: records of an earlier process never verify
    uint64_t key;
    uint64_t checksum;    // cold::record_checksum(key, record, generation)
  };
  static_assert(sizeof(SlotHeader) == 32);
  static constexpr const char* kDataFileName = "kvpack-cold-tier.data";

  // Throws std::invalid_argument when record_bytes is 0 or cap_bytes holds no slot, std::runtime_error
  // (naming the path and the reason) when PATH or its data file cannot be created, locked or sized.
  FileColdTier(const std::string& dir, uint64_t cap_bytes, size_t record_bytes, FileTierOptions options = {});
  ~FileColdTier() override;
  FileColdTier(const FileColdTier&) = delete;
  FileColdTier& operator=(const FileColdTier&) = delete;

  const char* kind() const override { return "dir"; }
  bool put(uint64_t key, std::span<const uint8_t> data) override;
  bool get(uint64_t key, std::span<uint8_t> out) override;
  void erase(uint64_t key) override;
  void put_many(std::span<const uint64_t> keys, std::span<const uint8_t* const> data, std::span<bool> ok) override;
  void get_many(std::span<const uint64_t> keys, std::span<uint8_t* const> out, std::span<bool> ok) override;
  void take_many(std::span<const uint64_t> keys, std::span<uint8_t* const> out, std::span<bool> ok) override;
  void flush() override;

  const std::string& data_path() const { return path_; }
  size_t slot_bytes() const { return slot_bytes_; }
  int64_t capacity_slots() const { return index_.capacity(); }
  FileTierIoStats io_stats() const;
  // flush(), then asks the kernel to drop the data file's pages from the page cache (fdatasync +
  // posix_fadvise DONTNEED), so that the next reads come from the device: benchmarks of a cold swap-in.
  void drop_page_cache();
  // Where `key` sits (tests: to corrupt it on disk); -1 when absent.
  int64_t slot_of(uint64_t key) const;

 private:
  enum class StageState : uint8_t { kFree, kFilling, kQueued, kWriting, kCancelled };
  struct StageEntry {
    cold::Slot slot = cold::kNoSlot;
    StageState state = StageState::kFree;
  };
  struct PendingRead;

  cold::Slot put_one(uint64_t key, const uint8_t* data, cold::Slot preferred);
  void read_many(std::span<const uint64_t> keys, std::span<uint8_t* const> out, std::span<bool> ok, bool take);
  void forget(cold::Slot s);  // under mu_: the record in `s` is gone (a queued write of it is cancelled)
  uint8_t* stage_buffer(int entry) { return stage_.get() + static_cast<size_t>(entry) * slot_bytes_; }
  void supersede_staged(cold::Slot s);  // a queued, not yet written record of `s` is no longer wanted
  void release_entry(int entry);
  void writer_loop();
  void write_batch(std::span<const int> batch, std::vector<bool>& written);
  void read_runs(std::span<PendingRead> reads, std::span<uint8_t* const> out);
  void log_once(const char* what, cold::Slot s);  // a bad read (checksum, short): first one only

  const size_t slot_bytes_;
  const uint64_t generation_;
  std::string path_;
  cold::UniqueFd fd_;

  std::condition_variable work_cv_;      // writer: something queued, or stopping
  std::condition_variable progress_cv_;  // putters (room in the stage) and flush() (queue drained)
  std::vector<int32_t> staged_entry_;    // per slot touched: its newest stage entry (-1: the file has it)
  std::vector<uint32_t> version_;        // per slot touched: bumped by each put into it (detects read races)
  std::unique_ptr<uint8_t[]> stage_;     // entries x slot_bytes: header + record, ready to write
  std::vector<StageEntry> entries_;
  std::vector<int> free_entries_;
  std::deque<int> queue_;                // staged entries in put order (the writer keeps it)
  size_t writing_ = 0;                   // entries the writer holds outside the lock
  bool stopping_ = false;
  bool logged_bad_read_ = false, logged_bad_write_ = false;  // one stderr line each, the first time
  const size_t max_write_batch_;
  const bool readahead_hint_;
  FileTierIoStats io_;
  std::thread writer_;                   // last: starts after everything above exists
};

// Sequential read bandwidth of the storage under `dir`: writes a scratch file of `bytes` there
// (unlinked at once, so nothing is left behind), fdatasync()s it, asks the kernel to drop its pages
// (posix_fadvise DONTNEED — honoured for clean pages on ext4/xfs/btrfs; not on tmpfs, where the "file" is
// the page cache), then reads it back with 8 MiB preads and returns GB/s (1e9 bytes/s).
// `resident_fraction` says what was measured: the share of the file's pages still in the page cache when
// the timed read began (mincore). Near 0: the device (plus the kernel's read path); near 1: the page cache.
struct SequentialReadMeasurement {
  double gbps = 0;
  double resident_fraction = 0;
};
SequentialReadMeasurement measure_sequential_read(const std::string& dir, size_t bytes);
double measure_sequential_read_gbps(const std::string& dir, size_t bytes);  // measure_sequential_read().gbps

}  // namespace kvpack::kv
