#include "engine/engine.h"

#include <stdexcept>

#include "engine/model_identity.h"
#include "engine/scheduler.h"

namespace kvpack {

kv::PoolConfig default_pool_config(const ModelConfig& c, const EngineOptions& opt) {
  kv::PoolConfig pc;
  pc.page_size = opt.page_size;
  pc.head_dim = c.head_dim;
  pc.kv_type = opt.kv_type;
  pc.page_runs = opt.page_runs;
  const int64_t streams = static_cast<int64_t>(c.n_layer) * c.n_head_kv;
  pc.max_pages = opt.kv_pages > 0 ? opt.kv_pages
                                  : std::max<int64_t>(1, opt.contexts) * streams * ((c.n_ctx + opt.page_size - 1) / opt.page_size);
  return pc;
}

Engine::Engine(const Model& model, const EngineOptions& opt)
    : model_(&model),
      opt_(opt),
      threads_(opt.threads),
      kv_(default_pool_config(model.config(), opt), model.config().n_layer, model.config().n_head_kv),
      runner_(model, threads_, opt.max_batch_tokens) {
  if (!opt.kv_cold.empty()) kv_.set_cold_tier(kv::make_cold_tier(opt.kv_cold, kv_.pool().record_bytes(), threads_.size()));
  if (!opt.kv_shared.empty()) {
    kv_identity_ = model_kv_identity(model, kv_.pool().config());
    kv_.set_shared_tier(kv::make_shared_tier(opt.kv_shared, kv_.pool().record_bytes(), kv_.n_streams(), kv_.page_size(), kv_identity_),
                        kv_identity_);
  }
}

GenerateResult Engine::generate(const Request& req, const std::function<bool(std::string_view)>& on_text) {
  // One request, no prefix cache (nothing to share with; and a hit would protect pages from compression,
  // so the output would depend on earlier calls), prefill chunks as large as the runner takes.
  SchedulerOptions so;
  so.max_running = 1;
  so.max_waiting = 1;
  so.step_tokens = opt_.max_batch_tokens;
  so.prefix_cache = false;
  Scheduler sched(*this, so);
  GenerateResult res;
  bool finished = false;
  std::string error;
  uint64_t id = 0;
  id = sched.submit(req, [&](const RequestEvent& ev) {
    if (ev.kind == RequestEvent::Kind::Text) {
      res.text += ev.text;
      if (on_text && !on_text(ev.text)) sched.cancel(id);
      return;
    }
    finished = true;
    res.finish = ev.finish;
    error = ev.error;
    res.tokens = ev.tokens;
    const RequestStats& st = ev.stats;
    res.prompt_tokens = st.prompt_tokens;
    res.prefill_seconds = st.prefill_seconds;
    res.decode_seconds = st.decode_seconds;
    res.decode_steps = st.decode_steps;
    res.kv_pages_in_use = st.kv_pages_in_use;
    res.resident_kv_bytes = static_cast<size_t>(st.kv_pages_in_use) * kv_.pool().page_bytes();
    res.peak_resident_kv_bytes = static_cast<size_t>(st.peak_kv_pages) * kv_.pool().page_bytes();
    res.window_pages_freed = st.window_pages_freed;
    res.compression = st.compression;
    res.evicted = st.evicted;
  });
  while (!finished) sched.step();
  res.pool_reserved_bytes = kv_.pool().reserved_bytes();
  if (res.finish == FinishReason::Error) throw std::runtime_error(error);
  return res;
}

}  // namespace kvpack
