// Codecs of Q6_K, Q5_K, Q3_K, Q2_K, IQ4_XS, Q5_0, Q5_1, IQ4_NL (util/quant_codecs.h) through
// kernels::quantize_row / dequantize_row: byte layouts against ggml's dequantisers restated in kquant_ref.h,
// round-trip error against float64 with the bounds util/quant_codecs.h derives from each format's step,
// quality ordering by bits per weight, and errors for partial blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kquant_ref.h"
#include "util/half.h"

namespace kvpack::kernels {
namespace {

constexpr DType kNewTypes[] = {DType::Q6_K, DType::Q5_K, DType::Q3_K, DType::Q2_K,
                               DType::IQ4_XS, DType::Q5_0, DType::Q5_1, DType::IQ4_NL};

uint32_t block_of(DType t) { return traits(t).block_elems; }

void set_half(uint8_t* p, float v) {
  const uint16_t h = f32_to_fp16(v);
  std::memcpy(p, &h, 2);
}

// Random bytes with finite f16 scales where each format keeps them.
std::vector<uint8_t> random_block(DType t, std::mt19937& rng) {
  std::vector<uint8_t> b(traits(t).block_bytes);
  for (auto& v : b) v = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  switch (t) {
    case DType::Q6_K: set_half(b.data() + 208, u(rng)); break;
    case DType::Q3_K: set_half(b.data() + 108, u(rng)); break;
    case DType::Q2_K: set_half(b.data() + 80, u(rng)); set_half(b.data() + 82, u(rng)); break;
    case DType::Q5_K: set_half(b.data(), u(rng)); set_half(b.data() + 2, u(rng)); break;
    case DType::Q5_1: set_half(b.data(), u(rng)); set_half(b.data() + 2, u(rng)); break;
    default: set_half(b.data(), u(rng)); break;  // IQ4_XS, Q5_0, IQ4_NL: d first
  }
  return b;
}

TEST(KQuantCodec, LayoutsMatchGgmlDequantisers) {
  std::mt19937 rng(31);
  for (DType t : kNewTypes) {
    SCOPED_TRACE(dtype_name(t));
    const uint32_t n = block_of(t);
    for (int rep = 0; rep < 50; ++rep) {
      const std::vector<uint8_t> b = random_block(t, rng);
      std::vector<float> got(n), want(n);
      dequantize_row(b.data(), t, n, got.data());
      test::ref_decode(t, b.data(), want.data());
      for (uint32_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i]) << "rep " << rep << " i " << i;
      // Re-encoding what a block decodes to must not move any value by more than the round-trip bound
      // below allows (checked there); here: the encoder writes every byte of the block deterministically.
      std::vector<uint8_t> r1(b.size(), 0x00), r2(b.size(), 0xff);
      quantize_row(got.data(), t, n, r1.data());
      quantize_row(got.data(), t, n, r2.data());
      ASSERT_EQ(r1, r2) << "encoder leaves bytes unwritten";
    }
  }
}

// Per-element bound of util/quant_codecs.h for element k of x, given the encoded row.
double bound(DType t, const float* x, const uint8_t* row, int64_t k) {
  const uint32_t B = block_of(t);
  const int64_t blk = k / B;
  const uint8_t* b = row + blk * traits(t).block_bytes;
  const float* xb = x + blk * B;
  auto amax_range = [&](int64_t lo, int64_t n, double* amax, double* range) {
    double a = 0, mn = 0, mx = xb[lo];
    for (int64_t i = lo; i < lo + n; ++i) {
      a = std::max(a, static_cast<double>(std::fabs(xb[i])));
      mn = std::min(mn, static_cast<double>(xb[i]));
      mx = std::max(mx, static_cast<double>(xb[i]));
    }
    *amax = a;
    *range = mx - mn;  // min clipped at 0: the formats' offsets only shift down
  };
  const int64_t i = k % B;
  double amax, range, widest = 0;
  const double slack = 1 + 1e-6;  // f32 rounding of the decoded products
  switch (t) {
    case DType::Q6_K:
    case DType::Q3_K: {
      const int qmax = t == DType::Q6_K ? 31 : 3;
      const float d = test::ref_half(b + (t == DType::Q6_K ? 208 : 108));
      amax_range(i / 16 * 16, 16, &amax, &range);
      return 0.5 * (amax / qmax + d) * slack;
    }
    case DType::Q5_K:
    case DType::Q2_K: {
      const int sub = t == DType::Q5_K ? 32 : 16, qmax = t == DType::Q5_K ? 31 : 3;
      for (int j = 0; j < 256 / sub; ++j) {
        amax_range(j * sub, sub, &amax, &range);
        widest = std::max(widest, range);
      }
      return widest / qmax * slack;
    }
    case DType::IQ4_XS: {
      amax_range(i / 32 * 32, 32, &amax, &range);
      return 14 * (amax / 127 + test::ref_half(b)) * slack;
    }
    case DType::IQ4_NL: amax_range(0, 32, &amax, &range); return 14 * amax / 127 * (1 + std::ldexp(1.0, -10));
    case DType::Q5_0: amax_range(0, 32, &amax, &range); return amax / 16 * (1 + 16 * std::ldexp(1.0, -11)) * slack;
    case DType::Q5_1: {
      double lo = xb[0], hi = xb[0];
      for (int j = 0; j < 32; ++j) {
        lo = std::min(lo, static_cast<double>(xb[j]));
        hi = std::max(hi, static_cast<double>(xb[j]));
      }
      return (0.5 * test::ref_half(b) + std::ldexp(1.0, -10) * (std::fabs(lo) + hi - lo)) * slack;
    }
    default: return 0;
  }
}

TEST(KQuantCodec, RoundTripWithinFormatStep) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), e(-10.0f, 10.0f), shift(-0.5f, 1.5f);
  const int64_t n = 256 * 24;
  for (DType t : kNewTypes) {
    SCOPED_TRACE(dtype_name(t));
    for (int pass = 0; pass < 3; ++pass) {
      std::vector<float> x(n), back(n);
      // pass 0: magnitudes over 20 binades per element; 1: per-block scale, skewed sign (mins matter);
      // 2: gaussian with zero blocks and an all-zero super-block.
      std::normal_distribution<float> g(0.0f, 1.0f);
      for (int64_t i = 0; i < n; ++i) {
        if (pass == 0) x[i] = u(rng) * std::exp2(e(rng));
        if (pass == 1) x[i] = shift(rng) * std::exp2(static_cast<float>(i / 256 % 8) - 4.0f);
        if (pass == 2) x[i] = g(rng);
      }
      if (pass == 2) {
        std::fill(x.begin() + 64, x.begin() + 96, 0.0f);
        std::fill(x.begin() + 512, x.begin() + 768, 0.0f);
      }
      std::vector<uint8_t> buf(row_bytes(t, n));
      quantize_row(x.data(), t, n, buf.data());
      dequantize_row(buf.data(), t, n, back.data());
      double worst = 0;
      for (int64_t k = 0; k < n; ++k) {
        const double err = std::fabs(static_cast<double>(back[k]) - x[k]);
        const double bnd = bound(t, x.data(), buf.data(), k);
        worst = std::max(worst, bnd > 0 ? err / bnd : 0.0);
        ASSERT_LE(err, bnd) << "pass " << pass << " k=" << k << " x=" << x[k] << " back=" << back[k];
        if (pass == 2 && k >= 512 && k < 768) {
          ASSERT_EQ(back[k], 0.0f) << "zero super-block k=" << k;
        }
      }
      std::printf("  %-6s pass %d: worst error / bound %.3f\n", std::string(dtype_name(t)).c_str(), pass, worst);
    }
  }
}

