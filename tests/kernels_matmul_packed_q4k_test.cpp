// Packed Q4_K matmul (kernels/matmul_packed.h, PackedQ4K):
// - the portable kernel against a float64 reference of the same codes (the Q4_K weights' integer form x the
//   int8 super-block activations matmul() makes), and close to the row-layout Q4_K matmul;
// - the AVX-512 kernel bitwise equal to the portable one on odd shapes (rows not a multiple of 16, one
//   super-block rows, every token tile and its remainders);
// - batch and thread invariance: a token's outputs are the same bits alone, in any batch, on 1 or 2 threads;
// - packing: the layout of one known block, padding rows, shape errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/matmul.h"
#include "kernels/matmul_packed.h"
#include "kernels/quant.h"
#include "util/dtype.h"
#include "util/half.h"
#include "util/thread_pool.h"

namespace kvpack::kernels {
namespace {

std::vector<uint8_t> make_q4k(int64_t n_out, int64_t n_in, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 0.5f);
  const size_t rb = row_bytes(DType::Q4_K, n_in);
  std::vector<uint8_t> w(rb * n_out);
  std::vector<float> row(n_in);
  for (int64_t o = 0; o < n_out; ++o) {
    for (auto& v : row) v = g(rng) + (o % 3 == 0 ? 0.7f : 0.0f);  // some rows off-centre: non-zero mins
    if (o % 5 == 0) row[static_cast<size_t>(o % n_in)] *= 40.0f;  // an outlier per few rows
    quantize_row(row.data(), DType::Q4_K, n_in, w.data() + rb * o);
  }
  return w;
}

std::vector<float> make_x(int64_t n_tokens, int64_t n_in, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(n_tokens * n_in);
  for (auto& v : x) v = g(rng);
  for (int64_t t = 0; t < n_tokens; t += 3) x[t * n_in] = 0.0f;
  if (n_tokens > 1) std::fill(x.begin() + n_in, x.begin() + 2 * n_in, 0.0f);  // an all-zero token (amax 0)
  return x;
}

std::vector<float> run(const PackedQ4K& p, const std::vector<float>& x, int64_t n_tokens, ThreadPool* pool, Isa isa) {
  std::vector<float> y(n_tokens * p.n_out(), -7.0f);
  matmul_packed(p, x.data(), n_tokens, y.data(), pool, isa);
  return y;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// float64: sum over elements of ((d sc_j) q - (dmin m_j)) * q_x * dx, with the activations rounded as the
// super-block quantiser rounds them (dx = amax / 127, q_x = x * (127 / amax) to nearest even) and the weight
// from its codes (exactly the integer form), so the kernel's only error is f32 rounding.
double reference(const uint8_t* row, const float* x, int64_t n_in, double* magnitude) {
  double acc = 0, mag = 0;
  for (int64_t sb = 0; sb < n_in / 256; ++sb) {
    const auto* blk = reinterpret_cast<const BlockQ4_K*>(row) + sb;
    uint8_t sc[8], m[8];
    q4_k_unpack_scales(blk->scales, sc, m);
    const double d = fp16_to_f32(blk->d), dmin = fp16_to_f32(blk->dmin);
    float amax = 0;
    for (int i = 0; i < 256; ++i) amax = std::max(amax, std::fabs(x[sb * 256 + i]));
    const float dx = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int e = 0; e < 256; ++e) {
      const int q = (blk->qs[32 * (e / 64) + e % 32] >> (e % 64 >= 32 ? 4 : 0)) & 15;
      const double w = d * sc[e / 32] * q - dmin * m[e / 32];
      const double qx = std::nearbyint(static_cast<double>(x[sb * 256 + e] * id));
      acc += w * qx * dx;
      mag += std::fabs(w * qx * dx);
    }
  }
  *magnitude = mag;
  return acc;
}

TEST(MatmulPackedQ4K, PortableKernelMatchesFloat64Reference) {
  std::mt19937 rng(21);
  for (auto [n_out, n_in] : {std::pair<int64_t, int64_t>{37, 256}, {16, 512}, {5, 768}, {70, 1024}}) {
    const auto w = make_q4k(n_out, n_in, rng);
    const PackedQ4K p = pack_q4_k(w.data(), n_out, n_in);
    const int64_t n_tokens = 7;
    const auto x = make_x(n_tokens, n_in, rng);
    const auto y = run(p, x, n_tokens, nullptr, Isa::Scalar);
    const size_t rb = row_bytes(DType::Q4_K, n_in);
    for (int64_t t = 0; t < n_tokens; ++t)
      for (int64_t o = 0; o < n_out; ++o) {
        double mag = 0;
        const double ref = reference(w.data() + rb * o, x.data() + t * n_in, n_in, &mag);
        // Two f32 products and FMAs per super-block, integer sums up to ~2^25 converted to f32.
        EXPECT_NEAR(y[t * n_out + o], ref, 1e-6 * mag + 1e-6) << n_out << "x" << n_in << " t" << t << " o" << o;
      }
  }
}

TEST(MatmulPackedQ4K, AgreesWithRowLayoutQ4K) {
  std::mt19937 rng(22);
  const int64_t n_out = 50, n_in = 512, n_tokens = 9;
  const auto w = make_q4k(n_out, n_in, rng);
  const auto x = make_x(n_tokens, n_in, rng);
  const PackedQ4K p = pack_q4_k(w.data(), n_out, n_in);
  const auto y = run(p, x, n_tokens, nullptr, Isa::Scalar);
  std::vector<float> y_row(n_tokens * n_out);
  matmul_with_isa(Isa::Scalar, w.data(), DType::Q4_K, n_out, n_in, x.data(), n_tokens, y_row.data(), nullptr);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], y_row[i], 2e-4 * (1.0f + std::fabs(y_row[i]))) << i;
}

