// AVX2 kernels (AVX2 + FMA + F16C). Built with -mavx2 -mfma -mf16c; only reached when
// cpu_supports(Isa::Avx2). Follows the ODR rules in matmul_internal.h. Same structure as the AVX-512
// file (token tiles over L2-resident row blocks, R rows x T tokens register micro-tiles), with 8-wide
// vectors and 16 ymm registers.
//
// Batch invariance (as in matmul_avx512.cpp): the number of partial accumulators per output and the
// order they are filled and combined (kUnroll* below) are fixed per weight family, never chosen from the
// micro-tile shape, so each y[t][o] is bitwise the same whatever n_tokens, tile, remainder row or thread
// computes it: a request's greedy tokens cannot change with the other requests batched beside it. The
// tile shapes are capped instead so that the accumulators and operands fit 16 ymm (static_asserts).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/matmul_internal.h"

namespace kvpack::kernels::detail {
namespace {

// Tokens of the first (streaming, R = 1) tile of every kind and of the later F tiles / the Q tiles.
constexpr int kTile = 4;
constexpr int kTileCachedF = 3;
constexpr int kTileQ = 3;

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  __builtin_memcpy(&v, p, 2);
  return v;
}
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
// Lanes [0, n) all-ones, for maskload of a partial vector (n in 1..7).
inline __m256i lane_mask(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// ---------------------------------------------------------------------------------------------------
// F32 / F16 / BF16 weights: widen 8 weights to f32 (exact), FMA with f32 activations.

struct LdF32 {
  static __m256 full(const uint8_t* row, int64_t i) { return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + i); }
  static __m256 part(const uint8_t* row, int64_t i, int64_t n) {
    return _mm256_maskload_ps(reinterpret_cast<const float*>(row) + i, lane_mask(n));
  }
};
// 16-bit types: the tail goes through a zero-padded copy (no 16-bit masked loads in AVX2).
inline __m128i load_u16_part(const uint8_t* p, int64_t n) {
  uint16_t tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  __builtin_memcpy(tmp, p, static_cast<size_t>(n) * 2);
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(tmp));
}
struct LdF16 {
  static __m256 full(const uint8_t* row, int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i)));
  }
  static __m256 part(const uint8_t* row, int64_t i, int64_t n) { return _mm256_cvtph_ps(load_u16_part(row + 2 * i, n)); }
};
struct LdBF16 {
  static __m256 widen(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
  static __m256 full(const uint8_t* row, int64_t i) {
    return widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i)));
  }
  static __m256 part(const uint8_t* row, int64_t i, int64_t n) { return widen(load_u16_part(row + 2 * i, n)); }
};

// Rows per kernel call: the first token tile streams the rows from DRAM strictly sequentially (R = 1;
// interleaved rows defeat the prefetchers, see matmul_avx512.cpp); later tiles find them in L2 and use
// R = 2 rows per activation load.
//
// F kinds: kUnrollF accumulators per output: vector i goes to accumulator i mod kUnrollF, leftover full
// vectors and the partial tail to accumulator 0, then acc0 + acc1 and hsum. 2 chains keep the GEMV near
// DRAM speed; the cached tile is then 2 rows x 3 tokens (12 accumulators + 2 weights + 1 activation).
constexpr int kRowsCached = 2;
constexpr int kUnrollF = 2;
static_assert(kUnrollF * kRowsCached * kTileCachedF + kRowsCached + 1 <= 16, "F micro-tile exceeds 16 ymm");
static_assert(kUnrollF * kTile + 2 <= 16, "F streaming tile exceeds 16 ymm");

