// AVX-512 page kernels of paged_attention (compiled with -mavx512f/bw/vl/dq -mfma -mf16c; run only when
// the CPU has them). F16 pages are widened in registers with vcvtph2ps, BF16 by a 16-bit shift, Q8_0 by a
// sign extension and its block scale (load_kv; the AVX2 and scalar paths dequantise a page to a scratch
// tile first, attention_impl.h). Any head_dim works (the last partial vector of
// a row uses masked loads, which never touch the masked-off elements).
//
// QK: for each slot block (SB slots) and row block (NR <= 8 rows), NR x SB zmm accumulators over head_dim;
//     each K vector is loaded/converted once per row block; results are reduced 4 at a time.
// PV: for each row block (RB rows) and head_dim block (DB vectors), RB x DB zmm accumulators stay in
//     registers across the page's slots; each V vector is loaded/converted once per row block.
// QK of Q8_0 keys on a CPU with AVX-512 VNNI (Avx512Kern<true>): the tile's query rows are quantised once
//     per 32 elements (quantise_query_rows, the spec is attention_quantise_query_row in attention.h), and
//     each 32-element block of a key is one vpdpbusd per row: 32 int8 products summed exactly in int32,
//     then scaled by d_k * d_q in f32. Widening int8 to f32 cost three instructions per 16 elements per
//     key (sign extension, conversion, scale) before two FMAs; the integer dot product does the 32
//     products of a block in one (measured in docs/performance.md §1, "Q8_0 KV").
// GCC 12's AVX-512 intrinsics (_mm512_castps512_ps256, _mm512_scalef_ps, ...) pass _mm512_undefined_*()
// as the pass-through operand, which trips -Wuninitialized after inlining (a GCC header issue).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstring>

#include "kernels/attention_impl.h"
#include "kernels/cpu_features.h"
#include "kernels/exp_avx512.h"

namespace kvpack::kernels::attn_detail {
namespace {

inline __m512 cvtph(__m256i h) { return _mm512_cvtph_ps(h); }
inline __m256 hi256(__m512 v) { return _mm512_extractf32x8_ps(v, 1); }

inline float reduce_add(__m512 v) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), hi256(v));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline float reduce_max(__m512 v) {
  const __m256 s8 = _mm256_max_ps(_mm512_castps512_ps256(v), hi256(v));
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

inline __mmask16 lanes(int32_t k) {  // first min(k, 16) lanes (k >= 0)
  return k >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << k) - 1u);
}

inline __m512 cvtbf(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

template <int KT>
inline __m512 load(const uint8_t* block, size_t idx) {
  if constexpr (KT == kElemF16)
    return cvtph(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2 * idx)));
  else if constexpr (KT == kElemBF16)
    return cvtbf(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2 * idx)));
  else
    return _mm512_loadu_ps(reinterpret_cast<const float*>(block) + idx);
}

template <int KT>
inline __m512 load(const uint8_t* block, size_t idx, __mmask16 m) {
  if constexpr (KT == kElemF16)
    return cvtph(_mm256_maskz_loadu_epi16(m, block + 2 * idx));
  else if constexpr (KT == kElemBF16)
    return cvtbf(_mm256_maskz_loadu_epi16(m, block + 2 * idx));
  else
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(block) + idx);
}

// Element `col` .. col + 15 of K/V row `row` (row stride hd elements, or hd / 32 Q8_0 blocks of 34 bytes).
// Q8_0 is dequantised in registers, d * q exactly as dequant_q8 writes it (the same products: outputs are
// bit for bit those of the scratch-tile path), so a page is read once and never stored back as f32.
template <int KT>
inline __m512 load_kv(const uint8_t* block, int32_t row, int32_t col, int32_t hd) {
  if constexpr (KT == kElemQ8) {
    const uint8_t* b = block + static_cast<size_t>(row) * static_cast<size_t>(hd / 32) * 34 + static_cast<size_t>(col / 32) * 34;
    uint16_t dbits;
    std::memcpy(&dbits, b, 2);
    const __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + col % 32)));
    return _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(dbits)), _mm512_cvtepi32_ps(q));
  } else {
    return load<KT>(block, static_cast<size_t>(row) * hd + col);
  }
}

