// Each scorer (compress/scorer.h) against the arithmetic the old free functions did, recomputed here
// from the ground-truth keys (F32 storage, so the rows are exact) and from the key-scoring kernels
// (which kernels_key_scoring_test checks slot by slot): the scores must be bit-identical, because the
// golden outputs depend on them. Also each scorer's declared needs.
#include <gtest/gtest.h>

#include <cmath>

#include "compress/scorer.h"
#include "compress/selection.h"
#include "kernels/key_scoring.h"
#include "compress_test_refs.h"

using namespace kvpack;
using namespace kvpack::compress;
using namespace kvpack::compress_test;

namespace {

struct Fixture {
  ModelConfig mc = tiny_model(true);
  kv::PagePool pool{pool_config()};
  Seq seq{pool, mc, 4242};
  QueryWindow queries{mc.n_layer, mc.q_dim(), 8};
  std::vector<std::vector<float>> scores = std::vector<std::vector<float>>(static_cast<size_t>(mc.n_layer * mc.n_head_kv));

  explicit Fixture(int32_t n) {
    EXPECT_TRUE(seq.append(n));
    const std::vector<float> q = [&] {
      std::vector<float> v(static_cast<size_t>(5 * mc.q_dim()));
      for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * static_cast<float>(i));
      return v;
    }();
    for (int32_t l = 0; l < mc.n_layer; ++l) queries.on_query(l, q.data(), 5, mc.q_dim());
  }
  void run(const CompressConfig& cfg, const KeyMass* mass = nullptr, const QueryStats* qs = nullptr) {
    auto scorer = make_scorer(cfg, mc);
    ASSERT_NE(scorer, nullptr);
    scorer->score(ScoringInputs{seq.kv(), &queries, mass, qs, nullptr}, scores);
    for (int32_t s = 0; s < seq.kv().n_streams(); ++s) ASSERT_EQ(scores[static_cast<size_t>(s)].size(), static_cast<size_t>(seq.kv().n_slots(s)));
  }
};

}  // namespace

TEST(CompressScorers, NeedsPerFamily) {
  const ModelConfig mc = tiny_model(true);
  auto needs = [&](PolicyKind p) { return make_scorer(make_cfg(p, 64, 4, -1), mc)->needs(); };
  EXPECT_EQ(needs(PolicyKind::Streaming).query_window, 0);
  EXPECT_FALSE(needs(PolicyKind::KNorm).key_mass);
  EXPECT_TRUE(needs(PolicyKind::TriAttention).calibration);
  EXPECT_EQ(needs(PolicyKind::SnapKV).query_window, 8);
  EXPECT_EQ(needs(PolicyKind::RKV).query_window, 8);
  EXPECT_EQ(needs(PolicyKind::TOVA).query_window, 1);
  EXPECT_TRUE(needs(PolicyKind::H2O).key_mass);
  EXPECT_FALSE(needs(PolicyKind::H2O).calibration);
  EXPECT_TRUE(needs(PolicyKind::TriSpan).calibration);
  EXPECT_TRUE(needs(PolicyKind::TriSpan).calibration_optional);
  EXPECT_FALSE(needs(PolicyKind::TriAttention).calibration_optional);
}