// out[k * T + t] = dot(rows[k], xs[t]) for k < R, t < T.
template <class Ld, int R, int T>
void dot_f(const uint8_t* const* rows, int64_t n, const float* const* xs, float* out) {
  constexpr int U = kUnrollF;  // never a function of R, T (batch invariance, see the top of the file)
  static_assert(U * R * T + R + 1 <= 16, "F micro-tile exceeds 16 ymm");
  __m256 acc[U][R * T];
#pragma GCC unroll 4
  for (int u = 0; u < U; ++u)
#pragma GCC unroll 4
    for (int j = 0; j < R * T; ++j) acc[u][j] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 * U <= n; i += 8 * U) {
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
      __m256 w[R];
#pragma GCC unroll 4
      for (int k = 0; k < R; ++k) w[k] = Ld::full(rows[k], i + 8 * u);
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        __m256 x = _mm256_loadu_ps(xs[t] + i + 8 * u);
        asm("" : "+x"(x));  // one load per activation vector, not one per row (see matmul_avx512.cpp)
#pragma GCC unroll 4
        for (int k = 0; k < R; ++k) acc[u][k * T + t] = _mm256_fmadd_ps(w[k], x, acc[u][k * T + t]);
      }
    }
  }
  for (; i < n; i += 8) {  // remaining full vectors, then a partial one
    const int64_t m = n - i;
    __m256 w[R];
#pragma GCC unroll 4
    for (int k = 0; k < R; ++k) w[k] = m >= 8 ? Ld::full(rows[k], i) : Ld::part(rows[k], i, m);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const __m256 x = m >= 8 ? _mm256_loadu_ps(xs[t] + i) : _mm256_maskload_ps(xs[t] + i, lane_mask(m));
#pragma GCC unroll 4
      for (int k = 0; k < R; ++k) acc[0][k * T + t] = _mm256_fmadd_ps(w[k], x, acc[0][k * T + t]);
    }
  }
#pragma GCC unroll 4
  for (int j = 0; j < R * T; ++j) {
    __m256 s = acc[0][j];
#pragma GCC unroll 4
    for (int u = 1; u < U; ++u) s = _mm256_add_ps(s, acc[u][j]);
    out[j] = hsum(s);
  }
}

template <class Ld, int R, int T>
void rows_tile_f(const RowsArgs& a, const float* const* xs, float* y) {
  int64_t r = a.r0;
  for (; r + R <= a.r1; r += R) {
    const uint8_t* rows[R];
    for (int k = 0; k < R; ++k) rows[k] = a.W + (r + k) * a.row_bytes;
    float out[R * T];
    dot_f<Ld, R, T>(rows, a.n_in, xs, out);
    for (int k = 0; k < R; ++k)
      for (int t = 0; t < T; ++t) y[t * a.y_stride + r + k] = out[k * T + t];
  }
  for (; r < a.r1; ++r) {
    const uint8_t* row = a.W + r * a.row_bytes;
    float out[T];
    dot_f<Ld, 1, T>(&row, a.n_in, xs, out);
    for (int t = 0; t < T; ++t) y[t * a.y_stride + r] = out[t];
  }
}

// rows_tile_f<Ld, R, nt> for a runtime nt in [1, T] (compile-time dispatch without std templates).
template <class Ld, int R, int T>
void tile_f(int nt, const RowsArgs& a, const float* const* xs, float* y) {
  if constexpr (T > 1) {
    if (nt < T) return tile_f<Ld, R, T - 1>(nt, a, xs, y);
  }
  rows_tile_f<Ld, R, T>(a, xs, y);
}

template <class Ld>
void rows_f(const RowsArgs& a) {
  const float* xs[kTile];
  auto set_xs = [&](int64_t t0, int nt) {
    for (int t = 0; t < nt; ++t)
      xs[t] = reinterpret_cast<const float*>(static_cast<const char*>(a.x) + (t0 + t) * a.x_stride);
  };
  const int n0 = static_cast<int>(imin(kTile, a.n_tokens));
  set_xs(0, n0);
  tile_f<Ld, 1, kTile>(n0, a, xs, a.y);
  for (int64_t t0 = n0; t0 < a.n_tokens; t0 += kTileCachedF) {
    const int nt = static_cast<int>(imin(kTileCachedF, a.n_tokens - t0));
    set_xs(t0, nt);
    tile_f<Ld, kRowsCached, kTileCachedF>(nt, a, xs, a.y + t0 * a.y_stride);
  }
}

// ---------------------------------------------------------------------------------------------------
// Q8_0 / Q4_0 x int8 activations with vpmaddubsw (u8 x s8 -> saturating s16 pairs) + vpmaddwd.
//   Q8_0: sign trick, |w| x (x * sign(w)): each s16 pair sum is <= 2 * 128 * 127 = 32512, no saturation
//         (the activations never hold -128). No bias needed (K = 0).
//   Q4_0: raw nibbles (0..15) x x, pair sums <= 2 * 15 * 127; bias8 adds -8 * sum(x) (K = 8).

