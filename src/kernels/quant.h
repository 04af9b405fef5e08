// ggml-compatible block layouts of the quantised weight types the kernels read and write.
//   Q8_0: 32 elements, value_i = d * qs[i]                      (34 bytes)
//   Q4_0: 32 elements, value_i = d * (nibble_i - 8); qs[j] holds element j in its low nibble and
//         element j + 16 in its high nibble                      (18 bytes)
//   Q4_K: 256 elements in 8 sub-blocks of 32, value = (d * sc[j]) * nibble - (dmin * m[j]) with 6-bit
//         sc/m per sub-block j; nibble layout and scale packing in util/dtype.h   (144 bytes)
//   Q6_K, Q5_K, Q3_K, Q2_K, IQ4_XS (256 elements) and Q5_0, Q5_1, IQ4_NL (32): ggml's block_* layouts below;
//         element order, scale packing and codecs in util/quant_codecs.h / quant_codecs_{k,b32}.cpp.
// d (and dmin) are IEEE halves. Blocks are packed with no padding (rows are arrays of blocks, 2-byte aligned).
// Row-level conversions (dequantize_row / quantize_row) are declared in kernels/matmul.h.
#pragma once
#include <cstdint>

namespace kvpack::kernels {

constexpr int kQ8_0Block = 32;
constexpr int kQ4_0Block = 32;

struct BlockQ8_0 {
  uint16_t d;  // fp16 scale
  int8_t qs[32];
};
static_assert(sizeof(BlockQ8_0) == 34, "ggml block_q8_0 layout");

struct BlockQ4_0 {
  uint16_t d;  // fp16 scale
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_0) == 18, "ggml block_q4_0 layout");

constexpr int kQ4_KBlock = 256;

struct BlockQ4_K {
  uint16_t d;          // fp16 super-block scale of the sub-block scales
  uint16_t dmin;       // fp16 super-block scale of the sub-block mins
  uint8_t scales[12];  // 8 x 6-bit scales + 8 x 6-bit mins, packed (util/dtype.h)
  uint8_t qs[128];     // nibbles
};
static_assert(sizeof(BlockQ4_K) == 144, "ggml block_q4_K layout");

struct BlockQ6_K {
  uint8_t ql[128];    // low 4 bits of the 6-bit codes
  uint8_t qh[64];     // high 2 bits
  int8_t scales[16];  // one signed 8-bit scale per 16 elements
  uint16_t d;         // fp16 super-block scale
};
static_assert(sizeof(BlockQ6_K) == 210, "ggml block_q6_K layout");

struct BlockQ5_K {
  uint16_t d, dmin;    // fp16 scales of the 6-bit sub-block scales / mins
  uint8_t scales[12];  // packed as Q4_K
  uint8_t qh[32];      // bit 4 of the codes
  uint8_t qs[128];     // low 4 bits
};
static_assert(sizeof(BlockQ5_K) == 176, "ggml block_q5_K layout");

struct BlockQ3_K {
  uint8_t hmask[32];   // bit 2 of the codes
  uint8_t qs[64];      // low 2 bits
  uint8_t scales[12];  // 16 x 6-bit scales (offset 32)
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110, "ggml block_q3_K layout");

struct BlockQ2_K {
  uint8_t scales[16];  // per 16 elements: scale (low nibble), min (high nibble)
  uint8_t qs[64];      // 2-bit codes
  uint16_t d, dmin;
};
static_assert(sizeof(BlockQ2_K) == 84, "ggml block_q2_K layout");

struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;   // bits 4-5 of the 8 sub-block scales
  uint8_t scales_l[4]; // bits 0-3
  uint8_t qs[128];     // grid indices (nibbles)
};
static_assert(sizeof(BlockIQ4_XS) == 136, "ggml block_iq4_xs layout");

struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // bit 4 of element j is bit j of this little-endian word
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_0) == 22, "ggml block_q5_0 layout");

struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_1) == 24, "ggml block_q5_1 layout");

struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[16];
};
static_assert(sizeof(BlockIQ4_NL) == 18, "ggml block_iq4_nl layout");

}  // namespace kvpack::kernels
