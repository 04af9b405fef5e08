// A prefix cache simulated over a request stream, with the engine's rules (kv/prefix_cache.h): a block
// is `page_size` tokens keyed by hash(parent key, the block's tokens, cache salt); a request reuses its
// longest run of cached whole blocks from the start, always leaving at least one prompt token to
// compute; afterwards the full blocks of its prompt are cached. Requests run one after another in log
// order (no concurrency), and only prompt blocks are registered (the log has no generated tokens).
// With a capacity, the least recently used blocks are dropped first, as the pool reuses cached-free
// pages least recently freed first.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kvpack::analyze {

struct SimOptions {
  int32_t page_size = 16;
  int64_t capacity_tokens = 0;  // 0: unbounded
};

struct SimResult {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  std::vector<int32_t> cached;  // per request
  double hit_rate() const { return prompt_tokens > 0 ? static_cast<double>(cached_tokens) / static_cast<double>(prompt_tokens) : 0; }
  int64_t computed_tokens() const { return prompt_tokens - cached_tokens; }  // prefill work
};

// `salts` is empty or one per prompt.
SimResult simulate_prefix_cache(std::span<const std::vector<int32_t>> prompts, std::span<const std::string> salts,
                                const SimOptions& opt);

}  // namespace kvpack::analyze
