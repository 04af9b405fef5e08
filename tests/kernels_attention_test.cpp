// Property tests of paged_attention against a naive double-precision reference (materialised scores,
// softmax, weighted sum over a flat, non-paged copy of K/V), on every instruction-set path this CPU has.
//
// Tolerances (V entries are in [-1, 1], so every output is a convex combination bounded by 1):
//  * outputs: |out - ref| <= 1e-5. The kernel works in f32: scores are f32 dot products over <= 128 terms
//    of magnitude |score| <~ 15 here, i.e. absolute score error ~1e-6 (a few ulps of the partial sums);
//    that is a relative error ~1e-6 on each softmax weight; exp (scalar libm or the ~1e-7 polynomial) and
//    the f32 running sums over <= 2K slots (error ~sqrt(n) * 6e-8 typically, n * 6e-8 worst) add ~1e-6.
//    Observed max error is ~9e-7; 1e-5 leaves margin without hiding real bugs (a dropped or duplicated
//    slot, a wrong rescale or a causal off-by-one changes outputs by >= 1e-3 at these sizes).
//  * key_mass: |mass - ref| <= 2e-5 * (1 + ref) per slot (a sum of up to 264 probabilities, each with
//    relative error ~1e-6).
//  * F16 / BF16 / Q8_0 storage: the reference uses the same stored (decoded to f32) values, so the
//    tolerance is unchanged. For BF16 and Q8_0, MatchesNaiveReference also checks the rounding itself
//    against the ORIGINAL values: per element |k' - k| <= 2^-8 |k| (BF16, round to nearest even of an
//    8-bit significand) or <= amax_block * (1/254 + 2^-11) + 127 * 2^-25 (Q8_0: half a step d = amax/127,
//    plus the f16 rounding of d, at most d 2^-11 + 2^-25, times |q| <= 127); and the outputs against a reference on the original values with
//    the bound that follows: if every score moves by at most delta and every V element by at most eps_v,
//    each softmax weight changes by a factor within e^(+-2 delta), so |out' - out| <= (e^(2 delta) - 1)
//    * max|v| + eps_v (delta, eps_v measured on the case's data; plus kOutTol for the f32 arithmetic).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cpu_features.h"
#include "util/half.h"

namespace kvpack::kernels {
namespace {

constexpr double kOutTol = 1e-5;
constexpr double kMassTol = 2e-5;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Config {
  int32_t hd = 8, ps = 16, group = 1, n_slots = 1, n_new = 1;
  DType type = DType::F32;
  float scale = 1.0f;
};

std::string describe(const Config& c) {
  return "hd=" + std::to_string(c.hd) + " ps=" + std::to_string(c.ps) + " group=" + std::to_string(c.group) +
         " n_slots=" + std::to_string(c.n_slots) + " n_new=" + std::to_string(c.n_new) +
         " " + kv_type_name(c.type);
}

// One KV stream: the flat K/V the reference uses ([n_slots][hd], values as the kernel sees them, i.e.
// decoded from the stored rows: rounded through f16 / bf16 or Q8_0), the original (unrounded) values,
// and the paged copy: pages at scattered, shuffled positions of a pool that is twice as large as needed
// and filled with 0xFF bytes (NaN in every type: f32 / f16 / bf16 NaN, Q8_0 scale NaN), so reading any
// slot >= n_slots poisons the output.
class Stream {
 public:
  explicit Stream(const Config& c, std::mt19937& rng) : c_(c) {
    row_ = kv_row_bytes(c.type, c.hd);
    v_offset_ = static_cast<size_t>(c.ps) * row_;
    page_stride_ = (2 * v_offset_ + 63) / 64 * 64 + 64 * (rng() % 2);
    const int32_t n_pages = (c.n_slots + c.ps - 1) / c.ps;
    const int32_t pool_pages = 2 * n_pages + 1;
    pool_.resize(page_stride_ * pool_pages / 8 + 8);
    auto* bytes = reinterpret_cast<uint8_t*>(pool_.data());
    std::memset(bytes, 0xFF, pool_.size() * sizeof(uint64_t));
    std::vector<int32_t> perm(pool_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int32_t p = 0; p < n_pages; ++p) pages_.push_back(bytes + static_cast<size_t>(perm[p]) * page_stride_);
    K_.resize(static_cast<size_t>(c.n_slots) * c.hd);
    V_.resize(K_.size());
    K0_.resize(K_.size());
    V0_.resize(K_.size());
  }

  // Writes slot s (the original values, the flat reference copy as read back, and the page).
  void set_slot(int32_t s, const float* k, const float* v) {
    uint8_t* page = const_cast<uint8_t*>(pages_[s / c_.ps]);
    const size_t off = static_cast<size_t>(s % c_.ps) * row_;
    const size_t at = static_cast<size_t>(s) * c_.hd;
    std::copy_n(k, c_.hd, K0_.data() + at);
    std::copy_n(v, c_.hd, V0_.data() + at);
    kv_encode_row(k, c_.type, c_.hd, page + off);
    kv_encode_row(v, c_.type, c_.hd, page + v_offset_ + off);
    kv_decode_row(page + off, c_.type, c_.hd, K_.data() + at);
    kv_decode_row(page + v_offset_ + off, c_.type, c_.hd, V_.data() + at);
  }