struct WQ8 {
  static constexpr int kBytes = 34;
  static constexpr bool kSigned = true;
  static __m256i load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2)); }
};
struct WQ4 {
  static constexpr int kBytes = 18;
  static constexpr bool kSigned = false;
  static __m256i load(const uint8_t* p) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2));
    return _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(a), _mm_srli_epi16(a, 4), 1),
                            _mm256_set1_epi8(0x0f));
  }
};

// Q5_0: Q4_0's nibbles (at +6) plus bit 4 from the qh word at +2 (bit j -> element j), expanded to bytes by a
// byte shuffle + bit test: codes 0..31, bias K = 16 (pair sums <= 2 * 31 * 127).
struct WQ5_0 {
  static constexpr int kBytes = 22;
  static constexpr bool kSigned = false;
  static __m256i load(const uint8_t* p) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 6));
    const __m256i nib = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(a), _mm_srli_epi16(a, 4), 1),
                                         _mm256_set1_epi8(0x0f));
    uint32_t qh;
    __builtin_memcpy(&qh, p + 2, 4);
    const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)),
                                              _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                                               2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
    return _mm256_or_si256(nib, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
  }
};
// IQ4_NL: Q4_0's nibble layout indexing the signed grid (|value| <= 127: the Q8_0 sign trick applies).
struct WIQ4NL {
  static constexpr int kBytes = 18;
  static constexpr bool kSigned = true;
  static __m256i load(const uint8_t* p) {
    const __m256i grid = _mm256_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
                                          -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
    return _mm256_shuffle_epi8(grid, WQ4::load(p));
  }
};

// Q kinds (Q8_0, Q4_0; the super-block kinds are in matmul_kquant_avx2.cpp): kUnrollQ accumulators per
// output, fixed (batch invariance): block b goes to accumulator b mod 2, a leftover block to accumulator 0. Two chains keep the GEMV (one FMA
// per 18-34 weight bytes and chain otherwise) near DRAM speed; the token tile is then 3 (6 accumulators).
constexpr int kUnrollQ = 2;

// out[k * T + t] = dot(rows[k], token t) for k < R, t < T.
template <class Wq, int R, int T>
void dot_q(const uint8_t* const* rows, int64_t nb, const uint8_t* const* acts, const ActLayout& L, float* out) {
  constexpr int U = kUnrollQ;  // never a function of R, T
  static_assert(U * R * T + 3 * R + 5 <= 16, "Q micro-tile exceeds 16 ymm");
  __m256 acc[U][R * T];
#pragma GCC unroll 4
  for (int u = 0; u < U; ++u)
#pragma GCC unroll 4
    for (int j = 0; j < R * T; ++j) acc[u][j] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  auto block = [&](int64_t b, int u) {
    __m256i w[R], wu[R];
    __m256 dw[R];
#pragma GCC unroll 4
    for (int k = 0; k < R; ++k) {
      const uint8_t* p = rows[k] + b * Wq::kBytes;
      w[k] = Wq::load(p);
      wu[k] = Wq::kSigned ? _mm256_abs_epi8(w[k]) : w[k];
      dw[k] = _mm256_set1_ps(_cvtsh_ss(load_u16(p)));
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const uint8_t* act = acts[t];
      const __m256i xq = _mm256_load_si256(reinterpret_cast<const __m256i*>(act + L.qs_off + b * 32));
      const __m256 dx = _mm256_load_ps(reinterpret_cast<const float*>(act + L.d_off + b * 32));
#pragma GCC unroll 4
      for (int k = 0; k < R; ++k) {
        const __m256i xs = Wq::kSigned ? _mm256_sign_epi8(xq, w[k]) : xq;
        __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(wu[k], xs), ones);
        if (!Wq::kSigned)
          s = _mm256_add_epi32(s, _mm256_load_si256(reinterpret_cast<const __m256i*>(act + L.bias_off + b * 32)));
        acc[u][k * T + t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw[k], dx), acc[u][k * T + t]);
      }
    }
  };
  int64_t b = 0;
  for (; b + U <= nb; b += U)
