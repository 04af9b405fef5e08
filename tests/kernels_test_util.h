// Helpers shared by the kernel tests (kernels_matmul_test.cpp, kernels_quant_test.cpp): the weight
// types every test runs over, and ggml's Q4_K scale decoding restated independently of the kernels.
#pragma once
#include <cstdint>

#include "kernels/quant.h"

namespace kvpack::kernels::test {

inline constexpr DType kAllTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K};

// Q4_K scale decoding restated from ggml's get_scale_min_k4 (independent of util/dtype.cpp and of the
// kernels' word-wise unpacking).
inline void q4k_scale_min(const uint8_t* q, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
  }
}

}  // namespace kvpack::kernels::test