// Masked: Q8_0 rows have head_dim % 32 == 0, so their vectors are always whole.
template <int KT>
inline __m512 load_kv(const uint8_t* block, int32_t row, int32_t col, int32_t hd, __mmask16 m) {
  if constexpr (KT == kElemQ8)
    return load_kv<KT>(block, row, col, hd);
  else
    return load<KT>(block, static_cast<size_t>(row) * hd + col, m);
}

inline float exp1(float x) { return _mm512_cvtss_f32(exp_ps(_mm512_set1_ps(x))); }

// Horizontal sums of four vectors -> {sum a, sum b, sum c, sum d}.
inline __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), hi256(a));
  const __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), hi256(b));
  const __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), hi256(c));
  const __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), hi256(d));
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a8, b8), _mm256_hadd_ps(c8, d8));
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// Scores of NR rows (qs rows, stride hdp) against slots [j0, j0 + SB) of the K block.
template <int KT, int NR, int SB>
inline void qk_block(const uint8_t* K, int32_t hd, int32_t nfull, __mmask16 tail, int32_t j0, const float* qs,
                     int32_t hdp, float* sc, int32_t psp) {
  __m512 acc[NR][SB];
#pragma GCC unroll 8
  for (int i = 0; i < NR; ++i)
#pragma GCC unroll 4
    for (int s = 0; s < SB; ++s) acc[i][s] = _mm512_setzero_ps();
  for (int32_t v = 0; v < nfull; ++v) {
    __m512 kv[SB];
#pragma GCC unroll 4
    for (int s = 0; s < SB; ++s) kv[s] = load_kv<KT>(K, j0 + s, 16 * v, hd);
#pragma GCC unroll 8
    for (int i = 0; i < NR; ++i) {
      const __m512 q = _mm512_loadu_ps(qs + static_cast<size_t>(i) * hdp + 16 * v);
#pragma GCC unroll 4
      for (int s = 0; s < SB; ++s) acc[i][s] = _mm512_fmadd_ps(q, kv[s], acc[i][s]);
    }
  }
  if (tail) {
    __m512 kv[SB];
#pragma GCC unroll 4
    for (int s = 0; s < SB; ++s) kv[s] = load_kv<KT>(K, j0 + s, 16 * nfull, hd, tail);
#pragma GCC unroll 8
    for (int i = 0; i < NR; ++i) {
      const __m512 q = _mm512_loadu_ps(qs + static_cast<size_t>(i) * hdp + 16 * nfull);
#pragma GCC unroll 4
      for (int s = 0; s < SB; ++s) acc[i][s] = _mm512_fmadd_ps(q, kv[s], acc[i][s]);
    }
  }
  constexpr int kN = NR * SB;
  alignas(16) float sums[kN + 3];
  int k = 0;
#pragma GCC unroll 8
  for (; k + 4 <= kN; k += 4)
    _mm_store_ps(sums + k, hsum4(acc[k / SB][k % SB], acc[(k + 1) / SB][(k + 1) % SB], acc[(k + 2) / SB][(k + 2) % SB],
                                 acc[(k + 3) / SB][(k + 3) % SB]));
  for (; k < kN; ++k) sums[k] = reduce_add(acc[k / SB][k % SB]);
#pragma GCC unroll 8
  for (int i = 0; i < NR; ++i)
#pragma GCC unroll 4
    for (int s = 0; s < SB; ++s) sc[static_cast<size_t>(i) * psp + j0 + s] = sums[i * SB + s];
}

template <int KT, int NR>
void qk_rows(const uint8_t* K, int32_t n, int32_t hd, const float* qs, int32_t hdp, float* sc, int32_t psp) {
  constexpr int SB = NR <= 4 ? 4 : 2;  // <= 16 accumulators + SB K vectors + 1 q vector in 32 zmm
  const int32_t nfull = hd / 16;
  const __mmask16 tail = static_cast<__mmask16>(hd % 16 ? lanes(hd % 16) : 0);
  int32_t j = 0;
  for (; j + SB <= n; j += SB) qk_block<KT, NR, SB>(K, hd, nfull, tail, j, qs, hdp, sc, psp);
  for (; j < n; ++j) qk_block<KT, NR, 1>(K, hd, nfull, tail, j, qs, hdp, sc, psp);
}

