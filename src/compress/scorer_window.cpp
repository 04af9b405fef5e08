// The query-window policies: scores from the attention of the most recent post-RoPE queries.
//   snapkv  mean over the last w queries of softmax(max-over-group q·k/√d) over the non-window keys,
//           max-pooled with kernel 7 (triattention repo §7, decode-time variant)
//   rkv     λ·snapkv − (1−λ)·redundancy (kernels::key_redundancy), λ = 0.1
//   tova    the last query's attention, softmax per query head, averaged over every head of the layer;
//           one score vector per layer, shared by its KV heads
#include <algorithm>
#include <cmath>

#include "compress/scorer_impl.h"
#include "kernels/key_scoring.h"

namespace kvpack::compress::scorer_detail {
namespace {

constexpr float kRkvLambda = 0.1f;

// acc[j] += softmax(row[0, m))_j / divisor (f64; the max subtracted in f32, as the policies define it).
void add_softmax(const float* row, int32_t m, int32_t divisor, double* acc) {
  float mx = -INFINITY;
  for (int32_t j = 0; j < m; ++j) mx = std::max(mx, row[j]);
  double sum = 0;
  for (int32_t j = 0; j < m; ++j) sum += std::exp(static_cast<double>(row[j] - mx));
  for (int32_t j = 0; j < m; ++j) acc[j] += std::exp(static_cast<double>(row[j] - mx)) / sum / divisor;
}

// SnapKV importance from window logits [w][n]: softmax over keys [0, n - w_keys), mean over the w
// queries, max-pool (kernel 7). Slots in the last w_keys get 0 (they are the protected window).
void snapkv_from_logits(std::span<const float> logits, int32_t w, int32_t n, int32_t w_keys, std::span<float> out) {
  const int32_t m = std::max(0, n - w_keys);
  std::vector<double> mean(static_cast<size_t>(m), 0.0);
  for (int32_t i = 0; i < w; ++i) add_softmax(logits.data() + static_cast<size_t>(i) * n, m, w, mean.data());
  constexpr int32_t kKernel = 7;
  for (int32_t j = 0; j < n; ++j) {
    if (j >= m) {
      out[static_cast<size_t>(j)] = 0.0f;
      continue;
    }
    double best = 0;
    for (int32_t d = -kKernel / 2; d <= kKernel / 2; ++d) {
      const int32_t x = j + d;
      if (x >= 0 && x < m) best = std::max(best, mean[static_cast<size_t>(x)]);
    }
    out[static_cast<size_t>(j)] = static_cast<float>(best);
  }
}

class WindowScorer final : public Scorer {
 public:
  std::unique_ptr<Scorer> clone() const override { return std::make_unique<WindowScorer>(*this); }
  WindowScorer(const CompressConfig& cfg, const ModelConfig& model)
      : policy_(cfg.policy), window_keys_(cfg.effective_window()), mc_(model),
        scale_(1.0f / std::sqrt(static_cast<float>(model.head_dim))) {}

  ScorerNeeds needs() const override { return {policy_ == PolicyKind::TOVA ? 1 : 8, false, false}; }

  void score(const ScoringInputs& in, std::vector<std::vector<float>>& scores) override {
    // Its own window's worth of rows (the window may be larger when recall reads it too).
    const int32_t w = in.queries ? std::min(in.queries->count(), needs().query_window) : 0;
    for (int32_t l = 0; l < mc_.n_layer; ++l) {
      if (in.is_frozen(in.kv.stream_index(l, 0))) {  // a sliding-window layer: every head of it
        for (int32_t h = 0; h < mc_.n_head_kv; ++h) scores[static_cast<size_t>(in.kv.stream_index(l, h))].clear();
        continue;
      }
      if (w > 0) in.queries->recent(l, w, q_);
      if (policy_ == PolicyKind::TOVA)
        score_tova_layer(in.kv, l, w, scores);
      else
        score_snapkv_layer(in.kv, l, w, scores);
    }
  }

 private:
  void score_tova_layer(const kv::SequenceKv& kv, int32_t l, int32_t w, std::vector<std::vector<float>>& scores) {
    const int32_t G = mc_.group(), hd = mc_.head_dim;
    const int32_t n = kv.n_slots(kv.stream_index(l, 0));
    std::vector<double> avg(static_cast<size_t>(n), 0.0);
    for (int32_t h = 0; h < mc_.n_head_kv; ++h) {
      const int32_t s = kv.stream_index(l, h);
      if (kv.n_slots(s) != n || w == 0) continue;
      logits_.resize(static_cast<size_t>(G) * n);
      const float* q_last = q_.data() + static_cast<size_t>(w - 1) * mc_.q_dim() + static_cast<size_t>(h * G) * hd;
      kernels::group_logits(kv.view(s), q_last, G, scale_, logits_.data());
      for (int32_t g = 0; g < G; ++g) add_softmax(logits_.data() + static_cast<size_t>(g) * n, n, 1, avg.data());  // x / 1 is exact
    }
    for (int32_t h = 0; h < mc_.n_head_kv; ++h) {
      const int32_t s = kv.stream_index(l, h);
      auto& out = scores[static_cast<size_t>(s)];
      out.assign(avg.begin(), avg.end());
      out.resize(static_cast<size_t>(kv.n_slots(s)), 0.0f);  // a head of another length: no signal for its tail
    }
  }

  void score_snapkv_layer(const kv::SequenceKv& kv, int32_t l, int32_t w, std::vector<std::vector<float>>& scores) {
    const int32_t G = mc_.group(), hd = mc_.head_dim;
    for (int32_t h = 0; h < mc_.n_head_kv; ++h) {
      const int32_t s = kv.stream_index(l, h);
      const int32_t n = kv.n_slots(s);
      auto& out = scores[static_cast<size_t>(s)];
      out.assign(static_cast<size_t>(n), 0.0f);
      if (w == 0) continue;
      logits_.resize(static_cast<size_t>(w) * n);
      kernels::window_logits(kv.view(s), q_.data() + static_cast<size_t>(h * G) * hd, mc_.q_dim(), w, G, scale_, logits_.data());
      const int32_t w_keys = std::min(n, window_keys_);
      snapkv_from_logits(logits_, w, n, w_keys, out);
      if (policy_ != PolicyKind::RKV) continue;
      redundancy_.assign(static_cast<size_t>(n), 0.0f);
      kernels::key_redundancy(kv.view(s), w_keys, redundancy_.data());
      for (int32_t j = 0; j < n; ++j)
        out[static_cast<size_t>(j)] = kRkvLambda * out[static_cast<size_t>(j)] - (1 - kRkvLambda) * redundancy_[static_cast<size_t>(j)];
    }
  }

  PolicyKind policy_;
  int32_t window_keys_;  // the protected recent window (SnapKV scores only keys before it)
  const ModelConfig mc_;
  float scale_;
  std::vector<float> q_, logits_, redundancy_;  // per-event scratch, kept to avoid reallocation
};

}  // namespace

std::unique_ptr<Scorer> make_window_scorer(const CompressConfig& cfg, const ModelConfig& model) {
  return std::make_unique<WindowScorer>(cfg, model);
}

}  // namespace kvpack::compress::scorer_detail
