#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace kvpack {
namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

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

struct Scheduler::Seq {
  uint64_t id = 0;
  RequestSpec spec;
  EventSink sink;
  std::unique_ptr<kv::SequenceKv> kv;
  std::unique_ptr<compress::SequenceCompressor> comp;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<TextStream> text;
  std::vector<int32_t> tokens;  // prompt + generated; the last one may not be in the KV yet
  int32_t n_prompt = 0;
  int32_t n_computed = 0;       // tokens of `tokens` whose K/V were computed (or attached)
  int32_t n_generated = 0;
  int32_t prev_token = -1;
  int32_t cached_tokens = 0;
  int32_t registered_blocks = 0;
  int32_t preemptions = 0;
  uint64_t arrival = 0;         // submit order
  uint64_t admitted_step = 0;   // last (re)admission (lru)
  double t_submit = 0, t_last_token = 0;
  bool first_token_done = false;
  bool cancelled = false;
  compress::CompressionStats comp_before;  // compression stats of earlier incarnations (preemption)
};

Scheduler::Scheduler(Engine& engine, const SchedulerOptions& opt)
    : engine_(&engine), opt_(opt),
      n_streams_(engine.model().config().n_layer * engine.model().config().n_head_kv) {
  opt_.step_tokens = std::min(opt_.step_tokens, engine.forward().max_batch_tokens());
  if (opt_.step_tokens < 1 || opt_.max_running < 1) throw std::invalid_argument("scheduler: step_tokens and max_running must be >= 1");
  if (opt_.prefix_cache) cache_ = std::make_unique<kv::PrefixCache>(engine.pool(), n_streams_, opt_.model_salt);
  logits_.resize(static_cast<size_t>(opt_.step_tokens) * engine.model().config().n_vocab);
}

Scheduler::~Scheduler() {
  stop();
  // Sequences release their pages before the cache and the pool go away.
  running_.clear();
  waiting_.clear();
  incoming_.clear();
  cache_.reset();
}

uint64_t Scheduler::submit(RequestSpec spec, EventSink sink) {
  const ModelConfig& c = engine_->model().config();
  if (spec.prompt.empty()) throw std::invalid_argument("empty prompt");
  if (static_cast<int64_t>(spec.prompt.size()) >= c.n_ctx)
    throw std::invalid_argument("prompt has " + std::to_string(spec.prompt.size()) + " tokens; the context is " + std::to_string(c.n_ctx));
  for (int32_t t : spec.prompt)
    if (t < 0 || t >= c.n_vocab) throw std::invalid_argument("token id " + std::to_string(t) + " out of range");
  if (spec.max_tokens < 0) throw std::invalid_argument("max_tokens must be >= 0");
  auto s = std::make_unique<Seq>();
  // Constructing the compressor validates the KV config (budget vs window, calibration present).
  s->comp = spec.kv.enabled() ? std::make_unique<compress::SequenceCompressor>(spec.kv, c, engine_->calibration(),
                                                                               static_cast<int32_t>(spec.prompt.size()), &engine_->threads())
                              : nullptr;
  s->spec = std::move(spec);
  s->sink = std::move(sink);
  s->tokens = s->spec.prompt;
  s->n_prompt = static_cast<int32_t>(s->tokens.size());
  s->prev_token = s->tokens.back();
  s->sampler = std::make_unique<Sampler>(s->spec.sampling, c.n_vocab);
  s->text = std::make_unique<TextStream>(s->spec.stop);
  s->t_submit = now_s();
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<int64_t>(incoming_.size()) + metrics_.waiting >= opt_.max_waiting) return 0;
  s->id = next_id_++;
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
  for (uint64_t id : cancels) {
    for (auto& s : running_)
      if (s->id == id) s->cancelled = true;
    for (auto& s : waiting_)
      if (s->id == id) s->cancelled = true;
  }
  // Cancelled requests leave now: their pages go back before anything else is scheduled.
  auto drop_cancelled = [&](std::vector<std::unique_ptr<Seq>>& v) {
    for (auto it = v.begin(); it != v.end();) {
      if ((*it)->cancelled) {
        finish(it->get(), "cancelled");
        it = v.erase(it);
      } else {
        ++it;
      }
    }
  };
  drop_cancelled(running_);
  drop_cancelled(waiting_);
}

