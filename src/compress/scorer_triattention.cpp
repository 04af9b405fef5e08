// TriAttention (research/triattention.md §2.3): the expected attention of future queries, from
// calibrated pre-RoPE query centres, evaluated on post-RoPE keys at the current position t.
//   Score_g(k) = Σ_f kr·(q̄r C − q̄i S) + ki·(q̄i C + q̄r S) + (E|q_f| − |q̄_f|)·|k_f|
// (the mean over offsets of Re(q̄_f conj(k̃_f) e^{iω_f(t+δ)}) is linear in k̃, so it folds into the
// per-band weights u_re / u_im built here; kernels::tri_key_scores does the per-key work).
// z-normalised per query head, max over the GQA group; with a uniform split, one keep set per KV head
// shared by all layers (mean over layers of the per-layer scores).
#include <algorithm>
#include <cmath>

#include "compress/scorer_impl.h"
#include "compress/selection.h"
#include "kernels/key_scoring.h"

namespace kvpack::compress {

void tri_offset_table(const ModelConfig& c, int64_t t, std::vector<float>& C, std::vector<float>& S) {
  const int32_t F = c.rope_dims / 2;
  C.assign(static_cast<size_t>(F), 0.0f);
  S.assign(static_cast<size_t>(F), 0.0f);
  constexpr int kOffsets = 17;  // 1, 2, 4, ..., 65536
  for (int32_t f = 0; f < F; ++f) {
    const double omega = std::pow(static_cast<double>(c.rope_theta), -2.0 * f / c.rope_dims) * c.rope_freq_scale /
                         (c.rope_freq_factors.empty() ? 1.0 : static_cast<double>(c.rope_freq_factors[static_cast<size_t>(f)]));
    double cs = 0, sn = 0;
    for (int i = 0; i < kOffsets; ++i) {
      const double ang = omega * static_cast<double>(t + (int64_t{1} << i));
      cs += std::cos(ang);
      sn += std::sin(ang);
    }
    C[static_cast<size_t>(f)] = static_cast<float>(cs / kOffsets);
    S[static_cast<size_t>(f)] = static_cast<float>(sn / kOffsets);
  }
}

TriBandWeights::TriBandWeights(const QueryStats& qs, int32_t layer, int32_t kv_head, int32_t group, bool rope_neox,
                               std::span<const float> C, std::span<const float> S)
    : n_bands_(qs.n_bands), group_(group), rope_neox_(rope_neox) {
  const int32_t F = n_bands_;
  u_re_.resize(static_cast<size_t>(group) * F);
  u_im_.resize(u_re_.size());
  wn_.resize(u_re_.size());
  for (int32_t g = 0; g < group; ++g)
    for (int32_t f = 0; f < F; ++f) {
      const size_t i = qs.index(layer, kv_head * group + g, f);
      const size_t o = static_cast<size_t>(g) * F + f;
      const float qr = qs.mean_re[i], qi = qs.mean_im[i];
      u_re_[o] = qr * C[static_cast<size_t>(f)] - qi * S[static_cast<size_t>(f)];
      u_im_[o] = qi * C[static_cast<size_t>(f)] + qr * S[static_cast<size_t>(f)];
      wn_[o] = qs.abs_mean[i] - std::sqrt(qr * qr + qi * qi);
    }
}

kernels::TriWeights TriBandWeights::view() const {
  kernels::TriWeights w;
  w.u_re = u_re_.data();
  w.u_im = u_im_.data();
  w.wn = wn_.data();
  w.n_bands = n_bands_;
  w.group = group_;
  w.rope_neox = rope_neox_;
  return w;
}

namespace scorer_detail {

void tri_stream_scores(const QueryStats& qs, const ModelConfig& mc, const kv::SequenceKv& kv, int32_t layer, int32_t h,
                       std::span<const float> C, std::span<const float> S, std::vector<float>& out) {
  const int32_t G = mc.group();
  const int32_t s = kv.stream_index(layer, h);
  const int32_t n = kv.n_slots(s);
  TriBandWeights w(qs, layer, h, G, mc.rope_neox, C, S);
  std::vector<float> all(static_cast<size_t>(G) * n);
  kernels::tri_key_scores(kv.view(s), w.view(), all.data());
  out.assign(static_cast<size_t>(n), -INFINITY);
  for (int32_t g = 0; g < G; ++g) {
    std::span<float> head(all.data() + static_cast<size_t>(g) * n, static_cast<size_t>(n));
    z_normalize(head);
    for (int32_t j = 0; j < n; ++j) out[static_cast<size_t>(j)] = std::max(out[static_cast<size_t>(j)], head[static_cast<size_t>(j)]);
  }
}

namespace {

class TriAttentionScorer final : public Scorer {
 public:
  std::unique_ptr<Scorer> clone() const override { return std::make_unique<TriAttentionScorer>(*this); }
  TriAttentionScorer(const CompressConfig& cfg, const ModelConfig& model) : mc_(model), uniform_(cfg.split == BudgetSplit::Uniform) {}
  ScorerNeeds needs() const override { return {0, false, true}; }

