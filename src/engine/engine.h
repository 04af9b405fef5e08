// The engine: a model plus the KV page pool, a thread pool and the forward-pass scratch, and the
// single-sequence generation loop the CLI uses. (Batched serving builds on the same parts.)
// Thread-safety: an Engine is driven by one thread at a time.
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
#include "engine/sampler.h"
#include "kv/page_pool.h"
#include "kv/sequence_kv.h"
#include "model/forward.h"
#include "model/model.h"
#include "util/thread_pool.h"

namespace kvpack {

struct EngineOptions {
  int32_t threads = 2;
  int32_t page_size = 16;
  DType kv_type = DType::F32;
  int64_t kv_pages = 0;  // 0: enough for one sequence of the full context (allocated lazily anyway)
  int32_t max_batch_tokens = 256;  // prefill chunk / batch size per forward call
};

struct GenerateRequest {
  std::vector<int32_t> prompt;  // must be non-empty (BOS at least, for models that use it)
  int32_t max_tokens = 128;
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  compress::CompressConfig kv;  // KV compression (policy "full" = none)
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated token ids
  std::string text;
  std::string stop_reason;  // "length", "eos", "stop", "context", "cancelled"
  int32_t prompt_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  int32_t decode_steps = 0;  // forward passes during decode (tokens/s = decode_steps / decode_seconds)
  int64_t kv_pages_in_use = 0;       // pages held by the sequence at the end
  size_t resident_kv_bytes = 0;      // those pages' bytes
  size_t peak_resident_kv_bytes = 0;
  size_t pool_reserved_bytes = 0;    // memory the pool actually obtained from the system
  compress::CompressionStats compression;
};

class Engine {
 public:
  Engine(const Model& model, const EngineOptions& opt);

  const Model& model() const { return *model_; }
  const EngineOptions& options() const { return opt_; }
  kv::PagePool& pool() { return pool_; }
  const kv::PagePool& pool() const { return pool_; }
  Forward& forward() { return forward_; }
  ThreadPool& threads() { return threads_; }
  std::unique_ptr<kv::SequenceKv> new_sequence();

  // Prefills `tokens` into kv in chunks of max_batch_tokens; logits of the last token into `logits`
  // (may be nullptr). With a compressor, compression runs between chunks when the schedule says so,
  // and chunks end where the next event fires, so a long prompt never holds more than budget + interval
  // slots per stream (plus protected ones). Returns the peak pages held.
  // Throws std::runtime_error if the pool is exhausted.
  int64_t prefill(kv::SequenceKv& kv, std::span<const int32_t> tokens, float* logits,
                  compress::SequenceCompressor* comp = nullptr);

  // TriAttention statistics for requests that use it (loaded once, shared by all sequences).
  void set_calibration(compress::QueryStats stats) { calib_ = std::make_unique<compress::QueryStats>(std::move(stats)); }
  const compress::QueryStats* calibration() const { return calib_.get(); }

  // Generates text; on_text receives printable text as it is produced and returns false to cancel.
  GenerateResult generate(const GenerateRequest& req, const std::function<bool(std::string_view)>& on_text);

 private:
  const Model* model_;
  EngineOptions opt_;
  ThreadPool threads_;
  kv::PagePool pool_;
  Forward forward_;
  std::unique_ptr<compress::QueryStats> calib_;
};

kv::PoolConfig default_pool_config(const ModelConfig& c, const EngineOptions& opt);

}  // namespace kvpack
