#include "compress/recall.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

#include "kernels/key_scoring.h"

namespace kvpack::compress {

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The additive fields (counts and times): what add() sums and subtract_counts() takes away, in one list so
// a new counter cannot be added to one and missed by the other.
template <class F>
void for_each_count(RecallStats& a, const RecallStats& b, F f) {
  f(a.checks, b.checks);
  f(a.pages_bounded, b.pages_bounded);
  f(a.pages_read, b.pages_read);
  f(a.pages_recalled, b.pages_recalled);
  f(a.slots_recalled, b.slots_recalled);
  f(a.read_misses, b.read_misses);
  f(a.bytes_read, b.bytes_read);
  f(a.seconds, b.seconds);
  f(a.score_seconds, b.score_seconds);
  f(a.read_seconds, b.read_seconds);
  f(a.measure_seconds, b.measure_seconds);
  f(a.settle_seconds, b.settle_seconds);
  f(a.guard_escalations, b.guard_escalations);
  f(a.guard_fallbacks, b.guard_fallbacks);
  f(a.guard_fallbacks_incomplete, b.guard_fallbacks_incomplete);
  f(a.guard_fallbacks_refused, b.guard_fallbacks_refused);
  f(a.fallback_pages_lost, b.fallback_pages_lost);
  f(a.exact_checks, b.exact_checks);
  f(a.exact_skipped, b.exact_skipped);
  f(a.exact_flips, b.exact_flips);
}
}  // namespace

void RecallStats::add(const RecallStats& o) {
  for_each_count(*this, o, [](auto& x, const auto& y) { x += y; });
  drift_last = o.checks > 0 ? o.drift_last : drift_last;
  drift_max = std::max(drift_max, o.drift_max);
  if (drift_first < 0) drift_first = o.drift_first;
  exact_tv_last = o.exact_checks > 0 ? o.exact_tv_last : exact_tv_last;
  exact_tv_max = std::max(exact_tv_max, o.exact_tv_max);
  if (exact_tv_first < 0) exact_tv_first = o.exact_tv_first;
}

void RecallStats::subtract_counts(const RecallStats& b) {
  for_each_count(*this, b, [](auto& x, const auto& y) { x -= y; });
}

bool RecallStats::add_exact_check(const float* compressed, const float* full, int32_t n_vocab) {
  // Softmax of both rows in f64, then TV = 1/2 sum |p - q|.
  double mc = -std::numeric_limits<double>::infinity(), mf = mc;
  int32_t top_c = 0, top_f = 0;
  for (int32_t i = 0; i < n_vocab; ++i) {
    if (compressed[i] > mc) mc = compressed[i], top_c = i;
    if (full[i] > mf) mf = full[i], top_f = i;
  }
  double zc = 0, zf = 0;
  for (int32_t i = 0; i < n_vocab; ++i) {
    zc += std::exp(static_cast<double>(compressed[i]) - mc);
    zf += std::exp(static_cast<double>(full[i]) - mf);
  }
  double tv = 0;
  for (int32_t i = 0; i < n_vocab; ++i)
    tv += std::abs(std::exp(static_cast<double>(compressed[i]) - mc) / zc - std::exp(static_cast<double>(full[i]) - mf) / zf);
  tv = std::min(1.0, 0.5 * tv);
  const bool flipped = top_c != top_f;
  ++exact_checks;
  exact_flips += flipped ? 1 : 0;
  exact_tv_last = tv;
  exact_tv_max = std::max(exact_tv_max, tv);
  if (exact_tv_first < 0) exact_tv_first = tv;
  return flipped;
}

Recall::Recall(const RecallConfig& cfg, const ModelConfig& model, std::vector<uint8_t> frozen)
    : cfg_(cfg), mc_(model), layer_queries_(static_cast<size_t>(model.n_layer)),
      work_(static_cast<size_t>(model.n_layer) * model.n_head_kv), frozen_(std::move(frozen)) {}