int64_t Scheduler::projected_pages(const Seq& s) const {
  const int32_t ps = engine_->pool().config().page_size;
  const int64_t full_len = std::min<int64_t>(static_cast<int64_t>(s.tokens.size()) + s.spec.max_tokens - s.n_generated,
                                             engine_->model().config().n_ctx);
  int64_t len = full_len;
  if (s.spec.kv.enabled()) {
    // Compression keeps a sequence at most budget + interval (prefill chunks stop where the next event
    // fires); protected slots — a prompt under protect_prompt, a shared prefix from the cache — can hold
    // it above the budget, and then the next event waits a full interval beyond them.
    int64_t floor = s.spec.kv.budget;
    if (s.spec.kv.protect_prompt) floor = std::max<int64_t>(floor, s.n_prompt);
    floor = std::max<int64_t>(floor, s.cached_tokens);
    len = std::min<int64_t>(full_len, floor + s.spec.kv.interval);
  }
  return n_streams_ * ((len + ps - 1) / ps + (s.spec.kv.enabled() ? 1 : 0));
}

void Scheduler::admit() {
  auto& pool = engine_->pool();
  int64_t reserved = 0;
  for (const auto& s : running_) reserved += projected_pages(*s);
  // Waiting sequences in arrival order (preempted ones keep their original place).
  std::stable_sort(waiting_.begin(), waiting_.end(), [](const auto& a, const auto& b) { return a->arrival < b->arrival; });
  for (auto it = waiting_.begin(); it != waiting_.end() && static_cast<int32_t>(running_.size()) < opt_.max_running;) {
    Seq& s = **it;
    const int64_t need = projected_pages(s);
    bool ok;
    if (opt_.reserve_admission) {
      ok = reserved + need <= pool.capacity() || running_.empty();
    } else {
      const int32_t ps = pool.config().page_size;
      const int64_t prompt_pages = n_streams_ * ((static_cast<int64_t>(s.tokens.size()) + ps - 1) / ps);
      ok = pool.free_pages() - prompt_pages >= static_cast<int64_t>(opt_.watermark * static_cast<double>(pool.capacity())) ||
           running_.empty();
    }
    if (!ok) break;  // FCFS: do not let later requests overtake
    s.kv = engine_->new_sequence();
    // Page tables sized for the projected length up front, so decode steps do not reallocate them.
    s.kv->reserve_slots(static_cast<int32_t>(need / n_streams_ * pool.config().page_size));
    s.n_computed = 0;
    s.registered_blocks = 0;
    if (cache_) {
      s.n_computed = cache_->attach(*s.kv, s.tokens, s.spec.cache_salt);
      s.registered_blocks = s.n_computed / pool.config().page_size;
      if (s.preemptions == 0) s.cached_tokens = s.n_computed;
    }
    if (s.comp) {  // a resumed sequence starts its compressor afresh (its KV is recomputed from text)
      s.comp_before.add(s.comp->stats());
      s.comp = std::make_unique<compress::SequenceCompressor>(s.spec.kv, engine_->model().config(), engine_->calibration(),
                                                              s.n_prompt, &engine_->threads());
    }
    if (s.preemptions == 0) {
      std::lock_guard<std::mutex> lock(mu_);
      metrics_.prompt_tokens += s.n_prompt;
    }
    s.admitted_step = step_no_;
    reserved += need;
    running_.push_back(std::move(*it));
    it = waiting_.erase(it);
  }
}

