// Compression settings: the policy, the budget (the one knob users should need) and the schedule.
// Every other field has a default that works untuned; see README "KV compression".
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvpack::compress {

enum class PolicyKind { Full, Streaming, KNorm, TriAttention, SnapKV, RKV, TOVA, H2O };
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
  bool naive = false;         // demonstration mode: evicted slots become holes, no compaction
  std::string calib_path;     // TriAttention statistics (kvpack calibrate)

  bool enabled() const { return policy != PolicyKind::Full && budget > 0; }
  int32_t effective_window() const;
};

// Policy names as used on the command line and in the API: full, streaming, knorm, triattention,
// snapkv, rkv, tova, h2o. Throws std::invalid_argument listing the valid names.
PolicyKind parse_policy(const std::string& name);
const char* policy_name(PolicyKind p);
BudgetSplit parse_split(const std::string& name);
const char* split_name(BudgetSplit s);
bool policy_needs_queries(PolicyKind p);      // keeps a window of recent post-RoPE queries
bool policy_needs_key_mass(PolicyKind p);     // attention kernel must emit per-key probability mass
bool policy_needs_calibration(PolicyKind p);
// Recent queries the policy looks at (SnapKV/R-KV: 8, TOVA: 1).
int32_t policy_query_window(PolicyKind p);

}  // namespace kvpack::compress