template <int KT>
void qk_t(const uint8_t* K, int32_t n, int32_t hd, const float* qs, int32_t hdp, int32_t R, float* scores,
          int32_t psp) {
  for (int32_t r0 = 0; r0 < R; r0 += 8) {
    const float* q = qs + static_cast<size_t>(r0) * hdp;
    float* sc = scores + static_cast<size_t>(r0) * psp;
    switch (imin(8, R - r0)) {
      case 1:
        qk_rows<KT, 1>(K, n, hd, q, hdp, sc, psp);
        break;
      case 2:
        qk_rows<KT, 2>(K, n, hd, q, hdp, sc, psp);
        break;
      case 3:
        qk_rows<KT, 3>(K, n, hd, q, hdp, sc, psp);
        break;
      case 4:
        qk_rows<KT, 4>(K, n, hd, q, hdp, sc, psp);
        break;
      case 5:
        qk_rows<KT, 5>(K, n, hd, q, hdp, sc, psp);
        break;
      case 6:
        qk_rows<KT, 6>(K, n, hd, q, hdp, sc, psp);
        break;
      case 7:
        qk_rows<KT, 7>(K, n, hd, q, hdp, sc, psp);
        break;
      default:
        qk_rows<KT, 8>(K, n, hd, q, hdp, sc, psp);
        break;
    }
  }
}

// The accumulator vectors [v0, v0 + DB) of RB rows (stride hdp), rescaled by the step's alpha; and back.
template <int RB, int DB>
__attribute__((always_inline)) inline void load_acc(__m512 (&a)[RB][DB], const float* acc, int32_t hdp, int32_t v0,
                                                    const float* alpha) {
#pragma GCC unroll 8
  for (int i = 0; i < RB; ++i) {
    const __m512 al = _mm512_set1_ps(alpha[i]);
#pragma GCC unroll 4
    for (int b = 0; b < DB; ++b)
      a[i][b] = _mm512_mul_ps(_mm512_loadu_ps(acc + static_cast<size_t>(i) * hdp + 16 * (v0 + b)), al);
  }
}

template <int RB, int DB>
__attribute__((always_inline)) inline void store_acc(const __m512 (&a)[RB][DB], float* acc, int32_t hdp, int32_t v0) {
#pragma GCC unroll 8
  for (int i = 0; i < RB; ++i)
#pragma GCC unroll 4
    for (int b = 0; b < DB; ++b) _mm512_storeu_ps(acc + static_cast<size_t>(i) * hdp + 16 * (v0 + b), a[i][b]);
}

// Causal limits of RB rows from r0 in a page of n slots: each row's visible slots, the slots every row sees
// (jfull) and those any row sees (jmax).
template <int RB>
struct RowLimits {
  int32_t nv[RB];
  int32_t jfull, jmax;
  RowLimits(int32_t rel0, int32_t r0, int32_t G, int32_t n) : jfull(n), jmax(0) {
    for (int i = 0; i < RB; ++i) {
      nv[i] = row_valid(rel0, r0 + i, G, n);
      jfull = imin(jfull, nv[i]);
      jmax = imax(jmax, nv[i]);
    }
  }
};

