#include "kv/cold_tier_index.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>
// libxxhash's runtime-dispatched XXH3 (SSE2 / AVX2 / AVX-512 by CPU): the plain entry points are the SSE2
// build, ~13 GB/s on an 8 KiB record here against ~50 GB/s dispatched, and the checksum is what a swap-in
// pays on top of its copy. Same hash values either way (XXH3 is one function; the ISA only changes speed).
#if defined(__x86_64__)
#include <xxh_x86dispatch.h>
#endif

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace kvpack::kv::cold {

uint64_t record_checksum(uint64_t key, std::span<const uint8_t> data, uint64_t seed) {
  XXH3_state_t st;
  XXH3_INITSTATE(&st);  // reset_withSeed reads the old seed: stack garbage equal to it skips the secret
  XXH3_64bits_reset_withSeed(&st, seed);
  XXH3_64bits_update(&st, &key, sizeof key);
  XXH3_64bits_update(&st, data.data(), data.size());
  return XXH3_64bits_digest(&st);
}

namespace {

constexpr size_t kChunkBytes = 4096;  // hashed, then copied while it sits in L1 (32 KiB or more)

// Copies one chunk that the caller has just read (it is in L1) with non-temporal stores.
void stream_chunk(const uint8_t* src, uint8_t* dst, size_t n) {
#if defined(__x86_64__)
  // Head: ordinary stores up to the first 16-byte aligned destination address (MOVNTDQ needs one).
  const size_t head = std::min(n, (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  for (; i + 16 <= n; i += 16)
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
  std::memcpy(dst + i, src + i, n - i);  // tail
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace

uint64_t copy_with_checksum(uint64_t key, const uint8_t* src, uint8_t* dst, size_t bytes, uint64_t seed, bool streaming) {
  XXH3_state_t st;
  XXH3_INITSTATE(&st);  // reset_withSeed reads the old seed: stack garbage equal to it skips the secret
  XXH3_64bits_reset_withSeed(&st, seed);
  XXH3_64bits_update(&st, &key, sizeof key);
  for (size_t off = 0; off < bytes; off += kChunkBytes) {
    const size_t n = std::min(kChunkBytes, bytes - off);
    XXH3_64bits_update(&st, src + off, n);
    if (streaming) {
      stream_chunk(src + off, dst + off, n);
    } else {
      std::memcpy(dst + off, src + off, n);
    }
  }
#if defined(__x86_64__)
  if (streaming) _mm_sfence();  // non-temporal stores are weakly ordered: visible before we return
#endif
  return XXH3_64bits_digest(&st);
}

int64_t slots_within(uint64_t cap_bytes, size_t record_bytes, size_t slot_bytes) {
  if (record_bytes == 0) throw std::invalid_argument("cold tier: record_bytes must be > 0");
  const uint64_t slots = cap_bytes / slot_bytes;
  if (slots == 0) {
    throw std::invalid_argument("cold tier: a cap of " + std::to_string(cap_bytes) + " bytes holds no record of " +
                                std::to_string(record_bytes) + " bytes" +
                                (slot_bytes > record_bytes ? " (plus its header)" : ""));
  }
  if (slots > static_cast<uint64_t>(INT32_MAX)) {
    throw std::invalid_argument("cold tier: " + std::to_string(slots) + " records exceed the 2^31 slot limit");
  }
  return static_cast<int64_t>(slots);
}

void check_batch(size_t keys, size_t buffers, size_t results, const char* call) {
  if (keys != buffers || keys != results) {
    throw std::invalid_argument(std::string("cold tier ") + call + ": keys, buffers and results differ in length");
  }
}

SlotIndex::SlotIndex(int64_t capacity_slots) : capacity_(capacity_slots) {}

void SlotIndex::push_back(List& l, Slot s) {
  const auto i = static_cast<size_t>(s);
  prev_[i] = l.tail;
  next_[i] = kNoSlot;
  if (l.tail != kNoSlot) next_[static_cast<size_t>(l.tail)] = s; else l.head = s;
  l.tail = s;
  ++l.size;
}

void SlotIndex::push_front(List& l, Slot s) {
  const auto i = static_cast<size_t>(s);
  prev_[i] = kNoSlot;
  next_[i] = l.head;
  if (l.head != kNoSlot) prev_[static_cast<size_t>(l.head)] = s; else l.tail = s;
  l.head = s;
  ++l.size;
}

void SlotIndex::unlink(List& l, Slot s) {
  const auto i = static_cast<size_t>(s);
  if (prev_[i] != kNoSlot) next_[static_cast<size_t>(prev_[i])] = next_[i]; else l.head = next_[i];
  if (next_[i] != kNoSlot) prev_[static_cast<size_t>(next_[i])] = prev_[i]; else l.tail = prev_[i];
  prev_[i] = next_[i] = kNoSlot;
  --l.size;
}

Slot SlotIndex::take_fresh() {
  if (next_fresh_ >= capacity_) return kNoSlot;
  key_.push_back(0);
  state_.push_back(State::kFree);
  prev_.push_back(kNoSlot);
  next_.push_back(kNoSlot);
  return next_fresh_++;
}

Slot SlotIndex::take_free(Slot preferred) {
  if (preferred >= 0 && preferred < next_fresh_ && state_[static_cast<size_t>(preferred)] == State::kFree) {
    unlink(free_, preferred);
    return preferred;
  }
  if (preferred == next_fresh_ && preferred < capacity_) return take_fresh();  // the batch runs on
  if (free_.head != kNoSlot) {
    const Slot s = free_.head;
    unlink(free_, s);
    return s;
  }
  return take_fresh();
}

SlotIndex::Allocation SlotIndex::allocate(uint64_t key, Slot preferred) {
  Allocation a;
  a.slot = take_free(preferred);
  if (a.slot == kNoSlot) {
    if (lru_.head == kNoSlot) return a;  // every record is pinned
    a.slot = lru_.head;
    unlink(lru_, a.slot);
    a.evicted = true;
    a.evicted_key = key_[static_cast<size_t>(a.slot)];
    by_key_.erase(a.evicted_key);
  }
  const auto i = static_cast<size_t>(a.slot);
  key_[i] = key;
  state_[i] = State::kLru;
  push_back(lru_, a.slot);
  by_key_.emplace(key, a.slot);
  return a;
}

void SlotIndex::touch(Slot s) {
  if (state_[static_cast<size_t>(s)] != State::kLru) return;
  unlink(lru_, s);
  push_back(lru_, s);
}

void SlotIndex::set_pinned(Slot s, bool pinned) {
  State& st = state_[static_cast<size_t>(s)];
  if (pinned && st == State::kLru) {
    unlink(lru_, s);
    st = State::kPinned;
  } else if (!pinned && st == State::kPinned) {
    st = State::kLru;
    push_back(lru_, s);  // unpinning counts as a use: the record was just needed
  }
}

void SlotIndex::release(Slot s) {
  State& st = state_[static_cast<size_t>(s)];
  if (st == State::kFree) return;
  if (st == State::kLru) unlink(lru_, s);
  by_key_.erase(key_[static_cast<size_t>(s)]);
  st = State::kFree;
  push_front(free_, s);
}

const char* SlotIndex::check() const {
  int64_t pinned = 0, in_lru = 0, free = 0;
  for (Slot s = 0; s < next_fresh_; ++s) {
    const State st = state_[static_cast<size_t>(s)];
    if (st == State::kPinned) ++pinned;
    if (st == State::kLru) ++in_lru;
    if (st == State::kFree) ++free;
    if (st != State::kFree) {
      auto it = by_key_.find(key_[static_cast<size_t>(s)]);
      if (it == by_key_.end() || it->second != s) return "a used slot's key does not map back to it";
    }
  }
  if (in_lru != lru_.size) return "LRU list length differs from the unpinned records";
  if (free != free_.size) return "free list length differs from the free slots";
  if (static_cast<int64_t>(by_key_.size()) != pinned + in_lru) return "map size differs from the used slots";
  int64_t walked = 0;
  for (Slot s = lru_.head; s != kNoSlot; s = next_[static_cast<size_t>(s)]) {
    if (state_[static_cast<size_t>(s)] != State::kLru || ++walked > lru_.size) return "LRU list is broken";
  }
  return walked == lru_.size ? "" : "LRU list is short";
}

IndexedTier::IndexedTier(size_t record_bytes, int64_t capacity_slots, uint64_t cap_bytes, int io_threads)
    : record_bytes_(record_bytes), index_(capacity_slots), workers_(std::max(1, io_threads)) {
  stats_.cap_bytes = cap_bytes;
}

int IndexedTier::tasks_for(size_t items, size_t min_per_task) const {
  if (workers_.size() <= 1 || items == 0) return items == 0 ? 0 : 1;
  const size_t by_size = std::max<size_t>(1, items / std::max<size_t>(1, min_per_task));
  return static_cast<int>(std::min<size_t>(by_size, static_cast<size_t>(4 * workers_.size())));
}

bool IndexedTier::contains(uint64_t key) const {
  std::lock_guard lock(mu_);
  return index_.find(key) != kNoSlot;
}

void IndexedTier::pin(uint64_t key, bool pinned) {
  std::lock_guard lock(mu_);
  if (const Slot s = index_.find(key); s != kNoSlot) index_.set_pinned(s, pinned);
}

ColdTierStats IndexedTier::stats() const {
  std::lock_guard lock(mu_);
  ColdTierStats st = stats_;
  st.records = index_.records();
  st.used_bytes = st.records * record_bytes_;
  return st;
}

}  // namespace kvpack::kv::cold
