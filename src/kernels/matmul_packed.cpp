// Packing of Q8_0 matrices into the 16-row interleaved layout (kernels/matmul_packed.h) and the portable
// kernel that defines its arithmetic (the AVX-512 kernel in matmul_avx512.cpp gives the same bits).
#include "kernels/matmul_packed.h"

#include <cmath>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/matmul_internal.h"
#include "kernels/quant.h"
#include "util/dtype.h"
#include "util/half.h"
#include "util/huge_alloc.h"

namespace kvpack::kernels {

bool packed_q8_preferred() { return selected_isa() == Isa::Avx512; }

size_t PackedQ8::bytes_for(int64_t n_out, int64_t n_in) {
  if (n_out <= 0 || n_in <= 0) return 0;
  return static_cast<size_t>((n_out + kRows - 1) / kRows) * static_cast<size_t>(n_in / 32) * kRecordBytes;
}

namespace {

// Memory for a packed matrix of `bytes`: matrices of a huge page or more on 2 MiB boundaries (fewer TLB misses
// while streaming them), smaller ones not rounded up to one.
std::unique_ptr<uint8_t, FreeBytes> packed_memory(size_t bytes) {
  uint8_t* mem = bytes >= kHugePageBytes ? huge_alloc(bytes) : static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 127) / 64 * 64));
  if (mem == nullptr) throw std::bad_alloc();
  return std::unique_ptr<uint8_t, FreeBytes>(mem);
}

}  // namespace

PackedQ8 pack_q8_0(const void* W, int64_t n_out, int64_t n_in) {
  auto owned = packed_memory(PackedQ8::bytes_for(n_out, n_in));
  PackedQ8 p = pack_q8_0_into(owned.get(), W, n_out, n_in);
  p.owned_ = std::move(owned);
  return p;
}

PackedQ8 pack_q8_0_into(uint8_t* mem, const void* W, int64_t n_out, int64_t n_in) {
  if (n_out <= 0 || n_in <= 0 || n_in % 32 != 0)
    throw std::invalid_argument("pack_q8_0: shape " + std::to_string(n_out) + " x " + std::to_string(n_in) +
                                " (n_in must be a positive multiple of 32)");
  PackedQ8 p;
  p.n_out_ = n_out;
  p.n_in_ = n_in;
  p.data_ = mem;
  const int64_t nb = n_in / 32;
  const auto* src = static_cast<const uint8_t*>(W);
  const size_t rb = row_bytes(DType::Q8_0, static_cast<uint64_t>(n_in));  // block_q8_0: f16 d, 32 x int8
  for (int64_t g = 0; g < p.n_groups(); ++g) {
    uint8_t* out = mem + static_cast<size_t>(g) * p.group_bytes();
    for (int64_t b = 0; b < nb; ++b, out += PackedQ8::kRecordBytes) {
      for (int r = 0; r < PackedQ8::kRows; ++r) {
        const int64_t row = g * PackedQ8::kRows + r;
        if (row >= n_out) {  // padding rows: code 0 (= 128 after the offset), scale 0
          for (int j = 0; j < 8; ++j) std::memset(out + j * 64 + r * 4, 0x80, 4);
          std::memset(out + 512 + r * 2, 0, 2);
          continue;
        }
        const uint8_t* blk = src + static_cast<size_t>(row) * rb + static_cast<size_t>(b) * 34;
        for (int j = 0; j < 8; ++j)
          for (int i = 0; i < 4; ++i) out[j * 64 + r * 4 + i] = static_cast<uint8_t>(blk[2 + 4 * j + i] ^ 0x80);
        std::memcpy(out + 512 + r * 2, blk, 2);
      }
    }
  }
  return p;
}

size_t PackedQ4K::bytes_for(int64_t n_out, int64_t n_in) {
  if (n_out <= 0 || n_in <= 0) return 0;
  return static_cast<size_t>((n_out + kRows - 1) / kRows) * static_cast<size_t>(n_in / 256) * kRecordBytes;
}

