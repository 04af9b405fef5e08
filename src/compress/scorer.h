// Scorers: one per policy family, each turning a sequence's cache into one importance score per slot
// of every stream (higher = more worth keeping). Protection and budgets are applied afterwards by the
// budget split (budget_split.h / selection.h), so scores never encode them.
//
//   streaming     slot index (most recent first)                      scorer_streaming.cpp
//   knorm         -||k||  (KNorm press: low-norm keys draw attention)  scorer_knorm.cpp
//   triattention  mean over 17 future offsets of the trigonometric series from calibrated pre-RoPE
//                 query centres, plus the norm term, on post-RoPE keys at the current position
//                 (research/triattention.md §2.3); z-normalised per query head, max over the GQA
//                 group; with a uniform split one keep set per KV head (mean over layers)
//                                                                     scorer_triattention.cpp
//   snapkv        mean over the last w queries of softmax(max-over-group q·k/√d) over non-window keys,
//                 max-pooled with kernel 7 (triattention repo §7, decode-time variant)
//   rkv           λ·snapkv − (1−λ)·redundancy, λ = 0.1, cosine threshold 0.5 keeping the newest copy
//   tova          last query's attention averaged over all heads of the layer (shared by its KV heads)
//                                                                     scorer_window.cpp
//   h2o           accumulated attention probability mass (from the attention kernel)  scorer_h2o.cpp
//   trispan       spans of novel keys first (cosine of each un-rotated key to the running mean of every key
//                 the stream has seen, standardised, averaged over streams, smoothed over +-2 positions,
//                 hysteresis runs padded by 2), then 0.5 z(TriAttention) + 0.5 z(recency); recency alone
//                 without calibration; one keep set for all streams that hold the same positions
//                                                                     scorer_trispan.cpp
//
// The per-key arithmetic lives in kernels/key_scoring.h; a scorer is policy over those numbers.
// Each scorer declares what it needs (ScorerNeeds); policy_needs_* in config.h are derived from it.
// Thread-safety: a scorer is owned by one compressor (one sequence); score() may use the given pool.
#pragma once
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include "compress/calibration.h"
#include "compress/config.h"
#include "compress/key_mass.h"
#include "compress/query_window.h"
#include "kernels/key_scoring.h"
#include "kv/sequence_kv.h"
#include "model/model.h"
#include "util/thread_pool.h"

namespace kvpack::compress {

struct ScorerNeeds {
  int32_t query_window = 0;  // recent post-RoPE query rows kept per layer (0 = none)
  bool key_mass = false;     // the attention kernel must accumulate per-key probability mass
  bool calibration = false;  // calibrated query statistics (kvpack calibrate): used when the engine has them
  bool calibration_optional = false;  // ... and not required (the scorer runs without them)
};

// What a scorer may read at an event. Members a scorer does not declare in its needs may be null.
struct ScoringInputs {
  const kv::SequenceKv& kv;
  const QueryWindow* queries = nullptr;
  const KeyMass* key_mass = nullptr;
  const QueryStats* calibration = nullptr;
  ThreadPool* pool = nullptr;  // optional
  // Streams not to score (sliding-window layers, CompressConfig::window_layers): their scores are left
  // empty and the compressor leaves them as they are. Empty: every stream is scored.
  std::span<const uint8_t> frozen = {};
  bool is_frozen(int32_t s) const { return !frozen.empty() && frozen[static_cast<size_t>(s)] != 0; }
};

class Scorer {
 public:
  virtual ~Scorer() = default;
  virtual ScorerNeeds needs() const = 0;
  // scores[s] = one score per slot of stream s, for every stream that is not frozen (scores has
  // kv.n_streams() entries; frozen ones are left empty and may point at pages no longer held).
  virtual void score(const ScoringInputs& in, std::vector<std::vector<float>>& scores) = 0;
  // A copy with the same state (some scorers carry state from event to event, e.g. TriSpan's running
  // sums): a forked sequence (n > 1 choices) continues exactly as its parent would have.
  virtual std::unique_ptr<Scorer> clone() const = 0;
  // Slots scored at or above this at an event are pinned: until the next event, recall's exchanges
  // (compress/recall.h) displace them only for a page that outweighs RecallConfig::pin_override_share. +inf (the default): nothing is pinned. TriSpan pins its spans
  // (whole lines it keeps for their structure), which a single query's attention does not see the use of.
  virtual float pin_score() const { return std::numeric_limits<float>::infinity(); }
};

// The scorer of cfg.policy (nullptr for policy full).
std::unique_ptr<Scorer> make_scorer(const CompressConfig& cfg, const ModelConfig& model);
// What policy p's scorer needs (computed once from the scorers themselves).
ScorerNeeds scorer_needs(PolicyKind p);

// TriAttention's per-band future-offset averages for position t: C_f = mean_δ cos(ω_f (t+δ)),
// S_f = mean_δ sin(...), δ ∈ {1, 2, 4, ..., 65536}, ω_f from the model's RoPE (theta, linear scaling).
void tri_offset_table(const ModelConfig& c, int64_t t, std::vector<float>& C, std::vector<float>& S);

}  // namespace kvpack::compress

namespace kvpack::compress {

// TriAttention's query side for one GQA group (layer, kv_head) at one position (offset tables C, S):
// the per-band weights kernels::tri_key_scores applies to each key,
//   u_re = q̄r C − q̄i S,  u_im = q̄i C + q̄r S,  wn = E|q_f| − |q̄_f|   ([group][n_bands] each).
class TriBandWeights {
 public:
  TriBandWeights(const QueryStats& qs, int32_t layer, int32_t kv_head, int32_t group, bool rope_neox,
                 std::span<const float> C, std::span<const float> S);
  kernels::TriWeights view() const;  // valid while this object lives

 private:
  int32_t n_bands_, group_;
  bool rope_neox_;
  std::vector<float> u_re_, u_im_, wn_;
};

}  // namespace kvpack::compress
