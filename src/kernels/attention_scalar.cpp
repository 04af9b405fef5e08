// Portable page kernels of paged_attention (baseline x86-64 / any CPU). The reference for the SIMD paths;
// plain loops the compiler may vectorise with SSE2. F16 / BF16 / Q8_0 pages are converted to f32 once per
// page and tile.
#include <cmath>
#include <cstring>

#include "kernels/attention_impl.h"
#include "util/half.h"

namespace kvpack::kernels::attn_detail {
namespace {

// Rows [0, n) of a page block as f32: the block itself for F32, else converted into `conv`.
const float* page_f32(const void* block, int kind, int32_t n, int32_t hd, float* conv) {
  if (kind == kElemF32) return static_cast<const float*>(block);
  const auto* h = static_cast<const uint8_t*>(block);
  const size_t count = static_cast<size_t>(n) * hd;
  for (size_t i = 0; i < count; ++i) {
    uint16_t bits;
    std::memcpy(&bits, h + 2 * i, 2);
    conv[i] = kind == kElemF16 ? fp16_to_f32(bits) : bf16_to_f32(bits);
  }
  return conv;
}

float dot(const float* a, const float* b, int32_t n) {
  float part[8] = {};  // 8 independent partial sums (vectorisable, no serial dependency chain)
  int32_t d = 0;
  for (; d + 8 <= n; d += 8)
    for (int i = 0; i < 8; ++i) part[i] += a[d + i] * b[d + i];
  for (; d < n; ++d) part[0] += a[d] * b[d];
  return ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
}

struct ScalarKern {
  static constexpr bool kDirectQ8 = false;  // Q8_0 pages go through dequant_q8 (attention_impl.h)
  // n rows of head_dim / 32 Q8_0 blocks -> f32 rows (stride hd): value = d * q, as ggml dequantises.
  static void dequant_q8(const uint8_t* block, int32_t n, int32_t hd, float* out) {
    const size_t nb = static_cast<size_t>(n) * (hd / 32);
    for (size_t b = 0; b < nb; ++b, block += 34, out += 32) {
      uint16_t dbits;
      std::memcpy(&dbits, block, 2);
      const float d = fp16_to_f32(dbits);
      const auto* q = reinterpret_cast<const int8_t*>(block + 2);
      for (int i = 0; i < 32; ++i) out[i] = d * static_cast<float>(q[i]);
    }
  }

  static void qk(const uint8_t* kblock, int kind, int32_t n, int32_t hd, const float* qs, int32_t hdp, int32_t R,
                 float* scores, int32_t psp, float* conv) {
    const float* K = page_f32(kblock, kind, n, hd, conv);
    for (int32_t r = 0; r < R; ++r)
      for (int32_t j = 0; j < n; ++j)
        scores[static_cast<size_t>(r) * psp + j] =
            dot(qs + static_cast<size_t>(r) * hdp, K + static_cast<size_t>(j) * hd, hd);
  }

  static void softmax(float* scores, int32_t psp, int32_t n, int32_t R, int32_t G, int32_t rel0, float* m, float* l,
                      float* alpha) {
    for (int32_t r = 0; r < R; ++r) {
      const int32_t nv = row_valid(rel0, r, G, n);
      float* s = scores + static_cast<size_t>(r) * psp;
      alpha[r] = 1.0f;
      if (nv == 0) continue;
      float mx = m[r];
      for (int32_t j = 0; j < nv; ++j) mx = s[j] > mx ? s[j] : mx;
      if (mx == -INFINITY) {  // every visible score is -inf: no weight
        for (int32_t j = 0; j < nv; ++j) s[j] = 0.0f;
        continue;
      }
      float sum = 0.0f;
      for (int32_t j = 0; j < nv; ++j) {
        s[j] = std::exp(s[j] - mx);
        sum += s[j];
      }
      const float a = m[r] == mx ? 1.0f : std::exp(m[r] - mx);
      l[r] = l[r] * a + sum;
      m[r] = mx;
      alpha[r] = a;
    }
  }

  static void pv(const uint8_t* vblock, int kind, int32_t n, int32_t hd, const float* p, int32_t psp,
                 const float* alpha, float* acc, int32_t hdp, int32_t R, int32_t G, int32_t rel0, float* conv) {
    const float* V = page_f32(vblock, kind, n, hd, conv);
    for (int32_t r = 0; r < R; ++r) {
      const int32_t nv = row_valid(rel0, r, G, n);
      float* o = acc + static_cast<size_t>(r) * hdp;
      const float a = alpha[r];
      if (a != 1.0f)
        for (int32_t d = 0; d < hd; ++d) o[d] *= a;
      for (int32_t j = 0; j < nv; ++j) {
        const float pj = p[static_cast<size_t>(r) * psp + j];
        const float* v = V + static_cast<size_t>(j) * hd;
        for (int32_t d = 0; d < hd; ++d) o[d] += pj * v[d];
      }
    }
  }

  static void mass(const float* scores, int32_t psp, int32_t n, int32_t R, int32_t G, int32_t rel0, const float* m,
                   const float* l, float* key_mass) {
    for (int32_t r = 0; r < R; ++r) {
      const int32_t nv = row_valid(rel0, r, G, n);
      if (nv == 0 || !(l[r] > 0.0f)) continue;
      const float inv = 1.0f / l[r];
      const float* s = scores + static_cast<size_t>(r) * psp;
      for (int32_t j = 0; j < nv; ++j) key_mass[j] += std::exp(s[j] - m[r]) * inv;
    }
  }
};

}  // namespace

void paged_attention_scalar(const KvStreamView& kv, const AttentionArgs& args) { run<ScalarKern>(kv, args); }

}  // namespace kvpack::kernels::attn_detail
