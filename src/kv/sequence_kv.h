// The KV cache of one sequence: one page table per stream (stream = layer * n_kv_heads + kv_head).
//
// Streams normally hold the same number of slots, but compression may leave them with different counts
// (per-layer / per-head budgets), so every stream keeps its own length. Slot s of a stream lives in
// slot s % page_size of page table[s / page_size]; positions(s) is the token position it came from.
// RAII: the destructor releases every page it references.
// Thread-safety: not thread-safe; one owner at a time. Different sequences on one pool must not be
// mutated concurrently (the pool is shared). compact_streams spreads its copies over a thread pool itself.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/attention.h"
#include "kv/page_pool.h"
#include "util/thread_pool.h"

namespace kvpack::kv {

class SequenceKv {
 public:
  SequenceKv(PagePool& pool, int32_t n_layers, int32_t n_kv_heads);
  ~SequenceKv();
  SequenceKv(const SequenceKv&) = delete;
  SequenceKv& operator=(const SequenceKv&) = delete;

  int32_t n_layers() const { return n_layers_; }
  int32_t n_kv_heads() const { return n_kv_heads_; }
  int32_t n_streams() const { return static_cast<int32_t>(streams_.size()); }
  int32_t stream_index(int32_t layer, int32_t kv_head) const { return layer * n_kv_heads_ + kv_head; }

  // Appends n slots to every stream, taking new pages from the pool as needed, and records their
  // positions (pos0, pos0+1, ...). All-or-nothing: on pool exhaustion nothing changes and it
  // returns false. The new slots' K/V bytes are for the caller to write (k_slot / v_slot).
  bool append(int32_t n, int32_t pos0);
  // Sizes every stream's page table for `slots` slots, so that appends up to that length allocate no
  // heap memory (the decode hot path): 12 bytes per page per stream, no KV pages are taken.
  void reserve_slots(int32_t slots);
  // Pages `append(n)` would take from the pool (admission control), the private copy of a shared,
  // partly filled last page included (a forked sequence's first append).
  int64_t pages_needed(int32_t n) const;

  int32_t n_slots(int32_t stream) const { return streams_[static_cast<size_t>(stream)].n_slots; }
  int32_t max_slots() const;    // longest stream
  int64_t total_slots() const;  // sum over streams
  int64_t pages_held() const;   // page-table entries over all streams
  // Tokens consumed by the sequence so far (next position); independent of eviction.
  int32_t next_pos() const { return next_pos_; }

  uint8_t* k_slot(int32_t stream, int32_t slot);
  uint8_t* v_slot(int32_t stream, int32_t slot);
  int32_t& position(int32_t stream, int32_t slot);
  int32_t position(int32_t stream, int32_t slot) const;
  // Every slot's position of one stream, in slot order, into out (resized to n_slots): page by page, for
  // callers that need the whole list (position() per slot is a page-table lookup each).
  void copy_positions(int32_t stream, std::vector<int32_t>& out) const;

  std::span<const PageId> page_table(int32_t stream) const { return streams_[static_cast<size_t>(stream)].pages; }
  kernels::KvStreamView view(int32_t stream) const;