// More bits per weight must mean less error: relative RMS error on gaussian data, ordered
// Q2_K > Q3_K > Q4_K > Q5_K > Q6_K, and the 4.5-bit types (IQ4_NL, IQ4_XS) between Q3_K and Q5_K; Q5_0 /
// Q5_1 between Q4_K and Q6_K. A codec that loses a bit or mixes up elements breaks the order.
TEST(KQuantCodec, ErrorFallsWithBitsPerWeight) {
  std::mt19937 rng(12);
  std::normal_distribution<float> g(0.0f, 1.0f);
  const int64_t n = 256 * 64;
  std::vector<float> x(n), back(n);
  for (auto& v : x) v = g(rng);
  auto rel_rms = [&](DType t) {
    std::vector<uint8_t> buf(row_bytes(t, n));
    quantize_row(x.data(), t, n, buf.data());
    dequantize_row(buf.data(), t, n, back.data());
    double se = 0, sx = 0;
    for (int64_t i = 0; i < n; ++i) {
      se += (static_cast<double>(back[i]) - x[i]) * (back[i] - x[i]);
      sx += static_cast<double>(x[i]) * x[i];
    }
    const double r = std::sqrt(se / sx);
    std::printf("  %-6s %.2f bits/weight: relative RMS error %.4f\n", std::string(dtype_name(t)).c_str(),
                8.0 * traits(t).block_bytes / traits(t).block_elems, r);
    return r;
  };
  const double q2 = rel_rms(DType::Q2_K), q3 = rel_rms(DType::Q3_K), q4 = rel_rms(DType::Q4_K);
  const double q5 = rel_rms(DType::Q5_K), q6 = rel_rms(DType::Q6_K);
  const double nl = rel_rms(DType::IQ4_NL), xs = rel_rms(DType::IQ4_XS);
  const double q50 = rel_rms(DType::Q5_0), q51 = rel_rms(DType::Q5_1);
  EXPECT_GT(q2, q3);
  EXPECT_GT(q3, q4);
  EXPECT_GT(q4, q5);
  EXPECT_GT(q5, q6);
  for (double v : {nl, xs}) {
    EXPECT_LT(v, q3);
    EXPECT_GT(v, q5);
  }
  for (double v : {q50, q51}) {
    EXPECT_LT(v, q4);
    EXPECT_GT(v, q6);
  }
}

TEST(KQuantCodec, PartialBlocksAreErrors) {
  std::vector<float> x(512, 1.0f);
  std::vector<uint8_t> buf(1024);
  for (DType t : kNewTypes) {
    const int64_t bad = block_of(t) == 256 ? 128 : 48;
    EXPECT_THROW(quantize_row(x.data(), t, bad, buf.data()), std::invalid_argument) << dtype_name(t);
    EXPECT_THROW(dequantize_row(buf.data(), t, bad, x.data()), std::invalid_argument) << dtype_name(t);
  }
}

}  // namespace
}  // namespace kvpack::kernels