// acc[i][v0 .. v0+DB vectors] = acc * alpha[i] + sum_{j < nv[i]} p[i][j] * V[j][...] for RB rows.
template <int KT, int RB, int DB>
inline void pv_block(const uint8_t* V, int32_t hd, int32_t v0, int32_t nvec, __mmask16 tail, const int32_t* nv,
                     int32_t jfull, int32_t jmax, const float* p, int32_t psp, const float* alpha, float* acc,
                     int32_t hdp) {
  __mmask16 mk[DB];
#pragma GCC unroll 4
  for (int b = 0; b < DB; ++b) mk[b] = (tail && v0 + b == nvec - 1) ? tail : static_cast<__mmask16>(0xFFFF);
  __m512 a[RB][DB];
  load_acc<RB, DB>(a, acc, hdp, v0, alpha);
  int32_t j = 0;
  for (; j < jfull; ++j) {  // slots visible to every row of the block
    __m512 vv[DB];
#pragma GCC unroll 4
    for (int b = 0; b < DB; ++b) vv[b] = load_kv<KT>(V, j, 16 * (v0 + b), hd, mk[b]);
#pragma GCC unroll 8
    for (int i = 0; i < RB; ++i) {
      const __m512 pb = _mm512_set1_ps(p[static_cast<size_t>(i) * psp + j]);
#pragma GCC unroll 4
      for (int b = 0; b < DB; ++b) a[i][b] = _mm512_fmadd_ps(pb, vv[b], a[i][b]);
    }
  }
  for (; j < jmax; ++j) {  // causal edge: only rows whose limit covers slot j
    __m512 vv[DB];
#pragma GCC unroll 4
    for (int b = 0; b < DB; ++b) vv[b] = load_kv<KT>(V, j, 16 * (v0 + b), hd, mk[b]);
#pragma GCC unroll 8
    for (int i = 0; i < RB; ++i) {
      if (j >= nv[i]) continue;
      const __m512 pb = _mm512_set1_ps(p[static_cast<size_t>(i) * psp + j]);
#pragma GCC unroll 4
      for (int b = 0; b < DB; ++b) a[i][b] = _mm512_fmadd_ps(pb, vv[b], a[i][b]);
    }
  }
  store_acc<RB, DB>(a, acc, hdp, v0);
}

template <int KT, int RB, int DB>
void pv_rows(const uint8_t* V, int32_t n, int32_t hd, int32_t r0, int32_t G, int32_t rel0, const float* p, int32_t psp,
             const float* alpha, float* acc, int32_t hdp) {
  const RowLimits<RB> lim(rel0, r0, G, n);
  const int32_t* nv = lim.nv;
  const int32_t jfull = lim.jfull, jmax = lim.jmax;
  const int32_t nvec = (hd + 15) / 16;
  const __mmask16 tail = static_cast<__mmask16>(hd % 16 ? lanes(hd % 16) : 0);
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
  for (; r0 + 8 <= R; r0 += 8) pv_rows<KT, 8, 2>(V, n, hd, r0, G, rel0, p, psp, alpha, acc, hdp);
  if (r0 + 4 <= R) {
    pv_rows<KT, 4, 4>(V, n, hd, r0, G, rel0, p, psp, alpha, acc, hdp);
    r0 += 4;
  }
  if (r0 + 2 <= R) {
    pv_rows<KT, 2, 4>(V, n, hd, r0, G, rel0, p, psp, alpha, acc, hdp);
    r0 += 2;
  }
  if (r0 < R) pv_rows<KT, 1, 4>(V, n, hd, r0, G, rel0, p, psp, alpha, acc, hdp);
}

// ---- Q8_0 pages on a CPU with VNNI (Avx512Kern<true>) ---------------------------------------------------
// The tile's quantised query rows live in its `conv` area (which the direct Q8_0 path does not otherwise use;
// scratch_floats sizes it for them), hd / 2 + hd / 32 floats per row:
//   q    [R][hd] int8, q_i = rne(x_i / d_b), |q_i| <= 127      bias [R][hd / 4] int32, -128 * (sum of a lane's 4 q)
//   dq   [R][nb] f32, d_b = amax_b / 127                        (nb = hd / 32 blocks per row)
struct Q8Scratch {
  int8_t* q = nullptr;
  int32_t* bias = nullptr;
  float* dq = nullptr;
  int32_t hd = 0, nb = 0;

