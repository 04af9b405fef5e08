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

#include "kv/page_pool.h"
#include "kv/prefix_cache.h"
#include "kv/sequence_kv.h"

namespace kvpack::kv {

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

  // Prefix cache. attach: the longest cached prefix of `tokens` (whole blocks, leaving one token to
  // compute) into the empty `kv`; returns the tokens reused. register_blocks: the first n_blocks full
  // blocks that `kv` holds uncompacted become findable.
  int32_t attach_cached_prefix(SequenceKv& kv, std::span<const int32_t> tokens, uint64_t salt);
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

  // Invariants (tests, debug builds): the pool's accounting against the page tables of `live`, and the
  // prefix cache against the pool's marks. "" or a description.
  std::string check(std::span<const SequenceKv* const> live) const;

  // The pool, for the layers below the scheduler (model runner, compression, benchmarks).
  PagePool& pool() { return pool_; }
  const PagePool& pool() const { return pool_; }

 private:
  int32_t n_layers_, n_kv_heads_;
  PagePool pool_;
  PrefixCache cache_;  // declared after the pool: destroyed first
};

}  // namespace kvpack::kv
