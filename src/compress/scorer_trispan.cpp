// TriSpan: score-free KV compression that keeps whole spans of novel keys, then fills the budget with
// TriAttention's score blended with recency (docs/kv-compression.md "TriSpan"). No attention scores.
//
// Per compression event, for every stream s (layer, KV head):
//   u_j     = R(-p_j) k_j / ||k_j||          the slot's key un-rotated to pre-RoPE and normalised
//   m_s     = running sum of u over EVERY token the stream has seen (new slots added at each event, so
//             evicted tokens still count: the reference is the whole history, not the survivors)
//   c_j     = -cos(u_j, m_s)                  key novelty
//   nu_sj   = (c_j - mean_s) / sd_s           standardised with running moments of c (each token counted
//                                             once, when first seen)
// Streams that hold the same positions (with a uniform split: all of them) share one score vector:
//   nu_j    = mean over the streams of nu_sj
//   a_j     = mean of nu over the slots j-2 .. j+2                                   (span novelty)
//   span    = maximal runs of consecutive slots with a > kSpanLow that reach a > kSpanHigh somewhere,
//             padded by 2 slots on either side                                        (hysteresis)
//   score_j = kTier + a_j                                       for slots in a span   (kept first)
//           = (1 - kRecency) z(tri_j) + kRecency z(j)           otherwise, tri_j = mean over the streams
//             of TriAttention's score (z per query head, max over the GQA group); without calibration
//             statistics, z(j) alone (recency)
// One keep set for the whole sequence: a token is kept or evicted in every layer and head at once, so a
// span survives everywhere. Constants were chosen on the testbed model (docs/quality.md §4c) and are in
// the units above (standardised novelty averaged over streams).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "compress/scorer_impl.h"
#include "compress/selection.h"
#include "kernels/key_scoring.h"
#include "kernels/ops.h"

namespace kvpack::compress::scorer_detail {
namespace {

constexpr int32_t kSmoothRadius = 2;  // span novelty: mean over the slots j-2 .. j+2
constexpr float kSpanHigh = 0.9f;     // a span reaches this somewhere ...
constexpr float kSpanLow = 0.5f;      // ... and extends while above this
constexpr int32_t kSpanPad = 2;       // the 2 slots on either side of a span are kept with it (line delimiters)
constexpr float kRecency = 0.5f;      // weight of recency against TriAttention's score outside the spans
constexpr float kTier = 1000.0f;      // spans rank above every other slot (the other scores are z-scores)

// FNV-1a over a stream's positions: streams with equal lists share one score vector.
uint64_t positions_hash(const std::vector<int32_t>& pos) {
  uint64_t h = 1469598103934665603ull ^ static_cast<uint64_t>(pos.size());
  for (const int32_t p : pos) {
    h ^= static_cast<uint32_t>(p);
    h *= 1099511628211ull;
  }
  return h;
}

class TriSpanScorer final : public Scorer {
 public:
  std::unique_ptr<Scorer> clone() const override { return std::make_unique<TriSpanScorer>(*this); }
  float pin_score() const override { return kTier; }
  TriSpanScorer(const CompressConfig&, const ModelConfig& model) : mc_(model) {}

  ScorerNeeds needs() const override {
    ScorerNeeds n;
    n.calibration = true;            // uses TriAttention's statistics when the engine has them ...
    n.calibration_optional = true;   // ... and runs without (recency outside the spans)
    return n;
  }

  void score(const ScoringInputs& in, std::vector<std::vector<float>>& scores) override {
    const kv::SequenceKv& kv = in.kv;
    const int32_t S = kv.n_streams();
    if (static_cast<int32_t>(state_.size()) != S) {
      state_.assign(static_cast<size_t>(S), StreamState{});
      for (auto& st : state_) st.sum.assign(static_cast<size_t>(mc_.head_dim), 0.0);
    }
    group_streams(in);
    // TriAttention's term needs RoPE on the whole head (as validate() demands of triattention); otherwise
    // the spans and recency alone.
    const bool use_tri = in.calibration != nullptr && mc_.rope_dims == mc_.head_dim;
    if (use_tri) tri_offset_table(mc_, kv.next_pos(), C_, S_);
    nov_.resize(static_cast<size_t>(S));
    tri_.resize(static_cast<size_t>(S));
    auto task = [&](int32_t s) {
      if (in.is_frozen(s)) return;
      stream_novelty(kv, s, nov_[static_cast<size_t>(s)]);
      if (use_tri) tri_stream_scores(*in.calibration, mc_, kv, s / mc_.n_head_kv, s % mc_.n_head_kv, C_, S_, tri_[static_cast<size_t>(s)]);
    };
    if (in.pool != nullptr) {
      in.pool->run(S, [&](int t, int) { task(t); });
    } else {
      for (int32_t s = 0; s < S; ++s) task(s);
    }
    // Groups write disjoint score vectors (their own streams'): in parallel too.
    if (in.pool != nullptr) {
      in.pool->run(static_cast<int32_t>(groups_.size()), [&](int g, int) { group_scores(kv, groups_[static_cast<size_t>(g)], use_tri, scores); });
    } else {
      for (const Group& g : groups_) group_scores(kv, g, use_tri, scores);
    }
    for (int32_t s = 0; s < S; ++s)
      if (in.is_frozen(s)) scores[static_cast<size_t>(s)].clear();
  }

