// Per-sequence compression: an orchestration of small parts —
//   CompressionSchedule (schedule.h)   when to compress (budget + interval), admission projections
//   Scorer (scorer.h)                  the policy: one score per slot of every stream
//   BudgetSplitter (budget_split.h)    protection + per-stream budgets -> keep sets
//   QueryWindow / KeyMass              what query-based policies and H2O need, fed by the forward
//   NaiveLayout (naive_layout.h)       page accounting of the naive-eviction demonstration
// and compaction through SequenceKv::compact_stream, which slides survivors forward in order and
// returns emptied tail pages to the pool in the same step. An event is score -> select -> compact ->
// stats. Naive mode compacts too (attention is the same); only its page figures come from NaiveLayout.
//
// The compressor is also the ForwardObserver that feeds the query window.
// Thread-safety: one compressor per sequence, used by the thread that runs that sequence.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "compress/budget_split.h"
#include "compress/calibration.h"
#include "compress/config.h"
#include "compress/key_mass.h"
#include "compress/naive_layout.h"
#include "compress/query_window.h"
#include "compress/recall.h"
#include "compress/schedule.h"
#include "compress/scorer.h"
#include "kv/evicted_kv.h"
#include "kv/sequence_kv.h"
#include "model/forward.h"
#include "util/thread_pool.h"

namespace kvpack::compress {

struct CompressionStats {
  int64_t events = 0;
  int64_t evicted_slots = 0;   // summed over streams
  int64_t freed_pages = 0;     // naive mode: pages a non-compacting allocator would free (NaiveLayout)
  uint64_t evicted_bytes = 0;  // K+V bytes of evicted slots
  uint64_t freed_bytes = 0;    // bytes of pages returned to the pool (naive: that it would return)
  double seconds = 0;          // scoring + selection + compaction
  double score_seconds = 0;
  double cold_seconds = 0;     // of which: copying evicted slots to the cold tier and their digests (EvictedKv)
  int64_t max_streams_slots = 0;  // largest stream length seen at a compression event
  // Streams an event left as they were because copying their shared pages (n > 1 choices, prefix cache)
  // needed more free pages than the pool had: they stay over budget until a later event.
  int64_t deferred_streams = 0;
  RecallStats recall;             // recall checks and what they brought back (compress/recall.h)
  double reclaim_efficiency() const { return evicted_bytes ? static_cast<double>(freed_bytes) / evicted_bytes : 0.0; }
  void add(const CompressionStats& o);
  // Takes away `base`'s counts and times (RecallStats::subtract_counts); max_streams_slots stays.
  void subtract_counts(const CompressionStats& base);
};

class SequenceCompressor : public ForwardObserver {
 public:
  // Validates an enabled `cfg` (CompressConfig::validate: throws InvalidCompressConfig, e.g. when `stats`
  // is null for a policy that needs calibration). A disabled config makes every call a no-op.
  SequenceCompressor(const CompressConfig& cfg, const ModelConfig& model, const QueryStats* stats, int32_t prompt_len,
                     ThreadPool* pool = nullptr);

