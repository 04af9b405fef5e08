// Shared by the tests/compress_*_test.cpp files: a tiny ModelConfig, a page pool with 4-slot pages,
// and a SequenceKv whose K/V rows are seeded random numbers written straight into the pages (no
// model file), with the ground truth kept for checks; reference selection and generic checks.
//
// Tokens are appended at positions 0, 1, ..., so the surviving positions (kv.position) name the kept
// original slots. Every compression can also be checked for: protected slots (sinks, window, prompt)
// kept, strictly increasing positions (order preserved), K/V content moved with its slot, exact
// counts, and stats consistent with the pool's page counts.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstring>
#include <functional>
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
#include "kv/page_pool.h"
#include "kv/sequence_kv.h"
#include "model/forward.h"
#include "model/model.h"
#include "util/half.h"
#include "util/thread_pool.h"

using namespace kvpack;
using namespace kvpack::compress;

namespace kvpack::compress_test {
using namespace kvpack::compress;

constexpr int32_t kPageSize = 4;
constexpr int32_t kHeadDim = 8;

inline ModelConfig tiny_model(bool neox, int32_t layers = 2, int32_t heads = 4, int32_t kv_heads = 2) {
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

inline kv::PoolConfig pool_config(int64_t pages = 8192) {
  kv::PoolConfig p;
  p.page_size = kPageSize;
  p.head_dim = kHeadDim;
  p.kv_type = DType::F32;
  p.max_pages = pages;
  p.pages_per_chunk = 7;
  return p;
}

inline CompressConfig make_cfg(PolicyKind p, int32_t budget, int32_t sinks, int32_t window, int32_t interval = 16) {
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
  // Called for every new key after it is drawn (stream, position, key): lets a test shape the keys.
  void set_key_hook(std::function<void(int32_t, int32_t, std::vector<float>&)> hook) { hook_ = std::move(hook); }

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
        if (hook_) hook_(s, pos0 + i, k);
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
  std::function<void(int32_t, int32_t, std::vector<float>&)> hook_;
};

// State of every stream just before a compression: positions and keys (float64), from the ground truth.
struct Snapshot {
  std::vector<std::vector<int32_t>> pos;                   // [stream][slot]
  std::vector<std::vector<std::vector<double>>> keys;      // [stream][slot][dim]
  int64_t total_slots = 0, used_pages = 0, pages_held = 0;
  int64_t next_pos = 0;
};

inline Snapshot snapshot(Seq& seq) {
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

// Slots (indices into the snapshot) that survived in stream s.
inline std::vector<int32_t> kept_slots(Seq& seq, const Snapshot& sn, int32_t s) {
  std::vector<int32_t> out;
  const auto& before = sn.pos[static_cast<size_t>(s)];
  for (int32_t p : seq.positions(s)) {
    auto it = std::lower_bound(before.begin(), before.end(), p);
    out.push_back(it != before.end() && *it == p ? static_cast<int32_t>(it - before.begin()) : -1);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Reference selection: protected slots, then the best others (higher score; equal scores: the more
// recent slot) until `budget`, returned in ascending order.
inline std::vector<bool> protect_mask(const std::vector<int32_t>& pos, int32_t sinks, int32_t window, int32_t prompt_end) {
  const auto n = static_cast<int32_t>(pos.size());
  std::vector<bool> m(pos.size());
  for (int32_t j = 0; j < n; ++j) m[static_cast<size_t>(j)] = j < sinks || j >= n - window || pos[static_cast<size_t>(j)] < prompt_end;
  return m;
}

inline std::vector<int32_t> ref_topk(const std::vector<double>& score, const std::vector<bool>& prot, int32_t budget) {
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

inline std::string fmt(const std::vector<int32_t>& v) {
  std::ostringstream o;
  o << "{";
  for (size_t i = 0; i < v.size(); ++i) o << (i ? "," : "") << v[i];
  o << "}";
  return o.str();
}

// got == want, or got is an equally valid top-k whose differences lie within `eps` of the cut-off
// (float32 in the engine vs float64 here). Protected slots and the count are always exact.
inline ::testing::AssertionResult keep_matches(const std::vector<int32_t>& got, const std::vector<int32_t>& want,
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
inline void expect_keep_sets(Seq& seq, const Snapshot& sn, const std::vector<std::vector<double>>& score,
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
inline void expect_stats(Seq& seq, const Snapshot& sn, const CompressionStats& before, const CompressionStats& after) {
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

inline std::string check_pool(const kv::PagePool& pool, const std::vector<kv::SequenceKv*>& seqs) {
  std::vector<std::span<const kv::PageId>> tables;
  for (auto* s : seqs)
    for (int32_t i = 0; i < s->n_streams(); ++i) tables.push_back(s->page_table(i));
  return pool.check(tables);
}
}  // namespace kvpack::compress_test
