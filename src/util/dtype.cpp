#include "util/dtype.h"

#include <array>
#include <cmath>
#include <cstring>

#include "util/half.h"

namespace kvpack {
namespace {
struct Entry {
  uint32_t id;
  DTypeTraits t;
};
// Sizes as defined by ggml (block layouts: Q8_0 = f16 scale + 32 int8; Q4_0 = f16 scale + 16 bytes;
// K-quants and IQ4_XS use 256-element super-blocks).
constexpr std::array<Entry, 22> kTypes = {{
    {0, {"F32", 1, 4}},      {1, {"F16", 1, 2}},      {2, {"Q4_0", 32, 18}},
    {3, {"Q4_1", 32, 20}},   {6, {"Q5_0", 32, 22}},   {7, {"Q5_1", 32, 24}},
    {8, {"Q8_0", 32, 34}},   {9, {"Q8_1", 32, 36}},   {10, {"Q2_K", 256, 84}},
    {11, {"Q3_K", 256, 110}}, {12, {"Q4_K", 256, 144}}, {13, {"Q5_K", 256, 176}},
    {14, {"Q6_K", 256, 210}}, {15, {"Q8_K", 256, 292}}, {24, {"I8", 1, 1}},
    {25, {"I16", 1, 2}},     {26, {"I32", 1, 4}},     {27, {"I64", 1, 8}},
    {28, {"F64", 1, 8}},     {30, {"BF16", 1, 2}},    {20, {"IQ4_NL", 32, 18}},
    {23, {"IQ4_XS", 256, 136}},
}};
}  // namespace

const DTypeTraits* dtype_traits(uint32_t raw_type) {
  for (const auto& e : kTypes)
    if (e.id == raw_type) return &e.t;
  return nullptr;
}

std::string_view dtype_name(DType t) {
  const auto* tr = dtype_traits(static_cast<uint32_t>(t));
  return tr ? tr->name : std::string_view("?");
}

// ---- Q4_K -------------------------------------------------------------------------------------

void q4_k_unpack_scales(const uint8_t* s, uint8_t sc[8], uint8_t m[8]) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    m[j] = s[j + 4] & 63;
    sc[j + 4] = static_cast<uint8_t>((s[j + 8] & 15) | (s[j] >> 6) << 4);
    m[j + 4] = static_cast<uint8_t>((s[j + 8] >> 4) | (s[j + 4] >> 6) << 4);
  }
}

