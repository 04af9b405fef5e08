// Reference computations for tests/compress_*_test.cpp, written from the formulas in
// research/triattention.md §2 / §7 and research/policies.md §1 in the most literal way (float64,
// std::complex for TriAttention, materialised softmax matrices for SnapKV / R-KV / TOVA); none of them
// calls src/compress or src/kernels scoring code. Also the query feed that drives the compressor's
// ForwardObserver hook like the forward pass does.
#pragma once
#include "compress_test_util.h"

namespace kvpack::compress_test {

// ---------------------------------------------------------------------------------------------------
// Query feed for SnapKV / R-KV / TOVA: post-RoPE queries go to the compressor like the forward pass
// sends them (every layer, in order, strided rows) and are remembered for the reference.
class Queries {
 public:
  Queries(const ModelConfig& mc, uint32_t seed) : mc_(mc), rng_(seed), hist_(static_cast<size_t>(mc.n_layer)) {}
  void feed(SequenceCompressor& comp, int32_t n_tokens) {
    const int32_t QD = mc_.q_dim();
    const int64_t stride = QD + 5;  // padded rows: the compressor must honour the stride
    std::normal_distribution<double> nd(0.0, 1.0);
    for (int32_t l = 0; l < mc_.n_layer; ++l) {
      std::vector<float> buf(static_cast<size_t>(n_tokens * stride), 1e9f);
      for (int32_t t = 0; t < n_tokens; ++t) {
        std::vector<double> q(static_cast<size_t>(QD));
        for (int32_t e = 0; e < QD; ++e) {
          const float v = static_cast<float>(nd(rng_) * 1.5);
          buf[static_cast<size_t>(t * stride + e)] = v;
          q[static_cast<size_t>(e)] = v;
        }
        hist_[static_cast<size_t>(l)].push_back(std::move(q));
      }
      comp.on_query_post_rope(0, l, buf.data(), n_tokens, stride);
    }
  }
  // The last min(w, seen) queries of a layer, oldest first.
  std::vector<std::vector<double>> last(int32_t layer, int32_t w) const {
    const auto& h = hist_[static_cast<size_t>(layer)];
    const size_t take = std::min(h.size(), static_cast<size_t>(w));
    return std::vector<std::vector<double>>(h.end() - static_cast<long>(take), h.end());
  }

