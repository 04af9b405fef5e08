// Tests for kernels/matmul.h: every ISA path this CPU can run (forced with matmul_with_isa; paths the CPU
// lacks are skipped) against a double-precision reference, over many shapes, unaligned x/y, and thread
// counts. The quantize/dequantize row conversions are tested in kernels_quant_test.cpp.
#include "kernels/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/matmul_internal.h"
#include "kernels/quant.h"
#include "kernels_test_util.h"
#include "util/half.h"

namespace kvpack::kernels {
namespace {

using test::kAllTypes;
using test::q4k_scale_min;

constexpr double kU = 1.0 / (1 << 24);  // unit roundoff of f32 (2^-24)

const Isa kAllIsas[] = {Isa::Scalar, Isa::Avx2, Isa::Avx512};

bool is_quant(DType t) { return t == DType::Q8_0 || t == DType::Q4_0 || t == DType::Q4_K; }

// Per 32-element block b of a quantised row: the weight step (value = step * code - offset).
struct BlockScale {
  double step, offset;
};
BlockScale block_scale(DType type, const uint8_t* row, int64_t b) {
  if (type == DType::Q4_K) {
    const uint8_t* blk = row + (b / 8) * 144;
    uint16_t dh, mh;
    std::memcpy(&dh, blk, 2);
    std::memcpy(&mh, blk + 2, 2);
    int sc, m;
    q4k_scale_min(blk + 4, static_cast<int>(b % 8), &sc, &m);
    return {static_cast<double>(fp16_to_f32(dh)) * sc, static_cast<double>(fp16_to_f32(mh)) * m};
  }
  const size_t bb = type == DType::Q8_0 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0);
  uint16_t dh;
  std::memcpy(&dh, row + b * bb, 2);
  return {fp16_to_f32(dh), 0.0};
}

// Row lengths that are whole blocks of every quantised type (Q4_K needs multiples of 256).
int64_t round_to_block(DType t, int64_t n_in) { return t == DType::Q4_K ? (n_in + 255) / 256 * 256 : n_in; }

// A weight matrix in its stored encoding plus its exact f32 decoding.
struct Weights {
  std::vector<uint8_t> storage;  // includes `offset` leading bytes so row 0 is not 64-byte aligned
  size_t offset = 0;
  std::vector<float> deq;  // n_out x n_in, exactly the values the kernels see
  const void* data() const { return storage.data() + offset; }
};

// Weights with per-row magnitudes spread over a few binades, encoded in `type`.
Weights make_weights(DType type, int64_t n_out, int64_t n_in, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::uniform_real_distribution<float> e(-3.0f, 3.0f);
  const size_t rb = row_bytes(type, n_in);
  Weights w;
  w.offset = type == DType::F32 ? 4 : 2;  // keep element alignment, break 64-byte alignment
  w.storage.assign(w.offset + rb * n_out + 64, 0xA5);
  w.deq.resize(n_out * n_in);
  std::vector<float> row(n_in);
  for (int64_t o = 0; o < n_out; ++o) {
    const float scale = std::exp2(e(rng));
    for (auto& v : row) v = u(rng) * scale;
    uint8_t* dst = w.storage.data() + w.offset + o * rb;
    quantize_row(row.data(), type, n_in, dst);
    dequantize_row(dst, type, n_in, w.deq.data() + o * n_in);
  }
  return w;
}

// Activations: gaussian-ish with occasional large outliers (as in LLM hidden states).
std::vector<float> make_acts(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 63);
  std::vector<float> x(n);
  for (auto& v : x) v = g(rng) * (pick(rng) == 0 ? 20.0f : 1.0f);
  return x;
}

