// AVX-512 kernels (F + BW + VL + DQ + VNNI, with FMA and F16C). Built with -mavx512*; only reached when
// cpu_supports(Isa::Avx512). Follows the ODR rules in matmul_internal.h: no shared inline code, no std
// templates, everything internal to this file.
//
// Structure: a rows kernel walks its token chunk in tiles of up to kTileF / kTile tokens; for each tile
// it streams the task's weight rows (<= 256 KB) through a register micro-tile of R rows x T tokens, so
// each weight vector is loaded and widened once per tile. The first tile reads the rows from DRAM one
// at a time (R = 1: one sequential stream, see kRowsCachedF); later tiles find them in L2 and use R > 1 so
// each activation load feeds several rows. GEMV (n_tokens == 1) is the 1 x 1 micro-tile.
//
// Batch invariance: every micro-tile shape computes each of its dot products with the same instruction
// sequence: the same number of partial accumulators per output (kUnroll* below, fixed per weight family),
// the same assignment of vectors / blocks to them, the same tail handling and the same combine and
// horizontal-sum order. So y[t][o] depends only on W row o, x row t, n_in and the weight type, never on
// n_tokens, on the tile (shape or position: streaming R = 1 vs cached R > 1, remainder rows) or on the
// thread split: a token gives bitwise the same logits whether it is decoded alone or batched with other
// requests (greedy outputs of a serving engine must not depend on what else is in flight). The price is
// that the unroll cannot grow for small tiles (GEMV) or shrink for big ones; the tile shapes are capped so
// that unroll x R x T accumulators plus the operands fit the 32 zmm registers (static_asserts below).
//
// GCC 12's AVX-512 intrinsic headers trip -W(maybe-)uninitialized on their internal _mm512_undefined_*
// temporaries (GCC bug 105593, fixed in 13); the pragma must precede the include to cover them.
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

// Tokens per pass over the weights. F kinds: 1 x 4 streaming tiles, then kRowsCachedF x 4 (see dot_f for
// why not 4 x 4 any more) so each activation load feeds several FMAs and a 4-token activation tile (16 KB
// at n_in = 1024) stays in L1.
// Q kinds: the first tile is 1 row x 8 tokens (one DRAM stream; each weight pair is unpacked once per
// 8 tokens), later tiles kCachedRowsQ rows x 4 tokens (4 x 4 measured +20% over 1 x 8, and over 2 x 4,
// 3 x 4, 4 x 2 and 2 x 8, on a 64-token Q8_0 prefill at 1024 x 3072, where the unroll allows it).
constexpr int kTileF = 4;
constexpr int kTile = 8;
constexpr int kTileCachedQ = 4;

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  __builtin_memcpy(&v, p, 2);
  return v;
}

// ---------------------------------------------------------------------------------------------------
// F32 / F16 / BF16 weights: widen 16 weights to f32 (exact), FMA with f32 activations.
// BF16 is widened by a 16-bit shift rather than using vdpbf16ps: dpbf16 would need the activations
// rounded to bf16 (8-bit mantissa, ~2^-9 relative error per element, i.e. ~1e-3 relative error in a
// dot product), while widening keeps every product exact and costs nothing measurable in a
// bandwidth-bound GEMV. Same for F16 (vcvtph2ps is exact).

struct LdF32 {
  static __m512 full(const uint8_t* row, int64_t i) { return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + i); }
  static __m512 part(const uint8_t* row, int64_t i, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + i);
  }
};
// F16: two ymm vcvtph2ps + insert measured ~8% faster in-cache on Zen 4 than one zmm vcvtph2ps.
struct LdF16 {
  static __m512 full(const uint8_t* row, int64_t i) {
    const __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i)));
    const __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i + 16)));
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
  }
  static __m512 part(const uint8_t* row, int64_t i, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * i));
  }
};
struct LdBF16 {
  static __m512 widen(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static __m512 full(const uint8_t* row, int64_t i) {
    return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * i)));
  }
  static __m512 part(const uint8_t* row, int64_t i, __mmask16 m) { return widen(_mm256_maskz_loadu_epi16(m, row + 2 * i)); }
};

// Horizontal sums of 4 vectors -> {sum a, sum b, sum c, sum d} (transpose-and-add; ~10 instructions
// instead of 4 separate reductions).
inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));  // a0+a2 b0+b2 a1+a3 b1+b3
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512 abcd = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))),
                                    _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(abcd), _mm512_extractf32x8_ps(abcd, 1));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// out[i] = horizontal sum of v[i], i < N. Always the reduce4 summation order (lane i of reduce4 depends
