// TriSpan (compress/scorer_trispan.cpp, kernels::key_novelty): the kernel against a float64 reference on
// every KV type and both RoPE layouts; the scorer's keep sets against a literal float64 reference of the
// documented formula over several events (running statistics across events, with and without calibration);
// what the policy is for (a planted span of novel keys survives whole in every stream while the bulk is
// evicted); determinism (thread pool, repeated runs); the default-policy rule; and the real data path: the
// committed testbed model prefilling a pointer-chasing prompt at 10 % of its context keeps every link line
// where a recent window keeps none, and then answers.
#include <gtest/gtest.h>

#include <complex>
#include <filesystem>
#include <numeric>

#include "kernels/key_scoring.h"
#include "kernels/ops.h"
#include "model/forward.h"
#include "model/model.h"
#include "util/thread_pool.h"
#include "compress_test_refs.h"

using namespace kvpack;
using namespace kvpack::compress;
using namespace kvpack::compress_test;

namespace {

// ---------------------------------------------------------------------------------------------------
// Kernel: a paged stream owned by the test (pages of K rows then V rows).
class Stream {
 public:
  Stream(DType type, int32_t head_dim, int32_t page_size, const std::vector<std::vector<float>>& keys)
      : row_(kernels::kv_row_bytes(type, head_dim)) {
    view_.kv_type = type;
    view_.head_dim = head_dim;
    view_.page_size = page_size;
    view_.n_slots = static_cast<int32_t>(keys.size());
    view_.v_offset = static_cast<size_t>(page_size) * row_;
    const size_t n_pages = (keys.size() + static_cast<size_t>(page_size) - 1) / static_cast<size_t>(page_size);
    pages_.resize(n_pages);
    for (size_t p = 0; p < n_pages; ++p) {
      pages_[p].assign(2 * view_.v_offset, 0xAB);  // garbage past the last slot
      for (size_t r = 0; r < static_cast<size_t>(page_size) && p * page_size + r < keys.size(); ++r)
        kernels::kv_encode_row(keys[p * page_size + r].data(), type, head_dim, pages_[p].data() + r * row_);
      ptrs_.push_back(pages_[p].data());
    }
    view_.pages = ptrs_.data();
  }
  const kernels::KvStreamView& view() const { return view_; }
  std::vector<float> key(int32_t slot) const {  // as stored (rounded to the KV type)
    std::vector<float> k(static_cast<size_t>(view_.head_dim));
    kernels::kv_decode_row(ptrs_[static_cast<size_t>(slot / view_.page_size)] + static_cast<size_t>(slot % view_.page_size) * row_,
                           view_.kv_type, view_.head_dim, k.data());
    return k;
  }

 private:
  size_t row_;
  kernels::KvStreamView view_;
  std::vector<std::vector<uint8_t>> pages_;
  std::vector<const uint8_t*> ptrs_;
};

// Inverse RoPE table of positions (what the scorer builds): rope_table of the negated positions.
std::vector<float> inverse_table(const std::vector<int32_t>& pos, int32_t rot_dims, float theta) {
  std::vector<int32_t> neg(pos.size());
  for (size_t j = 0; j < pos.size(); ++j) neg[j] = -pos[j];
  std::vector<float> cs(pos.size() * static_cast<size_t>(rot_dims));
  if (rot_dims > 0 && !pos.empty()) kernels::rope_table(neg.data(), static_cast<int32_t>(pos.size()), rot_dims, theta, 1.0f, cs.data());
  return cs;
}

// u = R(-p) k / ||k|| in float64, literally: band i of angle -p * theta^(-2i/rot_dims).
std::vector<double> ref_unit_prerope(const std::vector<float>& k, int32_t p, int32_t rot_dims, bool neox, double theta) {
  std::vector<double> u(k.begin(), k.end());
  const int32_t half = rot_dims / 2;
  for (int32_t i = 0; i < half; ++i) {
    const int32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const std::complex<double> z = std::complex<double>(k[static_cast<size_t>(a)], k[static_cast<size_t>(b)]) *
                                   std::polar(1.0, -static_cast<double>(p) * std::pow(theta, -2.0 * i / rot_dims));
    u[static_cast<size_t>(a)] = z.real();
    u[static_cast<size_t>(b)] = z.imag();
  }
  double ss = 0;
  for (double x : u) ss += x * x;
  for (double& x : u) x = ss > 0 ? x / std::sqrt(ss) : 0.0;
  return u;
}

std::vector<std::vector<float>> normal_keys(int32_t n, int32_t hd, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.3f);
  std::vector<std::vector<float>> k(static_cast<size_t>(n), std::vector<float>(static_cast<size_t>(hd)));
  for (auto& row : k)
    for (float& x : row) x = nd(rng);
  return k;
}