 private:
  ModelConfig mc_;
  std::mt19937 rng_;
  std::vector<std::vector<std::vector<double>>> hist_;  // [layer][token][q_dim]
};

// ---------------------------------------------------------------------------------------------------
// Reference scores, literal from the papers / research notes.

// KNorm (policies.md §1.12): s_j = −‖k_j‖₂.
inline std::vector<std::vector<double>> ref_knorm(const Snapshot& sn) {
  std::vector<std::vector<double>> out(sn.keys.size());
  for (size_t s = 0; s < sn.keys.size(); ++s)
    for (const auto& k : sn.keys[s]) {
      double ss = 0;
      for (double x : k) ss += x * x;
      out[s].push_back(-std::sqrt(ss));
    }
  return out;
}

// StreamingLLM (policies.md §1.1): sinks + most recent; a score that grows with recency.
inline std::vector<std::vector<double>> ref_recency(const Snapshot& sn) {
  std::vector<std::vector<double>> out(sn.keys.size());
  for (size_t s = 0; s < sn.keys.size(); ++s)
    for (size_t j = 0; j < sn.keys[s].size(); ++j) out[s].push_back(static_cast<double>(j));
  return out;
}

inline QueryStats make_stats(const ModelConfig& mc, uint32_t seed) {
  QueryStats qs;
  qs.n_layer = mc.n_layer;
  qs.n_head = mc.n_head;
  qs.n_bands = mc.rope_dims / 2;
  qs.rope_neox = mc.rope_neox;
  qs.model_name = mc.name;
  qs.tokens = 1000;
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_real_distribution<double> ud(0.0, 1.5);
  const size_t n = static_cast<size_t>(qs.n_layer) * qs.n_head * qs.n_bands;
  for (size_t i = 0; i < n; ++i) {
    const double re = nd(rng) * 2, im = nd(rng) * 2;
    qs.mean_re.push_back(static_cast<float>(re));
    qs.mean_im.push_back(static_cast<float>(im));
    qs.abs_mean.push_back(static_cast<float>(std::hypot(re, im) + ud(rng)));  // E|q_f| >= |q̄_f|
  }
  return qs;
}

// TriAttention (triattention.md §2.2–2.4): per (layer, query head)
//   S(k) = mean_{δ∈{1,2,4..65536}} Σ_f Re(q̄_f · conj(k̃_f) · e^{iω_f(t+δ)}) + Σ_f (E|q_f| − |q̄_f|)·|k̃_f|,
// k̃ the cached post-RoPE key as complex bands, ω_f = θ^(−2f/rope_dims); z-normalised per query head
// (population std), max over the GQA group, and (layer_mean) mean over layers per KV head.
inline std::vector<std::vector<double>> ref_triattention(const ModelConfig& mc, const QueryStats& qs, const Snapshot& sn,
                                                  int64_t t, bool layer_mean) {
  const int32_t F = mc.rope_dims / 2, G = mc.n_head / mc.n_head_kv;
  std::vector<std::vector<double>> out(sn.keys.size());
  for (int32_t l = 0; l < mc.n_layer; ++l)
    for (int32_t h = 0; h < mc.n_head_kv; ++h) {
      const size_t s = static_cast<size_t>(l * mc.n_head_kv + h);
      const size_t n = sn.keys[s].size();
      out[s].assign(n, -INFINITY);
      for (int32_t g = 0; g < G; ++g) {
        const int32_t qh = h * G + g;
        std::vector<double> raw(n);
        for (size_t j = 0; j < n; ++j) {
          const auto& k = sn.keys[s][j];
          double trig = 0, norm = 0;
          for (int32_t f = 0; f < F; ++f) {
            const size_t qi = (static_cast<size_t>(l) * mc.n_head + qh) * F + f;
            const std::complex<double> qbar(qs.mean_re[qi], qs.mean_im[qi]);
            const std::complex<double> kf = mc.rope_neox ? std::complex<double>(k[f], k[f + F])
                                                         : std::complex<double>(k[2 * f], k[2 * f + 1]);
            const double omega = std::pow(static_cast<double>(mc.rope_theta), -2.0 * f / mc.rope_dims);
            for (int i = 0; i < 17; ++i) {
              const double delta = std::ldexp(1.0, i);
              trig += std::real(qbar * std::conj(kf) * std::exp(std::complex<double>(0.0, omega * (static_cast<double>(t) + delta))));
            }
            norm += (static_cast<double>(qs.abs_mean[qi]) - std::abs(qbar)) * std::abs(kf);
          }
          raw[j] = trig / 17.0 + norm;
        }
        double mean = 0, var = 0;
        for (double x : raw) mean += x;
        mean /= static_cast<double>(n);
        for (double x : raw) var += (x - mean) * (x - mean);
        const double sd = std::max(std::sqrt(var / static_cast<double>(n)), 1e-6);
        for (size_t j = 0; j < n; ++j) out[s][j] = std::max(out[s][j], (raw[j] - mean) / sd);
      }
    }
  if (layer_mean) {
    for (int32_t h = 0; h < mc.n_head_kv; ++h) {
      const size_t n = out[static_cast<size_t>(h)].size();
      std::vector<double> mean(n, 0.0);
      for (int32_t l = 0; l < mc.n_layer; ++l)
        for (size_t j = 0; j < n; ++j) mean[j] += out[static_cast<size_t>(l * mc.n_head_kv + h)][j] / mc.n_layer;
      for (int32_t l = 0; l < mc.n_layer; ++l) out[static_cast<size_t>(l * mc.n_head_kv + h)] = mean;
    }
  }
  return out;
}

// A = max over the GQA group of Q_win · Kᵀ / √D  ([w][n]), materialised (triattention.md §7).
inline std::vector<std::vector<double>> ref_window_logits(const ModelConfig& mc, const std::vector<std::vector<double>>& q,
                                                   const std::vector<std::vector<double>>& keys, int32_t kv_head) {
  const int32_t G = mc.n_head / mc.n_head_kv;
  std::vector<std::vector<double>> A(q.size(), std::vector<double>(keys.size(), -INFINITY));
  for (size_t i = 0; i < q.size(); ++i)
    for (size_t j = 0; j < keys.size(); ++j)
      for (int32_t g = 0; g < G; ++g) {
        double d = 0;
        for (int32_t e = 0; e < kHeadDim; ++e) d += q[i][static_cast<size_t>((kv_head * G + g) * kHeadDim + e)] * keys[j][static_cast<size_t>(e)];
        A[i][j] = std::max(A[i][j], d / std::sqrt(static_cast<double>(kHeadDim)));
      }
  return A;
}

// SnapKV (triattention.md §7): a = maxpool7( mean_w softmax(A[:, :-w_keys]) ), slots [0, n − w_keys).
inline std::vector<double> ref_snapkv(const std::vector<std::vector<double>>& A, int32_t n, int32_t w_keys) {
  const int32_t m = std::max(0, n - w_keys);
  std::vector<std::vector<double>> P(A.size(), std::vector<double>(static_cast<size_t>(m)));
  for (size_t i = 0; i < A.size(); ++i) {
    double mx = -INFINITY, sum = 0;
    for (int32_t j = 0; j < m; ++j) mx = std::max(mx, A[i][static_cast<size_t>(j)]);
    for (int32_t j = 0; j < m; ++j) sum += std::exp(A[i][static_cast<size_t>(j)] - mx);
    for (int32_t j = 0; j < m; ++j) P[i][static_cast<size_t>(j)] = std::exp(A[i][static_cast<size_t>(j)] - mx) / sum;
  }
  std::vector<double> mean(static_cast<size_t>(m), 0.0);
  for (const auto& row : P)
    for (int32_t j = 0; j < m; ++j) mean[static_cast<size_t>(j)] += row[static_cast<size_t>(j)] / static_cast<double>(P.size());
  std::vector<double> pooled(static_cast<size_t>(n), 0.0);  // window slots are protected anyway
  for (int32_t j = 0; j < m; ++j) {
    double best = -INFINITY;  // max_pool1d(kernel 7, padding 3): padding never wins
    for (int32_t x = j - 3; x <= j + 3; ++x)
      if (x >= 0 && x < m) best = std::max(best, mean[static_cast<size_t>(x)]);
    pooled[static_cast<size_t>(j)] = best;
  }
  return pooled;
}

// R-KV redundancy, literal cal_similarity (triattention.md §7, R-KV rkv/utils.py): over the keys
// [0, n_keys): Kn = K/‖K‖, C = Kn Knᵀ with zero diagonal; per row i, j* = the largest j with
// C[i,j] > 0.5, or 0 if there is none (`max(indices)` over a row of zeros), and C[i,j*] = 0;
// sim = softmax_j(mean_i C[i,j]).
inline std::vector<double> ref_rkv_similarity(const std::vector<std::vector<double>>& keys, int32_t n_keys,
                                       bool zero_first_if_none) {
  std::vector<std::vector<double>> kn(static_cast<size_t>(n_keys));
  for (int32_t j = 0; j < n_keys; ++j) {
    double ss = 0;
    for (double x : keys[static_cast<size_t>(j)]) ss += x * x;
    for (double x : keys[static_cast<size_t>(j)]) kn[static_cast<size_t>(j)].push_back(x / (std::sqrt(ss) + 1e-8));
  }
  std::vector<std::vector<double>> C(static_cast<size_t>(n_keys), std::vector<double>(static_cast<size_t>(n_keys), 0.0));
  for (int32_t i = 0; i < n_keys; ++i) {
    int32_t jstar = zero_first_if_none ? 0 : -1;
    for (int32_t j = 0; j < n_keys; ++j) {
      if (i == j) continue;
      double d = 0;
      for (int32_t e = 0; e < kHeadDim; ++e) d += kn[static_cast<size_t>(i)][static_cast<size_t>(e)] * kn[static_cast<size_t>(j)][static_cast<size_t>(e)];
      C[static_cast<size_t>(i)][static_cast<size_t>(j)] = d;
      if (d > 0.5) jstar = j;
    }
    if (jstar >= 0) C[static_cast<size_t>(i)][static_cast<size_t>(jstar)] = 0.0;
  }
  std::vector<double> col(static_cast<size_t>(n_keys), 0.0);
  for (int32_t i = 0; i < n_keys; ++i)
    for (int32_t j = 0; j < n_keys; ++j) col[static_cast<size_t>(j)] += C[static_cast<size_t>(i)][static_cast<size_t>(j)] / n_keys;
  double mx = -INFINITY, sum = 0;
  for (double x : col) mx = std::max(mx, x);
  for (double x : col) sum += std::exp(x - mx);
  std::vector<double> sim;
  for (double x : col) sim.push_back(std::exp(x - mx) / sum);
  return sim;
}

// R-KV final score (triattention.md §7 / policies.md §1.10): λ·snapkv − (1−λ)·sim[:, :-w], λ = 0.1.
// literal = true: similarity over ALL cached keys, then sliced (R-KV's `cal_similarity(K)[:, :-w]`).
inline std::vector<double> ref_rkv(const std::vector<std::vector<double>>& A, const std::vector<std::vector<double>>& keys,
                            int32_t w_keys, bool literal) {
  const auto n = static_cast<int32_t>(keys.size());
  const int32_t m = std::max(0, n - w_keys);
  std::vector<double> a = ref_snapkv(A, n, w_keys);
  std::vector<double> sim = literal ? ref_rkv_similarity(keys, n, true) : ref_rkv_similarity(keys, m, false);
  std::vector<double> out(static_cast<size_t>(n), 0.0);
  for (int32_t j = 0; j < m; ++j) out[static_cast<size_t>(j)] = 0.1 * a[static_cast<size_t>(j)] - 0.9 * sim[static_cast<size_t>(j)];
  return out;
}

// Per-stream SnapKV (rkv = false) or literal R-KV (rkv = true) reference scores from the last 8 queries.
inline std::vector<std::vector<double>> ref_window_streams(const ModelConfig& mc, const Queries& qf, const Snapshot& sn, bool rkv) {
  std::vector<std::vector<double>> out(sn.keys.size());
  for (int32_t l = 0; l < mc.n_layer; ++l)
    for (int32_t h = 0; h < mc.n_head_kv; ++h) {
      const size_t s = static_cast<size_t>(l * mc.n_head_kv + h);
      const auto A = ref_window_logits(mc, qf.last(l, 8), sn.keys[s], h);
      out[s] = rkv ? ref_rkv(A, sn.keys[s], 8, true) : ref_snapkv(A, static_cast<int32_t>(sn.keys[s].size()), 8);
    }
  return out;
}

// TOVA (policies.md §1.4): s_j = mean over all query heads of the layer of softmax(q_last·K/√d)_j,
// one score row per layer shared by its KV heads.
inline std::vector<std::vector<double>> ref_tova(const ModelConfig& mc, const Queries& qf, const Snapshot& sn) {
  const int32_t G = mc.n_head / mc.n_head_kv;
  std::vector<std::vector<double>> out(sn.keys.size());
  for (int32_t l = 0; l < mc.n_layer; ++l) {
    const auto q = qf.last(l, 1);
    const size_t n = sn.keys[static_cast<size_t>(l * mc.n_head_kv)].size();
    std::vector<double> avg(n, 0.0);
    for (int32_t hq = 0; hq < mc.n_head; ++hq) {
      const auto& keys = sn.keys[static_cast<size_t>(l * mc.n_head_kv + hq / G)];
      std::vector<double> logit(n);
      double mx = -INFINITY, sum = 0;
      for (size_t j = 0; j < n; ++j) {
        double d = 0;
        for (int32_t e = 0; e < kHeadDim; ++e) d += q[0][static_cast<size_t>(hq * kHeadDim + e)] * keys[j][static_cast<size_t>(e)];
        logit[j] = d / std::sqrt(static_cast<double>(kHeadDim));
        mx = std::max(mx, logit[j]);
      }
      for (double x : logit) sum += std::exp(x - mx);
      for (size_t j = 0; j < n; ++j) avg[j] += std::exp(logit[j] - mx) / sum / mc.n_head;
    }
    for (int32_t h = 0; h < mc.n_head_kv; ++h) out[static_cast<size_t>(l * mc.n_head_kv + h)] = avg;
  }
  return out;
}

// Ada-KV (policies.md §1.7) for one layer: heads share H·budget slots; each head first keeps its
// protected slots and its own top n_safe = max(1, int(0.2·budget)); the remaining room goes to the
// globally best remaining (head, slot) scores. Heads may hold different slot counts.
inline std::vector<std::vector<int32_t>> ref_ada(const std::vector<std::vector<double>>& score,
                                          const std::vector<std::vector<bool>>& prot, int32_t budget) {
  const size_t H = score.size();
  const int32_t n_safe = std::max(1, static_cast<int32_t>(0.2 * budget));
  std::vector<std::vector<int32_t>> keep(H);
  struct E {
    double s;
    size_t h;
    int32_t j;
  };
  std::vector<E> rest;
  int64_t left = static_cast<int64_t>(H) * budget;
  for (size_t h = 0; h < H; ++h) {
    std::vector<int32_t> cand;
    for (size_t j = 0; j < prot[h].size(); ++j) (prot[h][j] ? keep[h] : cand).push_back(static_cast<int32_t>(j));
    std::sort(cand.begin(), cand.end(), [&](int32_t a, int32_t b) {
      return score[h][static_cast<size_t>(a)] != score[h][static_cast<size_t>(b)] ? score[h][static_cast<size_t>(a)] > score[h][static_cast<size_t>(b)] : a > b;
    });
    for (size_t i = 0; i < cand.size(); ++i) {
      if (static_cast<int32_t>(i) < n_safe) keep[h].push_back(cand[i]);
      else rest.push_back({score[h][static_cast<size_t>(cand[i])], h, cand[i]});
    }
    left -= static_cast<int64_t>(keep[h].size());
  }
  std::sort(rest.begin(), rest.end(), [](const E& a, const E& b) { return a.s != b.s ? a.s > b.s : a.j > b.j; });
  for (int64_t i = 0; i < left && i < static_cast<int64_t>(rest.size()); ++i) keep[rest[static_cast<size_t>(i)].h].push_back(rest[static_cast<size_t>(i)].j);
  for (auto& k : keep) std::sort(k.begin(), k.end());
  return keep;
}

// Runs compress() and checks the generic properties (content/order, stats, pool invariants).
inline void compress_and_check(SequenceCompressor& comp, Seq& seq, const Snapshot& sn) {
  const CompressionStats before = comp.stats();
  comp.compress(seq.kv());
  EXPECT_TRUE(seq.check_content());
  expect_stats(seq, sn, before, comp.stats());
  EXPECT_EQ(check_pool(seq.kv().pool(), {&seq.kv()}), "");
}

inline std::vector<int32_t> uniform_budgets(const ModelConfig& mc, int32_t budget) {
  return std::vector<int32_t>(static_cast<size_t>(mc.n_layer * mc.n_head_kv), budget);
}
// A forward's bookkeeping for n new tokens without a model: prepare() (sizes the key-mass buffer) with
// an n-token batch item, then the append. Returns the item's key-mass pointer and stride (the
// attention kernel's output; null unless the policy needs key mass); ok = false if the pool is full.
struct PreparedAppend {
  float* key_mass = nullptr;
  int64_t key_mass_stride = 0;
  bool ok = false;
};
inline PreparedAppend prepared_append(SequenceCompressor& comp, Seq& seq, int32_t n) {
  const std::vector<int32_t> toks(static_cast<size_t>(n), 1);
  BatchItem item;
  item.tokens = toks;
  comp.prepare(seq.kv(), item);
  return {item.key_mass, item.key_mass_stride, seq.append(n)};
}

// Decode steps: one token appended and one query fed per step.
inline ::testing::AssertionResult decode_steps(Seq& seq, Queries& qf, SequenceCompressor& comp, int n) {
  for (int i = 0; i < n; ++i) {
    if (!seq.append(1)) return ::testing::AssertionFailure() << "pool exhausted at decode step " << i;
    qf.feed(comp, 1);
  }
  return ::testing::AssertionSuccess();
}

}  // namespace kvpack::compress_test
