// Element types of tensors and KV pages, numbered exactly as GGUF/ggml number them so a
// GGUF tensor-type field can be cast straight to DType after validation.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvpack {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ4_NL = 20,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
};

struct DTypeTraits {
  std::string_view name;
  uint32_t block_elems;  // elements per block (1 for plain types)
  uint32_t block_bytes;  // bytes per block
};

// Returns nullptr for numbers that are not a known ggml type.
const DTypeTraits* dtype_traits(uint32_t raw_type);
inline const DTypeTraits& traits(DType t) { return *dtype_traits(static_cast<uint32_t>(t)); }
std::string_view dtype_name(DType t);

// Bytes for a row of `n` elements; n must be a multiple of the block size (checked by callers).
inline uint64_t row_bytes(DType t, uint64_t n) {
  const auto& tr = traits(t);
  return n / tr.block_elems * tr.block_bytes;
}

// ---- Q4_K (ggml block_q4_K) reference codec ------------------------------------------------------
// It lives in this lowest layer because both the GGUF model writer (gguf layer) and the kernels
// (kernels::quantize_row / dequantize_row) encode Q4_K and neither layer may depend on the other.
// Block of 256 elements, 144 bytes (layout struct: kernels::BlockQ4_K in kernels/quant.h):
//   f16 d, f16 dmin, 12 bytes of 6-bit sub-block scales sc[8] and mins m[8], 128 bytes of nibbles.
//   Sub-block j (elements 32 j .. 32 j + 31) decodes as value = (d * sc[j]) * q - (dmin * m[j]);
//   the nibbles of 64 elements 64 p .. 64 p + 63 sit in qs[32 p .. 32 p + 31]: element 64 p + i in
//   the low nibble of qs[32 p + i], element 64 p + 32 + i in its high nibble.
//   Scale packing (as ggml's get_scale_min_k4): for j < 4, sc[j] and m[j] are the low 6 bits of
//   bytes 0..3 and 4..7; for j >= 4, byte 8 + (j - 4) holds sc[j] & 15 (low nibble) and m[j] & 15 (high
//   nibble) and their top 2 bits are the top 2 bits of bytes j - 4 (sc) and j (m).
constexpr int kQ4KBlock = 256;
constexpr int kQ4KBytes = 144;

// Unpacks the 12 scale bytes into sc[8] and m[8] (each 0..63).
void q4_k_unpack_scales(const uint8_t* scales12, uint8_t sc[8], uint8_t m[8]);
// Packs sc[8], m[8] (each 0..63) into 12 bytes.
void q4_k_pack_scales(const uint8_t sc[8], const uint8_t m[8], uint8_t* scales12);

// Quantises n values (n a multiple of 256, checked by callers) into n / 256 blocks. A reference
// quantiser in the style of ggml's quantize_row_q4_K_ref / make_qkx2_quants, not bit-identical to it:
// per sub-block, a weighted least-squares search over 21 candidate steps for (scale, min <= 0) with
// importance weights rms(sub-block) + |x|; then d = max scale / 63 and dmin = max min / 63 (f16), the
// 6-bit sc/m rounded against the f16-rounded d/dmin, and every nibble re-rounded with its final
// effective step and offset. Deterministic; non-finite inputs give unspecified (but finite-index) codes.
void quantize_q4_k(const float* x, int64_t n, void* out);
// Decodes n / 256 blocks: out = (d * sc) * q - (dmin * m), each product exact in f32, one rounding for
// the difference (as ggml's dequantize_row_q4_K).
void dequantize_q4_k(const void* in, int64_t n, float* out);

// Helpers of the reference quantisers (also used by util/quant_codecs.cpp).
// round(v) clamped to [lo, hi]; NaN -> lo.
int round_clamp(float v, int lo, int hi);
// Weighted least-squares fit of x[i] ~= scale * L[i] - min (L in 0..nmax, min >= 0) over n elements (the
// Q4_K sub-block search above, for any width and code range). Returns scale; *min_out = min.
float fit_scale_min(const float* x, const float* w, int n, int nmax, float* min_out);

}  // namespace kvpack
