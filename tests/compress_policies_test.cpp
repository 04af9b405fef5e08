// Keep sets of every KV compression policy against independent reference computations on small
// hand-made inputs (no model file): a tiny ModelConfig, a page pool with 4-slot pages, and a
// SequenceKv whose K/V rows are seeded random numbers written straight into the pages.
//
// Each reference below is written from the formulas in research/triattention.md §2 / §7 and
// research/policies.md §1 in the most literal way (float64, std::complex for TriAttention,
// materialised softmax matrices for SnapKV / R-KV / TOVA); none of them calls src/compress/scoring.cpp
// or selection.cpp (pyramid_budgets is only called to check it against hand-computed numbers).
// Tokens are appended at positions 0, 1, ..., so the surviving positions (kv.position) name the kept
// original slots. Every compression is also checked for: protected slots (sinks, window, prompt)
// kept, strictly increasing positions (order preserved), K/V content moved with its slot, exact
// counts, and stats consistent with the pool's page counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "compress/calibration.h"
#include "compress/compressor.h"
#include "compress/config.h"
#include "compress/scoring.h"
#include "compress/selection.h"  // pyramid_budgets only (checked against hand-computed values)
#include "kv/page_pool.h"
#include "kv/sequence_kv.h"
#include "model/forward.h"
#include "model/model.h"
#include "util/half.h"
#include "util/thread_pool.h"

using namespace kvpack;
using namespace kvpack::compress;

namespace {

constexpr int32_t kPageSize = 4;
constexpr int32_t kHeadDim = 8;

ModelConfig tiny_model(bool neox, int32_t layers = 2, int32_t heads = 4, int32_t kv_heads = 2) {
  ModelConfig c;
  c.arch = "llama";
  c.name = "tiny-test";
  c.n_vocab = 32;
  c.n_embd = heads * kHeadDim;
  c.n_layer = layers;
  c.n_head = heads;
  c.n_head_kv = kv_heads;
  c.head_dim = kHeadDim;
  c.n_ff = 64;
  c.n_ctx = 1 << 20;
  c.rope_theta = 10000.0f;
  c.rope_dims = kHeadDim;
  c.rope_neox = neox;
  return c;
}

kv::PoolConfig pool_config(int64_t pages = 8192) {
  kv::PoolConfig p;
  p.page_size = kPageSize;
  p.head_dim = kHeadDim;
  p.kv_type = DType::F32;
  p.max_pages = pages;
  p.pages_per_chunk = 7;
  return p;
}

CompressConfig make_cfg(PolicyKind p, int32_t budget, int32_t sinks, int32_t window, int32_t interval = 16) {
  CompressConfig c;
  c.policy = p;
  c.budget = budget;
  c.sinks = sinks;
  c.window = window;
  c.interval = interval;
  return c;
}

// ---------------------------------------------------------------------------------------------------
// A hand-made sequence: K/V of every (stream, position) are remembered so that references use the
// ground truth and compaction can be checked byte for byte.
class Seq {
 public:
  Seq(kv::PagePool& pool, const ModelConfig& mc, uint32_t seed)
      : mc_(mc), kv_(pool, mc.n_layer, mc.n_head_kv), rng_(seed), k_(static_cast<size_t>(kv_.n_streams())),
        v_(static_cast<size_t>(kv_.n_streams())), head_scale_(static_cast<size_t>(mc.n_head_kv), 1.0) {}

  kv::SequenceKv& kv() { return kv_; }
  std::mt19937& rng() { return rng_; }
  void set_head_scale(int32_t kv_head, double s) { head_scale_[static_cast<size_t>(kv_head)] = s; }
  // Every new key becomes a copy of `fixed` (tie tests).
  void set_fixed_key(std::vector<float> fixed) { fixed_ = std::move(fixed); }

  // Appends n tokens at the next positions and fills their K/V with random numbers.
  bool append(int32_t n) {
    const int32_t pos0 = kv_.next_pos();
    if (!kv_.append(n, pos0)) return false;
    std::normal_distribution<double> nd(0.0, 1.0);
    std::uniform_real_distribution<double> ud(0.3, 1.7);
    for (int32_t s = 0; s < kv_.n_streams(); ++s) {
      const double hs = head_scale_[static_cast<size_t>(s % mc_.n_head_kv)];
      for (int32_t i = 0; i < n; ++i) {
        const int32_t slot = kv_.n_slots(s) - n + i;
        std::vector<float> k(kHeadDim), v(kHeadDim);
        const double scale = ud(rng_) * hs;  // spread of key norms
        for (int32_t e = 0; e < kHeadDim; ++e) {
          k[static_cast<size_t>(e)] = fixed_.empty() ? static_cast<float>(nd(rng_) * scale) : fixed_[static_cast<size_t>(e)];
          v[static_cast<size_t>(e)] = static_cast<float>(nd(rng_));
        }
        std::memcpy(kv_.k_slot(s, slot), k.data(), sizeof(float) * kHeadDim);
        std::memcpy(kv_.v_slot(s, slot), v.data(), sizeof(float) * kHeadDim);
        k_[static_cast<size_t>(s)][pos0 + i] = std::move(k);
        v_[static_cast<size_t>(s)][pos0 + i] = std::move(v);
      }
    }
    return true;
  }

  // Prefix sharing: appends block `block` of `src` (one page per stream) by reference.
  void attach_shared_from(Seq& src, int32_t block) {
    std::vector<kv::PageId> pages;
    for (int32_t s = 0; s < kv_.n_streams(); ++s) pages.push_back(src.kv().block_page(s, block));
    kv_.attach_shared_block(pages, block * kPageSize);
    for (int32_t s = 0; s < kv_.n_streams(); ++s)
      for (int32_t p = block * kPageSize; p < (block + 1) * kPageSize; ++p) {
        k_[static_cast<size_t>(s)][p] = src.key_at(s, p);
        v_[static_cast<size_t>(s)][p] = src.value_at(s, p);
      }
  }

  // Positions of the slots that are not holes (naive eviction).
  std::vector<int32_t> live_positions(int32_t s) const {
    std::vector<int32_t> p;
    for (int32_t j = 0; j < kv_.n_slots(s); ++j)
      if (!kv_.is_hole(s, j)) p.push_back(kv_.position(s, j));
    return p;
  }

  void clear() {
    kv_.clear();
    for (auto& m : k_) m.clear();
    for (auto& m : v_) m.clear();
  }

  std::vector<int32_t> positions(int32_t s) const {
    std::vector<int32_t> p(static_cast<size_t>(kv_.n_slots(s)));
    for (int32_t j = 0; j < kv_.n_slots(s); ++j) p[static_cast<size_t>(j)] = kv_.position(s, j);
    return p;
  }
  const std::vector<float>& key_at(int32_t s, int32_t pos) const { return k_[static_cast<size_t>(s)].at(pos); }
  const std::vector<float>& value_at(int32_t s, int32_t pos) const { return v_[static_cast<size_t>(s)].at(pos); }

  // Order preserved and content moved with its slot: positions strictly increasing, and K/V bytes at
  // every slot equal the rows originally written for that position.
  ::testing::AssertionResult check_content() {
    for (int32_t s = 0; s < kv_.n_streams(); ++s) {
      int32_t prev = -1;
      for (int32_t j = 0; j < kv_.n_slots(s); ++j) {
        const int32_t pos = kv_.position(s, j);
        if (pos <= prev)
          return ::testing::AssertionFailure() << "stream " << s << " slot " << j << ": position " << pos
                                               << " not above previous " << prev;
        prev = pos;
        auto it = k_[static_cast<size_t>(s)].find(pos);
        if (it == k_[static_cast<size_t>(s)].end())
          return ::testing::AssertionFailure() << "stream " << s << " slot " << j << ": unknown position " << pos;
        if (std::memcmp(kv_.k_slot(s, j), it->second.data(), sizeof(float) * kHeadDim) != 0 ||
            std::memcmp(kv_.v_slot(s, j), v_[static_cast<size_t>(s)].at(pos).data(), sizeof(float) * kHeadDim) != 0)
          return ::testing::AssertionFailure() << "stream " << s << " slot " << j << " (position " << pos
                                               << "): K/V content is not the row written for that position";
      }
    }
    return ::testing::AssertionSuccess();
  }

