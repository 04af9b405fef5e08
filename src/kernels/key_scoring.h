// Key-scoring kernels of the KV compression policies (src/compress/scorer_*.cpp turn their numbers into
// scores): per-slot quantities computed from the keys of one KV stream, read page by page from a
// KvStreamView (the view attention uses) and widened to f32 with kv_decode_row, for every KV type
// (F32 / F16 / BF16 / Q8_0).
//
//   key_neg_norms      -||k_j||                                    (KNorm; the norm accumulated in f64)
//   tri_key_scores     Σ_f kr_f·u_re[g][f] + ki_f·u_im[g][f] + wn[g][f]·|k_f| per GQA query head g
//                      (TriAttention, the query side folded into u_re / u_im / wn by the caller)
//   window_logits      max over the GQA group of (q_i · k_j)·scale for w recent queries (SnapKV, R-KV)
//   group_logits       (q_g · k_j)·scale for each query head g of the group (TOVA's last query)
//   key_redundancy     R-KV's cosine redundancy of every key against all the others
//   key_novelty        cosine of each unit pre-RoPE key to a running sum of them (TriSpan's novelty),
//                      the sum updated with the stream's new slots first
//
// Dispatch: kernels/cpu_features, family kKeyScoringIsa (KVPACK_ISA forces it like every family).
// ISA-specific paths: tri_key_scores (AVX-512, F16 keys in NeoX layout: the production case, where
// per-key work dominated a compaction event), group_logits (AVX-512, F16 keys, head_dim % 16 == 0, group
// <= 8: recall's hot logits at every check), digest_bounds (AVX-512, head_dim % 16 == 0), page_shares (AVX-512) and key_novelty
// (AVX-512, F16 keys, NeoX: TriSpan's per-key work at every event); every other
// kernel, and these on avx2, is the scalar code. Arithmetic order is fixed per path, so results are
// reproducible run to run (paths differ from each other by float rounding).
// Thread-safety: pure functions of their arguments; the caller parallelises over streams.
#pragma once
#include <cstdint>

#include "kernels/attention.h"
#include "kernels/cpu_features.h"

