#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace kvpack {
namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Length: return "length";
    case FinishReason::Eos: return "eos";
    case FinishReason::Stop: return "stop";
    case FinishReason::Context: return "context";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
  }
  return "?";
}

PreemptPolicy parse_preempt(const std::string& s) {
  if (s == "lru") return PreemptPolicy::LRU;
  if (s == "lfu") return PreemptPolicy::LFU;
  if (s == "priority") return PreemptPolicy::Priority;
  throw std::invalid_argument("unknown preemption policy '" + s + "' (lru, lfu, priority)");
}

const char* preempt_name(PreemptPolicy p) {
  switch (p) {
    case PreemptPolicy::LRU: return "lru";
    case PreemptPolicy::LFU: return "lfu";
    case PreemptPolicy::Priority: return "priority";
  }
  return "?";
}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds.size() && v > bounds[i]) ++i;
  ++counts[i];
  sum += v;
  ++count;
}

Scheduler::Scheduler(Engine& engine, const SchedulerOptions& opt) : engine_(&engine), kv_(&engine.kv()), opt_(opt) {
  opt_.step_tokens = std::min(opt_.step_tokens, engine.runner().max_batch_tokens());
  if (opt_.step_tokens < 1 || opt_.max_running < 1) throw std::invalid_argument("scheduler: step_tokens and max_running must be >= 1");
}

Scheduler::~Scheduler() {
  stop();
  for (auto& s : waiting_)
    if (s->swapped) kv_->drop_swapped(*s->swapped);
  // Sequences release their pages while the KV manager is still there.
  running_.clear();
  waiting_.clear();
  incoming_.clear();
}

uint64_t Scheduler::submit(Request req, EventSink sink) {
  const ModelConfig& c = engine_->model().config();
  if (req.prompt.empty()) throw std::invalid_argument("empty prompt (it needs at least one token, e.g. BOS)");
  if (static_cast<int64_t>(req.prompt.size()) > c.n_ctx)
    throw std::invalid_argument("prompt has " + std::to_string(req.prompt.size()) + " tokens; the context is " + std::to_string(c.n_ctx));
  for (int32_t t : req.prompt)
    if (t < 0 || t >= c.n_vocab) throw std::invalid_argument("token id " + std::to_string(t) + " out of range");
  if (req.max_tokens < 0) throw std::invalid_argument("max_tokens must be >= 0");
  if (req.logprobs < -1 || req.logprobs > kMaxTopLogprobs)
    throw std::invalid_argument("logprobs must be -1 (off) or in [0, " + std::to_string(kMaxTopLogprobs) + "]");
  if (req.n < 1 || req.n > opt_.max_running)
    throw std::invalid_argument("n must be in [1, " + std::to_string(opt_.max_running) + "] (the server's max running sequences)");
  auto s = std::make_unique<Sequence>();
  // Sliding-window layers are bounded by freeing their pages; without that, compression bounds them.
  if (!engine_->options().window_free) req.kv.window_layers = true;
  // Constructing the compressor validates the KV config (budget vs window, calibration present).
  s->comp = req.kv.enabled() ? std::make_unique<compress::SequenceCompressor>(req.kv, c, engine_->calibration(),
                                                                              static_cast<int32_t>(req.prompt.size()),
                                                                              &engine_->runner().threads())
                             : nullptr;
  s->req = std::move(req);
  s->sink = std::move(sink);
  s->tokens = s->req.prompt;
  s->n_prompt = static_cast<int32_t>(s->tokens.size());
  s->prev_token = s->tokens.back();
  allow_fallback_if_full_kv_fits(*s);
  s->sampler = std::make_unique<Sampler>(s->req.sampling, c.n_vocab);
  s->text = std::make_unique<TextStream>(s->req.stop);
  s->t_submit = now_s();
  s->stats.prompt_tokens = s->n_prompt;
  s->fork_pending = s->req.n > 1;
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<int64_t>(incoming_.size()) + metrics_.waiting >= opt_.max_waiting) return 0;
  s->id = next_id_++;
  s->family = s->id;
  s->arrival = s->id;
  const uint64_t id = s->id;
  incoming_.push_back(std::move(s));
  cv_.notify_all();
  return id;
}

void Scheduler::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancels_.push_back(id);
  cv_.notify_all();
}

void Scheduler::intake() {
  std::vector<uint64_t> cancels;
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!incoming_.empty()) {
      waiting_.push_back(std::move(incoming_.front()));
      incoming_.pop_front();
    }
    cancels.swap(cancels_);
  }
  for (uint64_t id : cancels) {  // a request's id cancels all its choices
    for (auto& s : running_)
      if (s->family == id) s->cancelled = true;
    for (auto& s : waiting_)
      if (s->family == id) s->cancelled = true;
  }
  // Cancelled requests leave now: their pages go back before anything else is scheduled.
  auto drop_cancelled = [&](std::vector<std::unique_ptr<Sequence>>& v) {
    for (auto it = v.begin(); it != v.end();) {
      if ((*it)->cancelled) {
        finish(it->get(), FinishReason::Cancelled);
        it = v.erase(it);
      } else {
        ++it;
      }
    }
  };
  drop_cancelled(running_);
  drop_cancelled(waiting_);
}

