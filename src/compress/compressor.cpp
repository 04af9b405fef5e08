#include "compress/compressor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace kvpack::compress {
namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::vector<uint8_t> frozen_streams(const CompressConfig& cfg, const ModelConfig& m) {
  std::vector<uint8_t> f;
  if (cfg.window_layers || m.swa_window <= 0) return f;
  f.assign(static_cast<size_t>(m.n_layer) * m.n_head_kv, 0);
  for (int32_t l = 0; l < m.n_layer; ++l)
    for (int32_t h = 0; h < m.n_head_kv; ++h) f[static_cast<size_t>(l * m.n_head_kv + h)] = m.is_swa(l) ? 1 : 0;
  return f;
}

int32_t count_unfrozen(const std::vector<uint8_t>& f, int32_t n_streams) {
  return f.empty() ? n_streams : static_cast<int32_t>(std::count(f.begin(), f.end(), uint8_t{0}));
}
}  // namespace

namespace {
// The additive fields (counts and times), for add() and subtract_counts() alike (recall.cpp: the same for
// RecallStats).
template <class F>
void for_each_count(CompressionStats& a, const CompressionStats& b, F f) {
  f(a.events, b.events);
  f(a.evicted_slots, b.evicted_slots);
  f(a.freed_pages, b.freed_pages);
  f(a.evicted_bytes, b.evicted_bytes);
  f(a.freed_bytes, b.freed_bytes);
  f(a.seconds, b.seconds);
  f(a.score_seconds, b.score_seconds);
  f(a.cold_seconds, b.cold_seconds);
  f(a.deferred_streams, b.deferred_streams);
}
}  // namespace

void CompressionStats::add(const CompressionStats& o) {
  for_each_count(*this, o, [](auto& x, const auto& y) { x += y; });
  max_streams_slots = std::max(max_streams_slots, o.max_streams_slots);
  recall.add(o.recall);
}

void CompressionStats::subtract_counts(const CompressionStats& b) {
  for_each_count(*this, b, [](auto& x, const auto& y) { x -= y; });
  recall.subtract_counts(b.recall);
}

SequenceCompressor::SequenceCompressor(const CompressConfig& cfg, const ModelConfig& model, const QueryStats* stats,
                                       int32_t prompt_len, ThreadPool* pool)
    : cfg_(cfg), mc_(model), qstats_(stats), prompt_len_(prompt_len), pool_(pool), n_streams_(model.n_layer * model.n_head_kv),
      frozen_(frozen_streams(cfg, model)), n_compressed_streams_(count_unfrozen(frozen_, n_streams_)),
      schedule_(cfg, n_compressed_streams_), splitter_(cfg, model.n_layer, model.n_head_kv) {
  if (!cfg_.enabled()) return;
  cfg_.validate(model, stats);
  scorer_ = make_scorer(cfg_, mc_);
  needs_ = scorer_->needs();
  const bool recall_on = cfg_.recall.enabled && !needs_.key_mass;  // H2O's mass is per slot: no splicing under it
  // The window holds what the scorer and the recall checks read: prefill_rows at the end of prefill,
  // rows afterwards.
  queries_ = QueryWindow(mc_.n_layer, mc_.q_dim(),
                         std::max(needs_.query_window, recall_on ? std::max(cfg_.recall.rows, cfg_.recall.prefill_rows) : 0));
  if (recall_on) recall_ = Recall(cfg_.recall, mc_, frozen_);
  if (needs_.key_mass) mass_ = KeyMass(n_streams_);
  scores_.resize(static_cast<size_t>(n_streams_));
}

// Every member is a value except the scorer (cloned) and the evicted sink (not shared: fork() clears it);
// the per-event scratch is not state (candidates_ even points into scores_), so the copy starts it empty.
SequenceCompressor::SequenceCompressor(const SequenceCompressor& o)
    : ForwardObserver(o), cfg_(o.cfg_), mc_(o.mc_), qstats_(o.qstats_), prompt_len_(o.prompt_len_),
      protected_prefix_(o.protected_prefix_), pool_(o.pool_), evicted_(nullptr), n_streams_(o.n_streams_),
      frozen_(o.frozen_), n_compressed_streams_(o.n_compressed_streams_), stats_(o.stats_), schedule_(o.schedule_), scorer_(o.scorer_ ? o.scorer_->clone() : nullptr), needs_(o.needs_),
      splitter_(o.splitter_), queries_(o.queries_), mass_(o.mass_), naive_(o.naive_), recall_(o.recall_),
      samples_(o.samples_), recomputing_(o.recomputing_), exact_due_(o.exact_due_), first_event_pos_(o.first_event_pos_),
      fallen_back_(o.fallen_back_), fallback_allowed_(o.fallback_allowed_), fallback_refused_(o.fallback_refused_),
      naive_peak_pages_(o.naive_peak_pages_), pinned_(o.pinned_), scores_(o.scores_.size()) {}  // per-event scratch starts empty

