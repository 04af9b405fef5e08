// KL divergence and top-1 agreement of next-token distributions, compressed KV vs full KV, on real text
// (DESIGN.md §5 "quality"; the same two numbers llama.cpp's perplexity tool reports for quantization).
//
// The text is cut into windows of `ctx` tokens (BOS + ctx-1 text tokens when the model has a BOS).
// Both runs are teacher-forced and processed token by token exactly like decode:
//   compressor.prepare -> forward of 1 token -> compressor.after_forward
// so compression happens on the decode schedule (at budget + interval, back to the budget). The full run
// uses the same one-token forward, so with no eviction the two are bit-identical (KL exactly 0); every
// difference measured is the compression's, not a kernel's batch-size numerics.
// For each position i < ctx-1 the distributions over token i+1 are compared (softmax in double):
// KL(full || compressed), argmax agreement, and the log-likelihood of the real next token (perplexity).
// Thread-safety: functions build their own Engine; safe to call concurrently on one Model.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "compress/calibration.h"
#include "compress/compressor.h"
#include "compress/config.h"
#include "engine/calibrate.h"
#include "engine/engine.h"
#include "model/model.h"

namespace kvpack::eval {

struct KldOptions {
  int32_t ctx = 512;         // tokens per window (<= the model's context)
  int32_t max_windows = 4;   // windows used, at most (as many as the text holds, up to this)
  EngineOptions engine;      // threads, page size, KV type (kv_pages 0: sized for the run)
};

struct KldResult {
  int32_t windows = 0, ctx = 0;
  int64_t positions = 0;              // distributions compared (windows * (ctx - 1))
  double mean_kl = 0, p99_kl = 0, max_kl = 0;
  double top1 = 1;                    // fraction of positions whose argmax agrees
  double ppl_full = 0, ppl_compressed = 0;
  int64_t positions_after_eviction = 0;  // positions predicted after the window's first compression event
  double mean_kl_after_eviction = 0;     // mean KL over those (0 if none)
  // Resident KV (pages held by the sequence; bytes = pages * page_bytes).
  size_t page_bytes = 0;
  int64_t peak_pages = 0, final_pages = 0;            // compressed run: max over windows / at the end of the last
  int64_t full_peak_pages = 0, full_final_pages = 0;  // full run
  size_t peak_bytes() const { return static_cast<size_t>(peak_pages) * page_bytes; }
  size_t final_bytes() const { return static_cast<size_t>(final_pages) * page_bytes; }
  size_t full_peak_bytes() const { return static_cast<size_t>(full_peak_pages) * page_bytes; }
  size_t full_final_bytes() const { return static_cast<size_t>(full_final_pages) * page_bytes; }
  compress::CompressionStats compression;  // summed over windows
  double seconds = 0;
};

// log-softmax of x[0..n) in double into lp (size >= n); returns the argmax (first index of the maximum).
int32_t log_softmax(const float* x, int32_t n, std::vector<double>& lp);

// Windows of ctx tokens from a text's tokens (no BOS in `text_tokens`; it is prepended per window when
// the model has one). Throws std::invalid_argument if ctx is out of range or the text is shorter than one window.
std::vector<std::vector<int32_t>> make_windows(const Model& model, std::span<const int32_t> text_tokens, int32_t ctx,
                                               int32_t max_windows);

// Logits of the full-KV run, computed once and reused for many compressed runs (the sweep).
struct FullReference {
  std::vector<std::vector<float>> logits;  // per window: [ctx][n_vocab]
  int64_t peak_pages = 0, final_pages = 0;
  static size_t bytes_needed(size_t windows, int32_t ctx, int32_t n_vocab) {
    return windows * static_cast<size_t>(ctx) * static_cast<size_t>(n_vocab) * sizeof(float);
  }
};
FullReference full_reference(const Model& model, const std::vector<std::vector<int32_t>>& windows, const EngineOptions& eo);

// The comparison. `calib` is needed for triattention (nullptr otherwise). `ref`: precomputed full run for
// these windows (nullptr: the full run is computed alongside, in lockstep). Throws what the compressor
// throws for an invalid config (e.g. budget < sinks + window + 1) and std::runtime_error if the KV pool
// runs out.
// on_position (optional): called after each position with the positions done so far (progress).
KldResult kld(const Model& model, const std::vector<std::vector<int32_t>>& windows, const compress::CompressConfig& kv,
              const compress::QueryStats* calib, const EngineOptions& eo, const FullReference* ref = nullptr,
              const std::function<void(int64_t)>& on_position = {});

// Convenience: windows from text tokens, then kld().
KldResult kld(const Model& model, std::span<const int32_t> text_tokens, const compress::CompressConfig& kv,
              const compress::QueryStats* calib, const KldOptions& opt);

// ---- helpers shared by the eval sub-commands ----
std::string read_text_file(const std::string& path);  // throws std::runtime_error naming the file
// Tokens of the start of `text` (no BOS), at most max_tokens (tokenises only about as much text as needed).
std::vector<int32_t> tokenize_head(const Tokenizer& tok, const std::string& text, int64_t max_tokens);
// TriAttention statistics from a pass over `tokens` in windows of the model's context, each starting with
// BOS where the model has one: the computation of `kvpack calibrate`.



}  // namespace kvpack::eval
