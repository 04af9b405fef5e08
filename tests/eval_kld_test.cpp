// Quality harness, KL part: with no eviction the compressed run is the full run bit for bit (KL exactly
// 0, top-1 100%) for every policy; with small budgets on real text (stories260K + Austen) the divergence
// is real, grows as the budget shrinks, and the resident KV is smaller than full.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "compress/config.h"
#include "eval/kld.h"
#include "model/model.h"

namespace {

using kvpack::EngineOptions;
using kvpack::Model;
using kvpack::compress::CompressConfig;
using kvpack::compress::PolicyKind;
using kvpack::compress::QueryStats;
namespace eval = kvpack::eval;

const std::string kShared = KVPACK_SHARED_DIR;

struct Fixture {
  std::unique_ptr<Model> model;
  std::vector<int32_t> text;  // Austen tokens
  QueryStats calib;
  EngineOptions eo;
};

// Loaded once: the model, ~3K tokens of text and a triattention calibration on text after them.
const Fixture& fx() {
  static const Fixture* f = [] {
    auto* x = new Fixture;
    x->model = Model::load(kShared + "/models/stories260K.gguf");
    x->eo.threads = 1;  // deterministic and fast for a 260K model (no spinning pool on shared cores)
    const std::vector<int32_t> all =
        eval::tokenize_head(x->model->tokenizer(), eval::read_text_file(kShared + "/corpora/austen.txt"), 3 * 512 + 4096);
    x->text.assign(all.begin(), all.begin() + 3 * 512);
    x->calib = kvpack::calibrate(*x->model, std::vector<int32_t>(all.begin() + 3 * 512, all.end()), x->eo);
    return x;
  }();
  return *f;
}

CompressConfig cfg(PolicyKind p, int32_t budget) {
  CompressConfig c;
  c.policy = p;
  c.budget = budget;
  return c;
}

const PolicyKind kAllPolicies[] = {PolicyKind::Full, PolicyKind::Streaming, PolicyKind::KNorm, PolicyKind::TriAttention,
                                   PolicyKind::SnapKV, PolicyKind::RKV, PolicyKind::TOVA, PolicyKind::H2O};

TEST(EvalKld, WindowsStartWithBosAndHaveCtxTokens) {
  const Fixture& f = fx();
  const auto w = eval::make_windows(*f.model, f.text, 256, 3);
  ASSERT_EQ(w.size(), 3u);
  for (size_t k = 0; k < w.size(); ++k) {
    ASSERT_EQ(w[k].size(), 256u);
    EXPECT_EQ(w[k][0], f.model->tokenizer().bos());
    EXPECT_EQ(w[k][1], f.text[k * 255]);
  }
  EXPECT_THROW(eval::make_windows(*f.model, std::vector<int32_t>(10, 5), 256, 1), std::invalid_argument);
  EXPECT_THROW(eval::make_windows(*f.model, f.text, 1024, 1), std::invalid_argument);  // past the model's context
}

// Acceptance criterion: with budget >= context, KL is 0 and top-1 100% for every policy and split.
TEST(EvalKld, BudgetAtLeastContextIsExactlyFullForEveryPolicy) {
  const Fixture& f = fx();
  const int32_t ctx = 256;
  const auto windows = eval::make_windows(*f.model, f.text, ctx, 2);
  for (auto split : {kvpack::compress::BudgetSplit::Uniform, kvpack::compress::BudgetSplit::Pyramid, kvpack::compress::BudgetSplit::Ada}) {
    for (PolicyKind p : kAllPolicies) {
      for (int32_t budget : {ctx, 2 * ctx}) {
        CompressConfig c = cfg(p, budget);
        c.split = split;
        const eval::KldResult r = eval::kld(*f.model, windows, c, &f.calib, f.eo);
        SCOPED_TRACE(std::string(kvpack::compress::policy_name(p)) + " " + kvpack::compress::split_name(split) + " budget " +
                     std::to_string(budget));
        EXPECT_EQ(r.positions, 2 * (ctx - 1));
        EXPECT_EQ(r.mean_kl, 0.0);
        EXPECT_EQ(r.max_kl, 0.0);
        EXPECT_EQ(r.top1, 1.0);
        EXPECT_EQ(r.ppl_full, r.ppl_compressed);
        EXPECT_EQ(r.compression.events, 0);
        EXPECT_EQ(r.peak_pages, r.full_peak_pages);
        EXPECT_GT(r.ppl_full, 1.0);
      }
    }
  }
}

TEST(EvalKld, SmallBudgetsDivergeAndHoldLessKv) {
  const Fixture& f = fx();
  const auto windows = eval::make_windows(*f.model, f.text, 512, 2);
  const eval::KldResult s32 = eval::kld(*f.model, windows, cfg(PolicyKind::Streaming, 32), nullptr, f.eo);
  const eval::KldResult s256 = eval::kld(*f.model, windows, cfg(PolicyKind::Streaming, 256), nullptr, f.eo);
  EXPECT_GT(s32.mean_kl, 0.0);
  EXPECT_LT(s32.top1, 1.0);
  EXPECT_GT(s32.p99_kl, s32.mean_kl);
  EXPECT_GE(s32.max_kl, s32.p99_kl);
  EXPECT_GT(s32.mean_kl, s256.mean_kl) << "streaming: a budget of 32 should hurt more than 256";
  EXPECT_GT(s256.mean_kl, 0.0);  // 256 + 128 < 512: it compresses too
  EXPECT_GT(s32.mean_kl_after_eviction, s32.mean_kl);
  EXPECT_GT(s32.positions_after_eviction, 0);
  EXPECT_LT(s32.positions_after_eviction, s32.positions);
  // Memory: peak at budget + interval slots per stream, far below the full 512.
  EXPECT_LT(s32.peak_bytes(), s32.full_peak_bytes());
  EXPECT_LT(s32.final_bytes(), s32.full_final_bytes());
  EXPECT_LT(s32.peak_bytes(), s256.peak_bytes());
  EXPECT_EQ(s32.full_peak_bytes(), 20u * (512 / 16) * s32.page_bytes);  // 5 layers x 4 KV heads x 32 pages
  EXPECT_GT(s32.compression.events, 0);
  EXPECT_DOUBLE_EQ(s32.compression.reclaim_efficiency(), 1.0);  // compaction frees whole pages
  EXPECT_NE(s32.ppl_compressed, s32.ppl_full);
  EXPECT_EQ(s32.ppl_full, s256.ppl_full);

  for (PolicyKind p : {PolicyKind::KNorm, PolicyKind::TriAttention, PolicyKind::SnapKV, PolicyKind::RKV, PolicyKind::TOVA, PolicyKind::H2O}) {
    const eval::KldResult r = eval::kld(*f.model, windows, cfg(p, 32), &f.calib, f.eo);
    SCOPED_TRACE(kvpack::compress::policy_name(p));
    EXPECT_GT(r.mean_kl, 0.0);
    EXPECT_LT(r.top1, 1.0);
    EXPECT_LT(r.peak_bytes(), r.full_peak_bytes());
  }
}

TEST(EvalKld, PrecomputedReferenceGivesTheSameNumbers) {
  const Fixture& f = fx();
  const auto windows = eval::make_windows(*f.model, f.text, 384, 2);
  const eval::FullReference ref = eval::full_reference(*f.model, windows, f.eo);
  for (PolicyKind p : {PolicyKind::Full, PolicyKind::SnapKV, PolicyKind::H2O}) {
    const eval::KldResult a = eval::kld(*f.model, windows, cfg(p, 64), &f.calib, f.eo, nullptr);
    const eval::KldResult b = eval::kld(*f.model, windows, cfg(p, 64), &f.calib, f.eo, &ref);
    EXPECT_EQ(a.mean_kl, b.mean_kl);
    EXPECT_EQ(a.p99_kl, b.p99_kl);
    EXPECT_EQ(a.top1, b.top1);
    EXPECT_EQ(a.ppl_full, b.ppl_full);
    EXPECT_EQ(a.ppl_compressed, b.ppl_compressed);
    EXPECT_EQ(a.full_peak_pages, b.full_peak_pages);
    EXPECT_EQ(a.peak_pages, b.peak_pages);
  }
}

TEST(EvalKld, InvalidConfigsThrow) {
  const Fixture& f = fx();
  const auto windows = eval::make_windows(*f.model, f.text, 128, 1);
  EXPECT_THROW(eval::kld(*f.model, windows, cfg(PolicyKind::Streaming, 4), nullptr, f.eo), std::invalid_argument);
  EXPECT_THROW(eval::kld(*f.model, windows, cfg(PolicyKind::TriAttention, 64), nullptr, f.eo), std::invalid_argument);
}

}  // namespace
