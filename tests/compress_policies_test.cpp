// Keep sets of every scoring policy (StreamingLLM, KNorm, TriAttention, SnapKV, R-KV, TOVA, H2O)
// against the literal references of compress_test_refs.h on small hand-made caches.
#include <gtest/gtest.h>

#include "kernels/key_scoring.h"
#include "util/half.h"
#include "util/thread_pool.h"
#include "compress_test_refs.h"

using namespace kvpack;
using namespace kvpack::compress;
using namespace kvpack::compress_test;

// ===================================================================================================
// StreamingLLM and KNorm

TEST(CompressPolicies, StreamingKeepsSinksAndMostRecent) {
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 1);
  const CompressConfig cfg = make_cfg(PolicyKind::Streaming, 20, 4, -1);
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  ASSERT_TRUE(seq.append(37));
  Snapshot sn = snapshot(seq);
  compress_and_check(comp, seq, sn);
  // Literal rule: positions {0..3} ∪ the last 16.
  std::vector<int32_t> want = {0, 1, 2, 3};
  for (int32_t p = 37 - 16; p < 37; ++p) want.push_back(p);
  for (int32_t s = 0; s < seq.kv().n_streams(); ++s) EXPECT_EQ(seq.positions(s), want) << "stream " << s;
  expect_keep_sets(seq, sn, ref_recency(sn), uniform_budgets(mc, 20), cfg, 0, 0.0, "streaming");
  // Second event after more tokens: still sinks + most recent (in original positions).
  ASSERT_TRUE(seq.append(11));
  sn = snapshot(seq);
  compress_and_check(comp, seq, sn);
  want = {0, 1, 2, 3};
  for (int32_t p = 48 - 16; p < 48; ++p) want.push_back(p);
  for (int32_t s = 0; s < seq.kv().n_streams(); ++s) EXPECT_EQ(seq.positions(s), want) << "stream " << s;
}

TEST(CompressPolicies, KNormKeepsLowestNormKeys) {
  const ModelConfig mc = tiny_model(false);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 2);
  const CompressConfig cfg = make_cfg(PolicyKind::KNorm, 16, 2, 3);
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  ASSERT_TRUE(seq.append(45));
  for (int round = 0; round < 4; ++round) {
    Snapshot sn = snapshot(seq);
    compress_and_check(comp, seq, sn);
    expect_keep_sets(seq, sn, ref_knorm(sn), uniform_budgets(mc, 16), cfg, 0, 0.0, "knorm round " + std::to_string(round));
    for (int32_t s = 0; s < seq.kv().n_streams(); ++s) EXPECT_EQ(seq.kv().n_slots(s), 16);
    ASSERT_TRUE(seq.append(7 + round * 5));
  }
}

TEST(CompressPolicies, EqualScoresPreferTheMoreRecentSlot) {
  // All keys identical: every KNorm score ties, so the keep set is the sinks plus the newest slots.
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 3);
  seq.set_fixed_key({0.5f, -1.0f, 0.25f, 2.0f, 0.0f, 1.0f, -0.5f, 0.75f});
  const CompressConfig cfg = make_cfg(PolicyKind::KNorm, 10, 2, 1);
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  ASSERT_TRUE(seq.append(29));
  Snapshot sn = snapshot(seq);
  compress_and_check(comp, seq, sn);
  const std::vector<int32_t> want = {0, 1, 21, 22, 23, 24, 25, 26, 27, 28};
  for (int32_t s = 0; s < seq.kv().n_streams(); ++s) EXPECT_EQ(seq.positions(s), want) << "stream " << s;
}

// ===================================================================================================
// TriAttention

class TriAttentionTest : public ::testing::TestWithParam<bool> {};

