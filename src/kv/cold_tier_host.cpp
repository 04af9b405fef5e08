#include "kv/cold_tier_host.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "util/huge_alloc.h"
#include "util/thread_pool.h"

namespace kvpack::kv {

using cold::kNoSlot;
using cold::Slot;

namespace {

constexpr size_t kSlabTargetBytes = size_t{4} << 20;

}  // namespace

HostColdTier::HostColdTier(uint64_t cap_bytes, size_t record_bytes, int io_threads)
    : IndexedTier(record_bytes, cold::slots_within(cap_bytes, record_bytes, record_bytes), cap_bytes, io_threads),
      slots_per_slab_(std::max<size_t>(1, kSlabTargetBytes / record_bytes)) {}

uint8_t* HostColdTier::record_at(Slot s) {
  const size_t slab = static_cast<size_t>(s) / slots_per_slab_;
  if (slab >= slabs_.size()) slabs_.resize(slab + 1);
  if (!slabs_[slab]) {
    const size_t first = slab * slots_per_slab_;
    const size_t n = std::min(slots_per_slab_, static_cast<size_t>(index_.capacity()) - first);
    // On 2 MiB pages: a recall check reads a few hundred records scattered over gigabytes, and with 4 KiB
    // pages every record cost two page walks (measured 4-13 us per 8 KiB record after a decode step had
    // streamed the weights through the caches, against ~2 us on huge pages). No zeroing: put overwrites.
    // A slab is at most kSlabTargetBytes, so rounding it to whole huge pages adds less than one record; a
    // small one (a small tier's only slab) stays on plain pages rather than take 2 MiB.
    const size_t bytes = n * record_bytes_;
    slabs_[slab].reset(bytes >= kHugePageBytes ? huge_alloc(bytes) : static_cast<uint8_t*>(std::malloc(bytes)));
    if (!slabs_[slab]) return nullptr;
  }
  return slabs_[slab].get() + static_cast<size_t>(s) % slots_per_slab_ * record_bytes_;
}

uint8_t* HostColdTier::place(uint64_t key, uint64_t sum) {
  ++stats_.puts;
  Slot s = index_.find(key);
  if (s != kNoSlot) {
    index_.touch(s);  // replacing: same slot, pin state kept
  } else {
    const cold::SlotIndex::Allocation a = index_.allocate(key, kNoSlot);
    if (a.slot == kNoSlot) {
      ++stats_.put_failures;
      return nullptr;
    }
    stats_.evictions += a.evicted;
    s = a.slot;
  }
  uint8_t* dst = record_at(s);
  if (dst == nullptr) {  // a fresh slot whose slab the system refused
    index_.release(s);
    ++stats_.put_failures;
    return nullptr;
  }
  if (checksum_.size() < static_cast<size_t>(index_.slots_touched())) checksum_.resize(index_.slots_touched());
  checksum_[static_cast<size_t>(s)] = sum;
  stats_.bytes_written += record_bytes_;
  return dst;
}

bool HostColdTier::put(uint64_t key, std::span<const uint8_t> data) {
  if (data.size() != record_bytes_) throw std::invalid_argument("cold tier put: record of the wrong size");
  const uint64_t sum = cold::record_checksum(key, data, 0);
  std::lock_guard lock(mu_);
  uint8_t* dst = place(key, sum);
  if (dst != nullptr) std::memcpy(dst, data.data(), record_bytes_);
  return dst != nullptr;
}

namespace {
constexpr size_t kRecordsPerTask = 16;  // ~128 KiB of 8 KiB pages: enough to amortise a task
}  // namespace

void HostColdTier::put_many(std::span<const uint64_t> keys, std::span<const uint8_t* const> data, std::span<bool> ok) {
  cold::check_batch(keys.size(), data.size(), ok.size(), "put_many");
  const size_t n = keys.size();
  const int tasks = tasks_for(n, kRecordsPerTask);
  const auto range = [&](int task) {
    return std::pair{n * static_cast<size_t>(task) / static_cast<size_t>(tasks), n * static_cast<size_t>(task + 1) / static_cast<size_t>(tasks)};
  };
  // Placed first (checksum to follow), then copied and hashed in one pass per record by the I/O threads:
  // the caller's page is read from DRAM once.
  std::vector<uint8_t*> dst(n);
  std::vector<Slot> slot(n, kNoSlot);
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < n; ++i) ok[i] = (dst[i] = place(keys[i], 0)) != nullptr;
  // A later key of the batch may have evicted an earlier one's slot (a tier smaller than the batch): only
  // the last placement of a slot is copied, and an earlier one whose slot was taken reports failure.
  for (size_t i = 0; i < n; ++i) {
    if (!ok[i]) continue;
    slot[i] = index_.find(keys[i]);
    if (slot[i] == kNoSlot) ok[i] = false, dst[i] = nullptr;
  }
  // A key given twice: its last record wins (as with put() in a loop), and only that one is copied.
  std::unordered_set<const uint8_t*> seen;
  for (size_t i = n; i-- > 0;)
    if (dst[i] != nullptr && !seen.insert(dst[i]).second) dst[i] = nullptr;
  const bool streaming = n * record_bytes_ >= cold::kStreamingCopyBytes;
  for_each_task(tasks, [&](int task) {  // distinct slots: each task writes its own checksum_ entries
    for (auto [i, end] = range(task); i < end; ++i)
      if (dst[i] != nullptr)
        checksum_[static_cast<size_t>(slot[i])] = cold::copy_with_checksum(keys[i], data[i], dst[i], record_bytes_, 0, streaming);
  });
}

