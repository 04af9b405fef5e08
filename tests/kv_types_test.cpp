// KV row formats (kernels/attention.h "KV element types"): the f32 -> row encoders against independent
// re-implementations of the rounding they promise (BF16 round-to-nearest-even; Q8_0 = ggml's
// quantize_row_q8_0_ref), decoding, sizes, names. The attention kernels' reads of these rows are tested in
// kernels_attention_test.cpp, pages / compaction in kv_page_pool_test.cpp, whole models in
// engine_kv_types_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "util/half.h"

using namespace kvpack;
using namespace kvpack::kernels;

namespace {

// ggml's quantize_row_q8_0_ref, transcribed: d = amax / 127, id = d ? 1/d : 0, q = roundf(x * id), d as f16.
std::vector<uint8_t> ggml_q8_0_ref(const std::vector<float>& x) {
  std::vector<uint8_t> out(x.size() / 32 * 34);
  for (size_t b = 0; b < x.size() / 32; ++b) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[b * 32 + j]));
    const float d = amax / 127.0f;
    const float id = d ? 1.0f / d : 0.0f;
    const uint16_t dh = f32_to_fp16(d);
    std::memcpy(&out[b * 34], &dh, 2);
    for (int j = 0; j < 32; ++j) out[b * 34 + 2 + j] = static_cast<uint8_t>(static_cast<int8_t>(roundf(x[b * 32 + j] * id)));
  }
  return out;
}

// Round-to-nearest-even to 8 significant bits by integer arithmetic on the f32 bits (finite inputs).
uint16_t bf16_rne(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t lower = u & 0xffffu, upper = u >> 16;
  if (lower > 0x8000u || (lower == 0x8000u && (upper & 1u))) return static_cast<uint16_t>(upper + 1);
  return static_cast<uint16_t>(upper);
}

}  // namespace

TEST(KvRowFormat, SizesNamesAndErrors) {
  EXPECT_EQ(kv_row_bytes(DType::F32, 64), 256u);
  EXPECT_EQ(kv_row_bytes(DType::F16, 64), 128u);
  EXPECT_EQ(kv_row_bytes(DType::BF16, 64), 128u);
  EXPECT_EQ(kv_row_bytes(DType::Q8_0, 64), 68u);
  EXPECT_EQ(kv_row_bytes(DType::Q8_0, 128), 136u);  // 34/64 of F16's 256
  try {
    kv_row_bytes(DType::Q8_0, 80);
    FAIL() << "head_dim 80 is not a multiple of 32";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 32"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("80"), std::string::npos) << e.what();
  }
  EXPECT_THROW(kv_row_bytes(DType::Q4_0, 64), std::invalid_argument);
  EXPECT_THROW(kv_row_bytes(DType::F16, 0), std::invalid_argument);
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0}) {
    EXPECT_TRUE(kv_type_supported(t));
    EXPECT_EQ(parse_kv_type(kv_type_name(t)), t);
  }
  EXPECT_STREQ(kv_type_name(DType::Q8_0), "q8_0");
  EXPECT_STREQ(kv_type_name(DType::BF16), "bf16");
  EXPECT_FALSE(kv_type_supported(DType::Q4_K));
  EXPECT_THROW(parse_kv_type("q4_0"), std::invalid_argument);
  EXPECT_THROW(parse_kv_type("F16"), std::invalid_argument);
}

