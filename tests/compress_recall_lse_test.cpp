// Recall's hot mass from the attention kernel (Recall::run's attn_lse): a one-row check that takes each
// head's log-sum-exp from paged_attention's by-product must read, recall and exchange the same pages and
// report the same drift as the check that recomputes the hot logits itself; NaN entries (a layer the
// kernel did not write) fall back to the recomputation bit for bit; pinned positions never go down in an exchange.
// Real pieces: a page pool, a sequence's
// streams, evictions into a host cold tier with their digests, the query window.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "compress/query_window.h"
#include "compress/recall.h"
#include "kernels/attention.h"
#include "kv/cold_tier_host.h"
#include "kv/evicted_kv.h"
#include "kv/page_pool.h"
#include "kv/sequence_kv.h"
#include "model/model.h"

using namespace kvpack;

namespace {

constexpr int32_t kLayers = 2, kHeads = 4, kKvHeads = 2, kHd = 32, kSlots = 400, kKeepRandom = 60;

ModelConfig model_config() {
  ModelConfig m;
  m.n_layer = kLayers;
  m.n_head = kHeads;
  m.n_head_kv = kKvHeads;
  m.head_dim = kHd;
  m.n_embd = kHeads * kHd;
  return m;
}

// One sequence, compressed once into the cold tier, and the newest query row; built the same way from a
// seed every time, so two copies can be checked with and without attn_lse.
struct State {
  kv::PagePool pool;
  kv::HostColdTier tier;
  std::unique_ptr<kv::SequenceKv> kv;
  std::unique_ptr<kv::EvictedKv> cold;
  compress::QueryWindow queries;
  std::vector<float> q;  // [n_head][head_dim], post-RoPE as the window holds it

  static kv::PoolConfig pool_config() {
    kv::PoolConfig c;
    c.page_size = 8;
    c.head_dim = kHd;
    c.kv_type = DType::F16;
    c.max_pages = 1024;
    return c;
  }

  explicit State(uint64_t seed)
      : pool(pool_config()), tier(64 << 20, pool.record_bytes()), queries(kLayers, kHeads * kHd, 4) {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    kv = std::make_unique<kv::SequenceKv>(pool, kLayers, kKvHeads);
    EXPECT_TRUE(kv->append(kSlots, 0));
    const int32_t streams = kLayers * kKvHeads;
    std::vector<float> row(kHd);
    std::vector<std::vector<float>> keys(static_cast<size_t>(streams) * kSlots, std::vector<float>(kHd));
    for (int32_t s = 0; s < streams; ++s)
      for (int32_t j = 0; j < kSlots; ++j) {
        auto& k = keys[static_cast<size_t>(s) * kSlots + j];
        for (float& x : k) x = nd(rng);
        kernels::kv_encode_row(k.data(), DType::F16, kHd, kv->k_slot(s, j));
        for (float& x : row) x = nd(rng);
        kernels::kv_encode_row(row.data(), DType::F16, kHd, kv->v_slot(s, j));
      }
    // Evict all but 4 sinks, a random 60 and the last 32, per stream.
    cold = std::make_unique<kv::EvictedKv>(tier, pool, seed, streams);
    std::vector<std::vector<int32_t>> evicted(static_cast<size_t>(streams));
    for (int32_t s = 0; s < streams; ++s) {
      std::vector<uint8_t> keep_mask(kSlots, 0);
      for (int32_t j = 0; j < 4; ++j) keep_mask[static_cast<size_t>(j)] = 1;
      for (int32_t j = kSlots - 32; j < kSlots; ++j) keep_mask[static_cast<size_t>(j)] = 1;
      for (int32_t i = 0; i < kKeepRandom; ++i) keep_mask[4 + rng() % (kSlots - 36)] = 1;
      std::vector<int32_t> keep;
      for (int32_t j = 0; j < kSlots; ++j) (keep_mask[static_cast<size_t>(j)] ? keep : evicted[static_cast<size_t>(s)]).push_back(j);
      cold->add(*kv, s, keep);
      kv->compact_stream(s, keep);
    }
    cold->commit();
    // The newest query of each layer: per head a blend of noise and 3x an evicted key of its stream, so some
    // cold pages hold a real share of the mass (recall has something to find), others none.
    for (int32_t l = 0; l < kLayers; ++l) {
      std::vector<float> qrow(static_cast<size_t>(kHeads) * kHd);
      for (int32_t h = 0; h < kHeads; ++h) {
        const int32_t s = l * kKvHeads + h / (kHeads / kKvHeads);
        const auto& ev = evicted[static_cast<size_t>(s)];
        const auto& k = keys[static_cast<size_t>(s) * kSlots + ev[rng() % ev.size()]];
        for (int32_t d = 0; d < kHd; ++d) qrow[static_cast<size_t>(h) * kHd + d] = 0.5f * nd(rng) + 3.0f * k[static_cast<size_t>(d)];
      }
      queries.on_query(l, qrow.data(), 1, kHeads * kHd);
      q.insert(q.end(), qrow.begin(), qrow.end());
    }
  }

