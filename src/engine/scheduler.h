// Continuous batching: requests join and leave at every step; one forward pass per step serves every
// running sequence (decodes first, then prefill chunks up to the step's token budget, so a long prompt
// never stalls decoding). One step is three parts (vLLM v1's shape):
//   schedule() -> StepPlan   intake, admission, the batch and its chunk sizes, room for its pages
//   ModelRunner::execute()   the batched forward pass (engine/model_runner.h)
//   update(plan, logits)     prefix-cache registration, compression, sampling, stopping, streaming
// Every way in — the CLI, the C++ Session API, eval and the HTTP server — drives this one loop; the
// synchronous ones through Engine::generate, a one-request scheduler.
//
// KV memory is the KV manager's (kv/kv_manager.h); the scheduler asks it, never the pool:
//   * admission is by pages and compression-aware: a compressed sequence is projected at what its
//     compression schedule allows (budget + interval, + a page per stream), a full one at prompt +
//     max_tokens ("reserve"), or admission only keeps a free-page watermark and relies on preemption
//     ("watermark");
//   * cached-free prefix pages count as free (they are reused lazily); when a step still cannot get its
//     pages, running sequences are preempted (victim: lru = least recently (re)admitted, lfu = fewest
//     tokens computed, priority = lowest priority then newest). With a cold tier the victim's pages are
//     swapped out and come back bit-identical (with its compressor, sampler and text state untouched), so
//     its output does not depend on load; without one, or when the tier cannot take them, it recomputes
//     its KV from its text (counted);
//   * the prefix cache reuses full blocks of earlier prompts; shared pages are protected from
//     compression, and a compressed sequence registers only what its schedule allows.
// Thread-safety: submit / cancel / metrics may be called from any thread; step() and the background
// loop run on one thread (the engine and KV manager are single-threaded).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "compress/compressor.h"
#include "engine/engine.h"
#include "engine/exact_check.h"
#include "engine/request.h"
#include "engine/sequence.h"
#include "engine/step_plan.h"
#include "kv/prefix_cache.h"