 private:
  struct StreamState {
    std::vector<double> sum;  // running sum of unit pre-RoPE keys
    int32_t last_pos = -1;    // highest position seen
    double n = 0, s1 = 0, s2 = 0;  // running moments of the novelty c
  };
  struct Group {
    std::vector<int32_t> streams;  // holding the same positions (positions_ of the first one)
  };

  // Frozen streams (sliding-window layers) join no group: their slots are other tokens. Each stream's
  // positions are copied once per event (positions_), page by page.
  void group_streams(const ScoringInputs& in) {
    const kv::SequenceKv& kv = in.kv;
    groups_.clear();
    hashes_.clear();
    positions_.resize(static_cast<size_t>(kv.n_streams()));
    for (int32_t s = 0; s < kv.n_streams(); ++s) {
      if (in.is_frozen(s)) continue;
      std::vector<int32_t>& pos = positions_[static_cast<size_t>(s)];
      kv.copy_positions(s, pos);
      const uint64_t h = positions_hash(pos);
      size_t g = 0;
      for (; g < groups_.size(); ++g)
        if (hashes_[g] == h && positions_[static_cast<size_t>(groups_[g].streams[0])] == pos) break;
      if (g == groups_.size()) {
        groups_.push_back({});
        hashes_.push_back(h);
      }
      groups_[g].streams.push_back(s);
    }
    extend_inverse_rope(kv.next_pos());
  }

  // The inverse RoPE table of every position below `end`, grown as positions do: computed once per
  // position, not once per group and event (after recall the streams rarely share a slot list, and
  // rebuilding a table per stream made an event several times slower).
  void extend_inverse_rope(int32_t end) {
    const int32_t have = inv_positions_;
    if (mc_.rope_dims == 0 || end <= have) return;
    std::vector<int32_t> neg(static_cast<size_t>(end - have));
    for (int32_t p = have; p < end; ++p) neg[static_cast<size_t>(p - have)] = -p;
    inv_cs_.resize(static_cast<size_t>(end) * static_cast<size_t>(mc_.rope_dims));
    kernels::rope_table(neg.data(), end - have, mc_.rope_dims, mc_.rope_theta, 1.0f / mc_.rope_freq_scale,
                        inv_cs_.data() + static_cast<size_t>(have) * static_cast<size_t>(mc_.rope_dims), mc_.rope_factors());
    inv_positions_ = end;
  }

  // nu_sj of every slot of stream s; updates the stream's running statistics with its new slots.
  void stream_novelty(const kv::SequenceKv& kv, int32_t s, std::vector<float>& nu) {
    StreamState& st = state_[static_cast<size_t>(s)];
    const int32_t n = kv.n_slots(s);
    int32_t from = n;  // slots are in position order: the unseen ones are a suffix
    const std::vector<int32_t>& pos = positions_[static_cast<size_t>(s)];
    while (from > 0 && pos[static_cast<size_t>(from - 1)] > st.last_pos) --from;
    nu.resize(static_cast<size_t>(n));
    if (n == 0) return;
    kernels::KeyUnrotate r;
    r.cs = inv_cs_.data();
    r.positions = pos.data();
    r.rot_dims = mc_.rope_dims;
    r.neox = mc_.rope_neox;
    kernels::key_novelty(kv.view(s), r, from, st.sum.data(), nu.data());
    for (int32_t j = 0; j < n; ++j) nu[static_cast<size_t>(j)] = -nu[static_cast<size_t>(j)];
    for (int32_t j = from; j < n; ++j) {
      const double c = nu[static_cast<size_t>(j)];
      st.n += 1;
      st.s1 += c;
      st.s2 += c * c;
    }
    st.last_pos = std::max(st.last_pos, pos[static_cast<size_t>(n - 1)]);
    const double mean = st.s1 / st.n;
    const double sd = std::max(std::sqrt(std::max(st.s2 / st.n - mean * mean, 0.0)), 1e-6);
    for (auto& x : nu) x = static_cast<float>((x - mean) / sd);
  }

