// GCC 12's AVX-512 intrinsic headers trip -W(maybe-)uninitialized on their internal _mm512_undefined_*
// temporaries (GCC bug 105593, fixed in 13); the pragma must precede the include (as in the kernels).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include "compress/scoring.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/attention.h"
#include "kernels/cpu_features.h"

namespace kvpack::compress {
namespace {

// Every key/value read of the policies goes through here: any KV type (F32/F16/BF16/Q8_0) to f32.
void load_row(const uint8_t* src, DType t, int32_t n, float* out) { kernels::kv_decode_row(src, t, n, out); }

// TriAttention's per-key work for the common production layout — F16 keys, NeoX rotary pairs (i, i + F),
// F a multiple of 16 — on AVX-512: the key's two halves are the real and imaginary band vectors, so one
// row is 2F/16 vcvtph2ps loads, F/16 vsqrtps and 3 FMAs per band vector per query head. The scalar path
// (one half-float conversion and one sqrt per element) measured ~350 ns per key at head_dim 128, most of
// a compaction event's time. Intrinsics only (no inline std code) in this target-specific function.
__attribute__((target("avx512f,avx512vl,f16c,fma"))) void tri_scores_f16_neox_avx512(
    const uint16_t* key, int32_t F, int32_t G, const float* u_re, const float* u_im, const float* wn, float* s) {
  __m512 acc[8];  // G <= 8 per call (the caller loops over larger groups)
  for (int32_t g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
  for (int32_t f = 0; f < F; f += 16) {
    const __m512 kr = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + f)));
    const __m512 ki = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + F + f)));
    const __m512 mag = _mm512_sqrt_ps(_mm512_fmadd_ps(kr, kr, _mm512_mul_ps(ki, ki)));
    for (int32_t g = 0; g < G; ++g) {
      const size_t o = static_cast<size_t>(g) * F + f;
      __m512 a = _mm512_fmadd_ps(kr, _mm512_loadu_ps(u_re + o), acc[g]);
      a = _mm512_fmadd_ps(ki, _mm512_loadu_ps(u_im + o), a);
      acc[g] = _mm512_fmadd_ps(mag, _mm512_loadu_ps(wn + o), a);
    }
  }
  for (int32_t g = 0; g < G; ++g) s[g] = _mm512_reduce_add_ps(acc[g]);
}

// The kernels' dispatcher decides (KVPACK_ISA=scalar forces the portable path here too).
bool use_avx512() { return kernels::selected_isa() == kernels::Isa::Avx512; }

}  // namespace

void load_key(const kv::SequenceKv& kv, int32_t stream, int32_t slot, float* out) {
  const auto& cfg = kv.pool().config();
  load_row(const_cast<kv::SequenceKv&>(kv).k_slot(stream, slot), cfg.kv_type, cfg.head_dim, out);
}

void load_value(const kv::SequenceKv& kv, int32_t stream, int32_t slot, float* out) {
  const auto& cfg = kv.pool().config();
  load_row(const_cast<kv::SequenceKv&>(kv).v_slot(stream, slot), cfg.kv_type, cfg.head_dim, out);
}

void score_knorm(const kv::SequenceKv& kv, int32_t stream, std::span<float> out) {
  const int32_t hd = kv.pool().config().head_dim;
  std::vector<float> k(static_cast<size_t>(hd));
  for (int32_t j = 0; j < kv.n_slots(stream); ++j) {
    load_key(kv, stream, j, k.data());
    double ss = 0;
    for (float v : k) ss += static_cast<double>(v) * v;
    out[static_cast<size_t>(j)] = static_cast<float>(-std::sqrt(ss));
  }
}

