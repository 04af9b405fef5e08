// Key-scoring kernels (kernels/key_scoring.h) on paged streams of every KV type (F32, F16, BF16, Q8_0)
// and odd shapes (partial last pages, page sizes that are not powers of two, odd groups):
//  * every kernel against a per-slot reference that decodes each row with kv_decode_row and does the
//    documented arithmetic in the same order: results must be bit-identical (the scalar kernels are the
//    reference paths whose order the policies' figures depend on);
//  * every ISA path of tri_key_scores this CPU has against the scalar path: bit-identical where the
//    path has no special code, within f32 rounding of a different summation order on the AVX-512 F16
//    NeoX path (the bound is stated below);
//  * the one dispatch mechanism: attention and key scoring answer from kernels/cpu_features.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cpu_features.h"
#include "kernels/key_scoring.h"
#include "util/half.h"

namespace kvpack::kernels {
namespace {

// A paged stream owned by the test: pages of K rows then V rows, K filled from seeded normals.
class Stream {
 public:
  // near_dup_every > 0: every such slot holds the previous key plus a little noise (cosine ~0.95, R-KV's
  // near-duplicates; random keys of these sizes rarely pass its 0.5 cut).
  Stream(DType type, int32_t head_dim, int32_t page_size, int32_t n_slots, uint32_t seed, int32_t near_dup_every = 0)
      : row_(kv_row_bytes(type, head_dim)) {
    view_.kv_type = type;
    view_.head_dim = head_dim;
    view_.page_size = page_size;
    view_.n_slots = n_slots;
    view_.v_offset = static_cast<size_t>(page_size) * row_;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.3f);
    const int32_t n_pages = (n_slots + page_size - 1) / page_size;
    pages_.resize(static_cast<size_t>(n_pages));
    std::vector<float> x(static_cast<size_t>(head_dim));
    for (int32_t p = 0; p < n_pages; ++p) {
      pages_[static_cast<size_t>(p)].assign(2 * view_.v_offset, 0xAB);  // garbage past the last slot
      for (int32_t r = 0; r < page_size && p * page_size + r < n_slots; ++r) {
        const bool dup = near_dup_every > 0 && (p * page_size + r) % near_dup_every == near_dup_every - 1;
        for (float& v : x) v = dup ? v + 0.3f * nd(rng) : nd(rng);
        if ((p * page_size + r) % 5 == 3) x.assign(x.size(), 0.0f);  // zero keys (R-KV's inv-norm guard)
        kv_encode_row(x.data(), type, head_dim, pages_[static_cast<size_t>(p)].data() + static_cast<size_t>(r) * row_);
      }
      ptrs_.push_back(pages_[static_cast<size_t>(p)].data());
    }
    view_.pages = ptrs_.data();
  }
  const KvStreamView& view() const { return view_; }
  std::vector<float> key(int32_t slot) const {
    std::vector<float> k(static_cast<size_t>(view_.head_dim));
    kv_decode_row(ptrs_[static_cast<size_t>(slot / view_.page_size)] + static_cast<size_t>(slot % view_.page_size) * row_,
                  view_.kv_type, view_.head_dim, k.data());
    return k;
  }

 private:
  size_t row_;
  KvStreamView view_;
  std::vector<std::vector<uint8_t>> pages_;
  std::vector<const uint8_t*> ptrs_;
};

struct Shape {
  DType type;
  int32_t head_dim, page_size, n_slots;
};

std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0})
    for (const auto& [hd, ps, n] : {std::tuple{32, 5, 37}, std::tuple{64, 16, 16}, std::tuple{32, 3, 1}, std::tuple{128, 7, 50}})
      out.push_back({t, hd, ps, n});
  for (DType t : {DType::F32, DType::F16, DType::BF16}) out.push_back({t, 24, 4, 13});  // head_dim not a multiple of 32
  return out;
}

std::string name(const Shape& s) {
  return std::string(kv_type_name(s.type)) + " hd" + std::to_string(s.head_dim) + " ps" + std::to_string(s.page_size) +
         " n" + std::to_string(s.n_slots);
}

