// Directed f32 -> f16 rounding (util/half.h f32_to_fp16_floor / _ceil), which recall's key digests rely on
// to stay bounds: floor(x) <= x <= ceil(x) as halves, equal exactly when x is a half, otherwise adjacent
// halves; across zero, at the subnormal end and beyond the half range.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "util/half.h"

using namespace kvpack;

TEST(HalfDirected, FloorAndCeilBracketEveryValue) {
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, -1.0f, 1e-9f, -1e-9f, 0x1p-24f, -0x1p-24f, 0x1.8p-24f, 0x1p-25f, 6.1e-5f,
                           65504.0f, 65505.0f, 65520.0f, 1e6f, -65504.0f, -65519.0f, -1e6f, 3.14159265f, -2.718281828f};
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int i = 0; i < 20000; ++i) xs.push_back(nd(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 25));
  for (float x : xs) {
    const uint16_t lo = f32_to_fp16_floor(x), hi = f32_to_fp16_ceil(x);
    const float flo = fp16_to_f32(lo), fhi = fp16_to_f32(hi);
    ASSERT_LE(flo, x) << x;
    ASSERT_GE(fhi, x) << x;
    if (flo == x) {
      ASSERT_EQ(fhi, x) << x;
    } else {
      ASSERT_EQ(fp16_step_up(lo), hi) << x << ": floor and ceil are not adjacent halves";
      ASSERT_EQ(fp16_step_down(hi), lo) << x;
    }
    if (std::fabs(x) <= 65504.0f) {  // inside the range both are finite and the nearest one is one of them
      ASSERT_TRUE(std::isfinite(flo) && std::isfinite(fhi)) << x;
      const uint16_t near = f32_to_fp16(x);
      ASSERT_TRUE(near == lo || near == hi || fp16_to_f32(near) == x) << x;
    }
  }
  EXPECT_EQ(f32_to_fp16_floor(1e6f), 0x7bffu);   // 65504: the largest half below
  EXPECT_EQ(f32_to_fp16_ceil(1e6f), 0x7c00u);    // +inf
  EXPECT_EQ(f32_to_fp16_floor(-1e6f), 0xfc00u);  // -inf
  EXPECT_EQ(f32_to_fp16_ceil(-1e6f), 0xfbffu);   // -65504
  EXPECT_EQ(f32_to_fp16_floor(1e-9f), 0x0000u);
  EXPECT_EQ(f32_to_fp16_ceil(1e-9f), 0x0001u);
  EXPECT_EQ(f32_to_fp16_floor(-1e-9f), 0x8001u);
  EXPECT_EQ(f32_to_fp16_ceil(-1e-9f), 0x8000u);
}