void Scheduler::preempt(Seq* s, const char* why) {
  ++s->preemptions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (opt_.preempt == PreemptPolicy::LRU) ++metrics_.preemptions_lru;
    else if (opt_.preempt == PreemptPolicy::LFU) ++metrics_.preemptions_lfu;
    else ++metrics_.preemptions_priority;
  }
  (void)why;
  s->kv.reset();  // all pages back (shared ones stay with the cache)
  s->n_computed = 0;
  for (auto it = running_.begin(); it != running_.end(); ++it)
    if (it->get() == s) {
      waiting_.push_back(std::move(*it));
      running_.erase(it);
      break;
    }
}

Scheduler::Seq* Scheduler::pick_victim() const {
  if (running_.size() <= 1) return nullptr;
  // Never the oldest running sequence: someone must make progress.
  const Seq* oldest = running_.front().get();
  for (const auto& s : running_)
    if (s->arrival < oldest->arrival) oldest = s.get();
  Seq* victim = nullptr;
  for (const auto& sp : running_) {
    Seq* s = sp.get();
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
        better = s->spec.priority < victim->spec.priority ||
                 (s->spec.priority == victim->spec.priority && s->arrival > victim->arrival);
        break;
    }
    if (better) victim = s;
  }
  return victim;
}

void Scheduler::finish(Seq* s, const std::string& reason) {
  if (reason != "cancelled" && reason.rfind("error", 0) != 0) {
    const std::string rest = s->text->flush();
    if (!rest.empty() && s->sink) {
      RequestEvent ev;
      ev.text = rest;
      s->sink(ev);
    }
  }
  RequestEvent ev;
  ev.kind = RequestEvent::Kind::Finished;
  ev.finish_reason = reason;
  ev.prompt_tokens = s->n_prompt;
  ev.completion_tokens = s->n_generated;
  ev.cached_tokens = s->cached_tokens;
  ev.preemptions = s->preemptions;
  if (s->comp) finished_compression_.add(s->comp->stats());
  finished_compression_.add(s->comp_before);
  s->kv.reset();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (reason == "cancelled") ++metrics_.requests_cancelled;
    else if (reason.rfind("error", 0) == 0) ++metrics_.requests_failed;
    else ++metrics_.requests_finished;
  }
  if (s->sink) s->sink(ev);
}

void Scheduler::emit_tokens(Seq& s, int32_t token) {
  const Tokenizer& tok = engine_->model().tokenizer();
  const std::string piece = tok.piece_after(s.prev_token, token);
  s.prev_token = token;
  const std::string text = s.text->push(piece);
  const double t = now_s();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!s.first_token_done) metrics_.ttft.observe(t - s.t_submit);
    else metrics_.itl.observe(t - s.t_last_token);
    ++metrics_.generated_tokens;
  }
  s.first_token_done = true;
  s.t_last_token = t;
  if (s.sink && !text.empty()) {
    RequestEvent ev;
    ev.text = text;
    ev.tokens = {token};
    s.sink(ev);
  }
}