  // Overwrites slot s's stored K and V rows with NaN (0xFF bytes) or +Inf in the stored type. Q8_0 has no
  // Inf encoding: a scale of +Inf with q = 1 decodes to +Inf.
  void poison_slot(int32_t s, bool nan) {
    uint8_t* page = const_cast<uint8_t*>(pages_[s / c_.ps]);
    const size_t off = static_cast<size_t>(s % c_.ps) * row_;
    for (uint8_t* r : {page + off, page + v_offset_ + off}) {
      if (nan) {
        std::memset(r, 0xFF, row_);
      } else if (c_.type == DType::Q8_0) {
        for (size_t b = 0; b < row_; b += 34) {
          const uint16_t inf = 0x7c00;
          std::memcpy(r + b, &inf, 2);
          std::memset(r + b + 2, 1, 32);
        }
      } else {
        const std::vector<float> bad(static_cast<size_t>(c_.hd), std::numeric_limits<float>::infinity());
        kv_encode_row(bad.data(), c_.type, c_.hd, r);
      }
    }
  }

  void fill_random(std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> k(c_.hd), v(c_.hd);
    for (int32_t s = 0; s < c_.n_slots; ++s) {
      for (int32_t d = 0; d < c_.hd; ++d) {
        k[d] = u(rng);
        v[d] = u(rng);
      }
      set_slot(s, k.data(), v.data());
    }
  }

  KvStreamView view() const {
    KvStreamView kv;
    kv.pages = pages_.data();
    kv.n_slots = c_.n_slots;
    kv.page_size = c_.ps;
    kv.head_dim = c_.hd;
    kv.kv_type = c_.type;
    kv.v_offset = v_offset_;
    return kv;
  }

  const Config& config() const { return c_; }
  const float* k(int32_t s) const { return K_.data() + static_cast<size_t>(s) * c_.hd; }
  const float* v(int32_t s) const { return V_.data() + static_cast<size_t>(s) * c_.hd; }
  const float* k0(int32_t s) const { return K0_.data() + static_cast<size_t>(s) * c_.hd; }  // original values
  const float* v0(int32_t s) const { return V0_.data() + static_cast<size_t>(s) * c_.hd; }