void Recall::score_stream(const kv::SequenceKv& kv, const kv::EvictedKv& cold, int32_t s, const float* attn_lse, StreamWork& w) const {
  const int32_t hd = mc_.head_dim, group = mc_.group();
  const int32_t layer = s / mc_.n_head_kv, kv_head = s % mc_.n_head_kv;
  const std::vector<float>& rows = layer_queries_[static_cast<size_t>(layer)];
  const int32_t n_rows = static_cast<int32_t>(rows.size() / static_cast<size_t>(mc_.q_dim()));
  const int32_t nq = n_rows * group;  // query vectors: row-major (row, head of the group)
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  w.q.resize(static_cast<size_t>(nq) * hd);
  for (int32_t r = 0; r < n_rows; ++r)
    for (int32_t g = 0; g < group; ++g) {
      const float* src = rows.data() + static_cast<size_t>(r) * mc_.q_dim() + static_cast<size_t>(kv_head * group + g) * hd;
      float* dst = w.q.data() + static_cast<size_t>(r * group + g) * hd;
      for (int32_t i = 0; i < hd; ++i) dst[i] = src[i] * scale;
    }
  // The hot mass per query vector: the attention kernel's log-sum-exp of this row when the caller has it
  // (one row), else from the hot logits, which also give each slot's best (the victim order).
  bool have_lse = attn_lse != nullptr && n_rows == 1;
  if (have_lse) {
    w.lse.resize(static_cast<size_t>(nq));
    for (int32_t g = 0; g < group; ++g) {
      const float v = attn_lse[static_cast<size_t>(layer) * mc_.n_head + static_cast<size_t>(kv_head * group + g)];
      have_lse = have_lse && std::isfinite(v);
      w.lse[static_cast<size_t>(g)] = v;
    }
  }
  if (have_lse)
    w.slot_max.clear();  // computed by settle_stream if this stream exchanges
  else
    hot_scores(kv, s, w, true);
  // Cold bounds: log of the bounded share of each page against the hot mass, worst query vector.
  const auto pages = cold.pages(s);
  w.bound.resize(pages.size());
  std::vector<double>& share_sum = w.share_sum;
  share_sum.assign(static_cast<size_t>(nq), 0.0);
  w.page_bound.resize(pages.size() * static_cast<size_t>(nq));
  kernels::digest_bounds(w.q.data(), nq, hd, cold.digests(s).data(), static_cast<int32_t>(pages.size()), w.page_bound.data());
  const int32_t page_size = kv.pool().config().page_size;
  const float log_page = std::log(static_cast<float>(page_size));
  w.log_n.resize(pages.size());
  for (size_t p = 0; p < pages.size(); ++p)
    w.log_n[p] = pages[p].lost || pages[p].n_slots == 0 ? kNegInf
                 : pages[p].n_slots == page_size      ? log_page
                                                      : std::log(static_cast<float>(pages[p].n_slots));
  kernels::page_shares(w.page_bound.data(), w.log_n.data(), w.lse.data(), nq, static_cast<int32_t>(pages.size()), w.bound.data(),
                       share_sum.data());
  // Only pages whose bound passes the read threshold are read (read_pages), at most max_pages of them
  // unless read_all_: order those alone, and only as far as the reads go (a long context's loose bounds
  // pass by the hundred per stream).
  const float threshold = std::log(cfg_.min_share);
  w.order.clear();
  for (size_t p = 0; p < pages.size(); ++p)
    if (w.bound[p] >= threshold) w.order.push_back(static_cast<int32_t>(p));
  const auto by_bound = [&](int32_t a, int32_t b) {
    return w.bound[static_cast<size_t>(a)] > w.bound[static_cast<size_t>(b)] || (w.bound[static_cast<size_t>(a)] == w.bound[static_cast<size_t>(b)] && a < b);
  };
  const size_t reads = read_all_ ? w.order.size() : std::min(w.order.size(), static_cast<size_t>(std::max(0, cfg_.max_pages)));
  std::partial_sort(w.order.begin(), w.order.begin() + static_cast<std::ptrdiff_t>(reads), w.order.end(), by_bound);
  w.order.resize(reads);
}