 private:
  ModelConfig mc_;
  kv::SequenceKv kv_;
  std::mt19937 rng_;
  std::vector<std::map<int32_t, std::vector<float>>> k_, v_;
  std::vector<double> head_scale_;
  std::vector<float> fixed_;
};

// State of every stream just before a compression: positions and keys (float64), from the ground truth.
struct Snapshot {
  std::vector<std::vector<int32_t>> pos;                   // [stream][slot]
  std::vector<std::vector<std::vector<double>>> keys;      // [stream][slot][dim]
  int64_t total_slots = 0, used_pages = 0, pages_held = 0;
  int64_t next_pos = 0;
};

Snapshot snapshot(Seq& seq) {
  Snapshot sn;
  auto& kv = seq.kv();
  sn.pos.resize(static_cast<size_t>(kv.n_streams()));
  sn.keys.resize(static_cast<size_t>(kv.n_streams()));
  for (int32_t s = 0; s < kv.n_streams(); ++s) {
    sn.pos[static_cast<size_t>(s)] = seq.positions(s);
    for (int32_t p : sn.pos[static_cast<size_t>(s)]) {
      const auto& k = seq.key_at(s, p);
      sn.keys[static_cast<size_t>(s)].emplace_back(k.begin(), k.end());
    }
  }
  sn.total_slots = kv.total_slots();
  sn.used_pages = kv.pool().used_pages();
  sn.pages_held = kv.pages_held();
  sn.next_pos = kv.next_pos();
  return sn;
}

// Live slots only (naive eviction leaves holes that are no longer candidates).
Snapshot live_snapshot(Seq& seq) {
  Snapshot sn = snapshot(seq);
  for (int32_t s = 0; s < seq.kv().n_streams(); ++s) {
    sn.pos[static_cast<size_t>(s)] = seq.live_positions(s);
    sn.keys[static_cast<size_t>(s)].clear();
    for (int32_t p : sn.pos[static_cast<size_t>(s)]) {
      const auto& k = seq.key_at(s, p);
      sn.keys[static_cast<size_t>(s)].emplace_back(k.begin(), k.end());
    }
  }
  return sn;
}

// Slots (indices into the snapshot) that survived in stream s.
std::vector<int32_t> kept_slots(Seq& seq, const Snapshot& sn, int32_t s) {
  std::vector<int32_t> out;
  const auto& before = sn.pos[static_cast<size_t>(s)];
  for (int32_t p : seq.live_positions(s)) {
    auto it = std::lower_bound(before.begin(), before.end(), p);
    out.push_back(it != before.end() && *it == p ? static_cast<int32_t>(it - before.begin()) : -1);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Reference selection: protected slots, then the best others (higher score; equal scores: the more
// recent slot) until `budget`, returned in ascending order.
std::vector<bool> protect_mask(const std::vector<int32_t>& pos, int32_t sinks, int32_t window, int32_t prompt_end) {
  const auto n = static_cast<int32_t>(pos.size());
  std::vector<bool> m(pos.size());
  for (int32_t j = 0; j < n; ++j) m[static_cast<size_t>(j)] = j < sinks || j >= n - window || pos[static_cast<size_t>(j)] < prompt_end;
  return m;
}

std::vector<int32_t> ref_topk(const std::vector<double>& score, const std::vector<bool>& prot, int32_t budget) {
  std::vector<int32_t> keep, cand;
  for (size_t j = 0; j < prot.size(); ++j) (prot[j] ? keep : cand).push_back(static_cast<int32_t>(j));
  std::sort(cand.begin(), cand.end(), [&](int32_t a, int32_t b) {
    const double sa = score[static_cast<size_t>(a)], sb = score[static_cast<size_t>(b)];
    return sa != sb ? sa > sb : a > b;
  });
  const int32_t room = std::max<int32_t>(0, budget - static_cast<int32_t>(keep.size()));
  for (int32_t i = 0; i < room && i < static_cast<int32_t>(cand.size()); ++i) keep.push_back(cand[static_cast<size_t>(i)]);
  std::sort(keep.begin(), keep.end());
  return keep;
}

std::string fmt(const std::vector<int32_t>& v) {
  std::ostringstream o;
  o << "{";
  for (size_t i = 0; i < v.size(); ++i) o << (i ? "," : "") << v[i];
  o << "}";
  return o.str();
}

// got == want, or got is an equally valid top-k whose differences lie within `eps` of the cut-off
// (float32 in the engine vs float64 here). Protected slots and the count are always exact.
::testing::AssertionResult keep_matches(const std::vector<int32_t>& got, const std::vector<int32_t>& want,
                                        const std::vector<double>& score, const std::vector<bool>& prot, double eps) {
  if (got == want) return ::testing::AssertionSuccess();
  auto fail = [&]() {
    std::vector<int32_t> extra, missing;
    std::set_difference(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(extra));
    std::set_difference(want.begin(), want.end(), got.begin(), got.end(), std::back_inserter(missing));
    auto f = ::testing::AssertionFailure();
    f << "kept " << fmt(got) << "\n   reference " << fmt(want) << "\n   kept but not in reference:";
    for (int32_t j : extra) f << " " << j << (j >= 0 && prot[static_cast<size_t>(j)] ? "(protected)" : "") << "[score " << (j >= 0 ? score[static_cast<size_t>(j)] : NAN) << "]";
    f << "\n   in reference but evicted:";
    for (int32_t j : missing) f << " " << j << (prot[static_cast<size_t>(j)] ? "(protected)" : "") << "[score " << score[static_cast<size_t>(j)] << "]";
    return f;
  };
  if (got.size() != want.size()) return fail() << "\n   (count differs: " << got.size() << " vs " << want.size() << ")";
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] < 0 || (i > 0 && got[i] <= got[i - 1])) return fail() << "\n   (not a strictly increasing subset)";
  std::vector<bool> in(score.size(), false);
  for (int32_t j : got) in[static_cast<size_t>(j)] = true;
  double min_in = INFINITY, max_out = -INFINITY;
  for (size_t j = 0; j < score.size(); ++j) {
    if (prot[j]) {
      if (!in[j]) return fail() << "\n   (protected slot " << j << " evicted)";
      continue;
    }
    if (in[j]) min_in = std::min(min_in, score[j]);
    else max_out = std::max(max_out, score[j]);
  }
  if (max_out <= min_in + eps) return ::testing::AssertionSuccess();  // a near-tie at the cut-off
  return fail() << "\n   (best evicted score " << max_out << " > worst kept score " << min_in << ")";
}

// Compares every stream's survivors with reference scores and per-stream budgets.
void expect_keep_sets(Seq& seq, const Snapshot& sn, const std::vector<std::vector<double>>& score,
                      const std::vector<int32_t>& budget, const CompressConfig& cfg, int32_t prompt_len, double eps,
                      const std::string& what) {
  for (int32_t s = 0; s < seq.kv().n_streams(); ++s) {
    const auto& pos = sn.pos[static_cast<size_t>(s)];
    const auto prot = protect_mask(pos, cfg.sinks, cfg.effective_window(), cfg.protect_prompt ? prompt_len : 0);
    const auto want = ref_topk(score[static_cast<size_t>(s)], prot, budget[static_cast<size_t>(s)]);
    const auto got = kept_slots(seq, sn, s);
    EXPECT_TRUE(keep_matches(got, want, score[static_cast<size_t>(s)], prot, eps)) << what << ", stream " << s;
  }
}

// Stats of the last event against the pool: evicted slots, freed pages (= the pool's drop in used
// pages = the page-count drop of every stream), bytes, reclaim efficiency.
void expect_stats(Seq& seq, const Snapshot& sn, const CompressionStats& before, const CompressionStats& after) {
  auto& kv = seq.kv();
  const auto& pool = kv.pool();
  int64_t expect_freed = 0;
  for (int32_t s = 0; s < kv.n_streams(); ++s) {
    const int64_t n0 = static_cast<int64_t>(sn.pos[static_cast<size_t>(s)].size()), n1 = kv.n_slots(s);
    expect_freed += (n0 + kPageSize - 1) / kPageSize - (n1 + kPageSize - 1) / kPageSize;
  }
  const int64_t evicted = sn.total_slots - kv.total_slots();
  const int64_t freed = after.freed_pages - before.freed_pages;
  EXPECT_EQ(after.events, before.events + 1);
  EXPECT_EQ(after.evicted_slots - before.evicted_slots, evicted);
  EXPECT_EQ(freed, expect_freed);
  EXPECT_EQ(freed, sn.used_pages - pool.used_pages());
  EXPECT_EQ(freed, sn.pages_held - kv.pages_held());
  const uint64_t ev_bytes = after.evicted_bytes - before.evicted_bytes, fr_bytes = after.freed_bytes - before.freed_bytes;
  EXPECT_EQ(ev_bytes, static_cast<uint64_t>(evicted) * 2 * kHeadDim * sizeof(float));
  EXPECT_EQ(fr_bytes, static_cast<uint64_t>(freed) * pool.page_bytes());
  EXPECT_EQ(after.evicted_bytes, static_cast<uint64_t>(after.evicted_slots) * 2 * kHeadDim * sizeof(float));
  EXPECT_EQ(after.freed_bytes, static_cast<uint64_t>(after.freed_pages) * pool.page_bytes());
  if (after.evicted_bytes > 0) {
    EXPECT_DOUBLE_EQ(after.reclaim_efficiency(), static_cast<double>(after.freed_bytes) / static_cast<double>(after.evicted_bytes));
  }
  // Compaction frees whole pages: at most one partly filled page per stream is left over.
  if (evicted > 0) {
    EXPECT_GE(static_cast<int64_t>(fr_bytes), static_cast<int64_t>(ev_bytes) -
                                                  static_cast<int64_t>(kv.n_streams()) * static_cast<int64_t>(pool.page_bytes()));
  }
}

std::string check_pool(const kv::PagePool& pool, const std::vector<kv::SequenceKv*>& seqs) {
  std::vector<std::span<const kv::PageId>> tables;
  for (auto* s : seqs)
    for (int32_t i = 0; i < s->n_streams(); ++i) tables.push_back(s->page_table(i));
  return pool.check(tables);
}

// ---------------------------------------------------------------------------------------------------
// Query feed for SnapKV / R-KV / TOVA: post-RoPE queries go to the compressor like the forward pass
// sends them (every layer, in order, strided rows) and are remembered for the reference.
class Queries {
 public:
  Queries(const ModelConfig& mc, uint32_t seed) : mc_(mc), rng_(seed), hist_(static_cast<size_t>(mc.n_layer)) {}
  void feed(SequenceCompressor& comp, int32_t n_tokens) {
    const int32_t QD = mc_.q_dim();
    const int64_t stride = QD + 5;  // padded rows: the compressor must honour the stride
    std::normal_distribution<double> nd(0.0, 1.0);
    for (int32_t l = 0; l < mc_.n_layer; ++l) {
      std::vector<float> buf(static_cast<size_t>(n_tokens * stride), 1e9f);
      for (int32_t t = 0; t < n_tokens; ++t) {
        std::vector<double> q(static_cast<size_t>(QD));
        for (int32_t e = 0; e < QD; ++e) {
          const float v = static_cast<float>(nd(rng_) * 1.5);
          buf[static_cast<size_t>(t * stride + e)] = v;
          q[static_cast<size_t>(e)] = v;
        }
        hist_[static_cast<size_t>(l)].push_back(std::move(q));
      }
      comp.on_query_post_rope(0, l, buf.data(), n_tokens, stride);
    }
  }
  // The last min(w, seen) queries of a layer, oldest first.
  std::vector<std::vector<double>> last(int32_t layer, int32_t w) const {
    const auto& h = hist_[static_cast<size_t>(layer)];
    const size_t take = std::min(h.size(), static_cast<size_t>(w));
    return std::vector<std::vector<double>>(h.end() - static_cast<long>(take), h.end());
  }

 private:
  ModelConfig mc_;
  std::mt19937 rng_;
  std::vector<std::vector<std::vector<double>>> hist_;  // [layer][token][q_dim]
};

// ---------------------------------------------------------------------------------------------------
// Reference scores, literal from the papers / research notes.

// KNorm (policies.md §1.12): s_j = −‖k_j‖₂.
std::vector<std::vector<double>> ref_knorm(const Snapshot& sn) {
  std::vector<std::vector<double>> out(sn.keys.size());
  for (size_t s = 0; s < sn.keys.size(); ++s)
    for (const auto& k : sn.keys[s]) {
      double ss = 0;
      for (double x : k) ss += x * x;
      out[s].push_back(-std::sqrt(ss));
    }
  return out;
}

// StreamingLLM (policies.md §1.1): sinks + most recent; a score that grows with recency.
std::vector<std::vector<double>> ref_recency(const Snapshot& sn) {
  std::vector<std::vector<double>> out(sn.keys.size());
  for (size_t s = 0; s < sn.keys.size(); ++s)
    for (size_t j = 0; j < sn.keys[s].size(); ++j) out[s].push_back(static_cast<double>(j));
  return out;
}

QueryStats make_stats(const ModelConfig& mc, uint32_t seed) {
  QueryStats qs;
  qs.n_layer = mc.n_layer;
  qs.n_head = mc.n_head;
  qs.n_bands = mc.rope_dims / 2;
  qs.rope_neox = mc.rope_neox;
  qs.model_name = mc.name;
  qs.tokens = 1000;
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_real_distribution<double> ud(0.0, 1.5);
  const size_t n = static_cast<size_t>(qs.n_layer) * qs.n_head * qs.n_bands;
  for (size_t i = 0; i < n; ++i) {
    const double re = nd(rng) * 2, im = nd(rng) * 2;
    qs.mean_re.push_back(static_cast<float>(re));
    qs.mean_im.push_back(static_cast<float>(im));
    qs.abs_mean.push_back(static_cast<float>(std::hypot(re, im) + ud(rng)));  // E|q_f| >= |q̄_f|
  }
  return qs;
}

// TriAttention (triattention.md §2.2–2.4): per (layer, query head)
//   S(k) = mean_{δ∈{1,2,4..65536}} Σ_f Re(q̄_f · conj(k̃_f) · e^{iω_f(t+δ)}) + Σ_f (E|q_f| − |q̄_f|)·|k̃_f|,
// k̃ the cached post-RoPE key as complex bands, ω_f = θ^(−2f/rope_dims); z-normalised per query head
// (population std), max over the GQA group, and (layer_mean) mean over layers per KV head.
std::vector<std::vector<double>> ref_triattention(const ModelConfig& mc, const QueryStats& qs, const Snapshot& sn,
                                                  int64_t t, bool layer_mean) {
  const int32_t F = mc.rope_dims / 2, G = mc.n_head / mc.n_head_kv;
  std::vector<std::vector<double>> out(sn.keys.size());
  for (int32_t l = 0; l < mc.n_layer; ++l)
    for (int32_t h = 0; h < mc.n_head_kv; ++h) {
      const size_t s = static_cast<size_t>(l * mc.n_head_kv + h);
      const size_t n = sn.keys[s].size();
      out[s].assign(n, -INFINITY);
      for (int32_t g = 0; g < G; ++g) {
        const int32_t qh = h * G + g;
        std::vector<double> raw(n);
        for (size_t j = 0; j < n; ++j) {
          const auto& k = sn.keys[s][j];
          double trig = 0, norm = 0;
          for (int32_t f = 0; f < F; ++f) {
            const size_t qi = (static_cast<size_t>(l) * mc.n_head + qh) * F + f;
            const std::complex<double> qbar(qs.mean_re[qi], qs.mean_im[qi]);
            const std::complex<double> kf = mc.rope_neox ? std::complex<double>(k[f], k[f + F])
                                                         : std::complex<double>(k[2 * f], k[2 * f + 1]);
            const double omega = std::pow(static_cast<double>(mc.rope_theta), -2.0 * f / mc.rope_dims);
            for (int i = 0; i < 17; ++i) {
              const double delta = std::ldexp(1.0, i);
              trig += std::real(qbar * std::conj(kf) * std::exp(std::complex<double>(0.0, omega * (static_cast<double>(t) + delta))));
            }
            norm += (static_cast<double>(qs.abs_mean[qi]) - std::abs(qbar)) * std::abs(kf);
          }
          raw[j] = trig / 17.0 + norm;
        }
        double mean = 0, var = 0;
        for (double x : raw) mean += x;
        mean /= static_cast<double>(n);
        for (double x : raw) var += (x - mean) * (x - mean);
        const double sd = std::max(std::sqrt(var / static_cast<double>(n)), 1e-6);
        for (size_t j = 0; j < n; ++j) out[s][j] = std::max(out[s][j], (raw[j] - mean) / sd);
      }
    }
  if (layer_mean) {
    for (int32_t h = 0; h < mc.n_head_kv; ++h) {
      const size_t n = out[static_cast<size_t>(h)].size();
      std::vector<double> mean(n, 0.0);
      for (int32_t l = 0; l < mc.n_layer; ++l)
        for (size_t j = 0; j < n; ++j) mean[j] += out[static_cast<size_t>(l * mc.n_head_kv + h)][j] / mc.n_layer;
      for (int32_t l = 0; l < mc.n_layer; ++l) out[static_cast<size_t>(l * mc.n_head_kv + h)] = mean;
    }
  }
  return out;
}

// A = max over the GQA group of Q_win · Kᵀ / √D  ([w][n]), materialised (triattention.md §7).
std::vector<std::vector<double>> ref_window_logits(const ModelConfig& mc, const std::vector<std::vector<double>>& q,
                                                   const std::vector<std::vector<double>>& keys, int32_t kv_head) {
  const int32_t G = mc.n_head / mc.n_head_kv;
  std::vector<std::vector<double>> A(q.size(), std::vector<double>(keys.size(), -INFINITY));
  for (size_t i = 0; i < q.size(); ++i)
    for (size_t j = 0; j < keys.size(); ++j)
      for (int32_t g = 0; g < G; ++g) {
        double d = 0;
        for (int32_t e = 0; e < kHeadDim; ++e) d += q[i][static_cast<size_t>((kv_head * G + g) * kHeadDim + e)] * keys[j][static_cast<size_t>(e)];
        A[i][j] = std::max(A[i][j], d / std::sqrt(static_cast<double>(kHeadDim)));
      }
  return A;
}

// SnapKV (triattention.md §7): a = maxpool7( mean_w softmax(A[:, :-w_keys]) ), slots [0, n − w_keys).
std::vector<double> ref_snapkv(const std::vector<std::vector<double>>& A, int32_t n, int32_t w_keys) {
  const int32_t m = std::max(0, n - w_keys);
  std::vector<std::vector<double>> P(A.size(), std::vector<double>(static_cast<size_t>(m)));
  for (size_t i = 0; i < A.size(); ++i) {
    double mx = -INFINITY, sum = 0;
    for (int32_t j = 0; j < m; ++j) mx = std::max(mx, A[i][static_cast<size_t>(j)]);
    for (int32_t j = 0; j < m; ++j) sum += std::exp(A[i][static_cast<size_t>(j)] - mx);
    for (int32_t j = 0; j < m; ++j) P[i][static_cast<size_t>(j)] = std::exp(A[i][static_cast<size_t>(j)] - mx) / sum;
  }
  std::vector<double> mean(static_cast<size_t>(m), 0.0);
  for (const auto& row : P)
    for (int32_t j = 0; j < m; ++j) mean[static_cast<size_t>(j)] += row[static_cast<size_t>(j)] / static_cast<double>(P.size());
  std::vector<double> pooled(static_cast<size_t>(n), 0.0);  // window slots are protected anyway
  for (int32_t j = 0; j < m; ++j) {
    double best = -INFINITY;  // max_pool1d(kernel 7, padding 3): padding never wins
    for (int32_t x = j - 3; x <= j + 3; ++x)
      if (x >= 0 && x < m) best = std::max(best, mean[static_cast<size_t>(x)]);
    pooled[static_cast<size_t>(j)] = best;
  }
  return pooled;
}

// R-KV redundancy, literal cal_similarity (triattention.md §7, R-KV rkv/utils.py): over the keys
// [0, n_keys): Kn = K/‖K‖, C = Kn Knᵀ with zero diagonal; per row i, j* = the largest j with
// C[i,j] > 0.5, or 0 if there is none (`max(indices)` over a row of zeros), and C[i,j*] = 0;
// sim = softmax_j(mean_i C[i,j]).
std::vector<double> ref_rkv_similarity(const std::vector<std::vector<double>>& keys, int32_t n_keys,
                                       bool zero_first_if_none) {
  std::vector<std::vector<double>> kn(static_cast<size_t>(n_keys));
  for (int32_t j = 0; j < n_keys; ++j) {
    double ss = 0;
    for (double x : keys[static_cast<size_t>(j)]) ss += x * x;
    for (double x : keys[static_cast<size_t>(j)]) kn[static_cast<size_t>(j)].push_back(x / (std::sqrt(ss) + 1e-8));
  }
  std::vector<std::vector<double>> C(static_cast<size_t>(n_keys), std::vector<double>(static_cast<size_t>(n_keys), 0.0));
  for (int32_t i = 0; i < n_keys; ++i) {
    int32_t jstar = zero_first_if_none ? 0 : -1;
    for (int32_t j = 0; j < n_keys; ++j) {
      if (i == j) continue;
      double d = 0;
      for (int32_t e = 0; e < kHeadDim; ++e) d += kn[static_cast<size_t>(i)][static_cast<size_t>(e)] * kn[static_cast<size_t>(j)][static_cast<size_t>(e)];
      C[static_cast<size_t>(i)][static_cast<size_t>(j)] = d;
      if (d > 0.5) jstar = j;
    }
    if (jstar >= 0) C[static_cast<size_t>(i)][static_cast<size_t>(jstar)] = 0.0;
  }
  std::vector<double> col(static_cast<size_t>(n_keys), 0.0);
  for (int32_t i = 0; i < n_keys; ++i)
    for (int32_t j = 0; j < n_keys; ++j) col[static_cast<size_t>(j)] += C[static_cast<size_t>(i)][static_cast<size_t>(j)] / n_keys;
  double mx = -INFINITY, sum = 0;
  for (double x : col) mx = std::max(mx, x);
  for (double x : col) sum += std::exp(x - mx);
  std::vector<double> sim;
  for (double x : col) sim.push_back(std::exp(x - mx) / sum);
  return sim;
}

// R-KV final score (triattention.md §7 / policies.md §1.10): λ·snapkv − (1−λ)·sim[:, :-w], λ = 0.1.
// literal = true: similarity over ALL cached keys, then sliced (R-KV's `cal_similarity(K)[:, :-w]`).
std::vector<double> ref_rkv(const std::vector<std::vector<double>>& A, const std::vector<std::vector<double>>& keys,
                            int32_t w_keys, bool literal) {
  const auto n = static_cast<int32_t>(keys.size());
  const int32_t m = std::max(0, n - w_keys);
  std::vector<double> a = ref_snapkv(A, n, w_keys);
  std::vector<double> sim = literal ? ref_rkv_similarity(keys, n, true) : ref_rkv_similarity(keys, m, false);
  std::vector<double> out(static_cast<size_t>(n), 0.0);
  for (int32_t j = 0; j < m; ++j) out[static_cast<size_t>(j)] = 0.1 * a[static_cast<size_t>(j)] - 0.9 * sim[static_cast<size_t>(j)];
  return out;
}

// TOVA (policies.md §1.4): s_j = mean over all query heads of the layer of softmax(q_last·K/√d)_j,
// one score row per layer shared by its KV heads.
std::vector<std::vector<double>> ref_tova(const ModelConfig& mc, const Queries& qf, const Snapshot& sn) {
  const int32_t G = mc.n_head / mc.n_head_kv;
  std::vector<std::vector<double>> out(sn.keys.size());
  for (int32_t l = 0; l < mc.n_layer; ++l) {
    const auto q = qf.last(l, 1);
    const size_t n = sn.keys[static_cast<size_t>(l * mc.n_head_kv)].size();
    std::vector<double> avg(n, 0.0);
    for (int32_t hq = 0; hq < mc.n_head; ++hq) {
      const auto& keys = sn.keys[static_cast<size_t>(l * mc.n_head_kv + hq / G)];
      std::vector<double> logit(n);
      double mx = -INFINITY, sum = 0;
      for (size_t j = 0; j < n; ++j) {
        double d = 0;
        for (int32_t e = 0; e < kHeadDim; ++e) d += q[0][static_cast<size_t>(hq * kHeadDim + e)] * keys[j][static_cast<size_t>(e)];
        logit[j] = d / std::sqrt(static_cast<double>(kHeadDim));
        mx = std::max(mx, logit[j]);
      }
      for (double x : logit) sum += std::exp(x - mx);
      for (size_t j = 0; j < n; ++j) avg[j] += std::exp(logit[j] - mx) / sum / mc.n_head;
    }
    for (int32_t h = 0; h < mc.n_head_kv; ++h) out[static_cast<size_t>(l * mc.n_head_kv + h)] = avg;
  }
  return out;
}

// Ada-KV (policies.md §1.7) for one layer: heads share H·budget slots; each head first keeps its
// protected slots and its own top n_safe = max(1, int(0.2·budget)); the remaining room goes to the
// globally best remaining (head, slot) scores. Heads may hold different slot counts.
std::vector<std::vector<int32_t>> ref_ada(const std::vector<std::vector<double>>& score,
                                          const std::vector<std::vector<bool>>& prot, int32_t budget) {
  const size_t H = score.size();
  const int32_t n_safe = std::max(1, static_cast<int32_t>(0.2 * budget));
  std::vector<std::vector<int32_t>> keep(H);
  struct E {
    double s;
    size_t h;
    int32_t j;
  };
  std::vector<E> rest;
  int64_t left = static_cast<int64_t>(H) * budget;
  for (size_t h = 0; h < H; ++h) {
    std::vector<int32_t> cand;
    for (size_t j = 0; j < prot[h].size(); ++j) (prot[h][j] ? keep[h] : cand).push_back(static_cast<int32_t>(j));
    std::sort(cand.begin(), cand.end(), [&](int32_t a, int32_t b) {
      return score[h][static_cast<size_t>(a)] != score[h][static_cast<size_t>(b)] ? score[h][static_cast<size_t>(a)] > score[h][static_cast<size_t>(b)] : a > b;
    });
    for (size_t i = 0; i < cand.size(); ++i) {
      if (static_cast<int32_t>(i) < n_safe) keep[h].push_back(cand[i]);
      else rest.push_back({score[h][static_cast<size_t>(cand[i])], h, cand[i]});
    }
    left -= static_cast<int64_t>(keep[h].size());
  }
  std::sort(rest.begin(), rest.end(), [](const E& a, const E& b) { return a.s != b.s ? a.s > b.s : a.j > b.j; });
  for (int64_t i = 0; i < left && i < static_cast<int64_t>(rest.size()); ++i) keep[rest[static_cast<size_t>(i)].h].push_back(rest[static_cast<size_t>(i)].j);
  for (auto& k : keep) std::sort(k.begin(), k.end());
  return keep;
}

// Runs compress() and checks the generic properties (content/order, stats, pool invariants).
void compress_and_check(SequenceCompressor& comp, Seq& seq, const Snapshot& sn) {
  const CompressionStats before = comp.stats();
  comp.compress(seq.kv());
  EXPECT_TRUE(seq.check_content());
  expect_stats(seq, sn, before, comp.stats());
  EXPECT_EQ(check_pool(seq.kv().pool(), {&seq.kv()}), "");
}

std::vector<int32_t> uniform_budgets(const ModelConfig& mc, int32_t budget) {
  return std::vector<int32_t>(static_cast<size_t>(mc.n_layer * mc.n_head_kv), budget);
}

}  // namespace

// ===================================================================================================
// StreamingLLM and KNorm

TEST(CompressPolicies, StreamingKeepsSinksAndMostRecent) {
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 1);
  const CompressConfig cfg = make_cfg(PolicyKind::Streaming, 20, 4, -1);
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  ASSERT_TRUE(seq.append(37));
  Snapshot sn = snapshot(seq);
  compress_and_check(comp, seq, sn);
  // Literal rule: positions {0..3} ∪ the last 16.
  std::vector<int32_t> want = {0, 1, 2, 3};
  for (int32_t p = 37 - 16; p < 37; ++p) want.push_back(p);
  for (int32_t s = 0; s < seq.kv().n_streams(); ++s) EXPECT_EQ(seq.positions(s), want) << "stream " << s;
  expect_keep_sets(seq, sn, ref_recency(sn), uniform_budgets(mc, 20), cfg, 0, 0.0, "streaming");
  // Second event after more tokens: still sinks + most recent (in original positions).
  ASSERT_TRUE(seq.append(11));
  sn = snapshot(seq);
  compress_and_check(comp, seq, sn);
  want = {0, 1, 2, 3};
  for (int32_t p = 48 - 16; p < 48; ++p) want.push_back(p);
  for (int32_t s = 0; s < seq.kv().n_streams(); ++s) EXPECT_EQ(seq.positions(s), want) << "stream " << s;
}

TEST(CompressPolicies, KNormKeepsLowestNormKeys) {
  const ModelConfig mc = tiny_model(false);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 2);
  const CompressConfig cfg = make_cfg(PolicyKind::KNorm, 16, 2, 3);
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  ASSERT_TRUE(seq.append(45));
  for (int round = 0; round < 4; ++round) {
    Snapshot sn = snapshot(seq);
    compress_and_check(comp, seq, sn);
    expect_keep_sets(seq, sn, ref_knorm(sn), uniform_budgets(mc, 16), cfg, 0, 0.0, "knorm round " + std::to_string(round));
    for (int32_t s = 0; s < seq.kv().n_streams(); ++s) EXPECT_EQ(seq.kv().n_slots(s), 16);
    ASSERT_TRUE(seq.append(7 + round * 5));
  }
}

TEST(CompressPolicies, EqualScoresPreferTheMoreRecentSlot) {
  // All keys identical: every KNorm score ties, so the keep set is the sinks plus the newest slots.
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 3);
  seq.set_fixed_key({0.5f, -1.0f, 0.25f, 2.0f, 0.0f, 1.0f, -0.5f, 0.75f});
  const CompressConfig cfg = make_cfg(PolicyKind::KNorm, 10, 2, 1);
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  ASSERT_TRUE(seq.append(29));
  Snapshot sn = snapshot(seq);
  compress_and_check(comp, seq, sn);
  const std::vector<int32_t> want = {0, 1, 21, 22, 23, 24, 25, 26, 27, 28};
  for (int32_t s = 0; s < seq.kv().n_streams(); ++s) EXPECT_EQ(seq.positions(s), want) << "stream " << s;
}

// ===================================================================================================
// TriAttention

class TriAttentionTest : public ::testing::TestWithParam<bool> {};

TEST_P(TriAttentionTest, KeepSetMatchesComplexReference) {
  const bool neox = GetParam();
  const ModelConfig mc = tiny_model(neox);
  const QueryStats qs = make_stats(mc, neox ? 11 : 12);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, neox ? 21 : 22);
  const CompressConfig cfg = make_cfg(PolicyKind::TriAttention, 24, 4, -1);
  ASSERT_EQ(cfg.effective_window(), 1);
  SequenceCompressor comp(cfg, mc, &qs, 0);
  ASSERT_TRUE(seq.append(61));
  for (int round = 0; round < 3; ++round) {
    Snapshot sn = snapshot(seq);
    compress_and_check(comp, seq, sn);
    const auto ref = ref_triattention(mc, qs, sn, sn.next_pos, /*layer_mean=*/true);
    expect_keep_sets(seq, sn, ref, uniform_budgets(mc, 24), cfg, 0, 1e-4, "triattention round " + std::to_string(round));
    // One selection per KV head shared by every layer.
    for (int32_t h = 0; h < mc.n_head_kv; ++h)
      for (int32_t l = 1; l < mc.n_layer; ++l)
        EXPECT_EQ(seq.positions(seq.kv().stream_index(l, h)), seq.positions(seq.kv().stream_index(0, h))) << "head " << h;
    ASSERT_TRUE(seq.append(13 + round));
  }
}

TEST_P(TriAttentionTest, ThreadPoolGivesTheSameKeepSets) {
  const bool neox = GetParam();
  const ModelConfig mc = tiny_model(neox, 3, 4, 2);
  const QueryStats qs = make_stats(mc, 5);
  kv::PagePool pool_a(pool_config()), pool_b(pool_config());
  Seq a(pool_a, mc, 77), b(pool_b, mc, 77);
  const CompressConfig cfg = make_cfg(PolicyKind::TriAttention, 20, 2, 2);
  ThreadPool tp(2);
  SequenceCompressor ca(cfg, mc, &qs, 0), cb(cfg, mc, &qs, 0, &tp);
  ASSERT_TRUE(a.append(50));
  ASSERT_TRUE(b.append(50));
  Snapshot sn = snapshot(a);
  compress_and_check(ca, a, sn);
  cb.compress(b.kv());
  for (int32_t s = 0; s < a.kv().n_streams(); ++s) EXPECT_EQ(a.positions(s), b.positions(s));
  expect_keep_sets(a, sn, ref_triattention(mc, qs, sn, sn.next_pos, true), uniform_budgets(mc, 20), cfg, 0, 1e-4, "tri 3 layers");
}

TEST_P(TriAttentionTest, LargeAbsolutePosition) {
  // t far from 0 (positions start at 100000): the offset table must use the sequence's position.
  const bool neox = GetParam();
  const ModelConfig mc = tiny_model(neox);
  const QueryStats qs = make_stats(mc, 31);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 32);
  const CompressConfig cfg = make_cfg(PolicyKind::TriAttention, 16, 0, 0);
  SequenceCompressor comp(cfg, mc, &qs, 0);
  // Put the sequence at a large position: append an empty first chunk at 100000 by rolling next_pos.
  ASSERT_TRUE(seq.kv().append(1, 100000));
  seq.kv().truncate_tail(1);  // next_pos goes back by one: 100000
  ASSERT_EQ(seq.kv().next_pos(), 100000);
  ASSERT_TRUE(seq.append(40));
  Snapshot sn = snapshot(seq);
  compress_and_check(comp, seq, sn);
  expect_keep_sets(seq, sn, ref_triattention(mc, qs, sn, sn.next_pos, true), uniform_budgets(mc, 16), cfg, 0, 1e-4,
                   "triattention t=100040");
}

INSTANTIATE_TEST_SUITE_P(RopeLayouts, TriAttentionTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "neox" : "normal"; });

// The production layout — F16 keys, NeoX pairs, head_dim 128 (F = 64 bands), groups of 2 and 8 — takes
// the vectorised scoring path on AVX-512 machines: every score must equal the folded formula evaluated in
// double precision on the stored (f16) keys, for every slot and query head of the group.
TEST(CompressPolicies, TriAttentionF16NeoxScoresMatchDoubleFormula) {
  for (int32_t group : {2, 8}) {
    ModelConfig mc = tiny_model(true, 2, 2 * group, 2);
    mc.head_dim = 128;
    mc.rope_dims = 128;
    mc.n_embd = mc.n_head * 128;
    const QueryStats qs = make_stats(mc, 40 + static_cast<uint32_t>(group));
    kv::PoolConfig pc = pool_config();
    pc.head_dim = 128;
    pc.kv_type = DType::F16;
    kv::PagePool pool(pc);
    kv::SequenceKv kv(pool, mc.n_layer, mc.n_head_kv);
    const int32_t n = 77;
    ASSERT_TRUE(kv.append(n, 5000));
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.5f);
    for (int32_t st = 0; st < kv.n_streams(); ++st)
      for (int32_t j = 0; j < n; ++j) {
        auto* h = reinterpret_cast<uint16_t*>(kv.k_slot(st, j));
        for (int e = 0; e < 128; ++e) h[e] = f32_to_fp16(nd(rng));
      }
    std::vector<float> C, S;
    tri_offset_table(mc, kv.next_pos(), C, S);
    const int32_t F = 64;
    for (int32_t layer = 0; layer < mc.n_layer; ++layer)
      for (int32_t h = 0; h < mc.n_head_kv; ++h) {
        std::vector<float> out(static_cast<size_t>(group) * n);
        score_triattention_group(kv, mc, qs, layer, h, C, S, out);
        const int32_t st = kv.stream_index(layer, h);
        for (int32_t g = 0; g < group; ++g)
          for (int32_t j = 0; j < n; ++j) {
            const auto* key = reinterpret_cast<const uint16_t*>(kv.k_slot(st, j));
            double ref = 0, mag = 0;
            for (int32_t f = 0; f < F; ++f) {
              const size_t i = qs.index(layer, h * group + g, f);
              const double qr = qs.mean_re[i], qi = qs.mean_im[i];
              const double kr = fp16_to_f32(key[f]), ki = fp16_to_f32(key[f + F]);
              const double m = std::hypot(kr, ki);
              ref += kr * (qr * C[static_cast<size_t>(f)] - qi * S[static_cast<size_t>(f)]) +
                     ki * (qi * C[static_cast<size_t>(f)] + qr * S[static_cast<size_t>(f)]) +
                     (qs.abs_mean[i] - std::hypot(qr, qi)) * m;
              mag += (std::fabs(kr) + std::fabs(ki)) * (std::fabs(qr) + std::fabs(qi)) * 2 + qs.abs_mean[i] * m;
            }
            EXPECT_NEAR(out[static_cast<size_t>(g) * n + j], ref, 1e-5 * mag + 1e-6)
                << "group " << group << " layer " << layer << " head " << h << " g " << g << " slot " << j;
          }
      }
  }
}

TEST(CompressPolicies, TriAttentionWithoutStatisticsNamesTheCalibrateCommand) {
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

TEST(CompressPolicies, BudgetBelowSinksPlusWindowPlusOneIsRejected) {
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
    EXPECT_NE(std::string(e.what()).find("sinks + window + 1"), std::string::npos) << e.what();
  }
}

// ===================================================================================================
// SnapKV, R-KV, TOVA (window attention from post-RoPE queries) and H2O (key mass)

class WindowPolicyTest : public ::testing::TestWithParam<int32_t> {};  // param: sinks