#pragma GCC unroll 2
    for (int u = 0; u < U; ++u) block(b + u, u);
  for (; b < nb; ++b) block(b, 0);
#pragma GCC unroll 4
  for (int j = 0; j < R * T; ++j) {
    __m256 s = acc[0][j];
#pragma GCC unroll 4
    for (int u = 1; u < U; ++u) s = _mm256_add_ps(s, acc[u][j]);
    out[j] = hsum(s);
  }
}

// One row at a time (sequential weight stream); T tokens share each weight load.
template <class Wq, int T>
void rows_tile_q(const RowsArgs& a, const uint8_t* const* acts, float* y) {
  const int64_t nb = a.n_in / kQBlock;
  for (int64_t r = a.r0; r < a.r1; ++r) {
    const uint8_t* row = a.W + r * a.row_bytes;
    float out[T];
    dot_q<Wq, 1, T>(&row, nb, acts, a.act, out);
    for (int t = 0; t < T; ++t) y[t * a.y_stride + r] = out[t];
  }
}

// rows_tile_q<Wq, nt> for a runtime nt in [1, T].
template <class Wq, int T>
void tile_q(int nt, const RowsArgs& a, const uint8_t* const* acts, float* y) {
  if constexpr (T > 1) {
    if (nt < T) return tile_q<Wq, T - 1>(nt, a, acts, y);
  }
  rows_tile_q<Wq, T>(a, acts, y);
}

template <class Wq>
void rows_q(const RowsArgs& a) {
  for (int64_t t0 = 0; t0 < a.n_tokens; t0 += kTileQ) {
    const int nt = static_cast<int>(imin(kTileQ, a.n_tokens - t0));
    const uint8_t* acts[kTileQ];
    for (int t = 0; t < nt; ++t) acts[t] = static_cast<const uint8_t*>(a.x) + (t0 + t) * a.x_stride;
    tile_q<Wq, kTileQ>(nt, a, acts, a.y + t0 * a.y_stride);
  }
}

// Activation quantisation; bit-identical to quant_act_scalar (see the AVX-512 version).
void quant_act_avx2(const float* x, int64_t n_in, int bias_k, const ActLayout& L, void* out) {
  auto* base = static_cast<uint8_t*>(out);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const int64_t nb = n_in / kQBlock;
  for (int64_t b = 0; b < nb; ++b) {
    __m256 v[4];
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(x + b * 32 + 8 * k);
      m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[k]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float d = act_block_scale(amax);
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];
    for (int k = 0; k < 4; ++k) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], vid));
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    const int32_t sum = _mm_cvtsi128_si32(s4);
    // packs interleave 128-bit lanes; the dword permute restores element order.
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(base + L.qs_off + b * 32),
                        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    _mm256_storeu_ps(reinterpret_cast<float*>(base + L.d_off) + b * 8, _mm256_set1_ps(d));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(reinterpret_cast<int32_t*>(base + L.bias_off) + b * 8),
                        _mm256_setr_epi32(-bias_k * sum, 0, 0, 0, 0, 0, 0, 0));
    reinterpret_cast<float*>(base + L.sum_off)[b] = d * static_cast<float>(sum);
    reinterpret_cast<float*>(base + L.dc_off)[b] = d;
  }
}

}  // namespace

const IsaKernels& kernels_avx2() {
  static const IsaKernels k = {
      {rows_f<LdF32>, rows_f<LdF16>, rows_f<LdBF16>, rows_q<WQ8>, rows_q<WQ4>, kRowsKAvx2[0], kRowsKAvx2[1],
       kRowsKAvx2[2], kRowsKAvx2[3], kRowsKAvx2[4], kRowsKAvx2[5], rows_q<WQ5_0>,
       nullptr /* Q5_1: scalar (its per-block min term has no place in dot_q yet) */, rows_q<WIQ4NL>},
      quant_act_avx2,
      {0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 16, 0, 0},
      quant_act_k_avx2,
  };
  return k;
}

}  // namespace kvpack::kernels::detail
