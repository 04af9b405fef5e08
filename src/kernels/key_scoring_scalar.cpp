// Portable key-scoring kernels (the reference paths; see key_scoring.h). Keys are decoded to f32 one
// page at a time: a page's K block is page_size contiguous rows, so one kv_decode_row call covers it.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/key_scoring_internal.h"
#include "kernels/ops.h"
#include "util/half.h"

namespace kvpack::kernels::ks_detail {
namespace {

// Calls f(first_slot, n_rows, rows) for each page of the stream, rows = n_rows x head_dim f32 keys.
template <class F>
void for_each_key_page(const KvStreamView& kv, std::vector<float>& rows, F&& f) {
  const int32_t hd = kv.head_dim, ps = kv.page_size;
  rows.resize(static_cast<size_t>(ps) * hd);
  for (int32_t s0 = 0; s0 < kv.n_slots; s0 += ps) {
    const int32_t n = std::min(ps, kv.n_slots - s0);
    kv_decode_row(kv.pages[s0 / ps], kv.kv_type, n * hd, rows.data());
    f(s0, n, rows.data());
  }
}

float dot(const float* a, const float* b, int32_t n) {
  float d = 0;  // f32, in element order (the policies' reference order)
  for (int32_t e = 0; e < n; ++e) d += a[e] * b[e];
  return d;
}

}  // namespace

void key_neg_norms_scalar(const KvStreamView& kv, float* out) {
  const int32_t hd = kv.head_dim;
  std::vector<float> rows;
  for_each_key_page(kv, rows, [&](int32_t s0, int32_t n, const float* k) {
    for (int32_t r = 0; r < n; ++r, k += hd) {
      double ss = 0;
      for (int32_t e = 0; e < hd; ++e) ss += static_cast<double>(k[e]) * k[e];
      out[s0 + r] = static_cast<float>(-std::sqrt(ss));
    }
  });
}

void tri_key_scores_scalar(const KvStreamView& kv, const TriWeights& w, float* out) {
  const int32_t F = w.n_bands, G = w.group, hd = kv.head_dim, n_slots = kv.n_slots;
  std::vector<float> rows, kr(static_cast<size_t>(F)), ki(static_cast<size_t>(F)), mag(static_cast<size_t>(F));
  for_each_key_page(kv, rows, [&](int32_t s0, int32_t n, const float* keys) {
    for (int32_t r = 0; r < n; ++r) {
      const float* k = keys + static_cast<size_t>(r) * hd;
      for (int32_t f = 0; f < F; ++f) {
        const float re = k[w.rope_neox ? f : 2 * f], im = k[w.rope_neox ? f + F : 2 * f + 1];
        kr[static_cast<size_t>(f)] = re;
        ki[static_cast<size_t>(f)] = im;
        mag[static_cast<size_t>(f)] = std::sqrt(re * re + im * im);
      }
      for (int32_t g = 0; g < G; ++g) {
        const float* ur = w.u_re + static_cast<size_t>(g) * F;
        const float* ui = w.u_im + static_cast<size_t>(g) * F;
        const float* wn = w.wn + static_cast<size_t>(g) * F;
        float s = 0;  // f32 accumulation over <= 64 bands; vectorises
        for (int32_t f = 0; f < F; ++f)
          s += kr[static_cast<size_t>(f)] * ur[f] + ki[static_cast<size_t>(f)] * ui[f] + wn[f] * mag[static_cast<size_t>(f)];
        out[static_cast<size_t>(g) * n_slots + s0 + r] = s;
      }
    }
  });
}

void window_logits_scalar(const KvStreamView& kv, const float* q, int64_t q_stride, int32_t n_queries, int32_t group,
                          float scale, float* logits) {
  const int32_t hd = kv.head_dim, n_slots = kv.n_slots;
  std::fill(logits, logits + static_cast<size_t>(n_queries) * n_slots, -INFINITY);
  std::vector<float> rows;
  for_each_key_page(kv, rows, [&](int32_t s0, int32_t n, const float* keys) {
    for (int32_t r = 0; r < n; ++r) {
      const float* k = keys + static_cast<size_t>(r) * hd;
      for (int32_t i = 0; i < n_queries; ++i)
        for (int32_t g = 0; g < group; ++g) {
          const float d = dot(q + i * q_stride + static_cast<int64_t>(g) * hd, k, hd);
          float& dst = logits[static_cast<size_t>(i) * n_slots + s0 + r];
          dst = std::max(dst, d * scale);
        }
    }
  });
}

void group_logits_scalar(const KvStreamView& kv, const float* q, int32_t group, float scale, float* out) {
  const int32_t hd = kv.head_dim, n_slots = kv.n_slots;
  std::vector<float> rows;
  for_each_key_page(kv, rows, [&](int32_t s0, int32_t n, const float* keys) {
    for (int32_t r = 0; r < n; ++r)
      for (int32_t g = 0; g < group; ++g)
        out[static_cast<size_t>(g) * n_slots + s0 + r] = dot(q + static_cast<size_t>(g) * hd, keys + static_cast<size_t>(r) * hd, hd) * scale;
  });
}

void digest_bounds_scalar(const float* q, int32_t nq, int32_t hd, const uint16_t* digests, int32_t n_pages, float* out) {
  for (int32_t p = 0; p < n_pages; ++p) {
    const uint16_t* mn = digests + static_cast<size_t>(p) * 2 * hd;
    const uint16_t* mx = mn + hd;
    for (int32_t v = 0; v < nq; ++v) {
      const float* qv = q + static_cast<size_t>(v) * hd;
      float b = 0;
      for (int32_t i = 0; i < hd; ++i) b += std::max(qv[i] * fp16_to_f32(mn[i]), qv[i] * fp16_to_f32(mx[i]));
      out[static_cast<size_t>(p) * nq + v] = b;
    }
  }
}

void page_shares_scalar(const float* bounds, const float* log_n, const float* lse, int32_t nq, int32_t n_pages, float* best,
                        double* share) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int32_t p = 0; p < n_pages; ++p) {
    float b = neg_inf;
    if (log_n[p] > neg_inf)
      for (int32_t v = 0; v < nq; ++v) {
        const float ls = bounds[static_cast<size_t>(p) * nq + v] + log_n[p] - lse[v];
        b = std::max(b, ls);
        if (ls > -60.0f) share[v] += static_cast<double>(std::exp(std::min(80.0f, ls)));
      }
    best[p] = b;
  }
}

