// Prefix cache: exact-match reuse of KV pages for shared prompt prefixes (vLLM / nano-vllm style).
//
// A block is `page_size` tokens; its key is hash(parent block's key, the block's token ids, salt), so
// a key names the whole prefix up to and including the block. A cached block is the group of pages,
// one per stream (layer x KV head), that hold its K/V. The cache owns one reference on each of those
// pages; a sequence that hits takes another. Shared pages are read-only (SequenceKv copies on write,
// and the compressor protects them), so compression never rewrites what the cache hands out.
// Entries are evicted least-recently-used first, preferring entries nobody else references (those
// free real memory) when the pool runs short.
// Only blocks computed from the true prompt before any compaction may be registered: after compaction
// a slot no longer corresponds to the prompt position it would be looked up by.
// Thread-safety: not thread-safe; owned by the scheduler thread together with the pool.
#pragma once
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/page_pool.h"
#include "kv/sequence_kv.h"

namespace kvpack::kv {

struct PrefixCacheStats {
  int64_t queries = 0;        // lookups (one per admitted sequence)
  int64_t hits = 0;           // lookups that matched at least one block
  int64_t blocks_queried = 0; // full blocks looked up
  int64_t blocks_hit = 0;     // blocks reused
  int64_t tokens_hit = 0;
  int64_t evictions = 0;      // blocks dropped from the cache
  int64_t cached_blocks = 0;  // current
};

class PrefixCache {
 public:
  PrefixCache(PagePool& pool, int32_t n_streams, uint64_t model_salt);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // Attaches the longest cached prefix of `tokens` (whole blocks only, and always leaving at least one
  // token to compute so the caller gets logits) to the empty sequence `kv`. Returns tokens reused.
  int32_t attach(SequenceKv& kv, std::span<const int32_t> tokens, uint64_t salt);
  // Registers the full blocks of `tokens` that `kv` holds (kv must hold them in order, uncompacted).
  void register_blocks(const SequenceKv& kv, std::span<const int32_t> tokens, int32_t n_blocks, uint64_t salt);
  // Drops LRU entries until the pool has `want_free` free pages or nothing evictable is left.
  // Returns the number of pages that became free.
  int64_t evict_until_free(int64_t want_free);
  void clear();

  const PrefixCacheStats& stats() const { return stats_; }
  // Page references the cache holds (for invariant checks: they count as page-table entries).
  std::vector<PageId> held_pages() const;

 private:
  struct Entry {
    std::vector<PageId> pages;  // one per stream
    uint64_t last_used = 0;
  };
  uint64_t block_key(uint64_t parent, std::span<const int32_t> block, uint64_t salt) const;
  void drop(std::unordered_map<uint64_t, Entry>::iterator it);

  PagePool* pool_;
  int32_t n_streams_;
  uint64_t model_salt_;
  uint64_t tick_ = 0;
  std::unordered_map<uint64_t, Entry> map_;
  PrefixCacheStats stats_;
};

}  // namespace kvpack::kv