// The activation quantisation every path performs (documented in matmul.h), replicated in f32: int8
// blocks of `blk` elements (32; 256 for Q4_K, whose kernels take one scale per super-block). d has one
// entry per 32 elements either way (a super-block's scale repeated 8 times).
void quantize_acts_ref(const float* x, int64_t n, std::vector<int>& q, std::vector<float>& d, int64_t blk = 32) {
  q.resize(n);
  d.resize(n / 32);
  for (int64_t b = 0; b < n / blk; ++b) {
    float amax = 0.0f;
    for (int64_t i = 0; i < blk; ++i) amax = std::max(amax, std::fabs(x[b * blk + i]));
    // 32-element blocks: d at f16 precision, as ggml's block_q8_0 stores it; super-blocks keep f32 (Q8_K).
    const float db = blk == 32 ? kvpack::fp16_to_f32(kvpack::f32_to_fp16(amax / 127.0f)) : amax / 127.0f;
    for (int64_t k = 0; k < blk / 32; ++k) d[b * blk / 32 + k] = db;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t i = 0; i < blk; ++i) q[b * blk + i] = static_cast<int>(std::nearbyint(x[b * blk + i] * id));
  }
}

std::string label(Isa isa, DType t, int64_t n_out, int64_t n_in, int64_t n_tok) {
  return std::string(isa_name(isa)) + " " + std::string(dtype_name(t)) + " n_out=" + std::to_string(n_out) +
         " n_in=" + std::to_string(n_in) + " n_tokens=" + std::to_string(n_tok);
}