std::vector<float> normals(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

float dot(const float* a, const float* b, int32_t n) {
  float d = 0;
  for (int32_t e = 0; e < n; ++e) d += a[e] * b[e];
  return d;
}

TEST(KernelsKeyScoring, NegNormsMatchPerSlotReference) {
  for (const Shape& sh : shapes()) {
    const Stream st(sh.type, sh.head_dim, sh.page_size, sh.n_slots, 11);
    std::vector<float> out(static_cast<size_t>(sh.n_slots));
    key_neg_norms(st.view(), out.data());
    for (int32_t j = 0; j < sh.n_slots; ++j) {
      double ss = 0;
      for (float v : st.key(j)) ss += static_cast<double>(v) * v;
      EXPECT_EQ(out[static_cast<size_t>(j)], static_cast<float>(-std::sqrt(ss))) << name(sh) << " slot " << j;
    }
  }
}

TEST(KernelsKeyScoring, WindowAndGroupLogitsMatchPerSlotReference) {
  for (const Shape& sh : shapes())
    for (int32_t group : {1, 3}) {
      const Stream st(sh.type, sh.head_dim, sh.page_size, sh.n_slots, 12);
      const int32_t w = 5, hd = sh.head_dim, n = sh.n_slots;
      const int64_t stride = static_cast<int64_t>(group) * hd + 7;  // padded rows
      const std::vector<float> q = normals(static_cast<size_t>(w * stride), 13);
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      std::vector<float> logits(static_cast<size_t>(w) * n), per_head(static_cast<size_t>(group) * n);
      window_logits(st.view(), q.data(), stride, w, group, scale, logits.data());
      group_logits_on(Isa::Scalar, st.view(), q.data() + (w - 1) * stride, group, scale, per_head.data());
      for (int32_t j = 0; j < n; ++j) {
        const std::vector<float> k = st.key(j);
        for (int32_t i = 0; i < w; ++i) {
          float want = -INFINITY;
          for (int32_t g = 0; g < group; ++g) want = std::max(want, dot(q.data() + i * stride + g * hd, k.data(), hd) * scale);
          EXPECT_EQ(logits[static_cast<size_t>(i) * n + j], want) << name(sh) << " group " << group << " query " << i << " slot " << j;
        }
        for (int32_t g = 0; g < group; ++g)
          EXPECT_EQ(per_head[static_cast<size_t>(g) * n + j], dot(q.data() + (w - 1) * stride + g * hd, k.data(), hd) * scale)
              << name(sh) << " head " << g << " slot " << j;
      }
    }
}

// group_logits on every path this CPU has against scalar: the AVX-512 F16 path (head_dim % 16 == 0,
// group <= 8) sums 16 lanes of FMAs, so it differs by rounding: |a - b| <= hd * 2^-23 * Σ|q_i k_i| * scale
// bounds it; the others are the scalar code, bitwise.
TEST(KernelsKeyScoring, GroupLogitsEveryIsaPathMatchesScalar) {
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (!cpu_supports(isa, kKeyScoringIsa)) continue;
    for (const Shape& sh : shapes())
      for (int32_t group : {1, 2, 7, 9}) {
        const Stream st(sh.type, sh.head_dim, sh.page_size, sh.n_slots, 21);
        const int32_t hd = sh.head_dim, n = sh.n_slots;
        const std::vector<float> q = normals(static_cast<size_t>(group) * hd, 22);
        const float scale = 0.125f;
        std::vector<float> got(static_cast<size_t>(group) * n), want(got.size());
        group_logits_on(isa, st.view(), q.data(), group, scale, got.data());
        group_logits_on(Isa::Scalar, st.view(), q.data(), group, scale, want.data());
        const bool special = isa == Isa::Avx512 && sh.type == DType::F16 && hd % 16 == 0 && group <= 8;
        for (int32_t j = 0; j < n; ++j) {
          const std::vector<float> k = st.key(j);
          for (int32_t g = 0; g < group; ++g) {
            const size_t i = static_cast<size_t>(g) * n + j;
            if (!special) {
              EXPECT_EQ(got[i], want[i]) << isa_name(isa) << " " << name(sh) << " g " << g << " slot " << j;
              continue;
            }
            double mag = 0;
            for (int32_t e = 0; e < hd; ++e) mag += std::fabs(static_cast<double>(q[static_cast<size_t>(g * hd + e)]) * k[static_cast<size_t>(e)]);
            EXPECT_NEAR(got[i], want[i], 1e-5 * mag * scale + 1e-30) << isa_name(isa) << " " << name(sh) << " g " << g << " slot " << j;
          }
        }
      }
  }
}

