// AVX-512 key scoring (built with the AVX-512 flags; called only when cpu_supports(Isa::Avx512,
// kKeyScoringIsa)). TriAttention's per-key work for the common production layout — F16 keys, NeoX
// rotary pairs (i, i + F), F a multiple of 16: the key's two halves are the real and imaginary band
// vectors, so one row is 2F/16 vcvtph2ps loads, F/16 vsqrtps and 3 FMAs per band vector per query head.
// The scalar path (one half-float conversion and one sqrt per element) measured ~350 ns per key at
// head_dim 128, most of a compaction event's time. No std code here (ODR, see key_scoring_internal.h).
// GCC 12's AVX-512 intrinsic headers trip -W(maybe-)uninitialized on their internal _mm512_undefined_*
// temporaries (GCC bug 105593, fixed in 13); the pragma must precede the include.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>

#include "kernels/exp_avx512.h"
#include "kernels/key_scoring_internal.h"

namespace kvpack::kernels::ks_detail {
namespace {

// One key against the G <= 8 query heads' weights: s[g].
void tri_row(const uint16_t* key, int32_t F, int32_t G, const float* u_re, const float* u_im, const float* wn, float* s) {
  __m512 acc[8];
  for (int32_t g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
  for (int32_t f = 0; f < F; f += 16) {
    const __m512 kr = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + f)));
    const __m512 ki = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + F + f)));
    const __m512 mag = _mm512_sqrt_ps(_mm512_fmadd_ps(kr, kr, _mm512_mul_ps(ki, ki)));
    for (int32_t g = 0; g < G; ++g) {
      const long o = static_cast<long>(g) * F + f;
      __m512 a = _mm512_fmadd_ps(kr, _mm512_loadu_ps(u_re + o), acc[g]);
      a = _mm512_fmadd_ps(ki, _mm512_loadu_ps(u_im + o), a);
      acc[g] = _mm512_fmadd_ps(mag, _mm512_loadu_ps(wn + o), a);
    }
  }
  for (int32_t g = 0; g < G; ++g) s[g] = _mm512_reduce_add_ps(acc[g]);
}

// digest_bounds for query vectors [v0, v0 + NV) over pages [p0, p0 + NP): max(q_i min_i, q_i max_i) is
// q_i max_i where q_i >= 0 and q_i min_i where q_i < 0 (rounding is monotone, so the products compare the
// same way): one blend chosen by the query's sign mask and one FMA per element.
template <int NV, int NP>
void digest_bounds_pages(const float* q, int32_t nq, int32_t v0, int32_t chunks, const __mmask16 (*neg)[kMaxDigestChunks],
                         const uint16_t* digests, int32_t p0, float* out) {
  const long hd = static_cast<long>(chunks) * 16;
  __m512 acc[NP][NV];
  for (int32_t p = 0; p < NP; ++p)
    for (int32_t v = 0; v < NV; ++v) acc[p][v] = _mm512_setzero_ps();
  for (int32_t c = 0; c < chunks; ++c) {
    __m512 qv[NV];
    for (int32_t v = 0; v < NV; ++v) qv[v] = _mm512_loadu_ps(q + (v0 + v) * hd + c * 16);
    for (int32_t p = 0; p < NP; ++p) {
      const uint16_t* mn = digests + (p0 + p) * 2 * hd + c * 16;
      const __m512 lo = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mn)));
      const __m512 hi = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mn + hd)));
      for (int32_t v = 0; v < NV; ++v) acc[p][v] = _mm512_fmadd_ps(qv[v], _mm512_mask_blend_ps(neg[v][c], hi, lo), acc[p][v]);
    }
  }
  for (int32_t p = 0; p < NP; ++p) {
    float* o = out + static_cast<long>(p0 + p) * nq + v0;
    int32_t v = 0;
    for (; v + 1 < NV; v += 2) {  // a's and b's 128-bit quarters summed pairwise, then within the quarter
      const __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(acc[p][v], acc[p][v + 1], 0x44), _mm512_shuffle_f32x4(acc[p][v], acc[p][v + 1], 0xEE));
      const __m512 u = _mm512_add_ps(t, _mm512_shuffle_f32x4(t, t, 0xB1));
      const __m512 w = _mm512_add_ps(u, _mm512_permute_ps(u, 0x4E));
      const __m512 x = _mm512_add_ps(w, _mm512_permute_ps(w, 0xB1));
      o[v] = _mm512_cvtss_f32(x);
      o[v + 1] = _mm_cvtss_f32(_mm512_extractf32x4_ps(x, 2));
    }
    if (v < NV) o[v] = _mm512_reduce_add_ps(acc[p][v]);
  }
}