 private:
  Config c_;
  size_t row_ = 0, v_offset_ = 0, page_stride_ = 0;
  std::vector<uint64_t> pool_;
  std::vector<const uint8_t*> pages_;
  std::vector<float> K_, V_, K0_, V0_;
};

// Naive reference in double: out[(t * group + g) * hd + d]; mass (if given) += probabilities.
void reference(const Stream& st, const std::vector<float>& q, int64_t q_stride, std::vector<double>& out,
               std::vector<double>* mass, bool original = false) {
  const Config& c = st.config();
  out.assign(static_cast<size_t>(c.n_new) * c.group * c.hd, 0.0);
  std::vector<double> sc(c.n_slots);
  for (int32_t t = 0; t < c.n_new; ++t) {
    const int32_t limit = c.n_slots - c.n_new + t + 1;
    for (int32_t g = 0; g < c.group; ++g) {
      const float* qv = q.data() + t * q_stride + static_cast<int64_t>(g) * c.hd;
      double mx = -std::numeric_limits<double>::infinity();
      for (int32_t s = 0; s < limit; ++s) {
        double dot = 0;
        const float* kr = original ? st.k0(s) : st.k(s);
        for (int32_t d = 0; d < c.hd; ++d) dot += static_cast<double>(qv[d]) * kr[d];
        sc[s] = dot * c.scale;
        mx = std::max(mx, sc[s]);
      }
      double sum = 0;
      for (int32_t s = 0; s < limit; ++s) sum += (sc[s] = std::exp(sc[s] - mx));
      double* o = out.data() + (static_cast<size_t>(t) * c.group + g) * c.hd;
      for (int32_t s = 0; s < limit; ++s) {
        const double p = sc[s] / sum;
        const float* vr = original ? st.v0(s) : st.v(s);
        for (int32_t d = 0; d < c.hd; ++d) o[d] += p * vr[d];
        if (mass) (*mass)[s] += p;
      }
    }
  }
}

// Runs the kernel with padded q/out strides, a misaligned NaN-filled scratch with a canary after it, and
// checks that padding and canary are untouched. Returns out as [(t * group + g) * hd + d].
std::vector<float> run_kernel(const char* isa, const Stream& st, const std::vector<float>& q, int64_t q_stride,
                              float* key_mass, int32_t out_pad = 3, float* lse = nullptr) {
  const Config& c = st.config();
  const int64_t row = static_cast<int64_t>(c.group) * c.hd;
  const int64_t out_stride = row + out_pad;
  constexpr float kSentinel = 12345.0f;
  std::vector<float> out(static_cast<size_t>(c.n_new) * out_stride, kSentinel);
  const size_t n_scratch = attention_scratch_floats(c.n_new, c.group, c.hd, c.ps);
  std::vector<float> scratch(n_scratch + 1 + 16, kNaN);
  for (int i = 0; i < 16; ++i) scratch[n_scratch + 1 + i] = kSentinel;
  AttentionArgs a;
  a.q = q.data();
  a.q_stride = q_stride;
  a.out = out.data();
  a.out_stride = out_stride;
  a.n_new = c.n_new;
  a.group = c.group;
  a.scale = c.scale;
  a.key_mass = key_mass;
  a.lse = lse;
  a.scratch = scratch.data() + 1;  // deliberately not 64-byte aligned
  if (isa)
    paged_attention_on(isa, st.view(), a);
  else
    paged_attention(st.view(), a);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(scratch[n_scratch + 1 + i], kSentinel) << "scratch overrun";
  std::vector<float> dense(static_cast<size_t>(c.n_new) * row);
  for (int32_t t = 0; t < c.n_new; ++t) {
    std::copy_n(out.data() + t * out_stride, row, dense.data() + t * row);
    for (int64_t i = row; i < out_stride; ++i) EXPECT_EQ(out[t * out_stride + i], kSentinel) << "out padding written";
  }
  return dense;
}

// q rows [n_new][q_stride], N(0, sigma), with NaN in the stride padding (must never be read).
std::vector<float> random_q(const Config& c, int64_t q_stride, float sigma, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> q(static_cast<size_t>(c.n_new) * q_stride, kNaN);
  for (int32_t t = 0; t < c.n_new; ++t)
    for (int64_t i = 0; i < static_cast<int64_t>(c.group) * c.hd; ++i) q[t * q_stride + i] = nd(rng);
  return q;
}

// The query rows the kernel scores with, in the reference's terms: q itself, or, on a path that quantises
// the queries for this KV type (AVX-512 VNNI with Q8_0 keys, attention_quantises_queries), the quantised
// q * scale (attention_quantise_query_row, the path's spec) divided back by the scale. isa nullptr: the
// default path's.
std::vector<float> kernel_q(const char* isa, const Config& c, const std::vector<float>& q, int64_t q_stride) {
  if (!attention_quantises_queries(isa != nullptr ? isa : attention_isa(), c.type)) return q;
  std::vector<float> out = q, x(static_cast<size_t>(c.hd)), y(static_cast<size_t>(c.hd));
  for (int32_t t = 0; t < c.n_new; ++t)
    for (int32_t g = 0; g < c.group; ++g) {
      float* row = out.data() + t * q_stride + static_cast<int64_t>(g) * c.hd;
      for (int32_t d = 0; d < c.hd; ++d) x[d] = row[d] * c.scale;  // f32, as the kernel scales its copy
      attention_quantise_query_row(x.data(), c.hd, y.data());
      for (int32_t d = 0; d < c.hd; ++d) row[d] = y[d] / c.scale;
    }
  return out;
}

// One decode token (head_dim 128, scale 1/sqrt(128)) over a stream of n_slots slots.
Config decode_config(DType type, int32_t n_slots, int32_t group, int32_t page_size) {
  Config c;
  c.hd = 128;
  c.ps = page_size;
  c.group = group;
  c.type = type;
  c.n_slots = n_slots;
  c.n_new = 1;
  c.scale = 1.0f / std::sqrt(128.0f);
  return c;
}

// Max |out - ref|; fails if any output is not finite.
double max_err(const std::vector<float>& out, const std::vector<double>& ref) {
  double e = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return std::numeric_limits<double>::infinity();
    e = std::max(e, std::abs(out[i] - ref[i]));
  }
  return e;
}

Config random_config(int32_t hd, int32_t ps, int32_t group, DType type, std::mt19937& rng) {
  static constexpr int32_t kNew[] = {1, 2, 7, 16, 33};
  Config c;
  c.hd = hd;
  c.ps = ps;
  c.group = group;
  c.type = type;
  c.n_new = kNew[rng() % 5];
  const int32_t kind = static_cast<int32_t>(rng() % 4);
  if (kind == 0)
    c.n_slots = c.n_new;  // prefill from an empty cache
  else if (kind == 1)
    c.n_slots = c.n_new + static_cast<int32_t>(rng() % 40);
  else
    c.n_slots = c.n_new + static_cast<int32_t>(rng() % 300);
  c.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  return c;
}

// A random case of any type, head dim, page size and group (the property tests' sampler).
Config random_case(std::mt19937& rng) {
  static constexpr int32_t kHd[] = {8, 16, 32, 64, 80, 128};
  static constexpr int32_t kPs[] = {1, 4, 16, 32};
  static constexpr int32_t kGroup[] = {1, 2, 4, 8};
  static constexpr DType kTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0};
  const DType type = kTypes[rng() % 4];
  const int32_t hd = type == DType::Q8_0 ? 32 * (1 + static_cast<int32_t>(rng() % 4)) : kHd[rng() % 6];
  return random_config(hd, kPs[rng() % 4], kGroup[rng() % 4], type, rng);
}

// Head dims per type: Q8_0 rows are whole 32-element blocks.
std::vector<int32_t> head_dims(DType type) {
  if (type == DType::Q8_0) return {32, 64, 96, 128, 160, 256};
  return {8, 16, 32, 64, 80, 128};
}

// Per-element rounding bound of the stored type (see the header comment) for a row x at element d.
double elem_bound(DType type, const float* row, int32_t hd, int32_t d) {
  switch (type) {
    case DType::BF16: return std::ldexp(std::fabs(row[d]), -8);
    case DType::Q8_0: {
      double amax = 0;
      for (int32_t i = d / 32 * 32; i < d / 32 * 32 + 32 && i < hd; ++i) amax = std::max(amax, std::fabs(double{row[i]}));
      return (amax * (1.0 / 254 + std::ldexp(1.0, -11)) + 127 * std::ldexp(1.0, -25)) * (1 + 1e-6);
    }
    case DType::F16: return std::ldexp(std::fabs(row[d]), -11) + std::ldexp(1.0, -25);
    default: return 0.0;
  }
}

