// matmul driver: argument checks, ISA dispatch, activation quantisation and the split into tasks.
// The kernels themselves live in matmul_scalar.cpp / matmul_avx2.cpp / matmul_avx512.cpp.
#include "kernels/matmul.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "kernels/cpu_features.h"
#include "kernels/matmul_internal.h"
#include "kernels/matmul_packed.h"
#include "util/half.h"

namespace kvpack::kernels {

namespace detail {
float act_block_scale(float amax) { return fp16_to_f32(f32_to_fp16(amax / 127.0f)); }

ActLayout act_layout(int64_t n_in) {
  const size_t nb = static_cast<size_t>(n_in) / kQBlock;
  auto up = [](size_t v) { return (v + 63) / 64 * 64; };
  const size_t qs = up(nb * 32), d = up(nb * 8 * sizeof(float)), b = up(nb * 8 * sizeof(int32_t));
  const size_t s = up(nb * sizeof(float));
  return ActLayout{0, qs, qs + d, qs + d + b, qs + d + b + s, qs + d + b + 2 * s};
}
}  // namespace detail

namespace {
using detail::IsaKernels;

int wkind(DType t) {
  switch (t) {
    case DType::F32: return detail::kF32;
    case DType::F16: return detail::kF16;
    case DType::BF16: return detail::kBF16;
    case DType::Q8_0: return detail::kQ8_0;
    case DType::Q4_0: return detail::kQ4_0;
    case DType::Q4_K: return detail::kQ4_K;
    case DType::Q6_K: return detail::kQ6_K;
    case DType::Q5_K: return detail::kQ5_K;
    case DType::Q3_K: return detail::kQ3_K;
    case DType::Q2_K: return detail::kQ2_K;
    case DType::IQ4_XS: return detail::kIQ4_XS;
    case DType::Q5_0: return detail::kQ5_0;
    case DType::Q5_1: return detail::kQ5_1;
    case DType::IQ4_NL: return detail::kIQ4_NL;
    default: return -1;
  }
}

const IsaKernels& isa_kernels(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return detail::kernels_avx512();
    case Isa::Avx2: return detail::kernels_avx2();
    default: return detail::kernels_scalar();
  }
}

// Per-thread scratch for the quantised activations of the quantised kinds. It grows to the largest
// request seen on this thread (n_tokens * ~3 * n_in bytes, e.g. 3 KB per token for n_in = 1024) and is
// reused, so steady-state calls allocate nothing; it is freed when the thread exits. Only the calling
// thread writes it; the pool's workers read it while the caller waits inside pool->run().
struct Scratch {
  std::unique_ptr<uint8_t[]> mem;
  size_t cap = 0;
  uint8_t* get(size_t bytes) {
    if (bytes > cap) {
      const size_t new_cap = std::max(bytes, cap + cap / 2);
      mem.reset();  // release first so peak memory is not old + new
      cap = 0;
      mem.reset(new uint8_t[new_cap + 64]);
      cap = new_cap;
    }
    auto p = reinterpret_cast<uintptr_t>(mem.get());
    return reinterpret_cast<uint8_t*>((p + 63) & ~uintptr_t{63});
  }
};
thread_local Scratch t_scratch;

template <class F>
void run_tasks(ThreadPool* pool, int64_t n_tasks, F&& fn) {
  if (pool == nullptr || pool->size() <= 1 || n_tasks <= 1) {
    for (int64_t i = 0; i < n_tasks; ++i) fn(i);
  } else {
    pool->run(static_cast<int>(n_tasks), [&](int task, int) { fn(task); });
  }
}

// Quantises every token's activations once into the calling thread's scratch (shared by all rows and
// threads of the matmul that follows), 16 tokens per task.
uint8_t* quantize_activations(const IsaKernels& K, int bias_k, const detail::ActLayout& L, const float* x, int64_t n_in,
                              int64_t n_tokens, ThreadPool* pool) {
  uint8_t* act = t_scratch.get(L.stride * static_cast<size_t>(n_tokens));
  const int64_t per_task = 16;
  run_tasks(pool, (n_tokens + per_task - 1) / per_task, [&](int64_t task) {
    const int64_t t1 = std::min(n_tokens, (task + 1) * per_task);
    for (int64_t t = task * per_task; t < t1; ++t) K.quant_act(x + t * n_in, n_in, bias_k, L, act + t * L.stride);
  });
  return act;
}

// The same for the super-block kinds' activations (ActLayoutK: one int8 super-block per 256, int16 sums per 16).
uint8_t* quantize_activations_k(const IsaKernels& K, const detail::ActLayoutK& L, const float* x, int64_t n_in,
                                int64_t n_tokens, ThreadPool* pool) {
  uint8_t* act = t_scratch.get(L.stride * static_cast<size_t>(n_tokens));
  const int64_t per_task = 16;
  run_tasks(pool, (n_tokens + per_task - 1) / per_task, [&](int64_t task) {
    const int64_t t1 = std::min(n_tokens, (task + 1) * per_task);
    for (int64_t t = task * per_task; t < t1; ++t) K.quant_act_k(x + t * n_in, n_in, L, act + t * L.stride);
  });
  return act;
}

// Tasks are (block of rows) x (chunk of tokens). The split depends only on the shape, never on the pool
// size, and every output element is computed by exactly one kernel call; the kernels' per-output arithmetic
// does not depend on the rows / tokens around it (batch invariance, see matmul.h), so the split affects
// speed only and results are bitwise identical for any thread count and batch. A row block is small enough
// (<= 256 KB of weights) to stay in L2 while the kernel walks its token tiles, and there are enough blocks
// (~32 for GEMV-sized matrices) for dynamic load balancing over the pool. `unit_bytes` is one row (or one
// packed 16-row group); blocks of 8 or more units are rounded down to a multiple of `round`.
struct TaskSplit {
  int64_t units_per_task, tok_chunk, n_tok_tasks, n_tasks;
};
TaskSplit split_tasks(size_t unit_bytes, int64_t n_units, int64_t n_tokens, int64_t round) {
  const size_t total_bytes = unit_bytes * static_cast<size_t>(n_units);
  const size_t task_bytes = std::clamp<size_t>(total_bytes / 32, size_t{32} << 10, size_t{256} << 10);
  int64_t per_task = std::max<int64_t>(1, static_cast<int64_t>(task_bytes / unit_bytes));
  if (per_task >= 8) per_task -= per_task % round;
  const int64_t n_unit_tasks = (n_units + per_task - 1) / per_task;
  // Few row blocks but many tokens (prefill of a small matrix): also split the tokens, in chunks that are
  // multiples of 8 (the widest token tile).
  int64_t tok_chunk = std::min<int64_t>(n_tokens, 64);
  if (n_unit_tasks < 16 && n_tokens > 8) {
    const int64_t want = (16 + n_unit_tasks - 1) / n_unit_tasks;
    tok_chunk = std::min(tok_chunk, std::max<int64_t>(8, ((n_tokens + want - 1) / want + 7) / 8 * 8));
  }
  const int64_t n_tok_tasks = (n_tokens + tok_chunk - 1) / tok_chunk;
  const int64_t n_tasks = n_unit_tasks * n_tok_tasks;
  if (n_tasks > (int64_t{1} << 30)) throw std::invalid_argument("matmul: too many tasks");
  return {per_task, tok_chunk, n_tok_tasks, n_tasks};
}

}  // namespace

