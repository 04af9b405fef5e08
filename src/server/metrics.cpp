#include "server/metrics.h"

#include <cstdio>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <utility>

namespace kvpack::server {
namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);  // round-trips; integers print without exponent below 2^53
  return buf;
}
std::string num(int64_t v) { return std::to_string(v); }
std::string num(uint64_t v) { return std::to_string(v); }

class Writer {
 public:
  template <class T>
  void metric(const char* type, const std::string& name, const char* help, T value) {
    head(type, name, help);
    os_ << name << ' ' << num(value) << '\n';
  }
  void head(const char* type, const std::string& name, const char* help) {
    os_ << "# HELP " << name << ' ' << help << '\n' << "# TYPE " << name << ' ' << type << '\n';
  }
  template <class T>
  void sample(const std::string& name_and_labels, T value) { os_ << name_and_labels << ' ' << num(value) << '\n'; }
  // A counter split by one label: name{label="value"} per entry, in the order given.
  void by_label(const std::string& name, const char* help, const char* label,
                std::initializer_list<std::pair<const char*, int64_t>> values) {
    head("counter", name, help);
    for (const auto& [value, n] : values) sample(name + '{' + label + "=\"" + value + "\"}", n);
  }
  void histogram(const std::string& name, const char* help, const Histogram& h) { histogram(name, help, h, ""); }
  // A labelled sample; `labels` is the inside of the braces ("" = none).
  template <class T>
  void labeled(const std::string& name, const std::string& labels, T value) {
    sample(labels.empty() ? name : name + '{' + labels + '}', value);
  }
  void histogram(const std::string& name, const char* help, const Histogram& h, const std::string& labels) {
    head("histogram", name, help);
    const std::string pre = labels.empty() ? "" : labels + ',';
    uint64_t cum = 0;
    for (size_t i = 0; i < h.bounds.size(); ++i) {
      cum += h.counts[i];
      char le[64];
      std::snprintf(le, sizeof le, "%g", h.bounds[i]);
      sample(name + "_bucket{" + pre + "le=\"" + le + "\"}", cum);
    }
    if (!h.counts.empty()) cum += h.counts.back();
    sample(name + "_bucket{" + pre + "le=\"+Inf\"}", cum);
    labeled(name + "_sum", labels, h.sum);
    labeled(name + "_count", labels, h.count);
  }
  std::string str() const { return os_.str(); }

 private:
  std::ostringstream os_;
};

// One family per compression figure, one sample per policy that ran (none before the first compressed
// request: no made-up zeros).
template <class F>
void per_policy(Writer& w, const SchedulerMetrics& m, const char* type, const std::string& name, const char* help, F value) {
  w.head(type, name, help);
  for (const auto& [policy, st] : m.compression_by_policy) {
    const std::optional<double> v = value(st);
    if (v) w.labeled(name, "policy=\"" + escape_label_value(policy) + '"', *v);
  }
}

std::optional<double> count(double v) { return v; }

}  // namespace

std::string escape_label_value(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char ch : v) {
    if (ch == '\\') out += "\\\\";
    else if (ch == '"') out += "\\\"";
    else if (ch == '\n') out += "\\n";
    else out += ch;
  }
  return out;
}

