// One scheduling step as plain data: which sequences run, which token range of each, whose logits are
// wanted and which compress afterwards. Scheduler::schedule() makes it, ModelRunner::execute() runs
// it, Scheduler::update() consumes it (vLLM v1's SchedulerOutput). Compressions are decided here, at
// plan time, from each sequence's CompressionSchedule and the slots the step will append.
#pragma once
#include <cstdint>
#include <vector>

namespace kvpack {

struct Sequence;

struct StepPlan {
  struct Item {
    Sequence* seq = nullptr;
    int32_t begin = 0;        // first token of seq->tokens to compute
    int32_t n = 0;            // tokens to compute (a prefill chunk, or 1 for decode)
    bool logits = false;      // the chunk ends the pending tokens: the last token's logits are sampled
    int32_t logits_row = -1;  // row of the runner's logits for this item (when logits)
    bool decode = false;      // a token after the first sampled one (counted as a decode step)
    bool compress = false;    // the sequence's compression event fires after this step
  };
  std::vector<Item> items;
  int32_t n_logits = 0;
  uint64_t step = 0;
  void clear() {
    items.clear();
    n_logits = 0;
  }
};

}  // namespace kvpack