// A drift guard's fallback makes the request a full-KV one to its end: allowed only when the pool could
// hold that whole KV (its full length, sliding-window layers at their window, plus one page per stream for
// the exact check's fork), since the scheduler would otherwise fail the request once it outgrew the pool
// (it goes on compressed instead).
void Scheduler::allow_fallback_if_full_kv_fits(Sequence& s) const {
  if (!s.comp) return;
  s.comp->set_fallback_allowed(projected_pages(s, true, true) + kv_->n_streams() <= kv_->capacity());
}

int64_t Scheduler::projected_pages(const Sequence& s, bool windowed, bool uncompressed) const {
  const ModelConfig& c = engine_->model().config();
  const int64_t full_len = std::min<int64_t>(static_cast<int64_t>(s.tokens.size()) + s.req.max_tokens - s.n_generated, c.n_ctx);
  // A compressed sequence holds what its schedule allows (budget + interval, more when protected slots
  // keep it above the budget); a full one its whole length.
  const bool comp = s.comp != nullptr && !uncompressed;
  const int64_t slots = comp ? s.comp->schedule().projected_slots(full_len, s.n_prompt, s.stats.cached_tokens) : full_len;
  const int64_t all = kv_->pages_for_slots(slots, comp);
  if (!windowed || c.swa_window <= 0 || !engine_->options().window_free) return all;
  // A local layer holds the window plus the step that is being computed (release_out_of_window runs
  // after each step), rounded out to pages on both ends; compression leaves it alone (window_layers is
  // false whenever window freeing is on), so a compressed sequence's local layers hold the same.
  const int64_t ps = kv_->page_size();
  const int64_t per_stream = all / kv_->n_streams();  // a global layer's stream
  const int64_t local = std::min((full_len + ps - 1) / ps, (c.swa_window - 1 + opt_.step_tokens + ps - 1) / ps + 1);
  int64_t local_layers = 0;
  for (int32_t l = 0; l < c.n_layer; ++l) local_layers += c.is_swa(l) ? 1 : 0;
  return all - local_layers * c.n_head_kv * (per_stream - local);
}

void Scheduler::release_out_of_window(Sequence& s) {
  const ModelConfig& c = engine_->model().config();
  if (c.swa_window <= 0 || !s.kv || !engine_->options().window_free) return;
  if (s.comp && s.comp->config().window_layers) return;  // compression bounds them instead
  // The next query is at next_pos or later and sees positions > p - window: anything below
  // next_pos - window + 1 is never read again. (A compressor leaves these layers alone: their slots
  // stay in position order, one per token, so dropping whole pages from the front is safe.)
  const int32_t min_pos = s.kv->next_pos() - c.swa_window + 1;
  if (min_pos <= 0) return;
  int64_t freed = 0;
  for (int32_t l = 0; l < c.n_layer; ++l) {
    if (!c.is_swa(l)) continue;
    for (int32_t h = 0; h < c.n_head_kv; ++h) freed += s.kv->drop_pages_before(s.kv->stream_index(l, h), min_pos);
  }
  if (freed == 0) return;
  s.stats.window_pages_freed += freed;
  std::lock_guard<std::mutex> lock(mu_);
  metrics_.window_pages_freed += freed;
}

int64_t Scheduler::reserved_pages(const Sequence& s) const {
  const int64_t own = projected_pages(s);
  // A fork adds at least its copy of each stream's partly filled last page.
  const int64_t floor = kv_->n_streams();
  if (s.fork_pending) {
    const int64_t prompt_full = static_cast<int64_t>(kv_->n_streams()) * (s.n_prompt / kv_->page_size());
    return own + static_cast<int64_t>(s.req.n - 1) * (s.comp ? own : std::max(floor, own - prompt_full));
  }
  // An uncompressed choice keeps its shared prompt pages to the end; a compressing one copies what it
  // compacts, so it is projected in full.
  if (s.stats.fork_shared_pages > 0 && s.kv && !s.comp) return std::max(floor, own - s.stats.fork_shared_pages);
  return own;
}