TEST_P(WindowPolicyTest, SnapKVMatchesMaterialisedSoftmax) {
  const int32_t sinks = GetParam();
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 40 + sinks);
  Queries qf(mc, 140 + sinks);
  const CompressConfig cfg = make_cfg(PolicyKind::SnapKV, 20, sinks, -1);
  ASSERT_EQ(cfg.effective_window(), 8);
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  ASSERT_TRUE(seq.append(50));
  qf.feed(comp, 5);  // a prefill chunk...
  qf.feed(comp, 6);  // ...and another: the window is the last 8 queries across both
  for (int round = 0; round < 3; ++round) {
    Snapshot sn = snapshot(seq);
    compress_and_check(comp, seq, sn);
    std::vector<std::vector<double>> ref(sn.keys.size());
    for (int32_t l = 0; l < mc.n_layer; ++l)
      for (int32_t h = 0; h < mc.n_head_kv; ++h) {
        const size_t s = static_cast<size_t>(l * mc.n_head_kv + h);
        const auto A = ref_window_logits(mc, qf.last(l, 8), sn.keys[s], h);
        ref[s] = ref_snapkv(A, static_cast<int32_t>(sn.keys[s].size()), 8);
      }
    expect_keep_sets(seq, sn, ref, uniform_budgets(mc, 20), cfg, 0, 1e-7, "snapkv round " + std::to_string(round));
    // Decode steps: one token and one query per step.
    for (int i = 0; i < 9 + 4 * round; ++i) {
      ASSERT_TRUE(seq.append(1));
      qf.feed(comp, 1);
    }
  }
}

TEST_P(WindowPolicyTest, TOVASharesOneKeepSetPerLayer) {
  const int32_t sinks = GetParam();
  const ModelConfig mc = tiny_model(false);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 60 + sinks);
  Queries qf(mc, 160 + sinks);
  const CompressConfig cfg = make_cfg(PolicyKind::TOVA, 12, sinks, -1);
  ASSERT_EQ(cfg.effective_window(), 1);
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  ASSERT_TRUE(seq.append(30));
  qf.feed(comp, 30);
  for (int round = 0; round < 3; ++round) {
    Snapshot sn = snapshot(seq);
    compress_and_check(comp, seq, sn);
    expect_keep_sets(seq, sn, ref_tova(mc, qf, sn), uniform_budgets(mc, 12), cfg, 0, 1e-7, "tova round " + std::to_string(round));
    for (int32_t l = 0; l < mc.n_layer; ++l)
      for (int32_t h = 1; h < mc.n_head_kv; ++h)
        EXPECT_EQ(seq.positions(seq.kv().stream_index(l, h)), seq.positions(seq.kv().stream_index(l, 0))) << "layer " << l;
    for (int i = 0; i < 5 + round; ++i) {
      ASSERT_TRUE(seq.append(1));
      qf.feed(comp, 1);
    }
  }
}

// R-KV against the literal reference. (An earlier engine version computed the redundancy over the
// non-window keys only (`m = n - w_keys`, rows AND columns [0, m)).) The reference
// `cal_similarity(K)[:, :-w]` (triattention.md §7, R-KV rkv/utils.py) builds C over ALL cached keys:
// the window's rows count in every column mean (a key duplicated inside the window is redundant),
// and the softmax runs over all n columns, which rescales the term against λ·importance. Minor
// second difference: when row i has no near-duplicate, `max(indices)` over an all-zero row gives
// j* = 0 and the reference zeroes C[i,0]; the engine zeroes nothing (lines 154-164).
// RKVRedundancyCountsWindowKeys isolates the first difference.
TEST_P(WindowPolicyTest, RKVMatchesLiteralReference) {
  const int32_t sinks = GetParam();
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 80 + sinks);
  Queries qf(mc, 180 + sinks);
  const CompressConfig cfg = make_cfg(PolicyKind::RKV, 20, sinks, -1);
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  ASSERT_TRUE(seq.append(48));
  qf.feed(comp, 12);
  for (int round = 0; round < 3; ++round) {
    Snapshot sn = snapshot(seq);
    compress_and_check(comp, seq, sn);
    std::vector<std::vector<double>> literal(sn.keys.size());
    for (int32_t l = 0; l < mc.n_layer; ++l)
      for (int32_t h = 0; h < mc.n_head_kv; ++h) {
        const size_t s = static_cast<size_t>(l * mc.n_head_kv + h);
        const auto A = ref_window_logits(mc, qf.last(l, 8), sn.keys[s], h);
        literal[s] = ref_rkv(A, sn.keys[s], 8, true);
      }
    expect_keep_sets(seq, sn, literal, uniform_budgets(mc, 20), cfg, 0, 1e-7, "rkv (literal cal_similarity) round " + std::to_string(round));
    for (int i = 0; i < 10; ++i) {
      ASSERT_TRUE(seq.append(1));
      qf.feed(comp, 1);
    }
  }
}

// Both R-KV deviations, isolated on a hand-made layout where they decide the outcome.
TEST(CompressPolicies, RKVRedundancyCountsWindowKeys) {
  // Regression test for the window-rows difference described at RKVMatchesLiteralReference.
  // Stream layout (1 layer, 1 KV head, 1 query head, window 8, sinks 0, budget 9 → 1 free slot):
  // candidates 0 and 1 have identical attention (queries all zero → uniform softmax), key 0 is
  // unique while key 1 has near-duplicates only INSIDE the window. With the window's keys counted
  // (reference) slot 1 is the redundant one and slot 0 is kept; ignoring them, both score alike and
  // the tie goes to the more recent slot 1.
  ModelConfig mc = tiny_model(true, 1, 1, 1);
  kv::PagePool pool(pool_config());
  kv::SequenceKv kv(pool, 1, 1);
  ASSERT_TRUE(kv.append(10, 0));
  auto put = [&](int32_t slot, std::vector<float> k) {
    std::memcpy(kv.k_slot(0, slot), k.data(), sizeof(float) * kHeadDim);
    std::vector<float> v(kHeadDim, static_cast<float>(slot));
    std::memcpy(kv.v_slot(0, slot), v.data(), sizeof(float) * kHeadDim);
  };
  put(0, {1, 0, 0, 0, 0, 0, 0, 0});
  put(1, {0, 1, 0, 0, 0, 0, 0, 0});
  for (int32_t j = 2; j < 10; ++j) put(j, {0, 1, 0.1f * static_cast<float>(j), 0, 0, 0, 0, 0});  // window: copies of key 1
  CompressConfig cfg = make_cfg(PolicyKind::RKV, 9, 0, 8);
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  std::vector<float> q(static_cast<size_t>(8 * mc.q_dim()), 0.0f);
  comp.on_query_post_rope(0, 0, q.data(), 8, mc.q_dim());
  comp.compress(kv);
  ASSERT_EQ(kv.n_slots(0), 9);
  EXPECT_EQ(kv.position(0, 0), 0) << "slot 1 (duplicated inside the window) should have been evicted, not slot 0";
}

TEST_P(WindowPolicyTest, H2OKeepsHeaviestMassAndMovesItWithCompaction) {
  const int32_t sinks = GetParam();
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 90 + sinks);
  const CompressConfig cfg = make_cfg(PolicyKind::H2O, 14, sinks, 2);
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  std::mt19937 rng(190 + sinks);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  // Reference mass per (stream, position), accumulated like the attention kernel would.
  std::vector<std::map<int32_t, double>> mass(static_cast<size_t>(seq.kv().n_streams()));
  auto forward = [&](int32_t n_new) {
    std::vector<int32_t> toks(static_cast<size_t>(n_new), 1);
    BatchItem item;
    item.kv = &seq.kv();
    item.tokens = toks;
    comp.prepare(seq.kv(), item);
    ASSERT_NE(item.key_mass, nullptr);
    ASSERT_GE(item.key_mass_stride, seq.kv().max_slots() + n_new);
    ASSERT_TRUE(seq.append(n_new));
    for (int32_t s = 0; s < seq.kv().n_streams(); ++s)
      for (int32_t j = 0; j < seq.kv().n_slots(s); ++j) {
        const float add = ud(rng);
        item.key_mass[static_cast<size_t>(s) * item.key_mass_stride + j] += add;
        mass[static_cast<size_t>(s)][seq.kv().position(s, j)] += add;
      }
  };
  forward(31);
  for (int round = 0; round < 4; ++round) {
    Snapshot sn = snapshot(seq);
    compress_and_check(comp, seq, sn);
    std::vector<std::vector<double>> ref(sn.pos.size());
    for (size_t s = 0; s < sn.pos.size(); ++s)
      for (int32_t p : sn.pos[s]) ref[s].push_back(mass[s][p]);
    expect_keep_sets(seq, sn, ref, uniform_budgets(mc, 14), cfg, 0, 1e-4, "h2o round " + std::to_string(round));
    // The accumulator moved with the survivors: slot i holds the mass of the i-th kept position, zeros after.
    BatchItem item;
    std::vector<int32_t> none;
    item.tokens = none;
    comp.prepare(seq.kv(), item);
    for (int32_t s = 0; s < seq.kv().n_streams(); ++s) {
      for (int32_t j = 0; j < seq.kv().n_slots(s); ++j)
        EXPECT_NEAR(item.key_mass[static_cast<size_t>(s) * item.key_mass_stride + j], mass[static_cast<size_t>(s)][seq.kv().position(s, j)], 1e-4)
            << "stream " << s << " slot " << j;
      for (int64_t j = seq.kv().n_slots(s); j < item.key_mass_stride; ++j)
        ASSERT_EQ(item.key_mass[static_cast<size_t>(s) * item.key_mass_stride + j], 0.0f) << "stream " << s << " slot " << j;
    }
    forward(3 + round * 17);  // the last one grows the buffer past its first capacity
  }
}

INSTANTIATE_TEST_SUITE_P(Sinks, WindowPolicyTest, ::testing::Values(0, 4),
                         [](const ::testing::TestParamInfo<int32_t>& i) { return "sinks" + std::to_string(i.param); });

// ===================================================================================================
// Budget splits

TEST(CompressPolicies, PyramidBudgetsMatchHandComputedSchedule) {
  // policies.md §1.6 with base = budget, T = n, β = 20:
  //   min = base/β, max = 2·base − min; if max ≥ T − w: max = T − w, min = 2·base − max;
  //   unless T ≥ max ≥ min ≥ w → uniform; else budget_l = round(max − l·(max − min)/(L − 1)).
  // (100, 4 layers, T 228, w 2): min 5, max 195 → 195, 131.67, 68.33, 5.
  EXPECT_EQ(pyramid_budgets(100, 4, 228, 2), (std::vector<int32_t>{195, 132, 68, 5}));
  // (60, 4, 188, 3): min 3, max 117, step 38.
  EXPECT_EQ(pyramid_budgets(60, 4, 188, 3), (std::vector<int32_t>{117, 79, 41, 3}));
  // (100, 3, 150, 8): max 195 ≥ 142 → max 142, min 58.
  EXPECT_EQ(pyramid_budgets(100, 3, 150, 8), (std::vector<int32_t>{142, 100, 58}));
  // (40, 4, 64, 2): max 78 ≥ 62 → max 62, min 18; step 14.67 → 62, 47.33, 32.67, 18.
  EXPECT_EQ(pyramid_budgets(40, 4, 64, 2), (std::vector<int32_t>{62, 47, 33, 18}));
  // (40, 2, 64, 2): max 62, min 18.
  EXPECT_EQ(pyramid_budgets(40, 2, 64, 2), (std::vector<int32_t>{62, 18}));
  // Fallbacks to uniform: min = 3.2 < w = 4; and capped max 30 < min 50.
  EXPECT_EQ(pyramid_budgets(64, 4, 192, 4), (std::vector<int32_t>{64, 64, 64, 64}));
  EXPECT_EQ(pyramid_budgets(40, 2, 60, 30), (std::vector<int32_t>{40, 40}));
  // One layer: nothing to spread.
  EXPECT_EQ(pyramid_budgets(40, 1, 64, 2), (std::vector<int32_t>{40}));
}

TEST(CompressPolicies, PyramidPerLayerKeepCounts) {
  for (int32_t layers : {2, 4}) {
    const ModelConfig mc = tiny_model(true, layers);
    kv::PagePool pool(pool_config());
    Seq seq(pool, mc, 300 + layers);
    CompressConfig cfg = make_cfg(PolicyKind::KNorm, 40, 2, -1, 24);
    cfg.split = BudgetSplit::Pyramid;
    ASSERT_EQ(cfg.effective_window(), 2);
    SequenceCompressor comp(cfg, mc, nullptr, 0);
    const std::vector<int32_t> per_layer =
        layers == 2 ? std::vector<int32_t>{62, 18} : std::vector<int32_t>{62, 47, 33, 18};
    std::vector<int32_t> budgets;
    for (int32_t l = 0; l < layers; ++l)
      for (int32_t h = 0; h < mc.n_head_kv; ++h) budgets.push_back(per_layer[static_cast<size_t>(l)]);
    // Decode one token at a time: the first event comes exactly at budget + interval = 64 slots.
    ASSERT_TRUE(seq.append(1));
    int events = 0;
    for (int step = 0; step < 200 && events < 3; ++step) {
      Snapshot sn = snapshot(seq);
      const CompressionStats before = comp.stats();
      if (comp.after_forward(seq.kv(), step == 0)) {
        ++events;
        if (events == 1) {
          EXPECT_EQ(sn.pos[0].size(), 64u);
        }
        EXPECT_GE(sn.total_slots, static_cast<int64_t>(mc.n_layer) * mc.n_head_kv * 64);
        EXPECT_TRUE(seq.check_content());
        expect_stats(seq, sn, before, comp.stats());
        expect_keep_sets(seq, sn, ref_knorm(sn), budgets, cfg, 0, 0.0, "pyramid event " + std::to_string(events));
        for (int32_t s = 0; s < seq.kv().n_streams(); ++s)
          EXPECT_EQ(seq.kv().n_slots(s), std::min<int32_t>(budgets[static_cast<size_t>(s)], static_cast<int32_t>(sn.pos[static_cast<size_t>(s)].size())))
              << "layer " << s / mc.n_head_kv;
      } else {
        EXPECT_LT(sn.total_slots, static_cast<int64_t>(mc.n_layer) * mc.n_head_kv * 64);
      }
      ASSERT_TRUE(seq.append(1));
    }
    EXPECT_EQ(events, 3);
  }
}

TEST(CompressPolicies, PyramidTriAttentionSelectsPerStream) {
  // With a non-uniform split layers hold different counts, so TriAttention's per-layer scores are
  // used per stream (no mean over layers).
  const ModelConfig mc = tiny_model(false);
  const QueryStats qs = make_stats(mc, 401);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 402);
  CompressConfig cfg = make_cfg(PolicyKind::TriAttention, 40, 2, 2, 24);
  cfg.split = BudgetSplit::Pyramid;
  SequenceCompressor comp(cfg, mc, &qs, 0);
  ASSERT_TRUE(seq.append(64));
  Snapshot sn = snapshot(seq);
  compress_and_check(comp, seq, sn);
  std::vector<int32_t> budgets = {62, 62, 18, 18};
  expect_keep_sets(seq, sn, ref_triattention(mc, qs, sn, sn.next_pos, false), budgets, cfg, 0, 1e-4, "pyramid triattention");
}

namespace {
// Checks one layer of an Ada event against ref_ada and the stated properties.
void expect_ada_layer(Seq& seq, const Snapshot& sn, const ModelConfig& mc, const CompressConfig& cfg, int32_t layer,
                      const std::vector<std::vector<double>>& score, const std::string& what) {
  std::vector<std::vector<double>> sc;
  std::vector<std::vector<bool>> prot;
  int64_t candidates = 0, protected_total = 0;
  for (int32_t h = 0; h < mc.n_head_kv; ++h) {
    const size_t s = static_cast<size_t>(layer * mc.n_head_kv + h);
    sc.push_back(score[s]);
    prot.push_back(protect_mask(sn.pos[s], cfg.sinks, cfg.effective_window(), 0));
    candidates += static_cast<int64_t>(sn.pos[s].size());
    for (bool b : prot.back()) protected_total += b;
  }
  const auto want = ref_ada(sc, prot, cfg.budget);
  int64_t kept_total = 0;
  const int32_t n_safe = std::max(1, static_cast<int32_t>(0.2 * cfg.budget));
  for (int32_t h = 0; h < mc.n_head_kv; ++h) {
    const int32_t s = layer * mc.n_head_kv + h;
    const auto got = kept_slots(seq, sn, s);
    kept_total += static_cast<int64_t>(got.size());
    EXPECT_EQ(got, want[static_cast<size_t>(h)]) << what << ": layer " << layer << " head " << h;
    // Its protected slots plus at least its own n_safe best.
    std::vector<int32_t> own = ref_topk(sc[static_cast<size_t>(h)], prot[static_cast<size_t>(h)],
                                        static_cast<int32_t>(std::count(prot[static_cast<size_t>(h)].begin(), prot[static_cast<size_t>(h)].end(), true)) + n_safe);
    for (int32_t j : own)
      EXPECT_TRUE(std::binary_search(got.begin(), got.end(), j)) << what << ": layer " << layer << " head " << h << " lost own-best/protected slot " << j;
  }
  EXPECT_EQ(kept_total, std::min<int64_t>(candidates, std::max<int64_t>(protected_total, static_cast<int64_t>(mc.n_head_kv) * cfg.budget)))
      << what << ": layer " << layer << " kept total";
}
}  // namespace

TEST(CompressPolicies, AdaSplitSingleEvent) {
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 500);
  seq.set_head_scale(1, 1.6);  // head 1 has larger keys: KNorm prefers head 0's, head 1 lives on its safeguard
  CompressConfig cfg = make_cfg(PolicyKind::KNorm, 20, 2, 2);
  cfg.split = BudgetSplit::Ada;
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  ASSERT_TRUE(seq.append(44));
  Snapshot sn = snapshot(seq);
  compress_and_check(comp, seq, sn);
  const auto score = ref_knorm(sn);
  for (int32_t l = 0; l < mc.n_layer; ++l) expect_ada_layer(seq, sn, mc, cfg, l, score, "ada event 1");
  // Ada really moved budget between heads here (otherwise this test would prove little).
  EXPECT_NE(seq.kv().n_slots(0), seq.kv().n_slots(1));
}

TEST(CompressPolicies, AdaSplitWithSnapKVScores) {
  const ModelConfig mc = tiny_model(false);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 510);
  Queries qf(mc, 511);
  CompressConfig cfg = make_cfg(PolicyKind::SnapKV, 20, 2, -1);
  cfg.split = BudgetSplit::Ada;
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  ASSERT_TRUE(seq.append(50));
  qf.feed(comp, 10);
  Snapshot sn = snapshot(seq);
  compress_and_check(comp, seq, sn);
  std::vector<std::vector<double>> score(sn.keys.size());
  for (int32_t l = 0; l < mc.n_layer; ++l)
    for (int32_t h = 0; h < mc.n_head_kv; ++h) {
      const size_t s = static_cast<size_t>(l * mc.n_head_kv + h);
      score[s] = ref_snapkv(ref_window_logits(mc, qf.last(l, 8), sn.keys[s], h), static_cast<int32_t>(sn.keys[s].size()), 8);
    }
  // (Max-pooling makes exact ties between neighbours; both sides break them towards the newer slot.)
  for (int32_t l = 0; l < mc.n_layer; ++l) expect_ada_layer(seq, sn, mc, cfg, l, score, "ada+snapkv");
}

// Regression (an earlier engine version: compressor.cpp compress(), the `if (!same)` branch of the Ada split,
// lines ~282-291): after one Ada event the KV heads of a layer hold different slot counts, so the
// next event does not pool them at all; every head falls back to select_keep with the uniform
// `budget`. The layer then is not re-balanced (heads keep their own top `budget`, no global top),
// and a head that had fewer than budget − interval slots keeps everything while its neighbour is
// cut to `budget`, leaving the layer below n_kv_heads × budget although candidates remain. Ada is
// thus only applied on every other event.
TEST(CompressPolicies, AdaSplitRepeatedEvents) {
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 520);
  seq.set_head_scale(1, 1.6);
  CompressConfig cfg = make_cfg(PolicyKind::KNorm, 20, 2, 2, 6);
  cfg.split = BudgetSplit::Ada;
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  ASSERT_TRUE(seq.append(44));
  for (int event = 1; event <= 3; ++event) {
    Snapshot sn = snapshot(seq);
    compress_and_check(comp, seq, sn);
    const auto score = ref_knorm(sn);
    for (int32_t l = 0; l < mc.n_layer; ++l) expect_ada_layer(seq, sn, mc, cfg, l, score, "ada event " + std::to_string(event));
    ASSERT_TRUE(seq.append(6));
  }
}

// ===================================================================================================
// Protection, counts, every policy

TEST(CompressPolicies, ProtectPromptNeverEvictsPromptPositions) {
  const ModelConfig mc = tiny_model(true);
  for (PolicyKind p : {PolicyKind::KNorm, PolicyKind::Streaming}) {
    kv::PagePool pool(pool_config());
    Seq seq(pool, mc, 600);
    CompressConfig cfg = make_cfg(p, 16, 2, 1);
    cfg.protect_prompt = true;
    const int32_t prompt = 10;
    SequenceCompressor comp(cfg, mc, nullptr, prompt);
    ASSERT_TRUE(seq.append(40));
    for (int round = 0; round < 3; ++round) {
      Snapshot sn = snapshot(seq);
      compress_and_check(comp, seq, sn);
      const auto score = p == PolicyKind::KNorm ? ref_knorm(sn) : ref_recency(sn);
      expect_keep_sets(seq, sn, score, uniform_budgets(mc, 16), cfg, prompt, 0.0, "protect prompt");
      for (int32_t s = 0; s < seq.kv().n_streams(); ++s) {
        const auto pos = seq.positions(s);
        ASSERT_GE(pos.size(), static_cast<size_t>(prompt));
        for (int32_t i = 0; i < prompt; ++i) EXPECT_EQ(pos[static_cast<size_t>(i)], i);
        EXPECT_EQ(seq.kv().n_slots(s), 16);
      }
      ASSERT_TRUE(seq.append(9));
    }
  }
  // Protection larger than the budget: everything protected stays (count = protected slots).
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 601);
  CompressConfig cfg = make_cfg(PolicyKind::KNorm, 16, 2, 3);
  cfg.protect_prompt = true;
  SequenceCompressor comp(cfg, mc, nullptr, 20);
  ASSERT_TRUE(seq.append(35));
  Snapshot sn = snapshot(seq);
  compress_and_check(comp, seq, sn);
  std::vector<int32_t> want;
  for (int32_t p = 0; p < 20; ++p) want.push_back(p);
  for (int32_t p = 32; p < 35; ++p) want.push_back(p);
  for (int32_t s = 0; s < seq.kv().n_streams(); ++s) EXPECT_EQ(seq.positions(s), want);
}

class EveryPolicyTest : public ::testing::TestWithParam<PolicyKind> {};

TEST_P(EveryPolicyTest, SinksWindowOrderCountsAndStats) {
  const PolicyKind p = GetParam();
  const ModelConfig mc = tiny_model(true);
  const QueryStats qs = make_stats(mc, 700);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 701 + static_cast<uint32_t>(p));
  Queries qf(mc, 702);
  const int32_t sinks = 3, window = 5, budget = 17;
  const CompressConfig cfg = make_cfg(p, budget, sinks, window, 10);
  SequenceCompressor comp(cfg, mc, &qs, 0);
  std::vector<int32_t> toks(40, 1);
  BatchItem item;
  item.tokens = toks;
  comp.prepare(seq.kv(), item);
  ASSERT_TRUE(seq.append(40));
  if (item.key_mass != nullptr)
    for (int32_t s = 0; s < seq.kv().n_streams(); ++s)
      for (int32_t j = 0; j < 40; ++j) item.key_mass[static_cast<size_t>(s) * item.key_mass_stride + j] = static_cast<float>((j * 7919 + s * 31) % 97);
  qf.feed(comp, 40);
  for (int round = 0; round < 3; ++round) {
    Snapshot sn = snapshot(seq);
    compress_and_check(comp, seq, sn);
    for (int32_t s = 0; s < seq.kv().n_streams(); ++s) {
      const auto got = kept_slots(seq, sn, s);
      const auto n = static_cast<int32_t>(sn.pos[static_cast<size_t>(s)].size());
      ASSERT_EQ(static_cast<int32_t>(got.size()), budget) << "stream " << s;
      for (int32_t j = 0; j < sinks; ++j) EXPECT_EQ(got[static_cast<size_t>(j)], j) << "sink " << j << " stream " << s;
      for (int32_t j = 0; j < window; ++j)
        EXPECT_EQ(got[static_cast<size_t>(budget - window + j)], n - window + j) << "window slot, stream " << s;
      for (size_t i = 1; i < got.size(); ++i) EXPECT_LT(got[i - 1], got[i]);
    }
    for (int i = 0; i < 6 + round; ++i) {
      comp.prepare(seq.kv(), item);
      ASSERT_TRUE(seq.append(1));
      qf.feed(comp, 1);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, EveryPolicyTest,
                         ::testing::Values(PolicyKind::Streaming, PolicyKind::KNorm, PolicyKind::TriAttention, PolicyKind::SnapKV,
                                           PolicyKind::RKV, PolicyKind::TOVA, PolicyKind::H2O),
                         [](const ::testing::TestParamInfo<PolicyKind>& i) { return std::string(policy_name(i.param)); });

// ===================================================================================================
// Schedule

TEST(CompressPolicies, AfterForwardTriggersExactlyAtBudgetPlusInterval) {
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 800);
  const int32_t budget = 12, interval = 8;
  const CompressConfig cfg = make_cfg(PolicyKind::Streaming, budget, 4, 0, interval);
  SequenceCompressor comp(cfg, mc, nullptr, 5);
  const int64_t streams = mc.n_layer * mc.n_head_kv;
  ASSERT_TRUE(seq.append(5));
  EXPECT_FALSE(comp.after_forward(seq.kv(), true));  // short prompt: nothing to cut
  int events = 0;
  for (int step = 0; step < 60; ++step) {
    ASSERT_TRUE(seq.append(1));
    const int64_t total = seq.kv().total_slots();
    Snapshot sn = snapshot(seq);
    const bool did = comp.after_forward(seq.kv(), false);
    EXPECT_EQ(did, total >= streams * (budget + interval)) << "step " << step << " total " << total;
    if (did) {
      ++events;
      EXPECT_EQ(total, streams * (budget + interval));  // one token per step: exactly at the threshold
      EXPECT_EQ(seq.kv().total_slots(), streams * budget);
      std::vector<int32_t> want = {0, 1, 2, 3};
      for (int64_t p = sn.next_pos - (budget - 4); p < sn.next_pos; ++p) want.push_back(static_cast<int32_t>(p));
      for (int32_t s = 0; s < seq.kv().n_streams(); ++s) EXPECT_EQ(seq.positions(s), want);
    }
  }
  EXPECT_EQ(events, (5 + 60 - budget) / interval);
  EXPECT_EQ(comp.stats().events, events);
}

TEST(CompressPolicies, CompressPrefillCutsLongPrompts) {
  const ModelConfig mc = tiny_model(true);
  const int64_t streams = mc.n_layer * mc.n_head_kv;
  for (bool prefill_cut : {true, false}) {
    kv::PagePool pool(pool_config());
    Seq seq(pool, mc, 810);
    CompressConfig cfg = make_cfg(PolicyKind::KNorm, 12, 2, 1, 8);
    cfg.compress_prefill = prefill_cut;
    SequenceCompressor comp(cfg, mc, nullptr, 15);
    ASSERT_TRUE(seq.append(10));  // first prefill chunk: not done yet, under budget + interval
    EXPECT_FALSE(comp.after_forward(seq.kv(), false));
    ASSERT_TRUE(seq.append(5));   // last chunk: 15 > budget
    Snapshot sn = snapshot(seq);
    EXPECT_EQ(comp.after_forward(seq.kv(), true), prefill_cut);
    EXPECT_EQ(seq.kv().total_slots(), prefill_cut ? streams * 12 : streams * 15);
    if (prefill_cut) expect_keep_sets(seq, sn, ref_knorm(sn), uniform_budgets(mc, 12), cfg, 0, 0.0, "prefill cut");
    // Decode: the next event at budget + interval = 20 slots either way.
    int steps = 0;
    while (!comp.after_forward(seq.kv(), false)) {
      ASSERT_TRUE(seq.append(1));
      ++steps;
      ASSERT_LT(steps, 100);
    }
    EXPECT_EQ(steps, prefill_cut ? 8 : 5);
  }
  // A prompt that ends exactly at the budget is not compressed.
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 811);
  SequenceCompressor comp(make_cfg(PolicyKind::KNorm, 12, 2, 1, 8), mc, nullptr, 12);
  ASSERT_TRUE(seq.append(12));
  EXPECT_FALSE(comp.after_forward(seq.kv(), true));
}

TEST(CompressPolicies, BudgetAtLeastSlotCountNeverEvicts) {
  const ModelConfig mc = tiny_model(true);
  // (H2O: see H2OBudgetAtLeastSlotCountNeverEvicts.)
  for (PolicyKind p : {PolicyKind::Streaming, PolicyKind::KNorm, PolicyKind::TriAttention, PolicyKind::SnapKV, PolicyKind::RKV,
                       PolicyKind::TOVA}) {
    // (Pyramid is left out on purpose: its per-layer budgets go below the mean budget.)
    for (BudgetSplit split : {BudgetSplit::Uniform, BudgetSplit::Ada}) {
      kv::PagePool pool(pool_config());
      Seq seq(pool, mc, 820);
      Queries qf(mc, 821);
      const QueryStats qs = make_stats(mc, 822);
      CompressConfig cfg = make_cfg(p, 40, 4, -1, 16);
      cfg.split = split;
      SequenceCompressor comp(cfg, mc, &qs, 0);
      std::vector<int32_t> toks(40, 1);
      BatchItem item;
      item.tokens = toks;
      comp.prepare(seq.kv(), item);
      ASSERT_TRUE(seq.append(40));
      qf.feed(comp, 8);
      Snapshot sn = snapshot(seq);
      EXPECT_FALSE(comp.after_forward(seq.kv(), true)) << policy_name(p);
      comp.compress(seq.kv());
      for (int32_t s = 0; s < seq.kv().n_streams(); ++s) EXPECT_EQ(seq.positions(s), sn.pos[static_cast<size_t>(s)]) << policy_name(p) << " " << split_name(split);
      EXPECT_EQ(comp.stats().evicted_slots, 0);
      EXPECT_EQ(comp.stats().freed_pages, 0);
      EXPECT_EQ(pool.used_pages(), sn.used_pages);
      EXPECT_TRUE(seq.check_content());
    }
  }
}

TEST(CompressPolicies, H2OBudgetAtLeastSlotCountNeverEvicts) {
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 825);
  SequenceCompressor comp(make_cfg(PolicyKind::H2O, 40, 4, -1, 16), mc, nullptr, 0);
  std::vector<int32_t> toks(40, 1);
  BatchItem item;
  item.tokens = toks;
  comp.prepare(seq.kv(), item);
  ASSERT_TRUE(seq.append(40));
  Snapshot sn = snapshot(seq);
  EXPECT_FALSE(comp.after_forward(seq.kv(), true));
  comp.compress(seq.kv());
  for (int32_t s = 0; s < seq.kv().n_streams(); ++s) EXPECT_EQ(seq.positions(s), sn.pos[static_cast<size_t>(s)]);
  EXPECT_EQ(comp.stats().evicted_slots, 0);
  EXPECT_EQ(pool.used_pages(), sn.used_pages);
}

// Regression: the first prepare() grows an empty buffer; copying "0 bytes from nullptr" is undefined
// behaviour that the sanitizer build aborts on (fixed in compressor.cpp by skipping the copy).
TEST(CompressPolicies, H2OFirstPrepareIsDefined) {
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  kv::SequenceKv kv(pool, mc.n_layer, mc.n_head_kv);
  SequenceCompressor comp(make_cfg(PolicyKind::H2O, 16, 4, -1), mc, nullptr, 0);
  std::vector<int32_t> toks(5, 1);
  BatchItem item;
  item.tokens = toks;
  comp.prepare(kv, item);
  ASSERT_NE(item.key_mass, nullptr);
  EXPECT_GE(item.key_mass_stride, 5);
  for (int64_t i = 0; i < item.key_mass_stride * kv.n_streams(); ++i) ASSERT_EQ(item.key_mass[i], 0.0f);
}

// TOVA scores a layer once and gives every KV head the same row; under Ada the heads of a layer then
// tie everywhere, take equal shares and must keep sharing one set (policies.md §1.4) across events.
TEST(CompressPolicies, TovaWithAdaKeepsOneSetPerLayer) {
  const ModelConfig mc = tiny_model(true, 2, 6, 3);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 840);
  Queries qf(mc, 841);
  CompressConfig cfg = make_cfg(PolicyKind::TOVA, 21, 2, -1, 8);
  cfg.split = BudgetSplit::Ada;
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  ASSERT_TRUE(seq.append(40));
  qf.feed(comp, 40);
  for (int event = 1; event <= 4; ++event) {
    Snapshot sn = snapshot(seq);
    compress_and_check(comp, seq, sn);
    const auto ref = ref_tova(mc, qf, sn);
    for (int32_t l = 0; l < mc.n_layer; ++l) {
      for (int32_t h = 1; h < mc.n_head_kv; ++h)
        ASSERT_EQ(seq.positions(seq.kv().stream_index(l, h)), seq.positions(seq.kv().stream_index(l, 0))) << "event " << event << " layer " << l;
      EXPECT_EQ(seq.kv().n_slots(seq.kv().stream_index(l, 0)), 21);
    }
    expect_keep_sets(seq, sn, ref, uniform_budgets(mc, 21), cfg, 0, 1e-7, "tova+ada event " + std::to_string(event));
    for (int i = 0; i < 8; ++i) {
      ASSERT_TRUE(seq.append(1));
      qf.feed(comp, 1);
    }
  }
}

// ===================================================================================================
// Prefix sharing: leading pages shared with another sequence are protected (read-only) and never
// written; once the other owner is gone they compete again.

