// The exact drift check's second opinion (compress::RecallConfig::exact): the newest token of a sequence
// computed once more over every KV the request has — its hot set and the pages compression evicted to
// the cold tier — so that its next-token distribution can be compared with the compressed one. Used by
// the scheduler (engine/scheduler.cpp, every checked step) and by `kvpack bench kv` (its cost at depth).
//
// The step runs on a fork of the sequence (pages shared until written: only the newest token's page of
// each stream is copied) that goes back to the pool at once. The evicted pages are read one layer at a
// time and attended where they lie (compress/cold_attend.h); a model with sliding-window layers, whose
// window must mask cold keys by position, has them copied into the fork instead (a whole context's pages
// for the length of the step). Cost: one decode step over the whole context plus reading every cold page
// once (docs/quality.md §4f).
// Thread-safety: one user at a time (it owns the layer buffer); the engine's forward is not re-entrant.
#pragma once
#include <cstdint>

#include "compress/cold_attend.h"
#include "compress/compressor.h"
#include "engine/engine.h"

namespace kvpack {

class ExactCheck {
 public:
  // Logits (n_vocab floats) of `token` at seq's newest position over every KV. False when it cannot be
  // computed now (the pool has no room for the fork's newest token, or a cold page is lost).
  bool over_all_kv(Engine& engine, const kv::SequenceKv& seq, int32_t token, compress::SequenceCompressor& comp, float* logits);
  // The same over the hot set only, recomputed the same way (for a token that came out of a multi-token
  // step, whose kernels round differently from a one-token step's).
  bool over_hot_kv(Engine& engine, const kv::SequenceKv& seq, int32_t token, float* logits);
  // Seconds the last over_all_kv spent reading cold pages from the tier (0 on the copy path).
  double last_read_seconds() const { return attend_.read_seconds(); }

 private:
  bool run(Engine& engine, const kv::SequenceKv& seq, int32_t token, compress::SequenceCompressor* comp, float* logits);
  compress::ColdAttend attend_;
};

}  // namespace kvpack