void Scheduler::admit() {
  int64_t reserved = 0;
  for (const auto& s : running_) reserved += reserved_pages(*s);
  // Waiting sequences in arrival order (preempted ones keep their original place).
  std::stable_sort(waiting_.begin(), waiting_.end(), [](const auto& a, const auto& b) { return a->arrival < b->arrival; });
  for (auto it = waiting_.begin(); it != waiting_.end() && static_cast<int32_t>(running_.size()) < opt_.max_running;) {
    Sequence& s = **it;
    // A pending fork needs room for all its choices in the batch (submit keeps n <= max_running).
    if (s.fork_pending && static_cast<int32_t>(running_.size()) + s.req.n > opt_.max_running && !running_.empty()) break;
    const int64_t need_all = reserved_pages(s);
    bool ok;
    if (opt_.reserve_admission) {
      ok = reserved + need_all <= kv_->capacity() || running_.empty();
    } else {
      const int64_t prompt_pages = kv_->pages_for_slots(static_cast<int64_t>(s.tokens.size()), false);
      ok = kv_->free_pages() - prompt_pages >= static_cast<int64_t>(opt_.watermark * static_cast<double>(kv_->capacity())) ||
           running_.empty();
    }
    if (!ok) break;  // FCFS: do not let later requests overtake
    // Page tables sized for the projected length up front, so decode steps do not reallocate them.
    const int32_t reserve = static_cast<int32_t>(projected_pages(s, false) / kv_->n_streams() * kv_->page_size());
    if (s.swapped) {  // back from the cold tier, bit-identical; a lost record means recompute
      if (!kv_->can_allocate(kv_->swap_in_pages(*s.swapped))) break;
      const double t0 = now_s();
      s.kv = kv_->swap_in(*s.swapped, reserve);
      s.swapped.reset();
      if (s.kv) {
        ++s.stats.swap_ins;
        std::lock_guard<std::mutex> lock(mu_);
        metrics_.swap_in.observe(now_s() - t0);
      } else {
        s.recompute = true;
        ++s.stats.recomputes;
        std::lock_guard<std::mutex> lock(mu_);
        ++metrics_.recomputes;
      }
    }
    if (!s.kv) {
      s.kv = kv_->new_sequence(reserve);
      s.n_computed = 0;
      s.registered_blocks = 0;
      if (s.comp && s.recompute) {  // the KV is recomputed from text: the compressor starts afresh
        s.comp_before.add(s.comp->stats());
        s.comp = std::make_unique<compress::SequenceCompressor>(s.req.kv, engine_->model().config(), engine_->calibration(),
                                                                s.n_prompt, &engine_->runner().threads());
        allow_fallback_if_full_kv_fits(s);
        if (s.evicted) s.evicted->clear();  // its cold pages belonged to the KV being rebuilt
      }
      if (s.comp && kv_->has_cold_tier() && engine_->options().kv_cold_evicted) {
        if (!s.evicted) s.evicted = std::make_unique<kv::EvictedKv>(*kv_->cold_tier(), kv_->pool(), s.id, kv_->n_streams());
        s.comp->set_evicted_sink(s.evicted.get());
      }
      // A compressed sequence whose prompt may not be registered must not attach cached blocks either:
      // attached pages are shared, hence protected from eviction, which a solo run would not have.
      if (opt_.prefix_cache && (!s.comp || s.comp->schedule().may_register(s.n_prompt))) {
        int32_t cold = 0, shared = 0;
        s.n_computed = kv_->attach_cached_prefix(*s.kv, s.tokens, s.req.cache_salt, &cold, &shared);
        s.registered_blocks = s.n_computed / kv_->page_size();
        if (s.comp) s.comp->set_protected_prefix(s.registered_blocks * kv_->page_size());
        if (s.stats.preemptions == 0) {
          s.stats.cached_tokens = s.n_computed;
          s.stats.cached_tokens_cold = cold;
          s.stats.cached_tokens_shared = shared;
        }
      }
      s.recompute = false;
    }
    if (s.stats.preemptions == 0) {
      s.t_admitted = now_s();
      s.stats.queue_seconds = s.t_admitted - s.t_submit;
      std::lock_guard<std::mutex> lock(mu_);
      metrics_.prompt_tokens += s.n_prompt;
    }
    s.admitted_step = step_no_;
    reserved += need_all;
    running_.push_back(std::move(*it));
    it = waiting_.erase(it);
  }
}