  static Q8Scratch at(float* conv, int32_t rows, int32_t hd) {
    Q8Scratch z;
    z.hd = hd;
    z.nb = hd / 32;
    z.q = reinterpret_cast<int8_t*>(conv);  // 64-byte aligned (Layout); rows of hd bytes, hd % 32 == 0
    z.bias = reinterpret_cast<int32_t*>(conv + static_cast<size_t>(rows) * (hd / 4));
    z.dq = conv + static_cast<size_t>(rows) * (hd / 2);
    return z;
  }
  int8_t* qrow(int32_t r) const { return q + static_cast<size_t>(r) * hd; }
  int32_t* brow(int32_t r) const { return bias + static_cast<size_t>(r) * (hd / 4); }
  float* dqrow(int32_t r) const { return dq + static_cast<size_t>(r) * nb; }
};

// Quantises R rows of qs (stride hdp, already times the attention scale) as attention_quantise_query_row.
void quantise_query_rows(const float* qs, int32_t hdp, int32_t R, int32_t hd, float* conv) {
  const Q8Scratch z = Q8Scratch::at(conv, R, hd);
  const __m512 sign = _mm512_set1_ps(-0.0f);
  const __m256i k128 = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int32_t r = 0; r < R; ++r) {
    for (int32_t b = 0; b < z.nb; ++b) {
      const float* x = qs + static_cast<size_t>(r) * hdp + 32 * b;
      const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
      const float amax = reduce_max(_mm512_max_ps(_mm512_andnot_ps(sign, x0), _mm512_andnot_ps(sign, x1)));
      const float d = amax / 127.0f;
      const __m512 id = _mm512_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
      // Round to nearest even (MXCSR's default mode, as nearbyintf in the spec); |x * id| <= 127 + ulps.
      const __m128i q0 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(x0, id)));
      const __m128i q1 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(x1, id)));
      const __m256i qv = _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1);
      _mm256_store_si256(reinterpret_cast<__m256i*>(z.qrow(r) + 32 * b), qv);
      // 128 * (sum of each lane's 4 q), by vpdpbusd of u8 128 against the s8 q; negated, it is the bias that
      // turns (k + 128) . q (keys made unsigned by flipping their top bit) back into k . q.
      const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), k128, qv);
      _mm256_store_si256(reinterpret_cast<__m256i*>(z.brow(r) + 8 * b), _mm256_sub_epi32(_mm256_setzero_si256(), s));
      z.dqrow(r)[b] = d;
    }
  }
}

// Horizontal sums of four ymm vectors -> {sum a, sum b, sum c, sum d}.
inline __m128 hsum4_256(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

inline float hsum_256(__m256 a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// Scores of NR quantised rows (from row r0) against Q8_0 slots [j0, j0 + SB): per 32-element block b,
// (k + 128) . q in int32 from the bias, times d_k * d_q (scale table), accumulated in f32 lanes.
template <int NR, int SB>
__attribute__((always_inline)) inline void qk_q8_block(const uint8_t* K, int32_t j0, const Q8Scratch& z, int32_t r0,
                                                       float* sc, int32_t psp) {
  __m256 acc[NR][SB];
#pragma GCC unroll 8
  for (int i = 0; i < NR; ++i)
#pragma GCC unroll 4
    for (int s = 0; s < SB; ++s) acc[i][s] = _mm256_setzero_ps();
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int32_t b = 0; b < z.nb; ++b) {
    __m256i ku[SB];
    __m256 dk[SB];
#pragma GCC unroll 4
    for (int s = 0; s < SB; ++s) {
      const uint8_t* blk = K + (static_cast<size_t>(j0 + s) * z.nb + b) * 34;
      ku[s] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)), flip);
      dk[s] = _mm256_cvtph_ps(_mm_broadcastw_epi16(_mm_loadu_si16(blk)));
    }