std::vector<int32_t> increasing_positions(int32_t n, int32_t start, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(static_cast<size_t>(n));
  int32_t x = start;
  for (auto& v : p) v = x += 1 + static_cast<int32_t>(rng() % 5);
  return p;
}

}  // namespace

TEST(CompressTriSpanKernel, NoveltyMatchesFloat64Reference) {
  for (DType type : {DType::F32, DType::F16, DType::BF16, DType::Q8_0})
    for (bool neox : {true, false})
      for (int32_t rot : {64, 32, 0}) {
        const int32_t hd = 64, n = 41, ps = 5;
        auto keys = normal_keys(n, hd, 17u + static_cast<uint32_t>(rot) + (neox ? 1u : 0u));
        keys[7].assign(static_cast<size_t>(hd), 0.0f);  // a zero key scores 0 and adds nothing
        const Stream st(type, hd, ps, keys);
        const std::vector<int32_t> pos = increasing_positions(n, 100000, 3);  // large angles
        const std::vector<float> cs = inverse_table(pos, rot, 10000.0f);
        kernels::KeyUnrotate r{cs.data(), rot, neox};
        for (int32_t from : {0, 19, n}) {
          SCOPED_TRACE(std::string(kernels::kv_type_name(type)) + (neox ? " neox" : " gptj") + " rot " + std::to_string(rot) +
                       " from " + std::to_string(from));
          std::vector<double> sum(static_cast<size_t>(hd), 0.25), ref_sum = sum;  // a sum from earlier events
          std::vector<float> out(static_cast<size_t>(n));
          kernels::key_novelty(st.view(), r, from, sum.data(), out.data());
          std::vector<std::vector<double>> u;
          for (int32_t j = 0; j < n; ++j) u.push_back(ref_unit_prerope(st.key(j), pos[static_cast<size_t>(j)], rot, neox, 10000.0));
          for (int32_t j = from; j < n; ++j)
            for (int32_t e = 0; e < hd; ++e) ref_sum[static_cast<size_t>(e)] += u[static_cast<size_t>(j)][static_cast<size_t>(e)];
          double norm = 0;
          for (int32_t e = 0; e < hd; ++e) {
            EXPECT_NEAR(sum[static_cast<size_t>(e)], ref_sum[static_cast<size_t>(e)], 1e-5) << e;
            norm += ref_sum[static_cast<size_t>(e)] * ref_sum[static_cast<size_t>(e)];
          }
          for (int32_t j = 0; j < n; ++j) {
            double c = 0;
            for (int32_t e = 0; e < hd; ++e) c += u[static_cast<size_t>(j)][static_cast<size_t>(e)] * ref_sum[static_cast<size_t>(e)];
            EXPECT_NEAR(out[static_cast<size_t>(j)], c / std::sqrt(norm), 2e-6) << "slot " << j;
          }
          EXPECT_EQ(out[7], 0.0f);
        }
      }
}

// A table indexed by position (KeyUnrotate::positions: one table for streams whose slots differ) gives
// bitwise what a table built for the slots' own positions gives.
TEST(CompressTriSpanKernel, PositionIndexedTableEqualsPerSlotTable) {
  for (DType type : {DType::F32, DType::F16})
    for (bool neox : {true, false}) {
      const int32_t hd = 64, n = 29, ps = 4, rot = 64;
      const auto keys = normal_keys(n, hd, 41u + (neox ? 1u : 0u));
      const Stream st(type, hd, ps, keys);
      const std::vector<int32_t> pos = increasing_positions(n, 10, 5);
      const std::vector<float> per_slot = inverse_table(pos, rot, 10000.0f);
      std::vector<int32_t> all(static_cast<size_t>(pos.back() + 1));
      std::iota(all.begin(), all.end(), 0);
      const std::vector<float> by_pos = inverse_table(all, rot, 10000.0f);
      std::vector<double> s1(static_cast<size_t>(hd), 0.0), s2 = s1;
      std::vector<float> o1(static_cast<size_t>(n)), o2(o1.size());
      kernels::KeyUnrotate a{per_slot.data(), rot, neox};
      kernels::KeyUnrotate b{by_pos.data(), rot, neox, pos.data()};
      kernels::key_novelty(st.view(), a, 0, s1.data(), o1.data());
      kernels::key_novelty(st.view(), b, 0, s2.data(), o2.data());
      EXPECT_EQ(o1, o2) << kernels::kv_type_name(type) << (neox ? " neox" : " gptj");
      EXPECT_EQ(s1, s2);
    }
}