void Scheduler::preempt(Sequence* s) {
  ++s->stats.preemptions;
  bool swapped = false;
  if (opt_.swap_preemption && kv_->has_cold_tier()) {
    auto sw = std::make_unique<kv::SwappedKv>();
    const double t0 = now_s();
    if (kv_->swap_out(*s->kv, s->id, *sw)) {
      s->swapped = std::move(sw);
      ++s->stats.swap_outs;
      swapped = true;
      std::lock_guard<std::mutex> lock(mu_);
      metrics_.swap_out.observe(now_s() - t0);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (opt_.preempt == PreemptPolicy::LRU) ++metrics_.preemptions_lru;
    else if (opt_.preempt == PreemptPolicy::LFU) ++metrics_.preemptions_lfu;
    else ++metrics_.preemptions_priority;
    if (!swapped) ++metrics_.recomputes;
  }
  s->kv.reset();  // all pages back (swapped ones are in the tier; cached ones stay findable)
  if (!swapped) {
    s->n_computed = 0;
    s->recompute = true;
    ++s->stats.recomputes;
  }
  for (auto it = running_.begin(); it != running_.end(); ++it)
    if (it->get() == s) {
      waiting_.push_back(std::move(*it));
      running_.erase(it);
      break;
    }
}

Sequence* Scheduler::pick_victim() const {
  if (running_.size() <= 1) return nullptr;
  // Never the oldest running sequence: someone must make progress.
  const Sequence* oldest = running_.front().get();
  for (const auto& s : running_)
    if (s->arrival < oldest->arrival) oldest = s.get();
  Sequence* victim = nullptr;
  for (const auto& sp : running_) {
    Sequence* s = sp.get();
    if (s == oldest) continue;
    if (victim == nullptr) {
      victim = s;
      continue;
    }
    bool better = false;
    switch (opt_.preempt) {
      case PreemptPolicy::LRU:  // least recently (re)admitted; among equals the newest arrival
        better = s->admitted_step < victim->admitted_step ||
                 (s->admitted_step == victim->admitted_step && s->arrival > victim->arrival);
        break;
      case PreemptPolicy::LFU:  // fewest tokens computed: the least work lost to recompute
        better = s->n_computed < victim->n_computed || (s->n_computed == victim->n_computed && s->arrival > victim->arrival);
        break;
      case PreemptPolicy::Priority:  // lowest priority; among equals the newest arrival
        better = s->req.priority < victim->req.priority ||
                 (s->req.priority == victim->req.priority && s->arrival > victim->arrival);
        break;
    }
    if (better) victim = s;
  }
  return victim;
}

void Scheduler::finish(Sequence* s, FinishReason reason, const std::string& error) {
  if (reason != FinishReason::Cancelled && reason != FinishReason::Error) {
    const std::string rest = s->text->flush();
    if (!rest.empty() && s->sink) {
      RequestEvent ev;
      ev.index = s->choice;
      ev.text = rest;
      ev.logprobs.swap(s->pending_logprobs);
      s->sink(ev);
    }
  }
  RequestEvent ev;
  ev.kind = RequestEvent::Kind::Finished;
  ev.index = s->choice;
  ev.logprobs.swap(s->pending_logprobs);  // tokens whose text was held back to the end (e.g. a stop string)
  ev.finish = reason;
  ev.error = error;
  ev.tokens.assign(s->tokens.begin() + s->n_prompt, s->tokens.end());
  RequestStats& st = s->stats;
  st.completion_tokens = s->n_generated;
  if (s->kv) st.kv_pages_in_use = s->comp ? s->comp->accounted_pages(*s->kv) : s->kv->pages_held();
  if (s->first_token_done()) st.decode_seconds = now_s() - s->t_first_token;
  st.compression = s->compression_so_far();
  finished_compression_.add(st.compression);
  if (s->comp || st.compression.events > 0) finished_by_policy_[compress::policy_name(s->req.kv.policy)].add(st.compression);
  if (s->evicted) {
    st.evicted = s->evicted->stats();
    kv::EvictedStats gone = st.evicted;
    gone.digest_bytes = 0;
    finished_evicted_.add(gone);
    if (s->comp) s->comp->set_evicted_sink(nullptr);
    s->evicted.reset();  // its records leave the tier now, not when the sequence object goes
  }
  ev.stats = st;
  s->kv.reset();
  if (s->swapped) kv_->drop_swapped(*s->swapped);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (reason == FinishReason::Cancelled) {
      ++metrics_.requests_cancelled;
    } else if (reason == FinishReason::Error) {
      ++metrics_.requests_failed;
    } else {
      ++metrics_.requests_finished;
      ++(reason == FinishReason::Eos || reason == FinishReason::Stop ? metrics_.finished_stop : metrics_.finished_length);
      const double end = now_s();
      metrics_.e2e.observe(end - s->t_submit);
      metrics_.queue.observe(st.queue_seconds);
      if (s->first_token_done()) {
        metrics_.prefill.observe(st.prefill_seconds);
        metrics_.decode.observe(st.decode_seconds);
      }
      metrics_.request_prompt_tokens.observe(s->n_prompt);
      metrics_.request_generation_tokens.observe(s->n_generated);
    }
  }
  if (s->sink) s->sink(ev);
}

void Scheduler::remove_running(Sequence* s) {
  for (auto it = running_.begin(); it != running_.end(); ++it)
    if (it->get() == s) {
      running_.erase(it);
      return;
    }
}

void Scheduler::emit_token(Sequence& s, int32_t token) {
  const Tokenizer& tok = engine_->model().tokenizer();
  const std::string piece = tok.piece_after(s.prev_token, token);
  s.prev_token = token;
  const std::string text = s.text->push(piece);
  const double t = now_s();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.first_token_done()) metrics_.ttft.observe(t - s.t_submit);
    else metrics_.itl.observe(t - s.t_last_token);
    ++metrics_.generated_tokens;
  }
  s.t_last_token = t;
  if (s.sink && !text.empty()) {
    RequestEvent ev;
    ev.index = s.choice;
    ev.text = text;
    ev.tokens = {token};
    ev.logprobs.swap(s.pending_logprobs);
    s.sink(ev);
  }
}

