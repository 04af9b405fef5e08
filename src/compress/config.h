// Compression settings: the policy, the budget (the one knob users should need) and the schedule.
// Every other field has a default that works untuned; see README "KV compression".
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvpack {
struct ModelConfig;
}

namespace kvpack::compress {

struct QueryStats;

enum class PolicyKind { Full, Streaming, KNorm, TriAttention, SnapKV, RKV, TOVA, H2O, TriSpan };
inline constexpr int kNumPolicies = 9;
enum class BudgetSplit { Uniform, Pyramid, Ada };

struct CompressConfig {
  PolicyKind policy = PolicyKind::Full;
  int32_t budget = 0;         // slots kept per stream (layer x KV head) after a compression event
  int32_t interval = 128;     // compress when a stream reaches budget + interval slots
  int32_t sinks = 4;          // first slots never evicted (attention sinks)
  int32_t window = -1;        // last slots never evicted; -1 = policy default (see default_window)
  bool protect_prompt = false;
  bool compress_prefill = true;  // also cut back right after a prompt longer than the budget
  BudgetSplit split = BudgetSplit::Uniform;
  bool naive = false;         // demonstration: report the pages a non-compacting allocator would hold (NaiveLayout)
  std::string calib_path;     // TriAttention statistics (kvpack calibrate)

  bool enabled() const { return policy != PolicyKind::Full && budget > 0; }
  int32_t effective_window() const;
  // The one check of a compression config, used by every entry point (CLI, C++ API, HTTP API, the
  // compressor itself). `calibration` = the statistics the engine holds (nullptr: none). Throws
  // InvalidCompressConfig naming the field, e.g. "kv_budget: 12 is smaller than kv_sinks + kv_window
  // + 1 (13)". A policy other than full needs a budget > 0; policy full with any budget is valid here
  // (budget 0 and full both mean "no compression").
  void validate(const ModelConfig& model, const QueryStats* calibration) const;
};

// What CompressConfig::validate throws: field() is the API name of the offending setting (kv_policy,
// kv_budget, kv_interval, kv_sinks, kv_window), what() starts with it.
class InvalidCompressConfig : public std::invalid_argument {
 public:
  InvalidCompressConfig(std::string field, const std::string& problem)
      : std::invalid_argument(field + ": " + problem), field_(std::move(field)) {}
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

// Policy names as used on the command line and in the API: full, streaming, knorm, triattention,
// snapkv, rkv, tova, h2o, trispan. Throws std::invalid_argument listing the valid names.
PolicyKind parse_policy(const std::string& name);
// The policy a budget alone selects (command line: --kv-budget N without --kv-policy). TriSpan needs no
// calibration file (it uses one when given), so the budget stays the one knob users need.
inline constexpr PolicyKind kDefaultPolicy = PolicyKind::TriSpan;
// The policy of a config that may leave it unnamed: parse_policy(name) when name is non-empty, else
// kDefaultPolicy when budget > 0 and full (no compression) when budget is 0.
PolicyKind resolve_policy(const std::string& name, int32_t budget);
const char* policy_name(PolicyKind p);
BudgetSplit parse_split(const std::string& name);
const char* split_name(BudgetSplit s);
// What the policy's scorer needs (see compress/scorer.h, ScorerNeeds: the one source of these answers).
bool policy_needs_queries(PolicyKind p);      // keeps a window of recent post-RoPE queries
bool policy_needs_key_mass(PolicyKind p);     // attention kernel must emit per-key probability mass
bool policy_needs_calibration(PolicyKind p);   // uses calibration statistics when given (--kv-calib loads them)
bool policy_requires_calibration(PolicyKind p); // ... and cannot run without them (triattention; not trispan)
// Recent queries the policy looks at (SnapKV/R-KV: 8, TOVA: 1).
int32_t policy_query_window(PolicyKind p);

}  // namespace kvpack::compress