// only on its i-th argument), also for the N % 4 leftovers and N = 1, so a dot product's horizontal sum is
// the same in every micro-tile shape (_mm512_reduce_add_ps adds in another order).
template <int N>
inline void store_sums(const __m512* v, float* out) {
#pragma GCC unroll 8
  for (int i = 0; i + 4 <= N; i += 4) _mm_storeu_ps(out + i, reduce4(v[i], v[i + 1], v[i + 2], v[i + 3]));
  constexpr int B = N / 4 * 4, L = N - B;
  if constexpr (L > 0) {
    float s[4];
    _mm_storeu_ps(s, reduce4(v[B], v[L > 1 ? B + 1 : B], v[L > 2 ? B + 2 : B], v[B]));
#pragma GCC unroll 4
    for (int j = 0; j < L; ++j) out[B + j] = s[j];
  }
}

// Rows per kernel call. The first pass over a task's rows streams them from DRAM and must read memory
// strictly sequentially: interleaving R rows (R short streams, 1-6 KB each) defeats the hardware
// prefetchers and measured 2.5-3x slower from DRAM on Zen 4 (e.g. Q8_0 GEMV 30 -> 10 GB/s), so the
// first token tile (and so every GEMV) uses R = 1. Later tiles of the same task find the rows in L2;
// there R > 1 rows share each activation load (+20% prefill throughput for F kinds at R = 4).
//
// F kinds: kUnrollF independent accumulators per output, vectors i = u (mod kUnrollF) go to accumulator
// u, leftover full vectors and the masked tail to accumulator 0, then acc0 + acc1 + ... and store_sums.
// 2 keeps the GEMV (1 x 1 tile, 2 FMA chains: ~60 GB/s of F16 weights per core at 3.7 GHz) well above
// DRAM speed; 4 would only help in-cache GEMV and would cap the cached tile at 1 x 4 (the old 4 x 4 tile of
// 16 accumulators needs 32 at unroll 2, hence 3 x 4 = 24 accumulators + 3 weights + 1 activation;
// measured 10-20% slower 64-token prefill than the old 4 x 4 at unroll 1, 2 x 4 was 1.6-1.8x slower).
constexpr int kUnrollF = 2;
constexpr int kRowsCachedF = 3;
static_assert(kUnrollF * kRowsCachedF * kTileF + kRowsCachedF + 1 <= 32, "F micro-tile exceeds 32 zmm");

// out[k * T + t] = dot(rows[k], xs[t]) for k < R, t < T.
template <class Ld, int R, int T>
void dot_f(const uint8_t* const* rows, int64_t n, const float* const* xs, float* out) {
  constexpr int U = kUnrollF;  // never a function of R, T: see "Batch invariance" at the top
  static_assert(U * R * T + R + 1 <= 32, "F micro-tile exceeds 32 zmm");
  __m512 acc[U][R * T];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u)
#pragma GCC unroll 8
    for (int j = 0; j < R * T; ++j) acc[u][j] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 * U <= n; i += 16 * U) {
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) {
      __m512 w[R];
#pragma GCC unroll 8
      for (int k = 0; k < R; ++k) w[k] = Ld::full(rows[k], i + 16 * u);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        __m512 x = _mm512_loadu_ps(xs[t] + i + 16 * u);
        // One load per activation vector, not one per row: without this GCC folds the load into each of
        // the R FMAs under register pressure (2x slower prefill, load-port bound).
        asm("" : "+v"(x));
#pragma GCC unroll 8
        for (int k = 0; k < R; ++k) acc[u][k * T + t] = _mm512_fmadd_ps(w[k], x, acc[u][k * T + t]);
      }
    }
  }
  for (; i < n; i += 16) {  // remaining full vectors, then a masked tail
    const auto m = n - i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1u);
    __m512 w[R];
#pragma GCC unroll 8
    for (int k = 0; k < R; ++k) w[k] = Ld::part(rows[k], i, m);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m512 x = _mm512_maskz_loadu_ps(m, xs[t] + i);
#pragma GCC unroll 8
      for (int k = 0; k < R; ++k) acc[0][k * T + t] = _mm512_fmadd_ps(w[k], x, acc[0][k * T + t]);
    }
  }
#pragma GCC unroll 8
  for (int u = 1; u < U; ++u)
#pragma GCC unroll 8
    for (int j = 0; j < R * T; ++j) acc[0][j] = _mm512_add_ps(acc[0][j], acc[u][j]);
  store_sums<R * T>(acc[0], out);
}