bool matmul_supports(DType wtype) { return wkind(wtype) >= 0; }

void matmul_with_isa(Isa isa, const void* W, DType wtype, int64_t n_out, int64_t n_in, const float* x,
                     int64_t n_tokens, float* y, ThreadPool* pool) {
  const int kind = wkind(wtype);
  if (kind < 0) throw std::invalid_argument("matmul: unsupported weight type " + std::string(dtype_name(wtype)));
  if (!cpu_supports(isa)) throw std::invalid_argument(std::string("matmul: ISA not supported: ") + isa_name(isa));
  if (n_out < 0 || n_in < 0 || n_tokens < 0) throw std::invalid_argument("matmul: negative dimension");
  const bool superblock = kind >= detail::kQ4_K && kind <= detail::kIQ4_XS;  // ActLayoutK activations
  const bool quantized = kind >= detail::kQ8_0;
  const int64_t block = superblock ? detail::kQKBlock : detail::kQBlock;
  if (quantized && n_in % block != 0)
    throw std::invalid_argument("matmul: n_in " + std::to_string(n_in) + " is not a multiple of " +
                                std::to_string(block) + " for " + std::string(dtype_name(wtype)));
  if (n_out == 0 || n_tokens == 0) return;
  if (n_in == 0) {
    std::fill(y, y + n_out * n_tokens, 0.0f);
    return;
  }

  const IsaKernels* K = &isa_kernels(isa);
  if (K->rows[kind] == nullptr) K = &detail::kernels_scalar();

  detail::RowsArgs base{};
  base.W = static_cast<const uint8_t*>(W);
  base.row_bytes = row_bytes(wtype, static_cast<uint64_t>(n_in));
  base.n_in = n_in;
  base.x = x;
  base.x_stride = static_cast<size_t>(n_in) * sizeof(float);
  base.y = y;
  base.y_stride = n_out;

  if (superblock) {
    // One int8 super-block per 256 activations (shared by all rows and threads).
    const detail::ActLayoutK L = detail::act_layout_k(n_in);
    uint8_t* act = quantize_activations_k(*K, L, x, n_in, n_tokens, pool);
    base.x = act;
    base.x_stride = L.stride;
    base.actk = L;
  } else if (quantized) {
    // Quantise every token's activations once (shared by all rows and threads).
    const detail::ActLayout L = detail::act_layout(n_in);
    uint8_t* act = quantize_activations(*K, K->bias_k[kind], L, x, n_in, n_tokens, pool);
    base.x = act;
    base.x_stride = L.stride;
    base.act = L;
  }

  const TaskSplit sp = split_tasks(base.row_bytes, n_out, n_tokens, 4);
  const int64_t rows_per_task = sp.units_per_task, tok_chunk = sp.tok_chunk, n_tok_tasks = sp.n_tok_tasks;
  const int64_t n_tasks = sp.n_tasks;

  const detail::RowsFn rows = K->rows[kind];
  run_tasks(pool, n_tasks, [&](int64_t task) {
    const int64_t rt = task / n_tok_tasks, tt = task % n_tok_tasks;
    detail::RowsArgs a = base;
    a.r0 = rt * rows_per_task;
    a.r1 = std::min(n_out, a.r0 + rows_per_task);
    const int64_t t0 = tt * tok_chunk;
    a.n_tokens = std::min(n_tokens, t0 + tok_chunk) - t0;
    a.x = static_cast<const char*>(base.x) + static_cast<size_t>(t0) * base.x_stride;
    a.y = base.y + t0 * n_out;
    rows(a);
  });
}

