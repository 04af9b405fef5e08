// The KV manager: the one owner of KV memory (vLLM v1's KVCacheManager over its BlockPool).
//
// It owns the page pool and the prefix cache and is the only thing the scheduler asks about KV memory:
// new sequences, cached-prefix lookup, registration of full blocks, how many pages a sequence of a given
// length projects to, whether a step's pages can be had, usage figures and the invariants. Allocation
// itself happens when the model runner appends a step's slots (SequenceKv::append → PagePool::allocate),
// which reuses cached-free pages lazily, least recently freed first (kv/page_pool.h): making room for a
// step never scans the cache.
//
// A second tier of pages (host memory, files, a remote store) plugs in here: the manager is where pages
// leave the pool (preemption, prefix-cache reuse, compaction's evictions) and where they would come back.
//
// Thread-safety: not thread-safe; owned by the engine and driven from the scheduling thread.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include <vector>

#include "kv/cold_tier.h"
#include "kv/page_pool.h"
#include "kv/prefix_cache.h"
#include "kv/sequence_kv.h"
#include "kv/shared_tier.h"

namespace kvpack::kv {

// A sequence's KV while it is swapped out (preempted with a cold tier): its pages are records in the tier
// (pinned) — cached prompt blocks only it holds too (they stay findable as cached-free pages meanwhile)
// — except pages another holder shares, which stay hot, referenced by this handle. The sequence comes
// back bit-identical (its restored pages are private copies; compression's protection of its cached
// prompt blocks is explicit, SequenceCompressor::set_protected_prefix, so it does not change).
struct SwappedKv {
  uint64_t uid = 0;
  int32_t next_pos = 0;
  std::vector<int32_t> n_slots;             // per stream
  std::vector<int32_t> dropped_pages;       // per stream: pages a sliding window released from its front
  std::vector<std::vector<PageId>> pages;   // per stream, per page: a kept shared page, or kNoPage (in the tier)
  std::vector<uint64_t> keys;               // tier records, in stream / page order
  int64_t pages_total() const;
};

// Swap and spill figures (cumulative).
struct ColdUsage {
  int64_t swap_outs = 0, swap_ins = 0;
  int64_t swap_out_failures = 0;   // tier full / absent at preemption: the scheduler recomputed instead
  int64_t swap_in_misses = 0;      // a record was lost (checksum, eviction): recomputed
  int64_t pages_swapped_out = 0, pages_swapped_in = 0;
  double swap_out_seconds = 0, swap_in_seconds = 0;
  ColdTierStats tier;
};

struct KvUsage {
  int64_t pages_total = 0;
  int64_t pages_used = 0;         // named by page tables of running sequences
  int64_t pages_cached_free = 0;  // free, still holding prefix-cache blocks (reused last)
  int64_t pages_free = 0;         // allocatable (cached-free included)
  size_t page_bytes = 0;
  size_t used_bytes = 0;
  size_t reserved_bytes = 0;      // memory the pool obtained from the system
};

class KvManager {
 public:
  KvManager(const PoolConfig& pool, int32_t n_layers, int32_t n_kv_heads, uint64_t model_salt = 0);
  ~KvManager();
  KvManager(const KvManager&) = delete;
  KvManager& operator=(const KvManager&) = delete;

  int32_t n_streams() const { return n_layers_ * n_kv_heads_; }
  int32_t page_size() const { return pool_.config().page_size; }

  // An empty sequence whose page tables are sized for `reserve_slots` slots per stream (decode then
  // allocates no heap memory).
  std::unique_ptr<SequenceKv> new_sequence(int32_t reserve_slots = 0);
  // A sequence holding `parent`'s pages by reference (SequenceKv::share_from: copy-on-write from then
  // on); *shared_full_pages = the full pages it did not have to allocate. Takes no page from the pool.
  std::unique_ptr<SequenceKv> fork_sequence(const SequenceKv& parent, int32_t reserve_slots, int64_t* shared_full_pages = nullptr);

