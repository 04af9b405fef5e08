// 32-element block codecs: Q5_0, Q5_1, IQ4_NL (util/quant_codecs.h). Byte offsets are ggml's
// (block_q5_0 / block_q5_1 / block_iq4_nl; structs in kernels/quant.h).
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

float signed_max_of(const float* x) {
  float a = 0, v = 0;
  for (int i = 0; i < 32; ++i)
    if (std::fabs(x[i]) > a) {
      a = std::fabs(x[i]);
      v = x[i];
    }
  return v;
}

// 5-bit codes c[32] of Q5_0 / Q5_1 from: qh (32 bits: bit j is bit 4 of element j) and qs[16] (element j
// in the low nibble of qs[j], element j + 16 in its high nibble).
void unpack5(const uint8_t* qh4, const uint8_t* qs, int* c) {
  uint32_t qh;
  std::memcpy(&qh, qh4, 4);
  for (int j = 0; j < 16; ++j) {
    c[j] = (qs[j] & 15) | static_cast<int>((qh >> j) & 1) << 4;
    c[j + 16] = (qs[j] >> 4) | static_cast<int>((qh >> (j + 16)) & 1) << 4;
  }
}
void pack5(const int* c, uint8_t* qh4, uint8_t* qs) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((c[j] & 15) | (c[j + 16] & 15) << 4);
    qh |= static_cast<uint32_t>(c[j] >> 4) << j | static_cast<uint32_t>(c[j + 16] >> 4) << (j + 16);
  }
  std::memcpy(qh4, &qh, 4);
}

// Q5_0: f16 d | qh[4] | qs[16] = 22 bytes; value = d (code - 16).
void decode_q5_0(const uint8_t* b, B32Ints* o) {
  int c[32];
  unpack5(b + 2, b + 6, c);
  for (int i = 0; i < 32; ++i) o->q[i] = static_cast<int8_t>(c[i] - 16);
  o->d = fp16_to_f32(get16(b));
  o->m = 0;
}
// As Q4_0 (kernels/quant.cpp): d = (signed max) / -16 maps the extreme element to code 0; codes of the
// opposite sign near -max clamp to 31 (error up to one step), everything else is within half a step.
void quantize_q5_0(const float* x, uint8_t* b) {
  const float d = signed_max_of(x) / -16.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put16(b, f32_to_fp16(d));
  int c[32];
  for (int i = 0; i < 32; ++i) {
    const float q = x[i] * id + 16.5f;
    c[i] = q >= 31.0f ? 31 : q > 0.0f ? static_cast<int>(q) : 0;
  }
  pack5(c, b + 2, b + 6);
}

// Q5_1: f16 d | f16 m | qh[4] | qs[16] = 24 bytes; value = d code + m.
void decode_q5_1(const uint8_t* b, B32Ints* o) {
  int c[32];
  unpack5(b + 4, b + 8, c);
  for (int i = 0; i < 32; ++i) o->q[i] = static_cast<int8_t>(c[i]);
  o->d = fp16_to_f32(get16(b));
  o->m = fp16_to_f32(get16(b + 2));
}
void quantize_q5_1(const float* x, uint8_t* b) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < 32; ++i) {
    lo = std::fmin(lo, x[i]);
    hi = std::fmax(hi, x[i]);
  }
  const uint16_t dh = f32_to_fp16((hi - lo) / 31.0f), mh = f32_to_fp16(lo);
  const float d = fp16_to_f32(dh), m = fp16_to_f32(mh);
  put16(b, dh);
  put16(b + 2, mh);
  int c[32];
  for (int i = 0; i < 32; ++i) c[i] = d > 0 ? round_clamp((x[i] - m) / d, 0, 31) : 0;
  pack5(c, b + 4, b + 8);
}

// IQ4_NL: f16 d | qs[16] = 18 bytes; value = d grid[nibble], nibbles as Q4_0.
void decode_iq4_nl(const uint8_t* b, B32Ints* o) {
  for (int j = 0; j < 16; ++j) {
    o->q[j] = kIQ4Grid[b[2 + j] & 15];
    o->q[j + 16] = kIQ4Grid[b[2 + j] >> 4];
  }
  o->d = fp16_to_f32(get16(b));
  o->m = 0;
}
void quantize_iq4_nl(const float* x, uint8_t* b) {
  const uint16_t dh = f32_to_fp16(signed_max_of(x) / -127.0f);  // the extreme element -> grid end -127
  const float d = fp16_to_f32(dh);
  put16(b, dh);
  for (int j = 0; j < 16; ++j) b[2 + j] = 0;
  for (int i = 0; i < 32; ++i) {
    int k = 8;  // grid value 1: nearest to 0 (an all-zero block has d = 0 and decodes to 0 anyway)
    if (d != 0) {
      const float t = x[i] / d;
      float best = std::fabs(t - kIQ4Grid[0]);
      k = 0;
      for (int g = 1; g < 16; ++g)
        if (std::fabs(t - kIQ4Grid[g]) < best) {
          best = std::fabs(t - kIQ4Grid[g]);
          k = g;
        }
    }
    b[2 + i % 16] = static_cast<uint8_t>(b[2 + i % 16] | k << (i < 16 ? 0 : 4));
  }
}

}  // namespace

bool is_block32_codec(DType t) { return t == DType::Q5_0 || t == DType::Q5_1 || t == DType::IQ4_NL; }

void decode_b32_block(DType t, const uint8_t* blk, B32Ints* out) {
  switch (t) {
    case DType::Q5_0: return decode_q5_0(blk, out);
    case DType::Q5_1: return decode_q5_1(blk, out);
    case DType::IQ4_NL: return decode_iq4_nl(blk, out);
    default: std::memset(out, 0, sizeof(*out));
  }
}

bool quantize_b32(DType t, const float* x, int64_t n, void* out) {
  void (*enc)(const float*, uint8_t*) = nullptr;
  switch (t) {
    case DType::Q5_0: enc = quantize_q5_0; break;
    case DType::Q5_1: enc = quantize_q5_1; break;
    case DType::IQ4_NL: enc = quantize_iq4_nl; break;
    default: return false;
  }
  const uint32_t bytes = traits(t).block_bytes;
  auto* o = static_cast<uint8_t*>(out);
  for (int64_t k = 0; k < n / 32; ++k) enc(x + 32 * k, o + bytes * k);
  return true;
}

bool dequantize_b32(DType t, const void* in, int64_t n, float* out) {
  if (!is_block32_codec(t)) return false;
  const uint32_t bytes = traits(t).block_bytes;
  const auto* b = static_cast<const uint8_t*>(in);
  B32Ints k;
  for (int64_t blk = 0; blk < n / 32; ++blk, out += 32) {
    decode_b32_block(t, b + bytes * blk, &k);
    for (int i = 0; i < 32; ++i) out[i] = k.d * static_cast<float>(k.q[i]) + k.m;
  }
  return true;
}

}  // namespace kvpack