void tri_offset_table(const ModelConfig& c, int64_t t, std::vector<float>& C, std::vector<float>& S) {
  const int32_t F = c.rope_dims / 2;
  C.assign(static_cast<size_t>(F), 0.0f);
  S.assign(static_cast<size_t>(F), 0.0f);
  constexpr int kOffsets = 17;  // 1, 2, 4, ..., 65536
  for (int32_t f = 0; f < F; ++f) {
    const double omega = std::pow(static_cast<double>(c.rope_theta), -2.0 * f / c.rope_dims) * c.rope_freq_scale;
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

void score_triattention_group(const kv::SequenceKv& kv, const ModelConfig& c, const QueryStats& qs, int32_t layer,
                              int32_t kv_head, std::span<const float> C, std::span<const float> S, std::span<float> out) {
  const int32_t F = qs.n_bands, G = c.group();
  const int32_t stream = kv.stream_index(layer, kv_head);
  const int32_t n = kv.n_slots(stream);
  // Score(k) = Σ_f kr·(q̄r C − q̄i S) + ki·(q̄i C + q̄r S) + (E|q_f| − |q̄_f|)·|k_f|
  // (the mean over offsets of Re(q̄_f conj(k̃_f) e^{iω_f(t+δ)}) is linear in k̃, so it folds into u).
  std::vector<float> u_re(static_cast<size_t>(G) * F), u_im(static_cast<size_t>(G) * F), wn(static_cast<size_t>(G) * F);
  for (int32_t g = 0; g < G; ++g)
    for (int32_t f = 0; f < F; ++f) {
      const size_t i = qs.index(layer, kv_head * G + g, f);
      const size_t o = static_cast<size_t>(g) * F + f;
      const float qr = qs.mean_re[i], qi = qs.mean_im[i];
      u_re[o] = qr * C[static_cast<size_t>(f)] - qi * S[static_cast<size_t>(f)];
      u_im[o] = qi * C[static_cast<size_t>(f)] + qr * S[static_cast<size_t>(f)];
      wn[o] = qs.abs_mean[i] - std::sqrt(qr * qr + qi * qi);
    }
  const auto& pc = kv.pool().config();
  if (pc.kv_type == DType::F16 && c.rope_neox && F % 16 == 0 && G <= 8 && 2 * F <= pc.head_dim && use_avx512()) {
    float sg[8];
    for (int32_t j = 0; j < n; ++j) {
      const auto* key = reinterpret_cast<const uint16_t*>(const_cast<kv::SequenceKv&>(kv).k_slot(stream, j));
      tri_scores_f16_neox_avx512(key, F, G, u_re.data(), u_im.data(), wn.data(), sg);
      for (int32_t g = 0; g < G; ++g) out[static_cast<size_t>(g) * n + j] = sg[g];
    }
    return;
  }
  std::vector<float> k(static_cast<size_t>(c.head_dim)), kr(static_cast<size_t>(F)), ki(static_cast<size_t>(F)), mag(static_cast<size_t>(F));
  for (int32_t j = 0; j < n; ++j) {
    load_key(kv, stream, j, k.data());
    for (int32_t f = 0; f < F; ++f) {
      kr[static_cast<size_t>(f)] = k[static_cast<size_t>(band_re(f, F, c.rope_neox))];
      ki[static_cast<size_t>(f)] = k[static_cast<size_t>(band_im(f, F, c.rope_neox))];
      mag[static_cast<size_t>(f)] = std::sqrt(kr[static_cast<size_t>(f)] * kr[static_cast<size_t>(f)] + ki[static_cast<size_t>(f)] * ki[static_cast<size_t>(f)]);
    }
    for (int32_t g = 0; g < G; ++g) {
      const float* ur = u_re.data() + static_cast<size_t>(g) * F;
      const float* ui = u_im.data() + static_cast<size_t>(g) * F;
      const float* w = wn.data() + static_cast<size_t>(g) * F;
      float s = 0;  // f32 accumulation over <= 64 bands; vectorises
      for (int32_t f = 0; f < F; ++f) s += kr[static_cast<size_t>(f)] * ur[f] + ki[static_cast<size_t>(f)] * ui[f] + w[f] * mag[static_cast<size_t>(f)];
      out[static_cast<size_t>(g) * n + j] = s;
    }
  }
}

void window_logits(const kv::SequenceKv& kv, const ModelConfig& c, int32_t layer, int32_t kv_head,
                   std::span<const float> queries, int32_t w, std::vector<float>& logits) {
  const int32_t stream = kv.stream_index(layer, kv_head);
  const int32_t n = kv.n_slots(stream), hd = c.head_dim, G = c.group();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  logits.assign(static_cast<size_t>(w) * n, -INFINITY);
  std::vector<float> k(static_cast<size_t>(hd));
  for (int32_t j = 0; j < n; ++j) {
    if (kv.is_hole(stream, j)) continue;  // never attended: stays -inf, gets no probability
    load_key(kv, stream, j, k.data());
    for (int32_t i = 0; i < w; ++i)
      for (int32_t g = 0; g < G; ++g) {
        const float* q = queries.data() + static_cast<size_t>(i) * c.q_dim() + static_cast<size_t>(kv_head * G + g) * hd;
        float d = 0;
        for (int32_t e = 0; e < hd; ++e) d += q[e] * k[static_cast<size_t>(e)];
        float& dst = logits[static_cast<size_t>(i) * n + j];
        dst = std::max(dst, d * scale);
      }
  }
}

void snapkv_from_logits(std::span<const float> logits, int32_t w, int32_t n, int32_t w_keys, std::span<float> out) {
  const int32_t m = std::max(0, n - w_keys);
  std::vector<double> mean(static_cast<size_t>(m), 0.0);
  for (int32_t i = 0; i < w; ++i) {
    const float* row = logits.data() + static_cast<size_t>(i) * n;
    float mx = -INFINITY;
    for (int32_t j = 0; j < m; ++j) mx = std::max(mx, row[j]);
    double sum = 0;
    for (int32_t j = 0; j < m; ++j) sum += std::exp(static_cast<double>(row[j] - mx));
    for (int32_t j = 0; j < m; ++j) mean[static_cast<size_t>(j)] += std::exp(static_cast<double>(row[j] - mx)) / sum / w;
  }
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

void rkv_redundancy(const kv::SequenceKv& kv, int32_t stream, int32_t n, int32_t w_keys, std::span<float> out) {
  // As the reference (triattention repo, baselines/utils.py cal_similarity, sliced [:, :-w]): the
  // similarity matrix covers ALL n keys (window rows count in the column means, the softmax runs over
  // all n columns); each row's newest near-duplicate (cos > 0.5) is exempted, and a row without one
  // zeroes column 0 (the reference takes max() of an empty index set as 0). Holes count as zero keys.
  const int32_t m = std::max(0, n - w_keys);
  const int32_t hd = kv.pool().config().head_dim;
  std::vector<float> keys(static_cast<size_t>(n) * hd, 0.0f);
  for (int32_t j = 0; j < n; ++j) {
    if (kv.is_hole(stream, j)) continue;
    float* k = keys.data() + static_cast<size_t>(j) * hd;
    load_key(kv, stream, j, k);
    double ss = 0;
    for (int32_t e = 0; e < hd; ++e) ss += static_cast<double>(k[e]) * k[e];
    const float inv = ss > 0 ? static_cast<float>(1.0 / std::sqrt(ss)) : 0.0f;
    for (int32_t e = 0; e < hd; ++e) k[e] *= inv;
  }
  std::vector<double> col(static_cast<size_t>(n), 0.0);
  std::vector<float> row(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    const float* ki = keys.data() + static_cast<size_t>(i) * hd;
    int32_t newest = 0;
    for (int32_t j = 0; j < n; ++j) {
      float d = 0;
      if (j != i) {
        const float* kj = keys.data() + static_cast<size_t>(j) * hd;
        for (int32_t e = 0; e < hd; ++e) d += ki[e] * kj[e];
        if (d > 0.5f) newest = j;
      }
      row[static_cast<size_t>(j)] = d;
    }
    row[static_cast<size_t>(newest)] = 0.0f;
    for (int32_t j = 0; j < n; ++j) col[static_cast<size_t>(j)] += row[static_cast<size_t>(j)];
  }
  double mx = -1e300;
  for (int32_t j = 0; j < n; ++j) mx = std::max(mx, col[static_cast<size_t>(j)] / n);
  double sum = 0;
  for (int32_t j = 0; j < n; ++j) sum += std::exp(col[static_cast<size_t>(j)] / n - mx);
  for (int32_t j = 0; j < n; ++j)
    out[static_cast<size_t>(j)] = j < m ? static_cast<float>(std::exp(col[static_cast<size_t>(j)] / n - mx) / sum) : 0.0f;
}

}  // namespace kvpack::compress