// digest_bounds: the scalar path is the element-order formula bitwise (on the f16 box widened to f32); every
// path bounds q.k of every key the digest covers (a min/max box of random keys, minima rounded down and
// maxima up to f16 as kv::EvictedKv stores them) and agrees with scalar to rounding.
TEST(KernelsKeyScoring, DigestBoundsBoundEveryKeyOnEveryPath) {
  for (int32_t hd : {16, 24, 64, 128})
  for (int32_t nq : {1, 2, 3, 4, 5, 9}) {  // the AVX-512 path takes queries 4 at a time, then 3 / 2 / 1
    const int32_t n_pages = 11, per_page = 5;
    std::vector<float> keys = normals(static_cast<size_t>(n_pages * per_page * hd), 23);
    std::vector<float> digests(static_cast<size_t>(n_pages) * 2 * hd);  // the f16 box, widened
    std::vector<uint16_t> halves(digests.size());
    for (int32_t p = 0; p < n_pages; ++p)
      for (int32_t e = 0; e < hd; ++e) {
        float lo = INFINITY, hi = -INFINITY;
        for (int32_t r = 0; r < per_page; ++r) {
          const float x = keys[static_cast<size_t>((p * per_page + r) * hd + e)];
          lo = std::min(lo, x);
          hi = std::max(hi, x);
        }
        halves[static_cast<size_t>(p * 2 * hd + e)] = f32_to_fp16_floor(lo);
        halves[static_cast<size_t>(p * 2 * hd + hd + e)] = f32_to_fp16_ceil(hi);
        digests[static_cast<size_t>(p * 2 * hd + e)] = fp16_to_f32(halves[static_cast<size_t>(p * 2 * hd + e)]);
        digests[static_cast<size_t>(p * 2 * hd + hd + e)] = fp16_to_f32(halves[static_cast<size_t>(p * 2 * hd + hd + e)]);
        ASSERT_LE(digests[static_cast<size_t>(p * 2 * hd + e)], lo);
        ASSERT_GE(digests[static_cast<size_t>(p * 2 * hd + hd + e)], hi);
      }
    const std::vector<float> q = normals(static_cast<size_t>(nq * hd), 24);
    std::vector<float> want(static_cast<size_t>(n_pages) * nq);
    digest_bounds_on(Isa::Scalar, q.data(), nq, hd, halves.data(), n_pages, want.data());
    for (int32_t p = 0; p < n_pages; ++p)
      for (int32_t v = 0; v < nq; ++v) {
        float b = 0;
        for (int32_t e = 0; e < hd; ++e) {
          const float x = q[static_cast<size_t>(v * hd + e)];
          b += std::max(x * digests[static_cast<size_t>(p * 2 * hd + e)], x * digests[static_cast<size_t>(p * 2 * hd + hd + e)]);
        }
        EXPECT_EQ(want[static_cast<size_t>(p * nq + v)], b) << "hd " << hd << " page " << p << " q " << v;
      }
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
      if (!cpu_supports(isa, kKeyScoringIsa)) continue;
      std::vector<float> got(want.size());
      digest_bounds_on(isa, q.data(), nq, hd, halves.data(), n_pages, got.data());
      for (int32_t p = 0; p < n_pages; ++p)
        for (int32_t v = 0; v < nq; ++v) {
          double mag = 0;
          for (int32_t e = 0; e < hd; ++e)
            mag += std::fabs(q[static_cast<size_t>(v * hd + e)]) *
                   std::max(std::fabs(digests[static_cast<size_t>(p * 2 * hd + e)]), std::fabs(digests[static_cast<size_t>(p * 2 * hd + hd + e)]));
          const float b = got[static_cast<size_t>(p * nq + v)];
          EXPECT_NEAR(b, want[static_cast<size_t>(p * nq + v)], 1e-5 * mag) << isa_name(isa) << " hd " << hd;
          for (int32_t r = 0; r < per_page; ++r)
            EXPECT_GE(b + 1e-5 * mag, dot(q.data() + v * hd, keys.data() + (p * per_page + r) * hd, hd))
                << isa_name(isa) << " hd " << hd << " page " << p << " key " << r;
        }
    }
  }
}

