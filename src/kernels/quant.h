// ggml-compatible block layouts of the quantised weight types the kernels read and write.
//   Q8_0: 32 elements, value_i = d * qs[i]                      (34 bytes)
//   Q4_0: 32 elements, value_i = d * (nibble_i - 8); qs[j] holds element j in its low nibble and
//         element j + 16 in its high nibble                      (18 bytes)
//   Q4_K: 256 elements in 8 sub-blocks of 32, value = (d * sc[j]) * nibble - (dmin * m[j]) with 6-bit
//         sc/m per sub-block j; nibble layout and scale packing in util/dtype.h   (144 bytes)
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

}  // namespace kvpack::kernels
