// The page pool: fixed-size KV pages, O(1) allocate/free, reference counts.
//
// Layout decision (DESIGN.md §3 "Streams"): a page holds `page_size` token slots of ONE stream, where a
// stream is one (layer, KV head) pair: K[page_size][head_dim] followed by V[page_size][head_dim], plus a
// per-slot original-position array kept beside it. Each stream of a sequence has its own page table, so
// per-layer / per-head budgets (PyramidKV, Ada-KV, TriAttention per-KV-head selection) free real pages
// rather than masking keys, and the attention kernel reads each page as two contiguous tiles.
// The cost is metadata: one page-table entry per (layer, head, 16 tokens) — e.g. 224 streams for a
// Qwen3-0.6B shape, ~14 entries per stream per 224 tokens — small next to the 8 KiB (f16) pages.
// Row format: one K (or V) row is kernels::kv_row_bytes(kv_type, head_dim) bytes (kernels/attention.h):
// 4 / 2 / 2 bytes per element for F32 / F16 / BF16, and head_dim / 32 Q8_0 blocks of 34 bytes (so a
// Q8_0 page is 34/64 of an F16 one; Q8_0 needs head_dim % 32 == 0). Everything above the kernels moves
// whole rows (slot_bytes()) and never looks inside one; rows are only 2-byte aligned for Q8_0.
//
// Memory grows with pages actually used: page storage is allocated in chunks on first use, freed pages
// are reused LIFO (hot in cache), and `max_pages` only bounds growth.
//
// Cached-free pages (vLLM v1's BlockPool design): a page the prefix cache has registered (mark_cached)
// keeps its K/V when its last page-table entry lets go — refcount 0, counted as free, but still
// findable by its block hash. allocate() hands out plain free pages first, then never-used ones, and
// only then the least recently freed cached page, telling the reuse listener (the prefix cache drops
// that block) — O(1), no scan. retain() on a cached-free page revives it (a prefix-cache hit).
// A page is *shared* (read-only: copy on write) when more than one table names it or it is cached.
// Page runs (allocate_after): decode attention reads a stream's pages in table order, and pages that
// follow each other in memory are streamed by the hardware prefetchers, while a page that breaks address
// order needs a software prefetch and runs at about 60 % of the rate (bench_attention layer/decode:
// runs of 16 pages match one contiguous stream, shuffled pages do not). A stream that grows a page at a
// time — decode, or a prompt fed in small chunks — while the other 223 streams of its sequence grow too
// would get every 224th page. So a stream asks for the page after its last one: that page if it is free,
// else a new run at the fresh frontier, whose next run_pages() - 1 pages are *soft-reserved* for it. A
// soft-reserved page is free in every count (capacity, admission, free_pages()); allocate() hands it out
// only after plain free and never-used pages, so reservations cost no capacity, only memory obtained
// ahead of use (at most run_pages() - 1 pages per growing stream, inside one chunk).
// Thread-safety: not thread-safe; the engine owns the pool and mutates it from its scheduling thread.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "util/dtype.h"

namespace kvpack::kv {

using PageId = int32_t;
inline constexpr PageId kNoPage = -1;

struct PoolConfig {
  int32_t page_size = 16;
  int32_t head_dim = 0;
  DType kv_type = DType::F32;   // F32, F16, BF16 or Q8_0 (head_dim % 32 == 0)
  int64_t max_pages = 0;        // hard limit on pages in existence
  int32_t pages_per_chunk = 0;  // 0 = choose (~2 MiB chunks)
  bool page_runs = true;        // allocate_after keeps streams' pages in runs (false: plain allocate(), a baseline)
};

class PagePool {
 public:
  explicit PagePool(const PoolConfig& cfg);
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  // Takes a free page with refcount 1, or returns kNoPage when the pool is exhausted
  // (or the system refused memory for a new chunk) — callers turn that into a clean error / preemption.
  PageId allocate();
  // As allocate(), for the page that follows `prev` in a stream's table (kNoPage: the stream's first page):
  // prefers the page right after `prev` in memory, then starts a run (see the header comment). `reserve`:
  // hold the pages after it for the stream (false for a page that is not the stream's last, e.g. a
  // copy-on-write copy in the middle of a table).
  PageId allocate_after(PageId prev, bool reserve = true);
  // The pages held for the stream whose last page is `last` go back to the free list (the stream shrank
  // or ended; a reservation only ever follows its stream's last page). O(run).
  void release_reservation(PageId last);
  // Pages of a run: >= 128 KiB of pages (16 f16 pages of head_dim 128), at most 64, within one chunk.
  int32_t run_pages() const { return run_pages_; }
  void retain(PageId p);   // one more page-table entry names p (prefix sharing; revives a cached-free page)
  void release(PageId p);  // one fewer; at zero the page returns to the free list (cached: to the LRU list)