// Rows [r0, r1) x the T tokens xs[], R rows per kernel call, remainder rows one at a time.
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
  for (int64_t t0 = 0; t0 < a.n_tokens; t0 += kTileF) {
    const int nt = static_cast<int>(imin(kTileF, a.n_tokens - t0));
    const float* xs[kTileF];
    for (int t = 0; t < nt; ++t)
      xs[t] = reinterpret_cast<const float*>(static_cast<const char*>(a.x) + (t0 + t) * a.x_stride);
    if (t0 == 0)
      tile_f<Ld, 1, kTileF>(nt, a, xs, a.y);
    else
      tile_f<Ld, kRowsCachedF, kTileF>(nt, a, xs, a.y + t0 * a.y_stride);
  }
}

// ---------------------------------------------------------------------------------------------------
// Q8_0 / Q4_0 weights x int8-quantised activations with VNNI vpdpbusd (u8 x s8 -> s32, 4-way sums).
// Two 32-element blocks fill one zmm; the int32 lanes 0-7 belong to the first block, 8-15 to the
// second. The unsigned operand is the weight:
//   Q8_0: w + 128 (xor 0x80), so sum((w+128) x) = dot + 128 sum(x)   -> bias K = 128
//   Q4_0: the raw nibble n = w + 8,   sum(n x) = dot + 8 sum(x)       -> bias K = 8
// The correction -K*sum(x) is pre-placed in lane 0 of each block's accumulator (ActLayout::bias8), so it
// costs a load, not an instruction. Every int32 lane stays < 2^24 in magnitude, so the conversion to
// float is exact; the float multiply by d_w * d_x and the accumulation are the only rounding steps.

inline __m512 dw_pair(const uint8_t* p0, const uint8_t* p1) {
  const __m128 f =
      _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(load_u16(p0) | static_cast<uint32_t>(load_u16(p1)) << 16)));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                               _mm512_castps128_ps512(f));
}
inline __m256 dw_one(const uint8_t* p) { return _mm256_set1_ps(_cvtsh_ss(load_u16(p))); }

// kUnroll: accumulators per output (block pair b goes to accumulator (b / 2) mod kUnroll, a leftover pair
// to accumulator 0, the odd last block, on ymm, after the combine). Fixed per weight type for batch
// invariance (see the top of the file). 1 chain: one FMA per 68 (Q8_0) / 36 (Q4_0) weight bytes, ~60 /
// ~33 GB/s per core at 3.7 GHz, above the ~19-21 GB/s a core streams from DRAM here (Zen 4), and it keeps
// the 4 x 4 cached tile (2 chains would need a 2 x 4 tile: measured ~8-27% slower 64-token Q4_0 prefill).
struct WQ8 {
  static constexpr int kBytes = 34;
  static constexpr int kUnroll = 1;
  static __m512i pair(const uint8_t* p) {
    const __m512i w = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kBytes + 2)), 1);
    return _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80)));
  }
  static __m256i one(const uint8_t* p) {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
  }
};

struct WQ4 {
  static constexpr int kBytes = 18;
  static constexpr int kUnroll = 1;
  static __m512i pair(const uint8_t* p) {
    // [qs0 | qs1] -> [qs0, qs0, qs1, qs1] -> shift the 2nd and 4th 128-bit lanes right by 4 -> & 0x0f:
    // elements 0-15, 16-31 of block 0, then of block 1.
    const __m256i ab =
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2))),
                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kBytes + 2)), 1);
    const __m512i v = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), _mm512_castsi256_si512(ab));
    const long long s4 = 0x0004000400040004LL;
    const __m512i sh = _mm512_setr_epi64(0, 0, s4, s4, 0, 0, s4, s4);
    return _mm512_and_si512(_mm512_srlv_epi16(v, sh), _mm512_set1_epi8(0x0f));
  }
  static __m256i one(const uint8_t* p) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2));
    return _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(a), _mm_srli_epi16(a, 4), 1),
                            _mm256_set1_epi8(0x0f));
  }
};