void matmul(const void* W, DType wtype, int64_t n_out, int64_t n_in, const float* x, int64_t n_tokens, float* y,
            ThreadPool* pool) {
  matmul_with_isa(selected_isa(), W, wtype, n_out, n_in, x, n_tokens, y, pool);
}

namespace {

// The checks both packed layouts make; false when there is nothing to compute.
template <class P>
bool packed_call_ok(const P& W, int64_t n_tokens, Isa isa) {
  if (!W) throw std::invalid_argument("matmul_packed: empty packed weight");
  if (isa != Isa::Avx512 && isa != Isa::Scalar)
    throw std::invalid_argument(std::string("matmul_packed: no packed path for ") + isa_name(isa));
  if (!cpu_supports(isa)) throw std::invalid_argument(std::string("matmul_packed: ISA not supported: ") + isa_name(isa));
  if (n_tokens < 0) throw std::invalid_argument("matmul_packed: negative dimension");
  return n_tokens > 0 && W.n_out() > 0;
}

// Tasks over (16-row groups x token chunks) of a packed W: `base` filled but for g0 / g1 / x / y / n_tokens;
// an even number of groups per task lets the cached tiles pair groups.
template <class P, class Args, class Fn>
void run_packed(const P& W, const Args& base, const uint8_t* act, size_t act_stride, int64_t n_tokens, float* y,
                ThreadPool* pool, Fn fn) {
  const TaskSplit sp = split_tasks(W.group_bytes(), W.n_groups(), n_tokens, 2);
  run_tasks(pool, sp.n_tasks, [&](int64_t task) {
    const int64_t gt = task / sp.n_tok_tasks, tt = task % sp.n_tok_tasks;
    Args a = base;
    a.g0 = gt * sp.units_per_task;
    a.g1 = std::min(W.n_groups(), a.g0 + sp.units_per_task);
    const int64_t t0 = tt * sp.tok_chunk;
    a.n_tokens = std::min(n_tokens, t0 + sp.tok_chunk) - t0;
    a.x = act + static_cast<size_t>(t0) * act_stride;
    a.y = y + t0 * W.n_out();
    fn(a);
  });
}

}  // namespace

void matmul_packed(const PackedQ8& W, const float* x, int64_t n_tokens, float* y, ThreadPool* pool, Isa isa) {
  if (!packed_call_ok(W, n_tokens, isa)) return;
  const int64_t n_in = W.n_in(), n_out = W.n_out();
  const IsaKernels& K = isa_kernels(isa);
  // Activations as for row-layout Q8_0 (bias K = 128 for the unsigned weight codes).
  const detail::ActLayout L = detail::act_layout(n_in);
  uint8_t* act = quantize_activations(K, 128, L, x, n_in, n_tokens, pool);
  detail::PackedArgs base{};
  base.W = W.group(0);
  base.group_bytes = W.group_bytes();
  base.nb = n_in / 32;
  base.n_out = n_out;
  base.x_stride = L.stride;
  base.y_stride = n_out;
  base.act = L;
  run_packed(W, base, act, L.stride, n_tokens, y, pool, isa == Isa::Avx512 ? detail::packed_q8_avx512 : detail::packed_q8_scalar);
}

void matmul_packed(const PackedQ4K& W, const float* x, int64_t n_tokens, float* y, ThreadPool* pool, Isa isa) {
  if (!packed_call_ok(W, n_tokens, isa)) return;
  const int64_t n_in = W.n_in(), n_out = W.n_out();
  const IsaKernels& K = isa_kernels(isa);
  // Activations as for the row-layout super-block kinds (one int8 super-block per 256, int16 sums per 16).
  const detail::ActLayoutK L = detail::act_layout_k(n_in);
  uint8_t* act = quantize_activations_k(K, L, x, n_in, n_tokens, pool);
  detail::PackedArgsK base{};
  base.W = W.group(0);
  base.group_bytes = W.group_bytes();
  base.nsb = n_in / 256;
  base.n_out = n_out;
  base.x_stride = L.stride;
  base.y_stride = n_out;
  base.act = L;
  run_packed(W, base, act, L.stride, n_tokens, y, pool, isa == Isa::Avx512 ? detail::packed_q4k_avx512 : detail::packed_q4k_scalar);
}

const char* matmul_isa() { return isa_name(selected_isa()); }

}  // namespace kvpack::kernels
