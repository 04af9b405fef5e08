// Key scoring: argument checks and the run-time path choice (kernels/cpu_features, kKeyScoringIsa).
// The kernels are in key_scoring_scalar.cpp / key_scoring_avx512.cpp.
#include "kernels/key_scoring.h"

#include <stdexcept>
#include <string>
#include <vector>
#include <cmath>

#include "kernels/key_scoring_internal.h"

namespace kvpack::kernels {
namespace {

void check(const KvStreamView& kv, const char* fn) {
  if (!kv_type_supported(kv.kv_type) || kv.head_dim <= 0 || kv.page_size <= 0 || kv.n_slots < 0 ||
      (kv.n_slots > 0 && kv.pages == nullptr))
    throw std::invalid_argument(std::string(fn) + ": invalid KV stream view");
}

}  // namespace

bool tri_key_scores_has_avx512_path(const KvStreamView& kv, const TriWeights& w) {
  return kv.kv_type == DType::F16 && w.rope_neox && w.n_bands % 16 == 0 && w.group >= 1 && w.group <= 8 &&
         2 * w.n_bands <= kv.head_dim;
}

void key_neg_norms(const KvStreamView& kv, float* out) {
  check(kv, "key_neg_norms");
  ks_detail::key_neg_norms_scalar(kv, out);
}

void tri_key_scores_on(Isa isa, const KvStreamView& kv, const TriWeights& w, float* out) {
  check(kv, "tri_key_scores");
  if (!cpu_supports(isa, kKeyScoringIsa))
    throw std::invalid_argument(std::string("tri_key_scores_on: ") + isa_name(isa) + " is not available on this CPU");
  if (2 * w.n_bands > kv.head_dim || w.group < 1) throw std::invalid_argument("tri_key_scores: n_bands / group out of range");
  if (isa == Isa::Avx512 && tri_key_scores_has_avx512_path(kv, w))
    ks_detail::tri_key_scores_avx512(kv, w, out);
  else
    ks_detail::tri_key_scores_scalar(kv, w, out);
}

void tri_key_scores(const KvStreamView& kv, const TriWeights& w, float* out) {
  tri_key_scores_on(selected_isa(kKeyScoringIsa), kv, w, out);
}

void window_logits(const KvStreamView& kv, const float* q, int64_t q_stride, int32_t n_queries, int32_t group,
                   float scale, float* logits) {
  check(kv, "window_logits");
  ks_detail::window_logits_scalar(kv, q, q_stride, n_queries, group, scale, logits);
}

void group_logits(const KvStreamView& kv, const float* q, int32_t group, float scale, float* out) {
  group_logits_on(selected_isa(kKeyScoringIsa), kv, q, group, scale, out);
}

void group_logits_on(Isa isa, const KvStreamView& kv, const float* q, int32_t group, float scale, float* out) {
  check(kv, "group_logits");
  if (!cpu_supports(isa, kKeyScoringIsa))
    throw std::invalid_argument(std::string("group_logits_on: ") + isa_name(isa) + " is not available on this CPU");
  if (isa == Isa::Avx512 && kv.kv_type == DType::F16 && kv.head_dim % 16 == 0 && group >= 1 && group <= 8)
    ks_detail::group_logits_avx512(kv, q, group, scale, out);
  else
    ks_detail::group_logits_scalar(kv, q, group, scale, out);
}

void digest_bounds_on(Isa isa, const float* q, int32_t nq, int32_t head_dim, const uint16_t* digests, int32_t n_pages, float* out) {
  if (nq < 0 || head_dim <= 0 || n_pages < 0 || (n_pages > 0 && nq > 0 && (q == nullptr || digests == nullptr || out == nullptr)))
    throw std::invalid_argument("digest_bounds: invalid arguments");
  if (!cpu_supports(isa, kKeyScoringIsa))
    throw std::invalid_argument(std::string("digest_bounds_on: ") + isa_name(isa) + " is not available on this CPU");
  if (isa == Isa::Avx512 && head_dim % 16 == 0 && head_dim <= 16 * ks_detail::kMaxDigestChunks)
    ks_detail::digest_bounds_avx512(q, nq, head_dim, digests, n_pages, out);
  else
    ks_detail::digest_bounds_scalar(q, nq, head_dim, digests, n_pages, out);
}

void digest_bounds(const float* q, int32_t nq, int32_t head_dim, const uint16_t* digests, int32_t n_pages, float* out) {
  digest_bounds_on(selected_isa(kKeyScoringIsa), q, nq, head_dim, digests, n_pages, out);
}

void page_shares_on(Isa isa, const float* bounds, const float* log_n, const float* lse, int32_t nq, int32_t n_pages,
                    float* best, double* share) {
  if (nq < 0 || n_pages < 0 || (n_pages > 0 && (log_n == nullptr || best == nullptr || (nq > 0 && bounds == nullptr))) ||
      (nq > 0 && (lse == nullptr || share == nullptr)))
    throw std::invalid_argument("page_shares: invalid arguments");
  if (!cpu_supports(isa, kKeyScoringIsa))
    throw std::invalid_argument(std::string("page_shares_on: ") + isa_name(isa) + " is not available on this CPU");
  if (isa == Isa::Avx512)
    ks_detail::page_shares_avx512(bounds, log_n, lse, nq, n_pages, best, share);
  else
    ks_detail::page_shares_scalar(bounds, log_n, lse, nq, n_pages, best, share);
}

void page_shares(const float* bounds, const float* log_n, const float* lse, int32_t nq, int32_t n_pages, float* best,
                 double* share) {
  page_shares_on(selected_isa(kKeyScoringIsa), bounds, log_n, lse, nq, n_pages, best, share);
}

void key_redundancy(const KvStreamView& kv, int32_t w_tail, float* out) {
  key_redundancy_on(selected_isa(kKeyScoringIsa), kv, w_tail, out);
}

void key_redundancy_on(Isa isa, const KvStreamView& kv, int32_t w_tail, float* out) {
  check(kv, "key_redundancy");
  if (!cpu_supports(isa, kKeyScoringIsa))
    throw std::invalid_argument(std::string("key_redundancy_on: ") + isa_name(isa) + " is not available on this CPU");
  ks_detail::key_redundancy_with(kv, w_tail, isa == Isa::Avx512, out);
}

void key_novelty(const KvStreamView& kv, const KeyUnrotate& r, int32_t from, double* sum, float* out) {
  check(kv, "key_novelty");
  if (r.rot_dims < 0 || r.rot_dims > kv.head_dim || r.rot_dims % 2 != 0 || (r.rot_dims > 0 && kv.n_slots > 0 && r.cs == nullptr))
    throw std::invalid_argument("key_novelty: rot_dims must be even, <= head_dim, with a table");
  if (from < 0 || from > kv.n_slots) throw std::invalid_argument("key_novelty: from out of range");
  key_novelty_on(selected_isa(kKeyScoringIsa), kv, r, from, sum, out);
}

bool key_novelty_has_avx512_path(const KvStreamView& kv, const KeyUnrotate& r) {
  return kv.kv_type == DType::F16 && kv.head_dim % 16 == 0 && kv.head_dim <= ks_detail::kMaxNoveltyDim &&
         (r.rot_dims == 0 || (r.neox && (r.rot_dims / 2) % 16 == 0));
}

void key_novelty_on(Isa isa, const KvStreamView& kv, const KeyUnrotate& r, int32_t from, double* sum, float* out) {
  check(kv, "key_novelty");
  if (!cpu_supports(isa, kKeyScoringIsa))
    throw std::invalid_argument(std::string("key_novelty_on: ") + isa_name(isa) + " is not available on this CPU");
  if (!(isa == Isa::Avx512 && key_novelty_has_avx512_path(kv, r))) {
    ks_detail::key_novelty_scalar(kv, r, from, sum, out);
    return;
  }
  ks_detail::key_novelty_avx512(kv, r, from, sum, out);
}

const char* key_scoring_isa() { return isa_name(selected_isa(kKeyScoringIsa)); }

}  // namespace kvpack::kernels