// key_novelty on every path this CPU has against scalar, odd shapes: where the AVX-512 path serves (F16,
// NeoX with rot_dims / 2 % 16 == 0, or no rotation) the sums match to rounding and the cosines to 1e-6;
// elsewhere every path is the scalar code, bitwise.
TEST(CompressTriSpanKernel, EveryIsaPathMatchesScalar) {
  for (kernels::Isa isa : {kernels::Isa::Scalar, kernels::Isa::Avx2, kernels::Isa::Avx512}) {
    if (!kernels::cpu_supports(isa, kernels::kKeyScoringIsa)) continue;
    for (DType type : {DType::F32, DType::F16})
      for (bool neox : {true, false})
        for (const auto& [hd, rot, ps, n] : {std::tuple{128, 128, 16, 61}, std::tuple{64, 32, 5, 23}, std::tuple{48, 0, 7, 9},
                                             std::tuple{96, 64, 3, 1}, std::tuple{32, 16, 4, 17}}) {
          SCOPED_TRACE(std::string(kernels::isa_name(isa)) + " " + kernels::kv_type_name(type) + (neox ? " neox" : " gptj") +
                       " hd " + std::to_string(hd) + " rot " + std::to_string(rot));
          const Stream st(type, hd, ps, normal_keys(n, hd, 91u + static_cast<uint32_t>(hd + rot)));
          const std::vector<int32_t> pos = increasing_positions(n, 7, 9);
          const std::vector<float> cs = inverse_table(pos, rot, 10000.0f);
          const kernels::KeyUnrotate r{cs.data(), rot, neox};
          const int32_t from = n / 3;
          std::vector<double> s_got(static_cast<size_t>(hd), 0.5), s_want = s_got;
          std::vector<float> got(static_cast<size_t>(n)), want(got.size());
          kernels::key_novelty_on(isa, st.view(), r, from, s_got.data(), got.data());
          kernels::key_novelty_on(kernels::Isa::Scalar, st.view(), r, from, s_want.data(), want.data());
          const bool special = isa == kernels::Isa::Avx512 && kernels::key_novelty_has_avx512_path(st.view(), r);
          EXPECT_EQ(special, isa == kernels::Isa::Avx512 && type == DType::F16 && hd % 16 == 0 && (rot == 0 || (neox && rot / 2 % 16 == 0)));
          if (!special) {
            EXPECT_EQ(got, want);
            EXPECT_EQ(s_got, s_want);
            continue;
          }
          for (int32_t e = 0; e < hd; ++e) EXPECT_NEAR(s_got[static_cast<size_t>(e)], s_want[static_cast<size_t>(e)], 1e-6) << e;
          for (int32_t j = 0; j < n; ++j) EXPECT_NEAR(got[static_cast<size_t>(j)], want[static_cast<size_t>(j)], 1e-6) << "slot " << j;
        }
  }
}

TEST(CompressTriSpanKernel, UndoesTheForwardPassRope) {
  // One pre-RoPE key rotated to many positions exactly as the forward pass rotates keys: after
  // un-rotation every slot is the same unit vector, so each has cosine 1 to their sum.
  for (bool neox : {true, false}) {
    const int32_t hd = 32, n = 23;
    const std::vector<float> base = normal_keys(1, hd, 5)[0];
    const std::vector<int32_t> pos = increasing_positions(n, 0, 9);
    std::vector<float> fwd(static_cast<size_t>(n) * hd);
    kernels::rope_table(pos.data(), n, hd, 10000.0f, 1.0f, fwd.data());
    std::vector<std::vector<float>> keys;
    for (int32_t j = 0; j < n; ++j) {
      std::vector<float> k = base;
      kernels::rope_apply(k.data(), fwd.data() + static_cast<size_t>(j) * hd, hd, neox);
      keys.push_back(k);
    }
    const Stream st(DType::F32, hd, 4, keys);
    const std::vector<float> cs = inverse_table(pos, hd, 10000.0f);
    std::vector<double> sum(static_cast<size_t>(hd), 0.0);
    std::vector<float> out(static_cast<size_t>(n));
    kernels::key_novelty(st.view(), {cs.data(), hd, neox}, 0, sum.data(), out.data());
    for (int32_t j = 0; j < n; ++j) EXPECT_NEAR(out[static_cast<size_t>(j)], 1.0f, 1e-5f) << j;
    double bn = 0;
    for (float x : base) bn += static_cast<double>(x) * x;
    for (int32_t e = 0; e < hd; ++e) EXPECT_NEAR(sum[static_cast<size_t>(e)], n * base[static_cast<size_t>(e)] / std::sqrt(bn), 1e-4);
  }
}

