// The model runner: executes a StepPlan with one batched forward pass (every token of every scheduled
// sequence through the weights together, attention per sequence over its pages) and returns the logits
// rows the plan asked for. It also points each compressed sequence's compressor at the pass (H2O key
// mass, query windows), so compression sees what attention saw.
// Low-level entry points for tools that drive the forward pass directly (calibration, KL evaluation,
// benchmarks) are forward() and prefill().
// Thread-safety: one thread at a time (it owns the forward scratch and the logits buffer).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "compress/compressor.h"
#include "engine/step_plan.h"
#include "model/forward.h"
#include "model/model.h"
#include "util/thread_pool.h"

namespace kvpack {

class ModelRunner {
 public:
  ModelRunner(const Model& model, ThreadPool& threads, int32_t max_batch_tokens);

  // Runs the plan; returns plan.n_logits rows of n_vocab floats (valid until the next call). Throws
  // std::runtime_error when the pool cannot hold the step's slots (the scheduler checks first).
  std::span<float> execute(const StepPlan& plan);

  // Prefills `tokens` into kv in chunks of max_batch_tokens (a compressed sequence's chunks end where its
  // next event fires, and it compresses between chunks); the last token's logits go to `logits` (may be
  // nullptr). Returns the peak pages held. Throws std::runtime_error if the pool is exhausted.
  int64_t prefill(kv::SequenceKv& kv, std::span<const int32_t> tokens, float* logits,
                  compress::SequenceCompressor* comp = nullptr);

  // One decode step of one sequence (benchmarks): `token` in, logits of the next position into `logits`
  // (n_vocab floats), compression after it when the schedule says so; returns the greedy next token.
  int32_t decode_greedy(kv::SequenceKv& kv, int32_t token, float* logits, compress::SequenceCompressor* comp = nullptr);

  Forward& forward() { return forward_; }
  int32_t max_batch_tokens() const { return forward_.max_batch_tokens(); }
  ThreadPool& threads() { return *threads_; }

 private:
  // Routes each batch item's query taps to its sequence's compressor.
  struct ObserverMux : ForwardObserver {
    std::vector<ForwardObserver*> obs;
    void on_query_pre_rope(int32_t b, int32_t l, const float* q, int32_t n, int64_t st) override;
    void on_query_post_rope(int32_t b, int32_t l, const float* q, int32_t n, int64_t st) override;
  };

  const Model* model_;
  ThreadPool* threads_;
  Forward forward_;
  std::vector<BatchItem> items_;
  std::vector<float> logits_;
  ObserverMux mux_;
};

}  // namespace kvpack
