// Naive eviction, as bookkeeping: what a paged allocator that evicts tokens WITHOUT compaction would
// still hold (the `--kv-naive` demonstration: "evicted 90 %, freed nothing").
//
// The real cache is compacted as usual; this class replays the keep sets on a virtual layout of each
// stream: every slot of the original layout stays in its virtual page (evicted slots become holes),
// a virtual page whose slots are all holes is freed (removed from the stream, later pages move down
// one page), and new slots fill the last virtual page before opening new ones. All virtual pages but
// the last are full, so a stream is described by its virtual slot count and, per virtual page, how
// many of its slots are live (the compacted stream's slots, in order).
// Thread-safety: not thread-safe; one per sequence.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace kvpack::compress {

class NaiveLayout {
 public:
  NaiveLayout() = default;
  NaiveLayout(int32_t n_streams, int32_t page_size);

  // Brings stream s to `live_slots` live slots: slots appended since the last call fill the last
  // virtual page, then new ones; a shorter length (a rolled-back append) drops live slots from the tail.
  void sync(int32_t s, int32_t live_slots);
  // An event kept `keep` (strictly increasing indices of the live slots) of stream s; returns the
  // virtual pages freed (those left without a live slot).
  int64_t evict(int32_t s, std::span<const int32_t> keep);
  // Virtual pages of stream s once it holds `live_slots` live slots (appends since the last sync
  // counted as sync would place them); const, for page accounting between events.
  int64_t pages(int32_t s, int32_t live_slots) const;

 private:
  struct Stream {
    int32_t slots = 0;              // virtual slots, holes included
    int32_t live = 0;               // live slots (== the compacted stream's length at the last sync)
    std::vector<int32_t> page_live;  // live slots per virtual page
  };
  int32_t page_size_ = 16;
  std::vector<Stream> streams_;
};

}  // namespace kvpack::compress