// Checks the stored rounding of every element against its type's bound and the kernel output against a
// reference on the ORIGINAL values, within the bound derived from the measured score / V perturbations.
// Returns (out error vs original) / bound (<= 1).
// q_eff: the rows the kernel scored with (kernel_q); its quantisation, if any, counts in the score change.
double check_rounding(const Stream& st, const std::vector<float>& q, const std::vector<float>& q_eff, int64_t q_stride,
                      const std::vector<float>& out) {
  const Config& c = st.config();
  double eps_v = 0, delta = 0;
  for (int32_t s = 0; s < c.n_slots; ++s)
    for (int32_t d = 0; d < c.hd; ++d) {
      const double ek = std::fabs(double{st.k(s)[d]} - st.k0(s)[d]), ev = std::fabs(double{st.v(s)[d]} - st.v0(s)[d]);
      EXPECT_LE(ek, elem_bound(c.type, st.k0(s), c.hd, d)) << "K slot " << s << " elem " << d;
      EXPECT_LE(ev, elem_bound(c.type, st.v0(s), c.hd, d)) << "V slot " << s << " elem " << d;
      eps_v = std::max(eps_v, ev);
    }
  for (int32_t t = 0; t < c.n_new; ++t)
    for (int32_t g = 0; g < c.group; ++g)
      for (int32_t s = 0; s < c.n_slots; ++s) {
        double ds = 0;
        const float* qv = q.data() + t * q_stride + static_cast<int64_t>(g) * c.hd;
        const float* qe = q_eff.data() + t * q_stride + static_cast<int64_t>(g) * c.hd;
        for (int32_t d = 0; d < c.hd; ++d) ds += double{qe[d]} * st.k(s)[d] - static_cast<double>(qv[d]) * st.k0(s)[d];
        delta = std::max(delta, std::fabs(ds * c.scale));
      }
  std::vector<double> ref0;
  reference(st, q, q_stride, ref0, nullptr, /*original=*/true);
  const double bound = std::expm1(2 * delta) * 1.0 /*max |v| */ + eps_v + kOutTol;
  const double err = max_err(out, ref0);
  EXPECT_LE(err, bound) << "delta " << delta << " eps_v " << eps_v;
  return err / bound;
}

class AttentionIsa : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!attention_isa_available(GetParam())) GTEST_SKIP() << GetParam() << " not available on this CPU";
  }
};

TEST_P(AttentionIsa, MatchesNaiveReference) {
  std::mt19937 rng(1234);
  int cases = 0;
  double worst = 0, worst_rounding = 0;
  for (DType type : {DType::F32, DType::F16, DType::BF16, DType::Q8_0})
    for (int32_t hd : head_dims(type))
      for (int32_t ps : {1, 4, 16, 32})
        for (int32_t group : {1, 2, 4, 8})
          for (int rep = 0; rep < 2; ++rep) {
            const Config c = random_config(hd, ps, group, type, rng);
            SCOPED_TRACE(describe(c));
            Stream st(c, rng);
            st.fill_random(rng);
            const int64_t q_stride = static_cast<int64_t>(c.group) * c.hd + (rng() % 2) * 5;
            const auto q = random_q(c, q_stride, 4.0f, rng);  // scores ~ N(0, 2.3^2)
            const auto qk = kernel_q(GetParam(), c, q, q_stride);
            std::vector<double> ref;
            reference(st, qk, q_stride, ref, nullptr);
            const auto out = run_kernel(GetParam(), st, q, q_stride, nullptr);
            const double err = max_err(out, ref);
            ASSERT_LE(err, kOutTol);
            worst = std::max(worst, err);
            if (type == DType::BF16 || type == DType::Q8_0) {
              worst_rounding = std::max(worst_rounding, check_rounding(st, q, qk, q_stride, out));
              if (::testing::Test::HasFailure()) return;
            }
            ++cases;
          }
  std::printf("[%s] %d cases, max |out - ref| = %.3g; BF16/Q8_0 vs original values: worst error / bound = %.3g\n",
              GetParam(), cases, worst, worst_rounding);
}

TEST_P(AttentionIsa, LongDecodeMatchesReference) {
  std::mt19937 rng(99);
  double worst = 0;
  for (DType type : {DType::F32, DType::F16, DType::BF16, DType::Q8_0})
    for (int32_t n_slots : {1000, 2049})
      for (int32_t group : {2, 8}) {
        const Config c = decode_config(type, n_slots, group, 16);
        SCOPED_TRACE(describe(c));
        Stream st(c, rng);
        st.fill_random(rng);
        const auto q = random_q(c, c.group * c.hd, 4.0f, rng);
        std::vector<double> ref;
        reference(st, kernel_q(GetParam(), c, q, c.group * c.hd), c.group * c.hd, ref, nullptr);
        const double err = max_err(run_kernel(GetParam(), st, q, c.group * c.hd, nullptr), ref);
        ASSERT_LE(err, kOutTol);
        worst = std::max(worst, err);
      }
  std::printf("[%s] long decode: max |out - ref| = %.3g\n", GetParam(), worst);
}

// random_case, its stream filled with random K/V and dense q rows (sigma 4).
struct RandomCase {
  Config c;
  Stream st;
  int64_t q_stride;
  std::vector<float> q;
  explicit RandomCase(std::mt19937& rng) : c(random_case(rng)), st(c, rng), q_stride(static_cast<int64_t>(c.group) * c.hd) {
    st.fill_random(rng);
    q = random_q(c, q_stride, 4.0f, rng);
  }
};

