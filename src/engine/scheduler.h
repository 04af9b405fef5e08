// Continuous batching: requests join and leave at every step; one forward pass per step serves every
// running sequence (decodes first, then prefill chunks up to the step's token budget, so a long prompt
// never stalls decoding). KV memory is managed in pages:
//   * admission is by pages and compression-aware: a compressed sequence is projected at
//     budget + interval (+ a page per stream), a full one at prompt + max_tokens ("reserve"), or
//     admission only keeps a free-page watermark and relies on preemption ("watermark");
//   * when a step cannot get its pages, the prefix cache gives back LRU blocks, then running
//     sequences are preempted by recompute (victim: lru = least recently (re)admitted, lfu = fewest
//     tokens computed, priority = lowest priority then newest); a preempted request keeps its
//     generated tokens and later recomputes its KV from its text, so its stream continues seamlessly;
//   * the prefix cache (kv/prefix_cache.h) reuses full blocks of earlier prompts; shared pages are
//     protected from compression, and a compressed sequence registers nothing after its first
//     compaction.
// Thread-safety: submit / cancel / metrics may be called from any thread; step() and the background
// loop run on one thread (the engine and pool are single-threaded).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "compress/compressor.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/text_stream.h"
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
  bool reserve_admission = true;   // false: watermark admission
  double watermark = 0.05;         // fraction of pages kept free at admission (watermark mode)
  int32_t max_waiting = 256;       // queue limit; submit() refuses beyond it (server: 429)
  uint64_t model_salt = 0;
};

struct RequestSpec {
  std::vector<int32_t> prompt;
  int32_t max_tokens = 128;
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  compress::CompressConfig kv;
  int32_t priority = 0;   // higher = more important (priority preemption)
  uint64_t cache_salt = 0;
};

struct RequestEvent {
  enum class Kind { Text, Finished } kind = Kind::Text;
  std::string text;           // Text: newly printable text
  std::vector<int32_t> tokens;  // Text: token ids produced with it
  std::string finish_reason;  // Finished: "stop", "length", "eos", "cancelled", "error: ..."
  int32_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0, preemptions = 0;
};
// Called on the scheduler thread; must be quick and must not call back into the scheduler's step().
using EventSink = std::function<void(const RequestEvent&)>;

struct Histogram {
  std::vector<double> bounds;       // upper bounds (seconds)
  std::vector<uint64_t> counts;     // per bucket (+ one for +Inf)
  double sum = 0;
  uint64_t count = 0;
  explicit Histogram(std::vector<double> b = {}) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
  void observe(double v);
};

struct SchedulerMetrics {
  int64_t pages_total = 0, pages_used = 0, pages_free = 0;
  uint64_t resident_kv_bytes = 0, page_bytes = 0;
  int64_t running = 0, waiting = 0;
  int64_t requests_finished = 0, requests_cancelled = 0, requests_failed = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0, steps = 0;
  int64_t preemptions_lru = 0, preemptions_lfu = 0, preemptions_priority = 0;
  int64_t peak_running = 0;
  compress::CompressionStats compression;  // totals over all sequences (finished + running)
  kv::PrefixCacheStats prefix;
  Histogram ttft{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram itl{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
};

class Scheduler {
 public:
  Scheduler(Engine& engine, const SchedulerOptions& opt);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request; returns its id, or 0 when the queue is full. Throws std::invalid_argument for
  // a request that can never run (empty prompt, prompt + 1 beyond the context, bad KV config).
  uint64_t submit(RequestSpec spec, EventSink sink);
  // Cancels a queued or running request (e.g. the client went away); its pages are freed at the
  // start of the next step and its sink gets Finished("cancelled"). Unknown ids are ignored.
  void cancel(uint64_t id);

  // Runs one scheduling step on the calling thread; returns false when there was nothing to do.
  bool step();
  // Background loop on its own thread.
  void start();
  void stop();

  SchedulerMetrics metrics() const;
  // Page-table spans of every running sequence and of the prefix cache (invariant checks).
  std::string check_invariants() const;

 private:
  struct Seq;
  void intake();
  void admit();
  Seq* pick_victim() const;
  void preempt(Seq* s, const char* why);
  void finish(Seq* s, const std::string& reason);
  int64_t projected_pages(const Seq& s) const;
  void emit_tokens(Seq& s, int32_t token);
  void publish_metrics();
  void loop();

  Engine* engine_;
  SchedulerOptions opt_;
  int32_t n_streams_;
  std::unique_ptr<kv::PrefixCache> cache_;

  // Shared with other threads (guarded by mu_).
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Seq>> incoming_;
  std::vector<uint64_t> cancels_;
  uint64_t next_id_ = 1;
  SchedulerMetrics metrics_;  // published snapshot fields updated at the end of each step

  // Scheduler thread only.
  std::vector<std::unique_ptr<Seq>> waiting_;  // arrival order (preempted ones keep their place)
  std::vector<std::unique_ptr<Seq>> running_;
  uint64_t step_no_ = 0;
  compress::CompressionStats finished_compression_;
  std::vector<float> logits_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
};

}  // namespace kvpack