  // What the forward's attention would report for that row over the hot set: [layer][head].
  std::vector<float> attention_lse() const {
    std::vector<float> lse(static_cast<size_t>(kLayers) * kHeads);
    const int32_t G = kHeads / kKvHeads;
    std::vector<float> out(static_cast<size_t>(G) * kHd);
    std::vector<float> scratch(kernels::attention_scratch_floats(1, G, kHd, pool.config().page_size));
    for (int32_t l = 0; l < kLayers; ++l)
      for (int32_t h = 0; h < kKvHeads; ++h) {
        kernels::AttentionArgs a;
        a.q = q.data() + (static_cast<size_t>(l) * kHeads + static_cast<size_t>(h) * G) * kHd;
        a.out = out.data();
        a.group = G;
        a.scale = 1.0f / std::sqrt(static_cast<float>(kHd));
        a.lse = lse.data() + static_cast<size_t>(l) * kHeads + static_cast<size_t>(h) * G;
        a.scratch = scratch.data();
        kernels::paged_attention(kv->view(kv->stream_index(l, h)), a);
      }
    return lse;
  }

  std::vector<std::vector<int32_t>> hot_positions() const {
    std::vector<std::vector<int32_t>> p(static_cast<size_t>(kLayers) * kKvHeads);
    for (int32_t s = 0; s < kLayers * kKvHeads; ++s)
      for (int32_t j = 0; j < kv->n_slots(s); ++j) p[static_cast<size_t>(s)].push_back(kv->position(s, j));
    return p;
  }
};

compress::RecallConfig recall_config() {
  compress::RecallConfig c;
  c.enabled = true;
  c.max_pages = 6;
  c.min_share = 0.02f;
  return c;
}

}  // namespace

TEST(RecallAttentionLse, SameReadsExchangesAndDriftAsRecomputing) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    const std::vector<compress::Protection> prot(static_cast<size_t>(kLayers) * kKvHeads, compress::Protection{4, 8, 0});
    State a(seed), b(seed);
    compress::Recall ra(recall_config(), model_config()), rb(recall_config(), model_config());
    const int64_t got_a = ra.run(*a.kv, *a.cold, a.queries, prot, 1, nullptr);
    const std::vector<float> lse = b.attention_lse();
    for (float v : lse) ASSERT_TRUE(std::isfinite(v));
    const int64_t got_b = rb.run(*b.kv, *b.cold, b.queries, prot, 1, nullptr, lse.data());
    EXPECT_GT(ra.stats().pages_read, 0) << "the fixture should give recall something to read";
    EXPECT_GT(got_a, 0) << "and something to bring back";
    EXPECT_EQ(got_a, got_b);
    EXPECT_EQ(ra.stats().pages_read, rb.stats().pages_read);
    EXPECT_EQ(ra.stats().pages_recalled, rb.stats().pages_recalled);
    EXPECT_EQ(a.hot_positions(), b.hot_positions()) << "the same slots came back and went down";
    EXPECT_GT(ra.stats().drift_last, 0.0);
    EXPECT_NEAR(ra.stats().drift_last, rb.stats().drift_last, 1e-5 * ra.stats().drift_last);
  }
}

