#include "kv/prefix_cache.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <algorithm>

namespace kvpack::kv {

PrefixCache::PrefixCache(PagePool& pool, int32_t n_streams, uint64_t model_salt)
    : pool_(&pool), n_streams_(n_streams), model_salt_(model_salt) {
  pool_->set_reuse_listener(this);
}

PrefixCache::~PrefixCache() {
  clear();
  pool_->set_reuse_listener(nullptr);
}

void PrefixCache::clear() {
  while (!map_.empty()) {
    drop(map_.begin());
    --stats_.evictions;  // clearing is not eviction under memory pressure
  }
}

uint64_t PrefixCache::block_key(uint64_t parent, std::span<const int32_t> block, uint64_t salt) const {
  XXH3_state_t st;
  XXH3_64bits_reset_withSeed(&st, model_salt_ ^ (salt * 0x9e3779b97f4a7c15ull));
  XXH3_64bits_update(&st, &parent, sizeof parent);
  XXH3_64bits_update(&st, block.data(), block.size_bytes());
  return XXH3_64bits_digest(&st);
}

int32_t PrefixCache::attach(SequenceKv& kv, std::span<const int32_t> tokens, uint64_t salt, int32_t* from_cold) {
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
    const bool cold = it == map_.end() && cold_ != nullptr;
    if (cold) it = load_cold(key);
    if (it == map_.end()) break;
    kv.attach_shared_block(it->second, b * ps);  // retains: revives cached-free pages
    if (cold) {  // load_cold's own references go: the sequence holds the pages now
      for (PageId p : it->second) pool_->release(p);
      ++stats_.blocks_hit_cold;
      stats_.tokens_hit_cold += ps;
      if (from_cold) *from_cold += ps;
    }
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
    if (map_.count(key)) continue;  // already cached (this sequence attached it, or another computed it)
    std::vector<PageId> pages(static_cast<size_t>(n_streams_));
    bool fresh = true;
    for (int32_t s = 0; s < n_streams_; ++s) {
      pages[static_cast<size_t>(s)] = kv.block_page(s, b);
      fresh &= !pool_->is_cached(pages[static_cast<size_t>(s)]);
    }
    if (!fresh) continue;  // a page of another block (cannot happen for an uncompacted prompt; be safe)
    for (PageId p : pages) {
      pool_->mark_cached(p);
      page_key_[p] = key;
    }
    map_.emplace(key, std::move(pages));
    ++stats_.cached_blocks;
  }
}

void PrefixCache::drop(Map::iterator it) {
  for (PageId p : it->second) {
    pool_->unmark_cached(p);
    page_key_.erase(p);
  }
  map_.erase(it);
  ++stats_.evictions;
  --stats_.cached_blocks;
}

void PrefixCache::on_reuse(PageId p) {
  auto k = page_key_.find(p);
  if (k == page_key_.end()) return;
  auto it = map_.find(k->second);
  if (it == map_.end()) return;
  // p's K/V are still intact (allocate() has not handed it out yet): the whole block goes down a tier.
  if (cold_ != nullptr) spill(it->first, it->second);
  drop(it);
}

uint64_t PrefixCache::cold_key(uint64_t block, int32_t stream) const {
  const uint64_t parts[3] = {0x7072656669780000ull /* "prefix" */, block, static_cast<uint64_t>(stream)};
  return XXH3_64bits(parts, sizeof parts);
}

void PrefixCache::spill(uint64_t key, const std::vector<PageId>& pages) {
  const size_t n = pages.size();
  io_keys_.resize(n);
  io_src_.resize(n);
  if (!io_ok_) io_ok_ = std::make_unique<bool[]>(static_cast<size_t>(n_streams_));
  for (size_t s = 0; s < n; ++s) {
    io_keys_[s] = cold_key(key, static_cast<int32_t>(s));
    io_src_[s] = pool_->data(pages[s]);
  }
  std::span<bool> ok(io_ok_.get(), n);
  cold_->put_many(io_keys_, io_src_, ok);
  bool all = true;
  for (bool b : ok) all &= b;
  for (size_t s = 0; all && s < n; ++s) all = cold_->contains(io_keys_[s]);  // none evicted by its successors
  if (all) {
    ++stats_.blocks_spilled;
  } else {  // a partial block is useless: forget it
    for (uint64_t k : io_keys_) cold_->erase(k);
    ++stats_.spill_failures;
  }
}

PrefixCache::Map::iterator PrefixCache::load_cold(uint64_t key) {
  const size_t n = static_cast<size_t>(n_streams_);
  io_keys_.resize(n);
  for (size_t s = 0; s < n; ++s) {
    io_keys_[s] = cold_key(key, static_cast<int32_t>(s));
    if (!cold_->contains(io_keys_[s])) return map_.end();
  }
  if (pool_->free_pages() < n_streams_) return map_.end();
  std::vector<PageId> pages(n, kNoPage);
  for (size_t s = 0; s < n; ++s) {
    pages[s] = pool_->allocate();  // may spill other cached-free blocks: no map iterator is held here
    if (pages[s] == kNoPage) {
      for (PageId p : pages)
        if (p != kNoPage) pool_->release(p);
      return map_.end();
    }
  }
  io_keys_.resize(n);  // (allocate may have spilled through io_keys_)
  io_dst_.resize(n);
  for (size_t s = 0; s < n; ++s) {
    io_keys_[s] = cold_key(key, static_cast<int32_t>(s));
    io_dst_[s] = pool_->data(pages[s]);
  }
  if (!io_ok_) io_ok_ = std::make_unique<bool[]>(n);
  std::span<bool> ok(io_ok_.get(), n);
  cold_->get_many(io_keys_, io_dst_, ok);
  bool all = true;
  for (bool b : ok) all &= b;
  if (!all) {  // lost (checksum, evicted meanwhile): recompute instead, never use partial data
    for (PageId p : pages) pool_->release(p);
    for (uint64_t k : io_keys_) cold_->erase(k);
    return map_.end();
  }
  for (PageId p : pages) {
    pool_->mark_cached(p);
    page_key_[p] = key;
  }
  ++stats_.cached_blocks;
  return map_.emplace(key, std::move(pages)).first;
}

std::string PrefixCache::check() const {
  size_t pages = 0;
  for (const auto& [key, ps] : map_) {
    if (static_cast<int32_t>(ps.size()) != n_streams_) return "prefix-cache block with " + std::to_string(ps.size()) + " pages";
    for (PageId p : ps) {
      if (!pool_->is_cached(p)) return "prefix-cache page " + std::to_string(p) + " is not marked cached in the pool";
      auto k = page_key_.find(p);
      if (k == page_key_.end() || k->second != key) return "prefix-cache page " + std::to_string(p) + " maps to another block";
    }
    pages += ps.size();
  }
  if (pages != page_key_.size()) return "prefix-cache page map has " + std::to_string(page_key_.size()) + " entries for " +
                                        std::to_string(pages) + " pages";
  if (static_cast<int64_t>(map_.size()) != stats_.cached_blocks) return "prefix-cache block count is stale";
  return "";
}

}  // namespace kvpack::kv
