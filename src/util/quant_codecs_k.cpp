// Super-block codecs (Q2_K, Q3_K, Q5_K, Q6_K, IQ4_XS; Q4_K forwards to util/dtype.cpp) and the dispatch
// of util/quant_codecs.h. Byte offsets are ggml's block layouts (see kernels/quant.h for the structs).
#include <cmath>
#include <cstring>

#include "util/half.h"
#include "util/quant_codecs.h"

namespace kvpack {
namespace {

uint16_t get16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
void put16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
float half_at(const uint8_t* p) { return fp16_to_f32(get16(p)); }

float amax_of(const float* x, int n) {
  float a = 0;
  for (int i = 0; i < n; ++i) a = std::fmax(a, std::fabs(x[i]));
  return a;
}
// The element of largest magnitude, with its sign (0 for an all-zero block).
float signed_max_of(const float* x, int n) {
  float a = 0, v = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > a) {
      a = std::fabs(x[i]);
      v = x[i];
    }
  return v;
}
// ceil(v) clamped to [0, hi]; NaN -> 0.
int ceil_clamp(float v, int hi) { return round_clamp(std::ceil(v), 0, hi); }

// Index of the IQ4 grid value nearest to t (ties to the lower one).
int nearest_iq4(float t) {
  int best = 0;
  float best_d = std::fabs(t - kIQ4Grid[0]);
  for (int k = 1; k < 16; ++k) {
    const float d = std::fabs(t - kIQ4Grid[k]);
    if (d < best_d) {
      best_d = d;
      best = k;
    }
  }
  return best;
}

// Importance weights of the least-squares fits (as quantize_q4_k): rms(sub-block) + |x|.
void fit_weights(const float* v, int n, float* w) {
  float s2 = 0;
  for (int i = 0; i < n; ++i) s2 += v[i] * v[i];
  const float rms = std::sqrt(s2 / static_cast<float>(n));
  for (int i = 0; i < n; ++i) w[i] = rms + std::fabs(v[i]);
}

// ---- Q6_K: ql[128] | qh[64] | int8 scales[16] | f16 d = 210 bytes --------------------------------------
// Element 128 h + 32 k + l (h < 2, k < 4, l < 32): low 4 bits in ql[64 h + l + 32 (k & 1)] (low nibble for
// k < 2, high for k >= 2), bits 4-5 in bits 2k..2k+1 of qh[32 h + l]; value = d * sc[e / 16] * (code - 32).
void decode_q6_k(const uint8_t* b, KBlockInts* o) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, k = (e % 128) / 32, l = e % 32;
    const uint8_t lo = ql[64 * h + l + 32 * (k & 1)];
    const int nib = k < 2 ? lo & 15 : lo >> 4;
    const int hi = (qh[32 * h + l] >> (2 * k)) & 3;
    o->q[e] = static_cast<int8_t>((nib | hi << 4) - 32);
  }
  for (int j = 0; j < 16; ++j) {
    o->sc[j] = static_cast<int8_t>(b[192 + j]);
    o->mn[j] = 0;
  }
  o->dA = half_at(b + 208);
  o->dB = 0;
}

void quantize_q6_k(const float* x, uint8_t* b) {
  float s[16], smax = 0;
  for (int j = 0; j < 16; ++j) {
    s[j] = amax_of(x + 16 * j, 16) / 31.0f;  // codes -31..31 cover the sub-block
    smax = std::fmax(smax, s[j]);
  }
  const uint16_t dh = f32_to_fp16(smax / 127.0f);
  const float d = fp16_to_f32(dh);
  std::memset(b, 0, 210);
  int sc[16];
  for (int j = 0; j < 16; ++j) {
    // Rounding the scale up keeps every code inside -31..31 (no clamping): error <= half the final step.
    sc[j] = d > 0 ? ceil_clamp(s[j] / d, 127) : 0;
    b[192 + j] = static_cast<uint8_t>(static_cast<int8_t>(sc[j]));
  }
  put16(b + 208, dh);
  for (int e = 0; e < 256; ++e) {
    const float step = d * static_cast<float>(sc[e / 16]);
    const int code = (step > 0 ? round_clamp(x[e] / step, -32, 31) : 0) + 32;
    const int h = e / 128, k = (e % 128) / 32, l = e % 32;
    uint8_t& lo = b[64 * h + l + 32 * (k & 1)];
    lo = static_cast<uint8_t>(lo | (k < 2 ? code & 15 : (code & 15) << 4));
    b[128 + 32 * h + l] = static_cast<uint8_t>(b[128 + 32 * h + l] | (code >> 4) << (2 * k));
  }
}