TEST_P(TriAttentionTest, KeepSetMatchesComplexReference) {
  const bool neox = GetParam();
  const ModelConfig mc = tiny_model(neox);
  const QueryStats qs = make_stats(mc, neox ? 11 : 12);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, neox ? 21 : 22);
  const CompressConfig cfg = make_cfg(PolicyKind::TriAttention, 24, 4, -1);
  ASSERT_EQ(cfg.effective_window(), 1);
  SequenceCompressor comp(cfg, mc, &qs, 0);
  ASSERT_TRUE(seq.append(61));
  for (int round = 0; round < 3; ++round) {
    Snapshot sn = snapshot(seq);
    compress_and_check(comp, seq, sn);
    const auto ref = ref_triattention(mc, qs, sn, sn.next_pos, /*layer_mean=*/true);
    expect_keep_sets(seq, sn, ref, uniform_budgets(mc, 24), cfg, 0, 1e-4, "triattention round " + std::to_string(round));
    // One selection per KV head shared by every layer.
    for (int32_t h = 0; h < mc.n_head_kv; ++h)
      for (int32_t l = 1; l < mc.n_layer; ++l)
        EXPECT_EQ(seq.positions(seq.kv().stream_index(l, h)), seq.positions(seq.kv().stream_index(0, h))) << "head " << h;
    ASSERT_TRUE(seq.append(13 + round));
  }
}

TEST_P(TriAttentionTest, ThreadPoolGivesTheSameKeepSets) {
  const bool neox = GetParam();
  const ModelConfig mc = tiny_model(neox, 3, 4, 2);
  const QueryStats qs = make_stats(mc, 5);
  kv::PagePool pool_a(pool_config()), pool_b(pool_config());
  Seq a(pool_a, mc, 77), b(pool_b, mc, 77);
  const CompressConfig cfg = make_cfg(PolicyKind::TriAttention, 20, 2, 2);
  ThreadPool tp(2);
  SequenceCompressor ca(cfg, mc, &qs, 0), cb(cfg, mc, &qs, 0, &tp);
  ASSERT_TRUE(a.append(50));
  ASSERT_TRUE(b.append(50));
  Snapshot sn = snapshot(a);
  compress_and_check(ca, a, sn);
  cb.compress(b.kv());
  for (int32_t s = 0; s < a.kv().n_streams(); ++s) EXPECT_EQ(a.positions(s), b.positions(s));
  expect_keep_sets(a, sn, ref_triattention(mc, qs, sn, sn.next_pos, true), uniform_budgets(mc, 20), cfg, 0, 1e-4, "tri 3 layers");
}

TEST_P(TriAttentionTest, LargeAbsolutePosition) {
  // t far from 0 (positions start at 100000): the offset table must use the sequence's position.
  const bool neox = GetParam();
  const ModelConfig mc = tiny_model(neox);
  const QueryStats qs = make_stats(mc, 31);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 32);
  const CompressConfig cfg = make_cfg(PolicyKind::TriAttention, 16, 0, 0);
  SequenceCompressor comp(cfg, mc, &qs, 0);
  // Put the sequence at a large position: append an empty first chunk at 100000 by rolling next_pos.
  ASSERT_TRUE(seq.kv().append(1, 100000));
  seq.kv().truncate_tail(1);  // next_pos goes back by one: 100000
  ASSERT_EQ(seq.kv().next_pos(), 100000);
  ASSERT_TRUE(seq.append(40));
  Snapshot sn = snapshot(seq);
  compress_and_check(comp, seq, sn);
  expect_keep_sets(seq, sn, ref_triattention(mc, qs, sn, sn.next_pos, true), uniform_budgets(mc, 16), cfg, 0, 1e-4,
                   "triattention t=100040");
}

INSTANTIATE_TEST_SUITE_P(RopeLayouts, TriAttentionTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "neox" : "normal"; });

