// Weight x activation products for every supported weight type.
//
//   y[t][o] = sum_i W[o][i] * x[t][i]      for t in [0, n_tokens), o in [0, n_out)
//
// W is row-major in GGUF layout: n_out rows of n_in elements, each row encoded in `wtype`
// (row_bytes(wtype, n_in) bytes; quantized rows are whole blocks). x and y are f32, dense, row stride
// n_in / n_out. n_tokens == 1 is the decode GEMV; larger n_tokens is prefill or batched decode and must
// read each weight row once per group of tokens, not once per token.
// Dispatch: the best path this CPU supports (AVX-512 / AVX2 / portable) is chosen once at start-up;
// KVPACK_ISA=scalar|avx2|avx512 forces one (see kernels/cpu_features.h).
// Thread-safety: pure function; parallelises over output rows with `pool` (may be nullptr).
// Batch invariance (every path): y[t][o] is a fixed function of W row o, x row t, n_in and wtype, bitwise:
// the same whether token t is computed alone (n_tokens = 1), in any batch of other tokens, at any position
// in it, and on any pool size. Each ISA path accumulates a dot product with one fixed schedule per weight
// type (number of partial sums, which vectors/blocks feed which, tail, combine and horizontal-sum order),
// whatever register micro-tile or thread computes it. This is what lets a serving engine batch unrelated
// requests (prefill chunks, batched decode) without changing any request's greedy output. Results do
// differ between ISA paths (scalar / AVX2 / AVX-512), within the tolerances documented in the tests.
// Supported weight types: F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q5_1, IQ4_NL (32-element blocks) and Q2_K, Q3_K,
// Q4_K, Q5_K, Q6_K, IQ4_XS (256-element super-blocks); block layouts in kernels/quant.h.
#pragma once
#include <cstdint>

#include "kernels/cpu_features.h"
#include "util/dtype.h"
#include "util/thread_pool.h"

namespace kvpack::kernels {

// True for weight types matmul() accepts (F32, F16, BF16, Q8_0 at least).
bool matmul_supports(DType wtype);

void matmul(const void* W, DType wtype, int64_t n_out, int64_t n_in, const float* x, int64_t n_tokens, float* y,
            ThreadPool* pool);

// Dequantises one row of n elements into f32 (embedding lookup, tests, tools).
void dequantize_row(const void* row, DType type, int64_t n, float* out);
// Quantises n f32 values into one row of `type` (writer tools, tests). n must be a block multiple.
// Both handle every type matmul() supports (ggml's reference rounding for Q8_0/Q4_0; for Q4_K a
// make_qkx2-style search, not bit-identical to ggml, see util/dtype.h; the other codecs in
// util/quant_codecs.h) and throw std::invalid_argument for other types or a partial block (32 elements; 256
// for the super-block types).
void quantize_row(const float* x, DType type, int64_t n, void* out);

// Name of the instruction set the dispatcher picked ("avx512", "avx2", "scalar").
const char* matmul_isa();

// matmul() on an explicitly chosen path (tests, benchmarks); throws std::invalid_argument if this CPU
// cannot run `isa` (check cpu_supports(isa) first). matmul() == matmul_with_isa(selected_isa(), ...).
// Errors (both functions): std::invalid_argument for an unsupported weight type or an n_in that is not
// a block multiple for quantised types (32; 256 for the super-block types).
// Numerics: F32/F16/BF16 weights are widened exactly to f32 and multiplied with f32 activations (FMA,
// f32 accumulation). Q8_0/Q4_0 quantise each activation row to int8 blocks of 32 (d = amax/127,
// round-to-nearest-even, bit-identical on every path) and accumulate exact int32 block dots, so their
// error vs the dequantised weights is dominated by the activation rounding (<= d/2 per element).
// Q5_0 / Q5_1 / IQ4_NL use the same 32-element activation blocks (Q5_1 adds m * d_x sum(x_q) per block).
// The super-block types (Q2_K..Q6_K, IQ4_XS) quantise activations per 256 elements (one scale, plus int16
// sums per 16 for mins and code offsets, like ggml's Q8_K): a super-block's sub-block dots and scales add up
// in exact int32, then one f32 multiply-add per super-block (one more for the mins). The coarser activation
// step costs accuracy where one outlier sets a super-block's scale (tests/engine_weight_types_test.cpp
// measures it); it removes the per-32 convert + FMA that made Q4_K decode compute-bound.
// Scratch: the quantised types keep the quantised activations in a per-thread buffer that grows to the largest
// n_tokens * ~3 * n_in bytes seen on the calling thread and is reused (no allocation in steady state).
// Pointers: W rows must be aligned to their element size (4 for F32, 2 otherwise); x and y need only
// float alignment.
void matmul_with_isa(Isa isa, const void* W, DType wtype, int64_t n_out, int64_t n_in, const float* x,
                     int64_t n_tokens, float* y, ThreadPool* pool);

}  // namespace kvpack::kernels