namespace {
// Log-softmax of the raw logits at `token`, and the k most likely tokens (ties: lower id first).
TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int32_t k) {
  float mx = -std::numeric_limits<float>::infinity();
  for (float v : logits) mx = std::max(mx, v);
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v - mx));
  const float lse = mx + static_cast<float>(std::log(sum));
  TokenLogprob lp;
  lp.token = token;
  lp.logprob = logits[static_cast<size_t>(token)] - lse;
  const size_t n = std::min(logits.size(), static_cast<size_t>(std::max(0, k)));
  if (n > 0) {
    std::vector<int32_t> ids(logits.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    std::partial_sort(ids.begin(), ids.begin() + static_cast<long>(n), ids.end(), [&](int32_t a, int32_t b) {
      return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
             (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
    });
    for (size_t i = 0; i < n; ++i) lp.top.emplace_back(ids[i], logits[static_cast<size_t>(ids[i])] - lse);
  }
  return lp;
}
}  // namespace

bool Scheduler::schedule(StepPlan& plan) {
  plan.clear();
  intake();
  admit();
  if (running_.empty()) return false;
  plan.step = ++step_no_;
  // Decodes first (one token each), then prefill chunks in arrival order, within the token budget.
  order_.clear();
  for (auto& s : running_) order_.push_back(s.get());
  std::stable_sort(order_.begin(), order_.end(), [](const Sequence* a, const Sequence* b) {
    const bool da = a->pending() == 1, db = b->pending() == 1;
    if (da != db) return da;
    return a->arrival < b->arrival;
  });
  // The batch and its chunk sizes; if its pages cannot be had (cached-free pages count), preempt and
  // re-plan (chunk sizes change when a sequence leaves the batch).
  for (;;) {
    plan.clear();
    int32_t budget = opt_.step_tokens;
    int64_t need = 0;
    for (Sequence* s : order_) {
      if (s->kv == nullptr) continue;  // preempted during this planning
      const int32_t pending = s->pending();
      if (pending <= 0 || budget <= 0) continue;
      // A compressed sequence's prefill chunk ends where its next compression event fires, so it never
      // holds more than budget + interval (what admission projected for it).
      const int32_t n = std::min({pending, budget, s->comp ? s->comp->tokens_until_trigger(*s->kv) : pending});
      budget -= n;
      need += s->kv->pages_needed(n);
      StepPlan::Item it;
      it.seq = s;
      it.begin = s->n_computed;
      it.n = n;
      it.logits = n == pending;
      if (it.logits) it.logits_row = plan.n_logits++;
      it.decode = s->first_token_done();
      // Every token appends one slot to every stream; the end of the prompt may fire an event too.
      it.compress = s->comp && s->comp->fires_after(*s->kv, n, it.logits && s->n_generated == 0);
      if (it.compress) need += s->comp->cow_pages(*s->kv);  // a forked choice copies shared pages it compacts
      plan.items.push_back(it);
    }
    if (kv_->can_allocate(need)) break;
    Sequence* victim = pick_victim();
    if (victim == nullptr) {
      // Even the oldest sequence alone cannot get its pages: the pool is too small for it.
      Sequence* s = running_.front().get();
      finish(s, FinishReason::Error, "KV cache too small for this request (" + std::to_string(kv_->capacity()) + " pages)");
      running_.erase(running_.begin());
      plan.clear();
      return true;  // work was done (a request ended); the plan is empty
    }
    preempt(victim);
  }
  return true;
}

