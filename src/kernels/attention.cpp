// paged_attention: argument checks, scratch size and the run-time choice of the instruction-set path.
// The kernels themselves are in attention_scalar.cpp / attention_avx2.cpp / attention_avx512.cpp; the
// shared driver (tiling, causal limits, online softmax, key_mass pass) is attention_impl.h.
#include "kernels/attention.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>

#include "kernels/attention_impl.h"
#include "kernels/cpu_features.h"
#include "util/half.h"

namespace kvpack::kernels {
namespace {

using Fn = void (*)(const KvStreamView&, const AttentionArgs&);

struct Path {
  const char* name;
  Fn fn;
};

// Returns the path named `isa` if this CPU can run it, else nullptr.
const Path* find_path(Isa isa) {
  static const Path kPaths[kNumIsas] = {{"scalar", attn_detail::paged_attention_scalar},
                                        {"avx2", attn_detail::paged_attention_avx2},
                                        {"avx512", attn_detail::paged_attention_avx512}};
  return cpu_supports(isa, kAttentionIsa) ? &kPaths[static_cast<int>(isa)] : nullptr;
}

// "avx512_novnni": the avx512 path without its VNNI QK of Q8_0 keys (the Q8_0 bit-identity tests on a CPU
// that has VNNI); not a choice of KVPACK_ISA.
const Path* find_path(const char* name) {
  static const Path kNoVnni{"avx512_novnni", attn_detail::paged_attention_avx512_novnni};
  if (name != nullptr && std::string_view(name) == kNoVnni.name)
    return cpu_supports(Isa::Avx512, kAttentionIsa) ? &kNoVnni : nullptr;
  Isa isa;
  return parse_isa(name, &isa) ? find_path(isa) : nullptr;
}

// The one dispatch mechanism (kernels/cpu_features): KVPACK_ISA forcing and the fallback note live there.
const Path& chosen_path() { return *find_path(selected_isa(kAttentionIsa)); }

[[noreturn]] void fail(const std::string& what) { throw std::invalid_argument("paged_attention: " + what); }

void validate(const KvStreamView& kv, const AttentionArgs& a) {
  if (!kv_type_supported(kv.kv_type)) fail("kv_type must be F32, F16, BF16 or Q8_0");
  if (kv.head_dim <= 0 || kv.page_size <= 0) fail("head_dim and page_size must be positive");
  if (kv.kv_type == DType::Q8_0 && kv.head_dim % 32 != 0) fail("Q8_0 KV needs head_dim to be a multiple of 32");
  if (a.group <= 0) fail("group must be positive");
  if (a.n_new < 0 || a.n_new > kv.n_slots) fail("need 0 <= n_new <= n_slots");
  if (a.n_new == 0) return;
  if (kv.v_offset < static_cast<size_t>(kv.page_size) * kv_row_bytes(kv.kv_type, kv.head_dim))
    fail("v_offset overlaps the K block");
  if (kv.pages == nullptr || a.q == nullptr || a.out == nullptr || a.scratch == nullptr)
    fail("pages, q, out and scratch must be non-null");
  if (a.n_new > 1 && (a.q_stride < static_cast<int64_t>(a.group) * kv.head_dim ||
                      a.out_stride < static_cast<int64_t>(a.group) * kv.head_dim))
    fail("q_stride / out_stride smaller than group * head_dim");
}

// f32 -> f16 rows with the hardware conversion (vcvtps2ph, round to nearest even: the same bits as
// f32_to_fp16 for every finite value, overflow and subnormal), NaN lanes then set to f32_to_fp16's canonical
// quiet NaN (sign | 0x7e00; the hardware would keep part of the payload). The scalar loop was 3-10 % of a
// prefill's time (every new token writes K and V of every layer and KV head).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) int32_t encode_f16_avx512(const float* x, int32_t n, uint8_t* dst) {
  int32_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    if (nan) {
      const __m256i sign = _mm512_cvtepi32_epi16(_mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(v), 16), _mm512_set1_epi32(0x8000)));
      h = _mm256_mask_blend_epi16(nan, h, _mm256_or_si256(sign, _mm256_set1_epi16(0x7e00)));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 2 * static_cast<size_t>(i)), h);
  }
  return i;
}
__attribute__((target("avx2,f16c"))) int32_t encode_f16_avx2(const float* x, int32_t n, uint8_t* dst) {
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0) break;  // NaN: the scalar tail takes it from here
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * static_cast<size_t>(i)),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  return i;
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

