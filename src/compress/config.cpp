#include "compress/config.h"

#include <algorithm>
#include <stdexcept>

namespace kvpack::compress {
namespace {
struct Named {
  const char* name;
  PolicyKind kind;
};
constexpr Named kPolicies[] = {
    {"full", PolicyKind::Full},   {"streaming", PolicyKind::Streaming}, {"knorm", PolicyKind::KNorm},
    {"triattention", PolicyKind::TriAttention}, {"snapkv", PolicyKind::SnapKV}, {"rkv", PolicyKind::RKV},
    {"tova", PolicyKind::TOVA},   {"h2o", PolicyKind::H2O},
};
}  // namespace

int32_t CompressConfig::effective_window() const {
  if (window >= 0) return window;
  switch (policy) {
    case PolicyKind::SnapKV:
    case PolicyKind::RKV:
      return 8;  // the observation window of the reference implementations (triattention repo §7)
    case PolicyKind::TOVA:
      return 1;  // TOVA protects the current token only
    default:
      // Score-free policies: a modest recent window (vLLM TriAttention uses 128 at budget 2048);
      // a sixteenth of the budget keeps the same proportion at small budgets.
      return std::clamp(budget / 16, 0, 128);
  }
}

PolicyKind parse_policy(const std::string& name) {
  for (const auto& p : kPolicies)
    if (name == p.name) return p.kind;
  std::string all;
  for (const auto& p : kPolicies) all += std::string(all.empty() ? "" : ", ") + p.name;
  throw std::invalid_argument("unknown KV policy '" + name + "' (valid: " + all + ")");
}

const char* policy_name(PolicyKind k) {
  for (const auto& p : kPolicies)
    if (p.kind == k) return p.name;
  return "?";
}

BudgetSplit parse_split(const std::string& name) {
  if (name == "uniform") return BudgetSplit::Uniform;
  if (name == "pyramid") return BudgetSplit::Pyramid;
  if (name == "ada") return BudgetSplit::Ada;
  throw std::invalid_argument("unknown budget split '" + name + "' (valid: uniform, pyramid, ada)");
}

const char* split_name(BudgetSplit s) {
  switch (s) {
    case BudgetSplit::Uniform: return "uniform";
    case BudgetSplit::Pyramid: return "pyramid";
    case BudgetSplit::Ada: return "ada";
  }
  return "?";
}

bool policy_needs_queries(PolicyKind p) {
  return p == PolicyKind::SnapKV || p == PolicyKind::RKV || p == PolicyKind::TOVA;
}
bool policy_needs_key_mass(PolicyKind p) { return p == PolicyKind::H2O; }
bool policy_needs_calibration(PolicyKind p) { return p == PolicyKind::TriAttention; }
int32_t policy_query_window(PolicyKind p) {
  return p == PolicyKind::TOVA ? 1 : (p == PolicyKind::SnapKV || p == PolicyKind::RKV) ? 8 : 0;
}

}  // namespace kvpack::compress