void Recall::hot_scores(const kv::SequenceKv& kv, int32_t s, StreamWork& w, bool lse) const {
  const int32_t hd = mc_.head_dim, group = mc_.group();
  const int32_t nq = static_cast<int32_t>(w.q.size() / static_cast<size_t>(hd));
  const int32_t n_rows = nq / group;
  const kernels::KvStreamView view = kv.view(s);
  const int32_t n = view.n_slots;
  std::vector<float> logits(static_cast<size_t>(group) * n);
  if (lse) w.lse.assign(static_cast<size_t>(nq), kNegInf);
  w.slot_max.assign(static_cast<size_t>(n), kNegInf);
  for (int32_t r = 0; r < n_rows; ++r) {
    kernels::group_logits(view, w.q.data() + static_cast<size_t>(r * group) * hd, group, 1.0f, logits.data());
    for (int32_t g = 0; g < group; ++g) {
      const float* l = logits.data() + static_cast<size_t>(g) * n;
      for (int32_t j = 0; j < n; ++j) w.slot_max[static_cast<size_t>(j)] = std::max(w.slot_max[static_cast<size_t>(j)], l[j]);
      if (!lse) continue;
      float m = kNegInf;
      for (int32_t j = 0; j < n; ++j) m = std::max(m, l[j]);
      double sum = 0;
      for (int32_t j = 0; j < n; ++j) sum += static_cast<double>(std::exp(l[j] - m));  // f32 exp (<= 0 argument), f64 sum
      w.lse[static_cast<size_t>(r * group + g)] = m + static_cast<float>(std::log(sum));
    }
  }
}

void Recall::read_pages(kv::EvictedKv& cold, size_t rec) {
  // Every stream's pages to read (score_stream's order, at most max_pages unless read_all_), in stream
  // order: one batched tier call for the whole check instead of a lock, an index lookup and a copy each.
  read_refs_.clear();
  read_out_.clear();
  for (size_t s = 0; s < work_.size(); ++s) {
    StreamWork& w = work_[s];
    w.reads.clear();
    if (!frozen_.empty() && frozen_[s] != 0) continue;
    stats_.pages_bounded += static_cast<int64_t>(cold.pages(static_cast<int32_t>(s)).size());
    if (w.records.size() < w.order.size() * rec) w.records.resize(w.order.size() * rec);
    for (size_t i = 0; i < w.order.size(); ++i) {
      read_refs_.push_back({static_cast<int32_t>(s), w.order[i]});
      read_out_.push_back(w.records.data() + i * rec);
    }
  }
  const std::span<const bool> ok = cold.read_many(read_refs_, read_out_);
  // Hits keep their record where it was read to (index = the page's position in w.order; a stream's
  // requests are consecutive in the batch).
  int32_t record = 0;
  for (size_t i = 0; i < read_refs_.size(); ++i) {
    record = i > 0 && read_refs_[i].stream == read_refs_[i - 1].stream ? record + 1 : 0;
    if (!ok[i]) {
      ++stats_.read_misses;
      continue;
    }
    ++stats_.pages_read;
    stats_.bytes_read += rec;
    work_[static_cast<size_t>(read_refs_[i].stream)].reads.push_back({read_refs_[i].page, record});
  }
}

double Recall::measure_stream(const kv::SequenceKv& kv, const kv::EvictedKv& cold, int32_t s, StreamWork& w) const {
  const int32_t hd = mc_.head_dim;
  const int32_t nq = static_cast<int32_t>(w.lse.size());
  const auto& pool = kv.pool();
  const int32_t ps = pool.config().page_size;
  const size_t rec = pool.record_bytes();
  // Exact shares replace the bounds of the pages read. Per query vector: E = sum of shares.
  std::vector<double> exact_sum(static_cast<size_t>(nq), 0.0), bound_of_read(static_cast<size_t>(nq), 0.0);
  w.candidates.clear();
  // One cold page's logits for every query vector, by the kernels that score the hot set (a record lays out
  // its keys as a pool page does): logits[v * n_slots + j] = q_v . k_j, in chunks of 8 query vectors.
  std::vector<float> logits(static_cast<size_t>(nq) * ps);
  for (const StreamWork::Read& r : w.reads) {
    const int32_t p = r.page;
    const uint8_t* record = w.records.data() + static_cast<size_t>(r.record) * rec;
    const kv::EvictedPage page = cold.pages(s)[static_cast<size_t>(p)];
    const kernels::KvStreamView view{&record, page.n_slots, ps, hd, pool.config().kv_type, pool.v_offset()};
    for (int32_t v0 = 0; v0 < nq; v0 += 8)
      kernels::group_logits(view, w.q.data() + static_cast<size_t>(v0) * hd, std::min(8, nq - v0), 1.0f,
                            logits.data() + static_cast<size_t>(v0) * page.n_slots);
    float best = kNegInf;
    double page_max_share = 0;
    for (int32_t v = 0; v < nq; ++v) {
      const float* l = logits.data() + static_cast<size_t>(v) * page.n_slots;
      double share = 0;
      for (int32_t j = 0; j < page.n_slots; ++j) {
        best = std::max(best, l[j]);
        share += std::exp(std::min(80.0, static_cast<double>(l[j] - w.lse[static_cast<size_t>(v)])));
      }
      exact_sum[static_cast<size_t>(v)] += share;
      page_max_share = std::max(page_max_share, share);
      const float b = w.page_bound[static_cast<size_t>(p) * static_cast<size_t>(nq) + static_cast<size_t>(v)];
      bound_of_read[static_cast<size_t>(v)] +=
          std::exp(std::min(80.0, static_cast<double>(b + std::log(static_cast<float>(page.n_slots)) - w.lse[static_cast<size_t>(v)])));
    }
    if (page_max_share >= cfg_.min_share) w.candidates.push_back({p, best, r.record, page_max_share});
  }
  // Drift of this stream: the bounded total (score_stream) with the pages read replaced by their exact share.
  double drift = 0;
  for (int32_t v = 0; v < nq; ++v) {
    const double e = std::max(0.0, w.share_sum[static_cast<size_t>(v)] - bound_of_read[static_cast<size_t>(v)]) + exact_sum[static_cast<size_t>(v)];
    drift = std::max(drift, e / (1.0 + e));
  }
  // The victim order of a stream that will exchange, if the hot mass came from the attention kernel.
  if (!w.candidates.empty() && cfg_.bring_back && w.slot_max.empty()) hot_scores(kv, s, w, false);
  return drift;
}