void Scheduler::update(const StepPlan& plan, std::span<float> logits) {
  const ModelConfig& c = engine_->model().config();
  const size_t V = static_cast<size_t>(c.n_vocab);
  done_.clear();
  for (const StepPlan::Item& item : plan.items) {
    Sequence& s = *item.seq;
    s.n_computed += item.n;
    if (item.decode) ++s.stats.decode_steps;
    s.stats.peak_kv_pages = std::max(s.stats.peak_kv_pages, s.comp ? s.comp->accounted_pages(*s.kv) : s.kv->pages_held());
    const bool prefill_done = s.n_computed == static_cast<int32_t>(s.tokens.size());
    // Register full blocks with the prefix cache while the KV still mirrors the token sequence.
    // Registered pages are shared, and shared pages are never evicted or rewritten, so a compressed
    // sequence registers only its prompt, before its first compaction, and only when the prompt fits in
    // its budget (or is protected anyway): a shared system prompt then costs part of each session's
    // budget once for all sessions, while a long document stays compressible. Any sequence may reuse
    // blocks that others registered.
    if (opt_.prefix_cache && (!s.comp || s.comp->schedule().may_register(s.n_prompt))) {
      const int32_t full = (s.comp ? s.comp->schedule().registrable_tokens(s.n_computed, s.n_prompt) : s.n_computed) / kv_->page_size();
      if (full > s.registered_blocks) {
        kv_->register_blocks(*s.kv, s.tokens, full, s.req.cache_salt);
        s.registered_blocks = full;
        if (s.comp) s.comp->set_protected_prefix(full * kv_->page_size());
      }
    }
    release_out_of_window(s);  // after registration: released pages stay findable as cached-free blocks
    if (s.comp) {
      try {
        s.comp->after_step(*s.kv, item.compress);
      } catch (const std::exception& e) {  // fail this request only, not the batch
        finish(&s, FinishReason::Error, std::string("compression failed: ") + e.what());
        remove_running(&s);
        continue;
      }
    }
    if (!prefill_done) continue;
    // Recall (compress/recall.h): evicted pages that the latest queries may need come back before
    // sampling. Right after prefill the logits predate them, so the last token is computed again.
    if (s.comp) {
      int32_t recompute = 0;
      try {
        recompute = s.comp->before_sample(*s.kv);
      } catch (const std::exception& e) {
        finish(&s, FinishReason::Error, std::string("recall failed: ") + e.what());
        remove_running(&s);
        continue;
      }
      if (recompute > 0) {
        s.kv->truncate_tail(recompute);
        s.n_computed -= recompute;
        continue;
      }
    }
    // Sample the next token from this sequence's logits (n > 1: the other choices fork from it first).
    float* lg = logits.data() + static_cast<size_t>(item.logits_row) * V;
    if (s.comp && s.comp->take_exact_check_due()) {
      const int32_t again = exact_drift_check(s, lg, item.n == 1);
      if (again > 0) {  // the exact guard gave the request its full KV back: the newest token again over it
        s.kv->truncate_tail(again);
        s.n_computed -= again;
        continue;
      }
    }
    if (s.fork_pending) fork(s, lg);
    sample_next(s, lg);
  }
  for (Sequence* s : done_) {
    finish(s, *s->ending);
    remove_running(s);
  }
}

int32_t Scheduler::exact_drift_check(Sequence& s, const float* lg, bool one_token_step) {
  const int32_t n_vocab = engine_->model().config().n_vocab;
  const int32_t pos = s.kv->next_pos() - 1;  // the newest token: computed again over every KV
  const int32_t token = pos >= 0 ? s.tokens[static_cast<size_t>(pos)] : 0;
  exact_logits_.resize(2 * static_cast<size_t>(n_vocab));
  float* full_row = exact_logits_.data();
  float* hot_row = full_row + n_vocab;
  // The newest token once more over every KV (engine/exact_check.h).
  auto recompute = [&](bool with_cold, float* out) {
    return with_cold ? exact_.over_all_kv(*engine_, *s.kv, token, *s.comp, out) : exact_.over_hot_kv(*engine_, *s.kv, token, out);
  };
  bool ok = pos >= 0 && recompute(true, full_row);
  // A token computed in a multi-token step (the end of prefill) went through the batched kernels, which
  // round differently: its compressed row is recomputed the same way as the full one, so the two differ
  // by the evicted keys alone (a one-token step's row is bit-identical to that recompute).
  if (ok && !one_token_step) {
    ok = recompute(false, hot_row);
    lg = hot_row;
  }
  if (ok) return s.comp->record_exact_check(*s.kv, lg, full_row, n_vocab);
  s.comp->record_exact_skip();
  return 0;
}

void Scheduler::sample_next(Sequence& s, float* lg) {
  const ModelConfig& c = engine_->model().config();
  const Tokenizer& tok = engine_->model().tokenizer();
  const size_t V = static_cast<size_t>(c.n_vocab);
  if (s.req.logprobs >= 0) s.raw_logits.assign(lg, lg + V);  // the sampler's penalty rewrites lg in place
  const int32_t next = s.sampler->sample(lg, s.tokens);
  if (s.req.max_tokens == 0) {
    s.ending = FinishReason::Length;
    done_.push_back(&s);
    return;
  }
  if (!s.req.ignore_eos && tok.is_eog(next)) {  // the end-of-generation token itself is not emitted
    s.ending = FinishReason::Eos;
    done_.push_back(&s);
    return;
  }
  s.tokens.push_back(next);
  ++s.n_generated;
  if (s.req.logprobs >= 0) s.pending_logprobs.push_back(token_logprob(s.raw_logits, next, s.req.logprobs));
  const bool first = !s.first_token_done();
  emit_token(s, next);
  if (first) {
    s.t_first_token = s.t_last_token;
    s.stats.prefill_seconds = s.t_first_token - s.t_admitted;
  }
  if (s.text->stopped()) s.ending = FinishReason::Stop;
  else if (s.n_generated >= s.req.max_tokens) s.ending = FinishReason::Length;
  else if (static_cast<int64_t>(s.tokens.size()) >= c.n_ctx) s.ending = FinishReason::Context;
  if (s.ending) done_.push_back(&s);
}

