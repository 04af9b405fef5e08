// SharedKeyChain, the value encoding of a shared block, and make_shared_tier (spec parsing).
#include "kv/shared_tier.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <climits>
#include <cstring>
#include <stdexcept>
#include <string_view>

#include "kv/shared_tier_redis.h"

namespace kvpack::kv {

SharedKeyChain::SharedKeyChain(uint64_t model_id, uint64_t salt)
    : seed_(XXH3_64bits_withSeed(&salt, sizeof salt, model_id ^ 0x6b767061636b7631ull /* "kvpackv1" */)) {}

SharedKey SharedKeyChain::next(std::span<const int32_t> block_tokens) {
  XXH3_state_t st;
  XXH3_INITSTATE(&st);  // reset_withSeed reads the old seed: stack garbage equal to it skips the secret
  XXH3_128bits_reset_withSeed(&st, seed_);
  XXH3_128bits_update(&st, &parent_, sizeof parent_);
  XXH3_128bits_update(&st, block_tokens.data(), block_tokens.size_bytes());
  const XXH128_hash_t h = XXH3_128bits_digest(&st);
  parent_ = SharedKey{h.low64, h.high64};
  return parent_;
}

namespace shared_value {
namespace {
template <class T>
void put_le(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);  // x86-64 / aarch64 are little-endian; values never cross architectures
}
template <class T>
T get_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
constexpr size_t kChecksumAt = 40;

uint64_t checksum(const uint8_t* header, std::span<const uint8_t> rest) {
  XXH3_state_t st;
  XXH3_INITSTATE(&st);  // reset_withSeed reads the old seed: stack garbage equal to it skips the secret
  XXH3_64bits_reset(&st);
  XXH3_64bits_update(&st, header, kChecksumAt);
  XXH3_64bits_update(&st, rest.data(), rest.size());
  return XXH3_64bits_digest(&st);
}
}  // namespace

void encode(const SharedKey& key, std::span<const int32_t> tokens, std::span<const uint8_t* const> records, size_t record_bytes,
            std::string& out) {
  const size_t body = tokens.size_bytes() + records.size() * record_bytes;
  out.resize(kHeaderBytes + body);
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  std::memset(p, 0, kHeaderBytes);
  put_le<uint32_t>(p + 0, kMagic);
  put_le<uint16_t>(p + 4, kVersion);
  put_le<uint32_t>(p + 8, static_cast<uint32_t>(records.size()));
  put_le<uint32_t>(p + 12, static_cast<uint32_t>(record_bytes));
  put_le<uint64_t>(p + 16, key.lo);
  put_le<uint64_t>(p + 24, key.hi);
  put_le<uint32_t>(p + 32, static_cast<uint32_t>(tokens.size()));
  uint8_t* q = p + kHeaderBytes;
  std::memcpy(q, tokens.data(), tokens.size_bytes());
  q += tokens.size_bytes();
  for (const uint8_t* r : records) {
    std::memcpy(q, r, record_bytes);
    q += record_bytes;
  }
  put_le<uint64_t>(p + kChecksumAt, checksum(p, {p + kHeaderBytes, body}));
}

bool decode(std::span<const uint8_t> value, const SharedKey& key, std::span<const int32_t> tokens, int32_t n_streams,
            size_t record_bytes, uint8_t* dst) {
  const size_t payload = static_cast<size_t>(n_streams) * record_bytes;
  if (value.size() != kHeaderBytes + tokens.size_bytes() + payload) return false;
  const uint8_t* p = value.data();
  if (get_le<uint32_t>(p) != kMagic || get_le<uint16_t>(p + 4) != kVersion) return false;
  if (get_le<uint32_t>(p + 8) != static_cast<uint32_t>(n_streams) || get_le<uint32_t>(p + 12) != record_bytes) return false;
  if (get_le<uint64_t>(p + 16) != key.lo || get_le<uint64_t>(p + 24) != key.hi) return false;
  if (get_le<uint32_t>(p + 32) != tokens.size()) return false;
  if (std::memcmp(p + kHeaderBytes, tokens.data(), tokens.size_bytes()) != 0) return false;
  if (get_le<uint64_t>(p + kChecksumAt) != checksum(p, value.subspan(kHeaderBytes))) return false;
  std::memcpy(dst, p + kHeaderBytes + tokens.size_bytes(), payload);
  return true;
}
}  // namespace shared_value

