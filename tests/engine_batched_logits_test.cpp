// Forward::run with several sequences whose logits buffers follow one another computes their output-head
// rows in one matmul (one pass over the vocabulary matrix instead of a GEMV per sequence). These tests run
// the same histories item by item and batched, on real GGUF files written by gen-model's writer (Q8_0:
// the int8 VNNI tiles; gemma3: the soft-cap), and require bitwise-equal logits for every row, including
// batches whose logits buffers are not contiguous, items without logits and all-logits items.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "gguf/model_writer.h"
#include "model/model.h"

using namespace kvpack;

namespace {

struct TmpModel {
  std::string path;
  TmpModel(const gguf::RandomModelSpec& s, const std::string& name)
      : path((std::filesystem::temp_directory_path() / ("kvpack_batched_logits_" + name + "_" + std::to_string(getpid()) + ".gguf"))
                 .string()) {
    gguf::write_random_model(s, path);
  }
  ~TmpModel() { std::filesystem::remove(path); }
};

struct Item {
  int32_t history;           // tokens prefilled before the step
  int32_t n;                 // tokens in the step
  enum { kNone, kLast, kAll } logits;
  bool own_buffer = false;   // logits in a buffer of its own (breaks the contiguous run)
};

std::vector<int32_t> tokens_for(int32_t seq, int32_t n, int32_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (seq * 131 + i * 17 + 5) % vocab;
  return t;
}

// Logits rows of every item's step, flat in item order; `batched`: all steps in one Forward::run.
std::vector<std::vector<float>> run_steps(const Model& m, const std::vector<Item>& items, bool batched) {
  const int32_t V = m.config().n_vocab;
  EngineOptions eo;
  eo.threads = 2;
  eo.page_size = 16;
  eo.max_batch_tokens = 64;
  eo.kv_pages = 4096;
  Engine engine(m, eo);
  std::vector<std::unique_ptr<kv::SequenceKv>> kvs;
  std::vector<std::vector<int32_t>> toks;
  for (size_t i = 0; i < items.size(); ++i) {
    toks.push_back(tokens_for(static_cast<int32_t>(i), items[i].history + items[i].n, V));
    kvs.push_back(engine.kv().new_sequence());
    engine.runner().prefill(*kvs.back(), std::span<const int32_t>(toks.back().data(), static_cast<size_t>(items[i].history)), nullptr);
  }
  auto rows_of = [](const Item& it) { return it.logits == Item::kNone ? 0 : it.logits == Item::kLast ? 1 : it.n; };
  int32_t shared_rows = 0;
  for (const Item& it : items)
    if (!it.own_buffer) shared_rows += rows_of(it);
  std::vector<float> shared(static_cast<size_t>(shared_rows) * V, -1.0f);
  std::vector<std::vector<float>> own(items.size());
  std::vector<BatchItem> batch;
  std::vector<float*> dst(items.size(), nullptr);
  int32_t row = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    BatchItem b;
    b.kv = kvs[i].get();
    b.tokens = std::span<const int32_t>(toks[i].data() + items[i].history, static_cast<size_t>(items[i].n));
    b.all_logits = items[i].logits == Item::kAll;
    if (items[i].logits != Item::kNone) {
      if (items[i].own_buffer) {
        own[i].assign(static_cast<size_t>(rows_of(items[i])) * V, -1.0f);
        b.logits = own[i].data();
      } else {
        b.logits = shared.data() + static_cast<size_t>(row) * V;
        row += rows_of(items[i]);
      }
    }
    dst[i] = b.logits;
    batch.push_back(b);
  }
  if (batched) {
    EXPECT_TRUE(engine.runner().forward().run(batch));
  } else {
    for (BatchItem& b : batch) EXPECT_TRUE(engine.runner().forward().run(std::span<BatchItem>(&b, 1)));
  }
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < items.size(); ++i)
    out.emplace_back(dst[i] ? std::vector<float>(dst[i], dst[i] + static_cast<size_t>(rows_of(items[i])) * V) : std::vector<float>{});
  return out;
}

void expect_batched_equals_single(const gguf::RandomModelSpec& spec, const std::string& name, const std::vector<Item>& items) {
  TmpModel file(spec, name);
  auto m = Model::load(file.path);
  const auto single = run_steps(*m, items, false);
  const auto batched = run_steps(*m, items, true);
  ASSERT_EQ(single.size(), batched.size());
  for (size_t i = 0; i < items.size(); ++i) {
    ASSERT_EQ(single[i].size(), batched[i].size()) << "item " << i;
    if (!single[i].empty()) {
      EXPECT_NE(single[i][0], -1.0f) << "item " << i << ": logits not written";
      EXPECT_EQ(0, std::memcmp(single[i].data(), batched[i].data(), single[i].size() * sizeof(float)))
          << name << " item " << i << ": batched logits differ from item-by-item logits";
    }
  }
}

// Eleven decoding sequences (more than the 8-token tile of the int8 kernels) with different histories,
// a prefill chunk, an all-logits item, one without logits and one with a buffer of its own in the middle.
std::vector<Item> mixed_items() {
  std::vector<Item> v;
  for (int32_t i = 0; i < 11; ++i) v.push_back({3 + 7 * i, 1, Item::kLast});
  v.insert(v.begin() + 4, Item{20, 5, Item::kLast});
  v.insert(v.begin() + 6, Item{9, 3, Item::kAll});
  v.insert(v.begin() + 8, Item{12, 2, Item::kNone});
  v.insert(v.begin() + 10, Item{30, 1, Item::kLast, true});
  return v;
}

}  // namespace

TEST(ForwardBatchedLogits, Q8_0HeadRowsOfManySequencesEqualOneByOne) {
  gguf::RandomModelSpec s = gguf::RandomModelSpec::preset("tiny-qwen3");
  s.weight_type = DType::Q8_0;
  expect_batched_equals_single(s, "q8", mixed_items());
}

TEST(ForwardBatchedLogits, F32UntiedHeadEqualsOneByOne) {
  gguf::RandomModelSpec s = gguf::RandomModelSpec::preset("tiny-llama");
  s.tied_embeddings = false;
  expect_batched_equals_single(s, "f32", mixed_items());
}

TEST(ForwardBatchedLogits, SoftCappedGemmaEqualsOneByOne) {
  gguf::RandomModelSpec s = gguf::RandomModelSpec::preset("tiny-gemma3");
  s.final_logit_softcapping = 2.0f;
  expect_batched_equals_single(s, "gemma", mixed_items());
}