std::unique_ptr<SequenceCompressor> SequenceCompressor::fork() const {
  return std::unique_ptr<SequenceCompressor>(new SequenceCompressor(*this));
}

void SequenceCompressor::prepare(kv::SequenceKv& kv, BatchItem& item) {
  if (cfg_.enabled() && needs_.key_mass) mass_.prepare(kv, item);
  // Recall's hot mass for a one-token step comes from the attention kernel (Recall::run's attn_lse), when
  // its logits are in recall's units (scale 1 / sqrt(head_dim)).
  attn_lse_fresh_ = false;
  const float std_scale = 1.0f / std::sqrt(static_cast<float>(mc_.head_dim));
  if (cfg_.enabled() && recall_.config().enabled && evicted_ != nullptr && item.tokens.size() == 1 &&
      (mc_.attn_scale <= 0.0f || mc_.attn_scale == std_scale)) {
    attn_lse_.assign(static_cast<size_t>(mc_.n_layer) * static_cast<size_t>(mc_.n_head), std::numeric_limits<float>::quiet_NaN());
    item.attn_lse = attn_lse_.data();
    attn_lse_fresh_ = true;
  }
}

void SequenceCompressor::on_query_post_rope(int32_t, int32_t layer, const float* q, int32_t n_tokens, int64_t stride) {
  queries_.on_query(layer, q, n_tokens, stride);
}

int64_t SequenceCompressor::live_total(const kv::SequenceKv& kv) const {
  if (frozen_.empty()) return kv.total_slots();
  int64_t n = 0;
  for (int32_t s = 0; s < n_streams_; ++s)
    if (!frozen(s)) n += kv.n_slots(s);
  return n;
}

int32_t SequenceCompressor::tokens_until_trigger(const kv::SequenceKv& kv) const {
  return schedule_.tokens_until_event(live_total(kv));
}

bool SequenceCompressor::fires_after(const kv::SequenceKv& kv, int32_t n_new, bool prompt_end) const {
  return schedule_.fires(live_total(kv) + static_cast<int64_t>(n_compressed_streams_) * n_new, prompt_end);
}

bool SequenceCompressor::after_forward(kv::SequenceKv& kv, bool prefill_done) {
  return after_step(kv, schedule_.fires(live_total(kv), prefill_done));
}

bool SequenceCompressor::after_step(kv::SequenceKv& kv, bool compress_now) {
  if (fallen_back_) return false;  // the drift guard gave this request its full KV back
  if (cfg_.naive) naive_peak_pages_ = std::max(naive_peak_pages_, accounted_pages(kv));
  if (compress_now) compress(kv);
  return compress_now;
}

