// Row conversions between f32 and the stored weight types (scalar; not on the decode hot path:
// embedding lookups convert one row per token, tools convert whole tensors once).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "util/half.h"
#include "util/quant_codecs.h"

namespace kvpack::kernels {
namespace {

void check_blocks(DType type, int64_t n, int64_t block) {
  if (n < 0 || n % block != 0)
    throw std::invalid_argument(std::string(dtype_name(type)) + " row length " + std::to_string(n) +
                                " is not a multiple of " + std::to_string(block));
}

}  // namespace

void dequantize_row(const void* row, DType type, int64_t n, float* out) {
  switch (type) {
    case DType::F32:
      if (n > 0) std::memcpy(out, row, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16: {
      const auto* h = static_cast<const uint16_t*>(row);
      for (int64_t i = 0; i < n; ++i) out[i] = fp16_to_f32(h[i]);
      return;
    }
    case DType::BF16: {
      const auto* h = static_cast<const uint16_t*>(row);
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(h[i]);
      return;
    }
    case DType::Q8_0: {
      check_blocks(type, n, kQ8_0Block);
      const auto* b = static_cast<const BlockQ8_0*>(row);
      for (int64_t k = 0; k < n / kQ8_0Block; ++k) {
        const float d = fp16_to_f32(b[k].d);
        for (int i = 0; i < kQ8_0Block; ++i) out[k * kQ8_0Block + i] = d * static_cast<float>(b[k].qs[i]);
      }
      return;
    }
    case DType::Q4_0: {
      check_blocks(type, n, kQ4_0Block);
      const auto* b = static_cast<const BlockQ4_0*>(row);
      for (int64_t k = 0; k < n / kQ4_0Block; ++k) {
        const float d = fp16_to_f32(b[k].d);
        float* o = out + k * kQ4_0Block;
        for (int j = 0; j < 16; ++j) {
          o[j] = d * static_cast<float>((b[k].qs[j] & 0x0f) - 8);
          o[j + 16] = d * static_cast<float>((b[k].qs[j] >> 4) - 8);
        }
      }
      return;
    }
    case DType::Q4_K:
      check_blocks(type, n, kQ4_KBlock);
      dequantize_q4_k(row, n, out);
      return;
    default:
      if (is_superblock_codec(type) || is_block32_codec(type)) {  // util/quant_codecs.h
        check_blocks(type, n, traits(type).block_elems);
        dequantize_codec(type, row, n, out);
        return;
      }
      throw std::invalid_argument("dequantize_row: unsupported type " + std::string(dtype_name(type)));
  }
}

void quantize_row(const float* x, DType type, int64_t n, void* out) {
  switch (type) {
    case DType::F32:
      if (n > 0) std::memcpy(out, x, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16: {
      auto* h = static_cast<uint16_t*>(out);
      for (int64_t i = 0; i < n; ++i) h[i] = f32_to_fp16(x[i]);
      return;
    }
    case DType::BF16: {
      auto* h = static_cast<uint16_t*>(out);
      for (int64_t i = 0; i < n; ++i) h[i] = f32_to_bf16(x[i]);
      return;
    }
    case DType::Q8_0: {
      // ggml's reference rounding: d = amax / 127, q = round-half-away(x / d), d stored as fp16.
      check_blocks(type, n, kQ8_0Block);
      auto* b = static_cast<BlockQ8_0*>(out);
      for (int64_t k = 0; k < n / kQ8_0Block; ++k) {
        const float* v = x + k * kQ8_0Block;
        float amax = 0.0f;
        for (int i = 0; i < kQ8_0Block; ++i) amax = std::max(amax, std::fabs(v[i]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[k].d = f32_to_fp16(d);
        for (int i = 0; i < kQ8_0Block; ++i) {
          const float q = std::round(v[i] * id);
          b[k].qs[i] = static_cast<int8_t>(q > 127.0f ? 127 : q < -127.0f ? -127 : q == q ? q : 0);
        }
      }
      return;
    }
    case DType::Q4_0: {
      // ggml's reference: d = (the element of largest magnitude, with its sign) / -8, so that element
      // maps exactly to nibble 0; q = min(15, trunc(x / d + 8.5)). Values of the opposite sign near
      // -max clamp to 15 (error up to one step |d|); everything else is within |d| / 2.
      check_blocks(type, n, kQ4_0Block);
      auto* b = static_cast<BlockQ4_0*>(out);
      for (int64_t k = 0; k < n / kQ4_0Block; ++k) {
        const float* v = x + k * kQ4_0Block;
        float amax = 0.0f, max = 0.0f;
        for (int i = 0; i < kQ4_0Block; ++i) {
          if (std::fabs(v[i]) > amax) {
            amax = std::fabs(v[i]);
            max = v[i];
          }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        b[k].d = f32_to_fp16(d);
        auto nib = [&](float f) -> uint8_t {
          const float q = f * id + 8.5f;  // in [0.5, 16.5] for finite input
          const int i = q >= 15.0f ? 15 : q > 0.0f ? static_cast<int>(q) : 0;
          return static_cast<uint8_t>(i);
        };
        for (int j = 0; j < 16; ++j) b[k].qs[j] = static_cast<uint8_t>(nib(v[j]) | nib(v[j + 16]) << 4);
      }
      return;
    }
    case DType::Q4_K:
      // Reference quantiser shared with the GGUF model writer (util/dtype.h documents the method).
      check_blocks(type, n, kQ4_KBlock);
      quantize_q4_k(x, n, out);
      return;
    default:
      if (is_superblock_codec(type) || is_block32_codec(type)) {  // util/quant_codecs.h
        check_blocks(type, n, traits(type).block_elems);
        quantize_codec(type, x, n, out);
        return;
      }
      throw std::invalid_argument("quantize_row: unsupported type " + std::string(dtype_name(type)));
  }
}

}  // namespace kvpack::kernels