TEST(CompressTriSpanKernel, ZeroSumAndArgumentChecks) {
  const Stream st(DType::F32, 8, 4, normal_keys(6, 8, 1));
  const std::vector<int32_t> pos = {0, 1, 2, 3, 4, 5};
  const std::vector<float> cs = inverse_table(pos, 8, 10000.0f);
  std::vector<double> sum(8, 0.0);
  std::vector<float> out(6, 1.0f);
  kernels::key_novelty(st.view(), {cs.data(), 8, true}, 6, sum.data(), out.data());  // nothing new, sum zero
  for (float x : out) EXPECT_EQ(x, 0.0f);
  EXPECT_THROW(kernels::key_novelty(st.view(), {cs.data(), 10, true}, 0, sum.data(), out.data()), std::invalid_argument);
  EXPECT_THROW(kernels::key_novelty(st.view(), {cs.data(), 7, true}, 0, sum.data(), out.data()), std::invalid_argument);
  EXPECT_THROW(kernels::key_novelty(st.view(), {nullptr, 8, true}, 0, sum.data(), out.data()), std::invalid_argument);
  EXPECT_THROW(kernels::key_novelty(st.view(), {cs.data(), 8, true}, 7, sum.data(), out.data()), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------------
// Scorer: a literal float64 reference of the documented formula, with its own running statistics.
namespace {

class RefTriSpan {
 public:
  explicit RefTriSpan(const ModelConfig& mc) : mc_(mc) {}
  // Scores of every stream for the snapshot (all streams hold the same positions: uniform split).
  std::vector<std::vector<double>> score(const Snapshot& sn, const QueryStats* qs) {
    const size_t S = sn.keys.size(), n = sn.keys[0].size();
    if (st_.empty()) st_.assign(S, {std::vector<double>(static_cast<size_t>(kHeadDim), 0.0), -1, 0, 0, 0});
    std::vector<double> nu(n, 0.0);
    for (size_t s = 0; s < S; ++s) {
      EXPECT_EQ(sn.pos[s], sn.pos[0]) << "streams must share positions";
      St& t = st_[s];
      std::vector<std::vector<double>> u;
      for (size_t j = 0; j < n; ++j) {
        const std::vector<float> k(sn.keys[s][j].begin(), sn.keys[s][j].end());
        u.push_back(ref_unit_prerope(k, sn.pos[s][j], mc_.rope_dims, mc_.rope_neox, mc_.rope_theta));
      }
      std::vector<bool> fresh(n);
      for (size_t j = 0; j < n; ++j) {
        fresh[j] = sn.pos[s][j] > t.last;
        if (fresh[j])
          for (int32_t e = 0; e < kHeadDim; ++e) t.sum[static_cast<size_t>(e)] += u[j][static_cast<size_t>(e)];
      }
      double norm = 0;
      for (double x : t.sum) norm += x * x;
      norm = std::sqrt(norm);
      std::vector<double> c(n);
      for (size_t j = 0; j < n; ++j) {
        double d = 0;
        for (int32_t e = 0; e < kHeadDim; ++e) d += u[j][static_cast<size_t>(e)] * t.sum[static_cast<size_t>(e)];
        c[j] = -(norm > 0 ? d / norm : 0.0);
        if (fresh[j]) {
          t.n += 1;
          t.s1 += c[j];
          t.s2 += c[j] * c[j];
        }
      }
      t.last = std::max(t.last, sn.pos[s].back());
      const double m = t.s1 / t.n, sd = std::max(std::sqrt(std::max(t.s2 / t.n - m * m, 0.0)), 1e-6);
      for (size_t j = 0; j < n; ++j) nu[j] += (c[j] - m) / sd / static_cast<double>(S);
    }
    std::vector<double> a(n);
    for (size_t j = 0; j < n; ++j) {
      const size_t lo = j >= 2 ? j - 2 : 0, hi = std::min(n - 1, j + 2);
      a[j] = std::accumulate(nu.begin() + static_cast<long>(lo), nu.begin() + static_cast<long>(hi) + 1, 0.0) / static_cast<double>(hi - lo + 1);
    }
    std::vector<bool> span(n, false), pad(n, false);
    for (size_t j = 0; j < n;) {
      if (a[j] <= 0.5) {
        ++j;
        continue;
      }
      size_t e = j;
      bool high = false;
      for (; e < n && a[e] > 0.5; ++e) high = high || a[e] > 0.9;
      for (size_t x = j; x < e; ++x) span[x] = high;
      j = e;
    }
    for (size_t j = 0; j < n; ++j)
      if (span[j])
        for (size_t x = j >= 2 ? j - 2 : 0; x <= std::min(n - 1, j + 2); ++x) pad[x] = true;
    auto z = [](std::vector<double> v) {
      double m = 0, var = 0;
      for (double x : v) m += x;
      m /= static_cast<double>(v.size());
      for (double x : v) var += (x - m) * (x - m);
      const double sd = std::max(std::sqrt(var / static_cast<double>(v.size())), 1e-6);
      for (double& x : v) x = (x - m) / sd;
      return v;
    };
    std::vector<double> rank(n);
    std::iota(rank.begin(), rank.end(), 0.0);
    rank = z(rank);
    std::vector<double> tier2 = rank;
    if (qs != nullptr) {
      const auto tri = ref_triattention(mc_, *qs, sn, sn.next_pos, /*layer_mean=*/false);
      std::vector<double> tm(n, 0.0);
      for (size_t s = 0; s < S; ++s)
        for (size_t j = 0; j < n; ++j) tm[j] += tri[s][j] / static_cast<double>(S);
      tm = z(tm);
      for (size_t j = 0; j < n; ++j) tier2[j] = 0.5 * tm[j] + 0.5 * rank[j];
    }
    std::vector<double> out(n);
    for (size_t j = 0; j < n; ++j) out[j] = pad[j] ? 1000.0 + a[j] : tier2[j];
    last_span_ = pad;
    return std::vector<std::vector<double>>(S, out);
  }
  const std::vector<bool>& last_span() const { return last_span_; }

 private:
  struct St {
    std::vector<double> sum;
    int32_t last;
    double n, s1, s2;
  };
  ModelConfig mc_;
  std::vector<St> st_;
  std::vector<bool> last_span_;
};

}  // namespace

class TriSpanTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {};  // (neox, calibration)

namespace {

// Keys like a repetitive text: per stream one pre-RoPE direction plus noise, rotated to the key's position
// as the forward pass stores it; positions in `planted` get random directions instead (novel lines).
void shape_keys(Seq& seq, const ModelConfig& mc, std::function<bool(int32_t)> planted, uint32_t seed) {
  auto dirs = std::make_shared<std::vector<std::vector<float>>>(normal_keys(mc.n_layer * mc.n_head_kv, kHeadDim, seed));
  auto rng = std::make_shared<std::mt19937>(seed + 1);
  seq.set_key_hook([dirs, rng, planted, mc](int32_t s, int32_t p, std::vector<float>& k) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int32_t e = 0; e < kHeadDim; ++e)
      k[static_cast<size_t>(e)] = planted(p) ? 2.0f * nd(*rng) : (*dirs)[static_cast<size_t>(s)][static_cast<size_t>(e)] + 0.3f * nd(*rng);
    std::vector<float> cs(kHeadDim);
    kernels::rope_table(&p, 1, kHeadDim, mc.rope_theta, 1.0f, cs.data());
    kernels::rope_apply(k.data(), cs.data(), kHeadDim, mc.rope_neox);
  });
}

}  // namespace

