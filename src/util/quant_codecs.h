// Reference codecs of the ggml weight types beyond F32/F16/BF16/Q8_0/Q4_0/Q4_K: Q2_K, Q3_K, Q5_K, Q6_K,
// IQ4_XS (256-element super-blocks) and Q5_0, Q5_1, IQ4_NL (32-element blocks). Byte layouts are ggml's
// (block_q6_K etc. in ggml-common.h; structs in kernels/quant.h), so llama.cpp's files load unchanged.
// They live in the lowest layer because the GGUF model writer and the kernels both need them.
//
// Every type decodes through an integer form shared by the dequantiser, the scalar kernels and the
// tests' references:
//   super-block types (KBlockInts): value_i = (dA * sc[i / 16]) * q[i] - dB * mn[i / 16], with int8 q,
//     int16 per-16 scales sc and mins mn (types with 32-wide sub-blocks repeat each scale twice), f32 dA,
//     dB (the block's f16 d and dmin; dB = 0 without mins). dA * sc is exact in f32, as in ggml.
//   32-blocks (B32Ints): value_i = d * q[i] + m (m = 0 except Q5_1).
//
// The quantisers are simple reference encoders written for this project (not ggml's searches, not
// bit-identical to llama.cpp's quantize tool): symmetric types pick each sub-block's step so that no code
// clamps (error <= half a step), types with mins reuse the Q4_K weighted least-squares fit. Their
// round-trip bounds are documented per type below and tested in kernels_quant_test.cpp.
#pragma once
#include <cstdint>

#include "util/dtype.h"

namespace kvpack {

struct KBlockInts {
  int8_t q[256];
  int16_t sc[16];
  int16_t mn[16];
  float dA, dB;
};

struct B32Ints {
  int8_t q[32];
  float d, m;
};

// IQ4_NL / IQ4_XS non-uniform 4-bit grid (ggml's kvalues_iq4nl).
inline constexpr int8_t kIQ4Grid[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// Types handled by decode_k_block (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) / decode_b32_block (Q5_0, Q5_1, IQ4_NL).
bool is_superblock_codec(DType t);
bool is_block32_codec(DType t);
void decode_k_block(DType t, const uint8_t* blk, KBlockInts* out);
void decode_b32_block(DType t, const uint8_t* blk, B32Ints* out);

// n must be a multiple of the type's block (checked by callers). Return false for types not listed above
// (Q4_K is listed: it forwards to quantize_q4_k / dequantize_q4_k in util/dtype.h).
//
// Round-trip bounds (x an element, amax / range of its sub-block, step the decoded per-element step):
//   Q6_K  : 16 x 16, q in [-32, 31], 8-bit scales: step_j = d sc_j >= amax_j / 31, |err| <= step_j / 2,
//           step_j <= amax_j / 31 + d (one unit of the scale).
//   Q3_K  : 16 x 16, q in [-4, 3] (used: -3..3), 6-bit scales: same with 3 and 31 (d = max step / 31).
//   Q5_K  : 8 x 32, q in 0..31, 6-bit scale and min per 32: the Q4_K fit, |err| <= widest range / 31.
//   Q2_K  : 16 x 16, q in 0..3, 4-bit scale and min per 16: |err| <= widest range of the super-block / 3.
//   IQ4_XS: 8 x 32, grid values, 6-bit signed scales: |err| <= 14 |step_j| (the grid's largest half gap
//           is 12 units, its positive end 113 is 14 short of 127), |step_j| <= amax_j / 127 + d.
//   IQ4_NL: 32, grid values, f16 d = -(signed max) / 127: |err| <= 14 |d| (1 + 2^-10).
//   Q5_0  : as Q4_0 with 5 bits: d = -(signed max) / 16; |err| <= |d| (1 + 16 * 2^-11).
//   Q5_1  : d = (max - min) / 31, m = min (both f16): |err| <= d / 2 + 2^-10 (|min| + max - min).
bool quantize_codec(DType t, const float* x, int64_t n, void* out);
bool dequantize_codec(DType t, const void* in, int64_t n, float* out);

}  // namespace kvpack
