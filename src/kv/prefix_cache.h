// Prefix cache: exact-match reuse of KV pages for shared prompt prefixes (vLLM v1 / nano-vllm style).
//
// A block is `page_size` tokens; its key is hash(parent block's key, the block's token ids, salt), so
// a key names the whole prefix up to and including the block. A cached block is the group of pages,
// one per stream (layer x KV head), that hold its K/V.
//
// The cache holds no page references. Registering a block marks its pages cached in the pool; when the
// last sequence lets go of them they stay in the pool as cached-free pages (counted as free), and a later
// lookup revives them. The pool reuses cached-free pages least recently freed first, only when it has no
// other free page, and tells the cache (ReuseListener), which forgets that block: eviction is lazy and
// O(1) per block, with no scan (vLLM v1's BlockPool). Cached pages are shared, i.e. read-only: SequenceKv
// copies on write and compression never evicts from them, so the cache never hands out rewritten K/V.
// With a cold tier (set_cold_tier), a block whose pages the pool reuses is first written to the tier
// under its key (one record per stream), and a lookup that misses the hot cache looks there and loads
// the block into fresh pages (which become cached again): hits by tier are counted separately.
// With a shared tier (set_shared_tier; kv/shared_tier.h) — a store shared by replicas of the model — every
// newly registered block is also published to it (write-through, queued: registration never waits on
// the network), and a lookup that misses the hot cache and the cold tier fetches the remaining blocks
// of the prompt from it in one round trip. Blocks from either tier become ordinary cached blocks.
// Only blocks computed from the true prompt before any compaction may be registered: after compaction
// a slot no longer corresponds to the prompt position it would be looked up by.
// Thread-safety: not thread-safe; owned by the KV manager together with the pool (scheduler thread).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/cold_tier.h"
#include "kv/page_pool.h"
#include "kv/sequence_kv.h"
#include "kv/shared_tier.h"

namespace kvpack::kv {

struct PrefixCacheStats {
  int64_t queries = 0;        // lookups (one per admitted sequence)
  int64_t hits = 0;           // lookups that matched at least one block
  int64_t blocks_queried = 0; // full blocks looked up
  int64_t blocks_hit = 0;     // blocks reused
  int64_t tokens_hit = 0;
  int64_t evictions = 0;      // blocks dropped from the cache (their pages were reused)
  int64_t cached_blocks = 0;  // current
  // With a cold tier: blocks written down when their pages were reused, and lookups served from it.
  int64_t blocks_spilled = 0, spill_failures = 0;
  int64_t blocks_hit_cold = 0, tokens_hit_cold = 0;  // included in blocks_hit / tokens_hit
  // With a shared tier: blocks loaded from it (included in blocks_hit / tokens_hit), blocks handed to it
  // for publication and blocks it dropped (queue full, breaker open).
  int64_t blocks_hit_shared = 0, tokens_hit_shared = 0;
  int64_t blocks_published = 0, publish_dropped = 0;
};

class PrefixCache : private PagePool::ReuseListener {
 public:
  PrefixCache(PagePool& pool, int32_t n_streams, uint64_t model_salt);
  ~PrefixCache() override;
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // Attaches the longest cached prefix of `tokens` (whole blocks only, and always leaving at least one
  // token to compute so the caller gets logits) to the empty sequence `kv`. Returns tokens reused.
  // `from_cold` / `from_shared` (optional) receive how many of them were loaded from the cold tier / the
  // shared tier.
  int32_t attach(SequenceKv& kv, std::span<const int32_t> tokens, uint64_t salt, int32_t* from_cold = nullptr,
                 int32_t* from_shared = nullptr);
  // Registers the full blocks of `tokens` that `kv` holds (kv must hold them in order, uncompacted).
  void register_blocks(const SequenceKv& kv, std::span<const int32_t> tokens, int32_t n_blocks, uint64_t salt);
  // Forgets every block (their free pages become plain free pages).
  void clear();
  // Spill target and second lookup level (nullptr: none). Record size = the pool's record_bytes().
  void set_cold_tier(ColdTier* tier) { cold_ = tier; }
  // Publication target and third lookup level (nullptr: none); `model_id` seeds its key chain
  // (kv/shared_tier.h). The tier's block geometry must match the pool's.
  void set_shared_tier(SharedTier* tier, uint64_t model_id) {
    shared_ = tier;
    model_id_ = model_id;
  }

  const PrefixCacheStats& stats() const { return stats_; }
  // Consistency of the cache with the pool's marks (tests, debug builds): "" or a description.
  std::string check() const;

 private:
  using Map = std::unordered_map<uint64_t, std::vector<PageId>>;  // block key -> one page per stream
  uint64_t block_key(uint64_t parent, std::span<const int32_t> block, uint64_t salt) const;
  void drop(Map::iterator it);
  void on_reuse(PageId p) override;
  uint64_t cold_key(uint64_t block, int32_t stream) const;
  void spill(uint64_t key, const std::vector<PageId>& pages);
  // Loads block `key` from the cold tier into fresh cached pages; the new map entry, or end() on a miss.
  Map::iterator load_cold(uint64_t key);
  // Fetches blocks [b, max_blocks) of `tokens` from the shared tier (key_b: block b's local key) and
  // inserts the leading run found as cached blocks whose pages hold one reference each (the caller
  // attaches and releases them). Returns how many.
  int32_t load_shared(std::span<const int32_t> tokens, uint64_t salt, int32_t b, int32_t max_blocks, uint64_t key_b);
  void fill_shared_keys(std::span<const int32_t> tokens, uint64_t salt, int32_t n_blocks);

  PagePool* pool_;
  int32_t n_streams_;
  uint64_t model_salt_;
  Map map_;
  std::unordered_map<PageId, uint64_t> page_key_;  // cached page -> its block's key
  PrefixCacheStats stats_;
  ColdTier* cold_ = nullptr;
  std::vector<uint64_t> io_keys_;  // scratch for batched tier calls
  std::vector<const uint8_t*> io_src_;
  std::vector<uint8_t*> io_dst_;
  std::unique_ptr<bool[]> io_ok_;
  SharedTier* shared_ = nullptr;
  uint64_t model_id_ = 0;
  std::vector<SharedKey> shared_keys_;  // scratch: the shared key chain of a prompt
  std::vector<uint8_t> shared_buf_;     // scratch: fetched blocks
};

}  // namespace kvpack::kv
