// Tests for the quantize/dequantize row conversions of kernels/quant.h: round-trip error bounds of every
// type, Q4_K quality, the exact block layouts (Q8_0, Q4_0, Q4_K with its packed 6-bit scales) and the
// f16 / bf16 conversions. Split from kernels_matmul_test.cpp, which tests the matmul paths.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels_test_util.h"
#include "util/half.h"

namespace kvpack::kernels {
namespace {

using test::kAllTypes;
using test::q4k_scale_min;

TEST(QuantizeRow, RoundTripBounds) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), e(-10.0f, 10.0f);
  const int64_t n = 32 * 40;
  std::vector<float> x(n), back(n);
  for (int64_t i = 0; i < n; ++i) x[i] = u(rng) * std::exp2(e(rng));
  x[5] = 0.0f;
  for (int i = 64; i < 96; ++i) x[i] = 0.0f;  // an all-zero block
  for (DType t : kAllTypes) {
    std::vector<uint8_t> buf(row_bytes(t, n));
    quantize_row(x.data(), t, n, buf.data());
    dequantize_row(buf.data(), t, n, back.data());
    for (int64_t b = 0; b < n / 32; ++b) {
      float amax = 0.0f;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
      // Q4_K: the widest sub-block range (max - min(0, min), as the format only shifts down) of the
      // super-block; one full step of it bounds every element's error (the least-squares search may clip
      // a sub-block's extremes by a fraction of a step, and 6-bit scales are relative to the largest).
      double range_sb = 0;
      for (int64_t j = b / 8 * 8; j < b / 8 * 8 + 8; ++j) {
        float lo = 0.0f, hi = x[j * 32];
        for (int i = 0; i < 32; ++i) {
          lo = std::min(lo, x[j * 32 + i]);
          hi = std::max(hi, x[j * 32 + i]);
        }
        range_sb = std::max(range_sb, static_cast<double>(hi) - lo);
      }
      for (int i = 0; i < 32; ++i) {
        const int64_t k = b * 32 + i;
        const double err = std::fabs(static_cast<double>(back[k]) - x[k]);
        double bound = 0;
        switch (t) {
          case DType::F32: bound = 0; break;
          case DType::F16: bound = std::ldexp(std::fabs(x[k]), -11) + std::ldexp(1.0, -25); break;  // half ulp; subnormal step
          case DType::BF16: bound = std::ldexp(std::fabs(x[k]), -8); break;  // 8-bit significand, half ulp
          // d = amax/127: half a step, plus the fp16 rounding of d (2^-11 relative) times |q| <= 127.
          case DType::Q8_0: bound = amax / 127.0 * (0.5 + 127 * std::ldexp(1.0, -11)) * (1 + 1e-5); break;
          // |d| = amax/8: a full step on the side that clamps to nibble 15, plus fp16 rounding of d
          // times |q - 8| <= 8.
          case DType::Q4_0: bound = amax / 8.0 * (1.0 + 8 * std::ldexp(1.0, -11)) * (1 + 1e-5); break;
          // Measured worst 0.71 of this (0.78 on uniform [-0.5, 1.5) data) for the search quantiser.
          case DType::Q4_K: bound = range_sb / 15.0; break;
          default: break;
        }
        ASSERT_LE(err, bound) << dtype_name(t) << " k=" << k << " x=" << x[k] << " back=" << back[k];
      }
    }
  }
}

// Q4_K's quantiser on gaussian data: RMS error relative to RMS value (~0.072 measured; a plain min/max
// 4-bit quantiser of 32-element blocks gives ~0.077), and exact zeros.
TEST(QuantizeRow, Q4_KQuality) {
  std::mt19937 rng(12);
  std::normal_distribution<float> g(0.0f, 1.0f);
  const int64_t n = 256 * 64;
  std::vector<float> x(n), back(n);
  for (auto& v : x) v = g(rng);
  std::vector<uint8_t> buf(row_bytes(DType::Q4_K, n));
  quantize_row(x.data(), DType::Q4_K, n, buf.data());
  dequantize_row(buf.data(), DType::Q4_K, n, back.data());
  double se = 0, sx = 0;
  for (int64_t i = 0; i < n; ++i) {
    se += (static_cast<double>(back[i]) - x[i]) * (back[i] - x[i]);
    sx += static_cast<double>(x[i]) * x[i];
  }
  EXPECT_LT(std::sqrt(se / sx), 0.076);
  // An all-zero super-block encodes d = dmin = 0 and decodes to exact zeros.
  std::vector<float> z(256, 0.0f), zb(256, 1.0f);
  std::vector<uint8_t> zq(144);
  quantize_row(z.data(), DType::Q4_K, 256, zq.data());
  dequantize_row(zq.data(), DType::Q4_K, 256, zb.data());
  for (int i = 0; i < 256; ++i) ASSERT_EQ(zb[i], 0.0f) << i;
}

