// The cold KV tier: where pages go when the hot page pool lets them go — evicted runs from compaction,
// swapped-out (preempted) sequences, spilled prefix-cache blocks — so they can come back bit-identical.
//
// A tier stores fixed-size records (one KV page's bytes plus its per-slot positions, laid out by the
// caller; `record_bytes` is fixed at construction) under 64-bit keys chosen by the caller (the KV
// manager composes them from a sequence id or a block hash, a stream and a page index). Within its byte
// cap it evicts least-recently-used records. Every record carries a checksum (XXH3-64 over key and
// bytes); a record that fails it, is truncated, or cannot be read is a *miss* — counted, logged once,
// never returned as data. A put() that cannot be honoured (cap full of pinned records, I/O error, disk
// full) returns false and stores nothing: callers fall back (recompute), nothing is lost.
//
// Backends (make_cold_tier):
//   "host:BYTES"       records in RAM (frees decode bandwidth: fewer hot pages to attend)
//   "dir:PATH:BYTES"   records in one preallocated file under PATH, addressed in O(1) by slot
//                      (slot * record_bytes, pread/pwrite); this is the one that frees RAM. A directory
//                      left by a killed process is discarded at start (the file is recreated): a cold
//                      tier is a cache, not a database.
//   "remote" backends (a store shared across replicas) implement the same interface later.
// Batched calls (put_many / get_many) exist so a backend can coalesce adjacent records into one system
// call and run copies off the caller's critical path; the file backend writes through a background
// thread (put returns once the bytes are staged; a get of a staged record is served from the stage).
//
// Thread-safety: every member may be called from any thread (backends lock internally).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace kvpack::kv {

struct ColdTierStats {
  uint64_t cap_bytes = 0;
  uint64_t used_bytes = 0;        // records stored x record_bytes
  uint64_t records = 0;           // stored now
  uint64_t puts = 0, put_failures = 0;   // put_failures: tier full (all pinned) or I/O error
  uint64_t gets = 0, hits = 0, misses = 0;
  uint64_t checksum_failures = 0; // misses caused by a failed checksum or a short read
  uint64_t evictions = 0;         // records dropped to make room (LRU)
  uint64_t bytes_written = 0, bytes_read = 0;
};

class ColdTier {
 public:
  virtual ~ColdTier() = default;

  virtual const char* kind() const = 0;   // "host", "dir"
  virtual size_t record_bytes() const = 0;

  // Stores `data` (exactly record_bytes) under `key`, replacing an older record with that key.
  // Evicts LRU unpinned records when the cap is reached. Returns false (storing nothing) when it cannot.
  virtual bool put(uint64_t key, std::span<const uint8_t> data) = 0;
  // Reads the record into `out` (record_bytes); false on a miss (absent, evicted, checksum failure, I/O
  // error). A hit refreshes the record's LRU position.
  virtual bool get(uint64_t key, std::span<uint8_t> out) = 0;
  virtual void erase(uint64_t key) = 0;
  virtual bool contains(uint64_t key) const = 0;
  // Pinned records are never evicted to make room (a swapped-out sequence's pages must survive until it
  // is resumed); erase() still removes them.
  virtual void pin(uint64_t key, bool pinned) = 0;

  // Batched forms: the result is per record (false = that put failed / that get missed). Records with
  // consecutive keys written together are read back with few system calls.
  virtual void put_many(std::span<const uint64_t> keys, std::span<const uint8_t* const> data, std::span<bool> ok);
  virtual void get_many(std::span<const uint64_t> keys, std::span<uint8_t* const> out, std::span<bool> ok);
  // get_many, then erase of the records it returned (a swap-in: the pages are hot again, the tier copy is
  // dead weight). Backends do it in one pass over the index; records it missed are erased too.
  virtual void take_many(std::span<const uint64_t> keys, std::span<uint8_t* const> out, std::span<bool> ok);
  // Waits until staged writes are durable in the backend (tests, shutdown).
  virtual void flush() {}

  virtual ColdTierStats stats() const = 0;
};

// Parses a spec ("host:BYTES" or "dir:PATH:BYTES"; BYTES accepts K/M/G/T/KiB/MiB/GiB/TiB suffixes, all
// powers of 1024, and plain bytes) and makes the tier for records of `record_bytes`. `io_threads`: the
// threads a batched copy may use (the engine's thread count); a file tier reads with at least 4. Throws
// std::invalid_argument with a message naming the spec — also when the cap holds no record or PATH cannot
// be used. Backends: kv/cold_tier_host.h, kv/cold_tier_file.h (layout, start-up, writer, I/O figures).
std::unique_ptr<ColdTier> make_cold_tier(const std::string& spec, size_t record_bytes, int io_threads = 1);

}  // namespace kvpack::kv