TEST(KvRowFormat, Bf16RoundsToNearestEven) {
  // Ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 -> even (1); 1 + 3 * 2^-8 -> 1 + 2^-6 (even).
  const std::vector<float> x = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f), 1.0f + 0x1p-8f + 0x1p-20f,
                                3.14159265f, -2.5e-3f, 1e30f, 0.0f, -0.0f, 6e-39f /* subnormal */};
  std::vector<uint8_t> row(2 * x.size());
  kv_encode_row(x.data(), DType::BF16, static_cast<int32_t>(x.size()), row.data());
  std::vector<float> back(x.size());
  kv_decode_row(row.data(), DType::BF16, static_cast<int32_t>(x.size()), back.data());
  for (size_t i = 0; i < x.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, &row[2 * i], 2);
    EXPECT_EQ(h, bf16_rne(x[i])) << "x = " << x[i];
    EXPECT_EQ(back[i], bf16_to_f32(h));
  }
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], 1.0f + 0x1p-6f);
  EXPECT_EQ(back[3], 1.0f + 0x1p-7f);  // just above the tie rounds up
  // Random values: the bf16-rne reference bit for bit, error <= half an ulp (<= 2^-8 relative: 8 significant bits).
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0.0f, 3.0f);
  std::vector<float> r(4096), rb(4096);
  for (auto& v : r) v = g(rng);
  std::vector<uint8_t> enc(2 * r.size());
  kv_encode_row(r.data(), DType::BF16, 4096, enc.data());
  kv_decode_row(enc.data(), DType::BF16, 4096, rb.data());
  for (size_t i = 0; i < r.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, &enc[2 * i], 2);
    ASSERT_EQ(h, bf16_rne(r[i]));
    ASSERT_LE(std::fabs(rb[i] - r[i]), std::ldexp(std::fabs(r[i]), -8));
  }
}

TEST(KvRowFormat, Q8_0MatchesGgmlReferenceQuantiser) {
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (int rep = 0; rep < 200; ++rep) {
    const int32_t n = 32 * (1 + rep % 8);
    std::vector<float> x(static_cast<size_t>(n));
    const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 20) - 10);
    for (auto& v : x) v = g(rng) * scale;
    if (rep % 5 == 0) std::fill(x.begin(), x.begin() + 32, 0.0f);  // all-zero block: d = 0, q = 0
    if (rep % 7 == 0)                                              // exact ties of x / d at .5: away from zero
      for (int j = 0; j < 32; ++j) x[static_cast<size_t>(j)] = (j == 0 ? 127.0f : static_cast<float>(j % 9) - 4.5f) * 0.25f;
    std::vector<uint8_t> got(kv_row_bytes(DType::Q8_0, n));
    kv_encode_row(x.data(), DType::Q8_0, n, got.data());
    const auto want = ggml_q8_0_ref(x);
    ASSERT_EQ(got, want) << "rep " << rep;
    // Decode: d (f16) * q exactly, error <= d/2 + 127 |d - f16(d)| per element, where |d - f16(d)| <=
    // d 2^-11 + 2^-25 (half an ulp, or half the subnormal step for tiny blocks).
    std::vector<float> back(x.size());
    kv_decode_row(got.data(), DType::Q8_0, n, back.data());
    for (int32_t b = 0; b < n / 32; ++b) {
      uint16_t dh;
      std::memcpy(&dh, &got[static_cast<size_t>(b) * 34], 2);
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[static_cast<size_t>(b * 32 + j)]));
      for (int j = 0; j < 32; ++j) {
        const size_t i = static_cast<size_t>(b * 32 + j);
        ASSERT_EQ(back[i], fp16_to_f32(dh) * static_cast<float>(static_cast<int8_t>(got[static_cast<size_t>(b) * 34 + 2 + j])));
        ASSERT_LE(std::fabs(back[i] - x[i]), (amax * (1.0 / 254 + std::ldexp(1.0, -11)) + 127 * std::ldexp(1.0, -25)) * (1 + 1e-6));
      }
    }
  }
  // Hand-computed: amax = 31.75 gives d = 0.25 exactly; x = -1.125 -> x / d = -4.5 -> -5 (ties away from
  // zero, as roundf), 0.625 -> 2.5 -> 3.
  std::vector<float> t(32, 0.0f);
  t[0] = 31.75f;
  t[1] = -1.125f;
  t[2] = 0.625f;  // 2.5 -> 3
  std::vector<uint8_t> row(34);
  kv_encode_row(t.data(), DType::Q8_0, 32, row.data());
  EXPECT_EQ(static_cast<int8_t>(row[2]), 127);
  EXPECT_EQ(static_cast<int8_t>(row[3]), -5);
  EXPECT_EQ(static_cast<int8_t>(row[4]), 3);
}

