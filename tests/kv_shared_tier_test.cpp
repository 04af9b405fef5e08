// The shared KV tier's parts one by one: the circuit breaker's state machine (time passed in), the value
// codec (every header field and the checksum guard the bytes), the 128-bit key chain, the --kv-shared
// spec parser, and the Redis backend against a real redis-server on a loopback port (skipped where
// Debian's redis-server is not installed), including a Redis frozen with SIGSTOP: fetches time out, the
// breaker opens and answers locally, and after SIGCONT the tier serves hits again.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kv/circuit_breaker.h"
#include "kv/shared_tier.h"

namespace kvpack::kv {
namespace {

using namespace std::chrono_literals;
using Clock = CircuitBreaker::Clock;

TEST(CircuitBreaker, OpensAfterConsecutiveFailuresAndLetsOneProbeThroughAfterTheWait) {
  CircuitBreaker b(3, 100ms);
  const Clock::time_point t0{};
  EXPECT_TRUE(b.allow(t0));
  b.failure(t0);
  b.failure(t0);
  b.success();  // a success in between resets the count
  b.failure(t0);
  b.failure(t0);
  EXPECT_EQ(b.state(), CircuitBreaker::State::Closed);
  b.failure(t0);  // third in a row
  EXPECT_EQ(b.state(), CircuitBreaker::State::Open);
  EXPECT_EQ(b.opens(), 1u);
  EXPECT_FALSE(b.allow(t0 + 50ms));
  EXPECT_FALSE(b.allow(t0 + 99ms));
  EXPECT_EQ(b.refused(), 2u);
  EXPECT_TRUE(b.allow(t0 + 100ms));  // the probe
  EXPECT_EQ(b.state(), CircuitBreaker::State::HalfOpen);
  EXPECT_FALSE(b.allow(t0 + 101ms));  // only one probe at a time
  EXPECT_EQ(b.refused(), 3u);
  b.success();
  EXPECT_EQ(b.state(), CircuitBreaker::State::Closed);
  EXPECT_TRUE(b.allow(t0 + 102ms));
  EXPECT_TRUE(b.allow(t0 + 102ms));
}

TEST(CircuitBreaker, AFailedProbeReopensForAnotherWait) {
  CircuitBreaker b(1, 100ms);
  const Clock::time_point t0{};
  b.failure(t0);
  ASSERT_EQ(b.state(), CircuitBreaker::State::Open);
  ASSERT_TRUE(b.allow(t0 + 100ms));
  b.failure(t0 + 110ms);
  EXPECT_EQ(b.state(), CircuitBreaker::State::Open);
  EXPECT_EQ(b.opens(), 2u);
  EXPECT_FALSE(b.allow(t0 + 200ms));  // reopened at 110 ms: closed to calls until 210 ms
  EXPECT_TRUE(b.allow(t0 + 210ms));
  // A failure reported while already open (a call that was in flight) changes nothing.
  b.failure(t0 + 211ms);
  b.failure(t0 + 212ms);
  EXPECT_EQ(b.opens(), 3u);
  EXPECT_STREQ(breaker_state_name(b.state()), "open");
}

// One block: 4 tokens, 2 streams of 64-byte records.
struct Block {
  SharedKey key{0x1234, 0x5678};
  std::vector<int32_t> tokens{5, 6, 7, 8};
  std::vector<uint8_t> a = std::vector<uint8_t>(64), b = std::vector<uint8_t>(64);
  Block() {
    for (size_t i = 0; i < 64; ++i) a[i] = static_cast<uint8_t>(i), b[i] = static_cast<uint8_t>(200 - i);
  }
  std::vector<const uint8_t*> records() const { return {a.data(), b.data()}; }
  std::string encoded() const {
    std::string v;
    const auto r = records();
    shared_value::encode(key, tokens, r, 64, v);
    return v;
  }
};

std::span<const uint8_t> bytes(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

TEST(SharedValue, RoundTripsTheRecordsStreamMajor) {
  const Block blk;
  const std::string v = blk.encoded();
  EXPECT_EQ(v.size(), shared_value::kHeaderBytes + 4 * sizeof(int32_t) + 2 * 64);
  std::vector<uint8_t> out(128, 0xee);
  ASSERT_TRUE(shared_value::decode(bytes(v), blk.key, blk.tokens, 2, 64, out.data()));
  EXPECT_TRUE(std::equal(blk.a.begin(), blk.a.end(), out.begin()));
  EXPECT_TRUE(std::equal(blk.b.begin(), blk.b.end(), out.begin() + 64));
}

TEST(SharedValue, EveryCorruptedByteAndEveryMismatchIsAMiss) {
  const Block blk;
  const std::string v = blk.encoded();
  std::vector<uint8_t> out(128);
  // Any single flipped bit anywhere in the value: header fields, tokens, checksum or records.
  for (size_t i = 0; i < v.size(); ++i) {
    std::string bad = v;
    bad[i] = static_cast<char>(bad[i] ^ 0x10);
    EXPECT_FALSE(shared_value::decode(bytes(bad), blk.key, blk.tokens, 2, 64, out.data())) << "byte " << i;
  }
  EXPECT_FALSE(shared_value::decode(bytes(v.substr(0, v.size() - 1)), blk.key, blk.tokens, 2, 64, out.data()));  // truncated
  EXPECT_FALSE(shared_value::decode(bytes(v + "x"), blk.key, blk.tokens, 2, 64, out.data()));                    // trailing byte
  EXPECT_FALSE(shared_value::decode({}, blk.key, blk.tokens, 2, 64, out.data()));
  EXPECT_FALSE(shared_value::decode(bytes(v), SharedKey{0x1234, 0x5679}, blk.tokens, 2, 64, out.data()));  // another key
  const std::vector<int32_t> other{5, 6, 7, 9};
  EXPECT_FALSE(shared_value::decode(bytes(v), blk.key, other, 2, 64, out.data()));  // other tokens (a hash collision)
  EXPECT_FALSE(shared_value::decode(bytes(v), blk.key, blk.tokens, 1, 128, out.data()));  // same size, other layout
  EXPECT_FALSE(shared_value::decode(bytes(v), blk.key, blk.tokens, 4, 32, out.data()));
}

TEST(SharedKeyChain, DependsOnModelSaltAndEveryEarlierBlock) {
  const std::vector<int32_t> b1{1, 2, 3, 4}, b2{5, 6, 7, 8}, b1x{1, 2, 3, 5};
  auto chain = [](uint64_t model, uint64_t salt, const std::vector<std::vector<int32_t>>& blocks) {
    SharedKeyChain c(model, salt);
    SharedKey k;
    for (const auto& b : blocks) k = c.next(b);
    return k;
  };
  const SharedKey k = chain(7, 0, {b1, b2});
  EXPECT_EQ(k, chain(7, 0, {b1, b2}));     // deterministic (replicas agree)
  EXPECT_FALSE(k == chain(8, 0, {b1, b2}));  // another model
  EXPECT_FALSE(k == chain(7, 1, {b1, b2}));  // another tenant (cache salt)
  EXPECT_FALSE(k == chain(7, 0, {b1x, b2}));  // same last block after another prefix
  EXPECT_FALSE(k == chain(7, 0, {b2}));
  EXPECT_FALSE(chain(7, 0, {b1}) == chain(7, 0, {b1x}));
}

TEST(SharedTierSpec, AcceptsTheDocumentedOptionsAndNamesWhatIsWrong) {
  auto t = make_shared_tier("redis://127.0.0.1:1?ttl=60&timeout_ms=20&queue=1M&failures=2&open_ms=500&max_blocks=8", 64, 2, 4, 1);
  ASSERT_NE(t, nullptr);
  EXPECT_STREQ(t->kind(), "redis");
  EXPECT_EQ(t->block_bytes(), 128u);
  const std::string d = t->describe();
  EXPECT_NE(d.find("127.0.0.1:1"), std::string::npos) << d;
  EXPECT_NE(make_shared_tier("redis://localhost", 64, 2, 4, 1), nullptr);  // defaults, no connection made yet
  for (const char* bad : {"redis:/x", "http://127.0.0.1:6379", "redis://", "redis://:6379", "redis://h:0", "redis://h:65536",
                          "redis://h:6x", "redis://h?ttl", "redis://h?ttl=abc", "redis://h?ttl=0", "redis://h?colour=blue",
                          "redis://h?timeout_ms=0", "redis://h?timeout_ms=60001", "redis://h?failures=0",
                          "redis://h?failures=4294967297", "redis://h?open_ms=0", "redis://h?max_blocks=0", "redis://h?queue=1T"}) {
    try {
      make_shared_tier(bad, 64, 2, 4, 1);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();  // names the spec
    }
  }
}

// ---- against a real redis-server ----

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("no free port");
  ::close(fd);
  return ntohs(a.sin_port);
}

bool port_open(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  if (fd >= 0) ::close(fd);
  return ok;
}

// redis-server on a loopback port, no persistence, stopped (and reaped) with the object.
class RedisServer {
 public:
  RedisServer() : port_(free_port()) {
    const char* bin = "/usr/bin/redis-server";
    if (::access(bin, X_OK) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      const std::string port = std::to_string(port_);
      ::execl(bin, bin, "--port", port.c_str(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", "/tmp",
              "--loglevel", "warning", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    for (int i = 0; i < 500 && !port_open(port_); ++i) std::this_thread::sleep_for(10ms);
  }
  ~RedisServer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGCONT);
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  bool up() const { return pid_ > 0 && port_open(port_); }
  int port() const { return port_; }
  void signal(int sig) const { ::kill(pid_, sig); }

 private:
  int port_;
  pid_t pid_ = -1;
};

TEST(RedisSharedTier, PublishedBlocksComeBackAndAFrozenRedisIsAnsweredLocally) {
  RedisServer redis;
  if (!redis.up()) GTEST_SKIP() << "redis-server not installed (apt-get install redis-server)";
  const std::string spec = "redis://127.0.0.1:" + std::to_string(redis.port()) + "?timeout_ms=50&failures=2&open_ms=300";
  auto tier = make_shared_tier(spec, 64, 2, 4, /*model_id=*/42);
  const Block blk;
  const auto recs = blk.records();
  ASSERT_TRUE(tier->publish(blk.key, blk.tokens, recs));
  tier->flush();
  SharedTierStats s = tier->stats();
  EXPECT_EQ(s.puts, 1u);
  EXPECT_EQ(s.put_failures, 0u);

  std::vector<uint8_t> out;
  const std::vector<SharedKey> keys{blk.key};
  ASSERT_EQ(tier->fetch(keys, blk.tokens, out), 1u);
  ASSERT_EQ(out.size(), 128u);
  EXPECT_TRUE(std::equal(blk.a.begin(), blk.a.end(), out.begin()));
  EXPECT_TRUE(std::equal(blk.b.begin(), blk.b.end(), out.begin() + 64));

  // A chain of two where only the first exists: one leading block.
  const std::vector<SharedKey> two{blk.key, SharedKey{9, 9}};
  const std::vector<int32_t> two_tokens{5, 6, 7, 8, 1, 1, 1, 1};
  EXPECT_EQ(tier->fetch(two, two_tokens, out), 1u);
  // The same key asked with other tokens (what a collision would look like): rejected, a miss.
  const std::vector<int32_t> other{5, 6, 7, 9};
  EXPECT_EQ(tier->fetch(keys, other, out), 0u);
  s = tier->stats();
  EXPECT_EQ(s.hits, 2u);
  EXPECT_GE(s.misses, 2u);
  EXPECT_EQ(s.checksum_failures, 1u);
  // Another model's tier (another key prefix) does not see the block.
  auto other_model = make_shared_tier(spec, 64, 2, 4, /*model_id=*/43);
  EXPECT_EQ(other_model->fetch(keys, blk.tokens, out), 0u);

  // Redis frozen (SIGSTOP: the socket accepts, nothing answers): each fetch ends at its timeout with a
  // miss; after `failures` of them the breaker opens and later fetches are answered without the network.
  redis.signal(SIGSTOP);
  EXPECT_EQ(tier->fetch(keys, blk.tokens, out), 0u);
  EXPECT_EQ(tier->fetch(keys, blk.tokens, out), 0u);
  s = tier->stats();
  EXPECT_GE(s.timeouts, 1u);
  EXPECT_GE(s.errors, 2u);
  EXPECT_EQ(s.breaker_opens, 1u);
  EXPECT_EQ(s.breaker_state, static_cast<int>(CircuitBreaker::State::Open));
  const uint64_t errors = s.errors;
  EXPECT_EQ(tier->fetch(keys, blk.tokens, out), 0u);
  s = tier->stats();
  EXPECT_EQ(s.errors, errors);  // refused by the breaker: no round trip
  EXPECT_GE(s.breaker_refused, 1u);
  EXPECT_FALSE(tier->publish(blk.key, blk.tokens, recs));  // publications are dropped while open, not queued
  EXPECT_GE(tier->stats().puts_dropped, 1u);

  // Redis back: once the open period has passed the probe succeeds and the block is served again.
  redis.signal(SIGCONT);
  size_t got = 0;
  for (int i = 0; i < 100 && got == 0; ++i) {
    std::this_thread::sleep_for(20ms);
    got = tier->fetch(keys, blk.tokens, out);
  }
  EXPECT_EQ(got, 1u);
  EXPECT_EQ(tier->stats().breaker_state, static_cast<int>(CircuitBreaker::State::Closed));
}

TEST(RedisSharedTier, ARedisThatIsDownIsNotAnErrorAtStartAndCostsNothingOnceTheBreakerOpens) {
  const int port = free_port();  // nothing listens here
  auto tier = make_shared_tier("redis://127.0.0.1:" + std::to_string(port) + "?failures=1&open_ms=60000", 64, 2, 4, 1);
  const Block blk;
  std::vector<uint8_t> out;
  const std::vector<SharedKey> keys{blk.key};
  EXPECT_EQ(tier->fetch(keys, blk.tokens, out), 0u);  // connection refused: counted
  SharedTierStats s = tier->stats();
  EXPECT_GE(s.errors, 1u);
  EXPECT_EQ(s.breaker_opens, 1u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(tier->fetch(keys, blk.tokens, out), 0u);
  s = tier->stats();
  EXPECT_GE(s.breaker_refused, 10u);
  EXPECT_EQ(s.errors, 1u);
}

}  // namespace
}  // namespace kvpack::kv
