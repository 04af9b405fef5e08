#include "kv/page_pool.h"

#include <algorithm>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "util/huge_alloc.h"

namespace kvpack::kv {

void PagePool::AlignedFree::operator()(uint8_t* p) const { std::free(p); }

namespace {

// Chunk storage. Chunks of ~2 MiB (the default) go on huge pages (util/huge_alloc.h): decode attention reads
// a stream's pages in page-table order, scattered over the pool (measured 2026-12-04, AMD EPYC VM, one
// thread reading 4 KiB chunks in shuffled order with an L2 prefetch: 9.5 GB/s on 4 KiB pages, 15 GB/s on
// 2 MiB pages). Small chunks (tests, tiny shapes) keep 64-byte alignment and are not rounded up.
bool huge_chunk(size_t chunk_bytes) { return chunk_bytes >= kHugePageBytes / 2; }

// What one chunk takes from the system.
size_t chunk_alloc_bytes(size_t chunk_bytes) {
  return huge_chunk(chunk_bytes) ? huge_alloc_bytes(chunk_bytes) : (chunk_bytes + 63) / 64 * 64;
}

uint8_t* allocate_chunk(size_t chunk_bytes) {
  if (huge_chunk(chunk_bytes)) return huge_alloc(chunk_bytes);
  return static_cast<uint8_t*>(std::aligned_alloc(64, chunk_alloc_bytes(chunk_bytes)));
}

}  // namespace

PagePool::PagePool(const PoolConfig& cfg) : cfg_(cfg) {
  if (cfg_.page_size <= 0 || cfg_.head_dim <= 0 || cfg_.max_pages <= 0)
    throw std::invalid_argument("page pool: page_size, head_dim and max_pages must be positive");
  if (!kernels::kv_type_supported(cfg_.kv_type))
    throw std::invalid_argument("page pool: KV type must be f32, f16, bf16 or q8_0");
  if (cfg_.max_pages > INT32_MAX) throw std::invalid_argument("page pool: too many pages");
  try {
    row_bytes_ = kernels::kv_row_bytes(cfg_.kv_type, cfg_.head_dim);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("page pool: ") + e.what());
  }
  page_bytes_ = 2 * row_bytes_ * static_cast<size_t>(cfg_.page_size);
  pos_offset_ = (page_bytes_ + 3) / 4 * 4;
  stride_ = (record_bytes() + 63) / 64 * 64;
  if (cfg_.pages_per_chunk <= 0) {
    const size_t target = size_t{2} << 20;
    cfg_.pages_per_chunk = static_cast<int32_t>(std::max<size_t>(1, target / stride_));
  }
  chunk_bytes_ = stride_ * cfg_.pages_per_chunk;
  alloc_bytes_ = chunk_alloc_bytes(chunk_bytes_);
  // Metadata is sized for the limit up front so allocate/release never reallocate (hot path).
  const size_t n = static_cast<size_t>(cfg_.max_pages);
  refcount_.assign(n, 0);
  free_.init(n);
  soft_.init(n);
  const size_t run_bytes = size_t{128} << 10;
  run_pages_ = static_cast<int32_t>(std::clamp<size_t>((run_bytes + stride_ - 1) / stride_, 1, 64));
  run_pages_ = cfg_.page_runs ? std::min(run_pages_, cfg_.pages_per_chunk) : 1;
  cached_.assign(n, 0);
  lru_prev_.assign(n, kNoPage);
  lru_next_.assign(n, kNoPage);
  chunks_.reserve((n + cfg_.pages_per_chunk - 1) / cfg_.pages_per_chunk);
}

void PagePool::lru_push_back(PageId p) {
  lru_prev_[static_cast<size_t>(p)] = lru_tail_;
  lru_next_[static_cast<size_t>(p)] = kNoPage;
  if (lru_tail_ != kNoPage) lru_next_[static_cast<size_t>(lru_tail_)] = p;
  else lru_head_ = p;
  lru_tail_ = p;
  ++lru_size_;
}

void PagePool::lru_remove(PageId p) {
  const PageId prev = lru_prev_[static_cast<size_t>(p)], next = lru_next_[static_cast<size_t>(p)];
  if (prev != kNoPage) lru_next_[static_cast<size_t>(prev)] = next;
  else lru_head_ = next;
  if (next != kNoPage) lru_prev_[static_cast<size_t>(next)] = prev;
  else lru_tail_ = prev;
  lru_prev_[static_cast<size_t>(p)] = lru_next_[static_cast<size_t>(p)] = kNoPage;
  --lru_size_;
}

void PagePool::mark_cached(PageId p) {
#if KVPACK_DEBUG_CHECKS
  if (p < 0 || p >= next_fresh_ || refcount_[static_cast<size_t>(p)] <= 0 || cached_[static_cast<size_t>(p)]) std::abort();
#endif
  cached_[static_cast<size_t>(p)] = 1;
}

