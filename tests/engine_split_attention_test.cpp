// Split-K decode attention (model/forward.cpp plan_split, kernels::attention_parts): with fewer (sequence,
// KV head) streams on a layer than twice the pool's threads, a deep one-token stream runs one task per
// part and the parts are folded after. The result must not depend on the thread count: the kernel folds the
// same parts in the same order when it runs the stream alone. Real pieces: a generated GGUF with one KV
// head (every layer one stream), the engine's forward and page pool, 1 / 2 / 3 threads, a context past
// several parts.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "kernels/attention.h"
#include "model/forward.h"
#include "model/model.h"
#include "one_kv_head_model.h"

using namespace kvpack;

namespace {

std::string one_kv_head_model() {
  static const std::string path = test::write_one_kv_head_model("split_attention");
  return path;
}

// Logits of `steps` one-token decode steps after a `prompt`-token prefill, on an engine with `threads`.
std::vector<float> decode_logits(const Model& model, int threads, int32_t prompt, int32_t steps, int64_t* split_layers) {
  EngineOptions eo;
  eo.threads = threads;
  eo.page_size = 16;
  eo.kv_type = DType::F16;
  eo.max_batch_tokens = 512;
  Engine engine(model, eo);
  std::mt19937 rng(3);
  std::vector<int32_t> toks(static_cast<size_t>(prompt + steps));
  for (auto& t : toks) t = static_cast<int32_t>(300 + rng() % 200);
  auto kv = engine.kv().new_sequence();
  Forward& fwd = engine.runner().forward();
  for (int32_t t0 = 0; t0 < prompt; t0 += 512) {
    BatchItem item;
    item.kv = kv.get();
    item.tokens = std::span<const int32_t>(toks.data() + t0, static_cast<size_t>(std::min(512, prompt - t0)));
    EXPECT_TRUE(fwd.run(std::span<BatchItem>(&item, 1)));
  }
  const int32_t V = model.config().n_vocab;
  std::vector<float> logits(static_cast<size_t>(steps) * V);
  const int64_t before = fwd.split_attention_layers();
  for (int32_t i = 0; i < steps; ++i) {
    BatchItem item;
    item.kv = kv.get();
    item.tokens = std::span<const int32_t>(toks.data() + prompt + i, 1);
    item.logits = logits.data() + static_cast<size_t>(i) * V;
    EXPECT_TRUE(fwd.run(std::span<BatchItem>(&item, 1)));
  }
  *split_layers = fwd.split_attention_layers() - before;
  return logits;
}

}  // namespace

TEST(SplitAttention, DeepDecodeLogitsAreTheSameForAnyThreadCount) {
  auto model = Model::load(one_kv_head_model());
  ASSERT_EQ(model->config().n_head_kv, 1);
  constexpr int32_t kPrompt = 3000, kSteps = 4;  // 188 pages: 5 parts (kernels::attention_parts)
  int64_t split1 = -1, split2 = -1, split3 = -1;
  const auto l1 = decode_logits(*model, 1, kPrompt, kSteps, &split1);
  const auto l2 = decode_logits(*model, 2, kPrompt, kSteps, &split2);
  const auto l3 = decode_logits(*model, 3, kPrompt, kSteps, &split3);
  EXPECT_EQ(split1, 0);  // one thread: the kernel folds the parts itself
  EXPECT_EQ(split2, static_cast<int64_t>(kSteps) * model->config().n_layer);  // every layer split into tasks
  EXPECT_EQ(split3, static_cast<int64_t>(kSteps) * model->config().n_layer);
  ASSERT_EQ(l1.size(), l2.size());
  EXPECT_EQ(std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(l1.data(), l3.data(), l1.size() * sizeof(float)), 0);
}

// A short context is one part: no split, whatever the threads.
TEST(SplitAttention, ShortContextsAreNotSplit) {
  auto model = Model::load(one_kv_head_model());
  int64_t split = -1;
  const auto l2 = decode_logits(*model, 2, 600, 2, &split);
  EXPECT_EQ(split, 0);
  int64_t split1 = -1;
  const auto l1 = decode_logits(*model, 1, 600, 2, &split1);
  EXPECT_EQ(std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(float)), 0);
}
