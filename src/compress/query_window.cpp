#include "compress/query_window.h"

#include <algorithm>
#include <cstring>

namespace kvpack::compress {

QueryWindow::QueryWindow(int32_t n_layer, int32_t q_dim, int32_t window)
    : n_layer_(n_layer), q_dim_(q_dim), window_(window) {
  if (window_ > 0) ring_.assign(static_cast<size_t>(n_layer_) * window_ * q_dim_, 0.0f);
}

void QueryWindow::on_query(int32_t layer, const float* q, int32_t n_tokens, int64_t stride) {
  if (window_ == 0) return;
  const int32_t first = std::max(0, n_tokens - window_);  // only the newest rows of this call matter
  for (int32_t t = first; t < n_tokens; ++t) {
    const int64_t slot = (seen_ + (t - first)) % window_;
    std::memcpy(ring_.data() + (static_cast<size_t>(layer) * window_ + static_cast<size_t>(slot)) * q_dim_, q + t * stride,
                sizeof(float) * static_cast<size_t>(q_dim_));
  }
  if (layer == n_layer_ - 1) seen_ += n_tokens - first;
}

int32_t QueryWindow::count() const { return static_cast<int32_t>(std::min<int64_t>(seen_, window_)); }

void QueryWindow::recent(int32_t layer, std::vector<float>& out) const { recent(layer, window_, out); }

void QueryWindow::recent(int32_t layer, int32_t max_rows, std::vector<float>& out) const {
  const int32_t w = std::max(0, std::min(count(), max_rows));
  out.resize(static_cast<size_t>(w) * q_dim_);
  for (int32_t i = 0; i < w; ++i) {  // oldest first
    const int64_t slot = (seen_ - w + i) % window_;
    std::memcpy(out.data() + static_cast<size_t>(i) * q_dim_,
                ring_.data() + (static_cast<size_t>(layer) * window_ + static_cast<size_t>(slot)) * q_dim_,
                sizeof(float) * static_cast<size_t>(q_dim_));
  }
}

}  // namespace kvpack::compress
