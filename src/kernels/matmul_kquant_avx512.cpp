// AVX-512 kernels of the super-block kinds (Q4_K, Q6_K, Q5_K, Q3_K, Q2_K, IQ4_XS) on ActLayoutK activations
// and the AVX-512 activation quantiser for them. Built with -mavx512* (BW, VNNI); only reached when
// cpu_supports(Isa::Avx512). ODR rules of matmul_internal.h apply (decoders: kquant_decode_ymm.inc inside
// this file's anonymous namespace).
//
// Same integer scheme as matmul_kquant_avx2.cpp on 64-element chunks: two decoded 32-element chunks form a
// zmm, vpmaddubsw against the activations, then vpdpwssd (VNNI) multiplies the int16 pair sums by the four
// sub-blocks' scales (vpermw broadcast) and adds them into the super-block's int32 accumulator. IQ4_XS's
// signed values use |w| and x negated where w < 0 (masked subtract: AVX-512 has no vpsignb). One convert +
// FMA per super-block and token (one more for the mins). Batch invariance as in the AVX2 file: the
// per-(row, token) instruction sequence does not depend on the tile.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/matmul_internal.h"

namespace kvpack::kernels::detail {
namespace {

#include "kernels/kquant_decode_ymm.inc"

constexpr int kTileK = 8;  // tokens per weight pass: 2 T accumulators + ~8 operands fit 32 zmm

template <class W, int T, int C>
inline void chunks(const uint8_t* blk, __m512i S, const int8_t* const* xq, __m512i* isum) {
  const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(W::template chunk<2 * C>(blk)),
                                       W::template chunk<2 * C + 1>(blk), 1);
  // int16 lanes 8k .. 8k + 7 of a vpmaddubsw result come from elements 64 C + 16 k .. + 15: sub-block 4C + k.
  const __m512i idx = _mm512_add_epi16(_mm512_set1_epi16(static_cast<short>(4 * C)),
                                       _mm512_setr_epi32(0, 0, 0, 0, 0x10001, 0x10001, 0x10001, 0x10001, 0x20002,
                                                         0x20002, 0x20002, 0x20002, 0x30003, 0x30003, 0x30003, 0x30003));
  const __m512i s16 = _mm512_permutexvar_epi16(idx, S);
  __m512i wu = w;
  __mmask64 neg = 0;
  if constexpr (W::kSigned) {
    wu = _mm512_abs_epi8(w);
    neg = _mm512_movepi8_mask(w);
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    __m512i x = _mm512_load_si512(xq[t] + 64 * C);
    if constexpr (W::kSigned) x = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
    isum[t] = _mm512_dpwssd_epi32(isum[t], _mm512_maddubs_epi16(wu, x), s16);
  }
  if constexpr (C + 1 < 4) chunks<W, T, C + 1>(blk, S, xq, isum);
}

// Horizontal sum in a fixed order (the same for every tile).
inline float hsum(__m512 v) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <class W, int T>
void dot_k(const uint8_t* row, int64_t nsb, const uint8_t* const* acts, const ActLayoutK& L, float* out) {
  __m512 acc[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = row + sb * W::kBytes;
    __m256i S, M = _mm256_setzero_si256();
    float dA, dB;
    W::prep(blk, &S, &M, &dA, &dB);
    const int8_t* xq[T];
    __m512i isum[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      xq[t] = reinterpret_cast<const int8_t*>(acts[t] + L.qs_off) + sb * kQKBlock;
      isum[t] = _mm512_setzero_si512();
    }
    chunks<W, T, 0>(blk, _mm512_castsi256_si512(S), xq, isum);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m256i bs = _mm256_load_si256(reinterpret_cast<const __m256i*>(acts[t] + L.bsum_off + sb * 32));
      if constexpr (W::kOffset != 0)
        isum[t] = _mm512_sub_epi32(isum[t], _mm512_zextsi256_si512(_mm256_madd_epi16(
                                                _mm256_mullo_epi16(S, _mm256_set1_epi16(W::kOffset)), bs)));
      const float dx = reinterpret_cast<const float*>(acts[t] + L.d_off)[sb];
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_set1_ps(dA * dx), acc[t]);
      if constexpr (W::kMins)
        acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(_mm256_madd_epi16(M, bs))),
                                  _mm512_set1_ps(dB * dx), acc[t]);
    }
  }
#pragma GCC unroll 8
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

// Bit-identical to quant_act_k_scalar (same formulas; cvtps2dq rounds to nearest-even).
void quant_act_k_avx512(const float* x, int64_t n_in, const ActLayoutK& L, void* out) {
  auto* base = static_cast<uint8_t*>(out);
  for (int64_t sb = 0; sb < n_in / kQKBlock; ++sb) {
    const float* v = x + sb * kQKBlock;
    __m512 m = _mm512_setzero_ps();
    for (int k = 0; k < 16; ++k) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(v + 16 * k)));
    const float amax = _mm512_reduce_max_ps(m);
    const __m512 vid = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    reinterpret_cast<float*>(base + L.d_off)[sb] = amax / 127.0f;
    int8_t* qs = reinterpret_cast<int8_t*>(base + L.qs_off) + sb * kQKBlock;
    int16_t* bs = reinterpret_cast<int16_t*>(base + L.bsum_off) + sb * 16;
    for (int g = 0; g < 16; ++g) {
      const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v + 16 * g), vid));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 16 * g), _mm512_cvtsepi32_epi8(q));
      bs[g] = static_cast<int16_t>(_mm512_reduce_add_epi32(q));
    }
  }
}

const RowsFn kRowsKAvx512[kNumKKinds] = {rows_k<KQ4K>, rows_k<KQ6K>, rows_k<KQ5K>,
                                         rows_k<KQ3K>, rows_k<KQ2K>, rows_k<KIQ4XS>};

}  // namespace kvpack::kernels::detail