  void score(const ScoringInputs& in, std::vector<std::vector<float>>& scores) override {
    const kv::SequenceKv& kv = in.kv;
    tri_offset_table(mc_, kv.next_pos(), C_, S_);
    auto task = [&](int32_t t) {
      if (in.is_frozen(t)) {
        scores[static_cast<size_t>(t)].clear();
        return;
      }
      score_stream(in, t / mc_.n_head_kv, t % mc_.n_head_kv, scores);
    };
    const int32_t n_streams = kv.n_streams();
    if (in.pool != nullptr) {
      in.pool->run(n_streams, [&](int t, int) { task(t); });
    } else {
      for (int32_t t = 0; t < n_streams; ++t) task(t);
    }
    if (uniform_) share_across_layers(in, scores);
  }

 private:
  void score_stream(const ScoringInputs& in, int32_t layer, int32_t h, std::vector<std::vector<float>>& scores) const {
    tri_stream_scores(*in.calibration, mc_, in.kv, layer, h, C_, S_, scores[static_cast<size_t>(in.kv.stream_index(layer, h))]);
  }

  // TriAttention's default selection: one keep set per KV head shared by all layers, from the mean over
  // layers. Valid only while all layers of a head hold the same slots, i.e. with a uniform split
  // (per-layer budgets make layers diverge; then each stream keeps its own).
  // Frozen layers (sliding-window ones) take no part.
  void share_across_layers(const ScoringInputs& in, std::vector<std::vector<float>>& scores) const {
    const kv::SequenceKv& kv = in.kv;
    std::vector<int32_t> layers;
    for (int32_t l = 0; l < mc_.n_layer; ++l)
      if (!in.is_frozen(kv.stream_index(l, 0))) layers.push_back(l);
    if (layers.empty()) return;
    for (int32_t h = 0; h < mc_.n_head_kv; ++h) {
      const int32_t n = kv.n_slots(kv.stream_index(layers[0], h));
      bool same = true;
      for (int32_t l : layers) same &= kv.n_slots(kv.stream_index(l, h)) == n;
      if (!same) continue;
      std::vector<float> mean(static_cast<size_t>(n), 0.0f);
      const float n_layers = static_cast<float>(layers.size());
      for (int32_t l : layers) {
        const auto& sc = scores[static_cast<size_t>(kv.stream_index(l, h))];
        for (int32_t j = 0; j < n; ++j) mean[static_cast<size_t>(j)] += sc[static_cast<size_t>(j)] / n_layers;
      }
      for (int32_t l : layers) scores[static_cast<size_t>(kv.stream_index(l, h))] = mean;
    }
  }

  const ModelConfig mc_;
  bool uniform_;
  std::vector<float> C_, S_;  // offset tables of the current event
};

}  // namespace

std::unique_ptr<Scorer> make_triattention_scorer(const CompressConfig& cfg, const ModelConfig& model) {
  return std::make_unique<TriAttentionScorer>(cfg, model);
}

}  // namespace scorer_detail
}  // namespace kvpack::compress
