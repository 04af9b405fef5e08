// Q8_0 weights repacked at load time for the int8 dot-product instructions (VNNI vpdpbusd), so that one
// instruction computes 4-element partial dots for 16 output rows at once and a whole 32-element block's dot
// stays in one int32 lane: the f32 convert, scale and accumulate then run once per block per 16 rows
// instead of once per 2 blocks per row (matmul.h's row layout: 3 float instructions per vpdpbusd, which
// held the Q8_0 prefill GEMM at ~45 % of the machine's scaled-int8 peak).
//
// Layout (PackedQ8): rows are taken 16 at a time (a group; the last group is padded with zero rows). Group g
// is one contiguous stream of nb = n_in / 32 block records of 544 bytes:
//   uint8_t q[8][16][4]   q[j][r][i] = W[16g + r][32b + 4j + i] + 128   (unsigned, for vpdpbusd's u8 side)
//   uint16_t d[16]        the f16 scale of block b of row 16g + r, as in the file
// 544 bytes per 16 x 32 weights, the same as the 16 rows' Q8_0 blocks: decode streams as many bytes.
//
// Arithmetic, per output y[t][o] (every path, bitwise): for each block b in order,
//   s_b = sum_i (q_w + 128) * q_x  - 128 * sum_i q_x      (exact int32: the dot of the int8 codes)
//   acc = fma((float)s_b, d_w * d_x, acc)                (f32: one product, one fused multiply-add)
// with the activations quantised as matmul.h's 32-element blocks (d_x = act_block_scale). Each output is
// one chain over its blocks: the result does not depend on the tile, the batch, the thread split or the
// ISA path (scalar and AVX-512 give the same bits), so batching never changes a greedy output.
//
// Thread-safety: PackedQ8 is immutable after pack_q8_0(); matmul_packed() is a pure function of its
// arguments and may run concurrently on the same PackedQ8.
#pragma once
#include <cstdint>
#include <memory>
#include <span>

#include "kernels/cpu_features.h"
#include "util/huge_alloc.h"
#include "util/thread_pool.h"

namespace kvpack::kernels {

template <class P>
P concat_view(std::span<const P* const> parts);

class PackedQ8 {
 public:
  static constexpr int kRows = 16;          // rows per group
  static constexpr int kRecordBytes = 544;  // one block of one group: 512 code bytes + 16 f16 scales

  // Bytes the packed form of an n_out x n_in matrix takes (0 for an empty shape).
  static size_t bytes_for(int64_t n_out, int64_t n_in);

  PackedQ8() = default;
  explicit operator bool() const { return data_ != nullptr; }
  int64_t n_out() const { return n_out_; }
  int64_t n_in() const { return n_in_; }
  int64_t n_groups() const { return (n_out_ + kRows - 1) / kRows; }
  size_t group_bytes() const { return static_cast<size_t>(n_in_ / 32) * kRecordBytes; }
  size_t bytes() const { return bytes_for(n_out_, n_in_); }
  const uint8_t* group(int64_t g) const { return data_ + static_cast<size_t>(g) * group_bytes(); }