int32_t SequenceCompressor::before_sample(kv::SequenceKv& kv) {
  if (!cfg_.enabled() || !recall_.config().enabled || evicted_ == nullptr) return 0;
  if (recomputing_) {
    recomputing_ = false;
    return 0;
  }
  const int64_t n = samples_++;
  const bool check = n == 0 || n % std::max(1, cfg_.recall.every) == 0;
  const int32_t exact_every = cfg_.recall.exact_every;
  // After a fallback the request is full KV; after a refused one (the pool cannot hold it) a guard has
  // nothing left to act on, so its checks stop (the exact check alone, --kv-drift-exact, goes on measuring).
  const bool guard_done = fallen_back_ || (fallback_refused_ && cfg_.recall.exact_guard > 0);
  exact_due_ = cfg_.recall.exact && !guard_done && (exact_every > 0 ? n % exact_every == 0 : check);
  if (!check) return 0;
  prot_scratch_.resize(static_cast<size_t>(n_streams_));
  for (int32_t s = 0; s < n_streams_; ++s) prot_scratch_[static_cast<size_t>(s)] = protection(kv, s);
  const int32_t rows = n == 0 ? cfg_.recall.prefill_rows : cfg_.recall.rows;
  int64_t got = recall_.run(kv, *evicted_, queries_, prot_scratch_, rows, pool_, attn_lse_fresh_ ? attn_lse_.data() : nullptr);
  attn_lse_fresh_ = false;  // exchanges change the hot set: a second run recomputes
  const float guard = cfg_.recall.guard;
  if (guard > 0 && !fallback_refused_ && recall_.stats().drift_last > guard) {
    // Recall more: every cold page whose bound passes is read and measured exactly.
    ++recall_.mutable_stats().guard_escalations;
    recall_.set_read_all(true);
    got += recall_.run(kv, *evicted_, queries_, prot_scratch_, rows, pool_);
    recall_.set_read_all(false);
    if (recall_.stats().drift_last > guard) got += fall_back(kv);  // still above: full KV for this request
  }
  stats_.recall = recall_.stats();
  if (got == 0) return 0;
  // The newest tokens whose slots are the last ones of every stream, in order, up to the rows scored:
  // those can be dropped and computed again over the recalled keys. After a fallback to full KV, every
  // token since the first compression event (as the exact guard does, record_exact_check).
  const int32_t want = fallen_back_ && first_event_pos_ >= 0 ? std::max(rows, kv.next_pos() - first_event_pos_) : rows;
  const int32_t tail = droppable_tail(kv, want);
  if (tail == 0) return 0;
  evicted_->forget_from(kv.next_pos() - tail);  // cold copies of those positions would be duplicates
  recomputing_ = true;
  return tail;
}

int64_t SequenceCompressor::fall_back(kv::SequenceKv& kv) {
  RecallStats& rs = recall_.mutable_stats();
  if (!fallback_allowed_) {
    if (!fallback_refused_) ++rs.guard_fallbacks_refused;
    fallback_refused_ = true;
    return 0;
  }
  bool complete = false;
  const int64_t got = recall_.restore_all(kv, *evicted_, complete);
  ++rs.guard_fallbacks;
  if (!complete) ++rs.guard_fallbacks_incomplete;  // the pool was full just now, or the tier lost pages
  fallen_back_ = true;
  return got;
}

int32_t SequenceCompressor::droppable_tail(const kv::SequenceKv& kv, int32_t want) const {
  int32_t tail = std::min(want, kv.next_pos());
  for (int32_t s = 0; s < n_streams_ && tail > 0; ++s) {
    const int32_t len = kv.n_slots(s);
    int32_t ok = 0;
    while (ok < tail && ok < len && kv.position(s, len - 1 - ok) == kv.next_pos() - 1 - ok) ++ok;
    tail = ok;
  }
  return tail;
}

bool SequenceCompressor::take_exact_check_due() {
  const bool due = exact_due_ && !recomputing_;
  if (due) exact_due_ = false;
  return due;
}

bool SequenceCompressor::copy_cold_into(kv::SequenceKv& fork) {
  return evicted_ != nullptr && recall_.copy_all_into(fork, *evicted_);
}

int32_t SequenceCompressor::record_exact_check(kv::SequenceKv& kv, const float* compressed_logits, const float* full_logits,
                                               int32_t n_vocab) {
  RecallStats& rs = recall_.mutable_stats();
  const bool flipped = rs.add_exact_check(compressed_logits, full_logits, n_vocab);
  int32_t recompute = 0;
  const bool flagged = flipped || rs.exact_tv_last >= static_cast<double>(cfg_.recall.exact_guard);
  if (cfg_.recall.exact_guard > 0 && flagged && evicted_ != nullptr && kv.next_pos() > 0) {
    // The evicted keys change what this request would emit: full KV from here on. Every token from the
    // first compression event on was computed over a hot set with keys missing (during prefill, most of
    // the prompt): with every key back they are dropped and computed again, so the request continues
    // exactly as a full-KV run would (one prefill's worth of work). Where a stream cannot give back that
    // tail (a pool too small for the whole KV, a sliding-window layer's released pages) as much of it as
    // can be, at least the newest token.
    fall_back(kv);
    if (fallen_back_) {
      recomputing_ = true;  // the before_sample after the recompute runs no check
      const int32_t since_event = first_event_pos_ >= 0 ? kv.next_pos() - first_event_pos_ : 1;
      recompute = std::max(1, droppable_tail(kv, std::max(1, since_event)));
    }
  }
  stats_.recall = recall_.stats();
  return recompute;
}

