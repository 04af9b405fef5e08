// The decode hot path allocates nothing: after warm-up, a forward pass of one token (single sequence,
// and a batch of several sequences) performs no heap allocation. Counted with a replaced global
// operator new (this test binary only), so any std::vector growth, std::function capture or
// std::string built inside the step shows up. Page tables are sized per request up front
// (SequenceKv::reserve_slots, as Engine::generate and the scheduler do); without that, their amortised
// growth is the only allocation a step makes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "engine/engine.h"
#include "model/forward.h"
#include "model/model.h"
#include "one_kv_head_model.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<long> g_allocs{0};
}  // namespace

void* operator new(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void* operator new(std::size_t n, std::align_val_t a) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocs.fetch_add(1, std::memory_order_relaxed);
  const std::size_t al = static_cast<std::size_t>(a);
  if (void* p = std::aligned_alloc(al, (std::max<std::size_t>(n, 1) + al - 1) / al * al)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) { return operator new(n, a); }
// Every replaceable form, nothrow included (std::get_temporary_buffer uses it): under AddressSanitizer a
// form left to the runtime would pair its allocation with our free() and be reported as a mismatch.
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  if (g_counting.load(std::memory_order_relaxed)) g_allocs.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return operator new(n, t); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  try {
    return operator new(n, a);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t& t) noexcept { return operator new(n, a, t); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace {

using namespace kvpack;
const std::string kShared = KVPACK_SHARED_DIR;

// Runs `steps` single-token decode steps for every sequence in `seqs` (one batched forward per step)
// and returns how many heap allocations happened during them.
long count_decode_allocs(Engine& engine, std::vector<std::unique_ptr<kv::SequenceKv>>& seqs, int steps) {
  const int32_t V = engine.model().config().n_vocab;
  std::vector<float> logits(seqs.size() * static_cast<size_t>(V));
  std::vector<int32_t> toks(seqs.size(), 1);
  std::vector<BatchItem> items(seqs.size());
  g_allocs = 0;
  g_counting = true;
  for (int i = 0; i < steps; ++i) {
    for (size_t k = 0; k < seqs.size(); ++k) {
      items[k] = BatchItem{};
      items[k].kv = seqs[k].get();
      items[k].tokens = std::span<const int32_t>(&toks[k], 1);
      items[k].logits = logits.data() + k * static_cast<size_t>(V);
    }
    if (!engine.runner().forward().run(std::span<BatchItem>(items))) {
      g_counting = false;
      ADD_FAILURE() << "KV pool exhausted";
      return -1;
    }
    for (size_t k = 0; k < seqs.size(); ++k) {
      const float* l = logits.data() + k * static_cast<size_t>(V);
      toks[k] = static_cast<int32_t>(std::max_element(l, l + V) - l);
    }
  }
  g_counting = false;
  return g_allocs.load();
}

TEST(HotPath, DecodeStepsAllocateNothing) {
  auto model = Model::load(kShared + "/models/stories260K.gguf");
  for (int threads : {1, 2}) {
    for (size_t batch : {size_t{1}, size_t{4}}) {
      EngineOptions eo;
      eo.threads = threads;
      eo.kv_type = DType::F16;
      eo.kv_pages = 20 * 4 * (512 / 16);  // 4 full contexts of stories260K's 20 streams
      Engine engine(*model, eo);
      std::vector<std::unique_ptr<kv::SequenceKv>> seqs;
      for (size_t k = 0; k < batch; ++k) {
        seqs.push_back(engine.kv().new_sequence());
        const std::vector<int32_t> prompt = model->tokenizer().encode("Once upon a time there was a little dog", true);
        seqs.back()->reserve_slots(static_cast<int32_t>(prompt.size()) + 140);  // as generate / the scheduler do
        engine.runner().prefill(*seqs.back(), prompt, nullptr);
      }
      // Warm-up: scratch buffers reach their steady-state size; the steps cross page boundaries.
      ASSERT_EQ(count_decode_allocs(engine, seqs, 40) >= 0, true);
      // Steady state: 100 more steps (several new pages per stream, taken from the pool's storage).
      EXPECT_EQ(count_decode_allocs(engine, seqs, 100), 0) << "threads " << threads << " batch " << batch;
    }
  }
}

// Split-K decode attention (Forward::plan_split: one KV head, a context past several parts, 2 threads):
// the per-part tasks and their partial outputs use storage reserved at construction.
TEST(HotPath, SplitAttentionDecodeStepsAllocateNothing) {
  const std::string path = test::write_one_kv_head_model("hot_path_split", 0);
  auto model = Model::load(path);
  EngineOptions eo;
  eo.threads = 2;
  eo.kv_type = DType::F16;
  Engine engine(*model, eo);
  std::vector<std::unique_ptr<kv::SequenceKv>> seqs;
  seqs.push_back(engine.kv().new_sequence());
  std::vector<int32_t> prompt(2500);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(300 + (i * 7) % 200);
  seqs.back()->reserve_slots(static_cast<int32_t>(prompt.size()) + 200);
  engine.runner().prefill(*seqs.back(), prompt, nullptr);
  const int64_t split0 = engine.runner().forward().split_attention_layers();
  ASSERT_EQ(count_decode_allocs(engine, seqs, 20) >= 0, true);
  EXPECT_EQ(count_decode_allocs(engine, seqs, 100), 0);
  EXPECT_GT(engine.runner().forward().split_attention_layers(), split0);  // the split path really ran
  std::remove(path.c_str());
}

}  // namespace
