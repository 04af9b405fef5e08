#include "compress/scorer.h"

#include <array>

#include "compress/scorer_impl.h"

namespace kvpack::compress {

std::unique_ptr<Scorer> make_scorer(const CompressConfig& cfg, const ModelConfig& model) {
  using namespace scorer_detail;
  switch (cfg.policy) {
    case PolicyKind::Full: return nullptr;
    case PolicyKind::Streaming: return make_streaming_scorer();
    case PolicyKind::KNorm: return make_knorm_scorer();
    case PolicyKind::TriAttention: return make_triattention_scorer(cfg, model);
    case PolicyKind::SnapKV:
    case PolicyKind::RKV:
    case PolicyKind::TOVA: return make_window_scorer(cfg, model);
    case PolicyKind::H2O: return make_h2o_scorer();
    case PolicyKind::TriSpan: return make_trispan_scorer(cfg, model);
  }
  return nullptr;
}

ScorerNeeds scorer_needs(PolicyKind p) {
  // Asked of the scorers themselves, once (their needs do not depend on the budget or the model).
  static const std::array<ScorerNeeds, kNumPolicies> table = [] {
    std::array<ScorerNeeds, kNumPolicies> t{};
    const ModelConfig model;
    for (int k = 0; k < kNumPolicies; ++k) {
      CompressConfig c;
      c.policy = static_cast<PolicyKind>(k);
      if (auto s = make_scorer(c, model)) t[static_cast<size_t>(k)] = s->needs();
    }
    return t;
  }();
  return table[static_cast<size_t>(p)];
}

bool policy_needs_queries(PolicyKind p) { return scorer_needs(p).query_window > 0; }
bool policy_needs_key_mass(PolicyKind p) { return scorer_needs(p).key_mass; }
bool policy_needs_calibration(PolicyKind p) { return scorer_needs(p).calibration; }
bool policy_requires_calibration(PolicyKind p) { return scorer_needs(p).calibration && !scorer_needs(p).calibration_optional; }
int32_t policy_query_window(PolicyKind p) { return scorer_needs(p).query_window; }

}  // namespace kvpack::compress