TEST(QuantizeRow, BlockLayouts) {
  // Q8_0: fp16 d then 32 int8, value = d * q.
  BlockQ8_0 b8{};
  b8.d = f32_to_fp16(0.5f);
  for (int i = 0; i < 32; ++i) b8.qs[i] = static_cast<int8_t>(i - 16);
  float out[32];
  dequantize_row(&b8, DType::Q8_0, 32, out);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out[i], 0.5f * (i - 16));
  // Q4_0: low nibble of qs[j] is element j, high nibble is element j + 16; value = d * (nibble - 8).
  BlockQ4_0 b4{};
  b4.d = f32_to_fp16(2.0f);
  for (int j = 0; j < 16; ++j) b4.qs[j] = static_cast<uint8_t>(j | (15 - j) << 4);
  dequantize_row(&b4, DType::Q4_0, 32, out);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 2.0f * (j - 8));
    EXPECT_EQ(out[j + 16], 2.0f * (15 - j - 8));
  }
  // Re-quantising exactly representable blocks reproduces them.
  BlockQ4_0 r4{};
  quantize_row(out, DType::Q4_0, 32, &r4);
  float again[32];
  dequantize_row(&r4, DType::Q4_0, 32, again);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(again[i], out[i]) << i;
  float v8[32];
  for (int i = 0; i < 32; ++i) v8[i] = static_cast<float>(i % 2 ? 127 - i : -127 + i);
  BlockQ8_0 r8{};
  quantize_row(v8, DType::Q8_0, 32, &r8);
  EXPECT_EQ(fp16_to_f32(r8.d), 1.0f);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(r8.qs[i], static_cast<int8_t>(v8[i]));

  // Q4_K: f16 d, f16 dmin, 12 bytes of packed 6-bit scales/mins (decoded here with ggml's
  // get_scale_min_k4, restated), 128 bytes of nibbles; 64 elements per 32 bytes (low nibbles first).
  static_assert(sizeof(BlockQ4_K) == 144 && offsetof(BlockQ4_K, scales) == 4 && offsetof(BlockQ4_K, qs) == 16);
  EXPECT_EQ(row_bytes(DType::Q4_K, 512), 288u);
  EXPECT_EQ(traits(DType::Q4_K).block_elems, 256u);
  {
    BlockQ4_K bk{};
    bk.d = f32_to_fp16(0.5f);
    bk.dmin = f32_to_fp16(0.25f);
    std::mt19937 rng(4);
    for (auto& b : bk.scales) b = static_cast<uint8_t>(rng());
    for (int i = 0; i < 128; ++i) bk.qs[i] = static_cast<uint8_t>(rng());
    float o[256];
    dequantize_row(&bk, DType::Q4_K, 256, o);
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      q4k_scale_min(bk.scales, j, &sc, &m);
      for (int i = 0; i < 32; ++i) {
        const int k = 32 * j + i;
        const int q = j % 2 == 0 ? bk.qs[32 * (j / 2) + i] & 15 : bk.qs[32 * (j / 2) + i] >> 4;
        ASSERT_EQ(o[k], 0.5f * sc * q - 0.25f * m) << "j=" << j << " i=" << i;
      }
    }
    // Packing round trip over all 6-bit values, against the restated decoder.
    for (int v = 0; v < 64; ++v) {
      uint8_t sc[8], m[8], packed[12], sc2[8], m2[8];
      for (int j = 0; j < 8; ++j) {
        sc[j] = static_cast<uint8_t>((v + 7 * j) % 64);
        m[j] = static_cast<uint8_t>((v * 5 + 3 * j) % 64);
      }
      q4_k_pack_scales(sc, m, packed);
      q4_k_unpack_scales(packed, sc2, m2);
      for (int j = 0; j < 8; ++j) {
        int a, b;
        q4k_scale_min(packed, j, &a, &b);
        ASSERT_EQ(a, sc[j]);
        ASSERT_EQ(b, m[j]);
        ASSERT_EQ(sc2[j], sc[j]);
        ASSERT_EQ(m2[j], m[j]);
      }
    }
    // Re-quantising a dequantised block stays within one step of it.
    BlockQ4_K r{};
    quantize_row(o, DType::Q4_K, 256, &r);
    float again[256];
    dequantize_row(&r, DType::Q4_K, 256, again);
    float lo = 0, hi = o[0];
    for (float v : o) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    for (int i = 0; i < 256; ++i) EXPECT_LE(std::fabs(again[i] - o[i]), (hi - lo) / 15) << i;
  }

  // Errors: quantised types need whole blocks (256 for Q4_K); Q4_1 has no codec.
  std::vector<uint8_t> buf(512);
  EXPECT_THROW(quantize_row(v8, DType::Q8_0, 31, buf.data()), std::invalid_argument);
  EXPECT_THROW(dequantize_row(buf.data(), DType::Q4_0, 48, out), std::invalid_argument);
  EXPECT_THROW(quantize_row(v8, DType::Q4_1, 256, buf.data()), std::invalid_argument);
  EXPECT_THROW(dequantize_row(buf.data(), DType::Q4_K, 128, out), std::invalid_argument);
}

TEST(QuantizeRow, HalfConversionsMatchScalarHelpers) {
  const float vals[] = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 1e-7f, 3.14159f, -1e30f};
  uint16_t h[8], bf[8];
  float back[8];
  quantize_row(vals, DType::F16, 8, h);
  quantize_row(vals, DType::BF16, 8, bf);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(h[i], f32_to_fp16(vals[i]));
    EXPECT_EQ(bf[i], f32_to_bf16(vals[i]));
  }
  dequantize_row(h, DType::F16, 8, back);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(f32_to_bits(back[i]), f32_to_bits(fp16_to_f32(h[i])));
}

}  // namespace
}  // namespace kvpack::kernels