  void group_scores(const kv::SequenceKv& kv, const Group& g, bool use_tri, std::vector<std::vector<float>>& scores) const {
    const int32_t s0 = g.streams[0], n = kv.n_slots(s0);
    const float k = 1.0f / static_cast<float>(g.streams.size());
    std::vector<float> nu(static_cast<size_t>(n), 0.0f), tier2(static_cast<size_t>(n), 0.0f);
    for (int32_t s : g.streams)
      for (int32_t j = 0; j < n; ++j) nu[static_cast<size_t>(j)] += nov_[static_cast<size_t>(s)][static_cast<size_t>(j)] * k;
    // Span novelty: mean over the neighbouring slots. Neighbours are slots, not positions: after a
    // compaction the survivors of a span are adjacent (tested: position windows kept fewer lines).
    std::vector<float> a(static_cast<size_t>(n));
    for (int32_t j = 0; j < n; ++j) {
      const int32_t lo = std::max(0, j - kSmoothRadius), hi = std::min(n - 1, j + kSmoothRadius);
      double sum = 0;
      for (int32_t x = lo; x <= hi; ++x) sum += nu[static_cast<size_t>(x)];
      a[static_cast<size_t>(j)] = static_cast<float>(sum / (hi - lo + 1));
    }
    // Spans: runs above kSpanLow that reach kSpanHigh, padded by kSpanPad slots.
    std::vector<char> span(static_cast<size_t>(n), 0), padded(static_cast<size_t>(n), 0);
    for (int32_t j = 0; j < n;) {
      if (a[static_cast<size_t>(j)] <= kSpanLow) {
        ++j;
        continue;
      }
      int32_t e = j;
      bool high = false;
      for (; e < n && a[static_cast<size_t>(e)] > kSpanLow; ++e) high |= a[static_cast<size_t>(e)] > kSpanHigh;
      if (high) std::fill(span.begin() + j, span.begin() + e, 1);
      j = e;
    }
    for (int32_t j = 0; j < n; ++j)
      if (span[static_cast<size_t>(j)])
        std::fill(padded.begin() + std::max(0, j - kSpanPad), padded.begin() + std::min(n, j + kSpanPad + 1), 1);
    // Outside the spans: TriAttention blended with recency (recency alone without calibration).
    std::vector<float> rank(static_cast<size_t>(n));
    for (int32_t j = 0; j < n; ++j) rank[static_cast<size_t>(j)] = static_cast<float>(j);
    z_normalize(rank);
    const float w_rec = use_tri ? kRecency : 1.0f;
    if (use_tri) {
      for (int32_t s : g.streams)
        for (int32_t j = 0; j < n; ++j) tier2[static_cast<size_t>(j)] += tri_[static_cast<size_t>(s)][static_cast<size_t>(j)] * k;
      z_normalize(tier2);
    }
    for (int32_t j = 0; j < n; ++j)
      tier2[static_cast<size_t>(j)] = (1.0f - w_rec) * tier2[static_cast<size_t>(j)] + w_rec * rank[static_cast<size_t>(j)];
    std::vector<float>& out = scores[static_cast<size_t>(s0)];
    out.resize(static_cast<size_t>(n));
    for (int32_t j = 0; j < n; ++j)
      out[static_cast<size_t>(j)] = padded[static_cast<size_t>(j)] ? kTier + a[static_cast<size_t>(j)] : tier2[static_cast<size_t>(j)];
    for (size_t i = 1; i < g.streams.size(); ++i) scores[static_cast<size_t>(g.streams[i])] = out;
  }

  const ModelConfig mc_;
  std::vector<StreamState> state_;
  std::vector<Group> groups_;
  std::vector<uint64_t> hashes_;                // per group: positions_hash of its positions
  std::vector<std::vector<int32_t>> positions_;  // per stream: its slots' positions (this event)
  std::vector<float> inv_cs_;   // inverse RoPE rows of positions [0, inv_positions_) (extend_inverse_rope)
  int32_t inv_positions_ = 0;
  std::vector<std::vector<float>> nov_, tri_;  // per-event, per stream
  std::vector<float> C_, S_;                   // TriAttention's offset tables of the event
};

}  // namespace

std::unique_ptr<Scorer> make_trispan_scorer(const CompressConfig& cfg, const ModelConfig& model) {
  return std::make_unique<TriSpanScorer>(cfg, model);
}

}  // namespace kvpack::compress::scorer_detail
