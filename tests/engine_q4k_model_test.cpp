// Q4_K end to end: the model writer's Q4_K files (tensor types, metadata, encoded values), loading them,
// and the engine's logits against (a) a float64 forward pass over the same dequantised weights and (b)
// the F32 model of the same seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>
#include <unistd.h>

#include "engine/engine.h"
#include "engine_logits.h"
#include "gguf/gguf.h"
#include "gguf/model_writer.h"
#include "kernels/matmul.h"
#include "model/forward.h"
#include "model/model.h"
#include "ref_forward.h"

using namespace kvpack;

namespace {

// The smallest shapes whose 2-D weight rows are whole Q4_K super-blocks (256 elements).
gguf::RandomModelSpec q4k_spec(const char* preset, DType type) {
  gguf::RandomModelSpec s = gguf::RandomModelSpec::preset(preset);
  s.n_embd = 256;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.head_dim = 64;
  s.n_ff = 512;
  s.n_ctx = 256;
  s.seed = 7;
  s.weight_type = type;
  return s;
}

std::string write(const gguf::RandomModelSpec& s, const std::string& tag) {
  const std::string path = ::testing::TempDir() + "/q4k_" + std::to_string(::getpid()) + "_" + s.arch + "_" + tag + ".gguf";
  gguf::write_random_model(s, path);
  return path;
}

std::vector<int32_t> prompt(const Model& m, int32_t n) {
  return test::padded_tokens(m,
                             "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
                             "One day, she saw a big, red ball.",
                             n, 17);
}

// All positions' logits through the engine, `chunk` tokens per forward call.
std::vector<std::vector<float>> engine_logits(const Model& m, const std::vector<int32_t>& toks, int32_t chunk) {
  const size_t V = static_cast<size_t>(m.config().n_vocab);
  const std::vector<float> flat = test::teacher_forced_logits(m, toks, DType::F32, chunk);
  std::vector<std::vector<float>> out;
  for (size_t t = 0; t < toks.size(); ++t) out.emplace_back(flat.begin() + static_cast<ptrdiff_t>(t * V), flat.begin() + static_cast<ptrdiff_t>((t + 1) * V));
  return out;
}

// max_i |a_i - r_i| / max_i |r_i|
template <class A, class R>
double rel_err(const A& a, const R& r) {
  double num = 0, den = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - static_cast<double>(r[i])));
    den = std::max(den, std::abs(static_cast<double>(r[i])));
  }
  return num / den;
}

TEST(Q4KModel, WriterTypesMetadataAndValues) {
  const gguf::RandomModelSpec s = q4k_spec("tiny-llama", DType::Q4_K);
  auto q = gguf::File::open(write(s, "types"));
  auto f = gguf::File::open(write(q4k_spec("tiny-llama", DType::F32), "types_f32"));
  EXPECT_EQ(q->get_int("general.file_type").value_or(-1), 14);  // LLAMA_FTYPE_MOSTLY_Q4_K_S
  EXPECT_EQ(q->get_int("general.quantization_version").value_or(-1), 2);
  int n_q4k = 0;
  for (const auto& t : q->tensors()) {
    const gguf::TensorInfo* ft = f->tensor(t.name);
    ASSERT_NE(ft, nullptr) << t.name;
    ASSERT_EQ(t.shape, ft->shape) << t.name;
    if (t.shape.size() == 1) {
      EXPECT_EQ(t.type, DType::F32) << t.name;
      continue;
    }
    const bool embd = t.name == "token_embd.weight" || t.name == "output.weight";
    EXPECT_EQ(t.type, embd ? DType::Q8_0 : DType::Q4_K) << t.name;
    if (t.type != DType::Q4_K) continue;
    ++n_q4k;
    // Each row decodes to the F32 model's row within one step of its super-block's widest sub-block
    // range (the quantiser's documented bound, see kernels_matmul_test RoundTripBounds).
    const int64_t n_in = static_cast<int64_t>(t.shape[0]), n_out = static_cast<int64_t>(t.shape[1]);
    std::vector<float> got(n_in);
    for (int64_t r = 0; r < n_out; r += 7) {
      kernels::dequantize_row(static_cast<const uint8_t*>(t.data) + row_bytes(DType::Q4_K, n_in) * r, DType::Q4_K, n_in,
                              got.data());
      const float* want = static_cast<const float*>(ft->data) + n_in * r;
      for (int64_t sb = 0; sb < n_in / 256; ++sb) {
        double range = 0;
        for (int j = 0; j < 8; ++j) {
          float lo = 0, hi = want[sb * 256 + 32 * j];
          for (int i = 0; i < 32; ++i) {
            lo = std::min(lo, want[sb * 256 + 32 * j + i]);
            hi = std::max(hi, want[sb * 256 + 32 * j + i]);
          }
          range = std::max(range, static_cast<double>(hi) - lo);
        }
        for (int64_t i = sb * 256; i < sb * 256 + 256; ++i)
          ASSERT_LE(std::abs(got[i] - want[i]), range / 15) << t.name << " row " << r << " i " << i;
      }
    }
  }
  EXPECT_EQ(n_q4k, 7 * static_cast<int>(s.n_layer));

  // Q4_K needs 256-element rows.
  gguf::RandomModelSpec bad = gguf::RandomModelSpec::preset("tiny-llama");
  bad.weight_type = DType::Q4_K;
  EXPECT_THROW(bad.validate(), gguf::Error);
}