  // Compaction support: keep only the slots in `keep` (strictly increasing slot indices) of one stream,
  // sliding them forward in order; pages that become empty return to the pool in the same step.
  // Pages shared with others (refcount > 1) are never written: the first shared page that would be
  // modified is copied first (copy-on-write). Returns the number of pages freed, or -1 with the stream
  // unchanged when the pool has fewer free pages than those copies need (compaction_copies).
  int64_t compact_stream(int32_t stream, std::span<const int32_t> keep);
  // compact_stream of several streams, the slides spread over `pool` (nullptr: in order on the caller):
  // streams[i] with keeps[i], each with compaction_copies == 0 (throws std::logic_error otherwise: a
  // copy-on-write allocates from the pool, which is single-threaded). The slides touch only the streams'
  // own pages; the emptied pages then go back to the pool on the caller, in the order given. freed[i] =
  // what compact_stream would have returned. A compaction event moves most slots of every stream (~230 MB
  // at 16K on a 28-layer, 8-KV-head model): on one thread that was a third of the event.
  void compact_streams(std::span<const int32_t> streams, std::span<const std::span<const int32_t>> keeps,
                       ThreadPool* pool, std::span<int64_t> freed);
  // Pages compact_stream(stream, keep) would copy before writing (shared pages it modifies): what it
  // needs free in the pool, before it gives any page back.
  int64_t compaction_copies(int32_t stream, std::span<const int32_t> keep) const;
  // Shared pages (refcount > 1 or prefix-cached) among the pages holding slots [from, to) of `stream`:
  // the copies a write to those slots would make first.
  int64_t shared_pages_in(int32_t stream, int32_t from, int32_t to) const {
    return shared_pages_in(streams_[static_cast<size_t>(stream)], from, to);
  }
  // Recall support: one slot brought back from elsewhere (the cold tier), its K and V rows in this pool's
  // row format and its original position.
  struct InsertedSlot {
    const uint8_t* k;
    const uint8_t* v;
    int32_t pos;
  };
  // Rebuilds one stream as the slots in `keep` (strictly increasing) plus `insert`, merged in position
  // order (insert sorted by position, no position shared with a kept slot). Slots before the first
  // change stay where they are (shared pages are copied before any write, as in compact_stream); the
  // stream may grow (new pages from the pool) or shrink (emptied pages return). False, with the stream
  // unchanged, when the pool cannot supply the pages. Only the slots whose source changes are written
  // (through buffers the sequence keeps for its next splice: the changed range's K/V rows).
  bool splice_stream(int32_t stream, std::span<const int32_t> keep, std::span<const InsertedSlot> insert);
  // Prefix sharing: appends one full page of `page_size` tokens to every stream by referencing
  // existing pages (pages_per_stream[stream], e.g. from the prefix cache) instead of computing them.
  // Every stream must be at a page boundary. Retains each page (it is read-only while shared).
  void attach_shared_block(std::span<const PageId> pages_per_stream, int32_t pos0);
  // Fork (n > 1 choices of one prompt): this empty sequence takes every page of `parent` by reference
  // (refcount + 1 each), with its slot counts and next position. The pages are then shared, hence
  // read-only for both: append copies a partly filled last page before writing into it, compaction and
  // recall copy the first page they would modify (copy-on-write), and a sequence's end releases only
  // its own references. Returns the full pages taken by reference (the partly filled last pages of the
  // streams are copied on the first append, so they save nothing).
  int64_t share_from(const SequenceKv& parent);
  // The page of `stream` that held token block `block` (slots [block * page_size, (block + 1) * page_size)
  // of the uncompacted stream, counting pages dropped from its front), or kNoPage once dropped.
  PageId block_page(int32_t stream, int32_t block) const {
    const Stream& s = streams_[static_cast<size_t>(stream)];
    const int64_t i = static_cast<int64_t>(block) - s.dropped_pages;
    return i < 0 || i >= static_cast<int64_t>(s.pages.size()) ? kNoPage : s.pages[static_cast<size_t>(i)];
  }

  // Sliding-window layers: releases the leading full pages of `stream` whose every slot has a position
  // below `min_pos` (no later query can see them), without moving any slot's bytes: the remaining slots
  // are renumbered by whole pages. Returns the pages released (a shared page loses this reference only).
  int64_t drop_pages_before(int32_t stream, int32_t min_pos);
  // Pages dropped from the front of `stream` so far (block_page's offset; kept across swap-out).
  int32_t dropped_pages(int32_t stream) const { return streams_[static_cast<size_t>(stream)].dropped_pages; }

  // Swap-in (kv/kv_manager.h): gives the empty stream `stream` n_slots slots on pages[i] where pages[i] is
  // a page whose reference the caller hands over (a shared page kept hot while swapped out), or on a fresh
  // page where pages[i] == kNoPage (its bytes and positions are for the caller to fill). Takes ownership
  // of every handed-over reference whatever happens; false when a fresh page could not be had (the stream
  // then holds what it got and is released with the sequence).
  bool restore_stream(int32_t stream, std::span<const PageId> pages, int32_t n_slots, int32_t dropped_pages = 0);
  void set_next_pos(int32_t pos) { next_pos_ = pos; }

  // Drops the last `n` slots of every stream and n positions (rollback of an append); frees emptied pages.
  void truncate_tail(int32_t n);
  // Releases everything (sequence finished or preempted).
  void clear();

  PagePool& pool() { return *pool_; }
  const PagePool& pool() const { return *pool_; }

 private:
  struct Stream {
    std::vector<PageId> pages;
    std::vector<const uint8_t*> page_ptrs;  // base pointers for the attention kernel
    int32_t n_slots = 0;
    int32_t dropped_pages = 0;  // pages released from the front (sliding window), drop_pages_before
  };
  void shrink_to(Stream& s, int32_t n_slots);
  bool make_private(Stream& s, size_t page_index);
  // Shared pages among the existing pages that hold slots [from, to) of `s`.
  int64_t shared_pages_in(const Stream& s, int32_t from, int32_t to) const;
  // compact_stream's copies: keep[i] moves to slot i from the first slot that moves on, each destination
  // page made private before its first write. Touches no pool state when no page written is shared.
  void slide_kept(Stream& s, std::span<const int32_t> keep);
  // splice_stream's working memory, kept between calls (a recall check splices a few streams each time).
  struct SpliceSource {
    int32_t kept;  // >= 0: a kept slot index; -1: insert[ins]
    int32_t ins;
  };
  struct SpliceScratch {
    std::vector<SpliceSource> order;
    std::vector<uint8_t> k, v;
    std::vector<int32_t> pos;
  };
  SpliceScratch splice_;

  PagePool* pool_;
  int32_t n_layers_, n_kv_heads_;
  std::vector<Stream> streams_;
  int32_t next_pos_ = 0;
};

}  // namespace kvpack::kv