// ---- Q3_K: hmask[32] | qs[64] | scales[12] | f16 d = 110 bytes ------------------------------------------
// Element 128 h + 32 j + l: low 2 bits in bits 2j..2j+1 of qs[32 h + l], bit 2 in bit 4h + j of hmask[l];
// value = d * (s - 32) * (code - 4). The 16 6-bit scales s: low nibble in byte j (j < 8) or the high
// nibble of byte j - 8, top 2 bits in bits 2 (j / 4) of byte 8 + j % 4.
int q3_k_scale(const uint8_t* s, int j) {
  const int lo = j < 8 ? s[j] & 15 : s[j - 8] >> 4;
  const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return lo | hi << 4;
}

void decode_q3_k(const uint8_t* b, KBlockInts* o) {
  const uint8_t* hm = b;
  const uint8_t* qs = b + 32;
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, j = (e % 128) / 32, l = e % 32;
    const int low = (qs[32 * h + l] >> (2 * j)) & 3;
    const int high = (hm[l] >> (4 * h + j)) & 1;
    o->q[e] = static_cast<int8_t>((low | high << 2) - 4);
  }
  for (int j = 0; j < 16; ++j) {
    o->sc[j] = static_cast<int16_t>(q3_k_scale(b + 96, j) - 32);
    o->mn[j] = 0;
  }
  o->dA = half_at(b + 108);
  o->dB = 0;
}

void quantize_q3_k(const float* x, uint8_t* b) {
  float s[16], smax = 0;
  for (int j = 0; j < 16; ++j) {
    s[j] = amax_of(x + 16 * j, 16) / 3.0f;  // codes -3..3 of -4..3
    smax = std::fmax(smax, s[j]);
  }
  const uint16_t dh = f32_to_fp16(smax / 31.0f);
  const float d = fp16_to_f32(dh);
  std::memset(b, 0, 110);
  int sc[16];
  for (int j = 0; j < 16; ++j) {
    sc[j] = d > 0 ? ceil_clamp(s[j] / d, 31) : 0;  // rounded up: no code clamps
    const int v = sc[j] + 32;
    if (j < 8)
      b[96 + j] = static_cast<uint8_t>(b[96 + j] | (v & 15));
    else
      b[96 + j - 8] = static_cast<uint8_t>(b[96 + j - 8] | (v & 15) << 4);
    b[96 + 8 + j % 4] = static_cast<uint8_t>(b[96 + 8 + j % 4] | (v >> 4) << (2 * (j / 4)));
  }
  put16(b + 108, dh);
  for (int e = 0; e < 256; ++e) {
    const float step = d * static_cast<float>(sc[e / 16]);
    const int code = (step > 0 ? round_clamp(x[e] / step, -4, 3) : 0) + 4;
    const int h = e / 128, j = (e % 128) / 32, l = e % 32;
    b[32 + 32 * h + l] = static_cast<uint8_t>(b[32 + 32 * h + l] | (code & 3) << (2 * j));
    b[l] = static_cast<uint8_t>(b[l] | (code >> 2) << (4 * h + j));
  }
}

