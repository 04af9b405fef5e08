// Packed Q8_0 matmul (kernels/matmul_packed.h):
// - the portable kernel against a float64 reference of the same quantised codes (dequantised weights x
//   the int8 activations matmul() would make), and against the row-layout Q8_0 matmul;
// - the AVX-512 kernel bitwise equal to the portable one on odd shapes (rows not a multiple of 16, 1-block
//   rows, every token tile and its remainders, the driver's 64-token chunks);
// - batch and thread invariance: a token's outputs are the same bits alone, in any batch, on 1 or 2 threads;
// - packing: padding rows, shape errors.
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
#include "util/dtype.h"
#include "util/half.h"
#include "util/thread_pool.h"

namespace kvpack::kernels {
namespace {

std::vector<uint8_t> make_q8(int64_t n_out, int64_t n_in, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 0.5f);
  const size_t rb = row_bytes(DType::Q8_0, n_in);
  std::vector<uint8_t> w(rb * n_out);
  std::vector<float> row(n_in);
  for (int64_t o = 0; o < n_out; ++o) {
    for (auto& v : row) v = g(rng);
    if (o % 5 == 0) row[static_cast<size_t>(o % n_in)] *= 40.0f;  // an outlier per few rows: large block scales
    quantize_row(row.data(), DType::Q8_0, n_in, w.data() + rb * o);
  }
  return w;
}

std::vector<float> make_x(int64_t n_tokens, int64_t n_in, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(n_tokens * n_in);
  for (auto& v : x) v = g(rng);
  for (int64_t t = 0; t < n_tokens; t += 3) x[t * n_in] = 0.0f;  // a zero now and then
  if (n_tokens > 1) std::fill(x.begin() + n_in, x.begin() + 2 * n_in, 0.0f);  // an all-zero token (amax 0)
  return x;
}

std::vector<float> run(const PackedQ8& p, const std::vector<float>& x, int64_t n_tokens, ThreadPool* pool, Isa isa) {
  std::vector<float> y(n_tokens * p.n_out(), -7.0f);
  matmul_packed(p, x.data(), n_tokens, y.data(), pool, isa);
  return y;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// float64 dot of the dequantised weights with the activations rounded as matmul() rounds them (int8 blocks
// of 32, round to nearest even, d = amax / 127 rounded to f16): the packed kernel's only error is the f32
// rounding of the block products and their sum.
double reference(const uint8_t* row, const float* x, int64_t n_in) {
  double acc = 0;
  std::vector<float> w(n_in);
  dequantize_row(row, DType::Q8_0, n_in, w.data());
  for (int64_t b = 0; b < n_in / 32; ++b) {
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const float d = fp16_to_f32(f32_to_fp16(amax / 127.0f));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int i = 0; i < 32; ++i) {
      const double q = std::nearbyint(static_cast<double>(x[b * 32 + i] * id));
      acc += static_cast<double>(w[b * 32 + i]) * q * d;
    }
  }
  return acc;
}

TEST(MatmulPacked, PortableKernelMatchesFloat64Reference) {
  std::mt19937 rng(11);
  for (auto [n_out, n_in] : {std::pair<int64_t, int64_t>{37, 64}, {16, 32}, {5, 288}, {70, 1024}}) {
    const auto w = make_q8(n_out, n_in, rng);
    const PackedQ8 p = pack_q8_0(w.data(), n_out, n_in);
    const int64_t n_tokens = 7;
    const auto x = make_x(n_tokens, n_in, rng);
    const auto y = run(p, x, n_tokens, nullptr, Isa::Scalar);
    const size_t rb = row_bytes(DType::Q8_0, n_in);
    for (int64_t t = 0; t < n_tokens; ++t)
      for (int64_t o = 0; o < n_out; ++o) {
        const double ref = reference(w.data() + rb * o, x.data() + t * n_in, n_in);
        // f32 block products summed over n_in / 32 blocks: a few ulps of the sum of |terms| per block.
        double mag = 0;
        std::vector<float> wr(n_in);
        dequantize_row(w.data() + rb * o, DType::Q8_0, n_in, wr.data());
        for (int64_t i = 0; i < n_in; ++i) mag += std::fabs(wr[i] * x[t * n_in + i]);
        EXPECT_NEAR(y[t * n_out + o], ref, 1e-6 * mag + 1e-6 * (n_in / 32)) << n_out << "x" << n_in << " t" << t << " o" << o;
      }
  }
}

TEST(MatmulPacked, AgreesWithRowLayoutQ8_0) {
  std::mt19937 rng(12);
  const int64_t n_out = 50, n_in = 512, n_tokens = 9;
  const auto w = make_q8(n_out, n_in, rng);
  const auto x = make_x(n_tokens, n_in, rng);
  const PackedQ8 p = pack_q8_0(w.data(), n_out, n_in);
  const auto y = run(p, x, n_tokens, nullptr, Isa::Scalar);
  std::vector<float> y_row(n_tokens * n_out);
  matmul_with_isa(Isa::Scalar, w.data(), DType::Q8_0, n_out, n_in, x.data(), n_tokens, y_row.data(), nullptr);
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], y_row[i], 2e-4 * (1.0f + std::fabs(y_row[i]))) << i;
}