// The engine (Q4_K kernels, int8 activations, paged KV, chunked prefill and decode) against a float64
// forward pass over the same dequantised weights; like the Q8_0 models, the difference is the int8
// activation quantisation inside the kernels (same 6e-2 bound as engine_reference_test's Q8_0 cases).
TEST(Q4KModel, LoadsAndMatchesFloat64Reference) {
  for (const char* preset : {"tiny-llama", "tiny-qwen3"}) {
    const gguf::RandomModelSpec s = q4k_spec(preset, DType::Q4_K);
    auto m = Model::load(write(s, "ref"));
    SCOPED_TRACE(preset);
    const std::vector<int32_t> toks = prompt(*m, 40);
    test::RefForward ref(*m);
    std::vector<std::vector<double>> want;
    for (int32_t t : toks) want.push_back(ref.step(t));
    for (int32_t chunk : {1, 16}) {
      const auto got = engine_logits(*m, toks, chunk);
      double worst = 0;
      for (size_t i = 0; i < toks.size(); ++i) worst = std::max(worst, rel_err(got[i], want[i]));
      std::printf("  %s Q4_K chunk=%d: worst relative logit error vs float64 reference %.3g\n", preset, chunk, worst);
      EXPECT_LT(worst, 6e-2) << "chunk " << chunk;
    }
  }
}

// Q4_K vs the F32 model written from the same seed: the weights differ by 4-bit quantisation only, so
// the logits must stay close -- far closer than those of an unrelated model (another seed).
TEST(Q4KModel, LogitsCloseToF32Model) {
  for (const char* preset : {"tiny-llama", "tiny-qwen3"}) {
    SCOPED_TRACE(preset);
    gguf::RandomModelSpec sf = q4k_spec(preset, DType::F32);
    auto mq = Model::load(write(q4k_spec(preset, DType::Q4_K), "close_q4k"));
    auto mf = Model::load(write(sf, "close_f32"));
    sf.seed = 8;
    auto mo = Model::load(write(sf, "close_other"));
    auto m8 = Model::load(write(q4k_spec(preset, DType::Q8_0), "close_q8"));  // for scale, printed only
    const std::vector<int32_t> toks = prompt(*mf, 40);
    const auto lq = engine_logits(*mq, toks, 8), lf = engine_logits(*mf, toks, 8), lo = engine_logits(*mo, toks, 8);
    const auto l8 = engine_logits(*m8, toks, 8);
    double worst8 = 0;
    for (size_t i = 0; i < toks.size(); ++i) worst8 = std::max(worst8, rel_err(l8[i], lf[i]));
    double worst = 0, mean = 0, unrelated = 1e30;
    int same_top = 0;
    for (size_t i = 0; i < toks.size(); ++i) {
      const double e = rel_err(lq[i], lf[i]);
      worst = std::max(worst, e);
      mean += e / static_cast<double>(toks.size());
      unrelated = std::min(unrelated, rel_err(lo[i], lf[i]));
      same_top += std::max_element(lq[i].begin(), lq[i].end()) - lq[i].begin() ==
                  std::max_element(lf[i].begin(), lf[i].end()) - lf[i].begin();
    }
    std::printf("  %s: Q4_K vs F32 relative logit error worst %.3g mean %.3g, same argmax %d/%zu (unrelated seed: "
                "best %.3g; Q8_0 vs F32 worst %.3g)\n",
                preset, worst, mean, same_top, toks.size(), unrelated, worst8);
    // Measured worst 0.24 (llama) / 0.28 (qwen3), mean ~0.18: the bound leaves ~1.5x headroom.
    EXPECT_LT(worst, 0.4);
    EXPECT_LT(worst, 0.5 * unrelated);
  }
}

}  // namespace
