#include "compress/config.h"

#include <algorithm>
#include <stdexcept>

#include "compress/calibration.h"
#include "model/model.h"

namespace kvpack::compress {
namespace {
struct Named {
  const char* name;
  PolicyKind kind;
};
constexpr Named kPolicies[] = {
    {"full", PolicyKind::Full},   {"streaming", PolicyKind::Streaming}, {"knorm", PolicyKind::KNorm},
    {"triattention", PolicyKind::TriAttention}, {"snapkv", PolicyKind::SnapKV}, {"rkv", PolicyKind::RKV},
    {"tova", PolicyKind::TOVA},   {"h2o", PolicyKind::H2O}, {"trispan", PolicyKind::TriSpan},
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

void CompressConfig::validate(const ModelConfig& model, const QueryStats* calibration) const {
  const std::string pol = std::string("'") + policy_name(policy) + "'";
  if (budget < 0) throw InvalidCompressConfig("kv_budget", "must be >= 0 (is " + std::to_string(budget) + ")");
  if (interval < 1) throw InvalidCompressConfig("kv_interval", "must be >= 1 (is " + std::to_string(interval) + ")");
  if (sinks < 0) throw InvalidCompressConfig("kv_sinks", "must be >= 0 (is " + std::to_string(sinks) + ")");
  if (window < -1) throw InvalidCompressConfig("kv_window", "must be >= 0, or -1 for the policy default (is " + std::to_string(window) + ")");
  if (policy == PolicyKind::Full) return;
  if (budget == 0)
    throw InvalidCompressConfig("kv_budget", "kv_policy " + pol + " needs kv_budget > 0 (command line: --kv-budget N)");
  const int32_t floor = sinks + effective_window() + 1;  // at least one evictable slot
  if (budget < floor)
    throw InvalidCompressConfig("kv_budget", std::to_string(budget) + " is smaller than kv_sinks + kv_window + 1 (" +
                                                 std::to_string(floor) + ")");
  if (policy_requires_calibration(policy) && calibration == nullptr)
    throw InvalidCompressConfig("kv_policy", pol + " needs calibration statistics, and none are loaded: `kvpack generate` and the "
                                             "C++ API compute them by themselves (once per model, cached); start `kvpack serve` with "
                                             "--kv-policy triattention (same) or --kv-calib FILE (from `kvpack calibrate`)");
  if (policy == PolicyKind::TriAttention && model.rope_dims != model.head_dim)
    throw InvalidCompressConfig("kv_policy", pol + " needs RoPE on the whole head (rope_dims " + std::to_string(model.rope_dims) +
                                             " != head_dim " + std::to_string(model.head_dim) + ")");
}

PolicyKind parse_policy(const std::string& name) {
  for (const auto& p : kPolicies)
    if (name == p.name) return p.kind;
  std::string all;
  for (const auto& p : kPolicies) all += std::string(all.empty() ? "" : ", ") + p.name;
  throw std::invalid_argument("unknown KV policy '" + name + "' (valid: " + all + ")");
}

PolicyKind resolve_policy(const std::string& name, int32_t budget) {
  if (!name.empty()) return parse_policy(name);
  return budget > 0 ? kDefaultPolicy : PolicyKind::Full;
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

}  // namespace kvpack::compress