bool Scheduler::step() {
  intake();
  admit();
  if (running_.empty()) {
    publish_metrics();
    return false;
  }
  ++step_no_;
  // Decodes first (one token each), then prefill chunks in arrival order, within the token budget.
  std::vector<Seq*> order;
  for (auto& s : running_) order.push_back(s.get());
  std::stable_sort(order.begin(), order.end(), [](const Seq* a, const Seq* b) {
    const bool da = static_cast<int32_t>(a->tokens.size()) - a->n_computed == 1;
    const bool db = static_cast<int32_t>(b->tokens.size()) - b->n_computed == 1;
    if (da != db) return da;
    return a->arrival < b->arrival;
  });
  // Pick the batch and its chunk sizes; if its pages do not fit, free cached blocks, then preempt
  // and re-plan (chunk sizes change when a sequence leaves the batch).
  std::vector<Seq*> batch;
  std::vector<int32_t> chunk;
  for (;;) {
    batch.clear();
    chunk.clear();
    int32_t budget = opt_.step_tokens;
    int64_t need = 0;
    for (Seq* s : order) {
      if (s->kv == nullptr) continue;  // preempted during this planning
      const int32_t pending = static_cast<int32_t>(s->tokens.size()) - s->n_computed;
      if (pending <= 0 || budget <= 0) continue;
      // A compressed sequence's prefill chunk ends where its next compression event fires, so it never
      // holds more than budget + interval (what admission projected for it).
      const int32_t n = std::min({pending, budget, s->comp ? s->comp->tokens_until_trigger(*s->kv) : pending});
      budget -= n;
      need += s->kv->pages_needed(n);
      batch.push_back(s);
      chunk.push_back(n);
    }
    if (engine_->pool().free_pages() >= need) break;
    if (cache_ && cache_->evict_until_free(need) > 0) continue;
    Seq* victim = pick_victim();
    if (victim == nullptr) {
      // Even the oldest sequence alone cannot get its pages: the pool is too small for it.
      Seq* s = running_.front().get();
      finish(s, "error: KV cache too small for this request (" + std::to_string(engine_->pool().capacity()) + " pages)");
      running_.erase(running_.begin());
      return true;
    }
    preempt(victim, preempt_name(opt_.preempt));
  }
  std::vector<BatchItem> items;
  int32_t logit_rows = 0;
  const int32_t V = engine_->model().config().n_vocab;
  for (size_t i = 0; i < batch.size(); ++i) {
    Seq* s = batch[i];
    const int32_t pending = static_cast<int32_t>(s->tokens.size()) - s->n_computed;
    BatchItem it;
    it.kv = s->kv.get();
    it.tokens = std::span<const int32_t>(s->tokens.data() + s->n_computed, static_cast<size_t>(chunk[i]));
    if (chunk[i] == pending) it.logits = logits_.data() + static_cast<size_t>(logit_rows++) * V;
    if (s->comp) s->comp->prepare(*s->kv, it);
    items.push_back(it);
  }
  struct Mux : ForwardObserver {
    std::vector<ForwardObserver*> obs;
    void on_query_pre_rope(int32_t b, int32_t l, const float* q, int32_t n, int64_t st) override {
      if (obs[static_cast<size_t>(b)]) obs[static_cast<size_t>(b)]->on_query_pre_rope(0, l, q, n, st);
    }
    void on_query_post_rope(int32_t b, int32_t l, const float* q, int32_t n, int64_t st) override {
      if (obs[static_cast<size_t>(b)]) obs[static_cast<size_t>(b)]->on_query_post_rope(0, l, q, n, st);
    }
  } mux;
  bool any_obs = false;
  for (Seq* s : batch) {
    mux.obs.push_back(s->comp.get());
    any_obs |= s->comp != nullptr;
  }
  if (!engine_->forward().run(items, any_obs ? &mux : nullptr))
    throw std::logic_error("scheduler: forward refused a batch after make_room");

  std::vector<Seq*> done;
  std::vector<std::pair<Seq*, std::string>> failed;
  for (size_t i = 0; i < batch.size(); ++i) {
    Seq& s = *batch[i];
    s.n_computed += chunk[i];
    const bool prefill_done = s.n_computed == static_cast<int32_t>(s.tokens.size());
    // Register full blocks with the prefix cache while the KV still mirrors the token sequence.
    // Registered pages are shared, and shared pages are never evicted or rewritten, so a compressed
    // sequence registers only its prompt, before its first compaction, and only when the prompt fits in
    // its budget (or is protected anyway): a shared system prompt then costs part of each session's
    // budget once for all sessions, while a long document stays compressible. Any sequence may reuse
    // blocks that others registered.
    const bool may_register =
        !s.comp || (s.comp->stats().events == 0 && (s.spec.kv.protect_prompt || s.n_prompt <= s.spec.kv.budget));
    if (cache_ && may_register) {
      const int32_t ps = engine_->pool().config().page_size;
      const int32_t full = (s.comp ? std::min(s.n_computed, s.n_prompt) : s.n_computed) / ps;
      if (full > s.registered_blocks) {
        cache_->register_blocks(*s.kv, s.tokens, full, s.spec.cache_salt);
        s.registered_blocks = full;
      }
    }
    if (s.comp) {
      try {
        s.comp->after_forward(*s.kv, prefill_done && s.n_generated == 0);
      } catch (const std::exception& e) {  // fail this request only, not the batch
        failed.emplace_back(&s, std::string("error: compression failed: ") + e.what());
        continue;
      }
    }
    if (!prefill_done) continue;
    // Sample the next token from this sequence's logits.
    float* lg = const_cast<float*>(items[i].logits);
    const int32_t next = s.sampler->sample(lg, s.tokens);
    const Tokenizer& tok = engine_->model().tokenizer();
    if (s.spec.max_tokens == 0) {
      done.push_back(&s);
      continue;
    }
    if (!s.spec.ignore_eos && tok.is_eog(next)) {
      s.text->flush();
      done.push_back(&s);
      s.prev_token = -2;  // marks eos
      continue;
    }
    s.tokens.push_back(next);
    ++s.n_generated;
    emit_tokens(s, next);
    if (s.text->stopped() || s.n_generated >= s.spec.max_tokens ||
        static_cast<int64_t>(s.tokens.size()) >= engine_->model().config().n_ctx)
      done.push_back(&s);
  }
  for (auto& [s, why] : failed) {
    finish(s, why);
    for (auto it = running_.begin(); it != running_.end(); ++it)
      if (it->get() == s) {
        running_.erase(it);
        break;
      }
  }
  for (Seq* s : done) {
    std::string reason = "length";
    if (s->prev_token == -2) reason = "eos";
    else if (s->text->stopped()) reason = "stop";
    else if (s->n_generated < s->spec.max_tokens && s->spec.max_tokens > 0) reason = "context";
    finish(s, reason);
    for (auto it = running_.begin(); it != running_.end(); ++it)
      if (it->get() == s) {
        running_.erase(it);
        break;
      }
  }
  publish_metrics();
  return true;
}