bool HostColdTier::settle_read(Slot s, bool verified) {
  if (!verified) {
    if (!logged_mismatch_) {
      std::fprintf(stderr, "[kvpack] cold tier: checksum mismatch in host memory slot %d (record dropped)\n", s);
      logged_mismatch_ = true;
    }
    index_.release(s);
    ++stats_.checksum_failures;
    ++stats_.misses;
    return false;
  }
  index_.touch(s);
  ++stats_.hits;
  stats_.bytes_read += record_bytes_;
  return true;
}

bool HostColdTier::get(uint64_t key, std::span<uint8_t> out) {
  if (out.size() != record_bytes_) throw std::invalid_argument("cold tier get: buffer of the wrong size");
  std::lock_guard lock(mu_);
  ++stats_.gets;
  const Slot s = index_.find(key);
  if (s == kNoSlot) {
    ++stats_.misses;
    return false;
  }
  std::memcpy(out.data(), record_at(s), record_bytes_);
  // Verified under the lock: a 8 KiB XXH3 costs well under a microsecond, and the stats stay exact.
  return settle_read(s, cold::record_checksum(key, out, 0) == checksum_[static_cast<size_t>(s)]);
}

void HostColdTier::get_many(std::span<const uint64_t> keys, std::span<uint8_t* const> out, std::span<bool> ok) {
  cold::check_batch(keys.size(), out.size(), ok.size(), "get_many");
  read_many(keys, out, ok, false);
}

void HostColdTier::take_many(std::span<const uint64_t> keys, std::span<uint8_t* const> out, std::span<bool> ok) {
  cold::check_batch(keys.size(), out.size(), ok.size(), "take_many");
  read_many(keys, out, ok, true);
}