TEST(CompressScorers, StreamingKNormAndH2OMatchTheOldArithmetic) {
  Fixture f(23);
  f.run(make_cfg(PolicyKind::Streaming, 12, 2, 1));
  for (int32_t s = 0; s < f.seq.kv().n_streams(); ++s)
    for (int32_t j = 0; j < 23; ++j) EXPECT_EQ(f.scores[static_cast<size_t>(s)][static_cast<size_t>(j)], static_cast<float>(j));
  f.run(make_cfg(PolicyKind::KNorm, 12, 2, 1));
  for (int32_t s = 0; s < f.seq.kv().n_streams(); ++s)
    for (int32_t j = 0; j < 23; ++j) {
      double ss = 0;
      for (float v : f.seq.key_at(s, j)) ss += static_cast<double>(v) * v;
      EXPECT_EQ(f.scores[static_cast<size_t>(s)][static_cast<size_t>(j)], static_cast<float>(-std::sqrt(ss))) << s << " " << j;
    }
  KeyMass mass(f.seq.kv().n_streams());
  BatchItem item;
  const std::vector<int32_t> one(1, 0);
  item.tokens = one;
  mass.prepare(f.seq.kv(), item);
  for (int32_t s = 0; s < f.seq.kv().n_streams(); ++s)
    for (int32_t j = 0; j < 23; ++j) item.key_mass[s * item.key_mass_stride + j] = static_cast<float>(s * 100 + j);
  f.run(make_cfg(PolicyKind::H2O, 12, 2, 1), &mass);
  for (int32_t s = 0; s < f.seq.kv().n_streams(); ++s)
    for (int32_t j = 0; j < 23; ++j) EXPECT_EQ(f.scores[static_cast<size_t>(s)][static_cast<size_t>(j)], static_cast<float>(s * 100 + j));
  f.run(make_cfg(PolicyKind::H2O, 12, 2, 1), nullptr);  // no forward prepared yet: no signal, all zero
  for (const auto& sc : f.scores)
    for (float v : sc) EXPECT_EQ(v, 0.0f);
}

TEST(CompressScorers, TriAttentionIsZNormalisedMaxOverGroupAndLayerMeanWhenUniform) {
  for (BudgetSplit split : {BudgetSplit::Uniform, BudgetSplit::Pyramid}) {
    Fixture f(29);
    const QueryStats qs = make_stats(f.mc, 5);
    CompressConfig cfg = make_cfg(PolicyKind::TriAttention, 12, 2, 1);
    cfg.split = split;
    f.run(cfg, nullptr, &qs);
    std::vector<float> C, S;
    tri_offset_table(f.mc, f.seq.kv().next_pos(), C, S);
    const int32_t G = f.mc.group(), n = 29;
    std::vector<std::vector<float>> per_stream(f.scores.size());
    for (int32_t l = 0; l < f.mc.n_layer; ++l)
      for (int32_t h = 0; h < f.mc.n_head_kv; ++h) {
        const int32_t s = f.seq.kv().stream_index(l, h);
        const TriBandWeights w(qs, l, h, G, true, C, S);
        std::vector<float> all(static_cast<size_t>(G) * n);
        kernels::tri_key_scores(f.seq.kv().view(s), w.view(), all.data());
        auto& out = per_stream[static_cast<size_t>(s)];
        out.assign(static_cast<size_t>(n), -INFINITY);
        for (int32_t g = 0; g < G; ++g) {
          std::span<float> head(all.data() + static_cast<size_t>(g) * n, static_cast<size_t>(n));
          z_normalize(head);
          for (int32_t j = 0; j < n; ++j) out[static_cast<size_t>(j)] = std::max(out[static_cast<size_t>(j)], head[static_cast<size_t>(j)]);
        }
      }
    for (int32_t l = 0; l < f.mc.n_layer; ++l)
      for (int32_t h = 0; h < f.mc.n_head_kv; ++h) {
        std::vector<float> want = per_stream[static_cast<size_t>(f.seq.kv().stream_index(l, h))];
        if (split == BudgetSplit::Uniform) {  // one keep set per KV head: the mean over layers, in layer order
          want.assign(static_cast<size_t>(n), 0.0f);
          for (int32_t l2 = 0; l2 < f.mc.n_layer; ++l2)
            for (int32_t j = 0; j < n; ++j)
              want[static_cast<size_t>(j)] += per_stream[static_cast<size_t>(f.seq.kv().stream_index(l2, h))][static_cast<size_t>(j)] /
                                              static_cast<float>(f.mc.n_layer);
        }
        EXPECT_EQ(f.scores[static_cast<size_t>(f.seq.kv().stream_index(l, h))], want) << split_name(split) << " layer " << l << " head " << h;
      }
  }
}

