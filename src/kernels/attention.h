// Paged flash attention over one KV stream (one layer x one KV head).
//
// A stream's tokens live in pages (see kv/page_pool.h): page p holds K[page_size][head_dim] followed by
// V[page_size][head_dim], elements of `kv_type` (F32 or F16). Slot s of the stream is slot s % page_size
// of page pages[s / page_size]. Keys are stored after RoPE, so slots carry no position.
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

#include "util/dtype.h"

namespace kvpack::kernels {

struct KvStreamView {
  const uint8_t* const* pages = nullptr;  // page base pointers, in stream order
  int32_t n_slots = 0;                    // valid slots (tokens) in the stream
  int32_t page_size = 16;
  int32_t head_dim = 0;
  DType kv_type = DType::F32;
  size_t v_offset = 0;  // byte offset of the V block inside a page (= page_size * head_dim * elem size)
  // Optional per-slot hole flags (n_slots bytes, non-zero = evicted but not compacted away): such slots
  // get no attention weight. Only the "naive eviction" demonstration mode uses holes; nullptr = none.
  const uint8_t* holes = nullptr;
};

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
  // Scratch of at least attention_scratch_floats(...) floats, owned by the caller (no allocation here).
  float* scratch = nullptr;
};

// Non-decreasing in every argument: a buffer sized for the largest n_new / page_size serves any smaller call.
size_t attention_scratch_floats(int32_t n_new, int32_t group, int32_t head_dim, int32_t page_size);

void paged_attention(const KvStreamView& kv, const AttentionArgs& args);

// Instruction-set paths. paged_attention() uses the best one this CPU supports ("avx512", then "avx2",
// then "scalar"), chosen once on first use; the environment variable KVPACK_ISA=scalar|avx2|avx512 forces
// one (ignored, with a warning on stderr, if this CPU cannot run it).
// Invalid arguments (unsupported kv_type, n_new > n_slots, null pointers, ...) throw std::invalid_argument.
const char* attention_isa();
// True if `isa` names a path ("scalar", "avx2", "avx512") that this CPU can run.
bool attention_isa_available(const char* isa);
// paged_attention() on an explicitly chosen path (tests, benchmarks); throws std::invalid_argument if the
// path is unknown or not available on this CPU.
void paged_attention_on(const char* isa, const KvStreamView& kv, const AttentionArgs& args);

}  // namespace kvpack::kernels