std::string render_prometheus(const SchedulerMetrics& m, const HttpStats& h, const MetricsContext& ctx) {
  Writer w;
  const int64_t kv_streams = ctx.kv_streams;
  const std::string model = "model_name=\"" + escape_label_value(ctx.model_name) + '"';
  // vLLM's names for the same concepts (see metrics.h).
  w.head("gauge", "vllm:num_requests_running", "Requests in the running batch.");
  w.labeled("vllm:num_requests_running", model, m.running);
  w.head("gauge", "vllm:num_requests_waiting", "Requests waiting for admission (preempted ones included).");
  w.labeled("vllm:num_requests_waiting", model, m.waiting);
  w.head("gauge", "vllm:kv_cache_usage_perc",
         "Fraction of KV pages held by running sequences (0-1); cached-free prefix pages count as free (kvpack_kv_pages_by_state).");
  w.labeled("vllm:kv_cache_usage_perc", model, m.pages_total > 0 ? static_cast<double>(m.pages_used) / static_cast<double>(m.pages_total) : 0.0);
  w.head("counter", "vllm:prompt_tokens_total", "Prompt tokens of admitted requests.");
  w.labeled("vllm:prompt_tokens_total", model, m.prompt_tokens);
  w.head("counter", "vllm:generation_tokens_total", "Tokens generated.");
  w.labeled("vllm:generation_tokens_total", model, m.generated_tokens);
  w.head("counter", "vllm:num_preemptions_total", "Running sequences preempted to free KV pages (kvpack_preemptions_total splits them by victim policy).");
  w.labeled("vllm:num_preemptions_total", model, m.preemptions_lru + m.preemptions_lfu + m.preemptions_priority);
  w.head("counter", "vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache (full blocks).");
  w.labeled("vllm:prefix_cache_queries_total", model, m.prefix.blocks_queried * ctx.page_size);
  w.head("counter", "vllm:prefix_cache_hits_total", "Prompt tokens whose KV the prefix cache supplied (either tier).");
  w.labeled("vllm:prefix_cache_hits_total", model, m.prefix.tokens_hit);
  w.head("counter", "vllm:request_success_total", "Requests finished, by finished_reason (stop: end-of-generation or a stop string; length: max_tokens or the context; abort: cancelled).");
  w.labeled("vllm:request_success_total", model + ",finished_reason=\"stop\"", m.finished_stop);
  w.labeled("vllm:request_success_total", model + ",finished_reason=\"length\"", m.finished_length);
  w.labeled("vllm:request_success_total", model + ",finished_reason=\"abort\"", m.requests_cancelled);
  w.histogram("vllm:time_to_first_token_seconds", "Time from submission to the first generated token.", m.ttft, model);
  w.histogram("vllm:inter_token_latency_seconds", "Time between consecutive tokens of a request.", m.itl, model);
  w.histogram("vllm:e2e_request_latency_seconds", "Submission to finish, per finished request.", m.e2e, model);
  w.histogram("vllm:request_queue_time_seconds", "Submission to first admission, per finished request.", m.queue, model);
  w.histogram("vllm:request_prefill_time_seconds", "First admission to first token, per finished request.", m.prefill, model);
  w.histogram("vllm:request_decode_time_seconds", "First token to finish, per finished request.", m.decode, model);
  w.histogram("vllm:request_prompt_tokens", "Prompt tokens per finished request.", m.request_prompt_tokens, model);
  w.histogram("vllm:request_generation_tokens", "Generated tokens per finished request.", m.request_generation_tokens, model);
  const auto& p = m.prefix;
  // KV page pool.
  w.metric("gauge", "kvpack_kv_pages_total", "KV page pool capacity in pages.", m.pages_total);
  w.metric("gauge", "kvpack_kv_pages_used", "KV pages named by running sequences.", m.pages_used);
  w.metric("gauge", "kvpack_kv_pages_free", "KV pages free (cached-free pages included: they are reused lazily).", m.pages_free);
  w.metric("gauge", "kvpack_kv_pages_cached_free", "Free KV pages still holding prefix-cache blocks (reused last, LRU).",
           m.pages_cached_free);
  w.metric("gauge", "kvpack_kv_page_bytes", "Bytes per KV page (K and V).", m.page_bytes);
  w.metric("gauge", "kvpack_kv_resident_bytes", "Bytes of KV pages in use.", m.resident_kv_bytes);
  w.head("gauge", "kvpack_kv_pages_by_state", "KV pages by state: active (held by running sequences), cached (free but still holding prefix-cache blocks, reused last), free.");
  w.labeled("kvpack_kv_pages_by_state", "state=\"active\"", m.pages_used);
  w.labeled("kvpack_kv_pages_by_state", "state=\"cached\"", m.pages_cached_free);
  w.labeled("kvpack_kv_pages_by_state", "state=\"free\"", m.pages_free - m.pages_cached_free);
  // Compression, by policy.
  per_policy(w, m, "counter", "kvpack_kv_compactions_total", "KV compression events (evict + compact).",
             [](const compress::CompressionStats& c) { return count(static_cast<double>(c.events)); });
  per_policy(w, m, "counter", "kvpack_kv_evicted_slots_total", "KV slots evicted, summed over layers and KV heads.",
             [](const compress::CompressionStats& c) { return count(static_cast<double>(c.evicted_slots)); });
  per_policy(w, m, "counter", "kvpack_kv_evicted_tokens_total", "KV slots evicted divided by the number of (layer, KV head) streams.",
             [&](const compress::CompressionStats& c) { return count(static_cast<double>(kv_streams > 0 ? c.evicted_slots / kv_streams : 0)); });
  per_policy(w, m, "counter", "kvpack_kv_evicted_bytes_total", "Bytes of K/V evicted.",
             [](const compress::CompressionStats& c) { return count(static_cast<double>(c.evicted_bytes)); });
  per_policy(w, m, "counter", "kvpack_kv_freed_pages_total", "KV pages returned to the pool by compaction.",
             [](const compress::CompressionStats& c) { return count(static_cast<double>(c.freed_pages)); });
  per_policy(w, m, "counter", "kvpack_kv_freed_bytes_total", "Bytes of KV pages returned to the pool by compaction.",
             [](const compress::CompressionStats& c) { return count(static_cast<double>(c.freed_bytes)); });
  per_policy(w, m, "gauge", "kvpack_kv_reclaim_efficiency", "Freed bytes / evicted bytes (1 = every evicted byte came back as free pages); no sample before the policy's first eviction.",
             [](const compress::CompressionStats& c) { return c.evicted_bytes > 0 ? std::optional<double>(c.reclaim_efficiency()) : std::nullopt; });
  per_policy(w, m, "counter", "kvpack_kv_compaction_seconds_total", "Time spent scoring, selecting and compacting.",
             [](const compress::CompressionStats& c) { return count(c.seconds); });
  // Prefix cache.
  w.metric("counter", "kvpack_kv_forks_total", "Choices 1..n-1 of n > 1 requests forked from a prefilled prompt (its pages shared copy-on-write).", m.forks);
  w.metric("counter", "kvpack_kv_fork_pages_saved_total", "Full prompt KV pages forked choices took by reference instead of allocating.", m.fork_pages_saved);
  w.metric("counter", "kvpack_kv_window_pages_freed_total",
           "KV pages of sliding-window layers returned to the pool as they fell out of the window.", m.window_pages_freed);
  w.metric("counter", "kvpack_prefix_cache_queries_total", "Prefix cache lookups (one per admission).", p.queries);
  w.metric("counter", "kvpack_prefix_cache_hits_total", "Lookups that reused at least one block.", p.hits);
  w.metric("counter", "kvpack_prefix_cache_hit_tokens_total", "Prompt tokens whose KV was reused.", p.tokens_hit);
  w.metric("counter", "kvpack_prefix_cache_blocks_queried_total", "Full blocks looked up.", p.blocks_queried);
  w.metric("counter", "kvpack_prefix_cache_blocks_hit_total", "Blocks reused.", p.blocks_hit);
  w.metric("counter", "kvpack_prefix_cache_evictions_total", "Blocks dropped from the prefix cache.", p.evictions);
  w.metric("gauge", "kvpack_prefix_cache_blocks", "Blocks held by the prefix cache.", p.cached_blocks);
  w.by_label("kvpack_prefix_cache_hit_blocks_by_tier_total", "Prefix-cache blocks reused, by the tier they came from.", "tier",
             {{"hot", p.blocks_hit - p.blocks_hit_cold - p.blocks_hit_shared}, {"cold", p.blocks_hit_cold}, {"shared", p.blocks_hit_shared}});
  w.metric("counter", "kvpack_prefix_cache_shared_hit_tokens_total", "Prompt tokens whose KV came from the shared tier (computed by another replica).",
           p.tokens_hit_shared);
  w.metric("counter", "kvpack_prefix_cache_published_blocks_total", "Blocks handed to the shared tier's writer when registered.",
           p.blocks_published);
  w.metric("counter", "kvpack_prefix_cache_publish_dropped_total", "Blocks not published: writer queue full or breaker open.",
           p.publish_dropped);
  // Shared tier (Redis): prefix blocks across replicas. Round trips that fail never fail a request.
  {
    const auto& t = m.shared;
    w.metric("gauge", "kvpack_kv_shared_enabled", "1 when a shared tier (--kv-shared) is configured.", int64_t{m.has_shared_tier ? 1 : 0});
    w.metric("counter", "kvpack_kv_shared_fetches_total", "Lookups sent to the shared tier (one round trip each).", t.fetches);
    w.metric("counter", "kvpack_kv_shared_hits_total", "Blocks found valid in the shared tier.", t.hits);
    w.metric("counter", "kvpack_kv_shared_misses_total", "Lookups whose next block was absent or invalid (ends the prefix).", t.misses);
    w.metric("counter", "kvpack_kv_shared_checksum_failures_total", "Values rejected by checksum, header or token check (misses).",
             t.checksum_failures);
    w.metric("counter", "kvpack_kv_shared_puts_total", "Blocks written to the shared tier.", t.puts);
    w.metric("counter", "kvpack_kv_shared_put_failures_total", "Blocks lost to a store error or timeout.", t.put_failures);
    w.metric("counter", "kvpack_kv_shared_puts_dropped_total", "Blocks not written: queue full or breaker open.", t.puts_dropped);
    w.metric("counter", "kvpack_kv_shared_read_bytes_total", "Bytes read from the shared tier.", t.bytes_read);
    w.metric("counter", "kvpack_kv_shared_written_bytes_total", "Bytes written to the shared tier.", t.bytes_written);
    w.metric("counter", "kvpack_kv_shared_errors_total", "Failed round trips (refused, reset, timed out).", t.errors);
    w.metric("counter", "kvpack_kv_shared_timeouts_total", "Round trips past the timeout (included in errors).", t.timeouts);
    w.metric("counter", "kvpack_kv_shared_breaker_opens_total", "Times the circuit breaker opened.", t.breaker_opens);
    w.metric("counter", "kvpack_kv_shared_breaker_refused_total", "Calls answered locally while the breaker was open.", t.breaker_refused);
    w.metric("gauge", "kvpack_kv_shared_breaker_state", "Circuit breaker: 0 closed, 1 open, 2 half-open.", static_cast<int64_t>(t.breaker_state));
    w.metric("gauge", "kvpack_kv_shared_queue_bytes", "Publications waiting for the writer.", t.queue_bytes);
  }
  w.metric("counter", "kvpack_prefix_cache_spilled_blocks_total", "Blocks written to the cold tier when their pages were reused.",
           p.blocks_spilled);
  // Cold tier (swap preemption, prefix spill).
  const auto& k = m.cold;
  w.metric("gauge", "kvpack_kv_cold_capacity_bytes", "Cold tier capacity (0: no cold tier).", k.tier.cap_bytes);
  w.metric("gauge", "kvpack_kv_cold_used_bytes", "Cold tier bytes in use.", k.tier.used_bytes);
  w.metric("gauge", "kvpack_kv_cold_records", "Pages stored in the cold tier.", k.tier.records);
  w.metric("counter", "kvpack_kv_cold_pages_written_total", "Pages written to the cold tier.", k.tier.puts - k.tier.put_failures);
  w.metric("counter", "kvpack_kv_cold_pages_read_total", "Pages read back from the cold tier.", k.tier.hits);
  w.metric("counter", "kvpack_kv_cold_checksum_misses_total", "Cold reads rejected by their checksum or short (treated as misses).",
           k.tier.checksum_failures);
  w.metric("counter", "kvpack_kv_cold_evictions_total", "Cold-tier records dropped to make room (LRU).", k.tier.evictions);
  const auto& e = m.evicted;
  w.metric("counter", "kvpack_kv_cold_evicted_pages_total", "Pages of compression-evicted tokens written to the cold tier.",
           e.pages_written);
  w.metric("counter", "kvpack_kv_cold_evicted_tokens_total", "Evicted slots (summed over layer x KV-head streams) kept in the cold tier.",
           e.slots_written);
  w.metric("counter", "kvpack_kv_cold_evicted_refused_total", "Evicted pages the cold tier could not take (discarded instead).",
           e.pages_refused);
  w.metric("counter", "kvpack_kv_cold_evicted_lost_total", "Evicted cold pages found gone when read (LRU, checksum) or refused.",
           e.pages_lost);
  per_policy(w, m, "counter", "kvpack_kv_recall_checks_total", "Recall checks (digest bounds scored against the latest queries).",
             [](const compress::CompressionStats& c) { return count(static_cast<double>(c.recall.checks)); });
  per_policy(w, m, "counter", "kvpack_kv_recall_pages_read_total", "Cold pages read by recall to measure them exactly.",
             [](const compress::CompressionStats& c) { return count(static_cast<double>(c.recall.pages_read)); });
  per_policy(w, m, "counter", "kvpack_kv_recall_pages_total", "Cold pages recalled into the hot set.",
             [](const compress::CompressionStats& c) { return count(static_cast<double>(c.recall.pages_recalled)); });
  per_policy(w, m, "counter", "kvpack_kv_recall_seconds_total", "Time spent in recall checks.",
             [](const compress::CompressionStats& c) { return count(c.recall.seconds); });
  per_policy(w, m, "gauge", "kvpack_kv_drift_max", "Largest drift estimate seen (share of attention evicted keys could hold); no sample before the first recall check.",
             [](const compress::CompressionStats& c) { return c.recall.checks > 0 ? std::optional<double>(c.recall.drift_max) : std::nullopt; });
  per_policy(w, m, "counter", "kvpack_kv_exact_checks_total", "Exact drift checks (the newest token computed again over every KV).",
             [](const compress::CompressionStats& c) { return count(static_cast<double>(c.recall.exact_checks)); });
  per_policy(w, m, "counter", "kvpack_kv_exact_flips_total", "Exact drift checks whose most likely next token differed with every KV.",
             [](const compress::CompressionStats& c) { return count(static_cast<double>(c.recall.exact_flips)); });
  per_policy(w, m, "counter", "kvpack_kv_guard_fallbacks_total", "Requests a drift guard sent back to full KV.",
             [](const compress::CompressionStats& c) { return count(static_cast<double>(c.recall.guard_fallbacks)); });
  per_policy(w, m, "counter", "kvpack_kv_guard_fallbacks_incomplete_total",
             "Fallbacks to full KV that could not bring every evicted token back (pool full or tier pages lost): those requests' outputs are not full KV's.",
             [](const compress::CompressionStats& c) { return count(static_cast<double>(c.recall.guard_fallbacks_incomplete)); });
  per_policy(w, m, "counter", "kvpack_kv_guard_fallbacks_refused_total",
             "Requests a drift guard flagged that stayed compressed: the KV pool cannot hold their whole KV.",
             [](const compress::CompressionStats& c) { return count(static_cast<double>(c.recall.guard_fallbacks_refused)); });
  w.metric("gauge", "kvpack_kv_cold_digest_bytes", "Hot memory held by the key digests of evicted cold pages (live sequences).",
           e.digest_bytes);
  w.metric("counter", "kvpack_kv_swap_outs_total", "Preempted sequences whose pages went to the cold tier.", k.swap_outs);
  w.metric("counter", "kvpack_kv_swap_ins_total", "Swapped-out sequences brought back bit-identical.", k.swap_ins);
  w.metric("counter", "kvpack_kv_swap_out_failures_total", "Swap-outs the cold tier could not take (recomputed instead).",
           k.swap_out_failures);
  w.metric("counter", "kvpack_kv_swap_in_misses_total", "Swap-ins that lost a record (recomputed instead).", k.swap_in_misses);
  w.metric("counter", "kvpack_kv_recomputes_total", "Preemptions (or lost swaps) that recomputed the KV from text.", m.recomputes);
  w.histogram("kvpack_kv_swap_out_seconds", "Time to write a preempted sequence's pages to the cold tier.", m.swap_out);
  w.histogram("kvpack_kv_swap_in_seconds", "Time to bring a swapped-out sequence back.", m.swap_in);
  // Scheduling.
  w.by_label("kvpack_preemptions_total", "Running sequences preempted (swapped out or recomputed) to free KV pages, by victim policy.",
             "reason", {{"lru", m.preemptions_lru}, {"lfu", m.preemptions_lfu}, {"priority", m.preemptions_priority}});
  w.metric("gauge", "kvpack_requests_peak_running", "Largest running batch seen.", m.peak_running);
  w.metric("counter", "kvpack_requests_failed_total", "Requests that ended with an error.", m.requests_failed);
  w.metric("counter", "kvpack_scheduler_steps_total", "Scheduler steps (batched forward passes).", m.steps);
  // HTTP layer.
  w.metric("gauge", "kvpack_http_active_requests", "Generation requests being served.", h.active_requests);
  w.metric("gauge", "kvpack_http_max_concurrent_requests", "Concurrency limit (--max-concurrent).", h.max_concurrent);
  w.by_label("kvpack_http_rejected_total", "Requests refused before generation, by reason.", "reason",
             {{"concurrency", h.rejected_concurrency}, {"queue_full", h.rejected_queue_full}, {"shutdown", h.rejected_shutdown}});
  w.metric("counter", "kvpack_http_client_disconnects_total", "Requests cancelled because the client disconnected.",
           h.client_disconnects);
  w.metric("gauge", "kvpack_http_connections_open", "Client connections open.", h.connections_open);
  w.metric("gauge", "kvpack_http_max_connections", "Connection cap (--max-connections).", h.max_connections);
  w.metric("counter", "kvpack_http_connections_accepted_total", "Client connections accepted (under the cap).", h.connections_accepted);
  w.metric("counter", "kvpack_http_connections_rejected_total", "Connections refused (503 and closed) because the cap was reached.",
           h.connections_rejected);
  w.by_label("kvpack_http_timeouts_total", "Connections closed by a deadline, by phase (header / body: 408; idle: keep-alive; write: client not reading).",
             "phase", {{"header", h.timeouts_header}, {"body", h.timeouts_body}, {"idle", h.timeouts_idle}, {"write", h.timeouts_write}});
  w.head("counter", "kvpack_http_responses_total", "HTTP responses by status code.");
  for (const auto& [code, n] : h.responses) w.sample("kvpack_http_responses_total{code=\"" + std::to_string(code) + "\"}", n);
  return w.str();
}

}  // namespace kvpack::server