// The production layout — F16 keys, NeoX pairs, head_dim 128 (F = 64 bands), groups of 2 and 8 — takes
// the vectorised scoring path on AVX-512 machines: every score must equal the folded formula evaluated in
// double precision on the stored (f16) keys, for every slot and query head of the group.
TEST(CompressPolicies, TriAttentionF16NeoxScoresMatchDoubleFormula) {
  for (int32_t group : {2, 8}) {
    ModelConfig mc = tiny_model(true, 2, 2 * group, 2);
    mc.head_dim = 128;
    mc.rope_dims = 128;
    mc.n_embd = mc.n_head * 128;
    const QueryStats qs = make_stats(mc, 40 + static_cast<uint32_t>(group));
    kv::PoolConfig pc = pool_config();
    pc.head_dim = 128;
    pc.kv_type = DType::F16;
    kv::PagePool pool(pc);
    kv::SequenceKv kv(pool, mc.n_layer, mc.n_head_kv);
    const int32_t n = 77;
    ASSERT_TRUE(kv.append(n, 5000));
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.5f);
    for (int32_t st = 0; st < kv.n_streams(); ++st)
      for (int32_t j = 0; j < n; ++j) {
        auto* h = reinterpret_cast<uint16_t*>(kv.k_slot(st, j));
        for (int e = 0; e < 128; ++e) h[e] = f32_to_fp16(nd(rng));
      }
    std::vector<float> C, S;
    tri_offset_table(mc, kv.next_pos(), C, S);
    const int32_t F = 64;
    for (int32_t layer = 0; layer < mc.n_layer; ++layer)
      for (int32_t h = 0; h < mc.n_head_kv; ++h) {
        const TriBandWeights tw(qs, layer, h, group, true, C, S);  // the query side, as the scorer folds it
        const int32_t st = kv.stream_index(layer, h);
        std::vector<float> out(static_cast<size_t>(group) * n);
        kernels::tri_key_scores(kv.view(st), tw.view(), out.data());
        for (int32_t g = 0; g < group; ++g)
          for (int32_t j = 0; j < n; ++j) {
            const auto* key = reinterpret_cast<const uint16_t*>(kv.k_slot(st, j));
            double ref = 0, mag = 0;
            for (int32_t f = 0; f < F; ++f) {
              const size_t i = qs.index(layer, h * group + g, f);
              const double qr = qs.mean_re[i], qi = qs.mean_im[i];
              const double kr = fp16_to_f32(key[f]), ki = fp16_to_f32(key[f + F]);
              const double m = std::hypot(kr, ki);
              ref += kr * (qr * C[static_cast<size_t>(f)] - qi * S[static_cast<size_t>(f)]) +
                     ki * (qi * C[static_cast<size_t>(f)] + qr * S[static_cast<size_t>(f)]) +
                     (qs.abs_mean[i] - std::hypot(qr, qi)) * m;
              mag += (std::fabs(kr) + std::fabs(ki)) * (std::fabs(qr) + std::fabs(qi)) * 2 + qs.abs_mean[i] * m;
            }
            EXPECT_NEAR(out[static_cast<size_t>(g) * n + j], ref, 1e-5 * mag + 1e-6)
                << "group " << group << " layer " << layer << " head " << h << " g " << g << " slot " << j;
          }
      }
  }
}


// ===================================================================================================
// SnapKV, R-KV, TOVA (window attention from post-RoPE queries) and H2O (key mass)

class WindowPolicyTest : public ::testing::TestWithParam<int32_t> {};  // param: sinks

TEST_P(WindowPolicyTest, SnapKVMatchesMaterialisedSoftmax) {
  const int32_t sinks = GetParam();
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 40 + sinks);
  Queries qf(mc, 140 + sinks);
  const CompressConfig cfg = make_cfg(PolicyKind::SnapKV, 20, sinks, -1);
  ASSERT_EQ(cfg.effective_window(), 8);
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  ASSERT_TRUE(seq.append(50));
  qf.feed(comp, 5);  // a prefill chunk...
  qf.feed(comp, 6);  // ...and another: the window is the last 8 queries across both
  for (int round = 0; round < 3; ++round) {
    Snapshot sn = snapshot(seq);
    compress_and_check(comp, seq, sn);
    expect_keep_sets(seq, sn, ref_window_streams(mc, qf, sn, false), uniform_budgets(mc, 20), cfg, 0, 1e-7, "snapkv round " + std::to_string(round));
    ASSERT_TRUE(decode_steps(seq, qf, comp, 9 + 4 * round));
  }
}

