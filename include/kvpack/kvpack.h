// kvpack embedding API: load a model, generate text with optional KV-cache compression, read the
// statistics. This header is the whole public surface; everything under src/ is internal.
//
//   auto s = kvpack::Session::open({.model_path = "model.gguf", .kv_policy = "triattention",
//                                    .kv_budget = 2048, .kv_calib = "model.calib"});
//   kvpack::GenerateStats st;
//   std::string text = s->generate("Once upon a time", {.max_tokens = 64, .temperature = 0}, nullptr, &st);
//
// Thread-safety: a Session is used by one thread at a time; separate Sessions are independent.
// Errors (bad files, bad options, out of KV memory) throw std::runtime_error / std::invalid_argument.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvpack {

struct SessionOptions {
  std::string model_path;      // GGUF, or llama2.c checkpoint (then tokenizer_path is required)
  std::string tokenizer_path;  // llama2.c tokenizer.bin
  int32_t threads = 2;
  std::string kv_type = "f16";  // "f16" (default, as llama.cpp), "f32", "bf16" or "q8_0" (q8_0 needs head_dim % 32 == 0)
  int64_t kv_pages = 0;         // page-pool limit; 0 = one full context
  // KV compression: "full" (none), "streaming", "knorm", "triattention", "snapkv", "rkv", "tova", "h2o",
  // "trispan". Empty: the recommended policy (trispan) when kv_budget > 0, else none.
  std::string kv_policy;
  int32_t kv_budget = 0;        // slots kept per (layer, KV head); the one knob that matters
  int32_t kv_interval = 128;
  std::string kv_split = "uniform";  // "uniform", "pyramid", "ada"
  // TriAttention statistics (kvpack calibrate). Empty with a policy that needs them (triattention):
  // computed once on built-in text and cached in $XDG_CACHE_HOME/kvpack (or ~/.cache/kvpack).
  std::string kv_calib;
};

struct GenerateOptions {
  int32_t max_tokens = 128;
  float temperature = 0.8f;  // 0 = greedy
  int32_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  uint64_t seed = 0;
  std::vector<std::string> stop;
  bool add_bos = true;  // when the vocabulary has a BOS token
};

struct GenerateStats {
  int32_t prompt_tokens = 0, generated_tokens = 0;
  std::string stop_reason;
  double prefill_tokens_per_s = 0, decode_tokens_per_s = 0;
  uint64_t resident_kv_bytes = 0, peak_resident_kv_bytes = 0;
  int64_t kv_pages_in_use = 0;
  int64_t compactions = 0, evicted_slots = 0, freed_pages = 0;
  double reclaim_efficiency = 0;  // bytes of pages returned / bytes of evicted slots
  double compaction_seconds = 0;
};

class Session {
 public:
  static std::unique_ptr<Session> open(const SessionOptions& opt);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Generates a continuation of `prompt`. on_text (optional) receives printable text as it is produced
  // and returns false to stop early.
  std::string generate(const std::string& prompt, const GenerateOptions& opt,
                       const std::function<bool(std::string_view)>& on_text = {}, GenerateStats* stats = nullptr);
  std::vector<int32_t> tokenize(const std::string& text, bool add_bos) const;
  std::string detokenize(const std::vector<int32_t>& tokens) const;
  // "llama 5 layers ..." one-line description of the loaded model.
  std::string describe() const;
  // How the KV calibration was obtained when open() computed or reused it by itself (triattention
  // without kv_calib): "triattention calibration computed (...), cached at PATH"; "" otherwise.
  std::string calibration_report() const;

 private:
  Session();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvpack
