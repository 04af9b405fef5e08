#include "compress/compressor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "compress/scoring.h"
#include "compress/selection.h"

namespace kvpack::compress {
namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
constexpr float kRkvLambda = 0.1f;
constexpr float kAdaAlpha = 0.2f;
}  // namespace

void CompressionStats::add(const CompressionStats& o) {
  events += o.events;
  evicted_slots += o.evicted_slots;
  freed_pages += o.freed_pages;
  evicted_bytes += o.evicted_bytes;
  freed_bytes += o.freed_bytes;
  seconds += o.seconds;
  score_seconds += o.score_seconds;
  max_streams_slots = std::max(max_streams_slots, o.max_streams_slots);
}

SequenceCompressor::SequenceCompressor(const CompressConfig& cfg, const ModelConfig& model, const QueryStats* stats,
                                       int32_t prompt_len, ThreadPool* pool)
    : cfg_(cfg), mc_(model), qstats_(stats), prompt_len_(prompt_len), pool_(pool), n_streams_(model.n_layer * model.n_head_kv),
      schedule_(cfg, n_streams_) {
  if (cfg_.enabled() && policy_needs_calibration(cfg_.policy) && qstats_ == nullptr)
    throw std::invalid_argument(std::string("KV policy '") + policy_name(cfg_.policy) +
                                "' needs calibration statistics: run `kvpack calibrate -m MODEL --text FILE -o FILE` "
                                "and pass --kv-calib FILE");
  if (cfg_.enabled() && cfg_.policy == PolicyKind::TriAttention && model.rope_dims != model.head_dim)
    throw std::invalid_argument("triattention needs RoPE on the whole head (rope_dims == head_dim)");
  if (cfg_.enabled() && cfg_.budget < cfg_.sinks + cfg_.effective_window() + 1)
    throw std::invalid_argument("KV budget " + std::to_string(cfg_.budget) + " is smaller than sinks + window + 1 (" +
                                std::to_string(cfg_.sinks + cfg_.effective_window() + 1) + ")");
  if (cfg_.interval < 1) throw std::invalid_argument("KV interval must be >= 1");
  scores_.resize(static_cast<size_t>(n_streams_));
  keeps_.resize(static_cast<size_t>(n_streams_));
  qwin_ = policy_query_window(cfg_.policy);
  if (qwin_ > 0) qring_.assign(static_cast<size_t>(mc_.n_layer) * qwin_ * mc_.q_dim(), 0.0f);
}

void SequenceCompressor::prepare(kv::SequenceKv& kv, BatchItem& item) {
  if (!cfg_.enabled() || !policy_needs_key_mass(cfg_.policy)) return;
  const int32_t need = kv.max_slots() + static_cast<int32_t>(item.tokens.size());
  if (need > mass_cap_) {
    // Grow geometrically so this reallocates O(log n) times per sequence, not per token.
    const int32_t cap = std::max(need, std::max(64, mass_cap_ * 2));
    std::vector<float> grown(static_cast<size_t>(n_streams_) * cap, 0.0f);
    for (int32_t s = 0; s < n_streams_ && mass_cap_ > 0; ++s)
      std::memcpy(grown.data() + static_cast<size_t>(s) * cap, mass_.data() + static_cast<size_t>(s) * mass_cap_,
                  sizeof(float) * static_cast<size_t>(mass_cap_));
    mass_.swap(grown);
    mass_cap_ = cap;
  }
  item.key_mass = mass_.data();
  item.key_mass_stride = mass_cap_;
}

void SequenceCompressor::on_query_post_rope(int32_t, int32_t layer, const float* q, int32_t n_tokens, int64_t stride) {
  if (qwin_ == 0) return;
  const int32_t QD = mc_.q_dim();
  // Keep only the newest qwin_ rows of this call.
  const int32_t first = std::max(0, n_tokens - qwin_);
  for (int32_t t = first; t < n_tokens; ++t) {
    const int32_t slot = (qcount_ + (t - first)) % qwin_;
    std::memcpy(qring_.data() + (static_cast<size_t>(layer) * qwin_ + slot) * QD, q + t * stride, sizeof(float) * static_cast<size_t>(QD));
  }
  if (layer == mc_.n_layer - 1) qcount_ += n_tokens - first;
}

std::span<const float> SequenceCompressor::recent_queries(int32_t layer, int32_t& w) {
  w = std::min(qcount_, qwin_);
  const int32_t QD = mc_.q_dim();
  qlinear_.resize(static_cast<size_t>(w) * QD);
  for (int32_t i = 0; i < w; ++i) {  // oldest first
    const int32_t slot = ((qcount_ - w + i) % qwin_ + qwin_) % qwin_;
    std::memcpy(qlinear_.data() + static_cast<size_t>(i) * QD, qring_.data() + (static_cast<size_t>(layer) * qwin_ + slot) * QD,
                sizeof(float) * static_cast<size_t>(QD));
  }
  return qlinear_;
}

int64_t SequenceCompressor::live_total(const kv::SequenceKv& kv) const {
  int64_t total = 0;  // live slots (naive mode leaves holes that no longer count)
  for (int32_t st = 0; st < n_streams_; ++st) total += cfg_.naive ? kv.live_slots(st) : kv.n_slots(st);
  return total;
}

int32_t SequenceCompressor::tokens_until_trigger(const kv::SequenceKv& kv) const {
  return schedule_.tokens_until_event(live_total(kv));
}

bool SequenceCompressor::after_forward(kv::SequenceKv& kv, bool prefill_done) {
  if (!schedule_.fires(live_total(kv), prefill_done)) return false;
  compress(kv);
  return true;
}

void SequenceCompressor::score_triattention(const kv::SequenceKv& kv) {
  std::vector<float> C, S;
  tri_offset_table(mc_, kv.next_pos(), C, S);
  const int32_t G = mc_.group();
  auto score_stream = [&](int32_t layer, int32_t h) {
    const int32_t s = kv.stream_index(layer, h);
    const int32_t n = kv.n_slots(s);
    std::vector<float>& out = scores_[static_cast<size_t>(s)];
    out.assign(static_cast<size_t>(n), -INFINITY);
    std::vector<float> all(static_cast<size_t>(G) * n);
    score_triattention_group(kv, mc_, *qstats_, layer, h, C, S, all);
    std::vector<float> live_tmp;
    for (int32_t g = 0; g < G; ++g) {
      std::span<float> tmp(all.data() + static_cast<size_t>(g) * n, static_cast<size_t>(n));
      if (cfg_.naive) {  // z-normalise over live slots only (holes are not candidates)
        live_tmp.clear();
        for (int32_t j = 0; j < n; ++j)
          if (!kv.is_hole(s, j)) live_tmp.push_back(tmp[static_cast<size_t>(j)]);
        z_normalize(live_tmp);
        for (int32_t j = 0, i = 0; j < n; ++j)
          if (!kv.is_hole(s, j)) tmp[static_cast<size_t>(j)] = live_tmp[static_cast<size_t>(i++)];
      } else {
        z_normalize(tmp);
      }
      for (int32_t j = 0; j < n; ++j) out[static_cast<size_t>(j)] = std::max(out[static_cast<size_t>(j)], tmp[static_cast<size_t>(j)]);
    }
  };
  if (pool_ != nullptr) {
    pool_->run(n_streams_, [&](int task, int) { score_stream(task / mc_.n_head_kv, task % mc_.n_head_kv); });
  } else {
    for (int32_t t = 0; t < n_streams_; ++t) score_stream(t / mc_.n_head_kv, t % mc_.n_head_kv);
  }
  // TriAttention's default selection: one keep set per KV head shared by all layers, from the mean over
  // layers of the per-layer scores. Valid only while all layers of a head hold the same slots, i.e.
  // with a uniform split (per-layer budgets make layers diverge; then each stream keeps its own).
  if (cfg_.split != BudgetSplit::Uniform) return;
  for (int32_t h = 0; h < mc_.n_head_kv; ++h) {
    const int32_t n = kv.n_slots(kv.stream_index(0, h));
    bool same = true;
    for (int32_t l = 1; l < mc_.n_layer; ++l) same &= kv.n_slots(kv.stream_index(l, h)) == n;
    if (!same) continue;
    std::vector<float> mean(static_cast<size_t>(n), 0.0f);
    for (int32_t l = 0; l < mc_.n_layer; ++l) {
      const auto& sc = scores_[static_cast<size_t>(kv.stream_index(l, h))];
      for (int32_t j = 0; j < n; ++j) mean[static_cast<size_t>(j)] += sc[static_cast<size_t>(j)] / static_cast<float>(mc_.n_layer);
    }
    for (int32_t l = 0; l < mc_.n_layer; ++l) scores_[static_cast<size_t>(kv.stream_index(l, h))] = mean;
  }
}

void SequenceCompressor::score_window_policy(const kv::SequenceKv& kv) {
  const int32_t hd = mc_.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> logits, tmp;
  for (int32_t l = 0; l < mc_.n_layer; ++l) {
    int32_t w = 0;
    std::span<const float> q = recent_queries(l, w);
    if (cfg_.policy == PolicyKind::TOVA) {
      // Last query, softmax per query head, averaged over every head of the layer; shared by its KV heads.
      const int32_t n = kv.n_slots(kv.stream_index(l, 0));
      std::vector<double> avg(static_cast<size_t>(n), 0.0);
      std::vector<float> k(static_cast<size_t>(hd));
      for (int32_t h = 0; h < mc_.n_head_kv; ++h) {
        const int32_t s = kv.stream_index(l, h);
        if (kv.n_slots(s) != n || w == 0) continue;
        for (int32_t g = 0; g < mc_.group(); ++g) {
          const float* qh = q.data() + static_cast<size_t>(w - 1) * mc_.q_dim() + static_cast<size_t>(h * mc_.group() + g) * hd;
          tmp.resize(static_cast<size_t>(n));
          float mx = -INFINITY;
          for (int32_t j = 0; j < n; ++j) {
            if (kv.is_hole(s, j)) {
              tmp[static_cast<size_t>(j)] = -INFINITY;
              continue;
            }
            load_key(kv, s, j, k.data());
            float d = 0;
            for (int32_t e = 0; e < hd; ++e) d += qh[e] * k[static_cast<size_t>(e)];
            tmp[static_cast<size_t>(j)] = d * scale;
            mx = std::max(mx, d * scale);
          }
          double sum = 0;
          for (float v : tmp) sum += std::exp(static_cast<double>(v - mx));
          for (int32_t j = 0; j < n; ++j) avg[static_cast<size_t>(j)] += std::exp(static_cast<double>(tmp[static_cast<size_t>(j)] - mx)) / sum;
        }
      }
      for (int32_t h = 0; h < mc_.n_head_kv; ++h) {
        auto& out = scores_[static_cast<size_t>(kv.stream_index(l, h))];
        out.assign(avg.begin(), avg.end());
      }
      continue;
    }
    for (int32_t h = 0; h < mc_.n_head_kv; ++h) {
      const int32_t s = kv.stream_index(l, h);
      const int32_t n = kv.n_slots(s);
      auto& out = scores_[static_cast<size_t>(s)];
      out.assign(static_cast<size_t>(n), 0.0f);
      if (w == 0) continue;
      window_logits(kv, mc_, l, h, q, w, logits);
      const int32_t w_keys = std::min(n, cfg_.effective_window());
      snapkv_from_logits(logits, w, n, w_keys, out);
      if (cfg_.policy == PolicyKind::RKV) {
        tmp.assign(static_cast<size_t>(n), 0.0f);
        rkv_redundancy(kv, s, n, w_keys, tmp);
        for (int32_t j = 0; j < n; ++j)
          out[static_cast<size_t>(j)] = kRkvLambda * out[static_cast<size_t>(j)] - (1 - kRkvLambda) * tmp[static_cast<size_t>(j)];
      }
    }
  }
}

void SequenceCompressor::score_all(const kv::SequenceKv& kv) {
  switch (cfg_.policy) {
    case PolicyKind::Full:
      break;
    case PolicyKind::Streaming:
      for (int32_t s = 0; s < n_streams_; ++s) {
        auto& out = scores_[static_cast<size_t>(s)];
        out.resize(static_cast<size_t>(kv.n_slots(s)));
        for (size_t j = 0; j < out.size(); ++j) out[j] = static_cast<float>(j);  // most recent first
      }
      break;
    case PolicyKind::KNorm:
      for (int32_t s = 0; s < n_streams_; ++s) {
        scores_[static_cast<size_t>(s)].resize(static_cast<size_t>(kv.n_slots(s)));
        score_knorm(kv, s, scores_[static_cast<size_t>(s)]);
      }
      break;
    case PolicyKind::TriAttention:
      score_triattention(kv);
      break;
    case PolicyKind::SnapKV:
    case PolicyKind::RKV:
    case PolicyKind::TOVA:
      score_window_policy(kv);
      break;
    case PolicyKind::H2O:
      for (int32_t s = 0; s < n_streams_; ++s) {
        const float* m = mass_.data() + static_cast<size_t>(s) * mass_cap_;
        scores_[static_cast<size_t>(s)].assign(m, m + kv.n_slots(s));
      }
      break;
  }
}

void SequenceCompressor::compress(kv::SequenceKv& kv) {
  if (!cfg_.enabled()) return;
  const double t0 = now_s();
  score_all(kv);
  const double t1 = now_s();

  Protection prot;
  prot.sinks = cfg_.sinks;
  prot.window = cfg_.effective_window();
  prot.prompt_end = cfg_.protect_prompt ? prompt_len_ : 0;
  // Slots in leading pages that are shared (prefix cache) are protected like sinks: a shared page is
  // read-only, and evicting from it would free nothing anyway.
  const int32_t ps = kv.pool().config().page_size;
  auto prot_for = [&](int32_t s) {
    Protection p = prot;
    int32_t shared = 0;  // pages up to and including the last shared one (cache entries can have gaps)
    auto table = kv.page_table(s);
    for (size_t pg = 0; pg < table.size(); ++pg)
      if (kv.pool().is_shared(table[pg])) shared = static_cast<int32_t>(pg) + 1;
    p.sinks = std::max(p.sinks, std::min(kv.n_slots(s), shared * ps));
    return p;
  };
  std::vector<int32_t> positions;
  auto stream_positions = [&](int32_t s) -> std::span<const int32_t> {
    if (prot.prompt_end == 0) return {};
    const auto& live = live_[static_cast<size_t>(s)];
    positions.resize(live.size());
    for (size_t j = 0; j < live.size(); ++j) positions[j] = kv.position(s, live[j]);
    return positions;
  };

  int64_t max_n = 0;
  for (int32_t s = 0; s < n_streams_; ++s) max_n = std::max<int64_t>(max_n, kv.n_slots(s));
  // Candidates are the live slots (all slots unless naive mode left holes). Selection works on the
  // dense candidate list; keep sets are mapped back to slot indices afterwards.
  live_.resize(static_cast<size_t>(n_streams_));
  for (int32_t s = 0; s < n_streams_; ++s) {
    auto& live = live_[static_cast<size_t>(s)];
    live.clear();
    auto& sc = scores_[static_cast<size_t>(s)];
    for (int32_t j = 0; j < kv.n_slots(s); ++j)
      if (!kv.is_hole(s, j)) {
        sc[live.size()] = sc[static_cast<size_t>(j)];
        live.push_back(j);
      }
    sc.resize(live.size());
  }
  auto n_live = [&](int32_t s) { return static_cast<int32_t>(live_[static_cast<size_t>(s)].size()); };
  if (cfg_.split == BudgetSplit::Ada) {
    // Each layer's KV heads pool n_kv_heads * budget slots (their counts may differ after earlier events).
    std::vector<std::vector<int32_t>> layer_keeps;
    std::vector<std::span<const float>> sc;
    std::vector<Protection> prots;
    std::vector<std::vector<int32_t>> pos_copies;
    for (int32_t l = 0; l < mc_.n_layer; ++l) {
      sc.clear();
      prots.clear();
      pos_copies.clear();
      for (int32_t h = 0; h < mc_.n_head_kv; ++h) {
        const int32_t s = kv.stream_index(l, h);
        sc.emplace_back(scores_[static_cast<size_t>(s)]);
        prots.push_back(prot_for(s));
        const auto p = stream_positions(s);
        pos_copies.emplace_back(p.begin(), p.end());
      }
      std::vector<std::span<const int32_t>> pos;
      for (const auto& p : pos_copies) pos.emplace_back(p);
      select_ada(sc, cfg_.budget, prots, pos, kAdaAlpha, layer_keeps);
      for (int32_t h = 0; h < mc_.n_head_kv; ++h) keeps_[static_cast<size_t>(kv.stream_index(l, h))] = layer_keeps[static_cast<size_t>(h)];
    }
  } else {
    std::vector<int32_t> budgets(static_cast<size_t>(mc_.n_layer), cfg_.budget);
    if (cfg_.split == BudgetSplit::Pyramid)
      budgets = pyramid_budgets(cfg_.budget, mc_.n_layer, cfg_.budget + cfg_.interval, prot.window);
    for (int32_t s = 0; s < n_streams_; ++s) {
      const int32_t l = s / mc_.n_head_kv;
      select_keep(scores_[static_cast<size_t>(s)], n_live(s), budgets[static_cast<size_t>(l)], prot_for(s), stream_positions(s),
                  keeps_[static_cast<size_t>(s)]);
    }
  }
  for (int32_t s = 0; s < n_streams_; ++s)  // candidate indices -> slot indices
    for (int32_t& k : keeps_[static_cast<size_t>(s)]) k = live_[static_cast<size_t>(s)][static_cast<size_t>(k)];

  // Compaction: survivors slide forward, tail pages go back to the pool.
  CompressionStats ev;
  ev.events = 1;
  ev.max_streams_slots = max_n;
  const uint64_t slot_kv_bytes = 2 * kv.pool().slot_bytes();
  const uint64_t page_bytes = kv.pool().page_bytes();
  for (int32_t s = 0; s < n_streams_; ++s) {
    const auto& keep = keeps_[static_cast<size_t>(s)];
    const int32_t n = n_live(s);
    if (static_cast<int32_t>(keep.size()) >= n) continue;
    int64_t freed;
    if (cfg_.naive) {
      removed_.clear();
      freed = kv.punch_holes(s, keep, &removed_);
      if (!mass_.empty() && !removed_.empty()) {  // drop the mass of the removed pages' slots
        float* m = mass_.data() + static_cast<size_t>(s) * mass_cap_;
        int32_t dst = 0, src = 0;
        size_t r = 0;
        for (int32_t pg = 0; src < mass_cap_ && pg * ps < mass_cap_; ++pg) {
          const bool gone = r < removed_.size() && removed_[r] == pg;
          if (gone) ++r;
          for (int32_t j = 0; j < ps && src < mass_cap_; ++j, ++src)
            if (!gone) m[dst++] = m[src];
        }
        std::fill(m + dst, m + mass_cap_, 0.0f);
      }
    } else {
      if (!mass_.empty()) {  // H2O statistics move with their slots
        float* m = mass_.data() + static_cast<size_t>(s) * mass_cap_;
        for (size_t i = 0; i < keep.size(); ++i) m[i] = m[keep[i]];
        std::fill(m + keep.size(), m + mass_cap_, 0.0f);
      }
      freed = kv.compact_stream(s, keep);
    }
    if (freed < 0) throw std::runtime_error("KV pool exhausted while un-sharing a page for compaction");
    ev.evicted_slots += n - static_cast<int64_t>(keep.size());
    ev.evicted_bytes += static_cast<uint64_t>(n - static_cast<int64_t>(keep.size())) * slot_kv_bytes;
    ev.freed_pages += freed;
    ev.freed_bytes += static_cast<uint64_t>(freed) * page_bytes;
  }
  schedule_.on_event(live_total(kv));
  ev.score_seconds = t1 - t0;
  ev.seconds = now_s() - t0;
  stats_.add(ev);
}

}  // namespace kvpack::compress