// ---- Q4_K / Q5_K: f16 d | f16 dmin | scales[12] (| qh[32] for Q5_K) | qs[128] --------------------------
void decode_q4_k(const uint8_t* b, KBlockInts* o) {
  uint8_t sc[8], m[8];
  q4_k_unpack_scales(b + 4, sc, m);
  const uint8_t* qs = b + 16;
  for (int p = 0; p < 4; ++p)
    for (int l = 0; l < 32; ++l) {
      o->q[64 * p + l] = static_cast<int8_t>(qs[32 * p + l] & 15);
      o->q[64 * p + 32 + l] = static_cast<int8_t>(qs[32 * p + l] >> 4);
    }
  for (int j = 0; j < 16; ++j) {
    o->sc[j] = sc[j / 2];
    o->mn[j] = m[j / 2];
  }
  o->dA = half_at(b);
  o->dB = half_at(b + 2);
}

// Q5_K: element 64 p + 32 c + l (c = 0 low nibble, 1 high nibble of qs[32 p + l]); bit 4 is bit 2p + c of qh[l].
void decode_q5_k(const uint8_t* b, KBlockInts* o) {
  uint8_t sc[8], m[8];
  q4_k_unpack_scales(b + 4, sc, m);
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int p = 0; p < 4; ++p)
    for (int l = 0; l < 32; ++l) {
      o->q[64 * p + l] = static_cast<int8_t>((qs[32 * p + l] & 15) | ((qh[l] >> (2 * p)) & 1) << 4);
      o->q[64 * p + 32 + l] = static_cast<int8_t>((qs[32 * p + l] >> 4) | ((qh[l] >> (2 * p + 1)) & 1) << 4);
    }
  for (int j = 0; j < 16; ++j) {
    o->sc[j] = sc[j / 2];
    o->mn[j] = m[j / 2];
  }
  o->dA = half_at(b);
  o->dB = half_at(b + 2);
}

// The Q4_K quantiser with 5-bit codes (util/dtype.cpp quantize_q4_k documents the method).
void quantize_q5_k(const float* x, uint8_t* b) {
  float scales[8], mins[8], w[32], max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    fit_weights(x + 32 * j, 32, w);
    scales[j] = fit_scale_min(x + 32 * j, w, 32, 31, &mins[j]);
    max_scale = std::fmax(max_scale, scales[j]);
    max_min = std::fmax(max_min, mins[j]);
  }
  const uint16_t dh = f32_to_fp16(max_scale / 63), mh = f32_to_fp16(max_min / 63);
  const float d = fp16_to_f32(dh), dmin = fp16_to_f32(mh);
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(d > 0 ? round_clamp(scales[j] / d, 0, 63) : 0);
    m[j] = static_cast<uint8_t>(dmin > 0 ? round_clamp(mins[j] / dmin, 0, 63) : 0);
  }
  std::memset(b, 0, 176);
  put16(b, dh);
  put16(b + 2, mh);
  q4_k_pack_scales(sc, m, b + 4);
  for (int e = 0; e < 256; ++e) {
    const int j = e / 32;
    const float step = d * static_cast<float>(sc[j]), off = dmin * static_cast<float>(m[j]);
    const int code = step > 0 ? round_clamp((x[e] + off) / step, 0, 31) : 0;
    const int p = e / 64, c = (e / 32) % 2, l = e % 32;
    b[48 + 32 * p + l] = static_cast<uint8_t>(b[48 + 32 * p + l] | (code & 15) << (4 * c));
    b[16 + l] = static_cast<uint8_t>(b[16 + l] | (code >> 4) << (2 * p + c));
  }
}

