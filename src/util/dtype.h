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

}  // namespace kvpack