#pragma GCC unroll 8
    for (int i = 0; i < NR; ++i) {
      const __m256i qv = _mm256_load_si256(reinterpret_cast<const __m256i*>(z.qrow(r0 + i) + 32 * b));
      const __m256i bias = _mm256_load_si256(reinterpret_cast<const __m256i*>(z.brow(r0 + i) + 8 * b));
      const __m256 dq = _mm256_set1_ps(z.dqrow(r0 + i)[b]);
#pragma GCC unroll 4
      for (int s = 0; s < SB; ++s)
        acc[i][s] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_dpbusd_epi32(bias, ku[s], qv)), _mm256_mul_ps(dk[s], dq),
                                    acc[i][s]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < NR; ++i) {
    float* row = sc + static_cast<size_t>(r0 + i) * psp + j0;
    if constexpr (SB == 4) {
      _mm_storeu_ps(row, hsum4_256(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
    } else {
#pragma GCC unroll 4
      for (int s = 0; s < SB; ++s) row[s] = hsum_256(acc[i][s]);
    }
  }
}

template <int NR>
void qk_q8_rows(const uint8_t* K, int32_t n, const Q8Scratch& z, int32_t r0, float* sc, int32_t psp) {
  constexpr int SB = NR <= 4 ? 4 : 2;  // NR x SB ymm accumulators + SB keys
  int32_t j = 0;
  for (; j + SB <= n; j += SB) qk_q8_block<NR, SB>(K, j, z, r0, sc, psp);
  for (; j < n; ++j) qk_q8_block<NR, 1>(K, j, z, r0, sc, psp);
}

void qk_q8_vnni(const uint8_t* K, int32_t n, int32_t hd, int32_t R, float* scores, int32_t psp, float* conv) {
  const Q8Scratch z = Q8Scratch::at(conv, R, hd);
  for (int32_t r0 = 0; r0 < R; r0 += 4) {
    switch (imin(4, R - r0)) {
      case 1:
        qk_q8_rows<1>(K, n, z, r0, scores, psp);
        break;
      case 2:
        qk_q8_rows<2>(K, n, z, r0, scores, psp);
        break;
      case 3:
        qk_q8_rows<3>(K, n, z, r0, scores, psp);
        break;
      default:
        qk_q8_rows<4>(K, n, z, r0, scores, psp);
        break;
    }
  }
}

// PV of Q8_0 V with the block scale folded into the probability: (p * d) * q, one multiply per row, slot
// and 32-element block instead of one per 16 elements (and none per row of the group). The products round
// differently from the dequantised-tile path (p * (d * q)), which is why only the VNNI kernel, whose scores
// already come from quantised queries, uses it. DB vectors = DB / 2 whole blocks. (Per-page tables of
// p * d, filled by a gather of the page's scales, were slower: the gathers cost more than the multiplies.)
template <int RB, int DB>
inline void pv_q8_block(const uint8_t* V, const Q8Scratch& z, int32_t v0, const int32_t* nv, int32_t jfull,
                        int32_t jmax, const float* p, int32_t psp, const float* alpha, float* acc, int32_t hdp) {
  static_assert(DB % 2 == 0, "whole Q8_0 blocks");
  __m512 a[RB][DB];
  load_acc<RB, DB>(a, acc, hdp, v0, alpha);
  for (int32_t j = 0; j < jmax; ++j) {
    const uint8_t* row = V + (static_cast<size_t>(j) * z.nb + v0 / 2) * 34;
    __m512 dv[DB / 2], vv[DB];
#pragma GCC unroll 4
    for (int k = 0; k < DB / 2; ++k) {
      const uint8_t* blk = row + 34 * k;
      dv[k] = _mm512_cvtph_ps(_mm256_broadcastw_epi16(_mm_loadu_si16(blk)));
      const __m128i* q = reinterpret_cast<const __m128i*>(blk + 2);
      vv[2 * k] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q)));
      vv[2 * k + 1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1)));
    }
    const bool edge = j >= jfull;  // causal edge: only rows whose limit covers slot j
#pragma GCC unroll 8
    for (int i = 0; i < RB; ++i) {
      if (edge && j >= nv[i]) continue;
      const __m512 pb = _mm512_set1_ps(p[static_cast<size_t>(i) * psp + j]);
#pragma GCC unroll 4
      for (int k = 0; k < DB / 2; ++k) {
        const __m512 pd = _mm512_mul_ps(pb, dv[k]);
        a[i][2 * k] = _mm512_fmadd_ps(pd, vv[2 * k], a[i][2 * k]);
        a[i][2 * k + 1] = _mm512_fmadd_ps(pd, vv[2 * k + 1], a[i][2 * k + 1]);
      }
    }
  }
  store_acc<RB, DB>(a, acc, hdp, v0);
}

