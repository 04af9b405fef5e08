#include "analyze/prefix_sim.h"

#include <list>
#include <stdexcept>
#include <unordered_map>
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

namespace kvpack::analyze {
namespace {

uint64_t block_key(uint64_t parent, std::span<const int32_t> block) {
  XXH3_state_t st;
  XXH3_INITSTATE(&st);  // reset_withSeed reads the old seed: stack garbage equal to it skips the secret
  XXH3_64bits_reset(&st);
  XXH3_64bits_update(&st, &parent, sizeof parent);
  XXH3_64bits_update(&st, block.data(), block.size_bytes());
  return XXH3_64bits_digest(&st);
}

// Cached blocks in least-recently-used order (front: most recent).
class BlockLru {
 public:
  explicit BlockLru(int64_t capacity_blocks) : capacity_(capacity_blocks) {}
  bool touch(uint64_t key) {
    auto it = where_.find(key);
    if (it == where_.end()) return false;
    order_.splice(order_.begin(), order_, it->second);
    return true;
  }
  void insert(uint64_t key) {
    if (touch(key)) return;
    order_.push_front(key);
    where_[key] = order_.begin();
    while (capacity_ > 0 && static_cast<int64_t>(order_.size()) > capacity_) {
      where_.erase(order_.back());
      order_.pop_back();
    }
  }

 private:
  int64_t capacity_;
  std::list<uint64_t> order_;
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> where_;
};

}  // namespace

BlockedPrompt block_prompt(std::span<const int32_t> p, int32_t page_size) {
  if (page_size < 1) throw std::invalid_argument("the page size must be at least 1");
  const size_t ps = static_cast<size_t>(page_size);
  BlockedPrompt b;
  b.n_tokens = static_cast<int32_t>(p.size());
  uint64_t key = 0;
  for (size_t i = 0; (i + 1) * ps <= p.size(); ++i) b.block_keys.push_back(key = block_key(key, p.subspan(i * ps, ps)));
  return b;
}

SimResult simulate_prefix_cache(std::span<const BlockedPrompt* const> prompts, std::span<const std::string> salts,
                                const SimOptions& opt) {
  if (opt.page_size < 1) throw std::invalid_argument("the page size must be at least 1");
  if (!salts.empty() && salts.size() != prompts.size()) throw std::invalid_argument("one salt per prompt, or none");
  const size_t ps = static_cast<size_t>(opt.page_size);
  // A capacity below one block still caches one block: a bounded cache is never a disabled one.
  BlockLru cache(opt.capacity_tokens > 0 ? std::max<int64_t>(1, opt.capacity_tokens / opt.page_size) : 0);
  SimResult r;
  r.cached.reserve(prompts.size());
  std::vector<uint64_t> keys;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const BlockedPrompt& p = *prompts[i];
    // The salt names a separate chain: every key of a salted prompt changes (the engine seeds its hash with it).
    const uint64_t salt = salts.empty() || salts[i].empty() ? 0 : XXH3_64bits(salts[i].data(), salts[i].size()) | 1;
    keys.clear();
    for (uint64_t k : p.block_keys) keys.push_back(salt ? XXH3_64bits_withSeed(&k, sizeof k, salt) : k);
    const size_t lookup = p.n_tokens == 0 ? 0 : std::min(keys.size(), static_cast<size_t>(p.n_tokens - 1) / ps);  // leave one token to compute
    size_t hit = 0;
    while (hit < lookup && cache.touch(keys[hit])) ++hit;
    for (uint64_t k : keys) cache.insert(k);
    r.cached.push_back(static_cast<int32_t>(hit * ps));
    r.prompt_tokens += p.n_tokens;
    r.cached_tokens += static_cast<int64_t>(hit * ps);
  }
  return r;
}

SimResult simulate_prefix_cache(std::span<const std::vector<int32_t>> prompts, std::span<const std::string> salts,
                                const SimOptions& opt) {
  std::vector<BlockedPrompt> blocked;
  blocked.reserve(prompts.size());
  for (const auto& p : prompts) blocked.push_back(block_prompt(p, opt.page_size));
  std::vector<const BlockedPrompt*> ptrs;
  for (const auto& b : blocked) ptrs.push_back(&b);
  return simulate_prefix_cache(ptrs, salts, opt);
}

}  // namespace kvpack::analyze
