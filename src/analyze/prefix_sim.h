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

// A prompt as the cache sees it: its length and the chain key of each full block (hash of the parent
// key and the block's tokens; the salt is mixed in by the simulation). 8 bytes per block instead of
// 4 per token: what lets the analyzer keep every scenario of a large log in memory.
struct BlockedPrompt {
  int32_t n_tokens = 0;
  std::vector<uint64_t> block_keys;
};
BlockedPrompt block_prompt(std::span<const int32_t> tokens, int32_t page_size);

struct SimResult {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  std::vector<int32_t> cached;  // per request
  double hit_rate() const { return prompt_tokens > 0 ? static_cast<double>(cached_tokens) / static_cast<double>(prompt_tokens) : 0; }
  int64_t computed_tokens() const { return prompt_tokens - cached_tokens; }  // prefill work
};

// `salts` is empty or one per prompt. The blocked prompts must have been cut with opt.page_size.
SimResult simulate_prefix_cache(std::span<const BlockedPrompt* const> prompts, std::span<const std::string> salts,
                                const SimOptions& opt);
SimResult simulate_prefix_cache(std::span<const std::vector<int32_t>> prompts, std::span<const std::string> salts,
                                const SimOptions& opt);

}  // namespace kvpack::analyze