 private:
  friend PackedQ8 pack_q8_0(const void* W, int64_t n_out, int64_t n_in);
  friend PackedQ8 pack_q8_0_into(uint8_t* dst, const void* W, int64_t n_out, int64_t n_in);
  template <class P>
  friend P concat_view(std::span<const P* const> parts);  // packed_concat's body (matmul_packed.cpp)
  const uint8_t* data_ = nullptr;
  std::unique_ptr<uint8_t, FreeBytes> owned_;  // empty for a view into memory its caller owns
  int64_t n_out_ = 0, n_in_ = 0;
};

// True when matmul_packed() has a fast path on this CPU for the selected ISA (AVX-512 with VNNI): the
// model loader packs its Q8_0 matrices only then; elsewhere the row-layout kernels of matmul.h run.
bool packed_q8_preferred();

// Repacks n_out rows of n_in Q8_0 elements (GGUF layout; n_out > 0 and n_in a positive multiple of 32, else
// std::invalid_argument) into memory the result owns (64-byte aligned; std::bad_alloc when memory is short).
PackedQ8 pack_q8_0(const void* W, int64_t n_out, int64_t n_in);
// The same into dst (PackedQ8::bytes_for() bytes, 64-byte aligned, owned by the caller and outliving the
// result): a model packs all its matrices into one arena (one rounding to 2 MiB, not one per matrix).
PackedQ8 pack_q8_0_into(uint8_t* dst, const void* W, int64_t n_out, int64_t n_in);

// A view of packed matrices that lie back to back in memory (each but the last with a multiple of 16 rows,
// the same n_in) as one matrix of their rows in order: Q|K|V or gate|up as one matmul, whose every output has
// the bits it has in its own matrix (one chain per output). Empty (false) when they do not lie so.
PackedQ8 packed_concat(std::span<const PackedQ8* const> parts);

// y[t][o] = sum_i W[o][i] x[t][i] for the packed W (arithmetic above), on `isa` (Isa::Avx512 or
// Isa::Scalar; throws std::invalid_argument for an ISA this CPU lacks or one without a packed path).
// Scratch: the quantised activations use matmul()'s per-thread buffer (no allocation in steady state).
void matmul_packed(const PackedQ8& W, const float* x, int64_t n_tokens, float* y, ThreadPool* pool,
                   Isa isa = selected_isa());

// ---- Q4_K packed the same way (PackedQ4K) --------------------------------------------------------------
// The row-layout Q4_K kernel (matmul_kquant_avx512.cpp) spends ~10 vector instructions per 64 weights and
// row on nibble decoding, scale broadcasting and int16 pair sums, and a convert + 2 FMAs per super-block and
// row: decode ran at ~14 G weights/s per thread (7.9 GB/s of Q4_K) against ~19 for Q8_0, compute-bound.
// Packed, one 64-byte load holds 2 x 4 weights of 16 rows, and two vpdpbusd with the token's activation
// quads broadcast give 16 rows' partial dots; sub-block scales and mins are applied once per 32 weights for
// 16 rows (vpmulld), the f32 convert and FMAs once per super-block for 16 rows.
//
// Layout: rows 16 at a time as PackedQ8 (the last group padded with zero rows); group g is n_in / 256
// super-block records of 2368 bytes:
//   uint8_t q[8][4][16][4]  byte (j, i, r, e): low nibble = code of W[16g + r][256 sb + 32 j + 4 i + e],
//                           high nibble = code of element 256 sb + 32 j + 16 + 4 i + e (codes 0..15)
//   uint8_t sc[8][16]       6-bit sub-block scales of rows 16g + r (Q4_K's, unpacked)
//   uint8_t m[8][16]        6-bit sub-block mins
//   uint16_t d[16], dmin[16]  the f16 super-block scales, as in the file
// 2368 bytes per 16 x 256 weights against 2304 in the file (+2.8 %: the scales unpacked to one byte each).
//
// Arithmetic, per output y[t][o] (every path, bitwise), with the activations quantised as matmul.h's
// super-blocks (int8 codes q_x, one f32 scale dx per 256, int16 sums per 16): for each super-block in order,
//   isum = sum_j sc_j * sum_{i in sub-block j} q_w,i * q_x,i        (exact int32)
//   msum = sum_j m_j * (sum of q_x over sub-block j)                 (exact int32)
//   acc = fma((float)isum, d * dx, acc);  acc = fma(-(float)msum, dmin * dx, acc)
// One chain per output, as PackedQ8: independent of tile, batch, thread split and ISA path. The row-layout
// kernel sums partial lanes in f32 instead, so the two layouts differ in the last bits (not across paths).
class PackedQ4K {
 public:
  static constexpr int kRows = 16;
  static constexpr int kRecordBytes = 2368;
  static constexpr int kScOffset = 2048, kMinOffset = 2176, kDOffset = 2304, kDminOffset = 2336;

  static size_t bytes_for(int64_t n_out, int64_t n_in);

  PackedQ4K() = default;
  explicit operator bool() const { return data_ != nullptr; }
  int64_t n_out() const { return n_out_; }
  int64_t n_in() const { return n_in_; }
  int64_t n_groups() const { return (n_out_ + kRows - 1) / kRows; }
  size_t group_bytes() const { return static_cast<size_t>(n_in_ / 256) * kRecordBytes; }
  size_t bytes() const { return bytes_for(n_out_, n_in_); }
  const uint8_t* group(int64_t g) const { return data_ + static_cast<size_t>(g) * group_bytes(); }

 private:
  friend PackedQ4K pack_q4_k(const void* W, int64_t n_out, int64_t n_in);
  friend PackedQ4K pack_q4_k_into(uint8_t* dst, const void* W, int64_t n_out, int64_t n_in);
  template <class P>
  friend P concat_view(std::span<const P* const> parts);
  const uint8_t* data_ = nullptr;
  std::unique_ptr<uint8_t, FreeBytes> owned_;
  int64_t n_out_ = 0, n_in_ = 0;
};

// As pack_q8_0 / pack_q8_0_into for Q4_K rows (n_in a positive multiple of 256, else std::invalid_argument).
PackedQ4K pack_q4_k(const void* W, int64_t n_out, int64_t n_in);
PackedQ4K pack_q4_k_into(uint8_t* dst, const void* W, int64_t n_out, int64_t n_in);
// As packed_concat of PackedQ8.
PackedQ4K packed_concat(std::span<const PackedQ4K* const> parts);

// y[t][o] = sum_i W[o][i] x[t][i] for the packed Q4_K W (arithmetic above); `isa` as for PackedQ8.
void matmul_packed(const PackedQ4K& W, const float* x, int64_t n_tokens, float* y, ThreadPool* pool,
                   Isa isa = selected_isa());

}  // namespace kvpack::kernels