TEST(CompressScorers, WindowScorersComposeTheKernels) {
  Fixture f(31);
  const int32_t n = 31, G = f.mc.group(), hd = f.mc.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  f.run(make_cfg(PolicyKind::SnapKV, 16, 2, -1));
  const auto snap = f.scores;
  f.run(make_cfg(PolicyKind::RKV, 16, 2, -1));
  std::vector<float> q;
  for (int32_t l = 0; l < f.mc.n_layer; ++l) {
    f.queries.recent(l, q);
    ASSERT_EQ(q.size(), static_cast<size_t>(5 * f.mc.q_dim()));
    for (int32_t h = 0; h < f.mc.n_head_kv; ++h) {
      const int32_t s = f.seq.kv().stream_index(l, h);
      for (int32_t j = n - 8; j < n; ++j) EXPECT_EQ(snap[static_cast<size_t>(s)][static_cast<size_t>(j)], 0.0f);  // the window
      std::vector<float> red(static_cast<size_t>(n));
      kernels::key_redundancy(f.seq.kv().view(s), 8, red.data());
      for (int32_t j = 0; j < n; ++j)
        EXPECT_EQ(f.scores[static_cast<size_t>(s)][static_cast<size_t>(j)],
                  0.1f * snap[static_cast<size_t>(s)][static_cast<size_t>(j)] - (1 - 0.1f) * red[static_cast<size_t>(j)])
            << "rkv stream " << s << " slot " << j;
    }
  }
  f.run(make_cfg(PolicyKind::TOVA, 16, 2, -1));
  for (int32_t l = 0; l < f.mc.n_layer; ++l) {
    f.queries.recent(l, q);
    std::vector<double> avg(static_cast<size_t>(n), 0.0);
    for (int32_t h = 0; h < f.mc.n_head_kv; ++h) {
      std::vector<float> logits(static_cast<size_t>(G) * n);
      kernels::group_logits(f.seq.kv().view(f.seq.kv().stream_index(l, h)), q.data() + 4 * f.mc.q_dim() + h * G * hd, G, scale, logits.data());
      for (int32_t g = 0; g < G; ++g) {
        const float* row = logits.data() + static_cast<size_t>(g) * n;
        float mx = -INFINITY;
        for (int32_t j = 0; j < n; ++j) mx = std::max(mx, row[j]);
        double sum = 0;
        for (int32_t j = 0; j < n; ++j) sum += std::exp(static_cast<double>(row[j] - mx));
        for (int32_t j = 0; j < n; ++j) avg[static_cast<size_t>(j)] += std::exp(static_cast<double>(row[j] - mx)) / sum;
      }
    }
    const std::vector<float> want(avg.begin(), avg.end());
    for (int32_t h = 0; h < f.mc.n_head_kv; ++h) EXPECT_EQ(f.scores[static_cast<size_t>(f.seq.kv().stream_index(l, h))], want) << "tova layer " << l;
  }
}

TEST(CompressScorers, QueryWindowKeepsTheNewestRowsOldestFirst) {
  QueryWindow w(2, 3, 4);
  EXPECT_EQ(w.count(), 0);
  std::vector<float> rows(7 * 5);  // 7 rows of 3 floats, stride 5
  for (int t = 0; t < 7; ++t)
    for (int e = 0; e < 3; ++e) rows[static_cast<size_t>(t * 5 + e)] = static_cast<float>(10 * t + e);
  for (int32_t l = 0; l < 2; ++l) w.on_query(l, rows.data(), 2, 5);  // rows 0, 1
  EXPECT_EQ(w.count(), 2);
  for (int32_t l = 0; l < 2; ++l) w.on_query(l, rows.data() + 2 * 5, 5, 5);  // rows 2..6: keeps 3..6
  EXPECT_EQ(w.count(), 4);
  std::vector<float> out;
  w.recent(1, out);
  const std::vector<float> want = {30, 31, 32, 40, 41, 42, 50, 51, 52, 60, 61, 62};
  EXPECT_EQ(out, want);
}