// Runs one shape on one path and checks every output against the f64 references.
//
// Tolerances (u = 2^-24):
//  * F32 / F16 / BF16: the weights are widened exactly, so the only error is f32 rounding of the products
//    and sums: |y - ref| <= (4 sqrt(n_in) + 8) u sum_i |w_i x_i|. (The worst case is ~n_in u; rounding
//    errors of many-accumulator sums behave like a random walk, and 4 sqrt(n) keeps this tight enough
//    that dropping or duplicating a single term fails for every n_in tested.)
//  * Q8_0 / Q4_0, against ref_q = dequantised weights x the quantised activations (exactly what the
//    kernel multiplies; block dots are exact int32): the same f32 term, but over the magnitudes the
//    kernels actually round: sum_b |d_w d_x| (sum_i |w_q x_q| + 128 sum_i |x_q|) (the AVX-512 path's
//    unsigned-offset trick adds and cancels 128 sum(x_q) inside each block).
//  * Q4_K, against ref_q: per sub-block the kernel multiplies the exact int32 dot by (d sc) d_x and adds
//    (-dmin m) d_x sum(x_q), so the magnitudes are sum_b |d_x| (d sc sum_i q_i |x_q| + dmin m sum_i |x_q|),
//    plus sum |w x_q d_x| because the reference's dequantised weights are themselves rounded once in f32
//    ((d sc) q - dmin m).
//  * Q8_0 / Q4_0 / Q4_K, against ref = dequantised weights x the original f32 activations: additionally the
//    activation rounding, |x - x_q d_x| <= d_x (1/2 + 1e-4) per element (1/2 step plus f32 rounding of
//    d_x and 1/d_x), i.e. + sum_b d_x,b (1/2 + 1e-4) sum_{i in b} |w_i|.
void check_shape(Isa isa, DType type, int64_t n_out, int64_t n_in, int64_t n_tok, std::mt19937& rng,
                 ThreadPool* pool = nullptr) {
  const Weights w = make_weights(type, n_out, n_in, rng);
  std::vector<float> xbuf(1 + n_tok * n_in + 1);
  const std::vector<float> xs = make_acts(n_tok * n_in, rng);
  std::copy(xs.begin(), xs.end(), xbuf.begin() + 1);
  const float* x = xbuf.data() + 1;  // deliberately not 16/32/64-byte aligned
  const float sentinel = -12345.5f;
  std::vector<float> ybuf(2 + n_tok * n_out + 2, sentinel);
  float* y = ybuf.data() + 1;
  matmul_with_isa(isa, w.data(), type, n_out, n_in, x, n_tok, y, pool);

  EXPECT_EQ(ybuf[0], sentinel) << "write before y";
  for (size_t k = 1 + n_tok * n_out; k < ybuf.size(); ++k) EXPECT_EQ(ybuf[k], sentinel) << "write past y";

  const std::string where = label(isa, type, n_out, n_in, n_tok);
  std::vector<int> xq;
  std::vector<float> dx;
  int failures = 0;
  for (int64_t t = 0; t < n_tok && failures < 5; ++t) {
    const float* xt = x + t * n_in;
    if (is_quant(type)) quantize_acts_ref(xt, n_in, xq, dx, type == DType::Q4_K ? 256 : 32);
    for (int64_t o = 0; o < n_out && failures < 5; ++o) {
      const float* wr = w.deq.data() + o * n_in;
      double ref = 0, mag = 0;
      for (int64_t i = 0; i < n_in; ++i) {
        ref += static_cast<double>(wr[i]) * xt[i];
        mag += std::fabs(static_cast<double>(wr[i]) * xt[i]);
      }
      const double got = y[t * n_out + o];
      if (!is_quant(type)) {
        const double tol = (4 * std::sqrt(static_cast<double>(n_in)) + 8) * kU * mag + 1e-30;
        if (!(std::fabs(got - ref) <= tol)) {
          ++failures;
          ADD_FAILURE() << where << " t=" << t << " o=" << o << ": got " << got << " ref " << ref << " tol " << tol;
        }
        continue;
      }
      // Quantised weights: the per-block scale of row o is recoverable from the encoded block.
      const uint8_t* row = static_cast<const uint8_t*>(w.data()) + o * row_bytes(type, n_in);
      double ref_q = 0, mag_q = 0, qbound = 0;
      for (int64_t b = 0; b < n_in / 32; ++b) {
        const BlockScale bs = block_scale(type, row, b);
        const double dw = bs.step;
        double sw = 0, swq = 0, sq = 0, swx = 0;
        for (int i = 0; i < 32; ++i) {
          const int64_t k = b * 32 + i;
          ref_q += static_cast<double>(wr[k]) * (xq[k] * static_cast<double>(dx[b]));
          sw += std::fabs(wr[k]);
          if (dw != 0) swq += std::fabs((wr[k] + bs.offset) / dw * xq[k]);
          sq += std::abs(xq[k]);
          swx += std::fabs(wr[k] * xq[k]);
        }
        if (type == DType::Q4_K)
          mag_q += std::fabs(dx[b]) * (dw * swq + bs.offset * sq + swx);
        else
          mag_q += std::fabs(dw * dx[b]) * (swq + 128 * sq);
        qbound += dx[b] * (0.5 + 1e-4) * sw;
      }
      const double tol_q = (4 * std::sqrt(static_cast<double>(n_in)) + 8) * kU * mag_q + 1e-30;
      if (!(std::fabs(got - ref_q) <= tol_q && std::fabs(got - ref) <= tol_q + qbound)) {
        ++failures;
        ADD_FAILURE() << where << " t=" << t << " o=" << o << ": got " << got << " ref_q " << ref_q << " (tol "
                      << tol_q << ") ref " << ref << " (tol " << tol_q + qbound << ")";
      }
    }
  }
}

class MatmulIsaType : public ::testing::TestWithParam<std::tuple<Isa, DType>> {
 protected:
  void SetUp() override {
    if (!cpu_supports(std::get<0>(GetParam()))) GTEST_SKIP() << isa_name(std::get<0>(GetParam())) << " not supported";
  }
};

