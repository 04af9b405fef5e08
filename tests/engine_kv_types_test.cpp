// Whole models with BF16 and Q8_0 KV caches: teacher-forced logits against the same engine with an F32
// KV cache (decode and chunked prefill), Q8_0's head_dim requirement, and compressed generation (every
// key-reading policy) on the new types.
#include <gtest/gtest.h>

#include <kvpack/kvpack.h>

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>
#include <unistd.h>

#include "engine/engine.h"
#include "engine_logits.h"
#include "gguf/model_writer.h"
#include "kernels/attention.h"
#include "model/forward.h"
#include "model/model.h"

using namespace kvpack;

namespace {

const std::string kShared = KVPACK_SHARED_DIR;

std::vector<int32_t> test_tokens(const Model& m, int32_t n) { return test::padded_tokens(m, test::kStoryText, n, 37); }

// Teacher-forced logits of every position, [n][n_vocab], with the given KV type and chunk size.
std::vector<float> all_logits(const Model& m, const std::vector<int32_t>& toks, DType kv_type, int32_t chunk) {
  return test::teacher_forced_logits(m, toks, kv_type, chunk);
}

// Worst over positions of max_i |a_i - r_i| / max_i |r_i|.
double worst_rel_err(const std::vector<float>& a, const std::vector<float>& r, int32_t V) {
  double worst = 0;
  for (size_t p = 0; p < r.size() / static_cast<size_t>(V); ++p) {
    double num = 0, den = 0;
    for (int32_t i = 0; i < V; ++i) {
      const size_t k = p * static_cast<size_t>(V) + static_cast<size_t>(i);
      if (!std::isfinite(a[k])) return INFINITY;
      num = std::max(num, std::fabs(static_cast<double>(a[k]) - r[k]));
      den = std::max(den, std::fabs(static_cast<double>(r[k])));
    }
    worst = std::max(worst, num / den);
  }
  return worst;
}

// worst_rel_err of the logits with KV types `a` and `b` against those with an F32 KV cache.
std::pair<double, double> worst_errors_vs_f32_kv(const Model& m, const std::vector<int32_t>& toks, int32_t chunk, DType a,
                                                 DType b) {
  const int32_t V = m.config().n_vocab;
  const auto ref = all_logits(m, toks, DType::F32, chunk);
  const double ea = worst_rel_err(all_logits(m, toks, a, chunk), ref, V);
  const double eb = worst_rel_err(all_logits(m, toks, b, chunk), ref, V);
  return {ea, eb};
}

std::string tiny_qwen3() {  // head_dim 32: one Q8_0 block per row
  static const std::string path = [] {
    gguf::RandomModelSpec spec = gguf::RandomModelSpec::preset("tiny-qwen3");
    spec.n_ctx = 512;
    spec.seed = 5;
    const std::string p = ::testing::TempDir() + "/kvtypes_tiny_qwen3_" + std::to_string(::getpid()) + ".gguf";
    gguf::write_random_model(spec, p);
    return p;
  }();
  return path;
}

}  // namespace

// Bounds: the F16 KV cache is held to 5e-3 of a float64 reference (engine_reference_test). BF16 keeps 8
// significant bits instead of 11 (8x the rounding) and Q8_0 rounds to half a step of amax/127 per 32
// elements (~1/254 of the block maximum, about BF16's error for a typical element, more for small ones);
// measured worst cases are printed, and the bounds leave ~2-3x headroom over them. A KV read or write bug
// (wrong row, wrong scale, a byte offset) moves logits by O(1) relative error.
TEST(KvTypes, Stories260kBf16LogitsStayCloseToF32Kv) {
  auto m = Model::load(kShared + "/models/stories260K.gguf");
  const auto toks = test_tokens(*m, 160);
  for (int32_t chunk : {1, 37}) {
    const auto [e16, ebf] = worst_errors_vs_f32_kv(*m, toks, chunk, DType::F16, DType::BF16);
    std::printf("  stories260K chunk %d: worst relative logit error vs f32 KV: f16 %.3g, bf16 %.3g\n", chunk, e16, ebf);
    EXPECT_LT(ebf, 4e-2);
    EXPECT_GT(ebf, 0.0);  // the cache really is rounded
    EXPECT_LE(e16, ebf);  // 11 bits beat 8
  }
}