// Q5_0: Q4_0's nibbles (at +6) plus bit 4 from the 32-bit qh word at +2 (bit j -> element j): codes 0..31,
// value = d (code - 16) -> bias K = 16.
struct WQ5_0 {
  static constexpr int kBytes = 22;
  static constexpr int kUnroll = 1;
  static uint32_t qh(const uint8_t* p) {
    uint32_t v;
    __builtin_memcpy(&v, p + 2, 4);
    return v;
  }
  static __m512i pair(const uint8_t* p) {
    const __m256i ab =
        _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 6))),
                                _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kBytes + 6)), 1);
    const __m512i v = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), _mm512_castsi256_si512(ab));
    const long long s4 = 0x0004000400040004LL;
    const __m512i nib = _mm512_and_si512(_mm512_srlv_epi16(v, _mm512_setr_epi64(0, 0, s4, s4, 0, 0, s4, s4)),
                                         _mm512_set1_epi8(0x0f));
    const __mmask64 hi = qh(p) | static_cast<uint64_t>(qh(p + kBytes)) << 32;
    return _mm512_or_si512(nib, _mm512_maskz_mov_epi8(hi, _mm512_set1_epi8(0x10)));
  }
  static __m256i one(const uint8_t* p) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 6));
    const __m256i nib = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(a), _mm_srli_epi16(a, 4), 1),
                                         _mm256_set1_epi8(0x0f));
    return _mm256_or_si256(nib, _mm256_maskz_mov_epi8(qh(p), _mm256_set1_epi8(0x10)));
  }
};

// IQ4_NL: Q4_0's nibble layout, each nibble an index into the non-uniform grid; the table holds grid + 128
// (1..241, unsigned for vpdpbusd) -> bias K = 128, as Q8_0.
struct WIQ4NL {
  static constexpr int kBytes = 18;
  static constexpr int kUnroll = 1;
  static __m128i grid() {
    return _mm_setr_epi8(1, 24, 45, 63, 79, 93, 106, 118, static_cast<char>(129), static_cast<char>(141),
                         static_cast<char>(153), static_cast<char>(166), static_cast<char>(181), static_cast<char>(197),
                         static_cast<char>(217), static_cast<char>(241));
  }
  static __m512i pair(const uint8_t* p) { return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(grid()), WQ4::pair(p)); }
  static __m256i one(const uint8_t* p) { return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(grid()), WQ4::one(p)); }
};

// out[k * T + t] = dot(rows[k], token t) for k < R, t < T.
template <class Wq, int R, int T>
void dot_q(const uint8_t* const* rows, int64_t nb, const uint8_t* const* acts, const ActLayout& L, float* out) {
  constexpr int U = Wq::kUnroll;  // never a function of R, T: see "Batch invariance" at the top
  static_assert(U * R * T + 2 * R + 5 <= 32, "Q micro-tile exceeds 32 zmm");
  __m512 accs[U][R * T];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u)
#pragma GCC unroll 8
    for (int j = 0; j < R * T; ++j) accs[u][j] = _mm512_setzero_ps();
  auto pair = [&](int64_t b, __m512* acc) {
    __m512i w[R];
    __m512 dw[R];
#pragma GCC unroll 8
    for (int k = 0; k < R; ++k) {
      const uint8_t* p = rows[k] + b * Wq::kBytes;
      w[k] = Wq::pair(p);
      dw[k] = dw_pair(p, p + Wq::kBytes);
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const uint8_t* act = acts[t];
      const __m512i xq = _mm512_load_si512(act + L.qs_off + b * 32);
      const __m512i bias = _mm512_load_si512(act + L.bias_off + b * 32);
      const __m512 dx = _mm512_load_ps(act + L.d_off + b * 32);
#pragma GCC unroll 8
      for (int k = 0; k < R; ++k) {
        const __m512i s = _mm512_dpbusd_epi32(bias, w[k], xq);
        acc[k * T + t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw[k], dx), acc[k * T + t]);
      }
    }
  };
  int64_t b = 0;
  for (; b + 2 * U <= nb; b += 2 * U)
#pragma GCC unroll 2
    for (int u = 0; u < U; ++u) pair(b + 2 * u, accs[u]);
  for (; b + 2 <= nb; b += 2) pair(b, accs[0]);
  __m512* acc = accs[0];
#pragma GCC unroll 8
  for (int u = 1; u < U; ++u)
#pragma GCC unroll 8
    for (int j = 0; j < R * T; ++j) acc[j] = _mm512_add_ps(acc[j], accs[u][j]);
  if (b < nb) {  // odd block count: last block on ymm
    __m256i w[R];
    __m256 dw[R];
#pragma GCC unroll 8
    for (int k = 0; k < R; ++k) {
      const uint8_t* p = rows[k] + b * Wq::kBytes;
      w[k] = Wq::one(p);
      dw[k] = dw_one(p);
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const uint8_t* act = acts[t];
      const __m256i xq = _mm256_load_si256(reinterpret_cast<const __m256i*>(act + L.qs_off + b * 32));
      const __m256i bias = _mm256_load_si256(reinterpret_cast<const __m256i*>(act + L.bias_off + b * 32));
      const __m256 dx = _mm256_load_ps(reinterpret_cast<const float*>(act + L.d_off + b * 32));
#pragma GCC unroll 8
      for (int k = 0; k < R; ++k) {
        const __m256i s = _mm256_dpbusd_epi32(bias, w[k], xq);
        const __m256 lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw[k], dx),
                                          _mm512_castps512_ps256(acc[k * T + t]));
        acc[k * T + t] = _mm512_insertf32x8(acc[k * T + t], lo, 0);
      }
    }
  }
  store_sums<R * T>(acc, out);
}