PackedQ4K pack_q4_k(const void* W, int64_t n_out, int64_t n_in) {
  auto owned = packed_memory(PackedQ4K::bytes_for(n_out, n_in));
  PackedQ4K p = pack_q4_k_into(owned.get(), W, n_out, n_in);
  p.owned_ = std::move(owned);
  return p;
}

PackedQ4K pack_q4_k_into(uint8_t* mem, const void* W, int64_t n_out, int64_t n_in) {
  if (n_out <= 0 || n_in <= 0 || n_in % 256 != 0)
    throw std::invalid_argument("pack_q4_k: shape " + std::to_string(n_out) + " x " + std::to_string(n_in) +
                                " (n_in must be a positive multiple of 256)");
  PackedQ4K p;
  p.n_out_ = n_out;
  p.n_in_ = n_in;
  p.data_ = mem;
  const int64_t nsb = n_in / 256;
  const auto* src = static_cast<const uint8_t*>(W);
  const size_t rb = row_bytes(DType::Q4_K, static_cast<uint64_t>(n_in));
  constexpr int R = PackedQ4K::kRows;
  for (int64_t g = 0; g < p.n_groups(); ++g) {
    uint8_t* out = mem + static_cast<size_t>(g) * p.group_bytes();
    for (int64_t sb = 0; sb < nsb; ++sb, out += PackedQ4K::kRecordBytes) {
      std::memset(out, 0, PackedQ4K::kRecordBytes);  // padding rows: codes, scales, mins and d all 0
      for (int r = 0; r < R; ++r) {
        const int64_t row = g * R + r;
        if (row >= n_out) break;
        const auto* blk = reinterpret_cast<const BlockQ4_K*>(src + static_cast<size_t>(row) * rb + static_cast<size_t>(sb) * sizeof(BlockQ4_K));
        // Element e of the super-block: nibble of qs[32 (e / 64) + e % 32], high half when e % 64 >= 32.
        auto code = [&](int e) { return static_cast<uint8_t>((blk->qs[32 * (e / 64) + e % 32] >> (e % 64 >= 32 ? 4 : 0)) & 15); };
        for (int j = 0; j < 8; ++j)
          for (int i = 0; i < 4; ++i)
            for (int e = 0; e < 4; ++e)
              out[(4 * j + i) * 64 + r * 4 + e] = static_cast<uint8_t>(code(32 * j + 4 * i + e) | code(32 * j + 16 + 4 * i + e) << 4);
        uint8_t sc[8], m[8];
        q4_k_unpack_scales(blk->scales, sc, m);
        for (int j = 0; j < 8; ++j) {
          out[PackedQ4K::kScOffset + 16 * j + r] = sc[j];
          out[PackedQ4K::kMinOffset + 16 * j + r] = m[j];
        }
        std::memcpy(out + PackedQ4K::kDOffset + 2 * r, &blk->d, 2);
        std::memcpy(out + PackedQ4K::kDminOffset + 2 * r, &blk->dmin, 2);
      }
    }
  }
  return p;
}

namespace {

// Rows of the concatenation, or -1 when the parts do not lie back to back as packed_concat needs.
template <class P>
int64_t concat_rows(std::span<const P* const> parts) {
  if (parts.empty() || !*parts[0]) return -1;
  int64_t n_out = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const P& p = *parts[i];
    if (!p || p.n_in() != parts[0]->n_in()) return -1;
    if (i + 1 < parts.size() && (p.n_out() % P::kRows != 0 || p.group(0) + p.bytes() != parts[i + 1]->group(0))) return -1;
    n_out += p.n_out();
  }
  return n_out;
}

}  // namespace

template <class P>
P concat_view(std::span<const P* const> parts) {
  P v;
  if (const int64_t n = concat_rows(parts); n > 0) {
    v.data_ = parts[0]->group(0);
    v.n_out_ = n;
    v.n_in_ = parts[0]->n_in();
  }
  return v;
}

PackedQ8 packed_concat(std::span<const PackedQ8* const> parts) { return concat_view(parts); }
PackedQ4K packed_concat(std::span<const PackedQ4K* const> parts) { return concat_view(parts); }