TEST_P(TriSpanTest, KeepSetsMatchTheLiteralReferenceOverEvents) {
  const auto [neox, calibrated] = GetParam();
  const ModelConfig mc = tiny_model(neox, 3, 4, 2);
  const QueryStats qs = make_stats(mc, 31);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, neox ? 41 : 42);
  // Novel lines at 20..27, 61..66, 130..134 and 170..176 (the last arrives after three events).
  shape_keys(seq, mc, [](int32_t p) { return (p >= 20 && p <= 27) || (p >= 61 && p <= 66) || (p >= 130 && p <= 134) || (p >= 170 && p <= 176); },
             neox ? 3 : 4);
  const CompressConfig cfg = make_cfg(PolicyKind::TriSpan, 40, 4, -1);
  SequenceCompressor comp(cfg, mc, calibrated ? &qs : nullptr, 0);
  RefTriSpan ref(mc);
  ASSERT_TRUE(seq.append(97));
  int spans = 0;
  for (int round = 0; round < 5; ++round) {
    Snapshot sn = snapshot(seq);
    compress_and_check(comp, seq, sn);
    const auto want = ref.score(sn, calibrated ? &qs : nullptr);
    for (bool b : ref.last_span()) spans += b ? 1 : 0;
    expect_keep_sets(seq, sn, want, uniform_budgets(mc, 40), cfg, 0, 1e-4, "trispan round " + std::to_string(round));
    for (int32_t s = 1; s < seq.kv().n_streams(); ++s) EXPECT_EQ(seq.positions(s), seq.positions(0)) << "stream " << s;
    ASSERT_TRUE(seq.append(23 + 7 * round));
  }
  EXPECT_GT(spans, 20) << "the planted lines should form spans, or this test checks only the rest";
}

