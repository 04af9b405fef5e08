#include "kv/prefix_cache.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <algorithm>

namespace kvpack::kv {

PrefixCache::PrefixCache(PagePool& pool, int32_t n_streams, uint64_t model_salt)
    : pool_(&pool), n_streams_(n_streams), model_salt_(model_salt) {}

PrefixCache::~PrefixCache() { clear(); }

void PrefixCache::clear() {
  for (auto& [k, e] : map_)
    for (PageId p : e.pages) pool_->release(p);
  map_.clear();
  stats_.cached_blocks = 0;
}

uint64_t PrefixCache::block_key(uint64_t parent, std::span<const int32_t> block, uint64_t salt) const {
  XXH3_state_t st;
  XXH3_64bits_reset_withSeed(&st, model_salt_ ^ (salt * 0x9e3779b97f4a7c15ull));
  XXH3_64bits_update(&st, &parent, sizeof parent);
  XXH3_64bits_update(&st, block.data(), block.size_bytes());
  return XXH3_64bits_digest(&st);
}

int32_t PrefixCache::attach(SequenceKv& kv, std::span<const int32_t> tokens, uint64_t salt) {
  const int32_t ps = pool_->config().page_size;
  ++stats_.queries;
  if (kv.max_slots() != 0) return 0;
  // Leave at least one token uncached so the forward pass produces the next-token logits.
  const int32_t max_blocks = tokens.empty() ? 0 : static_cast<int32_t>((tokens.size() - 1) / static_cast<size_t>(ps));
  uint64_t key = 0;
  int32_t matched = 0;
  for (int32_t b = 0; b < max_blocks; ++b) {
    ++stats_.blocks_queried;
    key = block_key(key, tokens.subspan(static_cast<size_t>(b) * ps, static_cast<size_t>(ps)), salt);
    auto it = map_.find(key);
    if (it == map_.end()) break;
    it->second.last_used = ++tick_;
    kv.attach_shared_block(it->second.pages, b * ps);
    ++matched;
  }
  if (matched > 0) ++stats_.hits;
  stats_.blocks_hit += matched;
  stats_.tokens_hit += static_cast<int64_t>(matched) * ps;
  return matched * ps;
}

void PrefixCache::register_blocks(const SequenceKv& kv, std::span<const int32_t> tokens, int32_t n_blocks, uint64_t salt) {
  const int32_t ps = pool_->config().page_size;
  uint64_t key = 0;
  for (int32_t b = 0; b < n_blocks; ++b) {
    if (static_cast<size_t>(b + 1) * ps > tokens.size()) break;
    bool held = true;
    for (int32_t s = 0; s < n_streams_; ++s) held &= kv.n_slots(s) >= (b + 1) * ps;
    if (!held) break;
    key = block_key(key, tokens.subspan(static_cast<size_t>(b) * ps, static_cast<size_t>(ps)), salt);
    auto it = map_.find(key);
    if (it != map_.end()) {
      it->second.last_used = ++tick_;
      continue;
    }
    Entry e;
    e.pages.resize(static_cast<size_t>(n_streams_));
    for (int32_t s = 0; s < n_streams_; ++s) {
      e.pages[static_cast<size_t>(s)] = kv.block_page(s, b);
      pool_->retain(e.pages[static_cast<size_t>(s)]);
    }
    e.last_used = ++tick_;
    map_.emplace(key, std::move(e));
    ++stats_.cached_blocks;
  }
}

void PrefixCache::drop(std::unordered_map<uint64_t, Entry>::iterator it) {
  for (PageId p : it->second.pages) pool_->release(p);
  map_.erase(it);
  ++stats_.evictions;
  --stats_.cached_blocks;
}

int64_t PrefixCache::evict_until_free(int64_t want_free) {
  const int64_t before = pool_->free_pages();
  while (pool_->free_pages() < want_free && !map_.empty()) {
    // LRU among entries whose pages only the cache holds (dropping them frees memory); if none,
    // nothing the cache can do frees memory.
    auto victim = map_.end();
    for (auto it = map_.begin(); it != map_.end(); ++it) {
      bool sole = true;
      for (PageId p : it->second.pages) sole &= pool_->refcount(p) == 1;
      if (sole && (victim == map_.end() || it->second.last_used < victim->second.last_used)) victim = it;
    }
    if (victim == map_.end()) break;
    drop(victim);
  }
  return pool_->free_pages() - before;
}

std::vector<PageId> PrefixCache::held_pages() const {
  std::vector<PageId> out;
  for (const auto& [k, e] : map_) out.insert(out.end(), e.pages.begin(), e.pages.end());
  return out;
}

}  // namespace kvpack::kv