namespace kvpack::kernels {

// out[j] = -sqrt(Σ_e k_j[e]²) (sum in f64), j < kv.n_slots.
void key_neg_norms(const KvStreamView& kv, float* out);

// TriAttention's per-key weights for the G query heads of one GQA group: [group][n_bands] each.
struct TriWeights {
  const float* u_re = nullptr;
  const float* u_im = nullptr;
  const float* wn = nullptr;
  int32_t n_bands = 0;  // F = rope_dims / 2
  int32_t group = 1;
  bool rope_neox = false;  // band f is elements (f, f + F) (NeoX) or (2f, 2f + 1) (GPT-J)
};
// out[g * n_slots + j] for g < group, j < kv.n_slots.
void tri_key_scores(const KvStreamView& kv, const TriWeights& w, float* out);
// The same on an explicitly chosen path (tests): throws std::invalid_argument if this CPU cannot run it.
void tri_key_scores_on(Isa isa, const KvStreamView& kv, const TriWeights& w, float* out);
// True if the AVX-512 path serves these arguments (F16 keys, NeoX, n_bands % 16 == 0, group <= 8).
bool tri_key_scores_has_avx512_path(const KvStreamView& kv, const TriWeights& w);

// logits[i * n_slots + j] = max_g (q(i, g) · k_j) * scale, q(i, g) = q + i * q_stride + g * head_dim,
// for i < n_queries, g < group.
void window_logits(const KvStreamView& kv, const float* q, int64_t q_stride, int32_t n_queries, int32_t group,
                   float scale, float* logits);
// out[g * n_slots + j] = (q(g) · k_j) * scale, q(g) = q + g * head_dim, for g < group.
void group_logits(const KvStreamView& kv, const float* q, int32_t group, float scale, float* out);
// The same on an explicitly chosen path (tests); throws std::invalid_argument if this CPU cannot run it.
void group_logits_on(Isa isa, const KvStreamView& kv, const float* q, int32_t group, float scale, float* out);

// Quest's page bound for recall (kv/evicted_kv.h): digests = n_pages x [head_dim minima, head_dim maxima],
// f16 bits; out[p * nq + v] = Σ_i max(q_v[i] * min_p[i], q_v[i] * max_p[i]), q_v = q + v * head_dim, v < nq.
void digest_bounds(const float* q, int32_t nq, int32_t head_dim, const uint16_t* digests, int32_t n_pages, float* out);
void digest_bounds_on(Isa isa, const float* q, int32_t nq, int32_t head_dim, const uint16_t* digests, int32_t n_pages, float* out);

// Recall's bounded page shares from digest_bounds' output: for each page p whose log_n[p] (log of its
// slot count) is finite, and each query v < nq, ls = (bounds[p * nq + v] + log_n[p]) - lse[v] (f32, in
// this order); best[p] = max_v ls (-inf for a page with log_n[p] = -inf: lost or empty); and
// share[v] += exp(min(80, ls)) wherever ls > -60 (shares below e^-60 of the hot mass change no sum), the
// exp in f32 and the sum in f64. share is accumulated into, not cleared. best is the same on every path;
// share differs between paths by rounding (the AVX-512 exp is within ~1e-7 of std::exp, summed in another
// order). The AVX-512 path: a check bounds every cold page of a long context and the scalar exp was as
// costly as the bounds themselves.
void page_shares(const float* bounds, const float* log_n, const float* lse, int32_t nq, int32_t n_pages, float* best,
                 double* share);
void page_shares_on(Isa isa, const float* bounds, const float* log_n, const float* lse, int32_t nq, int32_t n_pages,
                    float* best, double* share);

// R-KV redundancy (triattention repo baselines/utils.py cal_similarity, sliced [:, :-w]): C = cosine
// similarity of all n keys (zero diagonal); each row's newest near-duplicate (cos > 0.5) is exempted
// (a row without one zeroes column 0); out[j] = softmax_j(mean_i C[i, j]) for j < n - w_tail, 0 in the
// last w_tail slots.
void key_redundancy(const KvStreamView& kv, int32_t w_tail, float* out);
// The same on an explicitly chosen path (tests); throws std::invalid_argument if this CPU cannot run it.
// The paths differ by rounding (see ks_detail::redundancy_columns_*).
void key_redundancy_on(Isa isa, const KvStreamView& kv, int32_t w_tail, float* out);

// Unit pre-RoPE keys for key_novelty: u_j = R(-p_j) k_j / ||k_j||, the rotation undone with the inverse
// angles of slot j's position. cs = [n_slots][rot_dims / 2] (cos, sin) pairs as kernels::rope_table writes
// them for the NEGATED positions (the caller builds one table per position list; every stream holding the
// same positions shares it); rot_dims <= head_dim (the first rot_dims elements are rotated); neox: the
// pairing of rope_apply ((i, i + rot_dims / 2), else (2i, 2i + 1)).
// With `positions` set, cs is indexed by position instead: slot j's row is cs + positions[j] * rot_dims
// (a table of every position, NEGATED as above, shared by streams whose slots differ).
struct KeyUnrotate {
  const float* cs = nullptr;
  int32_t rot_dims = 0;
  bool neox = false;
  const int32_t* positions = nullptr;
};
// TriSpan's key novelty of one stream: first sum[e] += u_j[e] (f64) for the slots j >= from (the slots the
// stream has not seen before), then out[j] = u_j · sum / ||sum|| for every slot j < n_slots (0 where the key
// or the sum is zero). sum has head_dim entries.
void key_novelty(const KvStreamView& kv, const KeyUnrotate& r, int32_t from, double* sum, float* out);
// The same on an explicitly chosen path (tests); throws std::invalid_argument if this CPU cannot run it.
void key_novelty_on(Isa isa, const KvStreamView& kv, const KeyUnrotate& r, int32_t from, double* sum, float* out);
// True if the AVX-512 path serves these arguments (F16 keys, head_dim % 16 == 0, NeoX pairs with
// rot_dims / 2 % 16 == 0 or no rotation): the un-rotation is bitwise the scalar one (no FMA), the norm and
// the final dot sum in 16 lanes, so scores differ from scalar by rounding.
bool key_novelty_has_avx512_path(const KvStreamView& kv, const KeyUnrotate& r);

// The path key scoring runs here ("scalar", "avx2" (= scalar code), "avx512").
const char* key_scoring_isa();

}  // namespace kvpack::kernels
