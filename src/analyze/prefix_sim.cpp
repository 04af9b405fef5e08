#include "analyze/prefix_sim.h"

#include <list>
#include <stdexcept>
#include <unordered_map>
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

namespace kvpack::analyze {
namespace {

uint64_t block_key(uint64_t parent, std::span<const int32_t> block, uint64_t salt) {
  XXH3_state_t st;
  XXH3_64bits_reset_withSeed(&st, salt);
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

SimResult simulate_prefix_cache(std::span<const std::vector<int32_t>> prompts, std::span<const std::string> salts,
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
    const std::span<const int32_t> p(prompts[i]);
    const uint64_t salt = salts.empty() || salts[i].empty() ? 0 : XXH3_64bits(salts[i].data(), salts[i].size());
    keys.clear();
    uint64_t key = 0;
    for (size_t b = 0; (b + 1) * ps <= p.size(); ++b) keys.push_back(key = block_key(key, p.subspan(b * ps, ps), salt));
    const size_t lookup = p.empty() ? 0 : (p.size() - 1) / ps;  // leave one token to compute
    size_t hit = 0;
    while (hit < lookup && cache.touch(keys[hit])) ++hit;
    for (uint64_t k : keys) cache.insert(k);
    r.cached.push_back(static_cast<int32_t>(hit * ps));
    r.prompt_tokens += static_cast<int64_t>(p.size());
    r.cached_tokens += static_cast<int64_t>(hit * ps);
  }
  return r;
}

}  // namespace kvpack::analyze