TEST(RecallAttentionLse, NaNEntriesFallBackToRecomputingExactly) {
  const std::vector<compress::Protection> prot(static_cast<size_t>(kLayers) * kKvHeads, compress::Protection{4, 8, 0});
  State a(7), b(7);
  compress::Recall ra(recall_config(), model_config()), rb(recall_config(), model_config());
  ra.run(*a.kv, *a.cold, a.queries, prot, 1, nullptr);
  const std::vector<float> nan(static_cast<size_t>(kLayers) * kHeads, std::numeric_limits<float>::quiet_NaN());
  rb.run(*b.kv, *b.cold, b.queries, prot, 1, nullptr, nan.data());
  EXPECT_EQ(ra.stats().pages_read, rb.stats().pages_read);
  EXPECT_EQ(ra.stats().pages_recalled, rb.stats().pages_recalled);
  EXPECT_EQ(ra.stats().drift_last, rb.stats().drift_last);  // bit for bit: the same computation
  EXPECT_EQ(a.hot_positions(), b.hot_positions());
}

// The exact drift check's figure: total variation between the two next-token distributions, against a
// float64 reference; equal rows give 0, rows that put their mass on different tokens give ~1 and a flip.
TEST(RecallExactCheck, TotalVariationOfTheTwoNextTokenDistributions) {
  constexpr int32_t kVocab = 50;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> a(kVocab), b(kVocab);
  for (int32_t i = 0; i < kVocab; ++i) {
    a[static_cast<size_t>(i)] = dist(rng);
    b[static_cast<size_t>(i)] = a[static_cast<size_t>(i)] + 0.5f * dist(rng);
  }
  compress::RecallStats st;
  st.add_exact_check(a.data(), a.data(), kVocab);
  EXPECT_EQ(st.exact_tv_first, 0.0);
  EXPECT_EQ(st.exact_flips, 0);
  st.add_exact_check(a.data(), b.data(), kVocab);
  auto probs = [](const std::vector<float>& x) {
    std::vector<double> p(x.size());
    double z = 0;
    for (size_t i = 0; i < x.size(); ++i) z += (p[i] = std::exp(static_cast<double>(x[i])));
    for (double& v : p) v /= z;
    return p;
  };
  const auto pa = probs(a), pb = probs(b);
  double tv = 0;
  for (size_t i = 0; i < pa.size(); ++i) tv += std::abs(pa[i] - pb[i]) / 2;
  EXPECT_GT(tv, 0.01);
  EXPECT_NEAR(st.exact_tv_last, tv, 1e-12);
  EXPECT_EQ(st.exact_tv_max, st.exact_tv_last);
  std::vector<float> c(kVocab, 0.0f), d(kVocab, 0.0f);
  c[3] = 40.0f;
  d[7] = 40.0f;
  st.add_exact_check(c.data(), d.data(), kVocab);
  EXPECT_NEAR(st.exact_tv_last, 1.0, 1e-9);
  const bool ab_flip = std::max_element(a.begin(), a.end()) - a.begin() != std::max_element(b.begin(), b.end()) - b.begin();
  EXPECT_EQ(st.exact_flips, 1 + (ab_flip ? 1 : 0));
  EXPECT_EQ(st.exact_checks, 3);
  EXPECT_EQ(st.exact_tv_first, 0.0);
}