TEST_P(AttentionIsa, KeyMassMatchesReferenceAndAccumulates) {
  std::mt19937 rng(777);
  for (int i = 0; i < 120; ++i) {
    const RandomCase rc(rng);
    const Config& c = rc.c;
    const Stream& st = rc.st;
    const int64_t q_stride = rc.q_stride;
    const std::vector<float>& q = rc.q;
    SCOPED_TRACE(describe(c));
    // key_mass starts non-zero: the kernel must add to it.
    std::vector<float> mass(c.n_slots);
    for (auto& m : mass) m = static_cast<float>(rng() % 4);
    std::vector<double> ref_mass(mass.begin(), mass.end());
    std::vector<double> ref;
    reference(st, kernel_q(GetParam(), c, q, q_stride), q_stride, ref, &ref_mass);
    const auto out = run_kernel(GetParam(), st, q, q_stride, mass.data());
    ASSERT_LE(max_err(out, ref), kOutTol);
    // The output must not depend on whether key_mass was requested (streams this short are one part).
    const auto out_plain = run_kernel(GetParam(), st, q, q_stride, nullptr);
    ASSERT_EQ(kernels::attention_parts(st.view(), AttentionArgs{}), 1);
    ASSERT_EQ(0, std::memcmp(out.data(), out_plain.data(), out.size() * sizeof(float)));
    double total = 0;
    for (int32_t s = 0; s < c.n_slots; ++s) {
      ASSERT_NEAR(mass[s], ref_mass[s], kMassTol * (1 + ref_mass[s])) << "slot " << s;
      total += mass[s];
    }
    const double expect_total = std::accumulate(ref_mass.begin(), ref_mass.end(), 0.0);
    EXPECT_NEAR(total, expect_total, 1e-4 * expect_total);
  }
}

// The log-sum-exp by-product (recall's hot mass): ln sum_j exp(scale q.k_j) over each query row's visible
// slots, against the double reference; it changes nothing in the output.
TEST_P(AttentionIsa, LogSumExpMatchesReference) {
  std::mt19937 rng(4242);
  for (int i = 0; i < 120; ++i) {
    const RandomCase rc(rng);
    const auto& [c, st, q_stride, q] = rc;
    SCOPED_TRACE(describe(c));
    std::vector<float> lse(static_cast<size_t>(c.n_new) * c.group + 1, kNaN);
    const auto out = run_kernel(GetParam(), st, q, q_stride, nullptr, 3, lse.data());
    const auto out_plain = run_kernel(GetParam(), st, q, q_stride, nullptr);
    ASSERT_EQ(0, std::memcmp(out.data(), out_plain.data(), out.size() * sizeof(float)));
    EXPECT_TRUE(std::isnan(lse.back())) << "written past n_new * group";
    const auto qk = kernel_q(GetParam(), c, q, q_stride);
    for (int32_t t = 0; t < c.n_new; ++t)
      for (int32_t g = 0; g < c.group; ++g) {
        const int32_t limit = c.n_slots - c.n_new + t + 1;
        const float* qv = qk.data() + t * q_stride + static_cast<int64_t>(g) * c.hd;
        std::vector<double> sc(static_cast<size_t>(limit));
        double mx = -std::numeric_limits<double>::infinity();
        for (int32_t j = 0; j < limit; ++j) {
          double dot = 0;
          for (int32_t d = 0; d < c.hd; ++d) dot += static_cast<double>(qv[d]) * st.k(j)[d];
          sc[static_cast<size_t>(j)] = dot * c.scale;
          mx = std::max(mx, sc[static_cast<size_t>(j)]);
        }
        double sum = 0;
        for (double v : sc) sum += std::exp(v - mx);
        const double want = mx + std::log(sum);
        ASSERT_NEAR(lse[static_cast<size_t>(t) * c.group + g], want, 1e-4 * (1.0 + std::fabs(want))) << "t " << t << " g " << g;
      }
  }
}

// Scores of magnitude ~1e4 (exp overflows / underflows in f32 and in double without max subtraction).
// Small-integer q and k with scale 1 make every f32 dot product exact, so the tight tolerance still holds.
TEST_P(AttentionIsa, ExtremeScoresStayFinite) {
  std::mt19937 rng(4242);
  for (int i = 0; i < 24; ++i) {
    Config c;
    c.hd = (i % 3 == 0) ? 8 : (i % 3 == 1 ? 64 : 128);
    c.ps = (i % 2) ? 16 : 4;
    c.group = 1 << (i % 4);
    c.type = (i % 3 == 2) ? DType::BF16 : (i % 2) ? DType::F16 : DType::F32;  // small integers are exact in all three
    c.n_new = (i % 4 == 0) ? 7 : 1;
    c.n_slots = 50 + static_cast<int32_t>(rng() % 200);
    c.scale = 1.0f;
    SCOPED_TRACE(describe(c) + " case " + std::to_string(i));
    Stream st(c, rng);
    const bool all_negative = i % 2 == 1;  // every score hugely negative: naive exp underflows to 0/0
    std::vector<float> k(c.hd), v(c.hd);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int32_t s = 0; s < c.n_slots; ++s) {
      for (int32_t d = 0; d < c.hd; ++d) {
        k[d] = all_negative ? static_cast<float>(1 + rng() % 4) : static_cast<float>(static_cast<int>(rng() % 9) - 4);
        v[d] = u(rng);
      }
      st.set_slot(s, k.data(), v.data());
    }
    const int64_t q_stride = static_cast<int64_t>(c.group) * c.hd;
    std::vector<float> q(static_cast<size_t>(c.n_new) * q_stride);
    for (auto& x : q)
      x = all_negative ? -static_cast<float>(16 + rng() % 64) : static_cast<float>(static_cast<int>(rng() % 129) - 64);
    std::vector<double> ref;
    std::vector<double> ref_mass(c.n_slots, 0.0);
    reference(st, q, q_stride, ref, &ref_mass);
    std::vector<float> mass(c.n_slots, 0.0f);
    const auto out = run_kernel(GetParam(), st, q, q_stride, mass.data());
    ASSERT_LE(max_err(out, ref), kOutTol);
    for (int32_t s = 0; s < c.n_slots; ++s) ASSERT_NEAR(mass[s], ref_mass[s], kMassTol * (1 + ref_mass[s]));
  }
}