TEST_P(MatmulIsaType, ShapesVsDoubleReference) {
  const auto [isa, type] = GetParam();
  std::mt19937 rng(1234 + static_cast<int>(type) * 17 + static_cast<int>(isa));
  std::vector<int64_t> n_ins = {32, 64, 96, 160, 127 * 32, 129 * 32};
  if (!is_quant(type)) n_ins.insert(n_ins.end(), {1, 5, 8, 15, 16, 17, 33, 100, 1000});
  if (type == DType::Q4_K) n_ins = {256, 512, 768, 1280, 17 * 256};  // whole 256-element super-blocks
  const int64_t n_outs[] = {1, 3, 7, 17, 64, 129};
  for (int64_t n_in : n_ins) {
    for (int64_t n_out : n_outs) {
      for (int64_t n_tok = 1; n_tok <= 9; ++n_tok) check_shape(isa, type, n_out, n_in, n_tok, rng);
      if (n_in <= (type == DType::Q4_K ? 512 : 160)) {
        check_shape(isa, type, n_out, n_in, 16, rng);
        check_shape(isa, type, n_out, n_in, 37, rng);
      }
    }
  }
  // Larger prefill shapes: several row blocks and token chunks.
  check_shape(isa, type, 300, 256, 100, rng);
  check_shape(isa, type, 1000, 1024, 1, rng);
  check_shape(isa, type, 70, 2048, 65, rng);
}

// Integer-valued data whose every product and partial sum is exact in f32: results must be exact. This
// pins down indexing (element order, nibble order, tails) independent of any tolerance.
TEST_P(MatmulIsaType, ExactOnIntegerData) {
  const auto [isa, type] = GetParam();
  std::mt19937 rng(99);
  std::uniform_int_distribution<int> small(-8, 8), nib(0, 15), x127(-127, 127), coin(0, 1);
  std::vector<int64_t> n_ins = {32, 96, 160, 4128};
  if (!is_quant(type)) n_ins.insert(n_ins.end(), {1, 7, 17, 47, 1001});  // vector tails
  if (type == DType::Q4_K) n_ins = {256, 768, 4096};
  std::uniform_int_distribution<int> sc6(0, 3), m6(0, 7), pick8(0, 7);
  for (int64_t n_in : n_ins) {
    for (int64_t n_out : {1, 5, 33}) {
      for (int64_t n_tok : {1, 2, 5, 8, 9, 13}) {
        const size_t rb = row_bytes(type, n_in);
        std::vector<uint8_t> W(rb * n_out);
        std::vector<float> wd(n_out * n_in);
        for (int64_t o = 0; o < n_out; ++o) {
          uint8_t* row = W.data() + o * rb;
          if (type == DType::Q4_K) {
            // d = dmin = 1, small random sub-block scales and mins (all 6-bit fields and both scale
            // halves exercised via the packing), random nibbles: weights sc * q - m are small integers.
            for (int64_t sb = 0; sb < n_in / 256; ++sb) {
              uint8_t* blk = row + sb * 144;
              const uint16_t one = f32_to_fp16(1.0f);
              std::memcpy(blk, &one, 2);
              std::memcpy(blk + 2, &one, 2);
              uint8_t sc[8], m[8];
              for (int j = 0; j < 8; ++j) {
                // Mostly tiny; one in 8 sets a high 6-bit field bit (16, 32) so the split packing of
                // sub-blocks 4..7 is exercised while every partial sum stays far below 2^24.
                sc[j] = static_cast<uint8_t>(sc6(rng) + (pick8(rng) == 0 ? 16 * (1 + coin(rng)) : 0));
                m[j] = static_cast<uint8_t>(m6(rng) + (pick8(rng) == 0 ? 16 * (1 + coin(rng)) : 0));
              }
              q4_k_pack_scales(sc, m, blk + 4);
              for (int i = 0; i < 128; ++i) blk[16 + i] = static_cast<uint8_t>(nib(rng) | nib(rng) << 4);
            }
          } else if (type == DType::Q8_0 || type == DType::Q4_0) {
            const size_t bb = type == DType::Q8_0 ? 34 : 18;
            for (int64_t b = 0; b < n_in / 32; ++b) {
              uint8_t* blk = row + b * bb;
              const uint16_t one = f32_to_fp16(1.0f);
              std::memcpy(blk, &one, 2);
              for (int i = 0; i < 32; ++i) {
                if (type == DType::Q8_0) {
                  const int v = small(rng);
                  blk[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(v));
                } else if (i < 16) {
                  blk[2 + i] = static_cast<uint8_t>(nib(rng) | nib(rng) << 4);
                }
              }
            }
          } else {
            std::vector<float> v(n_in);
            for (auto& f : v) f = static_cast<float>(small(rng));
            quantize_row(v.data(), type, n_in, row);  // exact for small integers in every float type
          }
          dequantize_row(row, type, n_in, wd.data() + o * n_in);
        }
        // Activations: integers; for quantised weights each block has |max| == 127 so d_x == 1 exactly.
        std::vector<float> x(n_tok * n_in);
        for (int64_t t = 0; t < n_tok; ++t)
          for (int64_t b = 0; b * 32 < n_in; ++b)
            for (int64_t i = b * 32; i < std::min(n_in, b * 32 + 32); ++i) {
              float v = static_cast<float>(is_quant(type) ? x127(rng) : small(rng));
              if (is_quant(type) && i == b * 32 + (t + b) % 32) v = coin(rng) ? 127.0f : -127.0f;
              x[t * n_in + i] = v;
            }
        std::vector<float> y(n_tok * n_out);
        matmul_with_isa(isa, W.data(), type, n_out, n_in, x.data(), n_tok, y.data(), nullptr);
        for (int64_t t = 0; t < n_tok; ++t)
          for (int64_t o = 0; o < n_out; ++o) {
            double ref = 0;
            for (int64_t i = 0; i < n_in; ++i) ref += static_cast<double>(wd[o * n_in + i]) * x[t * n_in + i];
            ASSERT_EQ(y[t * n_out + o], ref) << label(isa, type, n_out, n_in, n_tok) << " t=" << t << " o=" << o;
          }
      }
    }
  }
}

