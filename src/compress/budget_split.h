// The budget split: how an event's per-stream budgets are chosen and applied to score vectors.
//   uniform  every stream keeps `budget` slots
//   pyramid  PyramidKV's per-layer budgets (selection.h pyramid_budgets), same for a layer's heads
//   ada      Ada-KV: a layer's KV heads pool n_kv_heads * budget slots (selection.h select_ada)
// Thread-safety: const after construction; select() is a pure function of its arguments.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "compress/config.h"
#include "compress/selection.h"
#include "util/thread_pool.h"

namespace kvpack::compress {

// One stream's candidates at an event.
struct StreamCandidates {
  std::span<const float> scores;       // one per slot (higher = keep)
  Protection prot;                      // sinks, window, prompt
  std::span<const int32_t> positions;  // per slot; may be empty when prot.prompt_end == 0
};

class BudgetSplitter {
 public:
  BudgetSplitter(const CompressConfig& cfg, int32_t n_layer, int32_t n_head_kv);
  // keeps[s] (strictly increasing slot indices) for every stream s = layer * n_head_kv + kv_head. With a
  // pool, uniform and pyramid select the streams in parallel (each writes its own keeps[s]; the result
  // does not depend on the pool).
  void select(std::span<const StreamCandidates> streams, std::vector<std::vector<int32_t>>& keeps,
              ThreadPool* pool = nullptr) const;

 private:
  BudgetSplit split_;
  int32_t budget_;
  int32_t n_layer_, n_head_kv_;
  std::vector<int32_t> layer_budgets_;  // uniform / pyramid
};

}  // namespace kvpack::compress
