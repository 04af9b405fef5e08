// matmul() for the super-block kinds (Q4_K, Q6_K, Q5_K, Q3_K, Q2_K, IQ4_XS on the one-scale-per-256
// activation format) and the 32-block kinds Q5_0, Q5_1, IQ4_NL: every ISA path this CPU runs against a
// float64 reference over odd shapes (rows not a multiple of any tile, one to 17 super-blocks, 1..13
// tokens), the activation quantiser bit-identical across paths, and SIMD paths against the scalar path.
// Batch and thread-count invariance of these kinds: kernels_matmul_batch_invariance_test.cpp.
#include <gtest/gtest.h>

#include "util/half.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/matmul.h"
#include "kernels/matmul_internal.h"
#include "util/quant_codecs.h"

namespace kvpack::kernels {
namespace {

constexpr double kU = 1.0 / (1 << 24);
const Isa kIsas[] = {Isa::Scalar, Isa::Avx2, Isa::Avx512};
constexpr DType kTypes[] = {DType::Q4_K, DType::Q6_K, DType::Q5_K, DType::Q3_K, DType::Q2_K,
                            DType::IQ4_XS, DType::Q5_0, DType::Q5_1, DType::IQ4_NL};

bool superblock(DType t) { return traits(t).block_elems == 256; }

struct Weights {
  std::vector<uint8_t> bytes;
  std::vector<float> deq;
};
Weights make_weights(DType t, int64_t n_out, int64_t n_in, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), e(-3.0f, 3.0f), skew(-0.3f, 1.0f);
  const size_t rb = row_bytes(t, n_in);
  Weights w{std::vector<uint8_t>(rb * n_out), std::vector<float>(n_out * n_in)};
  std::vector<float> row(n_in);
  for (int64_t o = 0; o < n_out; ++o) {
    const float scale = std::exp2(e(rng));
    for (auto& v : row) v = (o % 3 == 2 ? skew(rng) : u(rng)) * scale;  // some rows one-sided (mins)
    quantize_row(row.data(), t, n_in, w.bytes.data() + o * rb);
    dequantize_row(w.bytes.data() + o * rb, t, n_in, w.deq.data() + o * n_in);
  }
  return w;
}

std::vector<float> make_acts(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 63);
  std::vector<float> x(n);
  for (auto& v : x) v = g(rng) * (pick(rng) == 0 ? 20.0f : 1.0f);
  return x;
}

// The activation quantisation of matmul.h: int8 blocks of `blk` elements, d = amax / 127 (f16-rounded for
// 32-element blocks, as ggml's block_q8_0 stores it), round to even with the exact 127 / amax.
void quantize_acts(const float* x, int64_t n, int64_t blk, std::vector<int>& q, std::vector<float>& d) {
  q.resize(n);
  d.resize(n / blk);
  for (int64_t b = 0; b < n / blk; ++b) {
    float amax = 0;
    for (int64_t i = 0; i < blk; ++i) amax = std::max(amax, std::fabs(x[b * blk + i]));
    d[b] = blk == 32 ? kvpack::fp16_to_f32(kvpack::f32_to_fp16(amax / 127.0f)) : amax / 127.0f;
    const float id = amax != 0 ? 127.0f / amax : 0.0f;
    for (int64_t i = 0; i < blk; ++i) q[b * blk + i] = static_cast<int>(std::nearbyint(x[b * blk + i] * id));
  }
}