// Protection::pinned (the slots TriSpan keeps for their structure, Scorer::pin_score): with
// RecallConfig::pin_override_share at +inf an exchange never displaces them. The positions a check without pins sent down are pinned on an identical copy; there they
// all stay hot, and whatever the copy exchanges instead still keeps each stream at its length.
TEST(RecallExchange, PinnedPositionsNeverGoDown) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    const size_t n_streams = static_cast<size_t>(kLayers) * kKvHeads;
    State a(seed), b(seed);
    const auto before = a.hot_positions();
    std::vector<compress::Protection> prot(n_streams, compress::Protection{4, 8, 0});
    compress::Recall ra(recall_config(), model_config());
    ASSERT_GT(ra.run(*a.kv, *a.cold, a.queries, prot, 1, nullptr), 0) << "the fixture should exchange something";
    const auto after_a = a.hot_positions();
    std::vector<std::vector<int32_t>> went_down(n_streams);
    size_t total = 0;
    for (size_t s = 0; s < n_streams; ++s) {
      for (int32_t p : before[s])
        if (std::find(after_a[s].begin(), after_a[s].end(), p) == after_a[s].end()) went_down[s].push_back(p);
      std::sort(went_down[s].begin(), went_down[s].end());
      total += went_down[s].size();
      prot[s].pinned = went_down[s];
    }
    ASSERT_GT(total, 0u);
    compress::RecallConfig never = recall_config();
    never.pin_override_share = std::numeric_limits<float>::infinity();
    compress::Recall rb(never, model_config());
    rb.run(*b.kv, *b.cold, b.queries, prot, 1, nullptr);
    const auto after_b = b.hot_positions();
    for (size_t s = 0; s < n_streams; ++s) {
      EXPECT_EQ(after_b[s].size(), before[s].size()) << "an exchange keeps the stream's length";
      for (int32_t p : went_down[s])
        EXPECT_NE(std::find(after_b[s].begin(), after_b[s].end(), p), after_b[s].end()) << "pinned position " << p << " went down";
    }
  }
}

// RecallConfig::pin_override_share: a page whose exact share reaches it may displace pinned slots. With
// every hot position pinned, a check exchanges nothing with the override at +inf, nor with it at the read
// threshold (every candidate qualifies) and checks 16 tokens apart; with that override and a check every
// token an identical copy exchanges as a check without pins does, the stream lengths unchanged.
TEST(RecallExchange, APageThatOutweighsTheOverrideDisplacesPinnedSlots) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    const size_t n_streams = static_cast<size_t>(kLayers) * kKvHeads;
    State a(seed), b(seed), c(seed), d(seed);
    const auto before = a.hot_positions();
    std::vector<compress::Protection> open(n_streams, compress::Protection{4, 8, 0}), all_pinned = open;
    for (size_t s = 0; s < n_streams; ++s) all_pinned[s].pinned = before[s];  // sorted: slots are in position order
    compress::Recall ra(recall_config(), model_config());
    const int64_t unpinned = ra.run(*a.kv, *a.cold, a.queries, open, 1, nullptr);
    ASSERT_GT(unpinned, 0) << "the fixture should exchange something";
    compress::RecallConfig never = recall_config();
    never.pin_override_share = std::numeric_limits<float>::infinity();
    compress::Recall rb(never, model_config());
    EXPECT_EQ(rb.run(*b.kv, *b.cold, b.queries, all_pinned, 1, nullptr), 0);
    EXPECT_EQ(b.hot_positions(), before);
    compress::RecallConfig cfg = recall_config();
    cfg.pin_override_share = cfg.min_share;
    cfg.every = 16;  // checks 16 tokens apart: a displaced span could not come back in time; pins hold
    compress::Recall rd(cfg, model_config());
    EXPECT_EQ(rd.run(*d.kv, *d.cold, d.queries, all_pinned, 1, nullptr), 0);
    EXPECT_EQ(d.hot_positions(), before);
    cfg.every = 1;
    compress::Recall rc(cfg, model_config());
    EXPECT_EQ(rc.run(*c.kv, *c.cold, c.queries, all_pinned, 1, nullptr), unpinned);
    EXPECT_EQ(c.hot_positions(), a.hot_positions());
  }
}
