// Internal to the key-scoring kernels (not a public header): the per-ISA entry points.
// Same ODR rule as attention_impl.h: nothing inline is shared between files built with different -m flags.
#pragma once
#include <cstdint>

#include "kernels/key_scoring.h"

namespace kvpack::kernels::ks_detail {

void key_neg_norms_scalar(const KvStreamView& kv, float* out);
void tri_key_scores_scalar(const KvStreamView& kv, const TriWeights& w, float* out);
// Requires tri_key_scores_has_avx512_path(kv, w) and an AVX-512 CPU.
void tri_key_scores_avx512(const KvStreamView& kv, const TriWeights& w, float* out);
void window_logits_scalar(const KvStreamView& kv, const float* q, int64_t q_stride, int32_t n_queries, int32_t group,
                          float scale, float* logits);
void group_logits_scalar(const KvStreamView& kv, const float* q, int32_t group, float scale, float* out);
// Requires F16 keys, head_dim % 16 == 0, 1 <= group <= 8 and an AVX-512 CPU.
void group_logits_avx512(const KvStreamView& kv, const float* q, int32_t group, float scale, float* out);
void digest_bounds_scalar(const float* q, int32_t nq, int32_t hd, const uint16_t* digests, int32_t n_pages, float* out);
// Requires hd % 16 == 0, hd <= 16 * kMaxDigestChunks and an AVX-512 CPU.
inline constexpr int32_t kMaxDigestChunks = 32;
void digest_bounds_avx512(const float* q, int32_t nq, int32_t hd, const uint16_t* digests, int32_t n_pages, float* out);
void page_shares_scalar(const float* bounds, const float* log_n, const float* lse, int32_t nq, int32_t n_pages, float* best,
                        double* share);
void page_shares_avx512(const float* bounds, const float* log_n, const float* lse, int32_t nq, int32_t n_pages, float* best,
                        double* share);
// key_redundancy: the unit f32 keys are built on the portable path; the n x n similarity sums on the chosen one.
void key_redundancy_with(const KvStreamView& kv, int32_t w_tail, bool avx512, float* out);
// R-KV's column sums over n unit keys (row-major, n x hd): col[j] = sum over rows i != j of k_i . k_j, less,
// for each row i, its entry at newest(i) (the largest j != i with k_i . k_j > 0.5 in f32; column 0 when
// there is none). The scalar path is the reference (one f32 dot per ordered pair, in element order); the
// AVX-512 path computes each unordered pair once, 8 rows x 16 columns at a time (the scalar dot's
// dependent chain made rkv's events take minutes at a 2K context). Results differ by rounding, and where a
// cosine lies within rounding of 0.5 the two may pick a different newest(i).
void redundancy_columns_scalar(const float* keys, int32_t n, int32_t hd, double* col);
// The AVX-512 path's scratch, owned by the caller (no std containers in the AVX-512 file), zero-filled:
// kt hd x round_up(n, 16) floats, kr round_up(n, kRedundancyRows) x hd floats, sums and newest
// round_up(n, 16) entries each.
inline constexpr int32_t kRedundancyRows = 8;
struct RedundancyScratch {
  float* kt;
  float* kr;
  double* sums;
  int32_t* newest;
};
void redundancy_columns_avx512(const float* keys, int32_t n, int32_t hd, const RedundancyScratch& w, double* col);
void key_novelty_scalar(const KvStreamView& kv, const KeyUnrotate& r, int32_t from, double* sum, float* out);
// dir = sum / ||sum|| in f32 (zeros for a zero sum): the direction key_novelty's cosines are taken against.
void unit_direction(const double* sum, int32_t hd, float* dir);
// key_novelty on AVX-512 (key_novelty_has_avx512_path, head_dim <= kMaxNoveltyDim): sum[e] += u_j[e] for
// j >= from, then out[j] = u_j . dir with dir = unit_direction(sum).
inline constexpr int32_t kMaxNoveltyDim = 1024;
void key_novelty_avx512(const KvStreamView& kv, const KeyUnrotate& r, int32_t from, double* sum, float* out);

}  // namespace kvpack::kernels::ks_detail