// page_shares: written out here from its definition (the f64 formula, std::exp); best is the same on
// every path bitwise, the shares agree to ~1e-6 relative. The bounds span the cuts: shares below e^-60 are
// left out, above e^80 clamped; lost pages (log_n = -inf) count nowhere; page counts that are not a
// multiple of 16 exercise the vector path's tail.
TEST(KernelsKeyScoring, PageSharesSumTheBoundedSharesOfLivePages) {
  for (int32_t nq : {0, 1, 2, 3, 8, 64})
  for (int32_t n_pages : {0, 1, 15, 16, 17, 100}) {
    std::vector<float> bounds = normals(static_cast<size_t>(n_pages) * nq, 31), log_n(static_cast<size_t>(n_pages));
    for (float& b : bounds) b *= 40.0f;  // from about -160 to +160: both cuts are crossed
    for (int32_t p = 0; p < n_pages; ++p)
      log_n[static_cast<size_t>(p)] = p % 7 == 3 ? -INFINITY : std::log(static_cast<float>(1 + p % 16));
    const std::vector<float> lse = normals(static_cast<size_t>(nq), 32);
    std::vector<float> want_best(static_cast<size_t>(n_pages));
    std::vector<double> want_share(static_cast<size_t>(nq), 0.0);
    for (int32_t p = 0; p < n_pages; ++p) {
      float b = -INFINITY;
      for (int32_t v = 0; v < nq && log_n[static_cast<size_t>(p)] > -INFINITY; ++v) {
        const float ls = bounds[static_cast<size_t>(p * nq + v)] + log_n[static_cast<size_t>(p)] - lse[static_cast<size_t>(v)];
        b = std::max(b, ls);
        if (ls > -60.0f) want_share[static_cast<size_t>(v)] += std::exp(std::min(80.0, static_cast<double>(ls)));
      }
      want_best[static_cast<size_t>(p)] = b;
    }
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
      if (!cpu_supports(isa, kKeyScoringIsa)) continue;
      std::vector<float> best(static_cast<size_t>(n_pages), 7.0f);
      std::vector<double> share(static_cast<size_t>(nq), 1.0);  // accumulated into
      page_shares_on(isa, bounds.data(), log_n.data(), lse.data(), nq, n_pages, best.data(), share.data());
      for (int32_t p = 0; p < n_pages; ++p)
        EXPECT_EQ(best[static_cast<size_t>(p)], want_best[static_cast<size_t>(p)]) << isa_name(isa) << " nq " << nq << " page " << p;
      for (int32_t v = 0; v < nq; ++v)
        EXPECT_NEAR(share[static_cast<size_t>(v)], 1.0 + want_share[static_cast<size_t>(v)], 2e-6 * (1.0 + want_share[static_cast<size_t>(v)]))
            << isa_name(isa) << " nq " << nq << " q " << v;
    }
  }
}

TEST(KernelsKeyScoring, RedundancyIsASoftmaxOverNonWindowKeys) {
  for (const Shape& sh : shapes()) {
    const Stream st(sh.type, sh.head_dim, sh.page_size, sh.n_slots, 14);
    const int32_t n = sh.n_slots, w_tail = std::min(n, 4);
    std::vector<float> out(static_cast<size_t>(n), -1.0f);
    key_redundancy(st.view(), w_tail, out.data());
    double sum = 0;
    for (int32_t j = 0; j < n; ++j) {
      if (j >= n - w_tail) {
        EXPECT_EQ(out[static_cast<size_t>(j)], 0.0f) << name(sh) << " window slot " << j;
        continue;
      }
      EXPECT_GT(out[static_cast<size_t>(j)], 0.0f) << name(sh) << " slot " << j;
      sum += out[static_cast<size_t>(j)];
    }
    EXPECT_LE(sum, 1.0 + 1e-6) << name(sh);  // the softmax runs over all n columns, the window's included
    if (w_tail == 0) EXPECT_NEAR(sum, 1.0, 1e-5) << name(sh);
  }
}