TEST(KvTypes, Q8_0RequiresHeadDimMultipleOf32) {
  auto m = Model::load(kShared + "/models/stories260K.gguf");  // head_dim 8
  EngineOptions eo;
  eo.kv_type = DType::Q8_0;
  try {
    Engine engine(*m, eo);
    FAIL() << "q8_0 KV with head_dim 8 must be rejected";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of 32"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Session::open({.model_path = kShared + "/models/stories260K.gguf", .kv_type = "q8_0"}), std::invalid_argument);
  EXPECT_THROW(Session::open({.model_path = kShared + "/models/stories260K.gguf", .kv_type = "q4"}), std::invalid_argument);
}

TEST(KvTypes, Q8_0AndBf16LogitsStayCloseToF32KvOnHeadDim32Model) {
  auto m = Model::load(tiny_qwen3());
  ASSERT_EQ(m->config().head_dim, 32);
  const auto toks = test_tokens(*m, 120);
  for (int32_t chunk : {1, 23}) {
    const auto [ebf, eq8] = worst_errors_vs_f32_kv(*m, toks, chunk, DType::BF16, DType::Q8_0);
    std::printf("  tiny-qwen3 chunk %d: worst relative logit error vs f32 KV: bf16 %.3g, q8_0 %.3g\n", chunk, ebf, eq8);
    EXPECT_LT(ebf, 4e-2);
    EXPECT_LT(eq8, 4e-2);
    EXPECT_GT(eq8, 0.0);
  }
}

// Compressed generation on the new types: every key-reading policy (K-norm reads keys, SnapKV / R-KV /
// TOVA recompute attention from stored keys, H2O takes the kernel's key_mass) runs, compacts and frees
// pages; resident KV stays bounded by the budget.
TEST(KvTypes, CompressedGenerationWorksWithBf16AndQ8_0) {
  struct Case {
    std::string model, type;
  };
  const std::string stories = kShared + "/models/stories260K.gguf";
  for (const Case& c : {Case{stories, "bf16"}, Case{tiny_qwen3(), "bf16"}, Case{tiny_qwen3(), "q8_0"}})
    for (const char* policy : {"knorm", "snapkv", "rkv", "tova", "h2o", "streaming"}) {
      SCOPED_TRACE(c.model + " " + c.type + " " + policy);
      auto s = Session::open({.model_path = c.model, .kv_type = c.type, .kv_policy = policy, .kv_budget = 64, .kv_interval = 32});
      GenerateOptions g;
      g.temperature = 0;
      g.max_tokens = 240;
      GenerateStats st;
      s->generate("Once upon a time", g, {}, &st);
      // All 240 tokens, or the model's own end of text after the budget has been crossed several times
      // (the greedy text depends on the KV type's rounding: q8_0 with VNNI quantises the queries too).
      if (st.stop_reason == "eos")
        EXPECT_GT(st.generated_tokens, 3 * 64);
      else
        EXPECT_EQ(st.generated_tokens, 240);
      EXPECT_GT(st.compactions, 0);
      EXPECT_GT(st.freed_pages, 0);
      EXPECT_GT(st.reclaim_efficiency, 0.9);
      Session::open({.model_path = c.model, .kv_type = c.type});  // full KV opens too
    }
}

// Memory: a q8_0 page is 34/64 of an f16 one (16 slots x head_dim 32 x K and V).
TEST(KvTypes, Q8_0PagesAre34Of64OfF16) {
  auto m = Model::load(tiny_qwen3());
  for (DType t : {DType::F16, DType::Q8_0}) {
    EngineOptions eo;
    eo.kv_type = t;
    Engine e(*m, eo);
    const size_t want = 2u * 16 * (t == DType::F16 ? 64u : 34u);  // page 16 slots, head_dim 32
    EXPECT_EQ(e.kv().pool().page_bytes(), want) << kernels::kv_type_name(t);
  }
}