void redundancy_columns_scalar(const float* keys, int32_t n, int32_t hd, double* col) {
  std::fill(col, col + n, 0.0);
  std::vector<float> row(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    const float* ki = keys + static_cast<size_t>(i) * hd;
    int32_t newest = 0;
    for (int32_t j = 0; j < n; ++j) {
      float d = 0;
      if (j != i) {
        d = dot(ki, keys + static_cast<size_t>(j) * hd, hd);
        if (d > 0.5f) newest = j;
      }
      row[static_cast<size_t>(j)] = d;
    }
    row[static_cast<size_t>(newest)] = 0.0f;
    for (int32_t j = 0; j < n; ++j) col[static_cast<size_t>(j)] += row[static_cast<size_t>(j)];
  }
}

void key_redundancy_with(const KvStreamView& kv, int32_t w_tail, bool avx512, float* out) {
  // As the reference: the similarity matrix covers ALL n keys (window rows count in the column means,
  // the softmax runs over all n columns); a row without a near-duplicate zeroes column 0 (the reference
  // takes max() of an empty index set as 0). A zero key has zero similarity to everything.
  const int32_t n = kv.n_slots, hd = kv.head_dim;
  const int32_t m = std::max(0, n - w_tail);
  std::vector<float> keys(static_cast<size_t>(n) * hd), rows;
  for_each_key_page(kv, rows, [&](int32_t s0, int32_t cnt, const float* src) {
    std::copy(src, src + static_cast<size_t>(cnt) * hd, keys.begin() + static_cast<std::ptrdiff_t>(s0) * hd);
  });
  for (int32_t j = 0; j < n; ++j) {
    float* k = keys.data() + static_cast<size_t>(j) * hd;
    double ss = 0;
    for (int32_t e = 0; e < hd; ++e) ss += static_cast<double>(k[e]) * k[e];
    const float inv = ss > 0 ? static_cast<float>(1.0 / std::sqrt(ss)) : 0.0f;
    for (int32_t e = 0; e < hd; ++e) k[e] *= inv;
  }
  std::vector<double> col(static_cast<size_t>(n), 0.0);
  if (avx512) {
    const size_t n16 = static_cast<size_t>(n + 15) / 16 * 16;
    const size_t n_rows = static_cast<size_t>(n + kRedundancyRows - 1) / kRedundancyRows * kRedundancyRows;
    std::vector<float> kt(static_cast<size_t>(hd) * n16, 0.0f), kr(n_rows * hd, 0.0f);
    std::vector<double> sums(n16, 0.0);
    std::vector<int32_t> newest(n16, 0);
    redundancy_columns_avx512(keys.data(), n, hd, {kt.data(), kr.data(), sums.data(), newest.data()}, col.data());
  } else
    redundancy_columns_scalar(keys.data(), n, hd, col.data());
  double mx = -1e300;
  for (int32_t j = 0; j < n; ++j) mx = std::max(mx, col[static_cast<size_t>(j)] / n);
  double sum = 0;
  for (int32_t j = 0; j < n; ++j) sum += std::exp(col[static_cast<size_t>(j)] / n - mx);
  for (int32_t j = 0; j < n; ++j)
    out[j] = j < m ? static_cast<float>(std::exp(col[static_cast<size_t>(j)] / n - mx) / sum) : 0.0f;
}

