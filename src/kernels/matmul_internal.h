// Internal interface between the matmul driver (matmul.cpp) and the per-ISA kernel files
// (matmul_scalar.cpp, matmul_avx2.cpp, matmul_avx512.cpp). Not part of the public API.
//
// ODR hazard: the ISA files are compiled with -mavx2 / -mavx512*; any inline function or template they
// instantiate from a shared header (std::min, std::vector, kvpack::fp16_to_f32, ...) may be emitted as a
// weak symbol that the linker then also uses for baseline callers -> SIGILL on older CPUs. So this
// header holds only PODs, constants and declarations, and the ISA files include nothing but this,
// <immintrin.h>, <cstdint> and <cstddef>, keep all helpers `static`/in anonymous namespaces, and use no
// std templates. One exception: kquant_decode_ymm.inc (super-block weight decoders shared by the AVX2 and
// AVX-512 files) is #included *inside* each file's anonymous namespace, so every copy has internal linkage.
#pragma once
#include <cstddef>
#include <cstdint>

namespace kvpack::kernels::detail {

// Weight encodings the kernels handle (index into IsaKernels::rows). Activation formats: kQ8_0 .. kQ4_0 and
// kQ5_0 .. kIQ4_NL take 32-element int8 blocks (ActLayout); the super-block kinds kQ4_K .. kIQ4_XS take
// 256-element int8 super-blocks with one scale each (ActLayoutK, like ggml's Q8_K).
enum WKind : int {
  kF32 = 0, kF16 = 1, kBF16 = 2, kQ8_0 = 3, kQ4_0 = 4,
  kQ4_K = 5, kQ6_K = 6, kQ5_K = 7, kQ3_K = 8, kQ2_K = 9, kIQ4_XS = 10,  // ActLayoutK
  kQ5_0 = 11, kQ5_1 = 12, kIQ4_NL = 13,                               // ActLayout
  kNumWKinds = 14
};

constexpr int kQBlock = 32;    // elements per Q8_0 / Q4_0 / Q5_0 / Q5_1 / IQ4_NL block, per activation block
constexpr int kQKBlock = 256;  // elements per super-block (K-quants, IQ4_XS, ActLayoutK)
constexpr int kQ4KBytes = 144;

// Q4_K block (ggml block_q4_K, layout in util/dtype.h): f16 d at +0, f16 dmin at +2, 12 packed scale
// bytes at +4, 128 nibble bytes at +16. The packed 6-bit scales unpack with 32-bit word operations:
// with u0, u1, u2 the little-endian words at +4, +8, +12,
//   sc[0..3] = bytes of u0 & 0x3f3f3f3f
//   sc[4..7] = bytes of (u2 & 0x0f0f0f0f) | ((u0 >> 6) & 0x03030303) << 4
//   m[0..3]  = bytes of u1 & 0x3f3f3f3f
//   m[4..7]  = bytes of ((u2 >> 4) & 0x0f0f0f0f) | ((u1 >> 6) & 0x03030303) << 4

// Quantised activations for the integer-dot kernels (Q8_0, Q4_0 and Q4_K weights). Layout of one token
// (nb = n_in / 32 blocks), same for every ISA so the quantisation is bit-identical across paths:
//   int8_t  qs[nb][32]      q = round_nearest_even(x * id), id = 127 / amax (0 if amax == 0)
//   float   d8[nb][8]       d = act_block_scale(amax) (amax / 127 at f16 precision), replicated 8x (a ready-made ymm/zmm scale operand)
//   int32_t bias8[nb][8]    lane 0 = -K * sum(qs of block), lanes 1..7 = 0. K is the offset the
//                           ISA's unsigned x signed dot trick needs (see act_bias_k); 0 = unused.
//   float   xsum[nb]        d * (float)sum(qs of block) (one f32 rounding; Q4_K's min term)
//   float   dc[nb]          d, compact (Q4_K: 8 sub-block scales with one load)
// The token stride is rounded up to 64 bytes; every part starts 64-byte aligned when the base is.
struct ActLayout {
  size_t qs_off, d_off, bias_off, sum_off, dc_off, stride;
};
// Defined in matmul.cpp (not inline here: see the ODR note above); the driver passes it to the kernels.
ActLayout act_layout(int64_t n_in);
// d of an activation block: amax / 127 rounded to f16 and back, as ggml stores block_q8_0's d, so the
// products with Q8_0 / Q4_0 / Q5_0 / Q5_1 / IQ4_NL weights use llama.cpp's scale to the last bit
// (docs/performance.md §1c); the integers are still rounded with the exact 127 / amax, as ggml does.
float act_block_scale(float amax);

// Quantised activations for the super-block kinds (ggml's Q8_K idea: one scale per 256 elements, so a
// super-block's integer dot products add up in int32 and cost one convert + FMA per super-block). Layout of
// one token (nsb = n_in / 256), same for every ISA so the quantisation is bit-identical across paths:
//   int8_t  qs[nsb][256]    q = round_nearest_even(x * id), id = 127 / amax (0 if amax == 0), |q| <= 127
//   int16_t bsums[nsb][16]  sum of the 16 q of each 16-element group (mins and code offsets)
//   float   d[nsb]          amax / 127
// The token stride is rounded up to 64 bytes; every part starts 64-byte aligned when the base is.
struct ActLayoutK {
  size_t qs_off, bsum_off, d_off, stride;
};
ActLayoutK act_layout_k(int64_t n_in);

// Arguments of one rows kernel call: rows [r0, r1) x tokens [0, n_tokens) of the chunk.
//   weight row r   : W + r * row_bytes
//   token t input  : (const char*)x + t * x_stride   (f32 row for F types, quantised ActLayout token for Q)
//   output         : y[t * y_stride + r]
struct RowsArgs {
  const uint8_t* W;
  size_t row_bytes;
  int64_t n_in;
  int64_t r0, r1;
  const void* x;
  size_t x_stride;
  int64_t n_tokens;
  float* y;
  int64_t y_stride;
  ActLayout act;    // 32-block kinds only
  ActLayoutK actk;  // super-block kinds only
};

using RowsFn = void (*)(const RowsArgs& a);
// Quantises one token of f32 activations into ActLayout form; bias_k as described above.
using QuantActFn = void (*)(const float* x, int64_t n_in, int bias_k, const ActLayout& layout, void* out);
using QuantActKFn = void (*)(const float* x, int64_t n_in, const ActLayoutK& layout, void* out);

struct IsaKernels {
  RowsFn rows[kNumWKinds];  // nullptr = this ISA has no kernel for the kind (driver falls back to scalar)
  QuantActFn quant_act;
  int bias_k[kNumWKinds];   // K for ActLayout::bias8 per weight kind (0 if the kernel ignores bias8)
  QuantActKFn quant_act_k;
};

const IsaKernels& kernels_scalar();
const IsaKernels& kernels_avx2();    // only call when cpu_supports(Isa::Avx2)
const IsaKernels& kernels_avx512();  // only call when cpu_supports(Isa::Avx512)

// Q8_0 weights in the packed layout of kernels/matmul_packed.h x ActLayout activations quantised with
// bias K = 128 (bias8 lane 0 = -128 * sum(qs)). Groups [g0, g1) of 16 rows x tokens [0, n_tokens):
//   group g        : W + g * group_bytes (nb records of 544 bytes)
//   token t input  : x + t * x_stride
//   output         : y[t * y_stride + 16 g + r] for the rows 16 g + r < n_out
struct PackedArgs {
  const uint8_t* W;
  size_t group_bytes;
  int64_t nb;
  int64_t g0, g1;
  int64_t n_out;
  const uint8_t* x;
  size_t x_stride;
  int64_t n_tokens;
  float* y;
  int64_t y_stride;
  ActLayout act;
};
// The same for PackedQ4K: nb counts 256-element super-blocks, activations in ActLayoutK.
struct PackedArgsK {
  const uint8_t* W;
  size_t group_bytes;
  int64_t nsb;
  int64_t g0, g1;
  int64_t n_out;
  const uint8_t* x;
  size_t x_stride;
  int64_t n_tokens;
  float* y;
  int64_t y_stride;
  ActLayoutK act;
};
using PackedKFn = void (*)(const PackedArgsK& a);
void packed_q4k_scalar(const PackedArgsK& a);  // matmul_packed.cpp
void packed_q4k_avx512(const PackedArgsK& a);  // matmul_avx512.cpp; only when cpu_supports(Isa::Avx512)
using PackedFn = void (*)(const PackedArgs& a);
void packed_q8_scalar(const PackedArgs& a);  // matmul_packed.cpp
void packed_q8_avx512(const PackedArgs& a);  // matmul_avx512.cpp; only when cpu_supports(Isa::Avx512)

// Super-block kernels, one file per ISA (matmul_kquant_{scalar,avx2,avx512}.cpp), indexed by
// WKind - kQ4_K (Q4_K, Q6_K, Q5_K, Q3_K, Q2_K, IQ4_XS).
constexpr int kNumKKinds = kIQ4_XS - kQ4_K + 1;
extern const RowsFn kRowsKScalar[kNumKKinds];
extern const RowsFn kRowsKAvx2[kNumKKinds];
extern const RowsFn kRowsKAvx512[kNumKKinds];
void quant_act_k_scalar(const float* x, int64_t n_in, const ActLayoutK& layout, void* out);
void quant_act_k_avx2(const float* x, int64_t n_in, const ActLayoutK& layout, void* out);
void quant_act_k_avx512(const float* x, int64_t n_in, const ActLayoutK& layout, void* out);
// 32-block kinds beyond Q8_0 / Q4_0 (Q5_0, Q5_1, IQ4_NL), scalar path (matmul_kquant_scalar.cpp).
extern const RowsFn kRowsB32Scalar[3];

}  // namespace kvpack::kernels::detail