// All pages for NV query vectors, kPages at a time (8 / NV, at least 1) and the rest one by one.
template <int NV>
void digest_bounds_block(const float* q, int32_t nq, int32_t v0, int32_t chunks, const uint16_t* digests, int32_t n_pages, float* out) {
  constexpr int32_t kPages = NV >= 8 ? 1 : 8 / NV;
  __mmask16 neg[NV][kMaxDigestChunks];
  for (int32_t v = 0; v < NV; ++v)
    for (int32_t c = 0; c < chunks; ++c)
      neg[v][c] = _mm512_cmp_ps_mask(_mm512_loadu_ps(q + static_cast<long>(v0 + v) * chunks * 16 + c * 16), _mm512_setzero_ps(), _CMP_LT_OQ);
  int32_t p = 0;
  for (; p + kPages <= n_pages; p += kPages) digest_bounds_pages<NV, kPages>(q, nq, v0, chunks, neg, digests, p, out);
  for (; p < n_pages; ++p) digest_bounds_pages<NV, 1>(q, nq, v0, chunks, neg, digests, p, out);
}

}  // namespace

void group_logits_avx512(const KvStreamView& kv, const float* q, int32_t group, float scale, float* out) {
  // One vcvtph2ps per 16 key elements, shared by the group's query heads.
  const int32_t hd = kv.head_dim, ps = kv.page_size, n_slots = kv.n_slots;
  __m512 acc[8];
  for (int32_t s0 = 0; s0 < n_slots; s0 += ps) {
    const auto* page = reinterpret_cast<const uint16_t*>(kv.pages[s0 / ps]);
    const int32_t n = n_slots - s0 < ps ? n_slots - s0 : ps;
    for (int32_t r = 0; r < n; ++r) {
      const uint16_t* key = page + static_cast<long>(r) * hd;
      for (int32_t g = 0; g < group; ++g) acc[g] = _mm512_setzero_ps();
      for (int32_t e = 0; e < hd; e += 16) {
        const __m512 k = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + e)));
        for (int32_t g = 0; g < group; ++g) acc[g] = _mm512_fmadd_ps(k, _mm512_loadu_ps(q + static_cast<long>(g) * hd + e), acc[g]);
      }
      for (int32_t g = 0; g < group; ++g) out[static_cast<long>(g) * n_slots + s0 + r] = _mm512_reduce_add_ps(acc[g]) * scale;
    }
  }
}

void digest_bounds_avx512(const float* q, int32_t nq, int32_t hd, const uint16_t* digests, int32_t n_pages, float* out) {
  // Up to 8 query vectors per pass share each converted digest chunk (a check scores every cold page of a
  // long context). Several pages go through together so that 8 accumulator chains are in flight: with one
  // page and a GQA group of 2 the two chains of 8 dependent FMAs set the speed (measured 29 ns per page in
  // cache at head_dim 128, ~80 cycles for ~70 instructions).
  constexpr int32_t kBlock = 8;
  const int32_t chunks = hd / 16;  // <= kMaxDigestChunks (digest_bounds_on routes larger head_dims to scalar)
  for (int32_t v0 = 0; v0 < nq; v0 += kBlock) {
    const int32_t nv = std::min(kBlock, nq - v0);
    switch (nv) {
      case 1: digest_bounds_block<1>(q, nq, v0, chunks, digests, n_pages, out); break;
      case 2: digest_bounds_block<2>(q, nq, v0, chunks, digests, n_pages, out); break;
      case 3: digest_bounds_block<3>(q, nq, v0, chunks, digests, n_pages, out); break;
      case 4: digest_bounds_block<4>(q, nq, v0, chunks, digests, n_pages, out); break;
      case 5: digest_bounds_block<5>(q, nq, v0, chunks, digests, n_pages, out); break;
      case 6: digest_bounds_block<6>(q, nq, v0, chunks, digests, n_pages, out); break;
      case 7: digest_bounds_block<7>(q, nq, v0, chunks, digests, n_pages, out); break;
      default: digest_bounds_block<8>(q, nq, v0, chunks, digests, n_pages, out); break;
    }
  }
}