// Q8_0 / Q4_0 micro-tile (the super-block kinds are in matmul_kquant_avx512.cpp).
template <class Wq, int R, int T>
inline void dot_any(const uint8_t* const* rows, int64_t nb, const uint8_t* const* acts, const ActLayout& L,
                    float* out) {
  dot_q<Wq, R, T>(rows, nb, acts, L, out);
}

// Rows [r0, r1) x the T token activations, one row at a time (sequential weight stream; with up to 8
// tokens the int8 kernel already has T independent chains and shares each weight unpack over T tokens).
template <class Wq, int T>
void rows_tile_q(const RowsArgs& a, const uint8_t* const* acts, float* y) {
  const int64_t nb = a.n_in / kQBlock;
  for (int64_t r = a.r0; r < a.r1; ++r) {
    const uint8_t* row = a.W + r * a.row_bytes;
    float out[T];
    dot_any<Wq, 1, T>(&row, nb, acts, a.act, out);
    for (int t = 0; t < T; ++t) y[t * a.y_stride + r] = out[t];
  }
}

// Rows of the cached micro-tile: 4 where the unroll leaves room (16 accumulators), else 2.
template <class Wq>
constexpr int kCachedRowsQ = Wq::kUnroll == 1 ? 4 : 2;

// Later tiles (rows already in L2): kCachedRowsQ rows x T <= kTileCachedQ tokens per micro-tile, so each
// activation load (quants, scale, bias) feeds several rows instead of 1: the R = 1 tile issues 3
// activation loads per 4 arithmetic instructions and is load-bound. Remainder rows one at a time (same
// arithmetic per output, see "Batch invariance").
template <class Wq, int T>
void rows_tile_q_cached(const RowsArgs& a, const uint8_t* const* acts, float* y) {
  constexpr int R = kCachedRowsQ<Wq>;
  const int64_t nb = a.n_in / kQBlock;
  int64_t r = a.r0;
  for (; r + R <= a.r1; r += R) {
    const uint8_t* rows[R];
    for (int k = 0; k < R; ++k) rows[k] = a.W + (r + k) * a.row_bytes;
    float out[R * T];
    dot_any<Wq, R, T>(rows, nb, acts, a.act, out);
    for (int k = 0; k < R; ++k)
      for (int t = 0; t < T; ++t) y[t * a.y_stride + r + k] = out[k * T + t];
  }
  for (; r < a.r1; ++r) {
    const uint8_t* row = a.W + r * a.row_bytes;
    float out[T];
    dot_any<Wq, 1, T>(&row, nb, acts, a.act, out);
    for (int t = 0; t < T; ++t) y[t * a.y_stride + r] = out[t];
  }
}

// rows_tile_q<Wq, nt> / rows_tile_q_cached<Wq, nt> for a runtime nt in [1, T].
template <class Wq, bool kCached, int T>
void tile_q(int nt, const RowsArgs& a, const uint8_t* const* acts, float* y) {
  if constexpr (T > 1) {
    if (nt < T) return tile_q<Wq, kCached, T - 1>(nt, a, acts, y);
  }
  if constexpr (kCached)
    rows_tile_q_cached<Wq, T>(a, acts, y);
  else
    rows_tile_q<Wq, T>(a, acts, y);
}

template <class Wq>
void rows_q(const RowsArgs& a) {
  const uint8_t* acts[kTile];
  // First tile: up to kTile tokens, streaming the rows from DRAM one at a time.
  const int n0 = static_cast<int>(imin(kTile, a.n_tokens));
  for (int t = 0; t < n0; ++t) acts[t] = static_cast<const uint8_t*>(a.x) + t * a.x_stride;
  tile_q<Wq, false, kTile>(n0, a, acts, a.y);
  for (int64_t t0 = n0; t0 < a.n_tokens; t0 += kTileCachedQ) {
    const int nt = static_cast<int>(imin(kTileCachedQ, a.n_tokens - t0));
    for (int t = 0; t < nt; ++t) acts[t] = static_cast<const uint8_t*>(a.x) + (t0 + t) * a.x_stride;
    tile_q<Wq, true, kTileCachedQ>(nt, a, acts, a.y + t0 * a.y_stride);
  }
}