void PagePool::unmark_cached(PageId p) {
  if (!cached_[static_cast<size_t>(p)]) return;
  cached_[static_cast<size_t>(p)] = 0;
  if (refcount_[static_cast<size_t>(p)] == 0) {  // cached-free -> plain free
    lru_remove(p);
    free_.push(p);
  }
}

void PagePool::PageSet::push(PageId p) {
  pos_[static_cast<size_t>(p)] = static_cast<int32_t>(items_.size());
  items_.push_back(p);
}

PageId PagePool::PageSet::pop() {
  const PageId p = items_.back();
  items_.pop_back();
  pos_[static_cast<size_t>(p)] = -1;
  return p;
}

void PagePool::PageSet::remove(PageId p) {
  const int32_t i = pos_[static_cast<size_t>(p)];
  const PageId last = items_.back();
  items_[static_cast<size_t>(i)] = last;
  pos_[static_cast<size_t>(last)] = i;
  items_.pop_back();
  pos_[static_cast<size_t>(p)] = -1;
}

bool PagePool::PageSet::consistent(PageId p) const {
  const int32_t i = pos_[static_cast<size_t>(p)];
  return i < 0 || (static_cast<size_t>(i) < items_.size() && items_[static_cast<size_t>(i)] == p);
}

bool PagePool::ensure_chunk(PageId p) {
  while (static_cast<size_t>(p) / cfg_.pages_per_chunk >= chunks_.size()) {
    // allocate_chunk rounds up to the alignment aligned_alloc needs; page_bytes is a multiple of 64 in
    // practice (16 slots x row bytes x 2, Q8_0 rows included), but tiny test shapes may not be.
    auto* mem = allocate_chunk(chunk_bytes_);
    if (mem == nullptr) return false;
    chunks_.emplace_back(mem);
    // Positions of never-written slots read as -1.
    for (int32_t i = 0; i < cfg_.pages_per_chunk; ++i)
      std::fill_n(reinterpret_cast<int32_t*>(mem + static_cast<size_t>(i) * stride_ + pos_offset_), cfg_.page_size, -1);
  }
  return true;
}

PageId PagePool::take(PageId p) {
  refcount_[static_cast<size_t>(p)] = 1;
  ++used_;
  if (used_ > peak_used_) peak_used_ = used_;
  return p;
}

PageId PagePool::allocate() {
  if (!free_.empty()) return take(free_.pop());
  if (next_fresh_ < cfg_.max_pages && ensure_chunk(next_fresh_)) return take(next_fresh_++);
  if (!soft_.empty()) return take(lowest_in_run(soft_, soft_.back()));  // held for another stream
  if (lru_head_ == kNoPage) return kNoPage;
  // Lazy eviction: the least recently freed cached page; its block leaves the prefix cache.
  const PageId p = lru_head_;
  lru_remove(p);
  cached_[static_cast<size_t>(p)] = 0;
  if (listener_ != nullptr) listener_->on_reuse(p);  // drops p's block, un-marking its other pages
  return take(p);
}

PageId PagePool::allocate_after(PageId prev, bool reserve) {
  if (!cfg_.page_runs) return allocate();
  PageId t = kNoPage;
  if (prev != kNoPage) {
    const PageId n = prev + 1;
    if (n < next_fresh_ && n % cfg_.pages_per_chunk != 0) {  // same chunk: right after prev in memory
      if (soft_.contains(n)) soft_.remove(n), t = n;
      else if (free_.contains(n)) free_.remove(n), t = n;
    }
  }
  if (t == kNoPage) {
    // A new run: on a released page first (memory grows with pages in use), else at the fresh frontier
    // (which also continues prev's run when prev is the last page handed out).
    if (!free_.empty() && next_fresh_ != prev + 1) t = lowest_in_run(free_, free_.back());
    else if (next_fresh_ < cfg_.max_pages && ensure_chunk(next_fresh_)) t = next_fresh_++;
    else return allocate();  // a soft-reserved page of another stream, or a cached one
  }
  if (reserve) reserve_after(t);
  return take(t);
}

void PagePool::release_reservation(PageId last) {
  if (last == kNoPage) return;
  for (PageId q = last + 1; q < next_fresh_ && q % cfg_.pages_per_chunk != 0 && soft_.contains(q); ++q) {
    soft_.remove(q);
    free_.push(q);
  }
}

// The first page of the run of `set`'s pages that holds p (same chunk), taken out of the set: a stream
// that starts there continues upwards through the rest (LIFO order alone hands out a released or
// reserved run from its top down, every page breaking address order).
PageId PagePool::lowest_in_run(PageSet& set, PageId p) {
  while (p % cfg_.pages_per_chunk != 0 && set.contains(p - 1)) --p;
  set.remove(p);
  return p;
}