// Tolerances (u = 2^-24). Against ref_q (dequantised weights x the quantised activations the kernel
// multiplies): the kernel's integer sums are exact, so only f32 rounding of the per-block / per-super-block
// products and the accumulation remain, bounded by (4 sqrt(n_in) + 8) u times the magnitudes it rounds:
//   super-block kinds: sum_sb |dx| (|dA| sum_j |sc_j| sum_i |q_i xq_i| + |dB| sum_j |mn_j bsum_j|)
//   32-block kinds:    sum_b |d dx| (sum_i |q_i xq_i| + 128 sum_i |xq_i|) + |m| dx |sum xq|
// plus sum |w xq dx| for the reference's own f32-rounded weights. Against ref (f32 activations): plus the
// activation rounding, at most dx (1/2 + 1e-4) per element.
void check(Isa isa, DType t, int64_t n_out, int64_t n_in, int64_t n_tok, std::mt19937& rng,
           std::vector<float>* y_out = nullptr) {
  const Weights w = make_weights(t, n_out, n_in, rng);
  const std::vector<float> x = make_acts(n_tok * n_in, rng);
  std::vector<float> y(n_tok * n_out + 1, -1234.5f);
  matmul_with_isa(isa, w.bytes.data(), t, n_out, n_in, x.data(), n_tok, y.data(), nullptr);
  ASSERT_EQ(y.back(), -1234.5f) << "write past y";
  const int64_t ablk = superblock(t) ? 256 : 32;
  const size_t rb = row_bytes(t, n_in), bb = traits(t).block_bytes;
  const std::string where = std::string(isa_name(isa)) + " " + std::string(dtype_name(t)) + " n_out=" +
                            std::to_string(n_out) + " n_in=" + std::to_string(n_in) + " n_tok=" + std::to_string(n_tok);
  std::vector<int> xq;
  std::vector<float> dx;
  int failures = 0;
  for (int64_t tk = 0; tk < n_tok && failures < 5; ++tk) {
    const float* xt = x.data() + tk * n_in;
    quantize_acts(xt, n_in, ablk, xq, dx);
    for (int64_t o = 0; o < n_out && failures < 5; ++o) {
      const float* wr = w.deq.data() + o * n_in;
      const uint8_t* row = w.bytes.data() + o * rb;
      double ref = 0, ref_q = 0, mag = 0, qbound = 0;
      for (int64_t i = 0; i < n_in; ++i) {
        const double xd = xq[i] * static_cast<double>(dx[i / ablk]);
        ref += static_cast<double>(wr[i]) * xt[i];
        ref_q += static_cast<double>(wr[i]) * xd;
        mag += std::fabs(wr[i] * xd);
        qbound += dx[i / ablk] * (0.5 + 1e-4) * std::fabs(wr[i]);
      }
      if (superblock(t)) {
        KBlockInts k;
        for (int64_t sb = 0; sb < n_in / 256; ++sb) {
          decode_k_block(t, row + sb * bb, &k);
          double a = 0, b = 0;
          for (int j = 0; j < 16; ++j) {
            double s = 0;
            int bs = 0;
            for (int i = 0; i < 16; ++i) {
              s += std::abs(k.q[16 * j + i] * xq[sb * 256 + 16 * j + i]);
              bs += xq[sb * 256 + 16 * j + i];
            }
            a += std::abs(k.sc[j]) * s;
            b += std::abs(k.mn[j] * bs);
          }
          mag += std::fabs(dx[sb]) * (std::fabs(k.dA) * a + std::fabs(k.dB) * b);
        }
      } else {
        B32Ints k;
        for (int64_t b = 0; b < n_in / 32; ++b) {
          decode_b32_block(t, row + b * bb, &k);
          double s = 0, sq = 0;
          int sum = 0;
          for (int i = 0; i < 32; ++i) {
            s += std::abs(k.q[i] * xq[b * 32 + i]);
            sq += std::abs(xq[b * 32 + i]);
            sum += xq[b * 32 + i];
          }
          mag += std::fabs(k.d * dx[b]) * (s + 128 * sq) + std::fabs(k.m * dx[b] * sum);
        }
      }
      const double tol_q = (4 * std::sqrt(static_cast<double>(n_in)) + 8) * kU * mag + 1e-30;
      const double got = y[tk * n_out + o];
      if (!(std::fabs(got - ref_q) <= tol_q && std::fabs(got - ref) <= tol_q + qbound)) {
        ++failures;
        ADD_FAILURE() << where << " t=" << tk << " o=" << o << ": got " << got << " ref_q " << ref_q << " (tol "
                      << tol_q << ") ref " << ref << " (tol " << tol_q + qbound << ")";
      }
    }
  }
  if (y_out) *y_out = std::vector<float>(y.begin(), y.end() - 1);
}

class KQuantMatmul : public ::testing::TestWithParam<std::tuple<Isa, DType>> {
 protected:
  void SetUp() override {
    if (!cpu_supports(std::get<0>(GetParam()))) GTEST_SKIP() << isa_name(std::get<0>(GetParam())) << " not supported";
  }
};

TEST_P(KQuantMatmul, OddShapesVsDoubleReference) {
  const auto [isa, t] = GetParam();
  std::mt19937 rng(3);
  const std::vector<int64_t> n_ins = superblock(t) ? std::vector<int64_t>{256, 768, 17 * 256}
                                                   : std::vector<int64_t>{32, 96, 288, 4128};
  for (int64_t n_in : n_ins)
    for (int64_t n_out : {1, 3, 17, 67})
      for (int64_t n_tok : {1, 2, 3, 4, 5, 8, 9, 13}) {
        if (n_in > 1024 && n_tok > 3 && n_out > 17) continue;  // keeps the scalar path's run short
        check(isa, t, n_out, n_in, n_tok, rng);
      }
}