void SequenceCompressor::record_exact_skip() {
  ++recall_.mutable_stats().exact_skipped;
  stats_.recall = recall_.stats();
}

int64_t SequenceCompressor::cow_pages(const kv::SequenceKv& kv) const {
  if (!cfg_.enabled()) return 0;
  int64_t n = 0;
  for (int32_t s = 0; s < n_streams_; ++s)
    if (!frozen(s)) n += kv.shared_pages_in(s, protected_prefix_, kv.n_slots(s));
  return n;
}

int64_t SequenceCompressor::accounted_pages(const kv::SequenceKv& kv) const {
  if (!cfg_.enabled() || !cfg_.naive || schedule_.events() == 0) return kv.pages_held();
  int64_t pages = 0;
  for (int32_t s = 0; s < n_streams_; ++s) pages += naive_.pages(s, kv.n_slots(s));
  return pages;
}

int64_t SequenceCompressor::peak_accounted_pages(const kv::SequenceKv& kv) const {
  if (!cfg_.enabled() || !cfg_.naive) return kv.pages_held();
  return std::max(naive_peak_pages_, accounted_pages(kv));
}

Protection SequenceCompressor::protection(const kv::SequenceKv& kv, int32_t s) const {
  Protection p;
  p.sinks = cfg_.sinks;
  p.window = cfg_.effective_window();
  p.prompt_end = cfg_.protect_prompt ? prompt_len_ : 0;
  // The prompt blocks in the prefix cache are protected like sinks: their pages are shared (read-only),
  // and evicting from them would free nothing anyway. The scheduler says how far they reach
  // (set_protected_prefix) rather than this looking at which pages happen to be shared now, so the keep
  // sets do not depend on other requests or on a swap that brought the pages back as private copies.
  p.sinks = std::max(p.sinks, std::min(kv.n_slots(s), protected_prefix_));
  if (static_cast<size_t>(s) < pinned_.size()) p.pinned = pinned_[static_cast<size_t>(s)];
  return p;
}