TEST(KvRowFormat, F16EncodeIsTheSameOnEveryPath) {
  // The SIMD paths convert with vcvtps2ph; they must give f32_to_fp16's bits (round to nearest even, overflow
  // to inf, subnormal halves, canonical quiet NaN) for every class of input. Every sign and exponent, with
  // mantissas at and around the f16 rounding points (13 dropped bits: ties 0x1000, odd / even kept bits),
  // for normal, subnormal and overflowing halves, NaNs with payloads, infinities; odd lengths for the tails.
  std::vector<float> x;
  std::mt19937 rng(11);
  for (uint32_t sign = 0; sign < 2; ++sign)
    for (uint32_t e = 0; e < 256; ++e)
      for (uint32_t m : {0x0u, 0x1u, 0xfffu, 0x1000u, 0x1001u, 0x1fffu, 0x2000u, 0x3000u, 0x5000u, 0x7fe000u, 0x7ff000u, 0x7fffffu,
                         static_cast<uint32_t>(rng()) & 0x7fffffu, static_cast<uint32_t>(rng()) & 0x7fffffu}) {
        if (e == 255 && m == 0) continue;  // infinities below, once each
        x.push_back(bits_to_f32(sign << 31 | e << 23 | m));
      }
  for (float v : {65504.0f, 65519.996f, 65520.0f, 65536.0f, -65520.0f, 0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-26f, 6.0e-8f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()})
    x.push_back(v);
  for (uint32_t payload : {0x1u, 0x2000u, 0x400000u, 0x7fffffu, 0x3fffffu}) {  // signalling and quiet NaNs, both signs
    x.push_back(bits_to_f32(0x7f800000u | payload));
    x.push_back(bits_to_f32(0xff800000u | payload));
  }
  const int32_t n = static_cast<int32_t>(x.size());
  std::vector<uint8_t> want(2 * x.size());
  for (int32_t i = 0; i < n; ++i) {
    const uint16_t h = f32_to_fp16(x[static_cast<size_t>(i)]);
    std::memcpy(&want[2 * static_cast<size_t>(i)], &h, 2);
  }
  int paths = 0;
  for (const char* isa : {"scalar", "avx2", "avx512"}) {
    if (!attention_isa_available(isa)) continue;
    ++paths;
    for (int32_t len : {n, n - 1, 15, 17, 7, 1}) {  // offsets 0 and 3 shift every value through the vector lanes
      for (int32_t off : {0, 3}) {
        if (off + len > n) continue;
        std::vector<uint8_t> got(2 * static_cast<size_t>(len) + 2, 0xab);
        kv_encode_row_on(isa, x.data() + off, DType::F16, len, got.data());
        for (int32_t i = 0; i < len; ++i) {
          uint16_t g, w;
          std::memcpy(&g, &got[2 * static_cast<size_t>(i)], 2);
          std::memcpy(&w, &want[2 * static_cast<size_t>(i + off)], 2);
          ASSERT_EQ(g, w) << isa << " len " << len << " off " << off << ": x bits 0x" << std::hex << f32_to_bits(x[static_cast<size_t>(i + off)]);
        }
        EXPECT_EQ(got[2 * static_cast<size_t>(len)], 0xab) << isa << ": wrote past the row";
      }
    }
    std::vector<uint8_t> dflt(want.size());
    kv_encode_row(x.data(), DType::F16, n, dflt.data());  // the dispatched path
    EXPECT_EQ(dflt, want);
  }
  EXPECT_GE(paths, 1);
  EXPECT_THROW(kv_encode_row_on("sse9", x.data(), DType::F16, 1, want.data()), std::invalid_argument);
}