// Threads only change who computes which task, never the arithmetic: bitwise identical outputs.
TEST_P(MatmulIsaType, ThreadCountInvariant) {
  const auto [isa, type] = GetParam();
  ThreadPool pool1(1), pool2(2), pool3(3);
  for (auto [n_out, n_in, n_tok] : {std::tuple<int64_t, int64_t, int64_t>{1000, 1024, 1}, {129, 4096, 3},
                                    {3000, 64, 1}, {64, 512, 77}, {513, 256, 19}}) {
    n_in = round_to_block(type, n_in);
    std::mt19937 rng(7);
    const Weights w = make_weights(type, n_out, n_in, rng);
    const std::vector<float> x = make_acts(n_tok * n_in, rng);
    std::vector<float> y0(n_tok * n_out), y1(n_tok * n_out), y2(n_tok * n_out), y3(n_tok * n_out);
    matmul_with_isa(isa, w.data(), type, n_out, n_in, x.data(), n_tok, y0.data(), nullptr);
    matmul_with_isa(isa, w.data(), type, n_out, n_in, x.data(), n_tok, y1.data(), &pool1);
    matmul_with_isa(isa, w.data(), type, n_out, n_in, x.data(), n_tok, y2.data(), &pool2);
    matmul_with_isa(isa, w.data(), type, n_out, n_in, x.data(), n_tok, y3.data(), &pool3);
    const std::string where = label(isa, type, n_out, n_in, n_tok);
    EXPECT_EQ(0, std::memcmp(y0.data(), y1.data(), y0.size() * 4)) << where;
    EXPECT_EQ(0, std::memcmp(y0.data(), y2.data(), y0.size() * 4)) << where;
    EXPECT_EQ(0, std::memcmp(y0.data(), y3.data(), y0.size() * 4)) << where;
    // And the threaded result is still right.
    std::mt19937 rng2(8);
    check_shape(isa, type, n_out, n_in, n_tok, rng2, &pool2);
  }
}

INSTANTIATE_TEST_SUITE_P(AllPaths, MatmulIsaType, ::testing::Combine(::testing::ValuesIn(kAllIsas), ::testing::ValuesIn(kAllTypes)),
                         [](const ::testing::TestParamInfo<std::tuple<Isa, DType>>& info) {
                           return std::string(isa_name(std::get<0>(info.param))) + "_" +
                                  std::string(dtype_name(std::get<1>(info.param)));
                         });

