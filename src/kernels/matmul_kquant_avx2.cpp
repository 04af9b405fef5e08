// AVX2 kernels of the super-block kinds (Q4_K, Q6_K, Q5_K, Q3_K, Q2_K, IQ4_XS) on ActLayoutK activations,
// and the AVX2 activation quantiser for them. Follows the ODR rules of matmul_internal.h (the decoders come
// from kquant_decode_ymm.inc, included inside this file's anonymous namespace).
//
// Per super-block, (row, token): 8 chunks of 32 elements; each chunk's codes (unsigned bytes) x the int8
// activations with vpmaddubsw (pairs <= 2 * 63 * 127, no saturation; IQ4_XS's signed grid values use the
// sign trick: |w| x sign(x, w), pairs <= 2 * 127 * 127), then vpmaddwd with the two sub-blocks' int16
// scales adds into one int32 vector: the whole super-block's dot product stays integer. Code offsets
// (Q6_K 32, Q3_K 4) subtract offset * sum_j S_j bsum_j (vpmaddwd of scales x bsums), mins are
// sum_j M_j bsum_j. Then per super-block one convert + FMA (and one for the mins) into an f32 accumulator:
// this is what one activation scale per 256 elements buys over per-32 scales (a convert + FMA per 32).
//
// Batch invariance: each (row, token) dot product runs the same instruction sequence whatever the tile
// (T tokens share each weight chunk decode; the per-token arithmetic does not depend on T).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/matmul_internal.h"

namespace kvpack::kernels::detail {
namespace {

#include "kernels/kquant_decode_ymm.inc"

constexpr int kTileK = 3;  // tokens per weight pass: 2 T accumulators + ~8 operands fit 16 ymm

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// int16 scales of chunk C's two sub-blocks (2C, 2C + 1), each broadcast over its 128-bit lane. `half` holds
// S[0..7] (C < 4) or S[8..15] in both lanes.
template <int C>
inline __m256i scale_pair(__m256i half) {
  constexpr int a = (2 * C) % 8, b = a + 1;
  const __m256i idx = _mm256_setr_m128i(_mm_set1_epi16(static_cast<short>((2 * a + 1) << 8 | 2 * a)),
                                        _mm_set1_epi16(static_cast<short>((2 * b + 1) << 8 | 2 * b)));
  return _mm256_shuffle_epi8(half, idx);
}

template <class W, int T, int C>
inline void chunks(const uint8_t* blk, __m256i S_lo, __m256i S_hi, const int8_t* const* xq, __m256i* isum) {
  const __m256i w = W::template chunk<C>(blk);
  const __m256i s16 = scale_pair<C>(C < 4 ? S_lo : S_hi);
  const __m256i wu = W::kSigned ? _mm256_sign_epi8(w, w) : w;
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    const __m256i x = _mm256_load_si256(reinterpret_cast<const __m256i*>(xq[t] + 32 * C));
    const __m256i xs = W::kSigned ? _mm256_sign_epi8(x, w) : x;
    isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(wu, xs), s16));
  }
  if constexpr (C + 1 < 8) chunks<W, T, C + 1>(blk, S_lo, S_hi, xq, isum);
}

