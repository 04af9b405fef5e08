// CompressConfig::validate (the one check every entry point uses) and the compressor's use of it.
#include <gtest/gtest.h>

#include "compress_test_refs.h"

using namespace kvpack;
using namespace kvpack::compress;
using namespace kvpack::compress_test;

TEST(CompressValidate, TriAttentionWithoutStatisticsNamesTheCalibrateCommand) {
  const ModelConfig mc = tiny_model(true);
  try {
    SequenceCompressor comp(make_cfg(PolicyKind::TriAttention, 32, 4, -1), mc, nullptr, 0);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("kvpack calibrate"), std::string::npos) << e.what();
  }
  // Disabled compression (full, or budget 0) needs no statistics.
  EXPECT_NO_THROW(SequenceCompressor(make_cfg(PolicyKind::TriAttention, 0, 4, -1), mc, nullptr, 0));
  EXPECT_NO_THROW(SequenceCompressor(make_cfg(PolicyKind::Full, 32, 4, -1), mc, nullptr, 0));
}

TEST(CompressValidate, BudgetBelowSinksPlusWindowPlusOneIsRejected) {
  const ModelConfig mc = tiny_model(true);
  EXPECT_THROW(SequenceCompressor(make_cfg(PolicyKind::KNorm, 8, 4, 4), mc, nullptr, 0), std::invalid_argument);
  EXPECT_NO_THROW(SequenceCompressor(make_cfg(PolicyKind::KNorm, 9, 4, 4), mc, nullptr, 0));
  // Default windows: SnapKV/R-KV 8, TOVA 1, score-free budget/16.
  EXPECT_THROW(SequenceCompressor(make_cfg(PolicyKind::SnapKV, 12, 4, -1), mc, nullptr, 0), std::invalid_argument);
  EXPECT_NO_THROW(SequenceCompressor(make_cfg(PolicyKind::SnapKV, 13, 4, -1), mc, nullptr, 0));
  EXPECT_THROW(SequenceCompressor(make_cfg(PolicyKind::RKV, 12, 4, -1), mc, nullptr, 0), std::invalid_argument);
  EXPECT_THROW(SequenceCompressor(make_cfg(PolicyKind::TOVA, 5, 4, -1), mc, nullptr, 0), std::invalid_argument);
  EXPECT_NO_THROW(SequenceCompressor(make_cfg(PolicyKind::TOVA, 6, 4, -1), mc, nullptr, 0));
  EXPECT_THROW(SequenceCompressor(make_cfg(PolicyKind::Streaming, 4, 4, -1), mc, nullptr, 0), std::invalid_argument);
  EXPECT_NO_THROW(SequenceCompressor(make_cfg(PolicyKind::Streaming, 5, 4, -1), mc, nullptr, 0));
  const QueryStats qs = make_stats(mc, 1);
  try {
    SequenceCompressor comp(make_cfg(PolicyKind::TriAttention, 6, 4, 2), mc, &qs, 0);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("kv_budget: 6 is smaller than kv_sinks + kv_window + 1 (7)"), std::string::npos) << e.what();
  }
}

namespace {

// The message of validate()'s exception, and its field; "" if it accepts the config.
std::pair<std::string, std::string> check(const CompressConfig& c, const ModelConfig& mc, const QueryStats* qs) {
  try {
    c.validate(mc, qs);
  } catch (const InvalidCompressConfig& e) {
    return {e.field(), e.what()};
  }
  return {"", ""};
}

}  // namespace

