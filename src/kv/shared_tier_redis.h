// The shared KV tier on Redis (hiredis, synchronous API): one value per prefix block under
// "kvpack:v1:<model id>:<block key>" (hex), written with SET .. EX ttl and read with GETEX .. EX ttl (a hit
// refreshes the TTL, so a popular system prompt stays); memory limits and eviction are Redis's
// (maxmemory + allkeys-lru, deploy/redis/kvpack.conf). Redis >= 6.2 for GETEX; with an older server the
// reads fall back to GET (TTL not refreshed).
//
// Two connections: one for reads, made and used under a mutex by the caller of fetch() (the scheduler
// thread: the wait is bounded by timeout_ms), and one owned by a background writer thread that drains
// the publication queue in pipelined batches. Both share one circuit breaker; a failed round trip drops
// its connection (the next call reconnects, within the breaker's rules). A fetch of several blocks is
// one pipelined round trip.
//
// Thread-safety: every member may be called from any thread.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "kv/circuit_breaker.h"
#include "kv/shared_tier.h"

struct redisContext;

namespace kvpack::kv {

struct RedisTierOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  int64_t ttl_s = 3600;
  int timeout_ms = 50;              // connect and each read round trip; the writer allows 10x (it waits on nobody)
  uint64_t queue_bytes = 64 << 20;  // publications waiting for the writer; beyond it they are dropped
  int breaker_failures = 3;
  int breaker_open_ms = 2000;
  int max_fetch_blocks = 256;
};

class RedisSharedTier final : public SharedTier {
 public:
  RedisSharedTier(const RedisTierOptions& o, size_t record_bytes, int32_t n_streams, int32_t page_size, uint64_t model_id);
  ~RedisSharedTier() override;  // stops the writer; publications still queued are dropped (a cache)

  const char* kind() const override { return "redis"; }
  std::string describe() const override;
  bool publish(const SharedKey& key, std::span<const int32_t> tokens, std::span<const uint8_t* const> records) override;
  size_t fetch(std::span<const SharedKey> keys, std::span<const int32_t> tokens, std::vector<uint8_t>& out) override;
  void flush() override;
  SharedTierStats stats() const override;

  std::string key_name(const SharedKey& key) const;

 private:
  struct ContextDeleter {
    void operator()(redisContext* c) const;
  };
  using Context = std::unique_ptr<redisContext, ContextDeleter>;
  struct Item {
    std::string key, value;
  };
  // A connected context, or null (counted as an error, reported to the breaker).
  Context connect(int timeout_ms);
  // Records a failed round trip on `c` (timeout or not) and drops the connection.
  void fail_round_trip(Context& c);
  void writer_loop();

  const RedisTierOptions opt_;
  const std::string prefix_;  // "kvpack:v1:<model id>:"
  CircuitBreaker breaker_;

  std::mutex read_mu_;
  Context read_conn_;
  bool use_get_ = false;   // the server does not know GETEX (Redis < 6.2)
  std::string key_buf_;    // scratch for fetch (under read_mu_)
  std::vector<std::string> keys_buf_;

  mutable std::mutex q_mu_;
  std::condition_variable q_cv_, idle_cv_;
  std::deque<Item> queue_;
  uint64_t queued_bytes_ = 0;
  bool writing_ = false, stop_ = false;
  std::thread writer_;

  struct Counters {
    std::atomic<uint64_t> fetches{0}, blocks_requested{0}, hits{0}, misses{0}, checksum_failures{0};
    std::atomic<uint64_t> puts{0}, put_failures{0}, puts_dropped{0}, bytes_written{0}, bytes_read{0};
    std::atomic<uint64_t> errors{0}, timeouts{0};
  };
  mutable Counters c_;
};

}  // namespace kvpack::kv
