// Scalar IEEE half and bfloat16 conversions (bit-exact, round-to-nearest-even). SIMD kernels use
// hardware conversions; these are the portable reference and the slow-path helpers.
#pragma once
#include <cstdint>
#include <cstring>

namespace kvpack {

inline float bits_to_f32(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

inline float fp16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return bits_to_f32(sign);
    // subnormal: normalise
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    mant &= 0x3ffu;
    return bits_to_f32(sign | static_cast<uint32_t>(127 - 15 - e) << 23 | mant << 13);
  }
  if (exp == 31) return bits_to_f32(sign | 0x7f800000u | mant << 13);
  return bits_to_f32(sign | (exp + 112) << 23 | mant << 13);
}

inline uint16_t f32_to_fp16(float f) {
  const uint32_t x = f32_to_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absx < 0x38800000u) {                                                // subnormal or zero
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // value / 2^-24 = m >> shift; shift is 14..24 here
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = ((absx - 0x38000000u) >> 13);
  const uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

inline float bf16_to_f32(uint16_t h) { return bits_to_f32(static_cast<uint32_t>(h) << 16); }

// Directed f32 -> f16: the largest half <= f / the smallest half >= f (f finite; beyond the half range they
// give +-65504 or +-inf on the side that keeps the inequality). NaN: as f32_to_fp16. Used where a rounded
// value must stay a bound (recall's key digests: minima down, maxima up).
inline uint16_t fp16_step_down(uint16_t h) {
  if (h == 0x0000u) return 0x8001u;  // +0 -> the smallest negative subnormal
  return (h & 0x8000u) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h - 1);
}
inline uint16_t fp16_step_up(uint16_t h) {
  if (h == 0x8000u) return 0x0001u;  // -0 -> the smallest positive subnormal
  return (h & 0x8000u) ? static_cast<uint16_t>(h - 1) : static_cast<uint16_t>(h + 1);
}
inline uint16_t f32_to_fp16_floor(float f) {
  const uint16_t h = f32_to_fp16(f);
  return fp16_to_f32(h) > f ? fp16_step_down(h) : h;
}
inline uint16_t f32_to_fp16_ceil(float f) {
  const uint16_t h = f32_to_fp16(f);
  return fp16_to_f32(h) < f ? fp16_step_up(h) : h;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t x = f32_to_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace kvpack
