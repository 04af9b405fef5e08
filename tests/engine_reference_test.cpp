// Teacher-forced logits of the engine (paged KV, flash attention, SIMD matmuls, chunked prefill and
// single-token decode) against a straightforward float64 forward pass written here from the model
// definition: dense K/V arrays, materialised attention scores, no pages, no kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>
#include <unistd.h>

#include "engine/engine.h"
#include "gguf/model_writer.h"
#include "kernels/matmul.h"
#include "model/forward.h"
#include "model/model.h"
#include "engine_logits.h"
#include "ref_forward.h"

using namespace kvpack;

namespace {

const std::string kShared = KVPACK_SHARED_DIR;

// Worst relative deviation: max_i |a_i - r_i| / max_i |r_i| over one logits row.
double rel_err(const float* a, const std::vector<double>& r) {
  double num = 0, den = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    num = std::max(num, std::abs(a[i] - r[i]));
    den = std::max(den, std::abs(r[i]));
  }
  return num / den;
}

void check_model(const Model& m, int32_t n_tokens, int32_t chunk, double tol, DType kv_type = DType::F32) {
  const ModelConfig& c = m.config();
  // Tokens: the model's own tokenisation of real text, so attention patterns are realistic.
  const std::vector<int32_t> toks = test::padded_tokens(m, test::kStoryText, n_tokens, 37);

  test::RefForward ref(m);
  std::vector<std::vector<double>> want;
  for (int32_t t = 0; t < n_tokens; ++t) want.push_back(ref.step(toks[static_cast<size_t>(t)]));

  const std::vector<float> got = test::teacher_forced_logits(m, toks, kv_type, chunk);
  double worst = 0;
  for (int32_t t = 0; t < n_tokens; ++t) {
    const double e = rel_err(got.data() + static_cast<size_t>(t) * c.n_vocab, want[static_cast<size_t>(t)]);
    worst = std::max(worst, e);
    ASSERT_LT(e, tol) << "position " << t << " chunk " << chunk;
  }
  std::printf("  %s chunk=%d: worst relative logit error %.3g over %d positions\n", c.name.c_str(), chunk, worst, n_tokens);
}

}  // namespace

TEST(ModelReference, Stories260kGgufMatchesFloat64ReferenceInDecodeAndPrefill) {
  auto m = Model::load(kShared + "/models/stories260K.gguf");
  check_model(*m, 200, 1, 1e-4);    // token-by-token decode
  check_model(*m, 200, 37, 1e-4);   // chunked prefill (odd chunk crosses page boundaries)
}

TEST(ModelReference, Stories260kLlama2cMatchesFloat64Reference) {
  auto m = Model::load(kShared + "/models/stories260K.bin", kShared + "/models/tok512.bin");
  check_model(*m, 150, 16, 1e-4);
}

TEST(ModelReference, F16KvCacheStaysClose) {
  auto m = Model::load(kShared + "/models/stories260K.gguf");
  check_model(*m, 100, 8, 5e-3, DType::F16);  // K/V rounded to 11-bit mantissas
}

// Every architecture and weight type through the same comparison, on tiny random-weight GGUFs written
// by the model writer (llama: normal RoPE; qwen2: q/k/v biases, NeoX RoPE; qwen3: per-head q/k norms,
// head_dim != embd / heads). The reference dequantises the same weights, so F16/BF16 differ only by
// rounding of activations inside the kernels, and Q8_0 by the int8 quantisation of activations.
TEST(ModelReference, ArchitecturesAndWeightTypes) {
  struct Case {
    const char* preset;
    DType type;
    double tol;
  };
  const Case cases[] = {
      {"tiny-llama", DType::F32, 1e-4}, {"tiny-qwen2", DType::F32, 1e-4}, {"tiny-qwen3", DType::F32, 1e-4},
      {"tiny-qwen3", DType::F16, 1e-4}, {"tiny-qwen3", DType::BF16, 1e-4},
      // Q8_0 quantises activations to int8 per 32-block (as llama.cpp does); measured ~2.9% worst case
      // over 70 positions of a random model, so the bound leaves 2x headroom.
      {"tiny-llama", DType::Q8_0, 6e-2}, {"tiny-qwen2", DType::Q8_0, 6e-2},
  };
  for (const Case& cs : cases) {
    gguf::RandomModelSpec spec = gguf::RandomModelSpec::preset(cs.preset);
    spec.weight_type = cs.type;
    spec.n_ctx = 256;
    spec.seed = 7;
    const std::string path = ::testing::TempDir() + "/" + std::to_string(::getpid()) + "_" + cs.preset + "_" + std::string(dtype_name(cs.type)) + ".gguf";
    gguf::write_random_model(spec, path);
    auto m = Model::load(path);
    SCOPED_TRACE(std::string(cs.preset) + " " + std::string(dtype_name(cs.type)));
    EXPECT_EQ(m->config().arch, spec.arch);
    EXPECT_TRUE(m->config().random_weights);
    check_model(*m, 70, 1, cs.tol);
    check_model(*m, 70, 23, cs.tol);
  }
}