void encode_row_with(Isa isa, const float* x, DType t, int32_t n, uint8_t* dst) {
  switch (t) {
    case DType::F32:
      std::memcpy(dst, x, static_cast<size_t>(n) * 4);
      return;
    case DType::F16:
    case DType::BF16: {
      int32_t i = 0;
      if (t == DType::F16) i = isa == Isa::Avx512 ? encode_f16_avx512(x, n, dst) : isa == Isa::Avx2 ? encode_f16_avx2(x, n, dst) : 0;
      for (; i < n; ++i) {
        const uint16_t h = t == DType::F16 ? f32_to_fp16(x[i]) : f32_to_bf16(x[i]);
        std::memcpy(dst + 2 * static_cast<size_t>(i), &h, 2);
      }
      return;
    }
    case DType::Q8_0:
      for (int32_t b = 0; b + 32 <= n; b += 32, dst += 34) {
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b + i]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t dh = f32_to_fp16(d);
        std::memcpy(dst, &dh, 2);
        for (int i = 0; i < 32; ++i) {
          const float q = std::round(x[b + i] * id);
          dst[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(q > 127.0f ? 127 : q < -127.0f ? -127 : q == q ? q : 0));
        }
      }
      return;
    default:
      throw std::invalid_argument("kv_encode_row: unsupported KV type");
  }
}

}  // namespace

void kv_encode_row_on(const char* isa, const float* x, DType t, int32_t n, uint8_t* dst) {
  Isa i;
  if (!parse_isa(isa, &i) || !cpu_supports(i, kAttentionIsa))
    throw std::invalid_argument(std::string("kv_encode_row_on: path not available: ") + isa);
  encode_row_with(i, x, t, n, dst);
}

bool kv_type_supported(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::Q8_0;
}

size_t kv_row_bytes(DType t, int32_t head_dim) {
  if (!kv_type_supported(t))
    throw std::invalid_argument("KV type " + std::string(dtype_name(t)) + " is not supported (f32, f16, bf16, q8_0)");
  if (head_dim <= 0) throw std::invalid_argument("KV head_dim must be positive");
  const size_t hd = static_cast<size_t>(head_dim);
  switch (t) {
    case DType::F32: return 4 * hd;
    case DType::Q8_0:
      if (head_dim % 32 != 0)
        throw std::invalid_argument("KV type q8_0 needs head_dim to be a multiple of 32 (its block size); head_dim is " +
                                    std::to_string(head_dim) + ": use --kv-type f16 or bf16");
      return hd / 32 * 34;
    default: return 2 * hd;
  }
}

void kv_encode_row(const float* x, DType t, int32_t n, uint8_t* dst) {
  static const Isa isa = selected_isa(kAttentionIsa);
  encode_row_with(isa, x, t, n, dst);
}

void kv_decode_row(const uint8_t* src, DType t, int32_t n, float* out) {
  switch (t) {
    case DType::F32:
      std::memcpy(out, src, static_cast<size_t>(n) * 4);
      return;
    case DType::F16:
    case DType::BF16:
      for (int32_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * static_cast<size_t>(i), 2);
        out[i] = t == DType::F16 ? fp16_to_f32(h) : bf16_to_f32(h);
      }
      return;
    case DType::Q8_0:
      for (int32_t b = 0; b + 32 <= n; b += 32, src += 34) {
        uint16_t dh;
        std::memcpy(&dh, src, 2);
        const float d = fp16_to_f32(dh);
        for (int i = 0; i < 32; ++i) out[b + i] = d * static_cast<float>(static_cast<int8_t>(src[2 + i]));
      }
      return;
    default:
      throw std::invalid_argument("kv_decode_row: unsupported KV type");
  }
}

const char* kv_type_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::Q8_0: return "q8_0";
    default: return "unsupported";
  }
}

DType parse_kv_type(std::string_view name) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0})
    if (name == kv_type_name(t)) return t;
  throw std::invalid_argument("unknown KV type '" + std::string(name) + "' (expected f32, f16, bf16 or q8_0)");
}

// paged_attention's own floats at the front of the scratch when it folds parts: a part's output rows and
// log-sum-exps and the running log-sum-exps, rounded up to a whole 64-byte line.
size_t parts_scratch_floats(int32_t group, int32_t head_dim) {
  const size_t n = static_cast<size_t>(group) * (static_cast<size_t>(head_dim) + 2);
  return (n + 15) / 16 * 16;
}

size_t attention_scratch_floats(int32_t n_new, int32_t group, int32_t head_dim, int32_t page_size) {
  group = group < 1 ? 1 : group;
  return parts_scratch_floats(group, head_dim) + attn_detail::scratch_floats(n_new, group, head_dim, page_size);
}

int32_t attention_parts(const KvStreamView& kv, const AttentionArgs& a) {
  if (a.n_new != 1 || a.key_mass != nullptr || kv.page_size <= 0) return 1;
  const int32_t n_pages = (kv.n_slots + kv.page_size - 1) / kv.page_size;
  return std::clamp(std::min(kv.n_slots / kAttentionPartSlots, n_pages), 1, kAttentionMaxParts);
}