// Activation quantisation; bit-identical to quant_act_scalar (same d / id formulas, cvtps2dq rounds to
// nearest-even like the scalar magic-number rounding, max is order-independent).
void quant_act_avx512(const float* x, int64_t n_in, int bias_k, const ActLayout& L, void* out) {
  auto* base = static_cast<uint8_t*>(out);
  const int64_t nb = n_in / kQBlock;
  for (int64_t b = 0; b < nb; ++b) {
    const __m512 v0 = _mm512_loadu_ps(x + b * 32), v1 = _mm512_loadu_ps(x + b * 32 + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = act_block_scale(amax);
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const __m512 vid = _mm512_set1_ps(id);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, vid));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, vid));
    const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    int8_t* qs = reinterpret_cast<int8_t*>(base + L.qs_off) + b * 32;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qs), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 16), _mm512_cvtsepi32_epi8(q1));
    _mm256_storeu_ps(reinterpret_cast<float*>(base + L.d_off) + b * 8, _mm256_set1_ps(d));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(reinterpret_cast<int32_t*>(base + L.bias_off) + b * 8),
                        _mm256_setr_epi32(-bias_k * sum, 0, 0, 0, 0, 0, 0, 0));
    reinterpret_cast<float*>(base + L.sum_off)[b] = d * static_cast<float>(sum);
    reinterpret_cast<float*>(base + L.dc_off)[b] = d;
  }
}

// ---------------------------------------------------------------------------------------------------
// Packed Q8_0 (kernels/matmul_packed.h): lane r of every vector is row 16 g + r. For block b and the
// 4-byte column group j, one vpdpbusd multiplies the 16 rows' codes (one 64-byte load) by token t's 4
// activation codes broadcast to every lane; 8 of them (j = 0..7) make the exact int32 block dot of 16
// rows, which then costs one convert, one scale product and one FMA. The int32 chain starts at the
// block's bias (-128 sum q_x); every output is one f32 FMA chain over its blocks, whatever the tile.
//
// Tiles: R groups x T tokens, 2 R T accumulators (int32 block dot, f32 sum) + R weight vectors. The
// first token tile streams each group from DRAM once (R = 1, T <= kPackedTile1: one sequential stream);
// later tiles find the task's groups in L2 and pair them (R = 2, T <= kPackedTile2) so each broadcast
// activation feeds two weight vectors.
constexpr int kPackedTile1 = 12;
constexpr int kPackedTile2 = 6;
// The streaming tile prefetches the record this far ahead (past a group's last record into the next
// group, which the pool's contiguous ranges make the same thread's next task as a rule): a task is only
// 64-256 KB (a Qwen3-0.6B K or V projection is 1.1 MB in ~32 tasks), and when tasks were handed out one
// shared counter at a time the hardware prefetchers restarted at every task. Decode at depth 0 on the
// Qwen3-0.6B shape (Zen VM, 4 alternating pairs of runs, before the ranges): 8 records ahead +6..+19 %
// tok/s over none; 4 and 8 alike in bench_matmul's GEMV rows (8 / 16 / 32 / 64 alike again with the
// ranges, 2026-12-07).
constexpr size_t kPackedAhead = 8 * 544;
static_assert(2 * 1 * kPackedTile1 + 1 + 2 <= 32 && 2 * 2 * kPackedTile2 + 2 + 2 <= 32, "packed tile exceeds 32 zmm");

template <int R, int T>
void packed_tile(const uint8_t* const* grp, int64_t nb, const uint8_t* const* acts, const ActLayout& L, __m512* out) {
  __m512 facc[R * T];
#pragma GCC unroll 32
  for (int j = 0; j < R * T; ++j) facc[j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512i iacc[R * T];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      int32_t bias;
      __builtin_memcpy(&bias, acts[t] + L.bias_off + b * 32, 4);
      const __m512i vb = _mm512_set1_epi32(bias);
#pragma GCC unroll 4
      for (int k = 0; k < R; ++k) iacc[k * T + t] = vb;
    }
    const size_t rec = static_cast<size_t>(b) * 544;
    if constexpr (R == 1) {
      // The streaming tile: the record kPackedAhead ahead (into the next group past a group's last record;
      // past the arena's end a prefetch is dropped, it never faults).
#pragma GCC unroll 9
      for (int c = 0; c < 544; c += 64) _mm_prefetch(reinterpret_cast<const char*>(grp[0] + rec + kPackedAhead + c), _MM_HINT_T0);
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      __m512i w[R];
#pragma GCC unroll 4
      for (int k = 0; k < R; ++k) w[k] = _mm512_loadu_si512(grp[k] + rec + j * 64);
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        int32_t xv;
        __builtin_memcpy(&xv, acts[t] + L.qs_off + b * 32 + 4 * j, 4);
        const __m512i xb = _mm512_set1_epi32(xv);
#pragma GCC unroll 4
        for (int k = 0; k < R; ++k) iacc[k * T + t] = _mm512_dpbusd_epi32(iacc[k * T + t], w[k], xb);
      }
    }
    __m512 dw[R];