// key_redundancy on every path against a float64 evaluation of its documented formula, on odd shapes and
// with near-duplicate keys (the exemption of each row's newest one is exercised). The paths sum in other
// orders (the AVX-512 one takes each unordered pair once, 8 x 16 at a time), so they agree to rounding.
TEST(KernelsKeyScoring, RedundancyPathsMatchAFloat64Reference) {
  std::vector<Shape> cases = shapes();
  cases.push_back({DType::F16, 64, 16, 300});
  cases.push_back({DType::F32, 24, 5, 77});
  cases.push_back({DType::BF16, 40, 3, 17});
  for (const Shape& sh : cases) {
    const Stream st(sh.type, sh.head_dim, sh.page_size, sh.n_slots, 15, 4);
    const int32_t n = sh.n_slots, hd = sh.head_dim, w_tail = std::min(n, 3);
    std::vector<std::vector<double>> u(static_cast<size_t>(n));
    for (int32_t j = 0; j < n; ++j) {
      const std::vector<float> k = st.key(j);
      double ss = 0;
      for (float v : k) ss += static_cast<double>(v) * v;
      for (float v : k) u[static_cast<size_t>(j)].push_back(ss > 0 ? v / std::sqrt(ss) : 0.0);
    }
    std::vector<double> col(static_cast<size_t>(n), 0.0);
    int32_t exempted = 0;
    for (int32_t i = 0; i < n; ++i) {
      int32_t newest = 0;
      std::vector<double> row(static_cast<size_t>(n), 0.0);
      for (int32_t j = 0; j < n; ++j) {
        if (j == i) continue;
        for (int32_t e = 0; e < hd; ++e) row[static_cast<size_t>(j)] += u[static_cast<size_t>(i)][static_cast<size_t>(e)] * u[static_cast<size_t>(j)][static_cast<size_t>(e)];
        if (row[static_cast<size_t>(j)] > 0.5) newest = j;
      }
      exempted += newest != 0;
      row[static_cast<size_t>(newest)] = 0;
      for (int32_t j = 0; j < n; ++j) col[static_cast<size_t>(j)] += row[static_cast<size_t>(j)];
    }
    if (n >= 8) {
      EXPECT_GT(exempted, 0) << name(sh) << ": the data must hold near-duplicates";
    }
    double mx = -1e300, sum = 0;
    for (double c : col) mx = std::max(mx, c / n);
    for (double c : col) sum += std::exp(c / n - mx);
    for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
      if (!cpu_supports(isa, kKeyScoringIsa)) continue;
      std::vector<float> out(static_cast<size_t>(n), -1.0f);
      key_redundancy_on(isa, st.view(), w_tail, out.data());
      for (int32_t j = 0; j < n; ++j) {
        const double want = j < n - w_tail ? std::exp(col[static_cast<size_t>(j)] / n - mx) / sum : 0.0;
        EXPECT_NEAR(out[static_cast<size_t>(j)], want, 2e-6 * want) << name(sh) << " " << isa_name(isa) << " slot " << j;
      }
    }
  }
}

// The query side of TriAttention as random per-band weights (the scorer builds them from calibration).
struct Weights {
  std::vector<float> u_re, u_im, wn;
  TriWeights w;
  Weights(int32_t bands, int32_t group, bool neox, uint32_t seed)
      : u_re(normals(static_cast<size_t>(bands) * group, seed)), u_im(normals(static_cast<size_t>(bands) * group, seed + 1)),
        wn(normals(static_cast<size_t>(bands) * group, seed + 2)) {
    w.u_re = u_re.data();
    w.u_im = u_im.data();
    w.wn = wn.data();
    w.n_bands = bands;
    w.group = group;
    w.rope_neox = neox;
  }
};

TEST(KernelsKeyScoring, TriScalarMatchesPerSlotReference) {
  for (const Shape& sh : shapes())
    for (bool neox : {true, false})
      for (int32_t group : {1, 3, 8}) {
        const Stream st(sh.type, sh.head_dim, sh.page_size, sh.n_slots, 15);
        const int32_t F = sh.head_dim / 2, n = sh.n_slots;
        const Weights wt(F, group, neox, 16);
        std::vector<float> out(static_cast<size_t>(group) * n);
        tri_key_scores_on(Isa::Scalar, st.view(), wt.w, out.data());
        for (int32_t j = 0; j < n; ++j) {
          const std::vector<float> k = st.key(j);
          for (int32_t g = 0; g < group; ++g) {
            float s = 0;
            for (int32_t f = 0; f < F; ++f) {
              const float re = k[static_cast<size_t>(neox ? f : 2 * f)], im = k[static_cast<size_t>(neox ? f + F : 2 * f + 1)];
              const size_t o = static_cast<size_t>(g) * F + f;
              s += re * wt.u_re[o] + im * wt.u_im[o] + wt.wn[o] * std::sqrt(re * re + im * im);
            }
            EXPECT_EQ(out[static_cast<size_t>(g) * n + j], s) << name(sh) << (neox ? " neox" : " gptj") << " g " << g << " slot " << j;
          }
        }
      }
}

