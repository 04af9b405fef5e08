// Batch invariance of kernels/matmul.h: on every ISA path this CPU can run and for every weight type,
// output row t of an n_tokens-token matmul is bitwise identical to the same token computed alone
// (n_tokens = 1), and to the same call on a 1- and a 2-thread pool. A serving engine batches the
// tokens of unrelated requests into one matmul; if a row's summation order depended on how many other
// rows share its micro-tile (or on the row/token tile it lands in, or on the thread split), a request's
// greedy output would change with what else is in flight. The shapes make every micro-tile kind occur:
// n_out not a multiple of any row tile (remainder rows), n_tokens around and across every token tile
// (1..9, 13, 16, 17, 33) and the driver's 64-token chunks (64, 65), n_in with a masked / odd-block tail.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/matmul.h"
#include "kernels/quant.h"
#include "kernels_test_util.h"
#include "util/thread_pool.h"

namespace kvpack::kernels {
namespace {

// Every kind matmul() supports, the super-block and 32-block kinds of kernels_kquant_matmul_test.cpp too.
constexpr DType kAllTypes[] = {DType::F32,  DType::F16,  DType::BF16,   DType::Q8_0, DType::Q4_0,
                               DType::Q4_K, DType::Q6_K, DType::Q5_K,   DType::Q3_K, DType::Q2_K,
                               DType::IQ4_XS, DType::Q5_0, DType::Q5_1, DType::IQ4_NL};

constexpr int64_t kTokenCounts[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 33, 64, 65};
constexpr int64_t kMaxTokens = 65;

bool is_quant(DType t) { return traits(t).block_elems > 1; }

// n_in values for `type`: 256, 512, 3072 for all (whole Q4_K super-blocks), plus a length with a tail:
// 517 (masked last vector) for F kinds, 288 (odd number of 32-blocks: the single-block tail) for Q8_0 /
// Q4_0. Q4_K rows are whole 256-blocks by definition.
// The kinds added with the super-block kernels (Q6_K .. IQ4_NL) run fewer, smaller shapes: their scalar paths
// decode every block through the reference codec, and the suite also runs under the sanitizers.
bool added_kind(DType t) {
  return t != DType::F32 && t != DType::F16 && t != DType::BF16 && t != DType::Q8_0 && t != DType::Q4_0 &&
         t != DType::Q4_K;
}

std::vector<int64_t> n_in_values(DType type) {
  std::vector<int64_t> v = added_kind(type) ? std::vector<int64_t>{256, 768} : std::vector<int64_t>{256, 512, 3072};
  if (!is_quant(type)) v.push_back(517);
  if (traits(type).block_elems == 32) v.push_back(288);
  return v;
}

std::vector<uint8_t> make_weights(DType type, int64_t n_out, int64_t n_in, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const size_t rb = row_bytes(type, n_in);
  std::vector<uint8_t> w(rb * n_out);
  std::vector<float> row(n_in);
  for (int64_t o = 0; o < n_out; ++o) {
    const float scale = 0.01f * static_cast<float>(1 + o % 7);
    for (auto& v : row) v = u(rng) * scale;
    quantize_row(row.data(), type, n_in, w.data() + o * rb);
  }
  return w;
}

// n_tok activation rows, each with its own magnitude (tokens of different requests) and occasional outlier
// channels (LLM hidden states), so the sums have cancellation and rounding in every bit position.
std::vector<float> make_acts(int64_t n_tok, int64_t n_in, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::uniform_real_distribution<float> e(-4.0f, 4.0f);
  std::vector<float> x(n_tok * n_in);
  for (int64_t t = 0; t < n_tok; ++t) {
    const float scale = std::exp2(e(rng));
    for (int64_t i = 0; i < n_in; ++i) x[t * n_in + i] = g(rng) * scale * (i % 61 == 5 ? 16.0f : 1.0f);
  }
  return x;
}

class MatmulBatchInvariance : public ::testing::TestWithParam<std::tuple<Isa, DType>> {
 protected:
  void SetUp() override {
    if (!cpu_supports(std::get<0>(GetParam()))) GTEST_SKIP() << isa_name(std::get<0>(GetParam())) << " not supported";
  }
};

TEST_P(MatmulBatchInvariance, EveryRowEqualsItsSoloResult) {
  const auto [isa, type] = GetParam();
  ThreadPool pool1(1), pool2(2);
  int64_t rows_checked = 0;
  for (int64_t n_out : {int64_t{37}, added_kind(type) ? int64_t{301} : int64_t{1029}}) {
    for (int64_t n_in : n_in_values(type)) {
      std::mt19937 rng(static_cast<uint32_t>(n_out * 7919 + n_in));
      const std::vector<uint8_t> w = make_weights(type, n_out, n_in, rng);
      const std::vector<float> x = make_acts(kMaxTokens, n_in, rng);
      // Token t alone (the decode GEMV), no pool.
      std::vector<float> solo(kMaxTokens * n_out);
      for (int64_t t = 0; t < kMaxTokens; ++t)
        matmul_with_isa(isa, w.data(), type, n_out, n_in, x.data() + t * n_in, 1, solo.data() + t * n_out, nullptr);
      for (int64_t n_tok : kTokenCounts) {
        const std::string where = std::string(isa_name(isa)) + " " + std::string(dtype_name(type)) +
                                  " n_out=" + std::to_string(n_out) + " n_in=" + std::to_string(n_in) +
                                  " n_tokens=" + std::to_string(n_tok);
        for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool1, &pool2}) {
          std::vector<float> y(n_tok * n_out);
          matmul_with_isa(isa, w.data(), type, n_out, n_in, x.data(), n_tok, y.data(), pool);
          int64_t bad_rows = 0, first_bad = -1;
          for (int64_t t = 0; t < n_tok; ++t) {
            if (std::memcmp(y.data() + t * n_out, solo.data() + t * n_out, n_out * sizeof(float)) != 0) {
              if (first_bad < 0) first_bad = t;
              ++bad_rows;
            }
          }
          rows_checked += n_tok;
          EXPECT_EQ(bad_rows, 0) << where << " threads=" << (pool ? pool->size() : 0) << ": " << bad_rows
                                 << " token rows differ from their solo result (first: t=" << first_bad << ")";
        }
      }
    }
  }
  RecordProperty("rows_checked", static_cast<int>(rows_checked));
}

const Isa kAllIsas[] = {Isa::Scalar, Isa::Avx2, Isa::Avx512};

INSTANTIATE_TEST_SUITE_P(AllPaths, MatmulBatchInvariance,
                         ::testing::Combine(::testing::ValuesIn(kAllIsas), ::testing::ValuesIn(kAllTypes)),
                         [](const ::testing::TestParamInfo<MatmulBatchInvariance::ParamType>& info) {
                           return std::string(isa_name(std::get<0>(info.param))) + "_" +
                                  std::string(dtype_name(std::get<1>(info.param)));
                         });

}  // namespace
}  // namespace kvpack::kernels