void page_shares_avx512(const float* bounds, const float* log_n, const float* lse, int32_t nq, int32_t n_pages, float* best,
                        double* share) {
  // One query at a time over all pages, 16 pages per vector: the bounds of query v are gathered with stride
  // nq, best[] is kept in memory between queries (max is exact, so the order does not change it), and
  // the shares go into two f64 accumulators of 8 lanes.
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  for (int32_t p0 = 0; p0 < n_pages; p0 += 16) {
    const int32_t k = n_pages - p0;
    const __mmask16 m = k >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << k) - 1u);
    _mm512_mask_storeu_ps(best + p0, m, neg_inf);
  }
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (int32_t v = 0; v < nq; ++v) {
    const __m512 lse_v = _mm512_set1_ps(lse[v]);
    __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
    for (int32_t p0 = 0; p0 < n_pages; p0 += 16) {
      const int32_t k = n_pages - p0;
      const __mmask16 m = k >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << k) - 1u);
      const __m512 ln = _mm512_maskz_loadu_ps(m, log_n + p0);
      const __mmask16 live = _mm512_mask_cmp_ps_mask(m, ln, neg_inf, _CMP_GT_OQ);
      if (live == 0) continue;
      const __m512i idx = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_add_epi32(_mm512_set1_epi32(p0), lane), _mm512_set1_epi32(nq)),
                                           _mm512_set1_epi32(v));
      const __m512 b = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live, idx, bounds, 4);
      const __m512 ls = _mm512_sub_ps(_mm512_add_ps(b, ln), lse_v);
      const __m512 old = _mm512_maskz_loadu_ps(m, best + p0);
      _mm512_mask_storeu_ps(best + p0, live, _mm512_max_ps(old, ls));
      const __m512 e = exp_ps(_mm512_min_ps(ls, _mm512_set1_ps(80.0f)));
      const __mmask16 add = _mm512_mask_cmp_ps_mask(live, ls, _mm512_set1_ps(-60.0f), _CMP_GT_OQ);
      acc0 = _mm512_mask_add_pd(acc0, static_cast<__mmask8>(add), acc0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
      acc1 = _mm512_mask_add_pd(acc1, static_cast<__mmask8>(add >> 8), acc1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
    }
    share[v] += _mm512_reduce_add_pd(_mm512_add_pd(acc0, acc1));
  }
}

