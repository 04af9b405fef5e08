// Evicted tokens go down, not away: the slots a compaction drops from a sequence's streams, kept in the
// cold tier with a small digest per cold page in hot memory (Quest's bound), so that recall can find the
// pages that might matter for the current queries without reading them.
//
// Per stream (one layer x one KV head), every compaction event's evicted slots are packed in slot order
// — which is token order: a stream's slots are always in position order — into records of the page
// layout (K rows, V rows at the pool's v_offset, positions; kv/page_pool.h), page_size slots each, the
// last one of an event possibly partial (unused slots carry position -1). A record can therefore be
// copied straight into a pool page. Each cold page has a digest: the element-wise minimum and maximum of
// its keys (decoded to f32, post-RoPE as stored), so that for any query q
//     max over the page's slots of q.k  <=  sum_i max(q_i * min_i, q_i * max_i)      (upper_bound)
// at the cost of one pass over 2 * head_dim numbers, and the slot count and position range.
//
// Records are unpinned: the tier may drop them under pressure (LRU), which turns the page into "lost"
// when a read misses (counted); a put the tier refuses marks the page lost at once. Nothing here is
// needed for correctness of the hot KV — a lost cold page only means recall cannot bring it back.
// The destructor erases the sequence's records from the tier.
//
// Cost: the digest is 2 * head_dim halves per cold page per stream (512 B at head_dim 128 against an 8 KiB
// f16 page: 1/16 of the evicted bytes stay hot); figures in stats(). The minima are rounded down and the
// maxima up to f16 (f32_to_fp16_floor / _ceil), so the box still holds every key and the bound stays a
// bound; with f16 keys (the default KV type) the box is exact.
// Thread-safety: one owner (the sequence's thread); the tier is thread-safe.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kv/cold_tier.h"
#include "kv/page_pool.h"
#include "kv/sequence_kv.h"
#include "util/thread_pool.h"

namespace kvpack::kv {

struct EvictedPage {
  uint64_t key = 0;       // tier record
  int32_t n_slots = 0;    // 1 .. page_size
  int32_t first_pos = 0;  // positions of its first and last slot
  int32_t last_pos = 0;
  bool lost = false;      // the tier refused or dropped it: not recallable
  bool recalled = false;  // brought back into the hot set (record erased; also counts as not recallable)
};

struct EvictedStats {
  int64_t pages_written = 0;   // records the tier accepted
  int64_t slots_written = 0;
  int64_t pages_refused = 0;   // puts the tier could not honour (full of pinned records, I/O error)
  int64_t pages_read = 0;      // recalled reads that hit
  int64_t pages_lost = 0;      // reads that missed (evicted by LRU, checksum) plus refused puts
  uint64_t bytes_written = 0;  // record bytes accepted
  uint64_t digest_bytes = 0;   // hot memory held by digests now
  void add(const EvictedStats& o);  // sums (digest_bytes too: a total over sequences)
};

class EvictedKv {
 public:
  // `uid` names the sequence (tier keys derive from it; unique among live sequences).
  EvictedKv(ColdTier& tier, const PagePool& pool, uint64_t uid, int32_t n_streams);
  ~EvictedKv();
  EvictedKv(const EvictedKv&) = delete;
  EvictedKv& operator=(const EvictedKv&) = delete;

  // A copy for a forked sequence `uid` (n > 1 choices of one prefill): the same pages, digests and
  // figures, each live record copied in the tier under the child's keys (a record the tier no longer has,
  // or refuses, is lost in the copy only). Nothing may be staged (call between events).
  std::unique_ptr<EvictedKv> fork(uint64_t uid) const;
  // Stages the slots of `stream` that `keep` (strictly increasing slot indices of kv's stream) leaves out:
  // call right before kv.compact_stream(stream, keep). Records go to the tier at commit(), or earlier,
  // batch by batch, once the staged bytes would pass kStageBytes: the first event after a long prompt
  // evicts gigabytes, and staging all of it first held that much memory twice (and kept the capacity).
  void add(const SequenceKv& kv, int32_t stream, std::span<const int32_t> keep);
  // add() of streams[i] with keeps[i], in that order, with the copies and digests spread over `pool`
  // (nullptr: on the caller): the same keys, records, digests and tier batches as the add() loop. A
  // decode-time event of a 28-layer, 8-KV-head model copies ~15 MiB into ~1800 records; on one thread that
  // was about as long as writing them to the tier.
  void add_many(const SequenceKv& kv, std::span<const int32_t> streams, std::span<const std::span<const int32_t>> keeps,
                ThreadPool* pool);
  // Writes the staged records with one batched put (end of a compression event).
  void commit();
  // The most record bytes staged at once (a decode-time event of a 28-layer, 8-KV-head model stages ~15 MiB).
  static constexpr size_t kStageBytes = size_t{16} << 20;