TEST(CompressValidate, EachFieldNamesItselfAndTheProblem) {
  const ModelConfig mc = tiny_model(true);
  const QueryStats qs = make_stats(mc, 3);
  using P = std::pair<std::string, std::string>;
  EXPECT_EQ(check(make_cfg(PolicyKind::SnapKV, 12, 4, -1), mc, nullptr),
            P("kv_budget", "kv_budget: 12 is smaller than kv_sinks + kv_window + 1 (13)"));
  EXPECT_EQ(check(make_cfg(PolicyKind::KNorm, 0, 4, -1), mc, nullptr),
            P("kv_budget", "kv_budget: kv_policy 'knorm' needs kv_budget > 0 (command line: --kv-budget N)"));
  EXPECT_EQ(check(make_cfg(PolicyKind::KNorm, -3, 4, -1), mc, nullptr), P("kv_budget", "kv_budget: must be >= 0 (is -3)"));
  EXPECT_EQ(check(make_cfg(PolicyKind::KNorm, 32, 4, -1, 0), mc, nullptr), P("kv_interval", "kv_interval: must be >= 1 (is 0)"));
  EXPECT_EQ(check(make_cfg(PolicyKind::KNorm, 32, -1, -1), mc, nullptr), P("kv_sinks", "kv_sinks: must be >= 0 (is -1)"));
  EXPECT_EQ(check(make_cfg(PolicyKind::KNorm, 32, 4, -2), mc, nullptr).first, "kv_window");
  const auto calib = check(make_cfg(PolicyKind::TriAttention, 32, 4, -1), mc, nullptr);
  EXPECT_EQ(calib.first, "kv_policy");
  EXPECT_NE(calib.second.find("kv_policy: 'triattention' needs calibration statistics"), std::string::npos) << calib.second;
  EXPECT_NE(calib.second.find("kvpack calibrate"), std::string::npos) << calib.second;
  EXPECT_NE(calib.second.find("--kv-calib FILE"), std::string::npos) << calib.second;
  ModelConfig partial_rope = mc;
  partial_rope.rope_dims = kHeadDim / 2;
  EXPECT_EQ(check(make_cfg(PolicyKind::TriAttention, 32, 4, -1), partial_rope, &qs),
            P("kv_policy", "kv_policy: 'triattention' needs RoPE on the whole head (rope_dims 4 != head_dim 8)"));
}

TEST(CompressValidate, AcceptsWhatTheCompressorCanRun) {
  const ModelConfig mc = tiny_model(true);
  const QueryStats qs = make_stats(mc, 4);
  EXPECT_EQ(check(make_cfg(PolicyKind::SnapKV, 13, 4, -1), mc, nullptr).first, "");
  EXPECT_EQ(check(make_cfg(PolicyKind::TriAttention, 32, 4, -1), mc, &qs).first, "");
  // Policy full: no budget needed, and a budget is harmless (it means nothing without a policy).
  EXPECT_EQ(check(make_cfg(PolicyKind::Full, 0, 4, -1), mc, nullptr).first, "");
  EXPECT_EQ(check(make_cfg(PolicyKind::Full, 3, 4, -1), mc, nullptr).first, "");
  // The compressor validates enabled configs only: budget 0 is "no compression" there.
  EXPECT_NO_THROW(SequenceCompressor(make_cfg(PolicyKind::KNorm, 0, 4, -1), mc, nullptr, 0));
  EXPECT_THROW(SequenceCompressor(make_cfg(PolicyKind::KNorm, 32, 4, -1, 0), mc, nullptr, 0), InvalidCompressConfig);
}

TEST(CompressValidate, PolicyNeedsComeFromTheScorers) {
  for (int k = 0; k < kNumPolicies; ++k) {
    const auto p = static_cast<PolicyKind>(k);
    CompressConfig c;
    c.policy = p;
    c.budget = 64;
    const auto scorer = make_scorer(c, tiny_model(true));
    const ScorerNeeds n = scorer ? scorer->needs() : ScorerNeeds{};
    EXPECT_EQ(policy_query_window(p), n.query_window) << policy_name(p);
    EXPECT_EQ(policy_needs_queries(p), n.query_window > 0) << policy_name(p);
    EXPECT_EQ(policy_needs_key_mass(p), n.key_mass) << policy_name(p);
    EXPECT_EQ(policy_needs_calibration(p), n.calibration) << policy_name(p);
  }
  // The documented values.
  EXPECT_EQ(policy_query_window(PolicyKind::SnapKV), 8);
  EXPECT_EQ(policy_query_window(PolicyKind::RKV), 8);
  EXPECT_EQ(policy_query_window(PolicyKind::TOVA), 1);
  EXPECT_EQ(policy_query_window(PolicyKind::KNorm), 0);
  EXPECT_TRUE(policy_needs_key_mass(PolicyKind::H2O));
  EXPECT_TRUE(policy_needs_calibration(PolicyKind::TriAttention));
  EXPECT_FALSE(policy_needs_calibration(PolicyKind::Streaming));
  EXPECT_EQ(make_scorer(CompressConfig{}, tiny_model(true)), nullptr);  // policy full scores nothing
}