TEST(MatmulPackedQ4K, Avx512BitwiseEqualsPortableOnOddShapes) {
  if (!cpu_supports(Isa::Avx512)) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  std::mt19937 rng(23);
  ThreadPool pool(2);
  for (auto [n_out, n_in] : {std::pair<int64_t, int64_t>{1, 256}, {15, 512}, {16, 256}, {17, 768}, {33, 256}, {100, 1024}}) {
    const auto w = make_q4k(n_out, n_in, rng);
    const PackedQ4K p = pack_q4_k(w.data(), n_out, n_in);
    for (int64_t n_tokens : {1, 2, 3, 4, 5, 7, 8, 9, 13, 64, 67}) {
      const auto x = make_x(n_tokens, n_in, rng);
      const auto ys = run(p, x, n_tokens, nullptr, Isa::Scalar);
      const auto yv = run(p, x, n_tokens, &pool, Isa::Avx512);
      for (size_t i = 0; i < ys.size(); ++i)
        ASSERT_TRUE(same_bits(ys[i], yv[i])) << n_out << "x" << n_in << " tokens " << n_tokens << " i " << i << ": "
                                             << ys[i] << " vs " << yv[i];
    }
  }
}

TEST(MatmulPackedQ4K, TokenAloneEqualsTokenInBatchOnAnyPool) {
  std::mt19937 rng(24);
  ThreadPool pool2(2);
  const int64_t n_out = 75, n_in = 512, n_tokens = 67;
  const auto w = make_q4k(n_out, n_in, rng);
  const PackedQ4K p = pack_q4_k(w.data(), n_out, n_in);
  const auto x = make_x(n_tokens, n_in, rng);
  for (Isa isa : {Isa::Scalar, Isa::Avx512}) {
    if (!cpu_supports(isa)) continue;
    const auto batch1 = run(p, x, n_tokens, nullptr, isa);
    const auto batch2 = run(p, x, n_tokens, &pool2, isa);
    for (int64_t t = 0; t < n_tokens; t += 5) {
      const std::vector<float> xt(x.begin() + t * n_in, x.begin() + (t + 1) * n_in);
      const auto alone = run(p, xt, 1, nullptr, isa);
      for (int64_t o = 0; o < n_out; ++o) {
        ASSERT_TRUE(same_bits(alone[o], batch1[t * n_out + o])) << isa_name(isa) << " t" << t << " o" << o;
        ASSERT_TRUE(same_bits(alone[o], batch2[t * n_out + o])) << isa_name(isa) << " t" << t << " o" << o;
      }
    }
  }
}