// ---- Q2_K: scales[16] (low nibble scale, high nibble min) | qs[64] | f16 d | f16 dmin = 84 bytes -------
// Element 128 h + 32 j + l: code in bits 2j..2j+1 of qs[32 h + l]; value = d sc * code - dmin m per 16.
void decode_q2_k(const uint8_t* b, KBlockInts* o) {
  const uint8_t* qs = b + 16;
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128, j = (e % 128) / 32, l = e % 32;
    o->q[e] = static_cast<int8_t>((qs[32 * h + l] >> (2 * j)) & 3);
  }
  for (int j = 0; j < 16; ++j) {
    o->sc[j] = b[j] & 15;
    o->mn[j] = b[j] >> 4;
  }
  o->dA = half_at(b + 80);
  o->dB = half_at(b + 82);
}

void quantize_q2_k(const float* x, uint8_t* b) {
  float scales[16], mins[16], w[16], max_scale = 0, max_min = 0;
  for (int j = 0; j < 16; ++j) {
    fit_weights(x + 16 * j, 16, w);
    scales[j] = fit_scale_min(x + 16 * j, w, 16, 3, &mins[j]);
    max_scale = std::fmax(max_scale, scales[j]);
    max_min = std::fmax(max_min, mins[j]);
  }
  const uint16_t dh = f32_to_fp16(max_scale / 15), mh = f32_to_fp16(max_min / 15);
  const float d = fp16_to_f32(dh), dmin = fp16_to_f32(mh);
  std::memset(b, 0, 84);
  uint8_t sc[16], m[16];
  for (int j = 0; j < 16; ++j) {
    sc[j] = static_cast<uint8_t>(d > 0 ? round_clamp(scales[j] / d, 0, 15) : 0);
    m[j] = static_cast<uint8_t>(dmin > 0 ? round_clamp(mins[j] / dmin, 0, 15) : 0);
    b[j] = static_cast<uint8_t>(sc[j] | m[j] << 4);
  }
  put16(b + 80, dh);
  put16(b + 82, mh);
  for (int e = 0; e < 256; ++e) {
    const int s = e / 16;
    const float step = d * static_cast<float>(sc[s]), off = dmin * static_cast<float>(m[s]);
    const int code = step > 0 ? round_clamp((x[e] + off) / step, 0, 3) : 0;
    const int h = e / 128, j = (e % 128) / 32, l = e % 32;
    b[16 + 32 * h + l] = static_cast<uint8_t>(b[16 + 32 * h + l] | code << (2 * j));
  }
}

// ---- IQ4_XS: f16 d | u16 scales_h | scales_l[4] | qs[128] = 136 bytes ------------------------------------
// Sub-block ib (32 elements): 6-bit ls = low nibble (ib even) / high nibble (ib odd) of scales_l[ib / 2] |
// bits 2ib..2ib+1 of scales_h << 4; value = d (ls - 32) grid[nibble]; element j < 16 of the sub-block is the
// low nibble of qs[16 ib + j], element j + 16 its high nibble.
void decode_iq4_xs(const uint8_t* b, KBlockInts* o) {
  const uint16_t sh = get16(b + 2);
  for (int ib = 0; ib < 8; ++ib) {
    const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | ((sh >> (2 * ib)) & 3) << 4;
    o->sc[2 * ib] = o->sc[2 * ib + 1] = static_cast<int16_t>(ls - 32);
    o->mn[2 * ib] = o->mn[2 * ib + 1] = 0;
    for (int j = 0; j < 16; ++j) {
      o->q[32 * ib + j] = kIQ4Grid[b[8 + 16 * ib + j] & 15];
      o->q[32 * ib + 16 + j] = kIQ4Grid[b[8 + 16 * ib + j] >> 4];
    }
  }
  o->dA = half_at(b);
  o->dB = 0;
}

