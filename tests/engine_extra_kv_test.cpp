// Attention over KV held outside the pool (model/forward.h, ExtraKv), as the exact drift check uses it
// (compress/cold_attend.h): a sequence whose streams lost most of their slots to the cold tier, with the
// evicted pages attended where they are read, must give the next-token logits of the sequence that kept
// every slot (the same K/V bits; only the order of the softmax sums differs), while without them the
// logits move far more. Real pieces: the stories260K model, the engine's forward, a page pool, a host
// cold tier and the evicted-KV records with their digests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "compress/cold_attend.h"
#include "engine/engine.h"
#include "kv/cold_tier_host.h"
#include "kv/evicted_kv.h"
#include "model/forward.h"
#include "model/model.h"
#include "engine_logits.h"

using namespace kvpack;

namespace {

const std::string kShared = KVPACK_SHARED_DIR;
constexpr int32_t kPrompt = 200;

struct Rig {
  std::unique_ptr<Model> model = Model::load(kShared + "/models/stories260K.gguf");
  Engine engine;
  std::vector<int32_t> toks;
  int32_t V;

  static EngineOptions options() {
    EngineOptions eo;
    eo.threads = 2;
    eo.page_size = 16;
    eo.kv_type = DType::F16;
    eo.max_batch_tokens = 256;
    return eo;
  }
  Rig() : engine(*model, options()), toks(test::padded_tokens(*model, test::kStoryText, kPrompt + 1, 37)), V(model->config().n_vocab) {}

  std::unique_ptr<kv::SequenceKv> prefilled() {
    auto kv = engine.kv().new_sequence();
    BatchItem item;
    item.kv = kv.get();
    item.tokens = std::span<const int32_t>(toks.data(), kPrompt);
    EXPECT_TRUE(engine.runner().forward().run(std::span<BatchItem>(&item, 1)));
    return kv;
  }
  // The last token over `kv` (and `extra`), on a fork so that `kv` stays as it is.
  std::vector<float> next_logits(const kv::SequenceKv& kv, ExtraKv* extra) {
    auto fork = engine.kv().fork_sequence(kv, 0);
    std::vector<float> out(static_cast<size_t>(V));
    BatchItem item;
    item.kv = fork.get();
    item.tokens = std::span<const int32_t>(toks.data() + kPrompt, 1);
    item.logits = out.data();
    item.extra = extra;
    EXPECT_TRUE(engine.runner().forward().run(std::span<BatchItem>(&item, 1)));
    return out;
  }
};

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return d;
}

// Evicts all but 4 sinks, a random fifth and the last 16 slots of every stream into `cold`.
void evict_most(kv::SequenceKv& kv, kv::EvictedKv& cold, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int32_t s = 0; s < kv.n_streams(); ++s) {
    const int32_t n = kv.n_slots(s);
    std::vector<int32_t> keep;
    for (int32_t j = 0; j < n; ++j)
      if (j < 4 || j >= n - 16 || rng() % 5 == 0) keep.push_back(j);
    cold.add(kv, s, keep);
    kv.compact_stream(s, keep);
  }
  cold.commit();
}

}  // namespace

TEST(ExtraKv, EvictedPagesAttendedInPlaceGiveTheFullKvLogits) {
  Rig st;
  const auto full = st.prefilled();
  const std::vector<float> want = st.next_logits(*full, nullptr);

  kv::HostColdTier tier(64 << 20, st.engine.kv().pool().record_bytes());
  auto kv = st.prefilled();
  kv::EvictedKv cold(tier, st.engine.kv().pool(), 1, kv->n_streams());
  evict_most(*kv, cold, 7);
  ASSERT_LT(kv->n_slots(0), kPrompt / 2);
  ASSERT_GT(cold.pages(0).size(), 4u);

  const std::vector<float> hot_only = st.next_logits(*kv, nullptr);
  compress::ColdAttend attend;
  attend.bind(cold, *kv);
  const std::vector<float> got = st.next_logits(*kv, &attend);
  EXPECT_TRUE(attend.complete());
  int64_t cold_pages = 0;
  for (int32_t s = 0; s < cold.n_streams(); ++s) cold_pages += static_cast<int64_t>(cold.pages(s).size());
  EXPECT_EQ(attend.pages_read(), cold_pages);  // every layer's records, once

  const double err = max_abs_diff(got, want), moved = max_abs_diff(hot_only, want);
  std::printf("max |logit - full KV's|: with the cold pages %.3g, hot set only %.3g\n", err, moved);
  EXPECT_LT(err, 2e-4) << "hot only moved " << moved;
  EXPECT_GT(moved, 100 * err) << "the evicted keys should matter here (else the test shows nothing)";
}

TEST(ExtraKv, APageTheTierLostMakesTheCheckIncompleteAndOneTokenItemsOnly) {
  Rig st;
  kv::HostColdTier tier(64 << 20, st.engine.kv().pool().record_bytes());
  auto kv = st.prefilled();
  kv::EvictedKv cold(tier, st.engine.kv().pool(), 1, kv->n_streams());
  evict_most(*kv, cold, 11);
  const int32_t last_layer_stream = kv->n_streams() - 1;
  tier.erase(cold.pages(last_layer_stream)[0].key);  // the tier dropped one record (LRU, a failed checksum)
  compress::ColdAttend attend;
  attend.bind(cold, *kv);
  st.next_logits(*kv, &attend);
  EXPECT_FALSE(attend.complete());
  EXPECT_TRUE(cold.pages(last_layer_stream)[0].lost);

  // Extra KV is for one query token (decode): a two-token item is refused before any KV changes.
  auto fork = st.engine.kv().fork_sequence(*kv, 0);
  const int32_t before = fork->next_pos();
  BatchItem item;
  item.kv = fork.get();
  item.tokens = std::span<const int32_t>(st.toks.data(), 2);
  item.extra = &attend;
  EXPECT_THROW(st.engine.runner().forward().run(std::span<BatchItem>(&item, 1)), std::invalid_argument);
  EXPECT_EQ(fork->next_pos(), before);
}