// Each SIMD path against the scalar path on the same data: both are within their tolerance of the
// reference (above); here the difference itself, which is f32 rounding only (no algorithmic slack).
TEST_P(KQuantMatmul, SimdAgreesWithScalar) {
  const auto [isa, t] = GetParam();
  if (isa == Isa::Scalar) GTEST_SKIP() << "the reference path";
  for (auto [n_out, n_in, n_tok] : {std::tuple<int64_t, int64_t, int64_t>{67, 768, 1}, {5, 2560, 7}, {33, 512, 13}}) {
    if (!superblock(t)) n_in += 32;  // odd number of 32-blocks
    std::mt19937 r1(9), r2(9);
    std::vector<float> ys, yv;
    check(Isa::Scalar, t, n_out, n_in, n_tok, r1, &ys);
    check(isa, t, n_out, n_in, n_tok, r2, &yv);
    double worst = 0, scale = 0;
    for (size_t i = 0; i < ys.size(); ++i) {
      worst = std::max(worst, std::fabs(static_cast<double>(ys[i]) - yv[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(ys[i])));
    }
    // Same integers, different f32 summation: a few hundred units of roundoff of the largest output at most.
    EXPECT_LE(worst, 1e-4 * scale) << dtype_name(t) << " n_in=" << n_in;
  }
}

INSTANTIATE_TEST_SUITE_P(AllPaths, KQuantMatmul, ::testing::Combine(::testing::ValuesIn(kIsas), ::testing::ValuesIn(kTypes)),
                         [](const ::testing::TestParamInfo<KQuantMatmul::ParamType>& info) {
                           return std::string(isa_name(std::get<0>(info.param))) + "_" +
                                  std::string(dtype_name(std::get<1>(info.param)));
                         });

TEST(KQuantMatmul, ActivationQuantBitIdenticalAcrossIsas) {
  std::mt19937 rng(5);
  for (int64_t n_in : {256, 512, 4096}) {
    std::vector<float> x = make_acts(n_in, rng);
    for (int i = 256; i < 512 && i < n_in; ++i) x[i] = 0.0f;  // an all-zero super-block (d = 0)
    const detail::ActLayoutK L = detail::act_layout_k(n_in);
    std::vector<uint8_t> ref(L.stride + 64), got(L.stride + 64);
    auto aligned = [](std::vector<uint8_t>& v) {
      return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(v.data()) + 63) & ~uintptr_t{63});
    };
    detail::quant_act_k_scalar(x.data(), n_in, L, aligned(ref));
    std::vector<int> q;
    std::vector<float> d;
    quantize_acts(x.data(), n_in, 256, q, d);
    const auto* rq = reinterpret_cast<const int8_t*>(aligned(ref) + L.qs_off);
    const auto* rb = reinterpret_cast<const int16_t*>(aligned(ref) + L.bsum_off);
    const auto* rd = reinterpret_cast<const float*>(aligned(ref) + L.d_off);
    for (int64_t i = 0; i < n_in; ++i) ASSERT_EQ(rq[i], q[i]) << i;
    for (int64_t g = 0; g < n_in / 16; ++g) {
      int s = 0;
      for (int i = 0; i < 16; ++i) s += q[16 * g + i];
      ASSERT_EQ(rb[g], s) << g;
    }
    for (int64_t sb = 0; sb < n_in / 256; ++sb) ASSERT_EQ(rd[sb], d[sb]) << sb;
    for (Isa isa : {Isa::Avx2, Isa::Avx512}) {
      if (!cpu_supports(isa)) continue;
      std::fill(got.begin(), got.end(), 0);
      (isa == Isa::Avx2 ? detail::quant_act_k_avx2 : detail::quant_act_k_avx512)(x.data(), n_in, L, aligned(got));
      EXPECT_EQ(0, std::memcmp(aligned(ref), aligned(got), L.stride)) << isa_name(isa) << " n_in=" << n_in;
    }
  }
}

TEST(KQuantMatmul, RejectsPartialSuperBlocks) {
  std::vector<uint8_t> w(4096);
  std::vector<float> x(512), y(4);
  for (DType t : {DType::Q6_K, DType::Q2_K, DType::IQ4_XS})
    EXPECT_THROW(matmul(w.data(), t, 1, 288, x.data(), 1, y.data(), nullptr), std::invalid_argument) << dtype_name(t);
  EXPECT_THROW(matmul(w.data(), DType::Q5_0, 1, 48, x.data(), 1, y.data(), nullptr), std::invalid_argument);
}

}  // namespace
}  // namespace kvpack::kernels
