// Compression settings: the policy, the budget (the one knob users should need) and the schedule.
// Every other field has a default that works untuned; see README "KV compression".
#pragma once
#include <cstdint>
#include <limits>
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

// Recall of evicted pages from the cold tier (compress/recall.h; needs --kv-cold). Off by default.
struct RecallConfig {
  bool enabled = false;
  int32_t every = 16;       // decode steps between checks (and one check right after prefill)
  int32_t prefill_rows = 32;  // query rows scored at the check after prefill (the question, typically)
  int32_t rows = 1;         // query rows scored at the decode-time checks
  int32_t max_pages = 4;    // cold pages read per stream per check
  float min_share = 0.02f;  // a page is read / recalled when it could hold this share of the hot mass
  // With a check every token (every == 1) only: a page whose exact share reaches this (1: as much attention
  // as the whole hot set, for one query vector) may displace slots the policy pinned (Scorer::pin_score;
  // after the unpinned ones): the current query needs it beyond doubt, and a span it displaces that the
  // next token needs comes back at the next check. +inf: pins never yield. Testbed, TriSpan at 10 %
  // (docs/quality.md "What to switch on"): every 1, 1 gave Austen 100 / 92 / 86 % against 80 % pointer with
  // +inf, built-in 100 / 94 / 92 against 94; with the default every 16 it gave 98 / 0 / 0 and 100 / 26 / 16
  // (spans displaced for 15 tokens), hence ignored there.
  float pin_override_share = 1.0f;
  bool bring_back = true;   // false: measure the drift only (pages are read, nothing is exchanged)
  // Drift guard (0 = off): a check whose drift estimate exceeds it is repeated reading every cold page;
  // if the estimate is still above, the request falls back to full KV (every cold page back, no more
  // compression for it).
  float guard = 0.0f;
  // Exact drift check (off by default: each check costs one full-context step): at every check the
  // scheduler computes the newest token once more over all of the request's KV (hot and cold, in a
  // scratch copy of the sequence) and compares next-token distributions (RecallStats::exact_*).
  bool exact = false;
  // Decode steps between exact checks (0: at every recall check, the `every` above). A check always runs
  // right after prefill, before the first token is sampled. Each check is one more decode step over the
  // whole context (at 16K on the Qwen3-0.6B shape ~110 ms: docs/quality.md §4f), so its share of decode
  // time is about (full-context step) / (exact_every x compressed step).
  int32_t exact_every = 0;
  // Exact guard (0 = off; needs `exact`): a check whose next-token distribution with every KV is at least
  // this far (total variation) from the compressed one, or whose most likely token differs, sends the
  // request back to full KV at once (every cold page back, no more compression; every token since the
  // first compression event computed again before sampling). Its unit is probability mass, the same for
  // any model:
  // kExactGuardTv is the default (docs/quality.md: the detector curves it was read from).
  float exact_guard = 0.0f;
};
inline constexpr float kExactGuardTv = 0.15f;

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
  // Sliding-window layers (gemma3's local layers) are left alone by default: their KV is bounded by the
  // window and the scheduler frees their pages as they fall out of it, so only global layers are scored
  // and evicted. True compresses them too (the scheduler sets it when window freeing is off).
  bool window_layers = false;
  std::string calib_path;     // TriAttention statistics (kvpack calibrate)
  RecallConfig recall;

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
