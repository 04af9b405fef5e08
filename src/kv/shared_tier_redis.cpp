#include "kv/shared_tier_redis.h"

#include <hiredis.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace kvpack::kv {

namespace {
std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}
timeval to_timeval(int ms) { return timeval{ms / 1000, (ms % 1000) * 1000}; }
constexpr size_t kWriteBatchItems = 32;
constexpr uint64_t kWriteBatchBytes = 8 << 20;
}  // namespace

void RedisSharedTier::ContextDeleter::operator()(redisContext* c) const { redisFree(c); }

RedisSharedTier::RedisSharedTier(const RedisTierOptions& o, size_t record_bytes, int32_t n_streams, int32_t page_size,
                                 uint64_t model_id)
    : SharedTier(record_bytes, n_streams, page_size),
      opt_(o),
      prefix_("kvpack:v1:" + hex64(model_id) + ":"),
      breaker_(o.breaker_failures, std::chrono::milliseconds(o.breaker_open_ms)) {
  writer_ = std::thread([this] { writer_loop(); });
}

RedisSharedTier::~RedisSharedTier() {
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    stop_ = true;
  }
  q_cv_.notify_all();
  writer_.join();
}

std::string RedisSharedTier::describe() const {
  return "redis " + opt_.host + ":" + std::to_string(opt_.port) + ", keys " + prefix_ + "*, ttl " + std::to_string(opt_.ttl_s) +
         " s, timeout " + std::to_string(opt_.timeout_ms) + " ms, breaker " + std::to_string(opt_.breaker_failures) + " failures / " +
         std::to_string(opt_.breaker_open_ms) + " ms";
}

std::string RedisSharedTier::key_name(const SharedKey& key) const { return prefix_ + hex64(key.hi) + hex64(key.lo); }

RedisSharedTier::Context RedisSharedTier::connect(int timeout_ms) {
  Context c(redisConnectWithTimeout(opt_.host.c_str(), opt_.port, to_timeval(timeout_ms)));
  if (c && c->err == 0 && redisSetTimeout(c.get(), to_timeval(timeout_ms)) == REDIS_OK) return c;
  // Refused / unreachable / timed out: an error like any failed round trip.
  const bool timed_out = c && (std::strstr(c->errstr, "timed out") || std::strstr(c->errstr, "temporarily unavailable"));
  ++c_.errors;
  if (timed_out) ++c_.timeouts;
  breaker_.failure();
  return nullptr;
}

void RedisSharedTier::fail_round_trip(Context& c) {
  // hiredis reports a read past SO_RCVTIMEO as an I/O error "Resource temporarily unavailable".
  const bool timed_out = c && c->err == REDIS_ERR_IO &&
                         (std::strstr(c->errstr, "temporarily unavailable") || std::strstr(c->errstr, "timed out"));
  ++c_.errors;
  if (timed_out) ++c_.timeouts;
  breaker_.failure();
  c.reset();
}

bool RedisSharedTier::publish(const SharedKey& key, std::span<const int32_t> tokens, std::span<const uint8_t* const> records) {
  if (breaker_.state() == CircuitBreaker::State::Open) {  // the writer would drop it: do not even copy
    ++c_.puts_dropped;
    return false;
  }
  Item item;
  item.key = key_name(key);
  shared_value::encode(key, tokens, records, record_bytes(), item.value);
  const uint64_t bytes = item.value.size();
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    if (queued_bytes_ + bytes > opt_.queue_bytes) {
      ++c_.puts_dropped;
      return false;
    }
    queued_bytes_ += bytes;
    queue_.push_back(std::move(item));
  }
  q_cv_.notify_one();
  return true;
}

void RedisSharedTier::writer_loop() {
  Context conn;
  std::vector<Item> batch;
  const std::string ttl = std::to_string(opt_.ttl_s);
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(q_mu_);
      writing_ = false;
      idle_cv_.notify_all();
      q_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) {
        c_.puts_dropped += queue_.size();
        queue_.clear();
        queued_bytes_ = 0;
        idle_cv_.notify_all();
        return;
      }
      writing_ = true;
      batch.clear();
      uint64_t bytes = 0;
      while (!queue_.empty() && batch.size() < kWriteBatchItems && bytes < kWriteBatchBytes) {
        bytes += queue_.front().value.size();
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      queued_bytes_ -= bytes;
    }
    if (!breaker_.allow()) {
      c_.puts_dropped += batch.size();
      continue;
    }
    if (!conn) conn = connect(10 * opt_.timeout_ms);
    if (!conn) {
      c_.put_failures += batch.size();
      continue;
    }
    bool ok = true;
    for (const Item& it : batch) {
      const char* argv[5] = {"SET", it.key.data(), it.value.data(), "EX", ttl.data()};
      const size_t len[5] = {3, it.key.size(), it.value.size(), 2, ttl.size()};
      ok &= redisAppendCommandArgv(conn.get(), 5, argv, len) == REDIS_OK;
    }
    size_t done = 0;
    for (; ok && done < batch.size(); ++done) {
      void* r = nullptr;
      if (redisGetReply(conn.get(), &r) != REDIS_OK) {
        ok = false;
        break;
      }
      auto* reply = static_cast<redisReply*>(r);
      if (reply->type == REDIS_REPLY_STATUS) {
        ++c_.puts;
        c_.bytes_written += batch[done].value.size();
      } else {  // e.g. OOM with maxmemory and a noeviction policy: the store refused it
        ++c_.put_failures;
      }
      freeReplyObject(reply);
    }
    if (!ok) {
      c_.put_failures += batch.size() - done;
      fail_round_trip(conn);
    } else {
      breaker_.success();
    }
  }
}