#pragma GCC unroll 4
    for (int k = 0; k < R; ++k)
      dw[k] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(grp[k] + rec + 512)));
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512 dx = _mm512_set1_ps(reinterpret_cast<const float*>(acts[t] + L.d_off)[b * 8]);
#pragma GCC unroll 4
      for (int k = 0; k < R; ++k)
        facc[k * T + t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[k * T + t]), _mm512_mul_ps(dw[k], dx), facc[k * T + t]);
    }
  }
#pragma GCC unroll 32
  for (int j = 0; j < R * T; ++j) out[j] = facc[j];
}

// Groups [g0, g1) x T tokens, R groups per call, a remainder group alone.
template <int R, int T>
void packed_rows_tile(const PackedArgs& a, const uint8_t* const* acts, float* y) {
  int64_t g = a.g0;
  auto store = [&](int64_t grp_index, const __m512* v, int k) {
    const int64_t o0 = grp_index * 16;
    const int64_t valid = a.n_out - o0;
    const __mmask16 m = valid >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << valid) - 1u);
    for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + t * a.y_stride + o0, m, v[k * T + t]);
  };
  for (; g + R <= a.g1; g += R) {
    const uint8_t* grp[R];
    for (int k = 0; k < R; ++k) grp[k] = a.W + static_cast<size_t>(g + k) * a.group_bytes;
    __m512 out[R * T];
    packed_tile<R, T>(grp, a.nb, acts, a.act, out);
    for (int k = 0; k < R; ++k) store(g + k, out, k);
  }
  for (; g < a.g1; ++g) {
    const uint8_t* grp = a.W + static_cast<size_t>(g) * a.group_bytes;
    __m512 out[T];
    packed_tile<1, T>(&grp, a.nb, acts, a.act, out);
    store(g, out, 0);
  }
}

template <int R, int T>
void packed_tile_n(int nt, const PackedArgs& a, const uint8_t* const* acts, float* y) {
  if constexpr (T > 1) {
    if (nt < T) return packed_tile_n<R, T - 1>(nt, a, acts, y);
  }
  packed_rows_tile<R, T>(a, acts, y);
}

// PackedQ4K (matmul_packed.h): T tokens against one 16-row group. Per token: a dot (two for the GEMV), an
// isum, an msum and an f32 accumulator beside the weights, their two nibble halves and the scale vectors.
constexpr int kPackedKTile = 4;
// No software prefetch: the records stream in order and the kernel is compute-bound (one prefetch per line,
// 37 per record, two records ahead: GEMV 21 -> 27 GB/s per thread without them, decode 59-63 -> 74 tok/s
// on the Qwen3-0.6B Q4_K_M shape, AMD EPYC VM).

