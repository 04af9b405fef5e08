// From scores to keep sets: protection, budgets, top-k. A keep set is a strictly increasing list of
// slot indices; compaction keeps survivors in that (original) order.
// Thread-safety: pure functions.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace kvpack::compress {

struct Protection {
  int32_t sinks = 0;   // slots [0, sinks)
  int32_t window = 0;  // slots [n - window, n)
  // Slots whose original position is below this are protected (protect-prompt); positions are passed
  // to select_keep when it is non-zero.
  int32_t prompt_end = 0;
  // Positions (sorted) that recall's exchanges displace only for a page whose share reaches
  // RecallConfig::pin_override_share: the slots the policy pinned at its last event (Scorer::pin_score).
  // Compression itself ignores it.
  std::span<const int32_t> pinned;
};

// Keeps every protected slot plus the best-scored others until `budget` slots are kept (more if the
// protected slots alone exceed it). Ties prefer the more recent slot. `positions` may be empty when
// prompt_end == 0.
void select_keep(std::span<const float> scores, int32_t n, int32_t budget, const Protection& prot,
                 std::span<const int32_t> positions, std::vector<int32_t>& keep);

// PyramidKV's per-layer budgets (research/policies.md §1.6): linear from high (first layer) to low,
// mean equal to `budget`; uniform when the schedule does not fit `n` slots.
std::vector<int32_t> pyramid_budgets(int32_t budget, int32_t n_layers, int32_t n, int32_t window);

// Ada-KV: one layer's KV heads share n_heads * budget slots. Each head first keeps its protected slots
// and its own top max(1, alpha * budget); the rest goes to the globally best remaining scores. Head h
// has scores[h].size() candidates (heads may differ after earlier events), its own protection and
// positions (positions[h] may be empty when prompt protection is off).
void select_ada(std::span<const std::span<const float>> scores, int32_t budget, std::span<const Protection> prot,
                std::span<const std::span<const int32_t>> positions, float alpha, std::vector<std::vector<int32_t>>& keeps);

// z-normalisation in place (population std, floored at 1e-6), as TriAttention does per query head.
void z_normalize(std::span<float> x);

}  // namespace kvpack::compress