void q4_k_pack_scales(const uint8_t sc[8], const uint8_t m[8], uint8_t* s) {
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<uint8_t>((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
    s[j + 4] = static_cast<uint8_t>((m[j] & 63) | (m[j + 4] >> 4) << 6);
    s[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
  }
}

// round(v) clamped to [lo, hi]; NaN -> lo.
int round_clamp(float v, int lo, int hi) {
  if (!(v > static_cast<float>(lo))) return lo;
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(std::lround(v));
}

// Fits x[i] ~= scale * L[i] - min (L in 0..nmax, min >= 0) for one sub-block of n elements, minimising
// sum w[i] (scale L[i] - min - x[i])^2 over a sweep of candidate steps (each followed by a weighted
// least-squares refit of scale and offset). Returns scale; *min_out = min.
float fit_scale_min(const float* x, const float* w, int n, int nmax, float* min_out) {
  float lo = x[0], hi = x[0], sum_w = 0, sum_x = 0;
  for (int i = 0; i < n; ++i) {
    lo = std::fmin(lo, x[i]);
    hi = std::fmax(hi, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (lo > 0) lo = 0;  // the offset only ever shifts down (min >= 0), as in ggml
  if (!(hi > lo)) {    // constant (or non-finite) sub-block
    *min_out = std::isfinite(lo) ? -lo : 0.0f;
    return 0.0f;
  }
  auto err_of = [&](float scale, float offset) {
    float e = 0;
    for (int i = 0; i < n; ++i) {
      const int l = round_clamp((x[i] - offset) / scale, 0, nmax);
      const float d = scale * static_cast<float>(l) + offset - x[i];
      e += w[i] * d * d;
    }
    return e;
  };
  float best_scale = (hi - lo) / static_cast<float>(nmax), best_off = lo;
  float best_err = err_of(best_scale, best_off);
  for (int step = 0; step <= 20; ++step) {
    const float iscale = (static_cast<float>(nmax) - 1.0f + 0.1f * static_cast<float>(step)) / (hi - lo);
    float sl = 0, sl2 = 0, sxl = 0;
    for (int i = 0; i < n; ++i) {
      const float l = static_cast<float>(round_clamp(iscale * (x[i] - lo), 0, nmax));
      sl += w[i] * l;
      sl2 += w[i] * l * l;
      sxl += w[i] * l * x[i];
    }
    const float det = sum_w * sl2 - sl * sl;
    if (!(det > 0)) continue;
    float scale = (sum_w * sxl - sum_x * sl) / det;
    float off = (sl2 * sum_x - sl * sxl) / det;
    if (off > 0) {  // the offset must not be positive: refit the scale alone with offset 0
      off = 0;
      scale = sxl / sl2;
    }
    if (!(scale > 0)) continue;
    const float e = err_of(scale, off);
    if (e < best_err) {
      best_err = e;
      best_scale = scale;
      best_off = off;
    }
  }
  *min_out = -best_off;
  return best_scale;
}

namespace {
float fit_sub_block(const float* x, const float* w, float* min_out) { return fit_scale_min(x, w, 32, 15, min_out); }
}  // namespace

void quantize_q4_k(const float* x, int64_t n, void* out) {
  auto* o = static_cast<uint8_t*>(out);
  for (int64_t blk = 0; blk < n / kQ4KBlock; ++blk, x += kQ4KBlock, o += kQ4KBytes) {
    float scales[8], mins[8], w[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
      const float* v = x + 32 * j;
      float s2 = 0;
      for (int i = 0; i < 32; ++i) s2 += v[i] * v[i];
      const float rms = std::sqrt(s2 / 32);
      for (int i = 0; i < 32; ++i) w[i] = rms + std::fabs(v[i]);
      scales[j] = fit_sub_block(v, w, &mins[j]);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    const uint16_t dh = f32_to_fp16(max_scale / 63), mh = f32_to_fp16(max_min / 63);
    const float d = fp16_to_f32(dh), dmin = fp16_to_f32(mh);
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; ++j) {
      sc[j] = static_cast<uint8_t>(d > 0 ? round_clamp(scales[j] / d, 0, 63) : 0);
      m[j] = static_cast<uint8_t>(dmin > 0 ? round_clamp(mins[j] / dmin, 0, 63) : 0);
    }
    std::memcpy(o, &dh, 2);
    std::memcpy(o + 2, &mh, 2);
    q4_k_pack_scales(sc, m, o + 4);
    uint8_t L[256];
    for (int j = 0; j < 8; ++j) {
      const float step = d * static_cast<float>(sc[j]), off = dmin * static_cast<float>(m[j]);
      for (int i = 0; i < 32; ++i)
        L[32 * j + i] = static_cast<uint8_t>(step > 0 ? round_clamp((x[32 * j + i] + off) / step, 0, 15) : 0);
    }
    uint8_t* qs = o + 16;
    for (int p = 0; p < 4; ++p)
      for (int i = 0; i < 32; ++i) qs[32 * p + i] = static_cast<uint8_t>(L[64 * p + i] | L[64 * p + 32 + i] << 4);
  }
}

void dequantize_q4_k(const void* in, int64_t n, float* out) {
  const auto* b = static_cast<const uint8_t*>(in);
  for (int64_t blk = 0; blk < n / kQ4KBlock; ++blk, b += kQ4KBytes, out += kQ4KBlock) {
    uint16_t dh, mh;
    std::memcpy(&dh, b, 2);
    std::memcpy(&mh, b + 2, 2);
    const float d = fp16_to_f32(dh), dmin = fp16_to_f32(mh);
    uint8_t sc[8], m[8];
    q4_k_unpack_scales(b + 4, sc, m);
    const uint8_t* qs = b + 16;
    for (int p = 0; p < 4; ++p) {
      const float d0 = d * sc[2 * p], m0 = dmin * m[2 * p], d1 = d * sc[2 * p + 1], m1 = dmin * m[2 * p + 1];
      for (int i = 0; i < 32; ++i) {
        out[64 * p + i] = d0 * static_cast<float>(qs[32 * p + i] & 15) - m0;
        out[64 * p + 32 + i] = d1 * static_cast<float>(qs[32 * p + i] >> 4) - m1;
      }
    }
  }
}

}  // namespace kvpack