void HostColdTier::read_many(std::span<const uint64_t> keys, std::span<uint8_t* const> out, std::span<bool> ok, bool take) {
  struct Copy {
    size_t index;
    Slot slot;
    const uint8_t* src;
    bool verified;
  };
  std::vector<Copy> copies;
  copies.reserve(keys.size());
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    ++stats_.gets;
    ok[i] = false;
    if (const Slot s = index_.find(keys[i]); s != kNoSlot) {
      copies.push_back({i, s, record_at(s), false});
    } else {
      ++stats_.misses;
    }
  }
  // Hash and copy each 4 KiB of a record in one pass (cold::copy_with_checksum): the slab is read from
  // DRAM once, and a large batch is written with streaming stores. The hash is of the slab's bytes, which
  // the copy then reproduces; a bit flipped in the slab fails it. A take's index
  // work (forgetting every record read) is task 0, beside the copies: under mu_ nothing else touches the
  // index or reuses a freed slot's memory before this returns, and the copies read only the slabs and
  // checksum_, which release() leaves alone.
  const size_t n = copies.size();
  const int copy_tasks = tasks_for(n, kRecordsPerTask);
  const int first_copy = take ? 1 : 0;
  const bool streaming = n * record_bytes_ >= cold::kStreamingCopyBytes;
  for_each_task(copy_tasks + first_copy, [&](int task) {
    if (take && task == 0) {
      for (const Copy& c : copies)
        if (index_.find(keys[c.index]) == c.slot) index_.release(c.slot);  // a key given twice: released once
      return;
    }
    const size_t t = static_cast<size_t>(task - first_copy);
    const size_t end = n * (t + 1) / static_cast<size_t>(copy_tasks);
    for (size_t j = n * t / static_cast<size_t>(copy_tasks); j < end; ++j) {
      Copy& c = copies[j];
      c.verified = cold::copy_with_checksum(keys[c.index], c.src, out[c.index], record_bytes_, 0, streaming) ==
                   checksum_[static_cast<size_t>(c.slot)];
    }
  });
  for (const Copy& c : copies) {
    if (take) {  // already forgotten above: the outcome only
      ok[c.index] = c.verified;
      if (c.verified) {
        ++stats_.hits;
        stats_.bytes_read += record_bytes_;
      } else {
        if (!logged_mismatch_) {
          std::fprintf(stderr, "[kvpack] cold tier: checksum mismatch in host memory slot %d (record dropped)\n", c.slot);
          logged_mismatch_ = true;
        }
        ++stats_.checksum_failures;
        ++stats_.misses;
      }
      continue;
    }
    ok[c.index] = settle_read(c.slot, c.verified);
  }
}

void HostColdTier::erase(uint64_t key) {
  std::lock_guard lock(mu_);
  if (const Slot s = index_.find(key); s != kNoSlot) index_.release(s);
}

size_t HostColdTier::reserved_bytes() const {
  std::lock_guard lock(mu_);
  size_t total = 0;
  for (size_t i = 0; i < slabs_.size(); ++i) {
    if (!slabs_[i]) continue;
    total += std::min(slots_per_slab_, static_cast<size_t>(index_.capacity()) - i * slots_per_slab_) * record_bytes_;
  }
  return total;
}

uint8_t* HostColdTier::record_for_testing(uint64_t key) {
  std::lock_guard lock(mu_);
  const Slot s = index_.find(key);
  return s == kNoSlot ? nullptr : record_at(s);
}

double measure_memcpy_gbps(size_t bytes, int threads) {
  if (bytes == 0) return 0.0;
  threads = std::max(1, threads);
  auto src = std::make_unique_for_overwrite<uint8_t[]>(bytes);
  auto dst = std::make_unique_for_overwrite<uint8_t[]>(bytes);
  std::memset(src.get(), 0x5a, bytes);  // touch both: page faults are not what we time
  std::memset(dst.get(), 0, bytes);
  ThreadPool pool(threads);
  const auto part = [&](int t) { return bytes * static_cast<size_t>(t) / static_cast<size_t>(threads); };
  double best_seconds = 1e30;
  for (int round = 0; round < 5; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.run(threads, [&](int t, int) { std::memcpy(dst.get() + part(t), src.get() + part(t), part(t + 1) - part(t)); });
    asm volatile("" : : "r"(dst.get()) : "memory");  // the copy is observable: not elided
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    best_seconds = std::min(best_seconds, dt.count());
  }
  return static_cast<double>(bytes) / best_seconds / 1e9;
}

}  // namespace kvpack::kv