void key_novelty_avx512(const KvStreamView& kv, const KeyUnrotate& r, int32_t from, double* sum, float* out) {
  const int32_t hd = kv.head_dim, ps = kv.page_size, n_slots = kv.n_slots, half = r.rot_dims / 2;
  // (cos, sin) pairs of a table row -> a vector of 16 cosines and one of 16 sines.
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  // One unit pre-RoPE key at a time in a stack buffer (L1) instead of all of them in an n_slots x
  // head_dim f32 array: that array (1.1 MB per stream at 2K slots) was allocated, zeroed, written and read
  // back for every stream at every event, and pushed the stream's keys out of L2 before the TriAttention
  // pass read them again. The slots >= from are un-rotated twice (once for the sum, once for the dot):
  // a decode-time event adds ~128 of ~2K.
  constexpr int32_t kRotAhead = 4;
  alignas(64) float k[kMaxNoveltyDim];
  alignas(64) float dir[kMaxNoveltyDim];
  auto unit_key = [&](int32_t j) {
    const auto* key = reinterpret_cast<const uint16_t*>(kv.pages[j / ps]) + static_cast<long>(j % ps) * hd;
    // The same row of the next page, and the rotation row a few slots on: pages are scattered over the
    // pool and positions over the table, so the hardware prefetcher stops at each page's end.
    if (j + ps < n_slots) {
      const auto* next = reinterpret_cast<const char*>(reinterpret_cast<const uint16_t*>(kv.pages[j / ps + 1]) + static_cast<long>(j % ps) * hd);
      for (int32_t o = 0; o < hd * 2; o += 64) _mm_prefetch(next + o, _MM_HINT_T0);
    }
    if (half > 0 && r.positions != nullptr && j + kRotAhead < n_slots) {
      const auto* row = reinterpret_cast<const char*>(r.cs + static_cast<long>(r.positions[j + kRotAhead]) * r.rot_dims);
      for (int32_t o = 0; o < r.rot_dims * 4; o += 64) _mm_prefetch(row + o, _MM_HINT_T0);
    }
    for (int32_t e = 0; e < hd; e += 16)
      _mm512_store_ps(k + e, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + e))));
    if (half > 0) {
      const long row = r.positions != nullptr ? r.positions[j] : j;
      const float* cs = r.cs + row * r.rot_dims;
      for (int32_t i = 0; i < half; i += 16) {
        const __m512 a0 = _mm512_loadu_ps(cs + 2 * i), a1 = _mm512_loadu_ps(cs + 2 * i + 16);
        const __m512 c = _mm512_permutex2var_ps(a0, even, a1), s = _mm512_permutex2var_ps(a0, odd, a1);
        const __m512 x = _mm512_load_ps(k + i), y = _mm512_load_ps(k + i + half);
        // Products and differences as the scalar rope_apply rounds them (no fused multiply-add).
        _mm512_store_ps(k + i, _mm512_sub_ps(_mm512_mul_ps(x, c), _mm512_mul_ps(y, s)));
        _mm512_store_ps(k + i + half, _mm512_add_ps(_mm512_mul_ps(x, s), _mm512_mul_ps(y, c)));
      }
    }
    __m512d ss = _mm512_setzero_pd();
    for (int32_t e = 0; e < hd; e += 8) {
      const __m512d v = _mm512_cvtps_pd(_mm256_load_ps(k + e));
      ss = _mm512_fmadd_pd(v, v, ss);
    }
    const double s2 = _mm512_reduce_add_pd(ss);
    const float inv = s2 > 0 ? static_cast<float>(1.0 / _mm_cvtsd_f64(_mm_sqrt_sd(_mm_setzero_pd(), _mm_set_sd(s2)))) : 0.0f;
    const __m512 vinv = _mm512_set1_ps(inv);
    for (int32_t e = 0; e < hd; e += 16) _mm512_store_ps(k + e, _mm512_mul_ps(_mm512_load_ps(k + e), vinv));
  };
  for (int32_t j = from; j < n_slots; ++j) {  // the stream's new slots join its running sum
    unit_key(j);
    for (int32_t e = 0; e < hd; e += 8)
      _mm512_storeu_pd(sum + e, _mm512_add_pd(_mm512_loadu_pd(sum + e), _mm512_cvtps_pd(_mm256_load_ps(k + e))));
  }
  unit_direction(sum, hd, dir);
  for (int32_t j = 0; j < n_slots; ++j) {
    unit_key(j);
    __m512 acc = _mm512_setzero_ps();
    for (int32_t e = 0; e < hd; e += 16) acc = _mm512_fmadd_ps(_mm512_load_ps(k + e), _mm512_load_ps(dir + e), acc);
    out[j] = _mm512_reduce_add_ps(acc);
  }
}