namespace detail {

// The reference arithmetic of PackedQ4K (matmul_packed.h), one output at a time.
void packed_q4k_scalar(const PackedArgsK& a) {
  const ActLayoutK& L = a.act;
  constexpr int R = PackedQ4K::kRows;
  for (int64_t g = a.g0; g < a.g1; ++g) {
    const uint8_t* grp = a.W + static_cast<size_t>(g) * a.group_bytes;
    for (int r = 0; r < R; ++r) {
      const int64_t o = g * R + r;
      if (o >= a.n_out) break;
      for (int64_t t = 0; t < a.n_tokens; ++t) {
        const uint8_t* act = a.x + static_cast<size_t>(t) * a.x_stride;
        const auto* qs = reinterpret_cast<const int8_t*>(act + L.qs_off);
        const auto* bs = reinterpret_cast<const int16_t*>(act + L.bsum_off);
        const auto* dx = reinterpret_cast<const float*>(act + L.d_off);
        float acc = 0.0f;
        for (int64_t sb = 0; sb < a.nsb; ++sb) {
          const uint8_t* rec = grp + static_cast<size_t>(sb) * PackedQ4K::kRecordBytes;
          const int8_t* x = qs + sb * 256;
          int32_t isum = 0, msum = 0;
          for (int j = 0; j < 8; ++j) {
            int32_t dot = 0;
            for (int i = 0; i < 4; ++i)
              for (int e = 0; e < 4; ++e) {
                const uint8_t b = rec[(4 * j + i) * 64 + r * 4 + e];
                dot += int32_t{b & 15} * x[32 * j + 4 * i + e] + int32_t{b >> 4} * x[32 * j + 16 + 4 * i + e];
              }
            isum += int32_t{rec[PackedQ4K::kScOffset + 16 * j + r]} * dot;
            msum += int32_t{rec[PackedQ4K::kMinOffset + 16 * j + r]} * (int32_t{bs[sb * 16 + 2 * j]} + int32_t{bs[sb * 16 + 2 * j + 1]});
          }
          uint16_t dh, mh;
          std::memcpy(&dh, rec + PackedQ4K::kDOffset + 2 * r, 2);
          std::memcpy(&mh, rec + PackedQ4K::kDminOffset + 2 * r, 2);
          acc = std::fma(static_cast<float>(isum), fp16_to_f32(dh) * dx[sb], acc);
          acc = std::fma(-static_cast<float>(msum), fp16_to_f32(mh) * dx[sb], acc);
        }
        a.y[t * a.y_stride + o] = acc;
      }
    }
  }
}


// The reference arithmetic of matmul_packed.h, one output at a time.
void packed_q8_scalar(const PackedArgs& a) {
  const ActLayout& L = a.act;
  for (int64_t g = a.g0; g < a.g1; ++g) {
    const uint8_t* grp = a.W + static_cast<size_t>(g) * a.group_bytes;
    for (int r = 0; r < PackedQ8::kRows; ++r) {
      const int64_t o = g * PackedQ8::kRows + r;
      if (o >= a.n_out) break;
      for (int64_t t = 0; t < a.n_tokens; ++t) {
        const uint8_t* act = a.x + static_cast<size_t>(t) * a.x_stride;
        const auto* qs = reinterpret_cast<const int8_t*>(act + L.qs_off);
        const auto* dx = reinterpret_cast<const float*>(act + L.d_off);
        const auto* bias = reinterpret_cast<const int32_t*>(act + L.bias_off);
        float acc = 0.0f;
        for (int64_t b = 0; b < a.nb; ++b) {
          const uint8_t* rec = grp + static_cast<size_t>(b) * PackedQ8::kRecordBytes;
          int32_t s = bias[b * 8];
          for (int j = 0; j < 8; ++j)
            for (int i = 0; i < 4; ++i) s += int32_t{rec[j * 64 + r * 4 + i]} * int32_t{qs[b * 32 + 4 * j + i]};
          uint16_t dh;
          std::memcpy(&dh, rec + 512 + r * 2, 2);
          acc = std::fma(static_cast<float>(s), fp16_to_f32(dh) * dx[b * 8], acc);
        }
        a.y[t * a.y_stride + o] = acc;
      }
    }
  }
}

}  // namespace detail
}  // namespace kvpack::kernels
