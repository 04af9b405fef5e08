// Portable kernels of the super-block kinds (Q4_K, Q6_K, Q5_K, Q3_K, Q2_K, IQ4_XS on ActLayoutK activations)
// and of the 32-block kinds Q5_0, Q5_1, IQ4_NL (ActLayout). The reference the SIMD paths are tested
// against; weights decode through util/quant_codecs.h's integer form, the same one the dequantiser uses.
//
// Per super-block and (row, token): isum_A = sum_j sc_j * dot16(q_j, x_j) and isum_B = sum_j mn_j * bsum_j
// are exact int32 (|isum_A| <= 16 * 16 * 32 * 128 * 127 < 2^28 for Q6_K, the widest), then
//   acc += (dA * dx) * isum_A;  acc -= (dB * dx) * isum_B       (f32, super-blocks in order).
// The SIMD paths compute the same integers in vector lanes and differ only in how the f32 sums are split.
#include <cstring>

#include "kernels/matmul_internal.h"
#include "util/quant_codecs.h"

namespace kvpack::kernels::detail {

ActLayoutK act_layout_k(int64_t n_in) {
  const size_t nsb = static_cast<size_t>(n_in) / kQKBlock;
  auto up = [](size_t v) { return (v + 63) / 64 * 64; };
  const size_t qs = nsb * 256, bs = up(nsb * 32), d = up(nsb * sizeof(float));
  return ActLayoutK{0, qs, qs + bs, qs + bs + d};
}

namespace {

// Round to nearest even for |v| <= 127.5 (see matmul_scalar.cpp: bit-identical to cvtps2dq).
inline int round_even_small(float v) {
  const float magic = 12582912.0f;  // 1.5 * 2^23
  const float r = (v + magic) - magic;
  return r == r ? static_cast<int>(r) : 0;
}

// Tokens per pass of the scalar kernels (a task's token chunk is at most 64, see matmul.cpp).
constexpr int kMaxTokens = 64;

template <DType kType>
void rows_k(const RowsArgs& a) {
  const int64_t nsb = a.n_in / kQKBlock;
  const size_t bytes = traits(kType).block_bytes;
  KBlockInts k;
  for (int64_t t0 = 0; t0 < a.n_tokens; t0 += kMaxTokens) {
    const int64_t nt = a.n_tokens - t0 < kMaxTokens ? a.n_tokens - t0 : kMaxTokens;
    for (int64_t r = a.r0; r < a.r1; ++r) {
      float acc[kMaxTokens] = {};
      for (int64_t sb = 0; sb < nsb; ++sb) {
        decode_k_block(kType, a.W + r * a.row_bytes + sb * bytes, &k);
        for (int64_t t = 0; t < nt; ++t) {
          const auto* act = static_cast<const uint8_t*>(a.x) + (t0 + t) * a.x_stride;
          const auto* xq = reinterpret_cast<const int8_t*>(act + a.actk.qs_off) + sb * kQKBlock;
          const auto* bs = reinterpret_cast<const int16_t*>(act + a.actk.bsum_off) + sb * 16;
          const float dx = reinterpret_cast<const float*>(act + a.actk.d_off)[sb];
          int32_t isa = 0, isb = 0;
          for (int j = 0; j < 16; ++j) {
            int32_t s = 0;
            for (int i = 0; i < 16; ++i) s += k.q[16 * j + i] * xq[16 * j + i];
            isa += k.sc[j] * s;
            isb += k.mn[j] * bs[j];
          }
          acc[t] += (k.dA * dx) * static_cast<float>(isa);
          acc[t] -= (k.dB * dx) * static_cast<float>(isb);
        }
      }
      for (int64_t t = 0; t < nt; ++t) a.y[(t0 + t) * a.y_stride + r] = acc[t];
    }
  }
}

// 32-block kinds: value = d q + m, so dot = (d dx) * sum(q x_q) + m * (dx sum(x_q)) per block; blocks in order.
template <DType kType>
void rows_b32(const RowsArgs& a) {
  const int64_t nb = a.n_in / kQBlock;
  const size_t bytes = traits(kType).block_bytes;
  B32Ints k;
  for (int64_t t0 = 0; t0 < a.n_tokens; t0 += kMaxTokens) {
    const int64_t nt = a.n_tokens - t0 < kMaxTokens ? a.n_tokens - t0 : kMaxTokens;
    for (int64_t r = a.r0; r < a.r1; ++r) {
      float acc[kMaxTokens] = {};
      for (int64_t b = 0; b < nb; ++b) {
        decode_b32_block(kType, a.W + r * a.row_bytes + b * bytes, &k);  // once per row block, not per token
        for (int64_t t = 0; t < nt; ++t) {
          const auto* act = static_cast<const uint8_t*>(a.x) + (t0 + t) * a.x_stride;
          const auto* xq = reinterpret_cast<const int8_t*>(act + a.act.qs_off) + b * kQBlock;
          const float dx = reinterpret_cast<const float*>(act + a.act.d_off)[b * 8];
          int32_t s = 0;
          for (int i = 0; i < kQBlock; ++i) s += k.q[i] * xq[i];
          acc[t] += (k.d * dx) * static_cast<float>(s);
          if constexpr (kType == DType::Q5_1) acc[t] += k.m * reinterpret_cast<const float*>(act + a.act.sum_off)[b];
        }
      }
      for (int64_t t = 0; t < nt; ++t) a.y[(t0 + t) * a.y_stride + r] = acc[t];
    }
  }
}

}  // namespace

void quant_act_k_scalar(const float* x, int64_t n_in, const ActLayoutK& L, void* out) {
  auto* base = static_cast<uint8_t*>(out);
  auto* qs = reinterpret_cast<int8_t*>(base + L.qs_off);
  auto* bs = reinterpret_cast<int16_t*>(base + L.bsum_off);
  auto* dd = reinterpret_cast<float*>(base + L.d_off);
  for (int64_t sb = 0; sb < n_in / kQKBlock; ++sb) {
    const float* v = x + sb * kQKBlock;
    float amax = 0.0f;
    for (int i = 0; i < kQKBlock; ++i) {
      const float m = v[i] < 0 ? -v[i] : v[i];
      amax = m > amax ? m : amax;
    }
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    dd[sb] = amax / 127.0f;
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int i = 0; i < 16; ++i) {
        const int q = round_even_small(v[16 * g + i] * id);
        qs[sb * kQKBlock + 16 * g + i] = static_cast<int8_t>(q);
        s += q;
      }
      bs[sb * 16 + g] = static_cast<int16_t>(s);
    }
  }
}

const RowsFn kRowsKScalar[kNumKKinds] = {rows_k<DType::Q4_K>, rows_k<DType::Q6_K>, rows_k<DType::Q5_K>,
                                         rows_k<DType::Q3_K>, rows_k<DType::Q2_K>, rows_k<DType::IQ4_XS>};
const RowsFn kRowsB32Scalar[3] = {rows_b32<DType::Q5_0>, rows_b32<DType::Q5_1>, rows_b32<DType::IQ4_NL>};

}  // namespace kvpack::kernels::detail
