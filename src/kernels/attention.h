// Paged flash attention over one KV stream (one layer x one KV head).
//
// A stream's tokens live in pages (see kv/page_pool.h): page p holds K[page_size][head_dim] followed by
// V[page_size][head_dim], rows of `kv_type` (see "KV element types" below: F32, F16, BF16 or Q8_0). Slot s of
// the stream is slot s % page_size of page pages[s / page_size]. Keys are stored after RoPE, so slots carry
// no position.
//
// The G query heads that share this KV head (GQA group) are processed together so each K/V page is
// read once per group. The last `n_new` slots belong to the `n_new` query tokens (they were just
// written); query token t (0-based among the new ones) sees slots [0, n_slots - n_new + t + 1): causal.
// Decode is n_new == 1. Online softmax across pages: the score matrix is never materialised.
//
//   q(t, g)   = q   + t * q_stride   + g * head_dim      (f32, already RoPE'd)
//   out(t, g) = out + t * out_stride + g * head_dim      (f32)
// Thread-safety: pure function; the caller parallelises over (layer, kv head) streams / token blocks.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "util/dtype.h"

namespace kvpack::kernels {

// ---- KV element types -------------------------------------------------------------------------------
// A K (or V) row of head_dim elements is stored as one of:
//   F32, F16 (IEEE half), BF16 (bfloat16): head_dim elements of 4 / 2 / 2 bytes;
//   Q8_0: head_dim / 32 ggml block_q8_0 (f16 scale d, then 32 int8 q; value = d * q), 34 bytes per 32
//         elements (17/32 of F16), so Q8_0 needs head_dim % 32 == 0.
bool kv_type_supported(DType t);
// Bytes of one K (or V) row. Throws std::invalid_argument for an unsupported type, head_dim <= 0, or a
// head_dim that is not a multiple of 32 with Q8_0 (the message says so).
size_t kv_row_bytes(DType t, int32_t head_dim);
// One row from f32: F16 / BF16 round to nearest even; Q8_0 uses ggml's reference quantiser
// (quantize_row_q8_0_ref: d = amax / 127, q = roundf(x / d) (half away from zero), d stored as f16).
// n must be a multiple of 32 for Q8_0 (unchecked: callers size rows with kv_row_bytes).
void kv_encode_row(const float* x, DType t, int32_t n, uint8_t* dst);
// kv_encode_row on an explicitly chosen path ("scalar", "avx2", "avx512": F16 uses the hardware conversion on
// the SIMD paths, the same bits as the scalar one); throws std::invalid_argument if this CPU cannot run it.
void kv_encode_row_on(const char* isa, const float* x, DType t, int32_t n, uint8_t* dst);
// One row to f32 (exact for every type: d * q is computed in f32 as the kernels do).
void kv_decode_row(const uint8_t* src, DType t, int32_t n, float* out);
// Lower-case CLI names: "f32", "f16", "bf16", "q8_0".
const char* kv_type_name(DType t);
// Inverse of kv_type_name; throws std::invalid_argument naming the accepted values.
DType parse_kv_type(std::string_view name);

// Decode reads a stream's pages in page-table order and prefetches (into L2) the K and V blocks of the page
// this many pages ahead (attention_impl.h says why and what was measured); bench_attention's read roofline
// uses the same distance.
inline constexpr int32_t kAttentionPrefetchPages = 4;

// Whether decode prefetches page `i` of the table (i >= 1) in software: not when it starts at most one page
// record past page i - 1 (`page_span` = the V offset + one block + slack for the per-slot positions), i.e.
// the stream continues in address order, as a long append or prefill leaves a stream's pages; the hardware
// prefetchers stream such runs, and software prefetches on top of them halved the rate (bench_attention
// layer/decode ordered, 2 threads: 25.7 GB/s with them, 50.6 without; scattered pages need them: 22.6 vs 15.4).
inline bool kv_page_needs_prefetch(const uint8_t* const* pages, int32_t i, size_t page_span) {
  const auto prev = reinterpret_cast<uintptr_t>(pages[i - 1]);  // pages of different chunks: compare addresses
  const auto cur = reinterpret_cast<uintptr_t>(pages[i]);
  return !(cur > prev && cur - prev <= page_span);
}

struct KvStreamView {
  const uint8_t* const* pages = nullptr;  // page base pointers, in stream order
  int32_t n_slots = 0;                    // valid slots (tokens) in the stream
  int32_t page_size = 16;
  int32_t head_dim = 0;
  DType kv_type = DType::F32;
  size_t v_offset = 0;  // byte offset of the V block inside a page (>= page_size * kv_row_bytes(kv_type, head_dim))
};

// kv_page_needs_prefetch's `page_span` for a stream: its V offset, one block, and slack for the positions.
inline size_t kv_page_span(const KvStreamView& kv) {
  return kv.v_offset + kv_row_bytes(kv.kv_type, kv.head_dim) * static_cast<size_t>(kv.page_size) + 4096;
}

struct AttentionArgs {
  const float* q = nullptr;
  int64_t q_stride = 0;    // floats between consecutive tokens' q rows
  float* out = nullptr;
  int64_t out_stride = 0;  // floats between consecutive tokens' out rows
  int32_t n_new = 1;       // query tokens (the last n_new slots are theirs)
  int32_t group = 1;       // query heads sharing this KV head
  float scale = 1.0f;      // usually 1/sqrt(head_dim)
  // Optional: per-slot attention probability mass accumulated over all query tokens and heads
  // (H2O's signal). nullptr = not computed (fast path). Length n_slots; the kernel adds to it.
  float* key_mass = nullptr;
  // Optional: log-sum-exp of each query row's scaled logits over the slots it saw, ln(sum_j exp(s_j)) with
  // s_j = scale * q.k_j: lse[t * group + g] for new token t, head g of the group (recall's hot mass, a
  // by-product of the online softmax: its final max m and sum l give m + ln l). nullptr = not written.
  float* lse = nullptr;
  // Scratch of at least attention_scratch_floats(...) floats, owned by the caller (no allocation here).
  float* scratch = nullptr;
};

// Non-decreasing in every argument: a buffer sized for the largest n_new / page_size serves any smaller call.
size_t attention_scratch_floats(int32_t n_new, int32_t group, int32_t head_dim, int32_t page_size);

void paged_attention(const KvStreamView& kv, const AttentionArgs& args);

// ---- Decode at depth in parts (split-K) ------------------------------------------------------------
// One query token (n_new == 1, no key_mass) over a stream of at least 2 x kAttentionPartSlots slots is
// computed as P = attention_parts(kv, args) consecutive page-aligned parts (P = min(n_slots / 512, 8): a
// function of the stream's length and page size only), each an independent online softmax over its slots,
// folded left to right by attention_merge. paged_attention does exactly that; a caller with more threads than streams
// (one KV head, few sequences) may instead run paged_attention_part for each part as its own task and fold
// the parts in order with attention_merge: the same bits either way, whatever the thread count. H2O's
// key_mass needs one softmax over all slots, so a call with key_mass is never split (P = 1): at depth its
// output can differ in the last bits from the same call without key_mass (within the kernel's tolerance).
inline constexpr int32_t kAttentionPartSlots = 512;  // a part holds about this many slots or more
inline constexpr int32_t kAttentionMaxParts = 8;
int32_t attention_parts(const KvStreamView& kv, const AttentionArgs& args);
// Part `part` of a split decode call: its normalised output rows out[g * head_dim + d] (group x head_dim
// floats) and their log-sum-exps lse[g] (group floats). args.out and args.lse are not written; args.scratch
// is used as by paged_attention.
void paged_attention_part(const KvStreamView& kv, const AttentionArgs& args, int32_t part, float* out, float* lse);
// Folds a part into the running result: out / lse (group rows of head_dim, normalised, and their
// log-sum-exps) become the attention over both parts' slots.
void attention_merge(float* out, float* lse, const float* part_out, const float* part_lse, int32_t group,
                     int32_t head_dim);
// The fold of the parts, in order: part 0 starts the running result (copied), each later one is merged. The
// one rule paged_attention and a caller running the parts as tasks both follow, hence the same bits.
void attention_fold(int32_t part, float* out, float* lse, const float* part_out, const float* part_lse, int32_t group,
                    int32_t head_dim);

// Instruction-set paths. paged_attention() uses kernels/cpu_features' choice for attention
// (selected_isa(kAttentionIsa): the best path this CPU supports, "avx512" needing no VNNI, then "avx2",
// then "scalar"; KVPACK_ISA=scalar|avx2|avx512 forces one, ignored with a note on stderr if this CPU
// cannot run it).
// Invalid arguments (unsupported kv_type, n_new > n_slots, null pointers, ...) throw std::invalid_argument.
const char* attention_isa();
// True if `isa` names a path ("scalar", "avx2", "avx512", or "avx512_novnni": avx512 without its VNNI QK,
// for tests) that this CPU can run.
bool attention_isa_available(const char* isa);
// Q8_0 keys on a CPU with AVX-512 VNNI: the avx512 path quantises each query row (times `scale`) per 32
// elements and takes the scores as exact int8 dot products times d_k * d_q, as llama.cpp's CPU path does for
// a q8_0 K cache. The other paths (and F32 / F16 / BF16 keys) score the f32 query. True if `isa` does that
// for `kv_type` on this CPU.
bool attention_quantises_queries(const char* isa, DType kv_type);
// The query quantisation of that path, on n (a multiple of 32) floats already times the scale, written back
// as the values it stands for: per 32 elements d = amax / 127 (f32), q = nearbyint(x * (1 / d)) (round to
// nearest even; 0 where d == 0), out = d * q. The kernel's scores are those of these values up to f32
// rounding (tests/kernels_attention_test.cpp checks it against the double reference).
void attention_quantise_query_row(const float* x, int32_t n, float* out);
// paged_attention() on an explicitly chosen path (tests, benchmarks); throws std::invalid_argument if the
// path is unknown or not available on this CPU.
void paged_attention_on(const char* isa, const KvStreamView& kv, const AttentionArgs& args);

}  // namespace kvpack::kernels
