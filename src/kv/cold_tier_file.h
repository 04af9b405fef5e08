// The file cold tier ("dir:PATH:BYTES"): records in one data file, PATH/kvpack-cold-tier.data.
//
// Layout: capacity = BYTES / slot_bytes slots, slot_bytes = sizeof(SlotHeader) + record_bytes (no
// padding: a direct read rounds its range out to whole blocks instead, which costs at most two blocks
// per read, where padding every slot would cost disk and bandwidth on every record).
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
// coalescing consecutive slots (a batch is sorted by slot first). When the stage is full, put() blocks until the writer frees an entry
// (bounded by the disk's write rate; counted in io_stats().put_waits). A get() of a staged record is
// served from the stage. A write that fails later (EIO, ENOSPC on a sparse file) drops that record: it
// becomes a miss and counts in put_failures (and io_stats().write_errors); nothing half-written is ever
// returned, because reads check the header and the checksum. flush() waits until every staged record is
// in the file (pwrite done, no fsync: the file is discarded at the next start anyway).
//
// Reads: get_many() sorts the records to read by slot and cuts them into runs of consecutive slots. A run
// whose pages are all in the page cache (a recent write; mincore() on a read-only map of the file that is
// never touched) is read with one buffered preadv (headers into a scratch buffer, records straight into
// the caller's buffers). Any other run is read around the page cache (O_DIRECT, a second descriptor):
// block-aligned reads of a few MiB (FileTierOptions::direct_read_bytes) into a per-I/O-thread bounce buffer, each record then hashed and
// copied out in one pass (cold::copy_with_checksum). Why: the data file is opened POSIX_FADV_RANDOM
// (records are read by key), which turns the kernel's read-ahead off, so a buffered read of a cold run
// is served in small synchronous pieces; a direct read goes to the device as one request, and skips the
// page cache's copy and its memory. A direct read of a range the page cache holds dirty is still
// correct (the kernel writes it back first). Where the file system refuses O_DIRECT (tmpfs on older
// kernels, some FUSE), every read is buffered. The file format does not change: a direct read rounds
// its range out to 4 KiB blocks. A large batch is cut
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
#include <atomic>
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
  // (Only where direct reads are off: they queue their requests themselves.)
  bool readahead_hint = true;
  bool direct_reads = true;            // read runs that are not in the page cache with O_DIRECT (above)
  // Bytes per direct read (rounded to whole slots, at least one): each I/O thread that has read direct
  // keeps a bounce buffer of this size. A device splits a request above its max_sectors_kb (often
  // 1-4 MiB): a read of a few device requests keeps its queue full while the other threads verify and
  // copy. Measured on a 2-core VM's virtual disk (2026-12-03, `kvpack bench cold`): swap-in at 66-69 % of
  // a sequential O_DIRECT read with 4 MiB, 78-83 % with 8 MiB, 71-87 % with 16.
  size_t direct_read_bytes = size_t{8} << 20;
  // The bounce buffers of all I/O threads together stay within this: with many threads each read is
  // smaller (more of them are in flight at once), so a 16-thread engine does not pin 128 MiB for it.
  size_t direct_buffer_bytes = size_t{32} << 20;
  bool direct_even_if_cached = false;  // tests: every read direct, whatever the page cache holds
};

// System-call level figures of a file tier (tests check coalescing with them).
struct FileTierIoStats {
  uint64_t read_calls = 0;     // preadv calls by get/get_many (retries of EINTR / short reads included)
  uint64_t direct_read_calls = 0;  // of them, reads around the page cache (O_DIRECT)
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
  // Whether reads may go around the page cache (false: O_DIRECT was refused, at open or at a read).
  bool direct_reads() const { return direct_ok_.load(std::memory_order_relaxed); }
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
  void read_runs(std::span<PendingRead> reads, std::span<uint8_t* const> out, int thread, bool streaming);
  // One run of consecutive slots, buffered (at most cold::kMaxIovecs / 2 records).
  void read_run_buffered(std::span<PendingRead> run, std::span<uint8_t* const> out, SlotHeader* headers,
                         uint64_t& calls, uint64_t& bytes);
  // One run of consecutive slots around the page cache, in pieces that fit the bounce buffer; false when
  // the file system refused O_DIRECT (nothing was decided: the caller reads the run buffered).
  bool read_run_direct(std::span<PendingRead> run, std::span<uint8_t* const> out, uint8_t* bounce, bool streaming,
                       uint64_t& calls, uint64_t& bytes);
  bool run_is_cached(cold::Slot first, size_t n) const;  // every page of slots [first, first + n) is in the page cache
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
  const bool direct_even_if_cached_;
  const size_t direct_piece_slots_;      // slots per direct read
  cold::UniqueFd direct_fd_;             // the data file opened O_DIRECT (empty: direct reads off)
  std::atomic<bool> direct_ok_{false};
  void* map_ = nullptr;                  // PROT_READ map of the data file, for mincore() only (never read)
  size_t map_bytes_ = 0;
  // Per I/O thread: a 4 KiB-aligned buffer for direct reads, allocated at its first direct read.
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  std::vector<std::unique_ptr<uint8_t, FreeDeleter>> bounce_;
  FileTierIoStats io_;
  std::thread writer_;                   // last: starts after everything above exists
};

// Sequential read bandwidth of the storage under `dir`: writes a scratch file of `bytes` there
// (unlinked at once, so nothing is left behind), fdatasync()s it, asks the kernel to drop its pages
// (posix_fadvise DONTNEED — honoured for clean pages on ext4/xfs/btrfs; not on tmpfs, where the "file" is
// the page cache), then reads it back twice with 8 MiB reads by one thread: through the page cache with
// sequential read-ahead (what `dd` or `cat` see), and — pages dropped again — around it with O_DIRECT
// (what the device gives one reader that needs no read-ahead). `gbps` is the faster of the two: the
// reference a swap-in is judged against is the best plain sequential read of the directory.
// `resident_fraction` says what was measured: the share of the file's pages still in the page cache when
// the buffered read began (mincore). Near 0: the device (plus the kernel's read path); near 1: the page cache.
struct SequentialReadMeasurement {
  double gbps = 0;           // max(buffered_gbps, direct_gbps); GB/s = 1e9 bytes/s
  double buffered_gbps = 0;
  double direct_gbps = 0;    // 0 when the file system refuses O_DIRECT
  double resident_fraction = 0;
};
SequentialReadMeasurement measure_sequential_read(const std::string& dir, size_t bytes);

// The same, with the scratch file written once and read back by every measure() (each drops its pages
// first): a benchmark that measures its reference many times does not write and delete hundreds of MiB
// each time — on a file system mounted with `discard`, each delete sends the device a discard that slows
// whatever I/O comes next. Thread-safety: none.
class SequentialReadProbe {
 public:
  SequentialReadProbe(const std::string& dir, size_t bytes);  // throws std::runtime_error naming dir
  SequentialReadMeasurement measure() const;

 private:
  struct FreeBuffer {
    void operator()(uint8_t* p) const;
  };
  std::string dir_;
  size_t bytes_;
  cold::UniqueFd fd_, direct_fd_;
};
double measure_sequential_read_gbps(const std::string& dir, size_t bytes);  // measure_sequential_read().gbps

}  // namespace kvpack::kv