void redundancy_columns_avx512(const float* keys, int32_t n, int32_t hd, const RedundancyScratch& w, double* col) {
  constexpr int32_t R = kRedundancyRows;  // rows per tile: 8 independent FMA chains cover the FMA latency
  const int32_t n16 = (n + 15) / 16 * 16;
  float* kt = w.kt;
  double* sums = w.sums;
  int32_t* newest = w.newest;
  for (int32_t j = 0; j < n; ++j)
    for (int32_t e = 0; e < hd; ++e) kt[static_cast<long>(e) * n16 + j] = keys[static_cast<long>(j) * hd + e];
  for (long x = 0; x < static_cast<long>(n) * hd; ++x) w.kr[x] = keys[x];
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i nv = _mm512_set1_epi32(n);
  const __m512 half = _mm512_set1_ps(0.5f);
  for (int32_t i0 = 0; i0 < n; i0 += R) {
    __m512 rows[R];  // per row, its upper-triangle entries summed lane-wise: column i's sum over rows j > i
    for (auto& v : rows) v = _mm512_setzero_ps();
    const float* ki = w.kr + static_cast<long>(i0) * hd;
    // Only the pairs j > i: each unordered pair once, both of its columns updated from it.
    for (int32_t j0 = i0 / 16 * 16; j0 < n16; j0 += 16) {
      __m512 acc[R];
      for (auto& v : acc) v = _mm512_setzero_ps();
      const float* kc = kt + j0;
      // Element order, one f32 FMA per element: the rounding the exemption below reproduces.
      for (int32_t e = 0; e < hd; ++e) {
        const __m512 c = _mm512_loadu_ps(kc + static_cast<long>(e) * n16);
        for (int32_t r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(ki[r * hd + e]), c, acc[r]);
      }
      const __m512i jv = _mm512_add_epi32(_mm512_set1_epi32(j0), lane);
      const __mmask16 in_range = _mm512_cmplt_epi32_mask(jv, nv);
      __m512 cs = _mm512_setzero_ps();
      for (int32_t r = 0; r < R; ++r) {
        const int32_t i = i0 + r;
        const __mmask16 live = _mm512_mask_cmpgt_epi32_mask(in_range, jv, _mm512_set1_epi32(i));
        const __m512 sv = _mm512_maskz_mov_ps(live, acc[r]);
        cs = _mm512_add_ps(cs, sv);
        rows[r] = _mm512_add_ps(rows[r], sv);
        const unsigned near = _mm512_mask_cmp_ps_mask(live, sv, half, _CMP_GT_OQ);
        if (near != 0) {  // rare: near-duplicates. Row i's newest is its largest such j; i is a candidate of row j.
          const int32_t last = j0 + 31 - __builtin_clz(near);
          if (last > newest[i]) newest[i] = last;
          for (unsigned m = near; m != 0; m &= m - 1) {
            int32_t& nj = newest[j0 + __builtin_ctz(m)];
            if (i > nj) nj = i;
          }
        }
      }
      double* cd = sums + j0;
      _mm512_storeu_pd(cd, _mm512_add_pd(_mm512_loadu_pd(cd), _mm512_cvtps_pd(_mm512_castps512_ps256(cs))));
      _mm512_storeu_pd(cd + 8, _mm512_add_pd(_mm512_loadu_pd(cd + 8), _mm512_cvtps_pd(_mm512_extractf32x8_ps(cs, 1))));
    }
    for (int32_t r = 0; r < R && i0 + r < n; ++r) sums[i0 + r] += _mm512_reduce_add_ps(rows[r]);
  }
  // Each row's newest near-duplicate (column 0 without one) leaves that column: its entry, recomputed with
  // the same chain of f32 FMAs the tile ran (k_i . k_j and k_j . k_i round alike).
  for (int32_t i = 0; i < n; ++i) {
    const int32_t j = newest[i];
    if (j == i) continue;
    float d = 0;
    for (int32_t e = 0; e < hd; ++e) d = __builtin_fmaf(keys[static_cast<long>(i) * hd + e], keys[static_cast<long>(j) * hd + e], d);
    sums[j] -= d;
  }
  for (int32_t j = 0; j < n; ++j) col[j] = sums[j];
}

void tri_key_scores_avx512(const KvStreamView& kv, const TriWeights& w, float* out) {
  const int32_t F = w.n_bands, G = w.group, ps = kv.page_size, n_slots = kv.n_slots;
  const long row_halves = kv.head_dim;  // F16 row: head_dim halves
  float sg[8];
  for (int32_t s0 = 0; s0 < n_slots; s0 += ps) {
    const auto* page = reinterpret_cast<const uint16_t*>(kv.pages[s0 / ps]);
    const int32_t n = n_slots - s0 < ps ? n_slots - s0 : ps;
    for (int32_t r = 0; r < n; ++r) {
      tri_row(page + r * row_halves, F, G, w.u_re, w.u_im, w.wn, sg);
      for (int32_t g = 0; g < G; ++g) out[static_cast<long>(g) * n_slots + s0 + r] = sg[g];
    }
  }
}

}  // namespace kvpack::kernels::ks_detail