// Every finite fp16 / bf16 bit pattern goes through each path's widening exactly: row o holds pattern o
// in all its elements and x = (1, 0, 0, ...), so y[o] must equal the decoded weight bit for bit (up to
// the sign of zero). n_in = 16 uses the full-vector loads, n_in = 1 the tail/masked ones.
TEST(Matmul, HalfWideningExhaustive) {
  for (DType type : {DType::F16, DType::BF16}) {
    std::vector<uint16_t> pats;
    for (uint32_t h = 0; h < 65536; ++h) {
      const bool finite = type == DType::F16 ? (h & 0x7c00u) != 0x7c00u : (h & 0x7f80u) != 0x7f80u;
      if (finite) pats.push_back(static_cast<uint16_t>(h));
    }
    const int64_t n_out = static_cast<int64_t>(pats.size());
    for (int64_t n_in : {1, 16}) {
      std::vector<uint16_t> W(n_out * n_in);
      for (int64_t o = 0; o < n_out; ++o)
        for (int64_t i = 0; i < n_in; ++i) W[o * n_in + i] = pats[o];
      std::vector<float> x(n_in, 0.0f), y(n_out);
      x[0] = 1.0f;
      for (Isa isa : kAllIsas) {
        if (!cpu_supports(isa)) continue;
        matmul_with_isa(isa, W.data(), type, n_out, n_in, x.data(), 1, y.data(), nullptr);
        int bad = 0;
        for (int64_t o = 0; o < n_out && bad < 5; ++o) {
          const float want = type == DType::F16 ? fp16_to_f32(pats[o]) : bf16_to_f32(pats[o]);
          if (!(y[o] == want)) {
            ++bad;
            ADD_FAILURE() << isa_name(isa) << " " << dtype_name(type) << " n_in=" << n_in << " pattern 0x" << std::hex
                          << pats[o] << ": got " << y[o] << " want " << want;
          }
        }
      }
    }
  }
}

// The activation quantiser of every path produces the same bytes (so Q paths differ only in f32
// summation order), including the ISA-specific bias lane.
TEST(MatmulActivationQuant, BitIdenticalAcrossIsas) {
  std::mt19937 rng(5);
  for (int64_t n_in : {32, 64, 4096}) {
    std::vector<float> x = make_acts(n_in, rng);
    x[3] = 0.0f;
    for (int i = 32; i < 64 && i < n_in; ++i) x[i] = 0.0f;  // an all-zero block (d = 0)
    const detail::ActLayout L = detail::act_layout(n_in);
    std::vector<uint8_t> ref(L.stride + 64), got(L.stride + 64);
    auto aligned = [](std::vector<uint8_t>& v) {
      return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(v.data()) + 63) & ~uintptr_t{63});
    };
    detail::kernels_scalar().quant_act(x.data(), n_in, 128, L, aligned(ref));
    std::vector<int> q;
    std::vector<float> d;
    quantize_acts_ref(x.data(), n_in, q, d);
    for (int64_t i = 0; i < n_in; ++i) ASSERT_EQ(reinterpret_cast<int8_t*>(aligned(ref))[i], q[i]) << i;
    for (Isa isa : {Isa::Avx2, Isa::Avx512}) {
      if (!cpu_supports(isa)) continue;
      const auto& k = isa == Isa::Avx2 ? detail::kernels_avx2() : detail::kernels_avx512();
      std::fill(got.begin(), got.end(), 0);
      k.quant_act(x.data(), n_in, 128, L, aligned(got));
      EXPECT_EQ(0, std::memcmp(aligned(ref), aligned(got), L.stride)) << isa_name(isa) << " n_in=" << n_in;
    }
  }
}

