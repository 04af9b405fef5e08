// The engine: a model with its KV manager (page pool + prefix cache), its model runner (forward pass
// and thread pool) and the TriAttention calibration shared by requests. Requests run through a
// Scheduler (engine/scheduler.h); generate() is the synchronous way in — a one-request scheduler driven
// to completion on the calling thread, so the CLI, the Session API and eval run the same loop as the
// server.
// Thread-safety: an Engine is driven by one thread at a time (one scheduler at a time).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "compress/calibration.h"
#include "compress/compressor.h"
#include "compress/config.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "kv/kv_manager.h"
#include "model/model.h"
#include "util/thread_pool.h"

namespace kvpack {

struct EngineOptions {
  int32_t threads = 2;
  int32_t page_size = 16;
  DType kv_type = DType::F32;
  int64_t kv_pages = 0;  // 0: enough for `contexts` sequences of the full context (allocated lazily anyway)
  // With kv_pages 0: full contexts the pool can hold. 2 when the exact drift check is on
  // (compress::RecallConfig::exact): its scratch copy holds the request's whole KV beside the hot set.
  int32_t contexts = 1;
  int32_t max_batch_tokens = 256;  // prefill chunk / batch size per forward call
  // Cold KV tier (kv/cold_tier.h): "" = none, "host:BYTES" or "dir:PATH:BYTES". Swap preemption and
  // prefix-cache spill use it.
  std::string kv_cold;
  // With a cold tier: compression's evicted slots go to it (kv/evicted_kv.h) instead of away.
  bool kv_cold_evicted = true;
  // Shared KV tier for prefix blocks (kv/shared_tier.h): "" = none, or redis://HOST:PORT[?options].
  std::string kv_shared;
  // Sliding-window models (gemma3): local layers release pages as they fall out of the window
  // (Scheduler::release_out_of_window). false keeps them (a measurement baseline; outputs are the same).
  bool window_free = true;
  // The page pool keeps each stream's pages in runs (kv/page_pool.h "Page runs"); false hands out pages
  // LIFO one at a time, as before (a measurement baseline; outputs are the same).
  bool page_runs = true;
};

// What generate() returns: the tokens and text, how it ended, and the request's figures.
struct GenerateResult {
  std::vector<int32_t> tokens;  // generated token ids
  std::string text;
  FinishReason finish = FinishReason::Length;
  int32_t prompt_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  int32_t decode_steps = 0;  // forward passes during decode (tokens/s = decode_steps / decode_seconds)
  int64_t kv_pages_in_use = 0;       // pages held by the sequence at the end
  size_t resident_kv_bytes = 0;      // those pages' bytes
  size_t peak_resident_kv_bytes = 0;
  int64_t window_pages_freed = 0;    // sliding-window layers: pages returned as they left the window
  size_t pool_reserved_bytes = 0;    // memory the pool actually obtained from the system
  compress::CompressionStats compression;
  kv::EvictedStats evicted;          // evicted slots kept in the cold tier (with --kv-cold)
};

class Engine {
 public:
  Engine(const Model& model, const EngineOptions& opt);

  const Model& model() const { return *model_; }
  const EngineOptions& options() const { return opt_; }
  kv::KvManager& kv() { return kv_; }
  const kv::KvManager& kv() const { return kv_; }
  ModelRunner& runner() { return runner_; }
  // With a shared tier: the model identity its keys carry (engine/model_identity.h); 0 without one.
  uint64_t kv_identity() const { return kv_identity_; }

  // TriAttention statistics for requests that use it (loaded once, shared by all sequences).
  void set_calibration(compress::QueryStats stats) { calib_ = std::make_unique<compress::QueryStats>(std::move(stats)); }
  const compress::QueryStats* calibration() const { return calib_.get(); }

  // Runs one request to completion; on_text receives printable text as it is produced and returns false
  // to cancel. Throws std::invalid_argument for a request that cannot run and std::runtime_error when it
  // fails (e.g. the KV pool is too small for it).
  GenerateResult generate(const Request& req, const std::function<bool(std::string_view)>& on_text);

 private:
  const Model* model_;
  EngineOptions opt_;
  ThreadPool threads_;
  kv::KvManager kv_;
  ModelRunner runner_;
  std::unique_ptr<compress::QueryStats> calib_;
  uint64_t kv_identity_ = 0;
};

kv::PoolConfig default_pool_config(const ModelConfig& c, const EngineOptions& opt);

}  // namespace kvpack
