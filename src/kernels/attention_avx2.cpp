// AVX2 page kernels of paged_attention (compiled with -mavx2 -mfma -mf16c; run only when the CPU has
// them). BF16 is widened by a 16-bit shift; Q8_0 pages are dequantised per page and tile (attention_impl.h).
// Same structure as the AVX-512 path with 8-lane vectors and 16 registers: QK with NR x SB
// accumulators (NR <= 4 rows), PV with RB x DB accumulators held across the page's slots. A head_dim that
// is not a multiple of 8 takes a masked (f32) or copied (f16) load for the last partial vector.
#include <immintrin.h>

#include <cstring>

#include "kernels/attention_impl.h"

namespace kvpack::kernels::attn_detail {
namespace {

alignas(32) constexpr int32_t kLaneIdx[8] = {0, 1, 2, 3, 4, 5, 6, 7};

inline __m256i lanes(int32_t k) {  // mask of the first k lanes, k in [1, 8]
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_load_si256(reinterpret_cast<const __m256i*>(kLaneIdx)));
}

inline __m256 cvtbf(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }

template <int KT>
inline __m256 load(const uint8_t* block, size_t idx) {
  if constexpr (KT == kElemF16)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2 * idx)));
  else if constexpr (KT == kElemBF16)
    return cvtbf(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2 * idx)));
  else
    return _mm256_loadu_ps(reinterpret_cast<const float*>(block) + idx);
}

// First `cnt` (1..7) elements, zeros after; never touches memory past them.
template <int KT>
inline __m256 load_part(const uint8_t* block, size_t idx, int32_t cnt) {
  if constexpr (KT != kElemF32) {
    alignas(16) uint16_t tmp[8] = {};
    std::memcpy(tmp, block + 2 * idx, 2 * static_cast<size_t>(cnt));
    const __m128i h = _mm_load_si128(reinterpret_cast<const __m128i*>(tmp));
    if constexpr (KT == kElemF16)
      return _mm256_cvtph_ps(h);
    else
      return cvtbf(h);
  } else {
    return _mm256_maskload_ps(reinterpret_cast<const float*>(block) + idx, lanes(cnt));
  }
}