void Scheduler::fork(Sequence& s, const float* lg) {
  s.fork_pending = false;
  const size_t V = static_cast<size_t>(engine_->model().config().n_vocab);
  const int32_t reserve = static_cast<int32_t>(projected_pages(s, false) / kv_->n_streams() * kv_->page_size());
  std::vector<float> row(V);
  int64_t saved = 0;
  for (int32_t i = 1; i < s.req.n; ++i) {
    auto c = std::make_unique<Sequence>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      c->id = next_id_++;  // its own uid: swap and evicted-record keys derive from it
    }
    c->family = s.family;
    c->choice = i;
    c->req = s.req;
    c->req.sampling.seed = choice_seed(s.req.sampling.seed, i);
    c->sink = s.sink;
    c->kv = kv_->fork_sequence(*s.kv, reserve, &c->stats.fork_shared_pages);
    if (s.evicted) c->evicted = s.evicted->fork(c->id);
    if (s.comp) {
      c->comp = s.comp->fork();
      if (c->evicted) c->comp->set_evicted_sink(c->evicted.get());
    }
    c->sampler = std::make_unique<Sampler>(c->req.sampling, static_cast<int32_t>(V));
    c->text = std::make_unique<TextStream>(c->req.stop);
    c->tokens = s.tokens;
    c->n_prompt = s.n_prompt;
    c->n_computed = s.n_computed;
    c->prev_token = s.prev_token;
    c->registered_blocks = s.registered_blocks;  // the prompt's blocks are registered once, by choice 0
    c->arrival = s.arrival;
    c->admitted_step = s.admitted_step;
    c->t_submit = s.t_submit;
    c->t_admitted = s.t_admitted;
    // The prompt's figures are the request's; preemption counts start at the fork (no double counting).
    c->stats.prompt_tokens = s.stats.prompt_tokens;
    c->stats.cached_tokens = s.stats.cached_tokens;
    c->stats.cached_tokens_cold = s.stats.cached_tokens_cold;
    c->stats.cached_tokens_shared = s.stats.cached_tokens_shared;
    c->stats.queue_seconds = s.stats.queue_seconds;
    c->stats.peak_kv_pages = s.stats.peak_kv_pages;
    c->comp_before = s.comp_before;
    c->fork_base = s.compression_so_far();  // the parent's own base included: counts start at this fork
    saved += c->stats.fork_shared_pages;
    Sequence& child = *c;
    running_.push_back(std::move(c));  // plan items and done_ hold raw pointers: they stay valid
    std::copy(lg, lg + V, row.begin());
    sample_next(child, row.data());
  }
  std::lock_guard<std::mutex> lock(mu_);
  metrics_.forks += s.req.n - 1;
  metrics_.fork_pages_saved += saved;
}

bool Scheduler::step() {
  if (!schedule(plan_)) {
    publish_metrics();
    return false;
  }
  if (!plan_.items.empty()) update(plan_, engine_->runner().execute(plan_));
  publish_metrics();
  return true;
}

void Scheduler::publish_metrics() {
  const kv::KvUsage u = kv_->usage();
  // Totals and the per-policy split from one pass (a swapped-out sequence keeps its compressor: counted too).
  compress::CompressionStats cs = finished_compression_;
  std::map<std::string, compress::CompressionStats> by_policy = finished_by_policy_;
  for (const auto* q : {&running_, &waiting_})
    for (auto& s : *q) {
      const compress::CompressionStats one = s->compression_so_far();
      cs.add(one);
      if (s->comp || one.events > 0) by_policy[compress::policy_name(s->req.kv.policy)].add(one);
    }
  kv::EvictedStats ev = finished_evicted_;
  for (const auto* q : {&running_, &waiting_})
    for (auto& s : *q)
      if (s->evicted) ev.add(s->evicted->stats());
  // The KV map, outside the lock (only this thread writes kv_map_, so it reads it unlocked; readers copy
  // it under mu_ below). Also
  // rebuilt once the batch empties, so an idle server's map is not the last busy step's.
  KvMapSnapshot map;
  const bool rebuild_map = want_kv_map_.exchange(false) || (running_.empty() && waiting_.empty() && !kv_map_.sequences.empty());
  if (rebuild_map) build_kv_map(map);
  std::lock_guard<std::mutex> lock(mu_);
  if (rebuild_map) kv_map_ = std::move(map);
  metrics_.pages_total = u.pages_total;
  metrics_.pages_used = u.pages_used;
  metrics_.pages_free = u.pages_free;
  metrics_.pages_cached_free = u.pages_cached_free;
  metrics_.page_bytes = u.page_bytes;
  metrics_.resident_kv_bytes = u.used_bytes;
  metrics_.running = static_cast<int64_t>(running_.size());
  metrics_.waiting = static_cast<int64_t>(waiting_.size());
  metrics_.peak_running = std::max(metrics_.peak_running, metrics_.running);
  metrics_.steps = static_cast<int64_t>(step_no_);
  metrics_.compression = cs;
  metrics_.compression_by_policy = std::move(by_policy);
  metrics_.prefix = kv_->prefix_stats();
  metrics_.cold = kv_->cold_usage();
  metrics_.shared = kv_->shared_stats();
  metrics_.has_shared_tier = kv_->has_shared_tier();
  metrics_.evicted = ev;
}