double Recall::settle_stream(kv::SequenceKv& kv, kv::EvictedKv& cold, int32_t s, const Protection& prot, StreamWork& w) {
  const auto& pool = kv.pool();
  const size_t row = pool.slot_bytes();
  const size_t voff = pool.v_offset();
  const int32_t ps = pool.config().page_size;
  const size_t rec = pool.record_bytes();
  const size_t pos_off = rec - sizeof(int32_t) * static_cast<size_t>(ps);
  const double drift = w.drift;
  std::vector<Candidate>& recall = w.candidates;
  if (recall.empty() || !cfg_.bring_back) return drift;

  // The exchange: the lowest-scoring unprotected hot slots go down, as many as the recalled pages hold,
  // as long as each recalled page's best slot beats the victims'. Pinned slots go down only for a page
  // whose share reaches pin_override_share, and only once the unpinned ones are used up.
  const int32_t n = kv.n_slots(s);
  std::vector<int32_t>& eligible = w.eligible;
  std::vector<int32_t>& pinned = w.pinned;
  eligible.clear();
  pinned.clear();
  // Never the slots of the query rows scored (they may be recomputed: SequenceCompressor::before_sample),
  // whatever the window says.
  const int32_t tail_pos = kv.next_pos() - keep_tail_;
  std::vector<int32_t>& pos = w.positions;
  kv.copy_positions(s, pos);
  for (int32_t j = prot.sinks; j < n - std::max(prot.window, 1); ++j) {
    const int32_t p = pos[static_cast<size_t>(j)];
    if (p >= tail_pos || (prot.prompt_end != 0 && p < prot.prompt_end)) continue;
    (std::binary_search(prot.pinned.begin(), prot.pinned.end(), p) ? pinned : eligible).push_back(j);
  }
  // Victims are taken from the front, at most as many as the candidates hold: order only that far.
  // Pins yield only when the next check is the next token (RecallConfig::pin_override_share).
  const double override_share = cfg_.every == 1 ? cfg_.pin_override_share : std::numeric_limits<double>::infinity();
  size_t wanted = 0;
  bool strong = false;
  for (const Candidate& c : recall) {
    wanted += static_cast<size_t>(cold.pages(s)[static_cast<size_t>(c.page)].n_slots);
    strong = strong || c.share >= override_share;
  }
  const auto by_score = [&](int32_t a, int32_t b) {
    return w.slot_max[static_cast<size_t>(a)] < w.slot_max[static_cast<size_t>(b)] || (w.slot_max[static_cast<size_t>(a)] == w.slot_max[static_cast<size_t>(b)] && a < b);
  };
  std::partial_sort(eligible.begin(), eligible.begin() + static_cast<std::ptrdiff_t>(std::min(wanted, eligible.size())), eligible.end(), by_score);
  if (!strong) pinned.clear();
  std::partial_sort(pinned.begin(), pinned.begin() + static_cast<std::ptrdiff_t>(std::min(wanted, pinned.size())), pinned.end(), by_score);
  std::sort(recall.begin(), recall.end(), [](const Candidate& a, const Candidate& b) { return a.best > b.best; });
  std::vector<int32_t> victims;
  std::vector<kv::SequenceKv::InsertedSlot> inserted;
  std::vector<int32_t> recalled_pages;
  size_t next_free = 0, next_pinned = 0;
  for (const Candidate& c : recall) {
    const size_t need = static_cast<size_t>(cold.pages(s)[static_cast<size_t>(c.page)].n_slots);
    const size_t from_free = std::min(need, eligible.size() - next_free);
    const size_t from_pinned = need - from_free;
    if (from_pinned > 0 && (c.share < override_share || next_pinned + from_pinned > pinned.size())) {
      if (!strong) break;  // nothing may take pinned slots: no later page fits either (as without pins)
      continue;
    }
    // The page must beat the best of the slots it would displace (each list is in increasing score).
    float worst = -std::numeric_limits<float>::infinity();
    if (from_free > 0) worst = w.slot_max[static_cast<size_t>(eligible[next_free + from_free - 1])];
    if (from_pinned > 0) worst = std::max(worst, w.slot_max[static_cast<size_t>(pinned[next_pinned + from_pinned - 1])]);
    if (worst >= c.best) continue;
    for (size_t j = 0; j < from_free; ++j) victims.push_back(eligible[next_free++]);
    for (size_t j = 0; j < from_pinned; ++j) victims.push_back(pinned[next_pinned++]);
    const uint8_t* record = w.records.data() + static_cast<size_t>(c.record) * rec;
    const auto* rpos = reinterpret_cast<const int32_t*>(record + pos_off);
    for (size_t j = 0; j < need; ++j)
      inserted.push_back({record + j * row, record + voff + j * row, rpos[j]});
    recalled_pages.push_back(c.page);
  }
  if (inserted.empty()) return drift;
  std::sort(victims.begin(), victims.end());
  std::sort(inserted.begin(), inserted.end(), [](const auto& a, const auto& b) { return a.pos < b.pos; });
  std::vector<int32_t> keep;
  keep.reserve(static_cast<size_t>(n));
  size_t vi = 0;
  for (int32_t j = 0; j < n; ++j) {
    if (vi < victims.size() && victims[vi] == j) {
      ++vi;
      continue;
    }
    keep.push_back(j);
  }
  cold.add(kv, s, keep);  // the displaced slots go down before the stream is rebuilt
  if (!kv.splice_stream(s, keep, inserted)) return drift;  // no page for it: unchanged (victims stay staged: harmless copies)
  for (int32_t p : recalled_pages) cold.forget(s, p);
  stats_.pages_recalled += static_cast<int64_t>(recalled_pages.size());
  stats_.slots_recalled += static_cast<int64_t>(inserted.size());
  return drift;
}