// Holds the pages after t for t's stream, up to a run, stopping at the first that is in use, reserved or
// in another chunk. Only when t's run is used up (t + 1 not reserved): O(run) once per run.
void PagePool::reserve_after(PageId t) {
  const PageId chunk_end = (t / cfg_.pages_per_chunk + 1) * cfg_.pages_per_chunk;
  const PageId end = static_cast<PageId>(std::min<int64_t>({int64_t{t} + run_pages_, chunk_end, cfg_.max_pages}));
  for (PageId q = t + 1; q < end; ++q) {
    if (q == next_fresh_) ++next_fresh_;  // same chunk as t: its storage exists
    else if (q < next_fresh_ && free_.contains(q)) free_.remove(q);
    else break;
    soft_.push(q);
  }
}

void PagePool::retain(PageId p) {
#if KVPACK_DEBUG_CHECKS
  if (p < 0 || p >= next_fresh_ || (refcount_[static_cast<size_t>(p)] <= 0 && !cached_[static_cast<size_t>(p)])) std::abort();
#endif
  if (refcount_[static_cast<size_t>(p)] == 0) {  // a prefix-cache hit on a cached-free page
    lru_remove(p);
    ++used_;
    if (used_ > peak_used_) peak_used_ = used_;
  }
  ++refcount_[static_cast<size_t>(p)];
}

void PagePool::release(PageId p) {
#if KVPACK_DEBUG_CHECKS
  if (p < 0 || p >= next_fresh_ || refcount_[static_cast<size_t>(p)] <= 0) std::abort();
#endif
  if (--refcount_[static_cast<size_t>(p)] == 0) {
    if (cached_[static_cast<size_t>(p)]) lru_push_back(p);
    else free_.push(p);
    --used_;
  }
}

std::string PagePool::check(std::span<const std::span<const PageId>> tables) const {
  std::unordered_map<PageId, int32_t> named;
  for (auto t : tables)
    for (PageId p : t) {
      if (p < 0 || p >= next_fresh_) return "page table names invalid page " + std::to_string(p);
      ++named[p];
    }
  int64_t referenced = 0;
  for (PageId p = 0; p < next_fresh_; ++p) {
    const int32_t rc = refcount_[static_cast<size_t>(p)];
    if (rc < 0) return "negative refcount on page " + std::to_string(p);
    if (rc > 0) ++referenced;
    auto it = named.find(p);
    const int32_t n = it == named.end() ? 0 : it->second;
    if (n != rc)
      return "page " + std::to_string(p) + " has refcount " + std::to_string(rc) + " but " + std::to_string(n) +
             " page-table entries";
  }
  int64_t cached_free = 0;
  for (PageId p = lru_head_; p != kNoPage; p = lru_next_[static_cast<size_t>(p)]) {
    if (refcount_[static_cast<size_t>(p)] != 0 || !cached_[static_cast<size_t>(p)])
      return "page " + std::to_string(p) + " is on the cached-free list with refcount " +
             std::to_string(refcount_[static_cast<size_t>(p)]) + (cached_[static_cast<size_t>(p)] ? "" : " and not cached");
    if (++cached_free > lru_size_) return "cached-free list is longer than its count";
  }
  if (cached_free != lru_size_) return "cached-free list has " + std::to_string(cached_free) + " pages, count says " + std::to_string(lru_size_);
  for (PageId p = 0; p < next_fresh_; ++p)
    if (cached_[static_cast<size_t>(p)] && refcount_[static_cast<size_t>(p)] == 0 && lru_prev_[static_cast<size_t>(p)] == kNoPage &&
        lru_head_ != p)
      return "cached page " + std::to_string(p) + " has refcount 0 but is not on the cached-free list";
  for (PageId p = 0; p < next_fresh_; ++p) {
    const size_t i = static_cast<size_t>(p);
    if (!free_.consistent(p) || !soft_.consistent(p)) return "page " + std::to_string(p) + " has a stale free-set index";
    if ((free_.contains(p) || soft_.contains(p)) && (refcount_[i] != 0 || cached_[i] || (free_.contains(p) && soft_.contains(p))))
      return "free page " + std::to_string(p) + " is also referenced, cached or both free and soft-reserved";
  }
  const int64_t free_count = static_cast<int64_t>(free_.size() + soft_.size()) + (cfg_.max_pages - next_fresh_);
  if (free_count + cached_free + referenced != cfg_.max_pages)
    return "free (" + std::to_string(free_count) + ") + cached-free (" + std::to_string(cached_free) + ") + referenced (" +
           std::to_string(referenced) + ") != total (" + std::to_string(cfg_.max_pages) + ")";
  if (referenced != used_) return "used counter " + std::to_string(used_) + " != referenced " + std::to_string(referenced);
  return "";
}

}  // namespace kvpack::kv