void Scheduler::publish_metrics() {
  auto& pool = engine_->pool();
  compress::CompressionStats cs = finished_compression_;
  for (auto& s : running_) {
    if (s->comp) cs.add(s->comp->stats());
    cs.add(s->comp_before);
  }
  for (auto& s : waiting_) cs.add(s->comp_before);
  std::lock_guard<std::mutex> lock(mu_);
  metrics_.pages_total = pool.capacity();
  metrics_.pages_used = pool.used_pages();
  metrics_.pages_free = pool.free_pages();
  metrics_.page_bytes = pool.page_bytes();
  metrics_.resident_kv_bytes = pool.used_bytes();
  metrics_.running = static_cast<int64_t>(running_.size());
  metrics_.waiting = static_cast<int64_t>(waiting_.size());
  metrics_.peak_running = std::max(metrics_.peak_running, metrics_.running);
  metrics_.steps = static_cast<int64_t>(step_no_);
  metrics_.compression = cs;
  if (cache_) metrics_.prefix = cache_->stats();
}

SchedulerMetrics Scheduler::metrics() const {
  std::lock_guard<std::mutex> lock(mu_);
  SchedulerMetrics m = metrics_;
  m.waiting += static_cast<int64_t>(incoming_.size());
  return m;
}

std::string Scheduler::check_invariants() const {
  std::vector<std::span<const kv::PageId>> tables;
  for (const auto& s : running_)
    if (s->kv)
      for (int32_t i = 0; i < s->kv->n_streams(); ++i) tables.push_back(s->kv->page_table(i));
  std::vector<kv::PageId> cached;
  if (cache_) cached = cache_->held_pages();
  tables.push_back(cached);
  return engine_->pool().check(tables);
}

void Scheduler::loop() {
  while (!stop_.load()) {
    bool worked = false;
    try {
      worked = step();
    } catch (const std::exception& e) {
      // A failing step must not take the server down: fail the running requests, keep serving.
      for (auto& s : running_) finish(s.get(), std::string("error: ") + e.what());
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