// out[t] = dot(row, token t), t < T.
template <class W, int T>
void dot_k(const uint8_t* row, int64_t nsb, const uint8_t* const* acts, const ActLayoutK& L, float* out) {
  __m256 acc[T];
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = row + sb * W::kBytes;
    __m256i S, M = _mm256_setzero_si256();
    float dA, dB;
    W::prep(blk, &S, &M, &dA, &dB);
    const __m256i S_lo = _mm256_permute2x128_si256(S, S, 0x00), S_hi = _mm256_permute2x128_si256(S, S, 0x11);
    const int8_t* xq[T];
    __m256i isum[T];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      xq[t] = reinterpret_cast<const int8_t*>(acts[t] + L.qs_off) + sb * kQKBlock;
      isum[t] = _mm256_setzero_si256();
    }
    chunks<W, T, 0>(blk, S_lo, S_hi, xq, isum);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const __m256i bs = _mm256_load_si256(reinterpret_cast<const __m256i*>(acts[t] + L.bsum_off + sb * 32));
      if constexpr (W::kOffset != 0)
        isum[t] = _mm256_sub_epi32(isum[t],
                                   _mm256_madd_epi16(_mm256_mullo_epi16(S, _mm256_set1_epi16(W::kOffset)), bs));
      const float dx = reinterpret_cast<const float*>(acts[t] + L.d_off)[sb];
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(dA * dx), acc[t]);
      if constexpr (W::kMins)
        acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(M, bs)), _mm256_set1_ps(dB * dx), acc[t]);
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) out[t] = hsum(acc[t]);
}

template <class W, int T>
void rows_tile_k(const RowsArgs& a, const uint8_t* const* acts, float* y) {
  const int64_t nsb = a.n_in / kQKBlock;
  for (int64_t r = a.r0; r < a.r1; ++r) {
    float out[T];
    dot_k<W, T>(a.W + r * a.row_bytes, nsb, acts, a.actk, out);
    for (int t = 0; t < T; ++t) y[t * a.y_stride + r] = out[t];
  }
}

template <class W, int T>
void tile_k(int nt, const RowsArgs& a, const uint8_t* const* acts, float* y) {
  if constexpr (T > 1) {
    if (nt < T) return tile_k<W, T - 1>(nt, a, acts, y);
  }
  rows_tile_k<W, T>(a, acts, y);
}

template <class W>
void rows_k(const RowsArgs& a) {
  for (int64_t t0 = 0; t0 < a.n_tokens; t0 += kTileK) {
    const int nt = static_cast<int>(a.n_tokens - t0 < kTileK ? a.n_tokens - t0 : kTileK);
    const uint8_t* acts[kTileK];
    for (int t = 0; t < nt; ++t) acts[t] = static_cast<const uint8_t*>(a.x) + (t0 + t) * a.x_stride;
    tile_k<W, kTileK>(nt, a, acts, a.y + t0 * a.y_stride);
  }
}

}  // namespace

// Bit-identical to quant_act_k_scalar: same d / id formulas, cvtps2dq rounds to nearest-even, max and the
// integer sums are order-independent.
void quant_act_k_avx2(const float* x, int64_t n_in, const ActLayoutK& L, void* out) {
  auto* base = static_cast<uint8_t*>(out);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t sb = 0; sb < n_in / kQKBlock; ++sb) {
    const float* v = x + sb * kQKBlock;
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < 32; ++k) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + 8 * k)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const __m256 vid = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    reinterpret_cast<float*>(base + L.d_off)[sb] = amax / 127.0f;
    int8_t* qs = reinterpret_cast<int8_t*>(base + L.qs_off) + sb * kQKBlock;
    int16_t* bs = reinterpret_cast<int16_t*>(base + L.bsum_off) + sb * 16;
    for (int c = 0; c < 8; ++c) {  // 32 elements = two bsum groups
      __m256i q[4];
      for (int k = 0; k < 4; ++k) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 32 * c + 8 * k), vid));
      const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + 32 * c),
                          _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
      for (int g = 0; g < 2; ++g) {
        __m256i s = _mm256_add_epi32(q[2 * g], q[2 * g + 1]);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        bs[2 * c + g] = static_cast<int16_t>(_mm_cvtsi128_si32(s4));
      }
    }
  }
}

const RowsFn kRowsKAvx2[kNumKKinds] = {rows_k<KQ4K>, rows_k<KQ6K>, rows_k<KQ5K>,
                                       rows_k<KQ3K>, rows_k<KQ2K>, rows_k<KIQ4XS>};

}  // namespace kvpack::kernels::detail
