// TriAttention query statistics (research/triattention.md §3): for every layer and query head, the mean
// of the pre-RoPE query as complex numbers per RoPE frequency band, q̄_f, and the mean magnitude
// E|q_f|. Computed once per model by `kvpack calibrate` from a prefill over plain text, stored as a
// small GGUF file next to the model, and loaded with --kv-calib.
//
// Band f pairs dims (f, f + F) for NeoX-style RoPE (qwen2/3) and (2f, 2f+1) for llama's normal RoPE,
// F = rope_dims / 2, matching how the model rotates keys, so the same pairing applies to cached keys.
// Thread-safety: QueryStats is immutable after load; Calibrator is single-threaded.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/forward.h"
#include "model/model.h"

namespace kvpack::compress {

struct QueryStats {
  int32_t n_layer = 0, n_head = 0, n_bands = 0;
  bool rope_neox = false;
  std::string model_name;
  int64_t tokens = 0;  // tokens the statistics were computed from
  // [layer][head][band]
  std::vector<float> mean_re, mean_im, abs_mean;

  size_t index(int32_t layer, int32_t head, int32_t band) const {
    return (static_cast<size_t>(layer) * n_head + head) * n_bands + band;
  }
  void save(const std::string& path) const;
  // Loads and checks the statistics fit `model` (layers, heads, head dim, RoPE layout); throws
  // std::runtime_error naming the mismatch.
  static QueryStats load(const std::string& path, const ModelConfig& model);
};

// Accumulates statistics from the forward pass's pre-RoPE queries (a ForwardObserver).
class Calibrator : public ForwardObserver {
 public:
  explicit Calibrator(const ModelConfig& c);
  void on_query_pre_rope(int32_t batch_index, int32_t layer, const float* q, int32_t n_tokens, int64_t stride) override;
  QueryStats finish() const;

 private:
  ModelConfig c_;
  int32_t bands_;
  std::vector<double> sum_re_, sum_im_, sum_abs_;
  std::vector<int64_t> count_;  // per layer
};

// Band pairing: element indices of the real and imaginary part of band f.
inline int32_t band_re(int32_t f, int32_t n_bands, bool neox) { return neox ? f : 2 * f; }
inline int32_t band_im(int32_t f, int32_t n_bands, bool neox) { return neox ? f + n_bands : 2 * f + 1; }

}  // namespace kvpack::compress