TEST(MatmulPackedQ4K, LayoutPaddingRowsAndShapeErrors) {
  std::mt19937 rng(25);
  const auto w = make_q4k(3, 256, rng);
  const PackedQ4K p = pack_q4_k(w.data(), 3, 256);
  EXPECT_EQ(p.n_groups(), 1);
  EXPECT_EQ(p.bytes(), size_t{PackedQ4K::kRecordBytes});
  const uint8_t* rec = p.group(0);
  // Row 2's element 32 j + 4 i + e in the low nibble of byte ((4 j + i) * 16 + 2) * 4 + e, element + 16 in
  // the high one; its scales, mins and f16 scales where the header says.
  const auto* blk = reinterpret_cast<const BlockQ4_K*>(w.data() + 2 * row_bytes(DType::Q4_K, 256));
  auto code = [&](int e) { return (blk->qs[32 * (e / 64) + e % 32] >> (e % 64 >= 32 ? 4 : 0)) & 15; };
  for (int j = 0; j < 8; ++j)
    for (int i = 0; i < 4; ++i)
      for (int e = 0; e < 4; ++e) {
        const uint8_t b = rec[(4 * j + i) * 64 + 2 * 4 + e];
        EXPECT_EQ(b & 15, code(32 * j + 4 * i + e));
        EXPECT_EQ(b >> 4, code(32 * j + 16 + 4 * i + e));
      }
  uint8_t sc[8], m[8];
  q4_k_unpack_scales(blk->scales, sc, m);
  for (int j = 0; j < 8; ++j) {
    EXPECT_EQ(rec[PackedQ4K::kScOffset + 16 * j + 2], sc[j]);
    EXPECT_EQ(rec[PackedQ4K::kMinOffset + 16 * j + 2], m[j]);
  }
  EXPECT_EQ(std::memcmp(rec + PackedQ4K::kDOffset + 4, &blk->d, 2), 0);
  EXPECT_EQ(std::memcmp(rec + PackedQ4K::kDminOffset + 4, &blk->dmin, 2), 0);
  // Padding rows 3..15: every byte of theirs is 0 (codes, scales, mins, d and dmin).
  for (int r = 3; r < 16; ++r) {
    for (int v = 0; v < 32; ++v)
      for (int e = 0; e < 4; ++e) EXPECT_EQ(rec[v * 64 + r * 4 + e], 0);
    for (int j = 0; j < 8; ++j) EXPECT_EQ(rec[PackedQ4K::kScOffset + 16 * j + r] | rec[PackedQ4K::kMinOffset + 16 * j + r], 0);
    EXPECT_EQ(rec[PackedQ4K::kDOffset + 2 * r] | rec[PackedQ4K::kDminOffset + 2 * r], 0);
  }
  EXPECT_THROW(pack_q4_k(w.data(), 3, 128), std::invalid_argument);
  EXPECT_THROW(pack_q4_k(w.data(), 0, 256), std::invalid_argument);
  EXPECT_THROW(matmul_packed(PackedQ4K{}, nullptr, 1, nullptr, nullptr, Isa::Scalar), std::invalid_argument);
  if (cpu_supports(Isa::Avx2)) {
    std::vector<float> x(256), y(3);
    EXPECT_THROW(matmul_packed(p, x.data(), 1, y.data(), nullptr, Isa::Avx2), std::invalid_argument);
  }
}

}  // namespace
}  // namespace kvpack::kernels
