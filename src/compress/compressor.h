// Per-sequence compression: the schedule (compress at budget + interval, cut back to budget), the
// policy's scoring, the budget split, and compaction through SequenceKv::compact_stream, which slides
// survivors forward in order and returns emptied tail pages to the pool in the same step.
//
// It is also the ForwardObserver that keeps what query-based policies need (the last w post-RoPE
// queries per layer) and it owns the H2O key-mass accumulator, which moves with compaction.
// Thread-safety: one compressor per sequence, used by the thread that runs that sequence.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "compress/calibration.h"
#include "compress/config.h"
#include "compress/schedule.h"
#include "kv/sequence_kv.h"
#include "model/forward.h"
#include "util/thread_pool.h"

namespace kvpack::compress {

struct CompressionStats {
  int64_t events = 0;
  int64_t evicted_slots = 0;   // summed over streams
  int64_t freed_pages = 0;
  uint64_t evicted_bytes = 0;  // K+V bytes of evicted slots
  uint64_t freed_bytes = 0;    // bytes of pages returned to the pool
  double seconds = 0;          // scoring + selection + compaction
  double score_seconds = 0;
  int64_t max_streams_slots = 0;  // largest stream length seen at a compression event
  double reclaim_efficiency() const { return evicted_bytes ? static_cast<double>(freed_bytes) / evicted_bytes : 0.0; }
  void add(const CompressionStats& o);
};

class SequenceCompressor : public ForwardObserver {
 public:
  // `stats` must be non-null for policies that need calibration (throws std::invalid_argument).
  SequenceCompressor(const CompressConfig& cfg, const ModelConfig& model, const QueryStats* stats, int32_t prompt_len,
                     ThreadPool* pool = nullptr);

  const CompressConfig& config() const { return cfg_; }
  // Call before each forward of this sequence: sizes the key-mass buffer and points the batch item at it.
  void prepare(kv::SequenceKv& kv, BatchItem& item);
  // Call after each forward; compresses when the schedule says so. `prefill_done` marks the end of the
  // prompt (compress_prefill). Returns true if it compressed.
  bool after_forward(kv::SequenceKv& kv, bool prefill_done);
  // Compresses back to the budget now.
  void compress(kv::SequenceKv& kv);
  // Tokens that can still be appended before the next scheduled event fires (>= 1). Prefill loops clip
  // their chunks to it, so a sequence never holds more than budget + interval slots per stream (plus
  // protected slots) at any point, not budget + interval + one chunk: admission can project exactly that.
  int32_t tokens_until_trigger(const kv::SequenceKv& kv) const;
  const CompressionStats& stats() const { return stats_; }
  // Pages the sequence is accounted for (naive demonstration: what a non-compacting allocator holds).
  int64_t accounted_pages(const kv::SequenceKv& kv) const { return kv.pages_held(); }
  // When this sequence compresses (the scheduler asks it for admission and prefix-cache decisions).
  const CompressionSchedule& schedule() const { return schedule_; }

  void on_query_post_rope(int32_t batch_index, int32_t layer, const float* q, int32_t n_tokens, int64_t stride) override;

 private:
  int64_t live_total(const kv::SequenceKv& kv) const;
  void score_all(const kv::SequenceKv& kv);
  void score_triattention(const kv::SequenceKv& kv);
  void score_window_policy(const kv::SequenceKv& kv);
  std::span<const float> recent_queries(int32_t layer, int32_t& w) ;

  CompressConfig cfg_;
  ModelConfig mc_;
  const QueryStats* qstats_;
  int32_t prompt_len_;
  ThreadPool* pool_;
  int32_t n_streams_;
  CompressionStats stats_;
  CompressionSchedule schedule_;
  std::vector<std::vector<float>> scores_;  // per stream
  std::vector<std::vector<int32_t>> keeps_;
  std::vector<std::vector<int32_t>> live_;  // per stream: candidate (non-hole) slot indices
  std::vector<int32_t> removed_;
  // Query window: [layer][qwin_][q_dim] ring, newest at (qhead_ - 1).
  int32_t qwin_ = 0, qcount_ = 0;
  std::vector<float> qring_;
  std::vector<float> qlinear_;
  // H2O accumulated attention mass: [stream][mass_cap_].
  std::vector<float> mass_;
  int32_t mass_cap_ = 0;
};

}  // namespace kvpack::compress
