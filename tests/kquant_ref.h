// ggml's dequantize_row_* for the weight types added beside Q4_K (Q6_K, Q5_K, Q3_K, Q2_K, IQ4_XS, Q5_0, Q5_1,
// IQ4_NL), restated from ggml-quants.c's loop structure with pointer walks, independently of
// util/quant_codecs_*.cpp's element-index formulation. One block in, f32 values out, with ggml's f32 operation
// order, so the library's dequantiser must match bit for bit.
#pragma once
#include <cstdint>
#include <cstring>

#include "util/dtype.h"
#include "util/half.h"

namespace kvpack::test {

inline float ref_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_f32(h);
}

inline constexpr int8_t kRefIQ4[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// ggml's get_scale_min_k4.
inline void ref_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
  }
}

inline void ref_decode(DType t, const uint8_t* b, float* y) {
  switch (t) {
    case DType::Q6_K: {
      const uint8_t* ql = b;
      const uint8_t* qh = b + 128;
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      const float d = ref_half(b + 208);
      for (int n = 0; n < 256; n += 128) {
        for (int l = 0; l < 32; ++l) {
          const int is = l / 16;
          const int q1 = ((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
          const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
          const int q3 = ((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
          const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
          y[l + 0] = d * sc[is + 0] * q1;
          y[l + 32] = d * sc[is + 2] * q2;
          y[l + 64] = d * sc[is + 4] * q3;
          y[l + 96] = d * sc[is + 6] * q4;
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
      }
      return;
    }
    case DType::Q5_K: {
      const float d = ref_half(b), min = ref_half(b + 2);
      const uint8_t* scales = b + 4;
      const uint8_t* qh = b + 16;
      const uint8_t* ql = b + 48;
      int is = 0;
      uint8_t sc, m, u1 = 1, u2 = 2;
      for (int j = 0; j < 256; j += 64) {
        ref_scale_min_k4(is + 0, scales, &sc, &m);
        const float d1 = d * sc, m1 = min * m;
        ref_scale_min_k4(is + 1, scales, &sc, &m);
        const float d2 = d * sc, m2 = min * m;
        for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
        for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        ql += 32;
        is += 2;
        u1 = static_cast<uint8_t>(u1 << 2);
        u2 = static_cast<uint8_t>(u2 << 2);
      }
      return;
    }
    case DType::Q3_K: {
      const uint8_t* hm = b;
      const uint8_t* q = b + 32;
      const float d_all = ref_half(b + 108);
      uint32_t aux[4];
      std::memcpy(aux, b + 96, 12);
      const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f, tmp = aux[2];
      aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
      aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
      aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
      aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
      int8_t scales[16];
      std::memcpy(scales, aux, 16);
      int is = 0;
      uint8_t m = 1;
      for (int n = 0; n < 256; n += 128) {
        int shift = 0;
        for (int j = 0; j < 4; ++j) {
          float dl = d_all * (scales[is++] - 32);
          for (int l = 0; l < 16; ++l) *y++ = dl * ((int8_t)((q[l + 0] >> shift) & 3) - ((hm[l + 0] & m) ? 0 : 4));
          dl = d_all * (scales[is++] - 32);
          for (int l = 0; l < 16; ++l) *y++ = dl * ((int8_t)((q[l + 16] >> shift) & 3) - ((hm[l + 16] & m) ? 0 : 4));
          shift += 2;
          m = static_cast<uint8_t>(m << 1);
        }
        q += 32;
      }
      return;
    }
    case DType::Q2_K: {
      const float d = ref_half(b + 80), min = ref_half(b + 82);
      const uint8_t* q = b + 16;
      int is = 0;
      for (int n = 0; n < 256; n += 128) {
        int shift = 0;
        for (int j = 0; j < 4; ++j) {
          uint8_t sc = b[is++];
          float dl = d * (sc & 0xF), ml = min * (sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * ((int8_t)((q[l] >> shift) & 3)) - ml;
          sc = b[is++];
          dl = d * (sc & 0xF);
          ml = min * (sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * ((int8_t)((q[l + 16] >> shift) & 3)) - ml;
          shift += 2;
        }
        q += 32;
      }
      return;
    }
    case DType::IQ4_XS: {
      const float d = ref_half(b);
      uint16_t scales_h;
      std::memcpy(&scales_h, b + 2, 2);
      const uint8_t* scales_l = b + 4;
      const uint8_t* qs = b + 8;
      for (int ib = 0; ib < 8; ++ib) {
        const int ls = ((scales_l[ib / 2] >> 4 * (ib % 2)) & 0xf) | (((scales_h >> 2 * ib) & 3) << 4);
        const float dl = d * (ls - 32);
        for (int j = 0; j < 16; ++j) {
          y[j + 0] = dl * kRefIQ4[qs[j] & 0xf];
          y[j + 16] = dl * kRefIQ4[qs[j] >> 4];
        }
        y += 32;
        qs += 16;
      }
      return;
    }
    case DType::Q5_0:
    case DType::Q5_1: {
      const bool one = t == DType::Q5_1;
      const float d = ref_half(b), m = one ? ref_half(b + 2) : 0.0f;
      uint32_t qh;
      std::memcpy(&qh, b + (one ? 4 : 2), 4);
      const uint8_t* qs = b + (one ? 8 : 6);
      for (int j = 0; j < 16; ++j) {
        const uint8_t xh_0 = ((qh >> (j + 0)) << 4) & 0x10;
        const uint8_t xh_1 = ((qh >> (j + 12))) & 0x10;
        const int x0 = ((qs[j] & 0x0F) | xh_0) - (one ? 0 : 16);
        const int x1 = ((qs[j] >> 4) | xh_1) - (one ? 0 : 16);
        y[j] = one ? x0 * d + m : x0 * d;
        y[j + 16] = one ? x1 * d + m : x1 * d;
      }
      return;
    }
    case DType::IQ4_NL: {
      const float d = ref_half(b);
      for (int j = 0; j < 16; ++j) {
        y[j] = d * kRefIQ4[b[2 + j] & 0xf];
        y[j + 16] = d * kRefIQ4[b[2 + j] >> 4];
      }
      return;
    }
    default: return;
  }
}

}  // namespace kvpack::test
