#include "kv/prefix_cache.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <optional>

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
  XXH3_INITSTATE(&st);  // reset_withSeed reads the old seed: stack garbage equal to it skips the secret
  XXH3_64bits_reset_withSeed(&st, model_salt_ ^ (salt * 0x9e3779b97f4a7c15ull));
  XXH3_64bits_update(&st, &parent, sizeof parent);
  XXH3_64bits_update(&st, block.data(), block.size_bytes());
  return XXH3_64bits_digest(&st);
}

int32_t PrefixCache::attach(SequenceKv& kv, std::span<const int32_t> tokens, uint64_t salt, int32_t* from_cold,
                            int32_t* from_shared) {
  const int32_t ps = pool_->config().page_size;
  ++stats_.queries;
  if (kv.max_slots() != 0) return 0;
  // Leave at least one token uncached so the forward pass produces the next-token logits.
  const int32_t max_blocks = tokens.empty() ? 0 : static_cast<int32_t>((tokens.size() - 1) / static_cast<size_t>(ps));
  uint64_t key = 0;
  int32_t matched = 0;
  // Blocks [shared_begin, shared_end) came from the shared tier in one fetch; each holds a reference
  // from load_shared until the sequence has attached it. All of them are attached below: they are in
  // the map, referenced (so not reusable), and the loop runs to max_blocks past them.
  int32_t shared_begin = 0, shared_end = 0;
  for (int32_t b = 0; b < max_blocks; ++b) {
    ++stats_.blocks_queried;
    key = block_key(key, tokens.subspan(static_cast<size_t>(b) * ps, static_cast<size_t>(ps)), salt);
    auto it = map_.find(key);
    const bool cold = it == map_.end() && cold_ != nullptr;
    if (cold) it = load_cold(key);
    if (it == map_.end() && shared_ != nullptr && b >= shared_end) {
      const int32_t n = load_shared(tokens, salt, b, max_blocks, key);
      if (n > 0) {
        shared_begin = b;
        shared_end = b + n;
        it = map_.find(key);  // (inserts may have rehashed the map)
      }
    }
    if (it == map_.end()) break;
    kv.attach_shared_block(it->second, b * ps);  // retains: revives cached-free pages
    const bool shared = b >= shared_begin && b < shared_end;
    if (shared || cold) {  // the loader's own references go: the sequence holds the pages now
      for (PageId p : it->second) pool_->release(p);
    }
    if (shared) {
      ++stats_.blocks_hit_shared;
      stats_.tokens_hit_shared += ps;
      if (from_shared) *from_shared += ps;
    } else if (cold) {
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

void PrefixCache::fill_shared_keys(std::span<const int32_t> tokens, uint64_t salt, int32_t n_blocks) {
  const size_t ps = static_cast<size_t>(pool_->config().page_size);
  SharedKeyChain chain(model_id_, salt);
  shared_keys_.resize(static_cast<size_t>(n_blocks));
  for (size_t j = 0; j < shared_keys_.size(); ++j) shared_keys_[j] = chain.next(tokens.subspan(j * ps, ps));
}

int32_t PrefixCache::load_shared(std::span<const int32_t> tokens, uint64_t salt, int32_t b, int32_t max_blocks, uint64_t key_b) {
  const size_t ps = static_cast<size_t>(pool_->config().page_size);
  const size_t n_streams = static_cast<size_t>(n_streams_);
  // Only fetch what the pool can take: each block needs one page per stream.
  const int32_t room = static_cast<int32_t>(pool_->free_pages() / n_streams_);
  const int32_t want = std::min(max_blocks - b, room);
  if (want <= 0) return 0;
  fill_shared_keys(tokens, salt, b + want);
  const size_t found = shared_->fetch(std::span<const SharedKey>(shared_keys_).subspan(static_cast<size_t>(b)),
                                      tokens.subspan(static_cast<size_t>(b) * ps, static_cast<size_t>(want) * ps), shared_buf_);
  const size_t rb = pool_->record_bytes();
  uint64_t key = key_b;
  int32_t loaded = 0;
  std::vector<PageId> pages(n_streams, kNoPage);
  for (size_t i = 0; i < found; ++i) {
    const size_t blk = static_cast<size_t>(b) + i;
    if (i > 0) key = block_key(key, tokens.subspan(blk * ps, ps), salt);
    if (map_.count(key)) break;  // the rest of the prompt is cached locally after all: the caller finds it
    if (pool_->free_pages() < n_streams_) break;
    std::fill(pages.begin(), pages.end(), kNoPage);
    bool ok = true;
    for (size_t s = 0; s < n_streams && ok; ++s) {
      pages[s] = pool_->allocate();  // may spill other cached-free blocks (never these: they are referenced)
      ok = pages[s] != kNoPage;
    }
    if (!ok) {
      for (PageId p : pages)
        if (p != kNoPage) pool_->release(p);
      break;
    }
    const uint8_t* src = shared_buf_.data() + i * n_streams * rb;
    for (size_t s = 0; s < n_streams; ++s) {
      std::memcpy(pool_->data(pages[s]), src + s * rb, rb);
      pool_->mark_cached(pages[s]);
      page_key_[pages[s]] = key;
    }
    map_.emplace(key, pages);
    ++stats_.cached_blocks;
    ++loaded;
  }
  return loaded;
}

void PrefixCache::register_blocks(const SequenceKv& kv, std::span<const int32_t> tokens, int32_t n_blocks, uint64_t salt) {
  const int32_t ps = pool_->config().page_size;
  uint64_t key = 0;
  std::optional<SharedKeyChain> chain;
  if (shared_ != nullptr) chain.emplace(model_id_, salt);
  for (int32_t b = 0; b < n_blocks; ++b) {
    if (static_cast<size_t>(b + 1) * ps > tokens.size()) break;
    bool reached = true;
    for (int32_t s = 0; s < n_streams_; ++s) reached &= kv.dropped_pages(s) * ps + kv.n_slots(s) >= (b + 1) * ps;
    if (!reached) break;
    const std::span<const int32_t> block = tokens.subspan(static_cast<size_t>(b) * ps, static_cast<size_t>(ps));
    key = block_key(key, block, salt);
    const SharedKey skey = chain ? chain->next(block) : SharedKey{};
    if (map_.count(key)) continue;  // already cached (this sequence attached it, or another computed it)
    // A sliding window releases pages from the front once no query can see them (registered first,
    // in the step that filled them); a block whose page is gone cannot be registered, nor can later ones.
    bool held = true;
    for (int32_t s = 0; s < n_streams_; ++s) held &= kv.block_page(s, b) != kNoPage;
    if (!held) break;
    std::vector<PageId> pages(static_cast<size_t>(n_streams_));
    bool fresh = true;
    for (int32_t s = 0; s < n_streams_; ++s) {
      pages[static_cast<size_t>(s)] = kv.block_page(s, b);
      // The page must hold exactly this block's positions (a guard on the page-table offset).
      const int32_t* pos = pool_->positions(pages[static_cast<size_t>(s)]);
      fresh &= !pool_->is_cached(pages[static_cast<size_t>(s)]) && pos[0] == b * ps && pos[ps - 1] == b * ps + ps - 1;
    }
    if (!fresh) continue;  // a page of another block (cannot happen for an uncompacted prompt; be safe)
    for (PageId p : pages) {
      pool_->mark_cached(p);
      page_key_[p] = key;
    }
    if (shared_ != nullptr) {  // write-through: the block's pages are final now (full, uncompacted)
      io_src_.resize(pages.size());
      for (size_t s = 0; s < pages.size(); ++s) io_src_[s] = pool_->data(pages[s]);
      ++(shared_->publish(skey, block, io_src_) ? stats_.blocks_published : stats_.publish_dropped);
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