void key_novelty_scalar(const KvStreamView& kv, const KeyUnrotate& r, int32_t from, double* sum, float* out) {
  const int32_t n = kv.n_slots, hd = kv.head_dim, half = r.rot_dims / 2;
  // Pass 1 keeps the unit pre-RoPE rows (n x head_dim); pass 2 needs the updated sum first.
  std::vector<float> keys(static_cast<size_t>(n) * hd), rows;
  for_each_key_page(kv, rows, [&](int32_t s0, int32_t cnt, const float* src) {
    std::copy(src, src + static_cast<size_t>(cnt) * hd, keys.begin() + static_cast<std::ptrdiff_t>(s0) * hd);
  });
  for (int32_t j = 0; j < n; ++j) {
    float* k = keys.data() + static_cast<size_t>(j) * hd;
    const size_t row = static_cast<size_t>(r.positions != nullptr ? r.positions[j] : j);
    if (r.rot_dims > 0) rope_apply(k, r.cs + row * half * 2, r.rot_dims, r.neox);
    double ss = 0;
    for (int32_t e = 0; e < hd; ++e) ss += static_cast<double>(k[e]) * k[e];
    const float inv = ss > 0 ? static_cast<float>(1.0 / std::sqrt(ss)) : 0.0f;
    for (int32_t e = 0; e < hd; ++e) k[e] *= inv;
    if (j >= from)
      for (int32_t e = 0; e < hd; ++e) sum[e] += k[e];
  }
  std::vector<float> dir(static_cast<size_t>(hd));
  unit_direction(sum, hd, dir.data());
  for (int32_t j = 0; j < n; ++j) out[j] = dot(keys.data() + static_cast<size_t>(j) * hd, dir.data(), hd);
}

void unit_direction(const double* sum, int32_t hd, float* dir) {
  double norm = 0;
  for (int32_t e = 0; e < hd; ++e) norm += sum[e] * sum[e];
  norm = std::sqrt(norm);
  for (int32_t e = 0; e < hd; ++e) dir[e] = norm > 0 ? static_cast<float>(sum[e] / norm) : 0.0f;
}

}  // namespace kvpack::kernels::ks_detail