// matmul is a pure function: concurrent callers (each with its own per-thread activation scratch) get
// the same bits as a lone caller, including when their scratch must grow.
TEST(Matmul, ConcurrentCallers) {
  std::mt19937 rng(21);
  const int64_t n_out = 257, n_in = 512;
  const Weights w = make_weights(DType::Q8_0, n_out, n_in, rng);
  std::vector<std::vector<float>> xs, want;
  for (int64_t n_tok : {1, 5, 40}) {
    xs.push_back(make_acts(n_tok * n_in, rng));
    want.emplace_back(n_tok * n_out);
    matmul(w.data(), DType::Q8_0, n_out, n_in, xs.back().data(), n_tok, want.back().data(), nullptr);
  }
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&, th] {
      for (int it = 0; it < 30; ++it) {
        const size_t k = (th + it) % xs.size();
        const int64_t n_tok = static_cast<int64_t>(xs[k].size()) / n_in;
        std::vector<float> y(n_tok * n_out);
        matmul(w.data(), DType::Q8_0, n_out, n_in, xs[k].data(), n_tok, y.data(), nullptr);
        if (std::memcmp(y.data(), want[k].data(), y.size() * 4) != 0) ++mismatches[th];
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int th = 0; th < 4; ++th) EXPECT_EQ(mismatches[th], 0) << "thread " << th;
}

TEST(Matmul, DispatchAndErrors) {
  const std::string name = matmul_isa();
  EXPECT_TRUE(name == "scalar" || name == "avx2" || name == "avx512") << name;
  EXPECT_TRUE(cpu_supports(selected_isa()));
  Isa parsed;
  EXPECT_TRUE(parse_isa(name.c_str(), &parsed));
  EXPECT_EQ(parsed, selected_isa());
  EXPECT_FALSE(parse_isa("sse9", &parsed));

  for (DType t : kAllTypes) EXPECT_TRUE(matmul_supports(t)) << dtype_name(t);
  EXPECT_FALSE(matmul_supports(DType::Q4_1));
  for (DType t : {DType::Q6_K, DType::Q5_K, DType::Q3_K, DType::Q2_K, DType::IQ4_XS, DType::Q5_0, DType::Q5_1,
                  DType::IQ4_NL})
    EXPECT_TRUE(matmul_supports(t)) << dtype_name(t);  // kernels_kquant_matmul_test.cpp
  EXPECT_FALSE(matmul_supports(DType::Q8_K));

  std::vector<uint8_t> W(4096);
  std::vector<float> x(64), y(4);
  EXPECT_THROW(matmul(W.data(), DType::Q4_1, 1, 32, x.data(), 1, y.data(), nullptr), std::invalid_argument);
  EXPECT_THROW(matmul(W.data(), DType::Q8_0, 1, 33, x.data(), 1, y.data(), nullptr), std::invalid_argument);
  EXPECT_THROW(matmul(W.data(), DType::Q4_K, 1, 32, x.data(), 1, y.data(), nullptr), std::invalid_argument);
  for (Isa isa : kAllIsas) {
    if (!cpu_supports(isa)) {
      EXPECT_THROW(matmul_with_isa(isa, W.data(), DType::F32, 1, 8, x.data(), 1, y.data(), nullptr),
                   std::invalid_argument);
    }
  }

  // matmul() is matmul_with_isa(selected_isa()).
  std::mt19937 rng(3);
  const Weights w = make_weights(DType::Q8_0, 9, 96, rng);
  const std::vector<float> xs = make_acts(3 * 96, rng);
  std::vector<float> a(27), b(27);
  matmul(w.data(), DType::Q8_0, 9, 96, xs.data(), 3, a.data(), nullptr);
  matmul_with_isa(selected_isa(), w.data(), DType::Q8_0, 9, 96, xs.data(), 3, b.data(), nullptr);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4));

  // Degenerate sizes: nothing to do, or an empty sum.
  std::fill(y.begin(), y.end(), 7.0f);
  matmul(W.data(), DType::F32, 0, 8, x.data(), 1, y.data(), nullptr);
  matmul(W.data(), DType::F32, 4, 8, x.data(), 0, y.data(), nullptr);
  EXPECT_EQ(y[0], 7.0f);
  matmul(W.data(), DType::F32, 4, 0, x.data(), 1, y.data(), nullptr);
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace kvpack::kernels
