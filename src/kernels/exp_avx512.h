// exp on 16 floats for the AVX-512 kernel files (attention, key scoring). Include only from *_avx512.cpp
// (built with the AVX-512 flags): the function lives in an anonymous namespace, so each object keeps its
// own copy and none can be picked by the linker for a baseline path (the ODR / SIGILL hazard of
// attention_impl.h). Thread-safety: a pure function.
#pragma once
#include <immintrin.h>

namespace kvpack::kernels {
namespace {

// exp(x), relative error ~1e-7 (Cephes expf polynomial, 2^n applied with vscalefps, so no overflow in the
// exponent arithmetic). x <= -104 gives 0, NaN propagates.
inline __m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);  // operand order: NaN in x is returned
  x = _mm512_min_ps(_mm512_set1_ps(88.72f), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

}  // namespace
}  // namespace kvpack::kernels