// Query token t must not use slots >= n_slots - n_new + t + 1, even when they hold NaN or Inf (0 * Inf
// would poison it), and no slot >= n_slots is ever read (the pool is NaN-filled around every stream).
TEST_P(AttentionIsa, CausalSlotsBeyondLimitAreNeverUsed) {
  std::mt19937 rng(31337);
  for (int i = 0; i < 80; ++i) {
    static constexpr int32_t kHd[] = {8, 16, 64, 80, 128};
    static constexpr int32_t kPs[] = {1, 4, 16, 32};
    Config c;
    static constexpr DType kTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0};
    c.type = kTypes[rng() % 4];
    c.hd = c.type == DType::Q8_0 ? 32 * (1 + static_cast<int32_t>(rng() % 4)) : kHd[rng() % 5];
    c.ps = kPs[rng() % 4];
    c.group = 1 << (rng() % 4);
    c.n_new = 2 + static_cast<int32_t>(rng() % 40);
    c.n_slots = c.n_new + static_cast<int32_t>(rng() % 100);
    c.scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
    SCOPED_TRACE(describe(c));
    Stream st(c, rng);
    st.fill_random(rng);
    const int64_t q_stride = static_cast<int64_t>(c.group) * c.hd;
    const auto q = random_q(c, q_stride, 4.0f, rng);
    const auto before = run_kernel(GetParam(), st, q, q_stride, nullptr);
    const int32_t t_star = static_cast<int32_t>(rng() % (c.n_new - 1));  // tokens <= t_star stay clean
    for (int32_t s = c.n_slots - c.n_new + t_star + 1; s < c.n_slots; ++s) st.poison_slot(s, /*nan=*/i % 2 == 1);
    std::vector<float> mass(c.n_slots, 0.0f);
    const auto after = run_kernel(GetParam(), st, q, q_stride, mass.data());
    const size_t clean = static_cast<size_t>(t_star + 1) * c.group * c.hd;
    for (size_t j = 0; j < clean; ++j) {
      ASSERT_TRUE(std::isfinite(after[j])) << "index " << j;
      ASSERT_EQ(before[j], after[j]) << "index " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, AttentionIsa, ::testing::Values("scalar", "avx2", "avx512", "avx512_novnni"),
                         [](const auto& info) { return std::string(info.param); });

TEST(Attention, PathsAgreeAndDefaultPathWorks) {
  const std::string isa = attention_isa();
  EXPECT_TRUE(isa == "scalar" || isa == "avx2" || isa == "avx512") << isa;
  EXPECT_TRUE(attention_isa_available(isa.c_str()));
  EXPECT_TRUE(attention_isa_available("scalar"));
  EXPECT_FALSE(attention_isa_available("sse9"));
  EXPECT_FALSE(attention_isa_available(nullptr));
  std::printf("default attention path: %s\n", isa.c_str());

  std::mt19937 rng(5);
  Config c;
  c.hd = 64;
  c.ps = 16;
  c.group = 4;
  c.n_slots = 77;
  c.n_new = 5;
  c.scale = 0.125f;
  Stream st(c, rng);
  st.fill_random(rng);
  const auto q = random_q(c, c.group * c.hd, 4.0f, rng);
  std::vector<double> ref;
  reference(st, q, c.group * c.hd, ref, nullptr);
  EXPECT_LE(max_err(run_kernel(nullptr, st, q, c.group * c.hd, nullptr), ref), kOutTol);
  EXPECT_THROW(run_kernel("sse9", st, q, c.group * c.hd, nullptr), std::invalid_argument);
}

// Q8_0 pages give every path that scores the f32 query the same bits as F32 pages holding their dequantised
// values (d * q): AVX-512 without VNNI reads Q8_0 in registers, the other paths through a dequantised scratch
// tile, and either way the kernel must compute on exactly d * q. Decode and prefill shapes, GQA groups
// 1 / 2 / 8, key mass and lse too. (AVX-512 with VNNI quantises the queries: MatchesNaiveReference checks it
// against the reference on its quantised queries, and against the original values within the bound.)
TEST(Attention, Q8_0PagesGiveTheBitsOfTheirDequantisedF32Pages) {
  std::mt19937 rng(11);
  for (const char* isa : {"scalar", "avx2", "avx512", "avx512_novnni"}) {
    if (!attention_isa_available(isa) || attention_quantises_queries(isa, DType::Q8_0)) continue;
    for (const int32_t group : {1, 2, 8})
      for (const int32_t n_new : {1, 7}) {
        Config c;
        c.hd = group == 8 ? 64 : 128;
        c.ps = 16;
        c.group = group;
        c.n_slots = 16 * 9 + 5;
        c.n_new = n_new;
        c.scale = 0.09f;
        c.type = DType::Q8_0;
        Stream q8(c, rng);
        q8.fill_random(rng);
        Config cf = c;
        cf.type = DType::F32;
        Stream f32(cf, rng);
        for (int32_t slot = 0; slot < c.n_slots; ++slot) f32.set_slot(slot, q8.k(slot), q8.v(slot));  // exact in f32
        const auto q = random_q(c, c.group * c.hd, 3.0f, rng);
        std::vector<float> mass_q8(static_cast<size_t>(c.n_slots), 0.0f), mass_f32 = mass_q8;
        std::vector<float> lse_q8(static_cast<size_t>(c.n_new) * c.group), lse_f32 = lse_q8;
        const auto out_q8 = run_kernel(isa, q8, q, c.group * c.hd, mass_q8.data(), 3, lse_q8.data());
        const auto out_f32 = run_kernel(isa, f32, q, c.group * c.hd, mass_f32.data(), 3, lse_f32.data());
        const std::string what = std::string(isa) + " " + describe(c);
        ASSERT_EQ(out_q8.size(), out_f32.size());
        EXPECT_EQ(std::memcmp(out_q8.data(), out_f32.data(), out_q8.size() * sizeof(float)), 0) << what;
        EXPECT_EQ(std::memcmp(mass_q8.data(), mass_f32.data(), mass_q8.size() * sizeof(float)), 0) << what;
        EXPECT_EQ(std::memcmp(lse_q8.data(), lse_f32.data(), lse_q8.size() * sizeof(float)), 0) << what;
      }
  }
}

// Decode at depth in parts (split-K): paged_attention folds the stream's parts itself; a caller that runs
// each part as its own task (paged_attention_part) and folds them in order with attention_merge gets the same
// bits, output and log-sum-exp — so splitting by the thread count changes nothing. Against the double
// reference too, up to kAttentionMaxParts parts.
TEST(Attention, DecodeInPartsEqualsThePartsFoldedByTheCaller) {
  std::mt19937 rng(2468);
  for (DType type : {DType::F16, DType::Q8_0})
    for (int32_t n_slots : {1000, 1100, 2049, 5000, 9000})
      for (int32_t group : {1, 2, 8}) {
        const Config c = decode_config(type, n_slots, group, n_slots == 5000 ? 32 : 16);
        SCOPED_TRACE(describe(c));
        Stream st(c, rng);
        st.fill_random(rng);
        const auto q = random_q(c, c.group * c.hd, 4.0f, rng);
        std::vector<float> lse(static_cast<size_t>(group));
        const auto out = run_kernel(nullptr, st, q, c.group * c.hd, nullptr, 0, lse.data());
        AttentionArgs a;
        a.q = q.data();
        a.q_stride = c.group * c.hd;
        std::vector<float> sink(static_cast<size_t>(group) * c.hd);
        a.out = sink.data();
        a.group = group;
        a.scale = c.scale;
        std::vector<float> scratch(attention_scratch_floats(1, group, c.hd, c.ps));
        a.scratch = scratch.data();
        const int32_t P = attention_parts(st.view(), a);
        EXPECT_EQ(P, std::clamp(n_slots / kAttentionPartSlots, 1, kAttentionMaxParts));
        std::vector<float> folded(static_cast<size_t>(group) * c.hd), part(folded.size()), run_lse(lse.size()), part_lse(lse.size());
        for (int32_t p = 0; p < P; ++p) {
          paged_attention_part(st.view(), a, p, part.data(), part_lse.data());
          attention_fold(p, folded.data(), run_lse.data(), part.data(), part_lse.data(), group, c.hd);
        }
        EXPECT_EQ(std::memcmp(out.data(), folded.data(), out.size() * sizeof(float)), 0);
        EXPECT_EQ(std::memcmp(lse.data(), run_lse.data(), lse.size() * sizeof(float)), 0);
        EXPECT_THROW(paged_attention_part(st.view(), a, P, part.data(), part_lse.data()), std::invalid_argument);
        std::vector<double> ref;
        reference(st, kernel_q(nullptr, c, q, c.group * c.hd), c.group * c.hd, ref, nullptr);
        EXPECT_LE(max_err(out, ref), kOutTol);
      }
}

// The query quantisation's spec (attention_quantise_query_row): per 32 elements d = amax / 127 and
// q = nearbyint(x / d), ties to even; an all-zero block stays zero; every element within d / 2 of x.
TEST(Attention, QueryQuantisationFollowsItsSpec) {
  std::vector<float> x(64, 0.0f), y(64, -1.0f);
  x[0] = 127.0f;  // d = 1 in the first block
  x[1] = 2.5f;    // ties to even: 2
  x[2] = -3.5f;   // ties to even: -4
  x[3] = 0.49f;
  attention_quantise_query_row(x.data(), 64, y.data());
  EXPECT_EQ(y[0], 127.0f);
  EXPECT_EQ(y[1], 2.0f);
  EXPECT_EQ(y[2], -4.0f);
  EXPECT_EQ(y[3], 0.0f);
  for (int i = 32; i < 64; ++i) EXPECT_EQ(y[i], 0.0f) << i;  // zero block: d = 0, no NaN
  std::mt19937 rng(8);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> r(256), z(256);
  for (auto& v : r) v = nd(rng);
  attention_quantise_query_row(r.data(), 256, z.data());
  for (int b = 0; b < 256; b += 32) {
    float amax = 0;
    for (int i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(r[i]));
    for (int i = b; i < b + 32; ++i) EXPECT_LE(std::fabs(z[i] - r[i]), amax / 127.0f * (0.5f + 1e-5f)) << i;
  }
}

// Which paths quantise the queries: only avx512 with Q8_0 keys, and only where the CPU has VNNI.
TEST(Attention, OnlyTheVnniPathQuantisesQueries) {
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    for (const char* isa : {"scalar", "avx2", "avx512", "avx512_novnni"}) EXPECT_FALSE(attention_quantises_queries(isa, t));
  EXPECT_FALSE(attention_quantises_queries("scalar", DType::Q8_0));
  EXPECT_FALSE(attention_quantises_queries("avx2", DType::Q8_0));
  EXPECT_FALSE(attention_quantises_queries("avx512_novnni", DType::Q8_0));
  EXPECT_FALSE(attention_quantises_queries(nullptr, DType::Q8_0));
  EXPECT_EQ(attention_quantises_queries("avx512", DType::Q8_0),
            attention_isa_available("avx512") && cpu_has(CpuFeature::Avx512Vnni));
}

// The forward pass sizes one scratch buffer per thread for its largest token block and page size.
TEST(Attention, ScratchSizeIsMonotone) {
  for (int32_t group : {1, 2, 3, 8, 16, 64})
    for (int32_t hd : {8, 64, 80, 128, 256})
      for (int32_t ps : {1, 4, 16, 32, 64})
        for (int32_t n = 1; n < 80; ++n) {
          const size_t s = attention_scratch_floats(n, group, hd, ps);
          ASSERT_LE(s, attention_scratch_floats(n + 1, group, hd, ps));
          ASSERT_LE(s, attention_scratch_floats(n, group, hd, ps + 1));
          ASSERT_LE(s, attention_scratch_floats(n, group, hd + 1, ps));
          ASSERT_LE(s, attention_scratch_floats(n, group + 1, hd, ps));
        }
}

TEST(Attention, RejectsInvalidArguments) {
  std::mt19937 rng(6);
  Config c;
  c.hd = 16;
  c.n_slots = 4;
  c.n_new = 2;
  Stream st(c, rng);
  st.fill_random(rng);
  std::vector<float> q(64), out(64), scratch(attention_scratch_floats(8, 1, 16, 16));
  AttentionArgs a;
  a.q = q.data();
  a.q_stride = 16;
  a.out = out.data();
  a.out_stride = 16;
  a.n_new = 2;
  a.scratch = scratch.data();
  KvStreamView kv = st.view();
  EXPECT_NO_THROW(paged_attention(kv, a));
  KvStreamView bad_type = kv;
  bad_type.kv_type = DType::Q4_0;
  EXPECT_THROW(paged_attention(bad_type, a), std::invalid_argument);
  KvStreamView q8_bad_hd = kv;  // head_dim 16 is not a whole number of Q8_0 blocks
  q8_bad_hd.kv_type = DType::Q8_0;
  EXPECT_THROW(paged_attention(q8_bad_hd, a), std::invalid_argument);
  EXPECT_THROW(kv_row_bytes(DType::Q8_0, 16), std::invalid_argument);
  EXPECT_EQ(kv_row_bytes(DType::Q8_0, 128), 4u * 34);
  EXPECT_EQ(kv_row_bytes(DType::BF16, 80), 160u);
  AttentionArgs too_many = a;
  too_many.n_new = 5;
  EXPECT_THROW(paged_attention(kv, too_many), std::invalid_argument);
  AttentionArgs no_scratch = a;
  no_scratch.scratch = nullptr;
  EXPECT_THROW(paged_attention(kv, no_scratch), std::invalid_argument);
  // n_new == 0 is a no-op.
  AttentionArgs none = a;
  none.n_new = 0;
  std::fill(out.begin(), out.end(), 7.0f);
  EXPECT_NO_THROW(paged_attention(kv, none));
  EXPECT_EQ(out[0], 7.0f);
}

}  // namespace
}  // namespace kvpack::kernels

