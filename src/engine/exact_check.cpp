#include "engine/exact_check.h"

#include <memory>
#include <span>

namespace kvpack {

bool ExactCheck::over_all_kv(Engine& engine, const kv::SequenceKv& seq, int32_t token, compress::SequenceCompressor& comp,
                             float* logits) {
  return run(engine, seq, token, &comp, logits);
}

bool ExactCheck::over_hot_kv(Engine& engine, const kv::SequenceKv& seq, int32_t token, float* logits) {
  return run(engine, seq, token, nullptr, logits);
}

bool ExactCheck::run(Engine& engine, const kv::SequenceKv& seq, int32_t token, compress::SequenceCompressor* comp, float* logits) {
  if (seq.next_pos() <= 0) return false;
  const bool in_place = engine.model().config().swa_window == 0;
  std::unique_ptr<kv::SequenceKv> fork = engine.kv().fork_sequence(seq, 0);
  if (comp != nullptr && !in_place && !comp->copy_cold_into(*fork)) return false;
  fork->truncate_tail(1);
  BatchItem item;
  item.kv = fork.get();
  item.tokens = std::span<const int32_t>(&token, 1);
  item.logits = logits;
  if (comp != nullptr && in_place) {
    if (comp->evicted() == nullptr) return false;
    attend_.bind(*comp->evicted(), *fork);
    item.extra = &attend_;
  }
  const bool ran = engine.runner().forward().run(std::span<BatchItem>(&item, 1));
  return ran && (item.extra == nullptr || attend_.complete());
}

}  // namespace kvpack