TEST(MatmulPacked, Avx512BitwiseEqualsPortableOnOddShapes) {
  if (!cpu_supports(Isa::Avx512)) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  std::mt19937 rng(13);
  ThreadPool pool(2);
  for (auto [n_out, n_in] : {std::pair<int64_t, int64_t>{1, 32}, {15, 64}, {16, 96}, {17, 32}, {33, 288}, {100, 256},
                             {130, 1024}}) {
    const auto w = make_q8(n_out, n_in, rng);
    const PackedQ8 p = pack_q8_0(w.data(), n_out, n_in);
    for (int64_t n_tokens : {1, 2, 5, 6, 7, 11, 12, 13, 18, 19, 64, 65, 70}) {
      const auto x = make_x(n_tokens, n_in, rng);
      const auto ys = run(p, x, n_tokens, nullptr, Isa::Scalar);
      const auto yv = run(p, x, n_tokens, &pool, Isa::Avx512);
      for (size_t i = 0; i < ys.size(); ++i)
        ASSERT_TRUE(same_bits(ys[i], yv[i])) << n_out << "x" << n_in << " tokens " << n_tokens << " i " << i << ": "
                                             << ys[i] << " vs " << yv[i];
    }
  }
}

TEST(MatmulPacked, TokenAloneEqualsTokenInBatchOnAnyPool) {
  std::mt19937 rng(14);
  ThreadPool pool2(2);
  const int64_t n_out = 75, n_in = 320, n_tokens = 67;
  const auto w = make_q8(n_out, n_in, rng);
  const PackedQ8 p = pack_q8_0(w.data(), n_out, n_in);
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

TEST(MatmulPacked, PaddingRowsAndShapeErrors) {
  std::mt19937 rng(15);
  const auto w = make_q8(3, 64, rng);
  const PackedQ8 p = pack_q8_0(w.data(), 3, 64);
  EXPECT_EQ(p.n_groups(), 1);
  EXPECT_EQ(p.bytes(), size_t{2} * PackedQ8::kRecordBytes);
  // Padding lanes: codes 0 (stored as 0x80) and scale 0; the real rows keep their f16 scales.
  const uint8_t* rec = p.group(0);
  for (int r = 3; r < 16; ++r) {
    for (int j = 0; j < 8; ++j)
      for (int i = 0; i < 4; ++i) EXPECT_EQ(rec[j * 64 + r * 4 + i], 0x80);
    EXPECT_EQ(rec[512 + 2 * r], 0);
    EXPECT_EQ(rec[512 + 2 * r + 1], 0);
  }
  EXPECT_EQ(rec[512], w[0]);
  EXPECT_EQ(rec[513], w[1]);
  EXPECT_THROW(pack_q8_0(w.data(), 3, 48), std::invalid_argument);
  EXPECT_THROW(pack_q8_0(w.data(), 0, 64), std::invalid_argument);
  EXPECT_THROW(matmul_packed(PackedQ8{}, nullptr, 1, nullptr, nullptr, Isa::Scalar), std::invalid_argument);
  if (cpu_supports(Isa::Avx2)) {
    std::vector<float> x(64), y(3);
    EXPECT_THROW(matmul_packed(p, x.data(), 1, y.data(), nullptr, Isa::Avx2), std::invalid_argument);
  }
}

// packed_concat (Q|K|V as one matmul in the forward): parts packed back to back read as one matrix give each
// output the bits it has in its own part, on every path; parts that do not lie so give an empty view.
TEST(MatmulPacked, ConcatOfPartsBackToBackGivesEachPartsBits) {
  std::mt19937 rng(16);
  const int64_t n_in = 96, rows[] = {32, 16, 37};
  std::vector<std::vector<uint8_t>> w;
  size_t total = 0;
  for (int64_t r : rows) {
    w.push_back(make_q8(r, n_in, rng));
    total += PackedQ8::bytes_for(r, n_in);
  }
  std::vector<uint8_t> arena(total + 64);
  uint8_t* at = arena.data() + (64 - reinterpret_cast<uintptr_t>(arena.data()) % 64) % 64;
  std::vector<PackedQ8> parts;
  for (size_t i = 0; i < w.size(); ++i) {
    parts.push_back(pack_q8_0_into(at, w[i].data(), rows[i], n_in));
    at += parts.back().bytes();
  }
  const PackedQ8* ptrs[] = {&parts[0], &parts[1], &parts[2]};
  const PackedQ8 all = packed_concat(ptrs);
  ASSERT_TRUE(all);
  EXPECT_EQ(all.n_out(), 32 + 16 + 37);
  const int64_t n_tokens = 5;
  const auto x = make_x(n_tokens, n_in, rng);
  for (Isa isa : {Isa::Scalar, Isa::Avx512}) {
    if (!cpu_supports(isa)) continue;
    const auto y = run(all, x, n_tokens, nullptr, isa);
    int64_t o0 = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      const auto yi = run(parts[i], x, n_tokens, nullptr, isa);
      for (int64_t t = 0; t < n_tokens; ++t)
        for (int64_t o = 0; o < rows[i]; ++o)
          ASSERT_TRUE(same_bits(yi[t * rows[i] + o], y[t * all.n_out() + o0 + o])) << isa_name(isa) << " part " << i << " t" << t;
      o0 += rows[i];
    }
  }
  const PackedQ8* gap[] = {&parts[0], &parts[2]};  // not adjacent
  EXPECT_FALSE(packed_concat(gap));
  // 37 rows then 16, back to back: the first's last group is padded, so the second's rows would not follow.
  std::vector<uint8_t> arena2(PackedQ8::bytes_for(37, n_in) + PackedQ8::bytes_for(16, n_in) + 64);
  uint8_t* at2 = arena2.data() + (64 - reinterpret_cast<uintptr_t>(arena2.data()) % 64) % 64;
  const PackedQ8 a37 = pack_q8_0_into(at2, w[2].data(), 37, n_in);
  const PackedQ8 a16 = pack_q8_0_into(at2 + a37.bytes(), w[1].data(), 16, n_in);
  const PackedQ8* padded[] = {&a37, &a16};
  EXPECT_FALSE(packed_concat(padded));
  const PackedQ8* last_padded[] = {&a16};
  EXPECT_TRUE(packed_concat(last_padded));
}

}  // namespace
}  // namespace kvpack::kernels