// Decode leaves pages that continue their stream in address order to the hardware prefetchers and
// prefetches the others itself (kv_page_needs_prefetch): a page one record past the previous one, or in a
// small forward gap, is a continuation; backwards, the same address or a jump of more than a record is not.
TEST(AttentionPrefetch, OnlyPagesThatBreakAddressOrderArePrefetched) {
  std::vector<uint8_t> arena(1 << 20);
  const size_t rec = 8192 + 64, span = 8192 + 4096;
  const uint8_t* base = arena.data();
  const uint8_t* pages[] = {base, base + rec, base + 2 * rec, base + 2 * rec + 8192 + 4096, base + 40 * rec, base + 3 * rec,
                            base + 3 * rec};
  EXPECT_FALSE(kvpack::kernels::kv_page_needs_prefetch(pages, 1, span));  // next record
  EXPECT_FALSE(kvpack::kernels::kv_page_needs_prefetch(pages, 2, span));
  EXPECT_FALSE(kvpack::kernels::kv_page_needs_prefetch(pages, 3, span));  // gap of exactly the span
  EXPECT_TRUE(kvpack::kernels::kv_page_needs_prefetch(pages, 4, span));   // far ahead
  EXPECT_TRUE(kvpack::kernels::kv_page_needs_prefetch(pages, 5, span));   // backwards
  EXPECT_TRUE(kvpack::kernels::kv_page_needs_prefetch(pages, 6, span));   // the same page again
}