TEST(CompressPolicies, SharedPrefixPagesAreProtectedAndUntouched) {
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  Seq a(pool, mc, 950), b(pool, mc, 951);
  ASSERT_TRUE(a.append(8));
  b.attach_shared_from(a, 0);
  b.attach_shared_from(a, 1);
  ASSERT_TRUE(b.append(30));
  const CompressConfig cfg = make_cfg(PolicyKind::KNorm, 16, 2, 1);
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  Snapshot sn = snapshot(b);
  const CompressionStats before = comp.stats();
  comp.compress(b.kv());
  EXPECT_TRUE(a.check_content());
  EXPECT_TRUE(b.check_content());
  EXPECT_EQ(check_pool(pool, {&a.kv(), &b.kv()}), "");
  expect_stats(b, sn, before, comp.stats());
  CompressConfig shared_cfg = cfg;
  shared_cfg.sinks = 8;  // the two shared pages act as sinks
  expect_keep_sets(b, sn, ref_knorm(sn), uniform_budgets(mc, 16), shared_cfg, 0, 0.0, "shared prefix");
  for (int32_t s = 0; s < b.kv().n_streams(); ++s) {
    EXPECT_EQ(b.kv().block_page(s, 0), a.kv().block_page(s, 0));
    EXPECT_EQ(b.kv().block_page(s, 1), a.kv().block_page(s, 1));
  }
  // The other owner finishes: the pages are private now and their slots compete like any other.
  a.clear();
  ASSERT_TRUE(b.append(10));
  sn = snapshot(b);
  compress_and_check(comp, b, sn);
  expect_keep_sets(b, sn, ref_knorm(sn), uniform_budgets(mc, 16), cfg, 0, 0.0, "prefix no longer shared");
}

// ===================================================================================================
// Naive eviction (demonstration mode): holes instead of compaction.

TEST(CompressPolicies, NaiveModePunchesHolesAndFreesOnlyEmptyPages) {
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 960);
  CompressConfig cfg = make_cfg(PolicyKind::KNorm, 12, 2, 1, 8);
  cfg.naive = true;
  SequenceCompressor comp(cfg, mc, nullptr, 0);
  ASSERT_TRUE(seq.append(40));
  for (int event = 1; event <= 3; ++event) {
    Snapshot sn = live_snapshot(seq);
    const CompressionStats before = comp.stats();
    std::vector<std::vector<int32_t>> all_before;
    for (int32_t s = 0; s < seq.kv().n_streams(); ++s) all_before.push_back(seq.positions(s));
    comp.compress(seq.kv());
    EXPECT_TRUE(seq.check_content());  // holes keep their bytes; only whole pages go
    EXPECT_EQ(check_pool(pool, {&seq.kv()}), "");
    expect_keep_sets(seq, sn, ref_knorm(sn), uniform_budgets(mc, 12), cfg, 0, 0.0, "naive event " + std::to_string(event));
    int64_t evicted = 0, expect_freed = 0;
    for (int32_t s = 0; s < seq.kv().n_streams(); ++s) {
      EXPECT_EQ(seq.kv().live_slots(s), 12);
      evicted += static_cast<int64_t>(sn.pos[static_cast<size_t>(s)].size()) - 12;
      // A page goes back only if none of its slots holds a live position.
      const auto live = seq.live_positions(s);
      const auto& all = all_before[static_cast<size_t>(s)];
      for (size_t first = 0; first < all.size(); first += kPageSize) {
        bool any = false;
        for (size_t j = first; j < std::min(all.size(), first + kPageSize); ++j)
          any |= std::binary_search(live.begin(), live.end(), all[j]);
        expect_freed += !any;
      }
    }
    EXPECT_EQ(comp.stats().evicted_slots - before.evicted_slots, evicted);
    EXPECT_EQ(comp.stats().freed_pages - before.freed_pages, expect_freed);
    EXPECT_EQ(comp.stats().freed_pages - before.freed_pages, sn.used_pages - pool.used_pages());
    EXPECT_LT(comp.stats().reclaim_efficiency(), 1.0);
    // The schedule counts live slots: the next event comes after `interval` more tokens.
    int steps = 0;
    while (!comp.after_forward(seq.kv(), false)) {
      ASSERT_TRUE(seq.append(1));
      ASSERT_LT(++steps, 100);
    }
    EXPECT_EQ(steps, 8);
    // after_forward already compressed; add tokens so the next loop iteration has something to cut.
    ASSERT_TRUE(seq.append(9));
  }
}

// Naive mode must score live slots only. (An earlier engine version dropped holes from the candidates
// but still scored them: TriAttention's per-head z-normalisation (mean/std) runs over all n_slots including
// the holes (evicted tokens that are never attended again), so the live keys' normalised scores —
// and, through the max over the GQA group and the mean over layers, the keep set — depend on evicted
// keys. Reference: the same formula over the live keys only.
TEST(CompressPolicies, NaiveModeScoresLiveSlotsOnly) {
  const ModelConfig mc = tiny_model(true);
  const QueryStats qs = make_stats(mc, 970);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 971);
  CompressConfig cfg = make_cfg(PolicyKind::TriAttention, 12, 2, 1, 8);
  cfg.naive = true;
  SequenceCompressor comp(cfg, mc, &qs, 0);
  ASSERT_TRUE(seq.append(40));
  for (int event = 1; event <= 3; ++event) {
    Snapshot sn = live_snapshot(seq);
    comp.compress(seq.kv());
    EXPECT_TRUE(seq.check_content());
    expect_keep_sets(seq, sn, ref_triattention(mc, qs, sn, sn.next_pos, true), uniform_budgets(mc, 12), cfg, 0, 1e-4,
                     "naive triattention event " + std::to_string(event));
    ASSERT_TRUE(seq.append(17));
  }
}

TEST(CompressPolicies, DisabledCompressionDoesNothing) {
  const ModelConfig mc = tiny_model(true);
  kv::PagePool pool(pool_config());
  Seq seq(pool, mc, 830);
  for (const CompressConfig& cfg : {make_cfg(PolicyKind::Full, 8, 4, -1), make_cfg(PolicyKind::KNorm, 0, 4, -1)}) {
    SequenceCompressor comp(cfg, mc, nullptr, 0);
    ASSERT_TRUE(seq.append(50));
    EXPECT_FALSE(comp.after_forward(seq.kv(), true));
    comp.compress(seq.kv());
    EXPECT_EQ(seq.kv().n_slots(0), seq.kv().next_pos());
    EXPECT_EQ(comp.stats().events, 0);
  }
}

// ===================================================================================================
// Randomized: several sequences sharing one pool, appends / compressions / restarts, pool invariants
// and content after every operation.

TEST(CompressPolicies, RandomizedPoolInvariants) {
  const ModelConfig mc = tiny_model(false, 2, 4, 2);
  const QueryStats qs = make_stats(mc, 900);
  kv::PagePool pool(pool_config(64));  // small enough that some appends are refused
  std::mt19937 rng(901);
  const PolicyKind policies[] = {PolicyKind::Streaming, PolicyKind::KNorm, PolicyKind::TriAttention, PolicyKind::SnapKV,
                                 PolicyKind::RKV, PolicyKind::TOVA, PolicyKind::H2O};
  struct Slot {
    std::unique_ptr<Seq> seq;
    std::unique_ptr<SequenceCompressor> comp;
    std::unique_ptr<Queries> qf;
    CompressConfig cfg;
    int32_t prompt = 0;
  };
  std::vector<Slot> seqs(3);
  auto restart = [&](Slot& sl) {
    sl.comp.reset();
    sl.seq = std::make_unique<Seq>(pool, mc, static_cast<uint32_t>(rng()));
    sl.qf = std::make_unique<Queries>(mc, static_cast<uint32_t>(rng()));
    const PolicyKind p = policies[rng() % 7];
    const int32_t budget = 13 + static_cast<int32_t>(rng() % 20);  // >= sinks (<= 3) + window (<= 8) + 1
    sl.cfg = make_cfg(p, budget, static_cast<int32_t>(rng() % 4), static_cast<int32_t>(rng() % 3) - 1, 1 + static_cast<int32_t>(rng() % 12));
    sl.cfg.protect_prompt = rng() % 4 == 0;
    sl.cfg.compress_prefill = rng() % 2 == 0;
    sl.cfg.split = static_cast<BudgetSplit>(rng() % 3);
    sl.prompt = static_cast<int32_t>(rng() % 12);
    sl.comp = std::make_unique<SequenceCompressor>(sl.cfg, mc, &qs, sl.prompt);
  };
  for (auto& sl : seqs) restart(sl);
  auto all_kv = [&]() {
    std::vector<kv::SequenceKv*> v;
    for (auto& sl : seqs) v.push_back(&sl.seq->kv());
    return v;
  };
  int compressions = 0, refused = 0;
  for (int op = 0; op < 3000; ++op) {
    Slot& sl = seqs[rng() % seqs.size()];
    const int r = static_cast<int>(rng() % 100);
    const CompressionStats before = sl.comp->stats();
    Snapshot sn = snapshot(*sl.seq);
    bool compressed = false;
    if (r < 80) {  // a forward of 1..9 tokens (mostly decode)
      const int32_t n = r < 60 ? 1 : 1 + static_cast<int32_t>(rng() % 9);
      std::vector<int32_t> toks(static_cast<size_t>(n), 1);
      BatchItem item;
      item.tokens = toks;
      sl.comp->prepare(sl.seq->kv(), item);
      if (!sl.seq->append(n)) {
        ++refused;
        EXPECT_EQ(sl.seq->kv().total_slots(), sn.total_slots);
      } else {
        if (item.key_mass != nullptr)
          for (int32_t s = 0; s < sl.seq->kv().n_streams(); ++s)
            for (int32_t j = 0; j < sl.seq->kv().n_slots(s); ++j)
              item.key_mass[static_cast<size_t>(s) * item.key_mass_stride + j] += static_cast<float>(rng() % 1000) / 1000.0f;
        sl.qf->feed(*sl.comp, n);
        sn = snapshot(*sl.seq);
        compressed = sl.comp->after_forward(sl.seq->kv(), r >= 60);
      }
    } else if (r < 92) {
      sl.comp->compress(sl.seq->kv());
      compressed = sl.cfg.enabled();
    } else {
      restart(sl);
    }
    if (compressed) {
      ++compressions;
      expect_stats(*sl.seq, sn, before, sl.comp->stats());
      for (int32_t s = 0; s < sl.seq->kv().n_streams(); ++s) {
        const auto got = kept_slots(*sl.seq, sn, s);
        const auto prot = protect_mask(sn.pos[static_cast<size_t>(s)], sl.cfg.sinks, sl.cfg.effective_window(),
                                       sl.cfg.protect_prompt ? sl.prompt : 0);
        const auto n_prot = static_cast<int32_t>(std::count(prot.begin(), prot.end(), true));
        const auto n_before = static_cast<int32_t>(prot.size());
        if (sl.cfg.split == BudgetSplit::Uniform) {
          EXPECT_EQ(static_cast<int32_t>(got.size()), n_before <= sl.cfg.budget ? n_before : std::max(sl.cfg.budget, n_prot))
              << "op " << op << " stream " << s;
        }
        for (size_t j = 0; j < prot.size(); ++j)
          if (prot[j]) {
            ASSERT_TRUE(std::binary_search(got.begin(), got.end(), static_cast<int32_t>(j))) << "protected slot evicted, op " << op;
          }
      }
    }
    ASSERT_EQ(check_pool(pool, all_kv()), "") << "op " << op;
    int64_t held = 0;
    for (auto* k : all_kv()) held += k->pages_held();
    ASSERT_EQ(held, pool.used_pages()) << "op " << op;
    ASSERT_TRUE(sl.seq->check_content()) << "op " << op;
    if (::testing::Test::HasFailure()) break;
  }
  EXPECT_GT(compressions, 200);
  EXPECT_GT(refused, 0);  // the pool is small enough to exercise all-or-nothing appends
  RecordProperty("compressions", compressions);
  RecordProperty("refused_appends", refused);
}