// exp(x), relative error ~1e-7 (Cephes expf polynomial). x below ~-87.3 gives ~1e-38 rather than a
// smaller number or 0 (irrelevant after normalisation); NaN propagates.
inline __m256 exp_ps(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-87.3f), x);  // operand order: NaN in x is returned
  x = _mm256_min_ps(_mm256_set1_ps(88.3f), x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

inline float exp1(float x) { return _mm256_cvtss_f32(exp_ps(_mm256_set1_ps(x))); }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

template <int KT, int NR, int SB>
inline void qk_block(const uint8_t* K, int32_t hd, int32_t nfull, int32_t tail, int32_t j0, const float* qs,
                     int32_t hdp, float* sc, int32_t psp) {
  __m256 acc[NR][SB];
#pragma GCC unroll 4
  for (int i = 0; i < NR; ++i)
#pragma GCC unroll 4
    for (int s = 0; s < SB; ++s) acc[i][s] = _mm256_setzero_ps();
  for (int32_t v = 0; v < nfull; ++v) {
    __m256 kv[SB];
#pragma GCC unroll 4
    for (int s = 0; s < SB; ++s) kv[s] = load<KT>(K, static_cast<size_t>(j0 + s) * hd + 8 * v);
#pragma GCC unroll 4
    for (int i = 0; i < NR; ++i) {
      const __m256 q = _mm256_loadu_ps(qs + static_cast<size_t>(i) * hdp + 8 * v);
#pragma GCC unroll 4
      for (int s = 0; s < SB; ++s) acc[i][s] = _mm256_fmadd_ps(q, kv[s], acc[i][s]);
    }
  }
  if (tail) {
    __m256 kv[SB];
#pragma GCC unroll 4
    for (int s = 0; s < SB; ++s) kv[s] = load_part<KT>(K, static_cast<size_t>(j0 + s) * hd + 8 * nfull, tail);
#pragma GCC unroll 4
    for (int i = 0; i < NR; ++i) {
      const __m256 q = _mm256_loadu_ps(qs + static_cast<size_t>(i) * hdp + 8 * nfull);
#pragma GCC unroll 4
      for (int s = 0; s < SB; ++s) acc[i][s] = _mm256_fmadd_ps(q, kv[s], acc[i][s]);
    }
  }
  constexpr int kN = NR * SB;
  alignas(16) float sums[kN + 3];
  int k = 0;
#pragma GCC unroll 4
  for (; k + 4 <= kN; k += 4)
    _mm_store_ps(sums + k, hsum4(acc[k / SB][k % SB], acc[(k + 1) / SB][(k + 1) % SB], acc[(k + 2) / SB][(k + 2) % SB],
                                 acc[(k + 3) / SB][(k + 3) % SB]));
  for (; k < kN; ++k) sums[k] = hsum(acc[k / SB][k % SB]);
#pragma GCC unroll 4
  for (int i = 0; i < NR; ++i)
#pragma GCC unroll 4
    for (int s = 0; s < SB; ++s) sc[static_cast<size_t>(i) * psp + j0 + s] = sums[i * SB + s];
}

template <int KT, int NR>
void qk_rows(const uint8_t* K, int32_t n, int32_t hd, const float* qs, int32_t hdp, float* sc, int32_t psp) {
  constexpr int SB = NR <= 2 ? 4 : 2;  // <= 8 accumulators + SB K vectors + 1 q vector in 16 ymm
  const int32_t nfull = hd / 8, tail = hd % 8;
  int32_t j = 0;
  for (; j + SB <= n; j += SB) qk_block<KT, NR, SB>(K, hd, nfull, tail, j, qs, hdp, sc, psp);
  for (; j < n; ++j) qk_block<KT, NR, 1>(K, hd, nfull, tail, j, qs, hdp, sc, psp);
}

template <int KT>
void qk_t(const uint8_t* K, int32_t n, int32_t hd, const float* qs, int32_t hdp, int32_t R, float* scores,
          int32_t psp) {
  for (int32_t r0 = 0; r0 < R; r0 += 4) {
    const float* q = qs + static_cast<size_t>(r0) * hdp;
    float* sc = scores + static_cast<size_t>(r0) * psp;
    switch (imin(4, R - r0)) {
      case 1:
        qk_rows<KT, 1>(K, n, hd, q, hdp, sc, psp);
        break;
      case 2:
        qk_rows<KT, 2>(K, n, hd, q, hdp, sc, psp);
        break;
      case 3:
        qk_rows<KT, 3>(K, n, hd, q, hdp, sc, psp);
        break;
      default:
        qk_rows<KT, 4>(K, n, hd, q, hdp, sc, psp);
        break;
    }
  }
}

template <int KT, int RB, int DB>
inline void pv_block(const uint8_t* V, int32_t hd, int32_t v0, int32_t nvec, int32_t tail, const int32_t* nv,
                     int32_t jfull, int32_t jmax, const float* p, int32_t psp, const float* alpha, float* acc,
                     int32_t hdp) {
  __m256 a[RB][DB];
#pragma GCC unroll 4
  for (int i = 0; i < RB; ++i) {
    const __m256 al = _mm256_set1_ps(alpha[i]);
#pragma GCC unroll 4
    for (int b = 0; b < DB; ++b)
      a[i][b] = _mm256_mul_ps(_mm256_loadu_ps(acc + static_cast<size_t>(i) * hdp + 8 * (v0 + b)), al);
  }
  const bool has_tail = tail != 0 && v0 + DB == nvec;  // the block's last vector is partial
  for (int32_t j = 0; j < jmax; ++j) {
    __m256 vv[DB];
#pragma GCC unroll 4
    for (int b = 0; b < DB; ++b) {
      const size_t idx = static_cast<size_t>(j) * hd + 8 * (v0 + b);
      vv[b] = (b == DB - 1 && has_tail) ? load_part<KT>(V, idx, tail) : load<KT>(V, idx);
    }
#pragma GCC unroll 4
    for (int i = 0; i < RB; ++i) {
      if (j >= jfull && j >= nv[i]) continue;  // causal edge: row i does not see slot j
      const __m256 pb = _mm256_set1_ps(p[static_cast<size_t>(i) * psp + j]);
#pragma GCC unroll 4
      for (int b = 0; b < DB; ++b) a[i][b] = _mm256_fmadd_ps(pb, vv[b], a[i][b]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < RB; ++i)
#pragma GCC unroll 4
    for (int b = 0; b < DB; ++b) _mm256_storeu_ps(acc + static_cast<size_t>(i) * hdp + 8 * (v0 + b), a[i][b]);
}

template <int KT, int RB, int DB>
void pv_rows(const uint8_t* V, int32_t n, int32_t hd, int32_t r0, int32_t G, int32_t rel0, const float* p, int32_t psp,
             const float* alpha, float* acc, int32_t hdp) {
  int32_t nv[RB];
  int32_t jfull = n, jmax = 0;
  for (int i = 0; i < RB; ++i) {
    nv[i] = row_valid(rel0, r0 + i, G, n);
    jfull = imin(jfull, nv[i]);
    jmax = imax(jmax, nv[i]);
  }
  const int32_t nvec = (hd + 7) / 8, tail = hd % 8;
  p += static_cast<size_t>(r0) * psp;
  alpha += r0;
  acc += static_cast<size_t>(r0) * hdp;
  int32_t v0 = 0;
  for (; v0 + DB <= nvec; v0 += DB)
    pv_block<KT, RB, DB>(V, hd, v0, nvec, tail, nv, jfull, jmax, p, psp, alpha, acc, hdp);
  for (; v0 < nvec; ++v0) pv_block<KT, RB, 1>(V, hd, v0, nvec, tail, nv, jfull, jmax, p, psp, alpha, acc, hdp);
}

template <int KT>
void pv_t(const uint8_t* V, int32_t n, int32_t hd, const float* p, int32_t psp, const float* alpha, float* acc,
          int32_t hdp, int32_t R, int32_t G, int32_t rel0) {
  int32_t r0 = 0;
  for (; r0 + 4 <= R; r0 += 4) pv_rows<KT, 4, 2>(V, n, hd, r0, G, rel0, p, psp, alpha, acc, hdp);
  if (r0 + 2 <= R) {
    pv_rows<KT, 2, 4>(V, n, hd, r0, G, rel0, p, psp, alpha, acc, hdp);
    r0 += 2;
  }
  if (r0 < R) pv_rows<KT, 1, 4>(V, n, hd, r0, G, rel0, p, psp, alpha, acc, hdp);
}

struct Avx2Kern {
  static constexpr bool kDirectQ8 = false;  // Q8_0 pages go through dequant_q8 (attention_impl.h)
  // n rows of head_dim / 32 Q8_0 blocks -> f32 rows (stride hd): value = d * q, as ggml dequantises.
  static void dequant_q8(const uint8_t* block, int32_t n, int32_t hd, float* out) {
    const size_t nb = static_cast<size_t>(n) * (hd / 32);
    for (size_t b = 0; b < nb; ++b, block += 34, out += 32) {
      uint16_t dbits;
      std::memcpy(&dbits, block, 2);
      const __m256 d = _mm256_set1_ps(_cvtsh_ss(dbits));
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + 2 + 8 * c));
        _mm256_storeu_ps(out + 8 * c, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8))));
      }
    }
  }

  static void qk(const uint8_t* kblock, int kind, int32_t n, int32_t hd, const float* qs, int32_t hdp, int32_t R,
                 float* scores, int32_t psp, float*) {
    if (kind == kElemF16)
      qk_t<kElemF16>(kblock, n, hd, qs, hdp, R, scores, psp);
    else if (kind == kElemBF16)
      qk_t<kElemBF16>(kblock, n, hd, qs, hdp, R, scores, psp);
    else
      qk_t<kElemF32>(kblock, n, hd, qs, hdp, R, scores, psp);
  }

  static void softmax(float* scores, int32_t psp, int32_t n, int32_t R, int32_t G, int32_t rel0, float* m, float* l,
                      float* alpha) {
    for (int32_t r = 0; r < R; ++r) {
      const int32_t nv = row_valid(rel0, r, G, n);
      float* s = scores + static_cast<size_t>(r) * psp;
      alpha[r] = 1.0f;
      if (nv == 0) continue;
      // Lanes past nv are set to -inf (rows are padded to 16 floats, so whole vectors stay in the row).
      __m256 mx = _mm256_set1_ps(m[r]);
      const __m256 ninf = _mm256_set1_ps(-__builtin_inff());
      for (int32_t c = 0; c < nv; c += 8) {
        __m256 x = _mm256_loadu_ps(s + c);
        if (nv - c < 8) x = _mm256_blendv_ps(ninf, x, _mm256_castsi256_ps(lanes(nv - c)));
        mx = _mm256_max_ps(mx, x);
      }
      const float mnew = hmax(mx);
      if (mnew == -__builtin_inff()) {  // every visible score is -inf: no weight
        for (int32_t c = 0; c < nv; c += 8) _mm256_storeu_ps(s + c, _mm256_setzero_ps());
        continue;
      }
      const __m256 mv = _mm256_set1_ps(mnew);
      __m256 sum = _mm256_setzero_ps();
      for (int32_t c = 0; c < nv; c += 8) {
        __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + c), mv));
        if (nv - c < 8) e = _mm256_and_ps(e, _mm256_castsi256_ps(lanes(nv - c)));
        _mm256_storeu_ps(s + c, e);
        sum = _mm256_add_ps(sum, e);
      }
      const float a = m[r] == mnew ? 1.0f : exp1(m[r] - mnew);
      l[r] = l[r] * a + hsum(sum);
      m[r] = mnew;
      alpha[r] = a;
    }
  }

  static void pv(const uint8_t* vblock, int kind, int32_t n, int32_t hd, const float* p, int32_t psp,
                 const float* alpha, float* acc, int32_t hdp, int32_t R, int32_t G, int32_t rel0, float*) {
    if (kind == kElemF16)
      pv_t<kElemF16>(vblock, n, hd, p, psp, alpha, acc, hdp, R, G, rel0);
    else if (kind == kElemBF16)
      pv_t<kElemBF16>(vblock, n, hd, p, psp, alpha, acc, hdp, R, G, rel0);
    else
      pv_t<kElemF32>(vblock, n, hd, p, psp, alpha, acc, hdp, R, G, rel0);
  }

  static void mass(const float* scores, int32_t psp, int32_t n, int32_t R, int32_t G, int32_t rel0, const float* m,
                   const float* l, float* key_mass) {
    alignas(32) float col[8];
    for (int32_t c = 0; c < n; c += 8) {
      __m256 acc = _mm256_setzero_ps();
      for (int32_t r = 0; r < R; ++r) {
        const int32_t nv = row_valid(rel0, r, G, n);
        if (nv <= c || !(l[r] > 0.0f)) continue;
        __m256 e =
            exp_ps(_mm256_sub_ps(_mm256_loadu_ps(scores + static_cast<size_t>(r) * psp + c), _mm256_set1_ps(m[r])));
        if (nv - c < 8) e = _mm256_and_ps(e, _mm256_castsi256_ps(lanes(nv - c)));
        acc = _mm256_fmadd_ps(e, _mm256_set1_ps(1.0f / l[r]), acc);
      }
      _mm256_store_ps(col, acc);
      const int32_t cnt = imin(8, n - c);
      for (int32_t j = 0; j < cnt; ++j) key_mass[c + j] += col[j];
    }
  }
};

}  // namespace

void paged_attention_avx2(const KvStreamView& kv, const AttentionArgs& args) { run<Avx2Kern>(kv, args); }

}  // namespace kvpack::kernels::attn_detail