int64_t Recall::restore_all(kv::SequenceKv& kv, kv::EvictedKv& cold, bool& complete) {
  return bring_all(kv, cold, true, complete);
}

bool Recall::copy_all_into(kv::SequenceKv& dst, kv::EvictedKv& cold) {
  bool complete = false;
  bring_all(dst, cold, false, complete);
  return complete;
}

int64_t Recall::bring_all(kv::SequenceKv& kv, kv::EvictedKv& cold, bool forget, bool& complete) {
  complete = true;
  const auto& pool = kv.pool();
  const size_t row = pool.slot_bytes();
  const size_t voff = pool.v_offset();
  const int32_t ps = pool.config().page_size;
  const size_t pos_off = pool.record_bytes() - sizeof(int32_t) * static_cast<size_t>(ps);
  int64_t restored = 0;
  std::vector<uint8_t> records;
  std::vector<kv::SequenceKv::InsertedSlot> insert;
  std::vector<int32_t> keep, pages;
  std::vector<kv::EvictedKv::PageRef> refs;
  std::vector<uint8_t*> outs;
  for (int32_t s = 0; s < cold.n_streams(); ++s) {
    const auto list = cold.pages(s);
    pages.clear();
    for (size_t p = 0; p < list.size(); ++p)
      if (!list[p].recalled) pages.push_back(static_cast<int32_t>(p));
    if (pages.empty()) continue;
    records.resize(pages.size() * pool.record_bytes());
    insert.clear();
    // One batched tier call per stream (the host tier spreads its copies over its threads).
    refs.clear();
    outs.clear();
    for (size_t i = 0; i < pages.size(); ++i) {
      refs.push_back({s, pages[i]});
      outs.push_back(records.data() + i * pool.record_bytes());
    }
    const std::span<const bool> ok = cold.read_many(refs, outs);
    std::vector<int32_t> got;
    for (size_t i = 0; i < pages.size(); ++i) {
      if (!ok[i]) {
        if (forget) ++stats_.fallback_pages_lost;
        complete = false;
        continue;
      }
      got.push_back(pages[i]);
      const uint8_t* rec = outs[i];
      const auto* pos = reinterpret_cast<const int32_t*>(rec + pos_off);
      for (int32_t j = 0; j < list[static_cast<size_t>(pages[i])].n_slots; ++j)
        insert.push_back({rec + static_cast<size_t>(j) * row, rec + voff + static_cast<size_t>(j) * row, pos[j]});
    }
    if (!forget && !complete) return restored;  // a copy with a page missing is of no use: stop reading
    std::sort(insert.begin(), insert.end(), [](const auto& a, const auto& b) { return a.pos < b.pos; });
    keep.resize(static_cast<size_t>(kv.n_slots(s)));
    std::iota(keep.begin(), keep.end(), 0);
    if (!kv.splice_stream(s, keep, insert)) {  // the pool has no room: stays compressed
      complete = false;
      continue;
    }
    if (forget)
      for (int32_t p : got) cold.forget(s, p);
    restored += static_cast<int64_t>(insert.size());
  }
  return restored;
}

