// Portable kernels: the reference path of the dispatcher and the fallback on CPUs without AVX2.
// Plain C++ (no intrinsics); the compiler may auto-vectorise for the baseline ISA.
#include <cstring>

#include "kernels/matmul_internal.h"
#include "kernels/quant.h"
#include "util/half.h"

namespace kvpack::kernels::detail {
namespace {

// Round to nearest, ties to even, for |v| < 2^22 (here |v| <= 127.5): the float addition rounds away the
// fraction exactly like cvtps2dq does under the default MXCSR, so every ISA quantises identically
// (and no libm call, unlike nearbyintf on baseline x86-64).
inline int round_even_small(float v) {
  const float magic = 12582912.0f;  // 1.5 * 2^23
  const float r = (v + magic) - magic;
  return r == r ? static_cast<int>(r) : 0;
}

void quant_act_scalar(const float* x, int64_t n_in, int bias_k, const ActLayout& L, void* out) {
  auto* base = static_cast<uint8_t*>(out);
  auto* qs = reinterpret_cast<int8_t*>(base + L.qs_off);
  auto* d8 = reinterpret_cast<float*>(base + L.d_off);
  auto* b8 = reinterpret_cast<int32_t*>(base + L.bias_off);
  auto* xsum = reinterpret_cast<float*>(base + L.sum_off);
  const int64_t nb = n_in / kQBlock;
  for (int64_t b = 0; b < nb; ++b) {
    const float* v = x + b * kQBlock;
    float amax = 0.0f;
    for (int i = 0; i < kQBlock; ++i) {
      const float a = v[i] < 0 ? -v[i] : v[i];
      amax = a > amax ? a : amax;
    }
    const float d = act_block_scale(amax);
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (int i = 0; i < kQBlock; ++i) {
      const int q = round_even_small(v[i] * id);
      qs[b * kQBlock + i] = static_cast<int8_t>(q);
      sum += q;
    }
    for (int k = 0; k < 8; ++k) {
      d8[b * 8 + k] = d;
      b8[b * 8 + k] = 0;
    }
    b8[b * 8] = -bias_k * sum;
    xsum[b] = d * static_cast<float>(sum);
    reinterpret_cast<float*>(base + L.dc_off)[b] = d;
  }
}

template <class Conv>
void rows_float(const RowsArgs& a, Conv conv) {
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    const float* x = reinterpret_cast<const float*>(static_cast<const char*>(a.x) + t * a.x_stride);
    for (int64_t r = a.r0; r < a.r1; ++r) {
      const uint8_t* row = a.W + r * a.row_bytes;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int64_t i = 0;
      for (; i + 8 <= a.n_in; i += 8)
        for (int k = 0; k < 8; ++k) acc[k] += conv(row, i + k) * x[i + k];
      for (; i < a.n_in; ++i) acc[0] += conv(row, i) * x[i];
      a.y[t * a.y_stride + r] = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    }
  }
}

void rows_f32(const RowsArgs& a) {
  rows_float(a, [](const uint8_t* row, int64_t i) { return reinterpret_cast<const float*>(row)[i]; });
}
// Branch-light fp16 -> f32 (exact, same results as fp16_to_f32): shift exponent+mantissa into place and
// rescale by 2^112, which also normalises subnormals exactly; only inf/NaN (exponent 31) need a fix-up.
// ~20x faster than the branchy reference helper in this loop.
inline float fp16_to_f32_fast(uint16_t h) {
  const uint32_t em = static_cast<uint32_t>(h & 0x7fffu) << 13;
  float f = bits_to_f32(em) * 0x1p112f;
  if ((h & 0x7c00u) == 0x7c00u) f = bits_to_f32(em | 0x7f800000u);
  return bits_to_f32(f32_to_bits(f) | static_cast<uint32_t>(h & 0x8000u) << 16);
}

void rows_f16(const RowsArgs& a) {
  rows_float(a, [](const uint8_t* row, int64_t i) {
    return fp16_to_f32_fast(reinterpret_cast<const uint16_t*>(row)[i]);
  });
}
void rows_bf16(const RowsArgs& a) {
  rows_float(a, [](const uint8_t* row, int64_t i) { return bf16_to_f32(reinterpret_cast<const uint16_t*>(row)[i]); });
}

// Integer dot per block against the quantised activations, then one float multiply-add per block.
template <class BlockDot>
void rows_q(const RowsArgs& a, size_t block_bytes, BlockDot dot) {
  const int64_t nb = a.n_in / kQBlock;
  for (int64_t t = 0; t < a.n_tokens; ++t) {
    const auto* act = static_cast<const uint8_t*>(a.x) + t * a.x_stride;
    const auto* qs = reinterpret_cast<const int8_t*>(act + a.act.qs_off);
    const auto* d8 = reinterpret_cast<const float*>(act + a.act.d_off);
    for (int64_t r = a.r0; r < a.r1; ++r) {
      const uint8_t* row = a.W + r * a.row_bytes;
      float acc0 = 0.0f, acc1 = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = row + b * block_bytes;
        uint16_t dh;
        std::memcpy(&dh, blk, 2);
        const float scale = fp16_to_f32(dh) * d8[b * 8];
        const float v = scale * static_cast<float>(dot(blk + 2, qs + b * kQBlock));
        if (b & 1) acc1 += v; else acc0 += v;
      }
      a.y[t * a.y_stride + r] = acc0 + acc1;
    }
  }
}

void rows_q8_0(const RowsArgs& a) {
  rows_q(a, sizeof(BlockQ8_0), [](const uint8_t* w, const int8_t* x) {
    int32_t s = 0;
    for (int i = 0; i < kQBlock; ++i) s += static_cast<int8_t>(w[i]) * x[i];
    return s;
  });
}

void rows_q4_0(const RowsArgs& a) {
  rows_q(a, sizeof(BlockQ4_0), [](const uint8_t* w, const int8_t* x) {
    int32_t s = 0;
    for (int j = 0; j < 16; ++j) s += ((w[j] & 0x0f) - 8) * x[j] + ((w[j] >> 4) - 8) * x[j + 16];
    return s;
  });
}

}  // namespace

const IsaKernels& kernels_scalar() {
  static const IsaKernels k = {
      {rows_f32, rows_f16, rows_bf16, rows_q8_0, rows_q4_0, kRowsKScalar[0], kRowsKScalar[1], kRowsKScalar[2],
       kRowsKScalar[3], kRowsKScalar[4], kRowsKScalar[5], kRowsB32Scalar[0], kRowsB32Scalar[1], kRowsB32Scalar[2]},
      quant_act_scalar,
      {},
      quant_act_k_scalar,
  };
  return k;
}

}  // namespace kvpack::kernels::detail