void RedisSharedTier::flush() {
  std::unique_lock<std::mutex> lock(q_mu_);
  idle_cv_.wait(lock, [&] { return stop_ || (queue_.empty() && !writing_); });
}

size_t RedisSharedTier::fetch(std::span<const SharedKey> keys, std::span<const int32_t> tokens, std::vector<uint8_t>& out) {
  const size_t n = std::min(keys.size(), static_cast<size_t>(opt_.max_fetch_blocks));
  if (n == 0) return 0;
  std::lock_guard<std::mutex> lock(read_mu_);
  if (!breaker_.allow()) return 0;
  if (!read_conn_) read_conn_ = connect(opt_.timeout_ms);
  if (!read_conn_) return 0;
  ++c_.fetches;
  c_.blocks_requested += n;
  const std::string ttl = std::to_string(opt_.ttl_s);
  keys_buf_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    keys_buf_[i] = key_name(keys[i]);
    if (use_get_) {
      const char* argv[2] = {"GET", keys_buf_[i].data()};
      const size_t len[2] = {3, keys_buf_[i].size()};
      redisAppendCommandArgv(read_conn_.get(), 2, argv, len);
    } else {
      const char* argv[4] = {"GETEX", keys_buf_[i].data(), "EX", ttl.data()};
      const size_t len[4] = {5, keys_buf_[i].size(), 2, ttl.size()};
      redisAppendCommandArgv(read_conn_.get(), 4, argv, len);
    }
  }
  const size_t bb = block_bytes();
  const size_t ps = static_cast<size_t>(page_size());
  out.resize(n * bb);
  size_t found = 0;
  bool prefix = true;  // still in the leading run of valid blocks
  for (size_t i = 0; i < n; ++i) {
    void* r = nullptr;
    if (redisGetReply(read_conn_.get(), &r) != REDIS_OK) {
      fail_round_trip(read_conn_);
      return found;  // the blocks verified before the failure are good
    }
    auto* reply = static_cast<redisReply*>(r);
    if (reply->type == REDIS_REPLY_ERROR && std::strstr(reply->str, "unknown command")) use_get_ = true;  // next fetch uses GET
    if (prefix) {
      if (reply->type == REDIS_REPLY_STRING) {
        c_.bytes_read += reply->len;
        const std::span<const uint8_t> value(reinterpret_cast<const uint8_t*>(reply->str), reply->len);
        if (shared_value::decode(value, keys[i], tokens.subspan(i * ps, ps), n_streams(), record_bytes(), out.data() + i * bb)) {
          ++found;
          ++c_.hits;
        } else {
          ++c_.checksum_failures;
          ++c_.misses;
          prefix = false;
        }
      } else {
        ++c_.misses;
        prefix = false;
      }
    }
    freeReplyObject(reply);
  }
  breaker_.success();
  return found;
}

SharedTierStats RedisSharedTier::stats() const {
  SharedTierStats s;
  s.fetches = c_.fetches;
  s.blocks_requested = c_.blocks_requested;
  s.hits = c_.hits;
  s.misses = c_.misses;
  s.checksum_failures = c_.checksum_failures;
  s.puts = c_.puts;
  s.put_failures = c_.put_failures;
  s.puts_dropped = c_.puts_dropped;
  s.bytes_written = c_.bytes_written;
  s.bytes_read = c_.bytes_read;
  s.errors = c_.errors;
  s.timeouts = c_.timeouts;
  s.breaker_opens = breaker_.opens();
  s.breaker_refused = breaker_.refused();
  s.breaker_state = static_cast<int>(breaker_.state());
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    s.queue_bytes = queued_bytes_;
  }
  return s;
}

}  // namespace kvpack::kv