  int32_t refcount(PageId p) const { return refcount_[static_cast<size_t>(p)]; }
  // Prefix-cache marks (see the header comment). Un-marking a cached-free page makes it plain free.
  void mark_cached(PageId p);
  void unmark_cached(PageId p);
  bool is_cached(PageId p) const { return cached_[static_cast<size_t>(p)] != 0; }
  // Read-only for its holders: writes go to a private copy (SequenceKv), compression never evicts from it.
  bool is_shared(PageId p) const { return refcount_[static_cast<size_t>(p)] > 1 || cached_[static_cast<size_t>(p)] != 0; }
  // Called with a cached page that allocate() reuses (already un-marked; its K/V are about to be
  // overwritten); the listener forgets its block and un-marks the block's other pages. One listener:
  // the prefix cache.
  class ReuseListener {
   public:
    virtual ~ReuseListener() = default;
    virtual void on_reuse(PageId p) = 0;
  };
  void set_reuse_listener(ReuseListener* l) { listener_ = l; }
  uint8_t* data(PageId p) { return chunk_base(p) + offset_in_chunk(p); }
  const uint8_t* data(PageId p) const { return const_cast<PagePool*>(this)->data(p); }
  // The page's per-slot original positions live right after its K and V, so a page is one contiguous
  // record (record_bytes()) that the cold tier moves with a single copy.
  int32_t* positions(PageId p) { return reinterpret_cast<int32_t*>(data(p) + pos_offset_); }
  const int32_t* positions(PageId p) const { return reinterpret_cast<const int32_t*>(data(p) + pos_offset_); }

  const PoolConfig& config() const { return cfg_; }
  size_t page_bytes() const { return page_bytes_; }      // K + V (what every KV-memory figure counts)
  size_t record_bytes() const { return pos_offset_ + sizeof(int32_t) * static_cast<size_t>(cfg_.page_size); }  // K + V + positions
  size_t v_offset() const { return page_bytes_ / 2; }    // byte offset of V inside a page
  size_t slot_bytes() const { return row_bytes_; }       // one K (or V) row, kernels::kv_row_bytes

  int64_t capacity() const { return cfg_.max_pages; }
  int64_t used_pages() const { return used_; }                       // referenced by page tables
  int64_t free_pages() const { return cfg_.max_pages - used_; }      // allocatable, cached-free included
  int64_t cached_free_pages() const { return lru_size_; }            // free but still holding a cached block
  int64_t soft_reserved_pages() const { return static_cast<int64_t>(soft_.size()); }  // free, held for a growing stream
  int64_t peak_used_pages() const { return peak_used_; }
  size_t used_bytes() const { return static_cast<size_t>(used_) * page_bytes_; }
  size_t reserved_bytes() const { return chunks_.size() * alloc_bytes_; }  // memory actually obtained

  // Invariant check (tests, debug builds): free + cached-free + referenced = total, every refcount equals
  // the number of page-table entries naming that page (tables given by the caller), the LRU list holds
  // exactly the cached pages with refcount 0. Returns "" or a description.
  std::string check(std::span<const std::span<const PageId>> tables) const;

 private:
  uint8_t* chunk_base(PageId p) { return chunks_[static_cast<size_t>(p) / cfg_.pages_per_chunk].get(); }
  size_t offset_in_chunk(PageId p) const { return static_cast<size_t>(p) % cfg_.pages_per_chunk * stride_; }

  struct AlignedFree {
    void operator()(uint8_t* p) const;
  };
  PoolConfig cfg_;
  size_t row_bytes_ = 0, page_bytes_ = 0, chunk_bytes_ = 0;
  size_t alloc_bytes_ = 0;  // what a chunk takes from the system (chunk_bytes_ rounded up to its alignment)
  size_t pos_offset_ = 0;  // positions after K+V, 4-byte aligned
  size_t stride_ = 0;      // bytes between pages in a chunk: the record, rounded up to 64 (page alignment)
  std::vector<std::unique_ptr<uint8_t, AlignedFree>> chunks_;
  std::vector<int32_t> refcount_;   // per page id ever created
  // A set of page ids with LIFO pop and O(1) removal of any member (swap with the last), sized for the
  // whole pool up front: the free list and the soft-reserved set.
  class PageSet {
   public:
    void init(size_t n) { items_.reserve(n), pos_.assign(n, -1); }
    bool contains(PageId p) const { return pos_[static_cast<size_t>(p)] >= 0; }
    bool empty() const { return items_.empty(); }
    size_t size() const { return items_.size(); }
    void push(PageId p);
    PageId pop();  // the most recently pushed (LIFO: a freed page is reused while it is still in cache)
    PageId back() const { return items_.back(); }
    void remove(PageId p);
    bool consistent(PageId p) const;  // check(): p's index and entry agree
   private:
    std::vector<PageId> items_;
    std::vector<int32_t> pos_;
  };
  PageSet free_;  // released pages (not cached)
  PageSet soft_;  // soft-reserved pages (free; see "Page runs" above)
  int32_t run_pages_ = 1;
  PageId next_fresh_ = 0;           // pages [next_fresh_, max) were never handed out
  int64_t used_ = 0, peak_used_ = 0;
  // Cached-free pages in release order (head = least recently freed): an intrusive doubly linked list.
  std::vector<uint8_t> cached_;
  std::vector<PageId> lru_prev_, lru_next_;
  PageId lru_head_ = kNoPage, lru_tail_ = kNoPage;
  int64_t lru_size_ = 0;
  ReuseListener* listener_ = nullptr;
  void lru_push_back(PageId p);
  void lru_remove(PageId p);
  bool ensure_chunk(PageId p);  // the chunk holding page p exists (false: the system refused memory)
  PageId take(PageId p);        // refcount 1, counted used
  PageId lowest_in_run(PageSet& set, PageId p);
  void reserve_after(PageId t); // soft-reserves the free pages that follow t (up to a run), see allocate_after
};

}  // namespace kvpack::kv
