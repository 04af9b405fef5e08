// Small element-wise kernels of the forward pass (norms, RoPE, activations). They are O(dim) per token
// next to the O(dim^2) matmuls, so plain loops the compiler vectorises are enough; keep them simple.
// Thread-safety: pure functions.
#pragma once
#include <cstdint>

namespace kvpack::kernels {

// out[i] = x[i] / rms(x) * w[i]; out may alias x.
void rmsnorm(const float* x, const float* w, int64_t n, float eps, float* out);

// RoPE rotation tables for `n_pos` positions: cs[p][i] = (cos, sin) of pos[p] * theta_base^(-2i/rot_dims)
// for i < rot_dims/2, interleaved as cos,sin pairs. freq_scale divides positions (linear scaling).
// freq_factors (rot_dims/2 values, or nullptr) divide each frequency: Llama 3's rope_freqs.weight, the
// "llama3" scaling that llama.cpp passes to ggml_rope_ext as its freq_factors.
void rope_table(const int32_t* pos, int32_t n_pos, int32_t rot_dims, float theta_base, float freq_scale, float* cs,
                const float* freq_factors = nullptr);

// Rotates one head vector in place with one row of rope_table. neox=false: pairs (2i, 2i+1) (llama.cpp
// "normal", llama2.c); neox=true: pairs (i, i + rot_dims/2) (NeoX / Qwen / HF layout).
void rope_apply(float* x, const float* cs_row, int32_t rot_dims, bool neox);

// a[i] = silu(a[i]) * b[i]   (SwiGLU)
void silu_mul(float* a, const float* b, int64_t n);

// y[i] += x[i]
void add_inplace(float* y, const float* x, int64_t n);

int64_t argmax(const float* x, int64_t n);

}  // namespace kvpack::kernels