void SequenceCompressor::compress(kv::SequenceKv& kv) {
  if (!cfg_.enabled()) return;
  if (first_event_pos_ < 0) first_event_pos_ = kv.next_pos();  // every token before it saw every key
  attn_lse_fresh_ = false;  // the hot set changes
  const double t0 = now_s();
  scorer_->score(ScoringInputs{kv, &queries_, needs_.key_mass ? &mass_ : nullptr, qstats_, pool_, frozen_}, scores_);
  const double t1 = now_s();

  // Select: protection and budgets over the score vectors.
  CompressionStats ev;
  ev.events = 1;
  candidates_.resize(static_cast<size_t>(n_streams_));
  positions_.resize(static_cast<size_t>(n_streams_));
  for (int32_t s = 0; s < n_streams_; ++s) {
    StreamCandidates& c = candidates_[static_cast<size_t>(s)];
    if (frozen(s)) {  // no candidates: nothing is selected, nothing read
      c = StreamCandidates{};
      continue;
    }
    ev.max_streams_slots = std::max<int64_t>(ev.max_streams_slots, kv.n_slots(s));
    c.scores = scores_[static_cast<size_t>(s)];
    c.prot = protection(kv, s);
    c.positions = {};
    if (c.prot.prompt_end > 0) {
      auto& pos = positions_[static_cast<size_t>(s)];
      pos.resize(static_cast<size_t>(kv.n_slots(s)));
      for (int32_t j = 0; j < kv.n_slots(s); ++j) pos[static_cast<size_t>(j)] = kv.position(s, j);
      c.positions = pos;
    }
  }
  splitter_.select(candidates_, keeps_, pool_);
  // The kept slots the policy pinned (Scorer::pin_score), by position: recall leaves them in place.
  const float pin = scorer_->pin_score();
  const bool pins = pin < std::numeric_limits<float>::infinity();
  pinned_.resize(static_cast<size_t>(n_streams_));
  for (int32_t s = 0; s < n_streams_; ++s) {
    auto& pinned = pinned_[static_cast<size_t>(s)];
    pinned.clear();
    if (!pins || frozen(s)) continue;
    const auto& sc = scores_[static_cast<size_t>(s)];
    for (int32_t j : keeps_[static_cast<size_t>(s)])
      if (sc[static_cast<size_t>(j)] >= pin) pinned.push_back(kv.position(s, j));
    std::sort(pinned.begin(), pinned.end());
  }

  // Compact: survivors slide forward, tail pages go back to the pool; the H2O mass moves with them.
  const uint64_t slot_kv_bytes = 2 * kv.pool().slot_bytes();
  const uint64_t page_bytes = kv.pool().page_bytes();
  if (cfg_.naive && schedule_.events() == 0) naive_ = NaiveLayout(n_streams_, kv.pool().config().page_size);
  // Streams that need no copy-on-write are compacted in batches whose slides run in parallel
  // (SequenceKv::compact_streams); a stream that does need copies flushes the batch first and goes alone,
  // so every check of free pages sees exactly what a stream-by-stream loop would.
  batch_streams_.clear();
  batch_slots_.clear();
  batch_keeps_.clear();
  auto account = [&](int32_t s, int32_t n, int64_t compacted) {  // n: the stream's slots before the event
    const auto& keep = keeps_[static_cast<size_t>(s)];
    // Naive mode reports what a non-compacting allocator would have freed instead.
    const int64_t freed = cfg_.naive ? naive_.evict(s, keep) : compacted;
    ev.evicted_slots += n - static_cast<int64_t>(keep.size());
    ev.evicted_bytes += static_cast<uint64_t>(n - static_cast<int64_t>(keep.size())) * slot_kv_bytes;
    ev.freed_pages += freed;
    ev.freed_bytes += static_cast<uint64_t>(freed) * page_bytes;
  };
  auto flush_batch = [&] {
    if (batch_streams_.empty()) return;
    if (evicted_ != nullptr) {  // the batch's evicted slots to the cold tier before the survivors slide over them
      const double c0 = now_s();
      evicted_->add_many(kv, batch_streams_, batch_keeps_, pool_);
      ev.cold_seconds += now_s() - c0;
    }
    batch_freed_.assign(batch_streams_.size(), 0);
    kv.compact_streams(batch_streams_, batch_keeps_, pool_, batch_freed_);
    for (size_t i = 0; i < batch_streams_.size(); ++i) account(batch_streams_[i], batch_slots_[i], batch_freed_[i]);
    batch_streams_.clear();
    batch_slots_.clear();
    batch_keeps_.clear();
  };
  for (int32_t s = 0; s < n_streams_; ++s) {
    if (frozen(s)) continue;  // a sliding-window layer: left as it is
    const auto& keep = keeps_[static_cast<size_t>(s)];
    const int32_t n = kv.n_slots(s);
    if (cfg_.naive) naive_.sync(s, n);
    if (static_cast<int32_t>(keep.size()) >= n) continue;
    const int64_t copies = kv.compaction_copies(s, keep);
    if (copies > 0) flush_batch();  // the pages the batch frees count for this stream's check
    if (copies > kv.pool().free_pages()) {  // out of pages to copy shared ones into
      ++ev.deferred_streams;
      continue;
    }
    if (needs_.key_mass) mass_.compact(s, keep);
    if (copies == 0) {  // its evicted slots go to the cold tier with the batch (flush_batch)
      batch_streams_.push_back(s);
      batch_slots_.push_back(n);
      batch_keeps_.push_back(keep);
      continue;
    }
    if (evicted_ != nullptr) {  // before the survivors slide over them; the batch before it went first
      const double c0 = now_s();
      evicted_->add(kv, s, keep);
      ev.cold_seconds += now_s() - c0;
    }
    const int64_t compacted = kv.compact_stream(s, keep);
    if (compacted < 0) throw std::logic_error("compaction: pool exhausted after the check");
    account(s, n, compacted);
  }
  flush_batch();
  if (evicted_ != nullptr) {
    const double c0 = now_s();
    evicted_->commit();
    ev.cold_seconds += now_s() - c0;
  }
  schedule_.on_event(live_total(kv));
  ev.score_seconds = t1 - t0;
  ev.seconds = now_s() - t0;
  stats_.add(ev);
}

}  // namespace kvpack::compress