void Scheduler::build_kv_map(KvMapSnapshot& m) const {
  const kv::KvUsage u = kv_->usage();
  const ModelConfig& c = engine_->model().config();
  m.step = step_no_;
  m.t = now_s();
  m.n_layers = c.n_layer;
  m.n_kv_heads = c.n_head_kv;
  m.page_size = kv_->page_size();
  m.pages_total = u.pages_total;
  m.pages_active = u.pages_used;
  m.pages_cached = u.pages_cached_free;
  m.pages_free = u.pages_free - u.pages_cached_free;
  m.page_bytes = u.page_bytes;
  m.resident_bytes = u.used_bytes;
  if (const kv::ColdTier* tier = kv_->cold_tier()) {
    const kv::ColdTierStats ts = tier->stats();
    m.cold_cap_bytes = ts.cap_bytes;
    m.cold_used_bytes = ts.used_bytes;
    m.cold_records = ts.records;
  }
  const int64_t streams = static_cast<int64_t>(c.n_layer) * c.n_head_kv;
  const auto add = [&](const Sequence& s, const char* state) {
    KvMapSequence q;
    q.id = s.id;
    q.state = state;
    q.prompt_tokens = s.n_prompt;
    q.generated = s.n_generated;
    q.computed = s.n_computed;
    q.policy = compress::policy_name(s.req.kv.policy);
    q.budget = s.req.kv.enabled() ? s.req.kv.budget : 0;
    const compress::CompressionStats cs = s.compression_so_far();
    q.compactions = cs.events;
    q.evicted_tokens = streams > 0 ? cs.evicted_slots / streams : 0;
    q.recalled_pages = cs.recall.pages_recalled;
    q.drift = cs.recall.checks > 0 ? cs.recall.drift_max : -1;
    q.preemptions = s.stats.preemptions;
    if (s.evicted) q.cold_evicted_pages = s.evicted->stats().pages_written;
    if (s.kv) {
      const kv::PagePool& pool = s.kv->pool();
      const int32_t n = s.kv->n_streams();
      q.slots.resize(static_cast<size_t>(n));
      q.pages.resize(static_cast<size_t>(n));
      q.shared_pages.resize(static_cast<size_t>(n));
      for (int32_t i = 0; i < n; ++i) {
        q.slots[static_cast<size_t>(i)] = s.kv->n_slots(i);
        const auto table = s.kv->page_table(i);
        q.pages[static_cast<size_t>(i)] = static_cast<int32_t>(table.size());
        q.shared_pages[static_cast<size_t>(i)] =
            static_cast<int32_t>(std::count_if(table.begin(), table.end(), [&](kv::PageId p) { return pool.is_shared(p); }));
      }
    }
    m.sequences.push_back(std::move(q));
  };
  for (const auto& s : running_) add(*s, s->n_computed < s->n_prompt ? "prefill" : "decode");
  for (const auto& s : waiting_) add(*s, s->swapped ? "swapped" : "waiting");
}

KvMapSnapshot Scheduler::kv_map() {
  want_kv_map_.store(true);
  std::lock_guard<std::mutex> lock(mu_);
  return kv_map_;
}

SchedulerMetrics Scheduler::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  SchedulerMetrics m = metrics_;
  m.waiting += static_cast<int64_t>(incoming_.size());
  return m;
}

std::string Scheduler::check_invariants() const {
  std::vector<const kv::SequenceKv*> live;
  for (const auto& s : running_)
    if (s->kv) live.push_back(s->kv.get());
  std::vector<const kv::SwappedKv*> swapped;
  for (const auto& s : waiting_)
    if (s->swapped) swapped.push_back(s->swapped.get());
  return kv_->check(live, swapped);
}

void Scheduler::loop() {
  while (!stop_.load()) {
    bool worked = false;
    try {
      worked = step();
    } catch (const std::exception& e) {
      // A failing step must not take the server down: fail the running requests, keep serving.
      for (auto& s : running_) finish(s.get(), FinishReason::Error, e.what());
      running_.clear();
    }
    if (!worked) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stop_.load() || !incoming_.empty() || !cancels_.empty(); });
    }
  }
}

void Scheduler::start() {
  if (thread_.joinable()) return;
  stop_ = false;
  thread_ = std::thread([this] { loop(); });
}

void Scheduler::stop() {
  stop_ = true;
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace kvpack