  // Prefix cache. attach: the longest cached prefix of `tokens` (whole blocks, leaving one token to
  // compute) into the empty `kv`; returns the tokens reused. register_blocks: the first n_blocks full
  // blocks that `kv` holds uncompacted become findable.
  int32_t attach_cached_prefix(SequenceKv& kv, std::span<const int32_t> tokens, uint64_t salt, int32_t* from_cold = nullptr,
                               int32_t* from_shared = nullptr);
  void register_blocks(const SequenceKv& kv, std::span<const int32_t> tokens, int32_t n_blocks, uint64_t salt);
  void clear_prefix_cache() { cache_.clear(); }
  const PrefixCacheStats& prefix_stats() const { return cache_.stats(); }

  // Pages a sequence holding `slots` slots per stream needs (`compressed`: one more page per stream,
  // the partly filled page compaction leaves behind). Admission projects with it.
  int64_t pages_for_slots(int64_t slots, bool compressed) const;
  // True when `pages` more pages can be allocated now (cached-free pages count: they are reused lazily).
  bool can_allocate(int64_t pages) const { return pool_.free_pages() >= pages; }
  int64_t capacity() const { return pool_.capacity(); }
  int64_t free_pages() const { return pool_.free_pages(); }
  KvUsage usage() const;

  // The cold tier (optional; kv/cold_tier.h): record size must be pool().record_bytes(). With a tier,
  // prefix-cache blocks whose pages the pool reuses are spilled to it and found there by later lookups.
  void set_cold_tier(std::unique_ptr<ColdTier> tier);
  ColdTier* cold_tier() { return cold_.get(); }
  bool has_cold_tier() const { return cold_ != nullptr; }
  // Swap preemption. swap_out: writes `kv`'s private pages to the tier and keeps its shared ones
  // referenced in `out`; false (nothing stored, `out` untouched) when there is no tier or it cannot take
  // them — the caller then recomputes. The caller releases `kv` afterwards either way.
  bool swap_out(const SequenceKv& kv, uint64_t uid, SwappedKv& out);
  // Pages swap_in(sw) takes from the pool.
  int64_t swap_in_pages(const SwappedKv& sw) const;
  // Brings a swapped-out sequence back (page tables sized for reserve_slots). nullptr when a record was
  // lost (the caller recomputes); `sw` is consumed in both cases. Requires can_allocate(swap_in_pages(sw)).
  std::unique_ptr<SequenceKv> swap_in(SwappedKv& sw, int32_t reserve_slots);
  // Forgets a swapped-out sequence (cancelled while swapped out).
  void drop_swapped(SwappedKv& sw);
  const ColdUsage& cold_usage();

  // The shared tier (optional; kv/shared_tier.h): prefix blocks only, published when registered and
  // fetched on a miss of both local levels. Its geometry must match the pool (record size, streams,
  // page size); `model_id` (engine/model_identity.h) seeds the key chain.
  void set_shared_tier(std::unique_ptr<SharedTier> tier, uint64_t model_id);
  SharedTier* shared_tier() { return shared_.get(); }
  bool has_shared_tier() const { return shared_ != nullptr; }
  SharedTierStats shared_stats() const { return shared_ ? shared_->stats() : SharedTierStats{}; }

  // Invariants (tests, debug builds): the pool's accounting against the page tables of `live` and the
  // pages `swapped` sequences keep hot, the prefix cache against the pool's marks, and every swapped
  // sequence's records present in the tier. "" or a description.
  std::string check(std::span<const SequenceKv* const> live, std::span<const SwappedKv* const> swapped = {}) const;

  // The pool, for the layers below the scheduler (model runner, compression, benchmarks).
  PagePool& pool() { return pool_; }
  const PagePool& pool() const { return pool_; }

 private:
  int32_t n_layers_, n_kv_heads_;
  PagePool pool_;
  std::unique_ptr<ColdTier> cold_;
  std::unique_ptr<SharedTier> shared_;
  PrefixCache cache_;  // declared after the pool and the tiers: destroyed first
  ColdUsage cold_usage_;
  std::vector<const uint8_t*> io_src_;  // scratch for batched tier calls
  std::vector<uint8_t*> io_dst_;
  std::unique_ptr<bool[]> io_ok_;
  size_t io_ok_cap_ = 0;
  std::span<bool> io_ok(size_t n);
};

}  // namespace kvpack::kv