TEST_P(WindowPolicyTest, TOVASharesOneKeepSetPerLayer) {
  const int32_t sinks = GetParam();
  const ModelConfig mc = tiny_model(false);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 60 + sinks);
  Queries qf(mc, 160 + sinks);
  const CompressConfig cfg = make_cfg(PolicyKind::TOVA, 12, sinks, -1);
  ASSERT_EQ(cfg.effective_window(), 1);
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  ASSERT_TRUE(seq.append(30));
  qf.feed(comp, 30);
  for (int round = 0; round < 3; ++round) {
    Snapshot sn = snapshot(seq);
    compress_and_check(comp, seq, sn);
    expect_keep_sets(seq, sn, ref_tova(mc, qf, sn), uniform_budgets(mc, 12), cfg, 0, 1e-7, "tova round " + std::to_string(round));
    for (int32_t l = 0; l < mc.n_layer; ++l)
      for (int32_t h = 1; h < mc.n_head_kv; ++h)
        EXPECT_EQ(seq.positions(seq.kv().stream_index(l, h)), seq.positions(seq.kv().stream_index(l, 0))) << "layer " << l;
    ASSERT_TRUE(decode_steps(seq, qf, comp, 5 + round));
  }
}

// R-KV against the literal reference. (An earlier engine version computed the redundancy over the
// non-window keys only (`m = n - w_keys`, rows AND columns [0, m)).) The reference
// `cal_similarity(K)[:, :-w]` (triattention.md §7, R-KV rkv/utils.py) builds C over ALL cached keys:
// the window's rows count in every column mean (a key duplicated inside the window is redundant),
// and the softmax runs over all n columns, which rescales the term against λ·importance. Minor
// second difference: when row i has no near-duplicate, `max(indices)` over an all-zero row gives
// j* = 0 and the reference zeroes C[i,0]; the engine zeroes nothing (lines 154-164).
// RKVRedundancyCountsWindowKeys isolates the first difference.
TEST_P(WindowPolicyTest, RKVMatchesLiteralReference) {
  const int32_t sinks = GetParam();
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 80 + sinks);
  Queries qf(mc, 180 + sinks);
  const CompressConfig cfg = make_cfg(PolicyKind::RKV, 20, sinks, -1);
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  ASSERT_TRUE(seq.append(48));
  qf.feed(comp, 12);
  for (int round = 0; round < 3; ++round) {
    Snapshot sn = snapshot(seq);
    compress_and_check(comp, seq, sn);
    expect_keep_sets(seq, sn, ref_window_streams(mc, qf, sn, true), uniform_budgets(mc, 20), cfg, 0, 1e-7, "rkv (literal cal_similarity) round " + std::to_string(round));
    ASSERT_TRUE(decode_steps(seq, qf, comp, 10));
  }
}

// Both R-KV deviations, isolated on a hand-made layout where they decide the outcome.
TEST(CompressPolicies, RKVRedundancyCountsWindowKeys) {
  // Regression test for the window-rows difference described at RKVMatchesLiteralReference.
  // Stream layout (1 layer, 1 KV head, 1 query head, window 8, sinks 0, budget 9 → 1 free slot):
  // candidates 0 and 1 have identical attention (queries all zero → uniform softmax), key 0 is
  // unique while key 1 has near-duplicates only INSIDE the window. With the window's keys counted
  // (reference) slot 1 is the redundant one and slot 0 is kept; ignoring them, both score alike and
  // the tie goes to the more recent slot 1.
  ModelConfig mc = tiny_model(true, 1, 1, 1);
  kv::PagePool pool(pool_config());
  kv::SequenceKv kv(pool, 1, 1);
  ASSERT_TRUE(kv.append(10, 0));
  auto put = [&](int32_t slot, std::vector<float> k) {
    std::memcpy(kv.k_slot(0, slot), k.data(), sizeof(float) * kHeadDim);
    std::vector<float> v(kHeadDim, static_cast<float>(slot));
    std::memcpy(kv.v_slot(0, slot), v.data(), sizeof(float) * kHeadDim);
  };
  put(0, {1, 0, 0, 0, 0, 0, 0, 0});
  put(1, {0, 1, 0, 0, 0, 0, 0, 0});
  for (int32_t j = 2; j < 10; ++j) put(j, {0, 1, 0.1f * static_cast<float>(j), 0, 0, 0, 0, 0});  // window: copies of key 1
  CompressConfig cfg = make_cfg(PolicyKind::RKV, 9, 0, 8);
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  std::vector<float> q(static_cast<size_t>(8 * mc.q_dim()), 0.0f);
  comp.on_query_post_rope(0, 0, q.data(), 8, mc.q_dim());
  comp.compress(kv);
  ASSERT_EQ(kv.n_slots(0), 9);
  EXPECT_EQ(kv.position(0, 0), 0) << "slot 1 (duplicated inside the window) should have been evicted, not slot 0";
}