namespace {

bool parse_u64(std::string_view s, uint64_t& out) {
  if (s.empty()) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9' || v > (UINT64_MAX - 9) / 10) return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  out = v;
  return true;
}

// BYTES with an optional K/M/G suffix (powers of 1024), as --kv-cold.
bool parse_size(std::string_view s, uint64_t& out) {
  int shift = 0;
  if (!s.empty()) {
    switch (s.back()) {
      case 'K': case 'k': shift = 10; break;
      case 'M': case 'm': shift = 20; break;
      case 'G': case 'g': shift = 30; break;
      default: break;
    }
    if (shift) s.remove_suffix(1);
  }
  if (!parse_u64(s, out) || out > (UINT64_MAX >> shift)) return false;
  out <<= shift;
  return true;
}

}  // namespace

std::unique_ptr<SharedTier> make_shared_tier(const std::string& spec, size_t record_bytes, int32_t n_streams, int32_t page_size,
                                             uint64_t model_id) {
  const auto fail = [&](const std::string& why) { throw std::invalid_argument("--kv-shared '" + spec + "' : " + why); };
  std::string_view s = spec;
  if (!s.starts_with("redis://")) fail("expected redis://HOST[:PORT][?ttl=S&timeout_ms=MS&queue=BYTES&failures=N&open_ms=MS&max_blocks=N]");
  s.remove_prefix(8);
  RedisTierOptions o;
  const size_t q = s.find('?');
  std::string_view where = s.substr(0, q);
  std::string_view query = q == std::string_view::npos ? std::string_view{} : s.substr(q + 1);
  const size_t colon = where.rfind(':');
  if (colon != std::string_view::npos) {
    uint64_t port = 0;
    if (!parse_u64(where.substr(colon + 1), port) || port == 0 || port > 65535) fail("PORT must be 1..65535");
    o.port = static_cast<int>(port);
    where = where.substr(0, colon);
  }
  if (where.empty()) fail("HOST is empty");
  o.host = std::string(where);
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view kv = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    const size_t eq = kv.find('=');
    if (eq == std::string_view::npos) fail("option '" + std::string(kv) + "' needs a value (key=value)");
    const std::string_view name = kv.substr(0, eq), value = kv.substr(eq + 1);
    uint64_t v = 0;
    const bool ok = name == "queue" ? parse_size(value, v) : parse_u64(value, v);
    if (!ok) fail("option '" + std::string(name) + "': '" + std::string(value) + "' is not a number");
    if (name != "queue" && v > static_cast<uint64_t>(INT32_MAX)) fail("option '" + std::string(name) + "': " + std::string(value) + " is too large");
    if (name == "ttl") o.ttl_s = static_cast<int64_t>(v);
    else if (name == "timeout_ms") o.timeout_ms = static_cast<int>(v);
    else if (name == "queue") o.queue_bytes = v;
    else if (name == "failures") o.breaker_failures = static_cast<int>(v);
    else if (name == "open_ms") o.breaker_open_ms = static_cast<int>(v);
    else if (name == "max_blocks") o.max_fetch_blocks = static_cast<int>(v);
    else fail("unknown option '" + std::string(name) + "' (ttl, timeout_ms, queue, failures, open_ms, max_blocks)");
  }
  if (o.ttl_s < 1) fail("ttl must be at least 1 second");
  if (o.timeout_ms < 1 || o.timeout_ms > 60000) fail("timeout_ms must be 1..60000");
  if (o.breaker_failures < 1) fail("failures must be at least 1");
  if (o.breaker_open_ms < 1) fail("open_ms must be at least 1");
  if (o.max_fetch_blocks < 1) fail("max_blocks must be at least 1");
  return std::make_unique<RedisSharedTier>(o, record_bytes, n_streams, page_size, model_id);
}

}  // namespace kvpack::kv