// Every path this CPU has, against scalar. The AVX-512 F16 NeoX path sums in 16 lanes with FMAs: each
// of its 3F products is rounded differently, so |a - b| <= 3F * 2^-23 * Σ|terms| bounds the difference;
// 1e-5 * Σ|terms| (F <= 64) holds with margin.
TEST(KernelsKeyScoring, TriEveryIsaPathMatchesScalar) {
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    if (!cpu_supports(isa, kKeyScoringIsa)) continue;
    for (const Shape& sh : shapes())
      for (int32_t group : {1, 2, 8}) {
        const Stream st(sh.type, sh.head_dim, sh.page_size, sh.n_slots, 17);
        const int32_t F = sh.head_dim / 2, n = sh.n_slots;
        const Weights wt(F, group, true, 18);
        std::vector<float> got(static_cast<size_t>(group) * n), want(got.size());
        tri_key_scores_on(isa, st.view(), wt.w, got.data());
        tri_key_scores_on(Isa::Scalar, st.view(), wt.w, want.data());
        const bool special = isa == Isa::Avx512 && tri_key_scores_has_avx512_path(st.view(), wt.w);
        EXPECT_EQ(special, isa == Isa::Avx512 && sh.type == DType::F16 && F % 16 == 0) << name(sh);
        for (int32_t j = 0; j < n; ++j) {
          const std::vector<float> k = st.key(j);
          for (int32_t g = 0; g < group; ++g) {
            const size_t i = static_cast<size_t>(g) * n + j;
            if (!special) {
              EXPECT_EQ(got[i], want[i]) << isa_name(isa) << " " << name(sh) << " g " << g << " slot " << j;
              continue;
            }
            double mag = 0;
            for (int32_t f = 0; f < F; ++f) {
              const size_t o = static_cast<size_t>(g) * F + f;
              const double re = k[static_cast<size_t>(f)], im = k[static_cast<size_t>(f + F)];
              mag += std::fabs(re * wt.u_re[o]) + std::fabs(im * wt.u_im[o]) + std::fabs(wt.wn[o] * std::hypot(re, im));
            }
            EXPECT_NEAR(got[i], want[i], 1e-5 * mag + 1e-30) << isa_name(isa) << " " << name(sh) << " g " << g << " slot " << j;
          }
        }
      }
  }
}

TEST(KernelsKeyScoring, UnavailablePathIsRefused) {
  for (Isa isa : {Isa::Avx2, Isa::Avx512}) {
    if (cpu_supports(isa, kKeyScoringIsa)) continue;
    const Stream st(DType::F16, 32, 4, 3, 1);
    const Weights wt(16, 1, true, 2);
    std::vector<float> out(3);
    EXPECT_THROW(tri_key_scores_on(isa, st.view(), wt.w, out.data()), std::invalid_argument);
  }
}

TEST(KernelsKeyScoring, OneDispatchMechanismForEveryFamily) {
  // Attention's and key scoring's avx512 paths need no VNNI; matmul's does. Each family's path set is a
  // CPU-feature question answered by cpu_features alone.
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512}) {
    EXPECT_EQ(attention_isa_available(isa_name(isa)), cpu_supports(isa, kAttentionIsa)) << isa_name(isa);
    if (cpu_supports(isa, kMatmulIsa)) {
      EXPECT_TRUE(cpu_supports(isa, kAttentionIsa)) << isa_name(isa);
      EXPECT_TRUE(cpu_supports(isa, kKeyScoringIsa)) << isa_name(isa);
    }
  }
  EXPECT_EQ(cpu_supports(Isa::Avx512, kAttentionIsa), cpu_has(CpuFeature::Avx512));
  EXPECT_EQ(cpu_supports(Isa::Avx512, kMatmulIsa), cpu_has(CpuFeature::Avx512) && cpu_has(CpuFeature::Avx512Vnni));
  EXPECT_EQ(std::string(attention_isa()), isa_name(selected_isa(kAttentionIsa)));
  EXPECT_EQ(std::string(key_scoring_isa()), isa_name(selected_isa(kKeyScoringIsa)));
  EXPECT_TRUE(cpu_supports(selected_isa(kAttentionIsa), kAttentionIsa));
}

}  // namespace
}  // namespace kvpack::kernels
