// The last `window` post-RoPE query rows of every layer (SnapKV, R-KV, TOVA score keys against them).
// Filled by the compressor's ForwardObserver hook; a ring per layer, so a forward of any size costs at
// most `window` row copies per layer and no allocation.
// Thread-safety: not thread-safe; one per sequence (the forward calls on_query for one layer at a time).
#pragma once
#include <cstdint>
#include <vector>

namespace kvpack::compress {

class QueryWindow {
 public:
  QueryWindow() = default;
  // window == 0: keeps nothing (every call is a no-op).
  QueryWindow(int32_t n_layer, int32_t q_dim, int32_t window);

  int32_t window() const { return window_; }
  // Rows of one forward for `layer`: [n_tokens] rows of q_dim floats, `stride` floats apart. The last
  // layer's call completes a forward (the row count advances then).
  void on_query(int32_t layer, const float* q, int32_t n_tokens, int64_t stride);
  // Rows available (min(tokens seen, window)).
  int32_t count() const;
  // Copies `layer`'s count() rows, oldest first, into out ([count][q_dim]).
  void recent(int32_t layer, std::vector<float>& out) const;
  // The newest min(count(), max_rows) rows only, oldest first (the window may be sized for several readers).
  void recent(int32_t layer, int32_t max_rows, std::vector<float>& out) const;

 private:
  int32_t n_layer_ = 0, q_dim_ = 0, window_ = 0;
  int64_t seen_ = 0;        // rows seen per layer (ring head = seen_ % window_)
  std::vector<float> ring_;  // [layer][window][q_dim]
};

}  // namespace kvpack::compress