template <int RB, int DB>
void pv_q8_rows(const uint8_t* V, int32_t n, const Q8Scratch& z, int32_t r0, int32_t G, int32_t rel0, const float* p,
                int32_t psp, const float* alpha, float* acc, int32_t hdp) {
  const RowLimits<RB> lim(rel0, r0, G, n);
  const int32_t* nv = lim.nv;
  const int32_t jfull = lim.jfull, jmax = lim.jmax;
  const int32_t nvec = z.hd / 16;
  p += static_cast<size_t>(r0) * psp;
  alpha += r0;
  acc += static_cast<size_t>(r0) * hdp;
  int32_t v0 = 0;
  for (; v0 + DB <= nvec; v0 += DB) pv_q8_block<RB, DB>(V, z, v0, nv, jfull, jmax, p, psp, alpha, acc, hdp);
  for (; v0 < nvec; v0 += 2) pv_q8_block<RB, 2>(V, z, v0, nv, jfull, jmax, p, psp, alpha, acc, hdp);
}

void pv_q8_vnni(const uint8_t* V, int32_t n, int32_t hd, const float* p, int32_t psp, const float* alpha, float* acc,
                int32_t hdp, int32_t R, int32_t G, int32_t rel0, float* conv) {
  const Q8Scratch z = Q8Scratch::at(conv, R, hd);
  int32_t r0 = 0;
  for (; r0 + 8 <= R; r0 += 8) pv_q8_rows<8, 2>(V, n, z, r0, G, rel0, p, psp, alpha, acc, hdp);
  if (r0 + 4 <= R) {
    pv_q8_rows<4, 4>(V, n, z, r0, G, rel0, p, psp, alpha, acc, hdp);
    r0 += 4;
  }
  if (r0 + 2 <= R) {
    pv_q8_rows<2, 4>(V, n, z, r0, G, rel0, p, psp, alpha, acc, hdp);
    r0 += 2;
  }
  if (r0 < R) pv_q8_rows<1, 4>(V, n, z, r0, G, rel0, p, psp, alpha, acc, hdp);
}