template <int T>
void packed_k_tile(const uint8_t* grp, int64_t nsb, const uint8_t* const* acts, const ActLayoutK& L, __m512* out) {
  const __m512i low = _mm512_set1_epi8(0x0f);
  __m512 facc[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) facc[t] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* rec = grp + static_cast<size_t>(sb) * 2368;
    __m512i isum[T], msum[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) isum[t] = msum[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      // GEMV: the high nibbles enter as 16 x code (w & 0xf0: one instruction instead of a shift and a mask)
      // into a second dot, a multiple of 16 that shifts back exactly: the same integer as the codes' dot
      // (+5-20 % GEMV in bench_matmul; with 4 tokens the extra add and shift per sub-block cost more).
      constexpr bool kHi16 = T == 1;
      __m512i dot[T], dot16[T];
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) dot[t] = dot16[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const __m512i w = _mm512_loadu_si512(rec + (4 * j + i) * 64);
        const __m512i lo = _mm512_and_si512(w, low);
        const __m512i hi = kHi16 ? _mm512_andnot_si512(low, w) : _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
          const int8_t* x = reinterpret_cast<const int8_t*>(acts[t] + L.qs_off) + sb * 256 + 32 * j + 4 * i;
          int32_t x0, x1;
          __builtin_memcpy(&x0, x, 4);
          __builtin_memcpy(&x1, x + 16, 4);
          dot[t] = _mm512_dpbusd_epi32(dot[t], lo, _mm512_set1_epi32(x0));
          if constexpr (kHi16) dot16[t] = _mm512_dpbusd_epi32(dot16[t], hi, _mm512_set1_epi32(x1));
          else dot[t] = _mm512_dpbusd_epi32(dot[t], hi, _mm512_set1_epi32(x1));
        }
      }
      if constexpr (kHi16) {
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) dot[t] = _mm512_add_epi32(dot[t], _mm512_srai_epi32(dot16[t], 4));
      }
      const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 2048 + 16 * j)));
      const __m512i mn = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 2176 + 16 * j)));
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const auto* bs = reinterpret_cast<const int16_t*>(acts[t] + L.bsum_off) + sb * 16 + 2 * j;
        isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(dot[t], sc));
        msum[t] = _mm512_add_epi32(msum[t], _mm512_mullo_epi32(mn, _mm512_set1_epi32(int32_t{bs[0]} + int32_t{bs[1]})));
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 2304)));
    const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 2336)));
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m512 dx = _mm512_set1_ps(reinterpret_cast<const float*>(acts[t] + L.d_off)[sb]);
      facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(d, dx), facc[t]);
      facc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(msum[t]), _mm512_mul_ps(dm, dx), facc[t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) out[t] = facc[t];
}

template <int T>
void packed_k_rows(const PackedArgsK& a, const uint8_t* const* acts, float* y) {
  for (int64_t g = a.g0; g < a.g1; ++g) {
    __m512 out[T];
    packed_k_tile<T>(a.W + static_cast<size_t>(g) * a.group_bytes, a.nsb, acts, a.act, out);
    const int64_t o0 = g * 16, valid = a.n_out - o0;
    const __mmask16 m = valid >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << valid) - 1u);
    for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + t * a.y_stride + o0, m, out[t]);
  }
}

template <int T>
void packed_k_n(int nt, const PackedArgsK& a, const uint8_t* const* acts, float* y) {
  if constexpr (T > 1) {
    if (nt < T) return packed_k_n<T - 1>(nt, a, acts, y);
  }
  packed_k_rows<T>(a, acts, y);
}

}  // namespace

void packed_q4k_avx512(const PackedArgsK& a) {
  const uint8_t* acts[kPackedKTile];
  for (int64_t t0 = 0; t0 < a.n_tokens; t0 += kPackedKTile) {
    const int nt = static_cast<int>(imin(kPackedKTile, a.n_tokens - t0));
    for (int t = 0; t < nt; ++t) acts[t] = a.x + (t0 + t) * a.x_stride;
    packed_k_n<kPackedKTile>(nt, a, acts, a.y + t0 * a.y_stride);
  }
}

void packed_q8_avx512(const PackedArgs& a) {
  const uint8_t* acts[kPackedTile1];
  const int n0 = static_cast<int>(imin(kPackedTile1, a.n_tokens));
  for (int t = 0; t < n0; ++t) acts[t] = a.x + t * a.x_stride;
  packed_tile_n<1, kPackedTile1>(n0, a, acts, a.y);
  for (int64_t t0 = n0; t0 < a.n_tokens; t0 += kPackedTile2) {
    const int nt = static_cast<int>(imin(kPackedTile2, a.n_tokens - t0));
    for (int t = 0; t < nt; ++t) acts[t] = a.x + (t0 + t) * a.x_stride;
    packed_tile_n<2, kPackedTile2>(nt, a, acts, a.y + t0 * a.y_stride);
  }
}

const IsaKernels& kernels_avx512() {
  static const IsaKernels k = {
      {rows_f<LdF32>, rows_f<LdF16>, rows_f<LdBF16>, rows_q<WQ8>, rows_q<WQ4>, kRowsKAvx512[0], kRowsKAvx512[1],
       kRowsKAvx512[2], kRowsKAvx512[3], kRowsKAvx512[4], kRowsKAvx512[5], rows_q<WQ5_0>,
       nullptr /* Q5_1: scalar (its per-block min term has no place in dot_q yet) */, rows_q<WIQ4NL>},
      quant_act_avx512,
      {0, 0, 0, 128, 8, 0, 0, 0, 0, 0, 0, 16, 0, 128},
      quant_act_k_avx512,
  };
  return k;
}

}  // namespace kvpack::kernels::detail