namespace {

// Part `part` of P: pages [part * n_pages / P, (part + 1) * n_pages / P), as a stream of its own (one query
// token sees all of it; the newest slot is in the last part).
KvStreamView part_view(const KvStreamView& kv, int32_t P, int32_t part) {
  const int32_t n_pages = (kv.n_slots + kv.page_size - 1) / kv.page_size;
  const int32_t pg0 = static_cast<int32_t>(static_cast<int64_t>(part) * n_pages / P);
  const int32_t pg1 = static_cast<int32_t>(static_cast<int64_t>(part + 1) * n_pages / P);
  KvStreamView v = kv;
  v.pages = kv.pages + pg0;
  v.n_slots = std::min(kv.n_slots, pg1 * kv.page_size) - pg0 * kv.page_size;
  return v;
}

void run_part(const Path& path, const KvStreamView& kv, const AttentionArgs& a, int32_t P, int32_t part, float* out,
              float* lse) {
  AttentionArgs pa = a;
  pa.out = out;
  pa.out_stride = static_cast<int64_t>(a.group) * kv.head_dim;
  pa.lse = lse;
  pa.scratch = a.scratch + parts_scratch_floats(a.group, kv.head_dim);
  path.fn(part_view(kv, P, part), pa);
}

void run_path(const Path& path, const KvStreamView& kv, const AttentionArgs& a) {
  const int32_t P = attention_parts(kv, a);
  if (P == 1) {
    AttentionArgs pa = a;
    pa.scratch = a.scratch + parts_scratch_floats(a.group, kv.head_dim);
    path.fn(kv, pa);
    return;
  }
  const int32_t G = a.group, HD = kv.head_dim;
  float* part_out = a.scratch;
  float* part_lse = part_out + static_cast<size_t>(G) * HD;
  float* run_lse = part_lse + G;
  // n_new == 1: the output rows are out + g * head_dim whatever out_stride says.
  for (int32_t p = 0; p < P; ++p) {
    run_part(path, kv, a, P, p, part_out, part_lse);
    attention_fold(p, a.out, run_lse, part_out, part_lse, G, HD);
  }
  if (a.lse != nullptr) std::copy_n(run_lse, G, a.lse);
}

}  // namespace

void attention_merge(float* out, float* lse, const float* part_out, const float* part_lse, int32_t group,
                     int32_t head_dim) {
  // Two normalised partial outputs with log-sum-exps la, lb: weights e^la, e^lb over their sum.
  for (int32_t g = 0; g < group; ++g) {
    const float la = lse[g], lb = part_lse[g];
    const float m = std::max(la, lb);
    if (m == -std::numeric_limits<float>::infinity()) continue;  // neither part saw a finite score
    const float wa = std::exp(la - m), wb = std::exp(lb - m);
    const float inv = 1.0f / (wa + wb);
    float* o = out + static_cast<size_t>(g) * head_dim;
    const float* p = part_out + static_cast<size_t>(g) * head_dim;
    for (int32_t d = 0; d < head_dim; ++d) o[d] = (o[d] * wa + p[d] * wb) * inv;
    lse[g] = m + std::log(wa + wb);
  }
}

void attention_fold(int32_t part, float* out, float* lse, const float* part_out, const float* part_lse, int32_t group,
                    int32_t head_dim) {
  if (part > 0) {
    attention_merge(out, lse, part_out, part_lse, group, head_dim);
    return;
  }
  std::copy_n(part_out, static_cast<size_t>(group) * head_dim, out);
  std::copy_n(part_lse, group, lse);
}

void paged_attention_part(const KvStreamView& kv, const AttentionArgs& args, int32_t part, float* out, float* lse) {
  validate(kv, args);
  const int32_t P = attention_parts(kv, args);
  if (part < 0 || part >= P) fail("part out of range");
  run_part(chosen_path(), kv, args, P, part, out, lse);
}

void paged_attention(const KvStreamView& kv, const AttentionArgs& args) {
  validate(kv, args);
  if (args.n_new == 0) return;
  run_path(chosen_path(), kv, args);
}

const char* attention_isa() { return chosen_path().name; }

bool attention_quantises_queries(const char* isa, DType kv_type) {
  return kv_type == DType::Q8_0 && isa != nullptr && std::string_view(isa) == "avx512" &&
         attention_isa_available(isa) && cpu_has(CpuFeature::Avx512Vnni);
}

void attention_quantise_query_row(const float* x, int32_t n, float* out) {
  for (int32_t b = 0; b + 32 <= n; b += 32) {
    float amax = 0.0f;
    for (int32_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int32_t i = b; i < b + 32; ++i) out[i] = d * std::nearbyint(x[i] * id);
  }
}

bool attention_isa_available(const char* isa) { return find_path(isa) != nullptr; }

void paged_attention_on(const char* isa, const KvStreamView& kv, const AttentionArgs& args) {
  const Path* path = find_path(isa);
  if (path == nullptr)
    throw std::invalid_argument(std::string("paged_attention_on: path '") + (isa ? isa : "(null)") +
                                "' is unknown or not available on this CPU");
  validate(kv, args);
  if (args.n_new == 0) return;
  run_path(*path, kv, args);
}

}  // namespace kvpack::kernels
