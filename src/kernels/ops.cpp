#include "kernels/ops.h"

#include <cmath>

namespace kvpack::kernels {

void rmsnorm(const float* x, const float* w, int64_t n, float eps, float* out) {
  double ss = 0;  // double: the sum of squares of a 4K-wide activation loses digits in float
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
}

void rope_table(const int32_t* pos, int32_t n_pos, int32_t rot_dims, float theta_base, float freq_scale, float* cs,
                const float* freq_factors) {
  const int32_t half = rot_dims / 2;
  for (int32_t p = 0; p < n_pos; ++p) {
    for (int32_t i = 0; i < half; ++i) {
      const double freq = std::pow(static_cast<double>(theta_base), -2.0 * i / rot_dims) /
                          (freq_factors ? static_cast<double>(freq_factors[i]) : 1.0);
      const double angle = static_cast<double>(pos[p]) / freq_scale * freq;
      cs[(static_cast<int64_t>(p) * half + i) * 2] = static_cast<float>(std::cos(angle));
      cs[(static_cast<int64_t>(p) * half + i) * 2 + 1] = static_cast<float>(std::sin(angle));
    }
  }
}

void rope_apply(float* x, const float* cs, int32_t rot_dims, bool neox) {
  const int32_t half = rot_dims / 2;
  if (neox) {
    for (int32_t i = 0; i < half; ++i) {
      const float c = cs[2 * i], s = cs[2 * i + 1];
      const float a = x[i], b = x[i + half];
      x[i] = a * c - b * s;
      x[i + half] = a * s + b * c;
    }
  } else {
    for (int32_t i = 0; i < half; ++i) {
      const float c = cs[2 * i], s = cs[2 * i + 1];
      const float a = x[2 * i], b = x[2 * i + 1];
      x[2 * i] = a * c - b * s;
      x[2 * i + 1] = a * s + b * c;
    }
  }
}

void silu_mul(float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] = a[i] / (1.0f + std::exp(-a[i])) * b[i];
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

int64_t argmax(const float* x, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

}  // namespace kvpack::kernels