namespace kvpack {

enum class PreemptPolicy { LRU, LFU, Priority };
PreemptPolicy parse_preempt(const std::string& s);  // "lru" | "lfu" | "priority"
const char* preempt_name(PreemptPolicy p);

struct SchedulerOptions {
  int32_t max_running = 16;        // sequences per batch
  int32_t step_tokens = 256;       // tokens per forward pass (<= engine max_batch_tokens)
  PreemptPolicy preempt = PreemptPolicy::LRU;
  bool prefix_cache = true;
  bool swap_preemption = true;     // with a cold tier: preempted sequences swap out instead of recomputing
  bool reserve_admission = true;   // false: watermark admission
  double watermark = 0.05;         // fraction of pages kept free at admission (watermark mode)
  int32_t max_waiting = 256;       // queue limit; submit() refuses beyond it (server: 429)
};

struct Histogram {
  std::vector<double> bounds;       // upper bounds (seconds)
  std::vector<uint64_t> counts;     // per bucket (+ one for +Inf)
  double sum = 0;
  uint64_t count = 0;
  explicit Histogram(std::vector<double> b = {}) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
  void observe(double v);
};

struct SchedulerMetrics {
  int64_t pages_total = 0, pages_used = 0, pages_free = 0, pages_cached_free = 0;
  uint64_t resident_kv_bytes = 0, page_bytes = 0;
  int64_t running = 0, waiting = 0;
  int64_t requests_finished = 0, requests_cancelled = 0, requests_failed = 0;
  int64_t finished_stop = 0, finished_length = 0;  // requests_finished split as vLLM's finished_reason (eos counts as stop)
  int64_t prompt_tokens = 0, generated_tokens = 0, steps = 0;
  int64_t preemptions_lru = 0, preemptions_lfu = 0, preemptions_priority = 0;
  int64_t peak_running = 0;
  compress::CompressionStats compression;  // totals over all sequences (finished + running)
  // The same totals by the policy that produced them (policy name -> stats; only policies that ran).
  std::map<std::string, compress::CompressionStats> compression_by_policy;
  kv::PrefixCacheStats prefix;
  kv::ColdUsage cold;
  kv::SharedTierStats shared;      // the shared tier's counters (all zero without one)
  bool has_shared_tier = false;
  kv::EvictedStats evicted;        // evicted slots kept in the cold tier: totals; digest_bytes = held now
  int64_t recomputes = 0;          // preemptions (or lost swaps) that recomputed from text
  // n > 1: choices forked from a prefilled prompt, and the full pages they took by reference instead of
  // allocating (kvpack:kv_fork_pages_saved_total).
  int64_t forks = 0, fork_pages_saved = 0;
  // Sliding-window layers: pages released as they fell out of the window (kvpack_kv_window_pages_freed_total).
  int64_t window_pages_freed = 0;
  Histogram ttft{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram itl{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
  Histogram swap_out{{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}};  // seconds per swap
  Histogram swap_in{{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}};
  // Per finished request (not cancelled / failed), as vLLM's request-level histograms.
  Histogram e2e{{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300}};      // submit -> finish
  Histogram queue{{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};  // submit -> first admission
  Histogram prefill{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};     // admission -> first token
  Histogram decode{{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300}};   // first token -> finish
  Histogram request_prompt_tokens{{16, 64, 256, 1024, 4096, 16384, 65536, 262144}};
  Histogram request_generation_tokens{{1, 8, 32, 128, 512, 2048, 8192, 32768}};
};

// A picture of the KV cache for the live page map (server: GET /kv/state). The scheduler thread builds
// it at the end of a step only when one was asked for since the last one (kv_map()), so steps nobody
// watches pay nothing; a watcher polling every half second sees it at most one step old.
struct KvMapSequence {
  uint64_t id = 0;
  std::string state;            // "prefill" | "decode" (running), "waiting", "swapped" (preempted to the tier)
  int32_t prompt_tokens = 0, generated = 0, computed = 0;
  std::string policy;
  int32_t budget = 0;
  // Per (layer, KV head) stream, layer-major (layer * n_kv_heads + head); empty when not running.
  std::vector<int32_t> slots, pages, shared_pages;  // shared: prefix-cache or copy-on-write pages
  int64_t compactions = 0, evicted_tokens = 0, recalled_pages = 0, cold_evicted_pages = 0, preemptions = 0;
  double drift = -1;            // the latest recall check's largest drift (-1: none)
};

struct KvMapSnapshot {
  uint64_t step = 0;            // scheduler step it was taken at
  double t = 0;                 // steady-clock seconds (for rates and charts)
  int32_t n_layers = 0, n_kv_heads = 0, page_size = 0;
  int64_t pages_total = 0, pages_active = 0, pages_cached = 0, pages_free = 0;
  uint64_t page_bytes = 0, resident_bytes = 0;
  uint64_t cold_cap_bytes = 0, cold_used_bytes = 0, cold_records = 0;
  std::vector<KvMapSequence> sequences;  // running first (batch order), then waiting / swapped
};

class Scheduler {
 public:
  Scheduler(Engine& engine, const SchedulerOptions& opt);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request; returns its id, or 0 when the queue is full. Throws std::invalid_argument for
  // a request that can never run (empty prompt, prompt beyond the context, token ids out of range,
  // bad KV config, n outside [1, max_running]).
  // n > 1 (Request::n): choice 0 runs alone until its prompt is prefilled; then choices 1..n-1 fork from
  // it (fork()): each takes every page by reference (copy-on-write: kv/sequence_kv.h share_from), a copy
  // of its compressor state (and of its evicted cold records) and its own sampler, and samples its first
  // token from the same logits. From then on every choice is an ordinary running sequence: preempted,
  // swapped (shared pages stay hot, referenced by the swap handle), recomputed or compressed on its own,
  // so each choice's output is what a solo request with its seed gives.
  uint64_t submit(Request req, EventSink sink);
  // Cancels a queued or running request (e.g. the client went away); its pages are freed at the
  // start of the next step and its sink gets Finished(Cancelled). Unknown ids are ignored.
  void cancel(uint64_t id);

  // One step on the calling thread: schedule → execute → update. Returns false when there was nothing
  // to run.
  bool step();
  // The step's parts, for drivers that interleave other work (step() is all most callers need).
  // schedule() returns false when nothing runs this step (the plan is then empty).
  bool schedule(StepPlan& plan);
  void update(const StepPlan& plan, std::span<float> logits);

  // Background loop on its own thread.
  void start();
  void stop();

  SchedulerMetrics metrics() const;
  // The latest KV map, and a request for a fresh one at the end of the next step (see KvMapSnapshot).
  KvMapSnapshot kv_map();
  // Page accounting of every running sequence against the pool and the prefix cache ("" = consistent).
  std::string check_invariants() const;

 private:
  void intake();
  void admit();
  Sequence* pick_victim() const;
  void preempt(Sequence* s);
  void finish(Sequence* s, FinishReason reason, const std::string& error = {});
  void remove_running(Sequence* s);
  // Pages `s` will hold at most. windowed = false: as if sliding-window layers kept every page (the
  // length page tables are sized for, so the decode path never grows them); uncompressed = true: as if it
  // did not compress (what a drift guard's fallback would need).
  int64_t projected_pages(const Sequence& s, bool windowed = true, bool uncompressed = false) const;
  void allow_fallback_if_full_kv_fits(Sequence& s) const;
  // Sliding-window models: releases the pages of `s`'s local layers that no later query can see.
  void release_out_of_window(Sequence& s);
  void emit_token(Sequence& s, int32_t token);
  // After `s`'s logits row `lg` is known at the end of its prefill: creates choices 1..n-1 (see submit),
  // each sampling from its own copy of the row, before `s` samples (the sampler rewrites lg).
  void fork(Sequence& s, const float* lg);
  // Samples, emits and decides the ending of one sequence from its logits row (rewritten in place).
  void sample_next(Sequence& s, float* lg);
  // The exact drift check of compressed `s` (compress::RecallConfig::exact): its newest token computed
  // again over a fork of its KV with every evicted page copied back in, compared with `lg` (the step's
  // row; `one_token_step` false: recomputed alone on a plain fork, like the full row). The forks' pages
  // come from the shared pool and go back at once; when the pool cannot hold them the check is counted
  // as skipped. Changes nothing the request samples, unless the exact guard restores full KV: then it
  // returns the newest tokens to drop and compute again before sampling (SequenceCompressor::
  // record_exact_check).
  int32_t exact_drift_check(Sequence& s, const float* lg, bool one_token_step);
  // Pages admission reserves for `s`: its own projection, for a pending fork its n - 1 future choices
  // too (the prompt's full pages counted once), for a forked choice without the pages it shares.
  int64_t reserved_pages(const Sequence& s) const;
  void publish_metrics();
  void build_kv_map(KvMapSnapshot& out) const;
  void loop();

  Engine* engine_;
  kv::KvManager* kv_;
  SchedulerOptions opt_;
  std::vector<float> exact_logits_;  // exact_drift_check's logits row (scheduler thread only)
  ExactCheck exact_;                 // exact_drift_check's second opinion (scheduler thread only)

  // Shared with other threads (guarded by mu_).
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> incoming_;
  std::vector<uint64_t> cancels_;
  uint64_t next_id_ = 1;
  SchedulerMetrics metrics_;  // published snapshot fields updated at the end of each step
  KvMapSnapshot kv_map_;      // built when want_kv_map_ was set
  std::atomic<bool> want_kv_map_{true};

  // Scheduler thread only.
  std::vector<std::unique_ptr<Sequence>> waiting_;  // arrival order (preempted ones keep their place)
  std::vector<std::unique_ptr<Sequence>> running_;
  uint64_t step_no_ = 0;
  compress::CompressionStats finished_compression_;
  std::map<std::string, compress::CompressionStats> finished_by_policy_;
  kv::EvictedStats finished_evicted_;  // digest_bytes stays 0: finished sequences hold none
  StepPlan plan_;
  std::vector<Sequence*> order_, done_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
};

}  // namespace kvpack
