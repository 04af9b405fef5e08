#include "server/metrics.h"

#include <cstdio>
#include <initializer_list>
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
  void histogram(const std::string& name, const char* help, const Histogram& h) {
    head("histogram", name, help);
    uint64_t cum = 0;  // Prometheus buckets are cumulative; Histogram's are per bucket
    for (size_t i = 0; i < h.bounds.size(); ++i) {
      cum += h.counts[i];
      char le[64];
      std::snprintf(le, sizeof le, "%g", h.bounds[i]);
      sample(name + "_bucket{le=\"" + le + "\"}", cum);
    }
    if (!h.counts.empty()) cum += h.counts.back();
    sample(name + "_bucket{le=\"+Inf\"}", cum);
    sample(name + "_sum", h.sum);
    sample(name + "_count", h.count);
  }
  std::string str() const { return os_.str(); }

 private:
  std::ostringstream os_;
};

}  // namespace

std::string render_prometheus(const SchedulerMetrics& m, const HttpStats& h, int64_t kv_streams) {
  Writer w;
  const auto& c = m.compression;
  const auto& p = m.prefix;
  // KV page pool.
  w.metric("gauge", "kvpack_kv_pages_total", "KV page pool capacity in pages.", m.pages_total);
  w.metric("gauge", "kvpack_kv_pages_used", "KV pages named by running sequences.", m.pages_used);
  w.metric("gauge", "kvpack_kv_pages_free", "KV pages free (cached-free pages included: they are reused lazily).", m.pages_free);
  w.metric("gauge", "kvpack_kv_pages_cached_free", "Free KV pages still holding prefix-cache blocks (reused last, LRU).",
           m.pages_cached_free);
  w.metric("gauge", "kvpack_kv_page_bytes", "Bytes per KV page (K and V).", m.page_bytes);
  w.metric("gauge", "kvpack_kv_resident_bytes", "Bytes of KV pages in use.", m.resident_kv_bytes);
  // Compression.
  w.metric("counter", "kvpack_kv_compactions_total", "KV compression events (evict + compact).", c.events);
  w.metric("counter", "kvpack_kv_evicted_slots_total", "KV slots evicted, summed over layers and KV heads.", c.evicted_slots);
  w.metric("counter", "kvpack_kv_evicted_tokens_total", "KV slots evicted divided by the number of (layer, KV head) streams.",
           kv_streams > 0 ? c.evicted_slots / kv_streams : 0);
  w.metric("counter", "kvpack_kv_evicted_bytes_total", "Bytes of K/V evicted.", c.evicted_bytes);
  w.metric("counter", "kvpack_kv_freed_pages_total", "KV pages returned to the pool by compaction.", c.freed_pages);
  w.metric("counter", "kvpack_kv_freed_bytes_total", "Bytes of KV pages returned to the pool by compaction.", c.freed_bytes);
  w.metric("gauge", "kvpack_kv_reclaim_efficiency", "Freed bytes / evicted bytes (1 = every evicted byte came back as free pages).",
           c.reclaim_efficiency());
  w.metric("counter", "kvpack_kv_compaction_seconds_total", "Time spent scoring, selecting and compacting.", c.seconds);
  // Prefix cache.
  w.metric("counter", "kvpack_prefix_cache_queries_total", "Prefix cache lookups (one per admission).", p.queries);
  w.metric("counter", "kvpack_prefix_cache_hits_total", "Lookups that reused at least one block.", p.hits);
  w.metric("counter", "kvpack_prefix_cache_hit_tokens_total", "Prompt tokens whose KV was reused.", p.tokens_hit);
  w.metric("counter", "kvpack_prefix_cache_blocks_queried_total", "Full blocks looked up.", p.blocks_queried);
  w.metric("counter", "kvpack_prefix_cache_blocks_hit_total", "Blocks reused.", p.blocks_hit);
  w.metric("counter", "kvpack_prefix_cache_evictions_total", "Blocks dropped from the prefix cache.", p.evictions);
  w.metric("gauge", "kvpack_prefix_cache_blocks", "Blocks held by the prefix cache.", p.cached_blocks);
  w.by_label("kvpack_prefix_cache_hit_blocks_by_tier_total", "Prefix-cache blocks reused, by the tier they came from.", "tier",
             {{"hot", p.blocks_hit - p.blocks_hit_cold}, {"cold", p.blocks_hit_cold}});
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
  const auto& rc = m.compression.recall;
  w.metric("counter", "kvpack_kv_recall_checks_total", "Recall checks (digest bounds scored against the latest queries).", rc.checks);
  w.metric("counter", "kvpack_kv_recall_pages_read_total", "Cold pages read by recall to measure them exactly.", rc.pages_read);
  w.metric("counter", "kvpack_kv_recall_pages_total", "Cold pages recalled into the hot set.", rc.pages_recalled);
  w.metric("counter", "kvpack_kv_recall_seconds_total", "Time spent in recall checks.", rc.seconds);
  w.metric("gauge", "kvpack_kv_drift_max", "Largest drift estimate seen (share of attention evicted keys could hold).", rc.drift_max);
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
  w.metric("gauge", "kvpack_requests_running", "Sequences in the running batch.", m.running);
  w.metric("gauge", "kvpack_requests_waiting", "Requests queued for admission.", m.waiting);
  w.metric("gauge", "kvpack_requests_peak_running", "Largest running batch seen.", m.peak_running);
  w.metric("counter", "kvpack_requests_finished_total", "Requests that completed (stop, eos, length).", m.requests_finished);
  w.metric("counter", "kvpack_requests_cancelled_total", "Requests cancelled (e.g. the client went away).", m.requests_cancelled);
  w.metric("counter", "kvpack_requests_failed_total", "Requests that ended with an error.", m.requests_failed);
  w.metric("counter", "kvpack_prompt_tokens_total", "Prompt tokens processed.", m.prompt_tokens);
  w.metric("counter", "kvpack_generated_tokens_total", "Tokens generated.", m.generated_tokens);
  w.metric("counter", "kvpack_scheduler_steps_total", "Scheduler steps (batched forward passes).", m.steps);
  w.histogram("kvpack_time_to_first_token_seconds", "Time from submission to the first generated token.", m.ttft);
  w.histogram("kvpack_inter_token_latency_seconds", "Time between consecutive tokens of a request.", m.itl);
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
