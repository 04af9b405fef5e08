// paged_attention: argument checks, scratch size and the run-time choice of the instruction-set path.
// The kernels themselves are in attention_scalar.cpp / attention_avx2.cpp / attention_avx512.cpp; the
// shared driver (tiling, causal limits, online softmax, key_mass pass) is attention_impl.h.
#include "kernels/attention.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/attention_impl.h"

namespace kvpack::kernels {
namespace {

using Fn = void (*)(const KvStreamView&, const AttentionArgs&);

struct Path {
  const char* name;
  Fn fn;
};

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

// Returns the path named `isa` if this CPU can run it, else nullptr.
const Path* find_path(const char* isa) {
  static const Path kScalar{"scalar", attn_detail::paged_attention_scalar};
  static const Path kAvx2{"avx2", attn_detail::paged_attention_avx2};
  static const Path kAvx512{"avx512", attn_detail::paged_attention_avx512};
  if (isa == nullptr) return nullptr;
  if (std::strcmp(isa, "scalar") == 0) return &kScalar;
  if (std::strcmp(isa, "avx2") == 0) return cpu_has_avx2() ? &kAvx2 : nullptr;
  if (std::strcmp(isa, "avx512") == 0) return cpu_has_avx512() ? &kAvx512 : nullptr;
  return nullptr;
}

const Path& chosen_path() {
  static const Path* path = [] {
    const Path* best = find_path(cpu_has_avx512() ? "avx512" : cpu_has_avx2() ? "avx2" : "scalar");
    if (const char* env = std::getenv("KVPACK_ISA"); env != nullptr && *env != '\0') {
      if (const Path* forced = find_path(env)) return forced;
      std::fprintf(stderr, "kvpack: KVPACK_ISA=%s is not available for attention on this CPU; using %s\n", env,
                   best->name);
    }
    return best;
  }();
  return *path;
}

[[noreturn]] void fail(const std::string& what) { throw std::invalid_argument("paged_attention: " + what); }

void validate(const KvStreamView& kv, const AttentionArgs& a) {
  if (kv.kv_type != DType::F32 && kv.kv_type != DType::F16) fail("kv_type must be F32 or F16");
  if (kv.head_dim <= 0 || kv.page_size <= 0) fail("head_dim and page_size must be positive");
  if (a.group <= 0) fail("group must be positive");
  if (a.n_new < 0 || a.n_new > kv.n_slots) fail("need 0 <= n_new <= n_slots");
  if (a.n_new == 0) return;
  const size_t esz = kv.kv_type == DType::F16 ? 2 : 4;
  if (kv.v_offset < static_cast<size_t>(kv.page_size) * kv.head_dim * esz) fail("v_offset overlaps the K block");
  if (kv.pages == nullptr || a.q == nullptr || a.out == nullptr || a.scratch == nullptr)
    fail("pages, q, out and scratch must be non-null");
  if (a.n_new > 1 && (a.q_stride < static_cast<int64_t>(a.group) * kv.head_dim ||
                      a.out_stride < static_cast<int64_t>(a.group) * kv.head_dim))
    fail("q_stride / out_stride smaller than group * head_dim");
}

}  // namespace

size_t attention_scratch_floats(int32_t n_new, int32_t group, int32_t head_dim, int32_t page_size) {
  return attn_detail::scratch_floats(n_new, group < 1 ? 1 : group, head_dim, page_size);
}

void paged_attention(const KvStreamView& kv, const AttentionArgs& args) {
  validate(kv, args);
  if (args.n_new == 0) return;
  chosen_path().fn(kv, args);
}

const char* attention_isa() { return chosen_path().name; }

bool attention_isa_available(const char* isa) { return find_path(isa) != nullptr; }

void paged_attention_on(const char* isa, const KvStreamView& kv, const AttentionArgs& args) {
  const Path* path = find_path(isa);
  if (path == nullptr)
    throw std::invalid_argument(std::string("paged_attention_on: path '") + (isa ? isa : "(null)") +
                                "' is unknown or not available on this CPU");
  validate(kv, args);
  if (args.n_new == 0) return;
  path->fn(kv, args);
}

}  // namespace kvpack::kernels
