// The committed testbed model (models/testbed.gguf, the embedded default; docs/testbed.md) through the real
// loader, engine and task harness: with full KV it answers the long-context tasks, which random or broken
// weights, a wrong RoPE or a KV cache that loses tokens cannot; and a policy that keeps only a recent window
// loses pointer, whose answer lines lie far back — the harness measures retrieval, not luck.
// Quality thresholds, not speed: optimised builds only (the sanitizer build covers the same code paths with
// stories260K elsewhere, at a fraction of the cost).
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "eval/tasks.h"
#include "model/model.h"

namespace {

namespace eval = kvpack::eval;
using eval::TaskKind;

const std::string kModel = std::string(KVPACK_SOURCE_DIR) + "/models/testbed.gguf";

TEST(TestbedModel, AnswersTheTaskSuiteWithFullKvAndLosesPointerToAWindow) {
#ifdef KVPACK_DEBUG_CHECKS
  GTEST_SKIP() << "quality thresholds are checked in the optimised build";
#endif
  if (!std::filesystem::exists(kModel)) GTEST_SKIP() << kModel << " not present (the build falls back to random weights)";
  const std::unique_ptr<kvpack::Model> model = kvpack::Model::load(kModel);
  kvpack::EngineOptions eo;
  eo.threads = 2;  // the CI machine's cores: this test runs ≈ 40 s of decoding at 2048
  kvpack::Engine engine(*model, eo);
  // The model's trained context, where the target (≥ 90 % per task, n = 50) is measured.
  constexpr int32_t kCtx = 2048, kN = 20;
  constexpr uint64_t kSeed = 1000;  // the held-out seed of training (docs/testbed.md §2)
  const kvpack::compress::CompressConfig full;
  // Measured for the shipped model (run tbw9, docs/testbed.md §12) at n = 50, seed 1000: see the table there;
  // every task ≥ 90 % at 2048, needle ≥ 96 % at 1024 (tb13 before it: 50 %). The thresholds leave room for
  // another correct summation order (other SIMD paths) flipping a few samples, not for a broken engine (which
  // scores 0). A future default model must score at least as well. walk (the decode regime: ~420 generated
  // tokens, the last ~25 copied from the model's own output ~390 tokens back) catches a KV cache that loses or
  // misplaces what the model itself wrote.
  struct Expect {
    TaskKind kind;
    int32_t ctx;
    double at_least;
  };
  for (const Expect& e : {Expect{TaskKind::Needle, kCtx, 0.8}, Expect{TaskKind::VarTrack, kCtx, 0.8},
                          Expect{TaskKind::Pointer, kCtx, 0.75}, Expect{TaskKind::Walk, kCtx, 0.75},
                          Expect{TaskKind::Needle, 1024, 0.8}}) {
    const eval::TaskResult r = eval::run_task(engine, e.kind, e.ctx, kN, kSeed, full);
    SCOPED_TRACE(std::string(eval::task_name(e.kind)) + " at " + std::to_string(e.ctx));
    EXPECT_EQ(r.n, kN);
    EXPECT_GE(r.accuracy, e.at_least);
  }
  kvpack::compress::CompressConfig window;
  window.policy = kvpack::compress::PolicyKind::Streaming;
  window.budget = kCtx / 10;
  const eval::TaskResult w = eval::run_task(engine, TaskKind::Pointer, kCtx, kN, kSeed, window);
  EXPECT_GT(w.compression.events, 0);
  EXPECT_LE(w.accuracy, 0.2);
}

// Recall (compress/recall.h) on the real model, tasks and tiers: at 10 % of the context, TriAttention alone
// loses vartrack; with the evicted tokens in a host cold tier and a recall check before every sampled token
// it gets them back. Measured (n = 6, seed 1000): 0/6 without, 6/6 with. The drift estimate is a share.
TEST(TestbedModel, RecallFromTheColdTierBringsBackWhatCompressionLost) {
#ifdef KVPACK_DEBUG_CHECKS
  GTEST_SKIP() << "quality thresholds are checked in the optimised build";
#endif
  if (!std::filesystem::exists(kModel)) GTEST_SKIP() << kModel << " not present (the build falls back to random weights)";
  const std::unique_ptr<kvpack::Model> model = kvpack::Model::load(kModel);
  kvpack::EngineOptions eo;
  eo.threads = 2;
  kvpack::EngineOptions cold_eo = eo;
  cold_eo.kv_cold = "host:256M";
  kvpack::compress::CompressConfig kv;
  kv.policy = kvpack::compress::PolicyKind::Streaming;  // needs no calibration; loses vartrack like the others
  kv.budget = 205;
  constexpr int32_t kCtx = 2048, kN = 6;
  kvpack::Engine plain(*model, eo);
  const eval::TaskResult without = eval::run_task(plain, TaskKind::VarTrack, kCtx, kN, 1000, kv);
  kv.recall.enabled = true;
  kv.recall.every = 1;
  kv.recall.max_pages = 1000;
  kvpack::Engine cold(*model, cold_eo);
  const eval::TaskResult with = eval::run_task(cold, TaskKind::VarTrack, kCtx, kN, 1000, kv);
  EXPECT_LE(without.correct, 1);
  EXPECT_GE(with.correct, without.correct + 3);
  EXPECT_GT(with.compression.recall.pages_recalled, 0);
  EXPECT_EQ(with.peak_resident_kv_bytes, without.peak_resident_kv_bytes);  // the hot budget is the same
  for (const auto& s : with.samples) {
    EXPECT_GE(s.recall.drift_first, 0.0);
    EXPECT_LE(s.recall.drift_max, 1.0);
    EXPECT_GT(s.evicted.pages_written, 0);
  }
}

}  // namespace