TEST_P(TriSpanTest, ThreadPoolGivesTheSameKeepSets) {
  const auto [neox, calibrated] = GetParam();
  const ModelConfig mc = tiny_model(neox, 3, 4, 2);
  const QueryStats qs = make_stats(mc, 5);
  kv::PagePool pool_a(pool_config()), pool_b(pool_config());
  Seq a(pool_a, mc, 77), b(pool_b, mc, 77);
  const CompressConfig cfg = make_cfg(PolicyKind::TriSpan, 30, 2, 2);
  ThreadPool tp(2);
  SequenceCompressor ca(cfg, mc, calibrated ? &qs : nullptr, 0), cb(cfg, mc, calibrated ? &qs : nullptr, 0, &tp);
  for (int round = 0; round < 4; ++round) {
    ASSERT_TRUE(a.append(41 + round));
    ASSERT_TRUE(b.append(41 + round));
    ca.compress(a.kv());
    cb.compress(b.kv());
    for (int32_t s = 0; s < a.kv().n_streams(); ++s) EXPECT_EQ(a.positions(s), b.positions(s)) << "stream " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, TriSpanTest, ::testing::Combine(::testing::Bool(), ::testing::Bool()));

TEST(CompressTriSpan, PlantedSpanOfNovelKeysSurvivesWholeInEveryStream) {
  // The bulk: keys near one pre-RoPE direction per stream (repetitive filler). Planted at positions 30..36:
  // keys in random directions (a line unlike the rest). Keys are stored post-RoPE like the forward pass
  // stores them, so only the un-rotation finds the bulk's common direction. Budget 24 per stream, 4 events:
  // the span (7 slots, padded by 2 on each side) must survive whole everywhere, with or without calibration.
  for (bool calibrated : {false, true}) {
    const ModelConfig mc = tiny_model(true, 2, 4, 2);
    const QueryStats qs = make_stats(mc, 8);
    kv::PagePool pool(pool_config());
    kv::SequenceKv kv(pool, mc.n_layer, mc.n_head_kv);
    std::mt19937 rng(12);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<std::vector<float>> dir(static_cast<size_t>(kv.n_streams()), std::vector<float>(kHeadDim));
    for (auto& d : dir)
      for (float& x : d) x = nd(rng);
    auto append = [&](int32_t n) {
      const int32_t p0 = kv.next_pos();
      ASSERT_TRUE(kv.append(n, p0));
      std::vector<int32_t> pos(static_cast<size_t>(n));
      std::iota(pos.begin(), pos.end(), p0);
      std::vector<float> cs(static_cast<size_t>(n) * kHeadDim);
      kernels::rope_table(pos.data(), n, kHeadDim, mc.rope_theta, 1.0f, cs.data());
      for (int32_t s = 0; s < kv.n_streams(); ++s)
        for (int32_t i = 0; i < n; ++i) {
          const int32_t p = p0 + i;
          std::vector<float> k(kHeadDim), v(kHeadDim, 0.5f);
          const bool planted = p >= 30 && p <= 36;
          for (int32_t e = 0; e < kHeadDim; ++e)
            k[static_cast<size_t>(e)] = planted ? 2.0f * nd(rng) : dir[static_cast<size_t>(s)][static_cast<size_t>(e)] + 0.15f * nd(rng);
          kernels::rope_apply(k.data(), cs.data() + static_cast<size_t>(i) * kHeadDim, kHeadDim, mc.rope_neox);
          const int32_t slot = kv.n_slots(s) - n + i;
          std::memcpy(kv.k_slot(s, slot), k.data(), sizeof(float) * kHeadDim);
          std::memcpy(kv.v_slot(s, slot), v.data(), sizeof(float) * kHeadDim);
        }
    };
    SequenceCompressor comp(make_cfg(PolicyKind::TriSpan, 24, 2, 2), mc, calibrated ? &qs : nullptr, 0);
    append(60);
    for (int round = 0; round < 4; ++round) {
      comp.compress(kv);
      for (int32_t s = 0; s < kv.n_streams(); ++s) {
        std::vector<int32_t> pos;
        for (int32_t j = 0; j < kv.n_slots(s); ++j) pos.push_back(kv.position(s, j));
        EXPECT_EQ(kv.n_slots(s), 24);
        for (int32_t p = 28; p <= 38; ++p)
          EXPECT_TRUE(std::binary_search(pos.begin(), pos.end(), p))
              << "calibrated " << calibrated << " round " << round << " stream " << s << ": position " << p << " evicted";
      }
      append(20);
    }
  }
}

TEST(CompressTriSpan, NeedsCalibrationOnlyOptionallyAndIsTheDefaultForABudget) {
  const ModelConfig mc = tiny_model(true);
  EXPECT_EQ(parse_policy("trispan"), PolicyKind::TriSpan);
  EXPECT_STREQ(policy_name(PolicyKind::TriSpan), "trispan");
  EXPECT_TRUE(policy_needs_calibration(PolicyKind::TriSpan));     // --kv-calib is loaded for it
  EXPECT_FALSE(policy_requires_calibration(PolicyKind::TriSpan)); // ... and it runs without
  EXPECT_TRUE(policy_requires_calibration(PolicyKind::TriAttention));
  EXPECT_NO_THROW(make_cfg(PolicyKind::TriSpan, 32, 4, -1).validate(mc, nullptr));
  EXPECT_EQ(make_cfg(PolicyKind::TriSpan, 32, 4, -1).effective_window(), 2);  // the score-free default, budget / 16
  EXPECT_EQ(kDefaultPolicy, PolicyKind::TriSpan);
  EXPECT_EQ(resolve_policy("", 512), PolicyKind::TriSpan);
  EXPECT_EQ(resolve_policy("", 0), PolicyKind::Full);
  EXPECT_EQ(resolve_policy("knorm", 512), PolicyKind::KNorm);
  EXPECT_EQ(resolve_policy("full", 512), PolicyKind::Full);
  EXPECT_THROW(resolve_policy("bogus", 512), std::invalid_argument);
}

TEST(CompressTriSpan, OtherSplitsKeepEachStreamsBudget) {
  // Pyramid and Ada give streams different budgets, so their positions diverge: each group of streams
  // with equal positions is scored on its own, and every stream still ends at its budget.
  const ModelConfig mc = tiny_model(false, 3, 4, 2);
  for (BudgetSplit split : {BudgetSplit::Pyramid, BudgetSplit::Ada}) {
    kv::PagePool pool(pool_config());
    Seq seq(pool, mc, 5);
    CompressConfig cfg = make_cfg(PolicyKind::TriSpan, 30, 2, 2);
    cfg.split = split;
    SequenceCompressor comp(cfg, mc, nullptr, 0);
    for (int round = 0; round < 3; ++round) {
      ASSERT_TRUE(seq.append(50));
      Snapshot sn = snapshot(seq);
      compress_and_check(comp, seq, sn);
      int64_t total = 0;
      for (int32_t s = 0; s < seq.kv().n_streams(); ++s) total += seq.kv().n_slots(s);
      EXPECT_EQ(total, static_cast<int64_t>(seq.kv().n_streams()) * 30) << split_name(split);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Real data: the committed testbed model (models/testbed.gguf) prefilling a pointer-chasing prompt in the
// harness's format (docs/quality.md §2) with compression between chunks, as the engine does.
namespace {

struct Prefilled {
  std::vector<int32_t> tokens;
  std::vector<std::vector<int32_t>> kept;  // positions per stream after the last event
  std::string answer;                      // greedy continuation
};

Prefilled prefill_and_answer(const Model& model, const std::string& prompt, const CompressConfig& cfg, int32_t answer_tokens) {
  const ModelConfig& c = model.config();
  ThreadPool tp(2);
  kv::PoolConfig pc;
  pc.page_size = 16;
  pc.head_dim = c.head_dim;
  pc.kv_type = DType::F32;
  pc.max_pages = static_cast<int64_t>(c.n_layer) * c.n_head_kv * (c.n_ctx / 16 + 4);
  kv::PagePool pool(pc);
  kv::SequenceKv kv(pool, c.n_layer, c.n_head_kv);
  Forward fwd(model, tp, 256);
  Prefilled r;
  r.tokens = model.tokenizer().encode(prompt, model.tokenizer().bos() >= 0);
  SequenceCompressor comp(cfg, c, nullptr, static_cast<int32_t>(r.tokens.size()), &tp);
  std::vector<float> logits(static_cast<size_t>(c.n_vocab));
  size_t done = 0;
  while (done < r.tokens.size()) {
    int32_t n = std::min<int32_t>(256, static_cast<int32_t>(r.tokens.size() - done));
    if (cfg.enabled()) n = std::max(1, std::min(n, comp.tokens_until_trigger(kv)));
    BatchItem item;
    item.kv = &kv;
    item.tokens = std::span<const int32_t>(r.tokens.data() + done, static_cast<size_t>(n));
    item.logits = logits.data();
    comp.prepare(kv, item);
    EXPECT_TRUE(fwd.run(std::span<BatchItem>(&item, 1), &comp));
    done += static_cast<size_t>(n);
    comp.after_forward(kv, done == r.tokens.size());
  }
  for (int32_t s = 0; s < kv.n_streams(); ++s) {
    r.kept.emplace_back();
    for (int32_t j = 0; j < kv.n_slots(s); ++j) r.kept.back().push_back(kv.position(s, j));
  }
  for (int32_t i = 0; i < answer_tokens; ++i) {
    const int32_t next = static_cast<int32_t>(kernels::argmax(logits.data(), c.n_vocab));
    r.answer += model.tokenizer().piece(next);
    BatchItem item;
    item.kv = &kv;
    item.tokens = std::span<const int32_t>(&next, 1);
    item.logits = logits.data();
    comp.prepare(kv, item);
    EXPECT_TRUE(fwd.run(std::span<BatchItem>(&item, 1), &comp));
    comp.after_forward(kv, true);
  }
  return r;
}

}  // namespace

TEST(CompressTriSpan, TestbedModelKeepsEveryLinkLineAtTenPercent) {
#ifdef KVPACK_DEBUG_CHECKS
  GTEST_SKIP() << "a 2048-token prefill per policy: checked in the optimised build";
#endif
  const std::string path = std::string(KVPACK_SOURCE_DIR) + "/models/testbed.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not present";
  const std::unique_ptr<Model> model = Model::load(path);
  // The pointer task's format (docs/quality.md §2) with a hand-written deterministic filler: 16 links,
  // the queried chain ABQX -> ... of 4 hops among three distractor chains, in scrambled order.
  const char* links[16][2] = {{"ABQX", "MUVO"}, {"KDEW", "PLRT"}, {"MUVO", "ZENH"}, {"YTRC", "GOWL"}, {"ZENH", "CIFS"},
                              {"PLRT", "XVBA"}, {"GOWL", "NRKE"}, {"CIFS", "HYDU"}, {"XVBA", "QMJO"}, {"NRKE", "SWAT"},
                              {"FOLI", "BEKY"}, {"BEKY", "UQZD"}, {"UQZD", "RVNM"}, {"RVNM", "JTGP"}, {"QMJO", "WEZI"},
                              {"SWAT", "DAHC"}};
  const char* who[] = {"The busy mother", "A small dog", "My neighbour", "The old farmer", "A tired painter", "Her brother"};
  const char* did[] = {"talked about", "walked to", "cleaned", "visited", "painted", "played near"};
  const char* what[] = {"the dusty road", "the warm kitchen", "the little boat", "the tall tower", "the big tree", "the green field"};
  const char* when[] = {"with a smile", "in the evening", "at night", "on the weekend", "once again", "in the summer"};
  std::string prompt = "Links in this text are written A -> B.\n";
  uint32_t x = 7;
  auto pick = [&](int m) { x = x * 1103515245u + 12345u; return static_cast<int>((x >> 16) % static_cast<uint32_t>(m)); };
  const int32_t kLines = 150;  // about 1950 tokens with the links
  for (int32_t i = 0, l = 0; i < kLines; ++i) {
    if (l < 16 && i == 5 + l * 9) {
      prompt += std::string(links[l][0]) + " -> " + links[l][1] + "\n";
      ++l;
    }
    prompt += std::string(who[pick(6)]) + " " + did[pick(6)] + " " + what[pick(6)] + " " + when[pick(6)] + ".\n";
  }
  prompt += "Question: Start at ABQX and follow 4 links.\nAnswer: ABQX ->";
  const std::string answer = " MUVO -> ZENH -> CIFS -> HYDU";

  const ModelConfig& c = model->config();
  const int32_t budget = c.n_ctx / 10;
  CompressConfig span = make_cfg(PolicyKind::TriSpan, budget, 4, -1, 128);
  CompressConfig window = make_cfg(PolicyKind::Streaming, budget, 4, -1, 128);
  const Prefilled full = prefill_and_answer(*model, prompt, CompressConfig{}, 20);
  ASSERT_GT(full.tokens.size(), 1800u);
  ASSERT_LT(full.tokens.size(), 2040u);
  ASSERT_EQ(full.answer.substr(0, answer.size()), answer) << "full KV must answer (else the prompt is not the task's format)";
  const Prefilled a = prefill_and_answer(*model, prompt, span, 20), b = prefill_and_answer(*model, prompt, span, 20);
  const Prefilled w = prefill_and_answer(*model, prompt, window, 20);
  EXPECT_EQ(a.kept, b.kept);  // deterministic
  EXPECT_EQ(a.answer, b.answer);
  // Token positions of every link line (its tokens up to the newline).
  std::vector<std::vector<int32_t>> line_pos;
  {
    std::string text;
    std::vector<int32_t> cur;
    for (size_t p = 0; p < a.tokens.size(); ++p) {
      const std::string t = model->tokenizer().piece(a.tokens[p]);
      if (t.find('\n') == std::string::npos) {
        text += t;
        cur.push_back(static_cast<int32_t>(p));
        continue;
      }
      if (text.find(" -> ") != std::string::npos && text.find("Question") == std::string::npos && text.find("written") == std::string::npos)
        line_pos.push_back(cur);
      text.clear();
      cur.clear();
    }
  }
  ASSERT_EQ(line_pos.size(), 16u);
  int whole_span = 0, whole_window = 0;
  for (const auto& l : line_pos) {
    auto kept_all = [&](const Prefilled& r) {
      for (const auto& k : r.kept)
        for (int32_t p : l)
          if (!std::binary_search(k.begin(), k.end(), p)) return false;
      return true;
    };
    whole_span += kept_all(a) ? 1 : 0;
    whole_window += kept_all(w) ? 1 : 0;
  }
  for (const auto& k : a.kept) EXPECT_EQ(k, a.kept[0]);  // one keep set for every stream
  EXPECT_LE(a.kept[0].size(), static_cast<size_t>(budget) + 16);
  EXPECT_EQ(whole_span, 16) << "link lines kept whole by trispan";
  EXPECT_LE(whole_window, 1) << "a recent window keeps at most the last link";
  EXPECT_EQ(a.answer.substr(0, answer.size()), answer) << "trispan at 10 % answers like full KV";
}