  const CompressConfig& config() const { return cfg_; }
  // A deep copy for a forked sequence (n > 1 choices sharing one prefill): the same schedule position,
  // query window, key mass, scorer state, recall state and figures, so each child compresses exactly as
  // a solo run of the same prompt would. The evicted sink is not copied (nullptr): the caller gives the
  // child its own (kv::EvictedKv::fork).
  std::unique_ptr<SequenceCompressor> fork() const;
  // Call before each forward of this sequence: sizes the key-mass buffer and points the batch item at it.
  void prepare(kv::SequenceKv& kv, BatchItem& item);
  // Call after each forward; compresses when the schedule says so. `prefill_done` marks the end of the
  // prompt (compress_prefill). Returns true if it compressed.
  bool after_forward(kv::SequenceKv& kv, bool prefill_done);
  // The same when the caller already asked schedule().fires() (the scheduler plans compressions with the
  // step: StepPlan::Item::compress); compresses iff compress_now.
  bool after_step(kv::SequenceKv& kv, bool compress_now);
  // Compresses back to the budget now.
  void compress(kv::SequenceKv& kv);
  // Call when the sequence is about to sample a token (its prefill is done). Runs a recall check when one
  // is due — the first call (end of prefill, scoring the last recall.prefill_rows query rows), then every
  // recall.every calls (the last recall.rows rows) — given recall is on and an evicted sink is set.
  // Returns how many of the newest tokens the caller must drop (SequenceKv::truncate_tail) and compute
  // again before sampling: their hidden states predate the keys recall brought back. 0: sample now. The
  // call after a recompute runs no check (no ping-pong).
  int32_t before_sample(kv::SequenceKv& kv);
  // The exact drift check (RecallConfig::exact), run by the caller that owns the forward pass: true once
  // after a before_sample() that ran a check and asked for no recompute (the logits about to be sampled
  // are the checked step's). Then the caller copies the evicted KV into a fork of the sequence
  // (copy_cold_into), computes the newest token over it, and reports both logit rows (record_exact_check)
  // or that it could not (record_exact_skip).
  bool take_exact_check_due();
  bool copy_cold_into(kv::SequenceKv& fork);
  // The evicted sink (nullptr: none): what the exact check attends in place (compress/cold_attend.h).
  kv::EvictedKv* evicted() const { return evicted_; }
  // Returns how many of the newest tokens the caller must drop and compute again before sampling (as
  // before_sample): when the exact guard (RecallConfig::exact_guard) flags the check and restores full KV,
  // every token since the first compression event (whose KV was computed with keys missing).
  int32_t record_exact_check(kv::SequenceKv& kv, const float* compressed_logits, const float* full_logits, int32_t n_vocab);
  void record_exact_skip();
  // Tokens that can still be appended before the next scheduled event fires (>= 1). Prefill loops clip
  // their chunks to it, so a sequence never holds more than budget + interval slots per stream (plus
  // protected slots) at any point, not budget + interval + one chunk: admission can project exactly that.
  int32_t tokens_until_trigger(const kv::SequenceKv& kv) const;
  // Whether appending n_new tokens (one slot in every stream it compresses) fires an event; `prompt_end`:
  // the step ends the prompt (compress_prefill). What the scheduler plans with.
  bool fires_after(const kv::SequenceKv& kv, int32_t n_new, bool prompt_end) const;
  const CompressionStats& stats() const { return stats_; }
  // Pages an event may have to copy before writing (copy-on-write): shared pages past the protected
  // prefix (a forked choice's prompt pages). The scheduler adds them to a compressing step's page need.
  int64_t cow_pages(const kv::SequenceKv& kv) const;
  // The first `tokens` slots of every stream hold prompt blocks registered in (or attached from) the
  // prefix cache: never evicted (see protection()).
  void set_protected_prefix(int32_t tokens) { protected_prefix_ = tokens; }
  // Evicted slots go to `sink` (kv/evicted_kv.h: the cold tier, with per-page key digests) instead of
  // away; nullptr (the default) drops them. Not owned; must outlive the compressor's use of it.
  void set_evicted_sink(kv::EvictedKv* sink) { evicted_ = sink; }
  // Whether a drift guard may send this request back to full KV (the scheduler's call: false when the
  // pool could never hold the request's whole KV, where a fallback would end in an error once the
  // uncompressed request outgrew the pool). Refused, a flagged request goes on compressed, counted.
  void set_fallback_allowed(bool allowed) { fallback_allowed_ = allowed; }
  // When this sequence compresses (the scheduler asks it for admission and prefix-cache decisions).
  const CompressionSchedule& schedule() const { return schedule_; }
  // Pages this sequence's KV accounts for: kv.pages_held(), or in naive mode the pages a
  // non-compacting allocator would hold (the virtual hole layout, NaiveLayout).
  int64_t accounted_pages(const kv::SequenceKv& kv) const;
  // The peak of accounted_pages over the after_forward calls so far (each measured right after a
  // forward, before any compression) and now: in naive mode the virtual pages peak even inside loops
  // that measure only real pages (Engine::prefill); kv.pages_held() otherwise.
  int64_t peak_accounted_pages(const kv::SequenceKv& kv) const;