  int32_t n_streams() const { return static_cast<int32_t>(streams_.size()); }
  int32_t head_dim() const { return head_dim_; }
  std::span<const EvictedPage> pages(int32_t stream) const { return streams_[static_cast<size_t>(stream)].pages; }
  // The digest of page `page` of `stream`: head_dim minima, then head_dim maxima, as f16 bits.
  std::span<const uint16_t> digest(int32_t stream, int32_t page) const;
  // Every page's digest of `stream`, page after page (pages(stream).size() x 2 * head_dim halves).
  std::span<const uint16_t> digests(int32_t stream) const { return streams_[static_cast<size_t>(stream)].digests; }
  // sum_i max(q_i * min_i, q_i * max_i): no slot of the page has q.k above it (q: head_dim floats).
  float upper_bound(int32_t stream, int32_t page, const float* q) const;
  // Reads the record of a cold page (pool().record_bytes() bytes) into `out`; false when the tier no
  // longer has it (the page is then marked lost).
  bool read(int32_t stream, int32_t page, std::span<uint8_t> out);
  // read() of many pages with one batched tier call (kv::ColdTier::get_many: one lock, copies spread over
  // the tier's I/O threads): refs[i] = {stream, page} into out[i]. Returns one flag per ref, false where
  // read() would be; the flags live until the next call.
  struct PageRef {
    int32_t stream;
    int32_t page;
  };
  std::span<const bool> read_many(std::span<const PageRef> refs, std::span<uint8_t* const> out);
  // The page's slots are hot again (recall): its record leaves the tier and it is no longer recallable.
  void forget(int32_t stream, int32_t page);
  // Forgets every page holding a position >= pos (those tokens are being computed again).
  void forget_from(int32_t pos);

  const EvictedStats& stats() const { return stats_; }
  // Erases every record and forgets every page (the sequence's KV is being rebuilt or dropped).
  void clear();

 private:
  struct Stream {
    std::vector<EvictedPage> pages;
    std::vector<uint16_t> digests;  // 2 * head_dim f16 per page
  };
  struct Staged {
    int32_t stream;
    int32_t page;
  };
  // One planned record of add_many: evicted_slots_[from, to) of `stream` into its page entry `page`,
  // at stage_ offset stage_at.
  struct Job {
    int32_t stream;
    int32_t page;
    size_t from, to;
    size_t stage_at;
  };
  void fill_jobs(const SequenceKv& kv, ThreadPool* pool);  // runs and clears jobs_
  void fill_record(const SequenceKv& kv, const Job& job, float* scratch);

  ColdTier* tier_;
  const PagePool* pool_;
  uint64_t uid_;
  int32_t head_dim_, page_size_;
  DType kv_type_;
  uint64_t next_record_ = 0;
  std::vector<Stream> streams_;
  // Staged records of the current event: their bytes back to back, and which page each is.
  std::vector<uint8_t> stage_;
  std::vector<Staged> staged_;
  std::vector<uint64_t> stage_keys_;
  std::vector<const uint8_t*> stage_ptrs_;
  std::vector<uint64_t> read_keys_;  // read_many's batch (kept: no allocation per check)
  std::vector<uint8_t*> read_ptrs_;
  std::vector<size_t> read_index_;
  std::unique_ptr<bool[]> read_got_, read_ok_;  // read_many's flags per key asked / per ref (read_cap_ each)
  size_t read_cap_ = 0;
  std::vector<int32_t> evicted_slots_;  // add_many: the evicted slot indices of its streams, back to back
  std::vector<Job> jobs_;              // add_many: records planned and not filled yet
  std::vector<float> scratch_;         // per thread: one decoded key, the record's minima, its maxima
  EvictedStats stats_;
};

}  // namespace kvpack::kv