int64_t Recall::run(kv::SequenceKv& kv, kv::EvictedKv& cold, const QueryWindow& queries, const std::vector<Protection>& prot,
                    int32_t rows_wanted, ThreadPool* pool, const float* attn_lse) {
  const double t0 = now_s();
  const int64_t before = stats_.slots_recalled;
  for (int32_t l = 0; l < mc_.n_layer; ++l) {
    queries.recent(l, rows_wanted, layer_queries_[static_cast<size_t>(l)]);  // the latest rows only (the window holds more)
  }
  const int32_t n_streams = static_cast<int32_t>(work_.size());
  if (queries.count() == 0) return 0;
  auto is_frozen = [&](int32_t s) { return !frozen_.empty() && frozen_[static_cast<size_t>(s)] != 0; };
  auto score = [&](int task, int) {
    if (!is_frozen(task)) score_stream(kv, cold, task, attn_lse, work_[static_cast<size_t>(task)]);
  };
  if (pool != nullptr) {
    pool->run(n_streams, score);
  } else {
    for (int32_t s = 0; s < n_streams; ++s) score(s, 0);
  }
  const double t1 = now_s();
  // Reads in one batch in stream order (the tier sees the same requests in the same order whatever the
  // pool), the exact measurements in parallel, the exchanges again here in stream order.
  read_pages(cold, kv.pool().record_bytes());
  const double t2 = now_s();
  auto measure = [&](int task, int) {
    if (!is_frozen(task)) work_[static_cast<size_t>(task)].drift = measure_stream(kv, cold, task, work_[static_cast<size_t>(task)]);
  };
  if (pool != nullptr) {
    pool->run(n_streams, measure);
  } else {
    for (int32_t s = 0; s < n_streams; ++s) measure(s, 0);
  }
  const double t3 = now_s();
  double drift_sum = 0;
  int32_t scored = 0;
  keep_tail_ = std::max(1, std::min(rows_wanted, queries.count()));
  for (int32_t s = 0; s < n_streams; ++s) {
    if (is_frozen(s)) continue;
    drift_sum += settle_stream(kv, cold, s, prot[static_cast<size_t>(s)], work_[static_cast<size_t>(s)]);
    ++scored;
  }
  cold.commit();
  ++stats_.checks;
  stats_.drift_last = scored > 0 ? drift_sum / scored : 0.0;
  stats_.drift_max = std::max(stats_.drift_max, stats_.drift_last);
  if (stats_.drift_first < 0) stats_.drift_first = stats_.drift_last;
  const double t4 = now_s();
  stats_.seconds += t4 - t0;
  stats_.score_seconds += t1 - t0;
  stats_.read_seconds += t2 - t1;
  stats_.measure_seconds += t3 - t2;
  stats_.settle_seconds += t4 - t3;
  return stats_.slots_recalled - before;
}

}  // namespace kvpack::compress