void quantize_iq4_xs(const float* x, uint8_t* b) {
  float s[8], smax = 0;
  for (int ib = 0; ib < 8; ++ib) {
    s[ib] = signed_max_of(x + 32 * ib, 32) / -127.0f;  // maps the extreme element to the grid's end -127
    smax = std::fmax(smax, std::fabs(s[ib]));
  }
  const uint16_t dh = f32_to_fp16(smax / 31.0f);
  const float d = fp16_to_f32(dh);
  std::memset(b, 0, 136);
  put16(b, dh);
  uint16_t sh = 0;
  for (int ib = 0; ib < 8; ++ib) {
    // |scale| rounded up so that |x / step| <= 127 (inside the grid's span).
    const int mag = d > 0 ? ceil_clamp(std::fabs(s[ib]) / d, 31) : 0;
    const int sc = s[ib] < 0 ? -mag : mag;
    const int ls = sc + 32;
    b[4 + ib / 2] = static_cast<uint8_t>(b[4 + ib / 2] | (ls & 15) << (4 * (ib % 2)));
    sh = static_cast<uint16_t>(sh | (ls >> 4) << (2 * ib));
    const float step = d * static_cast<float>(sc);
    for (int j = 0; j < 32; ++j) {
      const int k = step != 0 ? nearest_iq4(x[32 * ib + j] / step) : 8;
      uint8_t& q = b[8 + 16 * ib + j % 16];
      q = static_cast<uint8_t>(q | k << (j < 16 ? 0 : 4));
    }
  }
  put16(b + 2, sh);
}

}  // namespace

bool is_superblock_codec(DType t) {
  return t == DType::Q2_K || t == DType::Q3_K || t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K ||
         t == DType::IQ4_XS;
}

void decode_k_block(DType t, const uint8_t* blk, KBlockInts* out) {
  switch (t) {
    case DType::Q2_K: return decode_q2_k(blk, out);
    case DType::Q3_K: return decode_q3_k(blk, out);
    case DType::Q4_K: return decode_q4_k(blk, out);
    case DType::Q5_K: return decode_q5_k(blk, out);
    case DType::Q6_K: return decode_q6_k(blk, out);
    case DType::IQ4_XS: return decode_iq4_xs(blk, out);
    default: std::memset(out, 0, sizeof(*out));
  }
}

// quantize_b32 / dequantize_b32 live in quant_codecs_b32.cpp.
bool quantize_b32(DType t, const float* x, int64_t n, void* out);
bool dequantize_b32(DType t, const void* in, int64_t n, float* out);

bool quantize_codec(DType t, const float* x, int64_t n, void* out) {
  if (t == DType::Q4_K) {
    quantize_q4_k(x, n, out);
    return true;
  }
  void (*enc)(const float*, uint8_t*) = nullptr;
  switch (t) {
    case DType::Q2_K: enc = quantize_q2_k; break;
    case DType::Q3_K: enc = quantize_q3_k; break;
    case DType::Q5_K: enc = quantize_q5_k; break;
    case DType::Q6_K: enc = quantize_q6_k; break;
    case DType::IQ4_XS: enc = quantize_iq4_xs; break;
    default: return quantize_b32(t, x, n, out);
  }
  const uint32_t bytes = traits(t).block_bytes;
  auto* o = static_cast<uint8_t*>(out);
  for (int64_t k = 0; k < n / 256; ++k) enc(x + 256 * k, o + bytes * k);
  return true;
}

bool dequantize_codec(DType t, const void* in, int64_t n, float* out) {
  if (t == DType::Q4_K) {
    dequantize_q4_k(in, n, out);
    return true;
  }
  if (!is_superblock_codec(t)) return dequantize_b32(t, in, n, out);
  const uint32_t bytes = traits(t).block_bytes;
  const auto* b = static_cast<const uint8_t*>(in);
  KBlockInts k;
  for (int64_t blk = 0; blk < n / 256; ++blk, out += 256) {
    decode_k_block(t, b + bytes * blk, &k);
    for (int e = 0; e < 256; ++e) {
      const float step = k.dA * static_cast<float>(k.sc[e / 16]), off = k.dB * static_cast<float>(k.mn[e / 16]);
      out[e] = step * static_cast<float>(k.q[e]) - off;
    }
  }
  return true;
}

}  // namespace kvpack
