// The host cold tier ("host:BYTES"): records in RAM within a byte cap.
//
// Storage: capacity = cap_bytes / record_bytes slots, kept in slabs of about 4 MiB (at least one record)
// that are allocated when a slot in them is first used and kept until the tier is destroyed — memory
// grows with the high-water mark of records held, never beyond the cap rounded up to whole records, and
// costs one allocation per slab, none per record. Records live at slab[slot / per_slab] + offset; a freed
// slot is reused first (its memory is warm). If the system refuses a slab, that put fails cleanly.
// Index: cold::SlotIndex (key -> slot, intrusive LRU over unpinned records, free list; all O(1)).
// Every record's XXH3-64 (key + bytes) is taken on put and verified on get: a stray write into the
// slab (or a bit flip) turns into a counted miss, never into wrong KV.
//
// Batches: put_many / get_many split their copies and checksums over `io_threads` threads (the caller
// included): a swap of a 2048-token sequence moves a few hundred MiB, and one core cannot both copy at
// DRAM speed and hash; the engine passes its thread count (its compute threads are idle while the
// scheduler swaps between steps).
// Thread-safety: every member may be called from any thread; one mutex guards the index, the slabs and
// the stats. Copies into and out of the slabs happen under it (a host tier is memcpy-bound and is driven
// by the KV manager's one scheduling thread); put() checksums its record before taking it, get() verifies
// under it (so a record dropped for a bad checksum and the stats change together).
// Sizes: put() of a record that is not record_bytes long, or get() into such a buffer, throws
// std::invalid_argument (a caller bug, not a cold-tier condition). The same holds for the file tier.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "kv/cold_tier.h"
#include "kv/cold_tier_index.h"
#include "util/huge_alloc.h"

namespace kvpack::kv {

class HostColdTier final : public cold::IndexedTier {
 public:
  // Throws std::invalid_argument when record_bytes is 0 or cap_bytes holds no record.
  HostColdTier(uint64_t cap_bytes, size_t record_bytes, int io_threads = 1);

  const char* kind() const override { return "host"; }
  bool put(uint64_t key, std::span<const uint8_t> data) override;
  bool get(uint64_t key, std::span<uint8_t> out) override;
  void erase(uint64_t key) override;
  void put_many(std::span<const uint64_t> keys, std::span<const uint8_t* const> data, std::span<bool> ok) override;
  void get_many(std::span<const uint64_t> keys, std::span<uint8_t* const> out, std::span<bool> ok) override;
  void take_many(std::span<const uint64_t> keys, std::span<uint8_t* const> out, std::span<bool> ok) override;

  // Memory obtained for slabs so far (the figure the byte cap bounds).
  size_t reserved_bytes() const;
  // Tests: the stored bytes of `key` (nullptr when absent), to simulate a stray write. Not for production.
  uint8_t* record_for_testing(uint64_t key);

 private:
  uint8_t* record_at(cold::Slot s);  // nullptr when its slab is not allocated (the system refused it)
  // Under mu_: a record of `key` with checksum `sum` gets a slot (replacing, or allocating / evicting);
  // nullptr (stats counted) when none can be had. The caller copies the bytes in.
  uint8_t* place(uint64_t key, uint64_t sum);
  // Under mu_: the outcome of reading slot `s` (verified == its checksum matched); false on a mismatch.
  // A hit is refreshed in the LRU (take_many forgets its records itself, beside the copies).
  bool settle_read(cold::Slot s, bool verified);
  void read_many(std::span<const uint64_t> keys, std::span<uint8_t* const> out, std::span<bool> ok, bool take);

  const size_t slots_per_slab_;
  std::vector<std::unique_ptr<uint8_t, FreeBytes>> slabs_;  // huge_alloc: 2 MiB-aligned
  std::vector<uint64_t> checksum_;  // per slot touched
  bool logged_mismatch_ = false;
};

// Copy bandwidth of this machine: copies a `bytes` buffer into another (both touched first, so no page
// faults are timed) a few times and returns the best rate in GB/s (1e9 bytes/s), counting each byte copied
// once (not read + write). `threads` threads copy one contiguous part each (the figure a tier with that
// many I/O threads is set against). Use a size well above the last-level cache (e.g. 256 MiB) for a DRAM
// figure.
double measure_memcpy_gbps(size_t bytes, int threads = 1);

}  // namespace kvpack::kv