TEST_P(WindowPolicyTest, H2OKeepsHeaviestMassAndMovesItWithCompaction) {
  const int32_t sinks = GetParam();
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 90 + sinks);
  const CompressConfig cfg = make_cfg(PolicyKind::H2O, 14, sinks, 2);
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  std::mt19937 rng(190 + sinks);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  // Reference mass per (stream, position), accumulated like the attention kernel would.
  std::vector<std::map<int32_t, double>> mass(static_cast<size_t>(seq.kv().n_streams()));
  auto forward = [&](int32_t n_new) {
    std::vector<int32_t> toks(static_cast<size_t>(n_new), 1);
    BatchItem item;
    item.kv = &seq.kv();
    item.tokens = toks;
    comp.prepare(seq.kv(), item);
    ASSERT_NE(item.key_mass, nullptr);
    ASSERT_GE(item.key_mass_stride, seq.kv().max_slots() + n_new);
    ASSERT_TRUE(seq.append(n_new));
    for (int32_t s = 0; s < seq.kv().n_streams(); ++s)
      for (int32_t j = 0; j < seq.kv().n_slots(s); ++j) {
        const float add = ud(rng);
        item.key_mass[static_cast<size_t>(s) * item.key_mass_stride + j] += add;
        mass[static_cast<size_t>(s)][seq.kv().position(s, j)] += add;
      }
  };
  forward(31);
  for (int round = 0; round < 4; ++round) {
    Snapshot sn = snapshot(seq);
    compress_and_check(comp, seq, sn);
    std::vector<std::vector<double>> ref(sn.pos.size());
    for (size_t s = 0; s < sn.pos.size(); ++s)
      for (int32_t p : sn.pos[s]) ref[s].push_back(mass[s][p]);
    expect_keep_sets(seq, sn, ref, uniform_budgets(mc, 14), cfg, 0, 1e-4, "h2o round " + std::to_string(round));
    // The accumulator moved with the survivors: slot i holds the mass of the i-th kept position, zeros after.
    BatchItem item;
    std::vector<int32_t> none;
    item.tokens = none;
    comp.prepare(seq.kv(), item);
    for (int32_t s = 0; s < seq.kv().n_streams(); ++s) {
      for (int32_t j = 0; j < seq.kv().n_slots(s); ++j)
        EXPECT_NEAR(item.key_mass[static_cast<size_t>(s) * item.key_mass_stride + j], mass[static_cast<size_t>(s)][seq.kv().position(s, j)], 1e-4)
            << "stream " << s << " slot " << j;
      for (int64_t j = seq.kv().n_slots(s); j < item.key_mass_stride; ++j)
        ASSERT_EQ(item.key_mass[static_cast<size_t>(s) * item.key_mass_stride + j], 0.0f) << "stream " << s << " slot " << j;
    }
    forward(3 + round * 17);  // the last one grows the buffer past its first capacity
  }
}

INSTANTIATE_TEST_SUITE_P(Sinks, WindowPolicyTest, ::testing::Values(0, 4),
                         [](const ::testing::TestParamInfo<int32_t>& i) { return "sinks" + std::to_string(i.param); });
