// The shared KV tier: prefix-cache blocks shared between replicas of one model (a second level below
// the local cold tier, for prefix blocks only). A prefix computed on one replica is published here and
// a replica that misses it locally loads it instead of recomputing it.
//
// What goes here and what does not: only prefix blocks, whose bytes are a pure function of (model, KV
// layout, cache salt, token chain). Swapped-out sequences' pages and compression's evicted tokens are
// per-process state and stay in the local cold tier (kv/cold_tier.h).
//
// Keys. A block is named by a 128-bit chained hash: key(b) = XXH3-128(key(b-1) ‖ tokens of block b)
// seeded with the model identity and the request's cache salt (SharedKeyChain). The model identity
// (engine/model_identity.h) hashes the model file, the KV element type, the page size and the kernel
// paths, i.e. everything that makes a page's bytes valid: two replicas of the same model on the same
// kind of CPU share, different models or tenants (salts) never collide. 128 bits because the store is
// shared by a fleet: a 64-bit chain would reach a birthday collision within reach of a large
// deployment's lifetime; a collision would hand out wrong KV silently.
//
// Values. One value per block: a header (magic, version, stream count, record size, the block key and
// token count), the block's tokens, then the block's records (one KV page per layer x KV head stream,
// kv/page_pool.h's record layout), all under an XXH3-64 checksum. A value is used only when every field
// matches what the reader expects and the checksum holds — otherwise it is a miss (counted), never data.
//
// Failure model: the tier is an optimisation. publish() never waits on the network (a bounded queue, a
// background writer; a full queue drops and counts), fetch() waits at most the configured timeout and
// is short-circuited by a breaker (kv/circuit_breaker.h) while the store is failing. No request fails
// because of the shared tier: on any problem the caller recomputes.
//
// Thread-safety: every member may be called from any thread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace kvpack::kv {

struct SharedKey {
  uint64_t lo = 0, hi = 0;
  bool operator==(const SharedKey&) const = default;
};

// The 128-bit chain over a prompt's blocks (see the header comment).
class SharedKeyChain {
 public:
  SharedKeyChain(uint64_t model_id, uint64_t salt);
  // Key of the next block given its tokens; advances the chain.
  SharedKey next(std::span<const int32_t> block_tokens);

 private:
  uint64_t seed_;
  SharedKey parent_{};
};

struct SharedTierStats {
  uint64_t fetches = 0;            // fetch() calls that went to the store
  uint64_t blocks_requested = 0;   // blocks asked for by those calls
  uint64_t hits = 0, misses = 0;   // blocks: found and valid / absent (a miss ends a prefix)
  uint64_t checksum_failures = 0;  // values rejected (checksum, header or token mismatch): misses too
  uint64_t puts = 0;               // blocks the store accepted
  uint64_t put_failures = 0;       // blocks lost to a store error or timeout
  uint64_t puts_dropped = 0;       // blocks not written: queue full or breaker open (never waited for)
  uint64_t bytes_written = 0, bytes_read = 0;
  uint64_t errors = 0;             // failed round trips (connection refused / reset / protocol), timeouts included
  uint64_t timeouts = 0;           // round trips that ran past the timeout
  uint64_t breaker_opens = 0;      // times the breaker opened
  uint64_t breaker_refused = 0;    // calls answered locally because the breaker was open
  int breaker_state = 0;           // 0 closed, 1 open, 2 half-open
  uint64_t queue_bytes = 0;        // publications waiting for the writer now
};

class SharedTier {
 public:
  virtual ~SharedTier() = default;
  virtual const char* kind() const = 0;  // "redis"
  virtual std::string describe() const = 0;  // for the start-up note: where, TTL, timeouts
  size_t record_bytes() const { return record_bytes_; }
  int32_t n_streams() const { return n_streams_; }
  int32_t page_size() const { return page_size_; }
  size_t block_bytes() const { return record_bytes_ * static_cast<size_t>(n_streams_); }

  // Queues block `key` (its `page_size` tokens and one record per stream, copied now) for writing.
  // Returns at once; false when it was dropped (queue full, breaker open).
  virtual bool publish(const SharedKey& key, std::span<const int32_t> tokens, std::span<const uint8_t* const> records) = 0;
  // Looks up the blocks `keys` (with their tokens, keys.size() x page_size, for verification) in one
  // round trip and returns how many leading blocks were found valid; their bytes are in `out`
  // (block_bytes() each, stream-major like publish's records). 0 on any error, timeout or open breaker.
  virtual size_t fetch(std::span<const SharedKey> keys, std::span<const int32_t> tokens, std::vector<uint8_t>& out) = 0;
  // Waits until queued publications are written or dropped (tests, shutdown).
  virtual void flush() = 0;
  virtual SharedTierStats stats() const = 0;

 protected:
  SharedTier(size_t record_bytes, int32_t n_streams, int32_t page_size)
      : record_bytes_(record_bytes), n_streams_(n_streams), page_size_(page_size) {}

 private:
  size_t record_bytes_;
  int32_t n_streams_, page_size_;
};

// Value encoding (exposed for tests and for other backends).
namespace shared_value {
constexpr uint32_t kMagic = 0x4250564b;  // "KVPB"
constexpr uint16_t kVersion = 1;
constexpr size_t kHeaderBytes = 48;
// Header + tokens + records into `out` (replaced).
void encode(const SharedKey& key, std::span<const int32_t> tokens, std::span<const uint8_t* const> records, size_t record_bytes,
            std::string& out);
// Checks `value` against what the reader expects; on success copies the records (n_streams x
// record_bytes) to `dst` and returns true.
bool decode(std::span<const uint8_t> value, const SharedKey& key, std::span<const int32_t> tokens, int32_t n_streams,
            size_t record_bytes, uint8_t* dst);
}  // namespace shared_value

// Parses a spec and makes the tier (connections are made lazily: a store that is down at start-up is
// not an error, the breaker counts it). Spec: redis://HOST[:PORT][?key=value&...] with keys
//   ttl=SECONDS (default 3600), timeout_ms (default 50: connect and each round trip), queue=BYTES
//   (default 64M: publications waiting), failures=N (default 3: consecutive failures that open the
//   breaker), open_ms (default 2000: how long it stays open), max_blocks (default 256: blocks per fetch).
// Throws std::invalid_argument naming the spec when it cannot be parsed.
std::unique_ptr<SharedTier> make_shared_tier(const std::string& spec, size_t record_bytes, int32_t n_streams, int32_t page_size,
                                             uint64_t model_id);

}  // namespace kvpack::kv