  void on_query_post_rope(int32_t batch_index, int32_t layer, const float* q, int32_t n_tokens, int64_t stride) override;

 private:
  SequenceCompressor(const SequenceCompressor& o);  // fork()
  SequenceCompressor& operator=(const SequenceCompressor&) = delete;
  int64_t live_total(const kv::SequenceKv& kv) const;
  // Protection of stream s: the config's, plus leading shared (prefix-cache) pages treated as sinks.
  Protection protection(const kv::SequenceKv& kv, int32_t s) const;
  // The largest n <= want such that every stream's last n slots hold the newest n positions, in order:
  // the tokens that can be dropped (SequenceKv::truncate_tail) and computed again.
  int32_t droppable_tail(const kv::SequenceKv& kv, int32_t want) const;

  CompressConfig cfg_;
  ModelConfig mc_;
  const QueryStats* qstats_;
  int32_t prompt_len_;
  int32_t protected_prefix_ = 0;
  ThreadPool* pool_;
  kv::EvictedKv* evicted_ = nullptr;
  int32_t n_streams_;
  // Streams this compressor leaves alone (sliding-window layers unless cfg.window_layers; empty when
  // there are none) and how many it compresses: the schedule counts only those.
  std::vector<uint8_t> frozen_;
  int32_t n_compressed_streams_;
  bool frozen(int32_t s) const { return !frozen_.empty() && frozen_[static_cast<size_t>(s)] != 0; }
  CompressionStats stats_;
  CompressionSchedule schedule_;
  std::unique_ptr<Scorer> scorer_;  // null when disabled
  ScorerNeeds needs_;
  BudgetSplitter splitter_;
  QueryWindow queries_;
  KeyMass mass_;
  NaiveLayout naive_;  // used only when cfg_.naive
  Recall recall_;
  int64_t samples_ = 0;  // before_sample calls so far (recomputes excluded)
  bool recomputing_ = false;
  bool exact_due_ = false;  // a check ran: the exact drift check is due on the logits it leads to
  int32_t first_event_pos_ = -1;  // next_pos at the first compression event (-1: none yet)
  // The latest one-token forward's attention log-sum-exp per (layer, head), and whether the hot set is still
  // the one it was computed over (no event or exchange since).
  std::vector<float> attn_lse_;
  bool attn_lse_fresh_ = false;
  bool fallen_back_ = false;  // the drift guard restored full KV: no more compression
  bool fallback_allowed_ = true;
  bool fallback_refused_ = false;  // a guard flagged this request but the pool cannot hold its whole KV
  // The guard's decision: restore every evicted token (full KV from here on) or, when that is not allowed,
  // count the refusal once and go on compressed. Returns the slots restored.
  int64_t fall_back(kv::SequenceKv& kv);
  std::vector<Protection> prot_scratch_;
  int64_t naive_peak_pages_ = 0;
  // Per stream: the sorted positions the policy pinned at the last event (Protection::pinned); reused.
  std::vector<std::vector<int32_t>> pinned_;
  // Per-event scratch, kept between events to avoid reallocation.
  std::vector<std::vector<float>> scores_;
  std::vector<std::vector<int32_t>> keeps_, positions_;
  std::vector<StreamCandidates> candidates_;
  std::vector<int32_t> batch_streams_, batch_slots_;  // compaction batch (compress()): streams, their slots before
  std::vector<std::span<const int32_t>> batch_keeps_;
  std::vector<int64_t> batch_freed_;
};

}  // namespace kvpack::compress
