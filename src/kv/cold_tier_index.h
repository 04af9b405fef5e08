// Internals shared by the cold-tier backends (kv/cold_tier_host.h, kv/cold_tier_file.h): the slot index
// and the record checksum. Not part of the tier's interface.
//
// Both backends store records in numbered slots of one size (a slab of RAM, a region of a file), so one
// index serves both: key -> slot, an LRU list over unpinned records, a free list, all O(1). The lists are
// intrusive (per-slot prev/next arrays; a slot sits in at most one of them), so nothing is allocated per
// record except the hash-map node. Per-slot arrays grow with the slots actually used (like the page
// pool's never-used frontier), not with the capacity: a 1 TiB file tier costs metadata only for what it
// holds.
//
// Thread-safety: none; each backend guards its index with its own mutex.
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/cold_tier.h"
#include "util/thread_pool.h"

namespace kvpack::kv::cold {

using Slot = int32_t;
inline constexpr Slot kNoSlot = -1;

// XXH3-64 over the key (8 bytes, little-endian host order) followed by the record bytes, seeded by `seed`
// (the file backend seeds with its per-instance generation, so records of an earlier process never verify).
uint64_t record_checksum(uint64_t key, std::span<const uint8_t> data, uint64_t seed);

// Copies `bytes` from `src` to `dst` (non-overlapping) and returns record_checksum(key, {src, bytes}, seed)
// in the same pass: per 4 KiB chunk, hash (which pulls the chunk into L1) then copy it from L1, so the
// source is read from DRAM once. With `streaming`, the copy uses non-temporal stores (x86-64: SSE2
// MOVNTDQ, one SFENCE at the end): an ordinary store of a line that is not cached first reads it for
// ownership, so a large copy with ordinary stores moves 3 bytes over the memory bus per byte copied
// where glibc's memcpy of a large buffer (which streams) moves 2. Use it for batches far larger than the
// caches (a swap of a sequence); for a few records, ordinary stores leave the copy in cache for its
// reader. Elsewhere than x86-64, `streaming` is ignored.
uint64_t copy_with_checksum(uint64_t key, const uint8_t* src, uint8_t* dst, size_t bytes, uint64_t seed, bool streaming);

// Batches of at least this many bytes are copied with streaming stores (about the last-level cache of a
// server core complex: beyond it, the copy's destination would be evicted before it is read anyway).
inline constexpr size_t kStreamingCopyBytes = size_t{16} << 20;

// How many slots of `slot_bytes` (a record of `record_bytes` plus any header) fit in `cap_bytes`. Throws
// std::invalid_argument when record_bytes is 0, when not even one fits, or beyond 2^31 slots.
int64_t slots_within(uint64_t cap_bytes, size_t record_bytes, size_t slot_bytes);

// The batched calls take parallel arrays; throws std::invalid_argument naming `call` when their sizes differ.
void check_batch(size_t keys, size_t buffers, size_t results, const char* call);

class SlotIndex {
 public:
  explicit SlotIndex(int64_t capacity_slots);

  int64_t capacity() const { return capacity_; }
  size_t records() const { return by_key_.size(); }
  // Slots [0, slots_touched()) have been handed out at least once; per-slot arrays of the backends are
  // at least that long (the backends grow theirs in step, see grow_to()).
  Slot slots_touched() const { return next_fresh_; }

  Slot find(uint64_t key) const {
    auto it = by_key_.find(key);
    return it == by_key_.end() ? kNoSlot : it->second;
  }
  uint64_t key_of(Slot s) const { return key_[static_cast<size_t>(s)]; }
  bool pinned(Slot s) const { return state_[static_cast<size_t>(s)] == State::kPinned; }

  struct Allocation {
    Slot slot = kNoSlot;       // kNoSlot: every slot holds a pinned record
    bool evicted = false;      // the slot held `evicted_key` (LRU unpinned), now forgotten
    uint64_t evicted_key = 0;
  };
  // Takes a slot for `key` (which must be absent): `preferred` when it is free (so a batch of puts lands
  // in consecutive slots), else a recycled free slot, else a never-used one, else the least recently used
  // unpinned record's slot (evicting that record). The record starts unpinned, most recently used.
  Allocation allocate(uint64_t key, Slot preferred);
  // The record in `s` becomes most recently used (pinned records are outside the LRU: no-op).
  void touch(Slot s);
  // Pinned records leave the LRU list; unpinning puts the record back as most recently used.
  void set_pinned(Slot s, bool pinned);
  // Forgets the record in `s`; the slot goes to the front of the free list (reused first: warm).
  void release(Slot s);

  // Invariant check (tests): lists and map agree. Returns "" or a description.
  const char* check() const;

 private:
  enum class State : uint8_t { kFree, kLru, kPinned };
  // One of the two intrusive lists over prev_/next_ (head = oldest for the LRU, next to hand out for free).
  struct List {
    Slot head = kNoSlot, tail = kNoSlot;
    int64_t size = 0;
  };
  void push_back(List& l, Slot s);
  void push_front(List& l, Slot s);
  void unlink(List& l, Slot s);
  Slot take_fresh();
  Slot take_free(Slot preferred);  // kNoSlot when no slot is free

  int64_t capacity_ = 0;
  Slot next_fresh_ = 0;
  std::unordered_map<uint64_t, Slot> by_key_;
  std::vector<uint64_t> key_;
  std::vector<State> state_;
  std::vector<Slot> prev_, next_;
  List lru_, free_;
};

// What both backends share: the record size, the mutex, the index and the stats, and the members that
// only touch those. Stats conventions (both backends): puts counts records offered (failures included),
// bytes_written the record bytes accepted, bytes_read the record bytes returned by hits, records and
// used_bytes are read off the index. Thread-safety: as the backends' (every member takes mu_).
class IndexedTier : public ColdTier {
 public:
  size_t record_bytes() const override { return record_bytes_; }
  int io_threads() const { return workers_.size(); }
  bool contains(uint64_t key) const override;
  void pin(uint64_t key, bool pinned) override;
  ColdTierStats stats() const override;

 protected:
  // io_threads: threads (the caller included) that a batched call splits its copies, checksums and reads
  // over; 1 = the caller alone.
  IndexedTier(size_t record_bytes, int64_t capacity_slots, uint64_t cap_bytes, int io_threads = 1);

  // Runs fn(task) for task in [0, n) on the I/O threads and returns when all are done. One batch at a time
  // (a second caller waits): the pool runs one fork-join section at a time.
  template <class F>
  void for_each_task(int n, F&& fn) {
    std::lock_guard lock(workers_mu_);
    workers_.run(n, [&](int task, int) { fn(task); });
  }
  // The same, fn(task, thread) with thread in [0, io_threads()): what a task may keep per thread (a
  // buffer) is indexed by it, and no two tasks run on one thread at once.
  template <class F>
  void for_each_task_on_thread(int n, F&& fn) {
    std::lock_guard lock(workers_mu_);
    workers_.run(n, [&](int task, int thread) { fn(task, thread); });
  }
  // Tasks for `items` items: about four per thread (so one slow task does not leave the others idle), at
  // least `min_per_task` items each.
  int tasks_for(size_t items, size_t min_per_task) const;

  const size_t record_bytes_;
  mutable std::mutex mu_;
  SlotIndex index_;       // guarded by mu_
  ColdTierStats stats_;   // guarded by mu_; records / used_bytes are filled in by stats()

 private:
  std::mutex workers_mu_;  // may be taken while mu_ is held, never the other way round
  ThreadPool workers_;
};

}  // namespace kvpack::kv::cold
