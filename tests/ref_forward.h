// A deliberately naive float64 transformer forward pass (one token at a time, dense K/V history,
// materialised softmax) used as the correctness reference in tests. It reads the same Weight views as
// the engine (dequantising rows with kernels::dequantize_row), but shares none of its code paths.
#pragma once
#include <cmath>
#include <vector>

#include "kernels/matmul.h"
#include "model/model.h"

namespace kvpack::test {

class RefForward {
 public:
  explicit RefForward(const Model& m) : m_(m), c_(m.config()) {
    k_.resize(static_cast<size_t>(c_.n_layer));
    v_.resize(static_cast<size_t>(c_.n_layer));
  }

  // Feeds one token, returns the next-token logits.
  std::vector<double> step(int32_t tok) {
    const ModelWeights& W = m_.weights();
    const int64_t E = c_.n_embd, HD = c_.head_dim;
    std::vector<double> x = row(W.tok_embd, tok);
    for (int32_t l = 0; l < c_.n_layer; ++l) {
      const LayerWeights& L = W.layers[static_cast<size_t>(l)];
      std::vector<double> xb = norm(x, L.attn_norm);
      std::vector<double> q = mul(L.wq, xb), k = mul(L.wk, xb), v = mul(L.wv, xb);
      if (L.bq) add(q, L.bq);
      if (L.bk) add(k, L.bk);
      if (L.bv) add(v, L.bv);
      for (int32_t h = 0; h < c_.n_head; ++h) head_fix(q, h, L.q_norm);
      for (int32_t h = 0; h < c_.n_head_kv; ++h) head_fix(k, h, L.k_norm);
      k_[static_cast<size_t>(l)].push_back(k);
      v_[static_cast<size_t>(l)].push_back(v);
      const auto& K = k_[static_cast<size_t>(l)];
      const auto& V = v_[static_cast<size_t>(l)];
      std::vector<double> att(static_cast<size_t>(c_.q_dim()), 0.0);
      for (int32_t h = 0; h < c_.n_head; ++h) {
        const int32_t kh = h / c_.group();
        std::vector<double> s(K.size());
        double mx = -1e300;
        for (size_t j = 0; j < K.size(); ++j) {
          double d = 0;
          for (int64_t e = 0; e < HD; ++e) d += q[static_cast<size_t>(h * HD + e)] * K[j][static_cast<size_t>(kh * HD + e)];
          s[j] = d / std::sqrt(static_cast<double>(HD));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (size_t j = 0; j < K.size(); ++j)
          for (int64_t e = 0; e < HD; ++e) att[static_cast<size_t>(h * HD + e)] += s[j] / sum * V[j][static_cast<size_t>(kh * HD + e)];
      }
      std::vector<double> o = mul(L.wo, att);
      for (int64_t i = 0; i < E; ++i) x[static_cast<size_t>(i)] += o[static_cast<size_t>(i)];
      xb = norm(x, L.ffn_norm);
      std::vector<double> g = mul(L.w_gate, xb), u = mul(L.w_up, xb);
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      std::vector<double> d = mul(L.w_down, g);
      for (int64_t i = 0; i < E; ++i) x[static_cast<size_t>(i)] += d[static_cast<size_t>(i)];
    }
    ++pos_;
    return mul(W.output, norm(x, W.out_norm));
  }

 private:
  std::vector<double> row(const Weight& w, int64_t r) const {
    std::vector<float> f(static_cast<size_t>(w.n_in));
    const auto* base = static_cast<const uint8_t*>(w.data) + row_bytes(w.type, static_cast<uint64_t>(w.n_in)) * static_cast<uint64_t>(r);
    kernels::dequantize_row(base, w.type, w.n_in, f.data());
    return std::vector<double>(f.begin(), f.end());
  }
  std::vector<double> mul(const Weight& w, const std::vector<double>& x) const {
    std::vector<double> y(static_cast<size_t>(w.n_out));
    for (int64_t o = 0; o < w.n_out; ++o) {
      const std::vector<double> r = row(w, o);
      double s = 0;
      for (int64_t i = 0; i < w.n_in; ++i) s += r[static_cast<size_t>(i)] * x[static_cast<size_t>(i)];
      y[static_cast<size_t>(o)] = s;
    }
    return y;
  }
  std::vector<double> norm(const std::vector<double>& x, const Weight& w) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + c_.rms_eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w.f32()[i];
    return y;
  }
  static void add(std::vector<double>& y, const Weight& b) {
    for (size_t i = 0; i < y.size(); ++i) y[i] += b.f32()[i];
  }
  // Optional per-head RMSNorm (qwen3), then RoPE at the current position.
  void head_fix(std::vector<double>& x, int32_t h, const Weight& nw) const {
    double* v = x.data() + static_cast<size_t>(h) * c_.head_dim;
    const int32_t HD = c_.head_dim;
    if (nw) {
      double ss = 0;
      for (int32_t e = 0; e < HD; ++e) ss += v[e] * v[e];
      const double inv = 1.0 / std::sqrt(ss / HD + c_.rms_eps);
      for (int32_t e = 0; e < HD; ++e) v[e] = v[e] * inv * nw.f32()[e];
    }
    const int32_t R = c_.rope_dims, half = R / 2;
    for (int32_t i = 0; i < half; ++i) {
      const double ang = pos_ * c_.rope_freq_scale * std::pow(static_cast<double>(c_.rope_theta), -2.0 * i / R);
      const double cs = std::cos(ang), sn = std::sin(ang);
      const int32_t a = c_.rope_neox ? i : 2 * i, b = c_.rope_neox ? i + half : 2 * i + 1;
      const double x0 = v[a], x1 = v[b];
      v[a] = x0 * cs - x1 * sn;
      v[b] = x0 * sn + x1 * cs;
    }
  }

  const Model& m_;
  const ModelConfig& c_;
  std::vector<std::vector<std::vector<double>>> k_, v_;  // [layer][pos][kv_dim]
  int64_t pos_ = 0;
};

}  // namespace kvpack::test