template <bool kVnni>
struct Avx512Kern {
  static constexpr bool kDirectQ8 = true;  // qk / pv read Q8_0 pages themselves (kind kElemQ8)
  static constexpr bool kQuantisesQ8Queries = kVnni;  // run() calls prepare_q8 for Q8_0 pages
  // The tile's query rows, quantised once for every page's QK (into the conv scratch, see QueryQ8).
  static void prepare_q8(const float* qs, int32_t hdp, int32_t R, int32_t hd, float* conv) {
    quantise_query_rows(qs, hdp, R, hd, conv);
  }
  // n rows of head_dim / 32 Q8_0 blocks -> f32 rows (stride hd): value = d * q, as ggml dequantises.
  static void dequant_q8(const uint8_t* block, int32_t n, int32_t hd, float* out) {
    const size_t nb = static_cast<size_t>(n) * (hd / 32);
    for (size_t b = 0; b < nb; ++b, block += 34, out += 32) {
      uint16_t dbits;
      std::memcpy(&dbits, block, 2);
      const __m512 d = _mm512_set1_ps(_cvtsh_ss(dbits));
      const __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 2)));
      const __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 18)));
      _mm512_storeu_ps(out, _mm512_mul_ps(d, _mm512_cvtepi32_ps(q0)));
      _mm512_storeu_ps(out + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(q1)));
    }
  }

  static void qk(const uint8_t* kblock, int kind, int32_t n, int32_t hd, const float* qs, int32_t hdp, int32_t R,
                 float* scores, int32_t psp, float* conv) {
    if (kind == kElemQ8 && kVnni)
      qk_q8_vnni(kblock, n, hd, R, scores, psp, conv);
    else if (kind == kElemQ8)
      qk_t<kElemQ8>(kblock, n, hd, qs, hdp, R, scores, psp);
    else if (kind == kElemF16)
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
      __m512 mx = _mm512_set1_ps(m[r]);
      for (int32_t c = 0; c < nv; c += 16) mx = _mm512_mask_max_ps(mx, lanes(nv - c), mx, _mm512_loadu_ps(s + c));
      const float mnew = reduce_max(mx);
      if (mnew == -__builtin_inff()) {  // every visible score is -inf: no weight
        for (int32_t c = 0; c < nv; c += 16) _mm512_storeu_ps(s + c, _mm512_setzero_ps());
        continue;
      }
      const __m512 mv = _mm512_set1_ps(mnew);
      __m512 sum = _mm512_setzero_ps();
      for (int32_t c = 0; c < nv; c += 16) {
        const __mmask16 mk = lanes(nv - c);
        const __m512 e = _mm512_maskz_mov_ps(mk, exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, s + c), mv)));
        _mm512_storeu_ps(s + c, e);  // rows are padded to 16 floats
        sum = _mm512_add_ps(sum, e);
      }
      const float a = m[r] == mnew ? 1.0f : exp1(m[r] - mnew);
      l[r] = l[r] * a + reduce_add(sum);
      m[r] = mnew;
      alpha[r] = a;
    }
  }

  static void pv(const uint8_t* vblock, int kind, int32_t n, int32_t hd, const float* p, int32_t psp,
                 const float* alpha, float* acc, int32_t hdp, int32_t R, int32_t G, int32_t rel0, float* conv) {
    if (kind == kElemQ8 && kVnni)
      pv_q8_vnni(vblock, n, hd, p, psp, alpha, acc, hdp, R, G, rel0, conv);
    else if (kind == kElemQ8)
      pv_t<kElemQ8>(vblock, n, hd, p, psp, alpha, acc, hdp, R, G, rel0);
    else if (kind == kElemF16)
      pv_t<kElemF16>(vblock, n, hd, p, psp, alpha, acc, hdp, R, G, rel0);
    else if (kind == kElemBF16)
      pv_t<kElemBF16>(vblock, n, hd, p, psp, alpha, acc, hdp, R, G, rel0);
    else
      pv_t<kElemF32>(vblock, n, hd, p, psp, alpha, acc, hdp, R, G, rel0);
  }

  static void mass(const float* scores, int32_t psp, int32_t n, int32_t R, int32_t G, int32_t rel0, const float* m,
                   const float* l, float* key_mass) {
    for (int32_t c = 0; c < n; c += 16) {
      __m512 col = _mm512_setzero_ps();
      for (int32_t r = 0; r < R; ++r) {
        const int32_t nv = row_valid(rel0, r, G, n);
        if (nv <= c || !(l[r] > 0.0f)) continue;
        const __mmask16 mk = lanes(nv - c);
        const __m512 s = _mm512_maskz_loadu_ps(mk, scores + static_cast<size_t>(r) * psp + c);
        const __m512 e = exp_ps(_mm512_sub_ps(s, _mm512_set1_ps(m[r])));
        col = _mm512_mask_add_ps(col, mk, col, _mm512_mul_ps(e, _mm512_set1_ps(1.0f / l[r])));
      }
      const __mmask16 mk = lanes(n - c);
      _mm512_mask_storeu_ps(key_mass + c, mk, _mm512_add_ps(_mm512_maskz_loadu_ps(mk, key_mass + c), col));
    }
  }
};

}  // namespace

// VNNI is optional for the attention family (cpu_features.h): the QK of Q8_0 keys uses it where present.
void paged_attention_avx512(const KvStreamView& kv, const AttentionArgs& args) {
  static const bool vnni = cpu_has(CpuFeature::Avx512Vnni);
  if (vnni)
    run<Avx512Kern<true>>(kv, args);
  else
    run<Avx512Kern<false>>(kv, args);
}

void paged_attention_avx512_novnni(const KvStreamView& kv, const AttentionArgs& args) {
  run<Avx512Kern<false>>(kv, args);
}

}  // namespace kvpack::kernels::attn_detail
