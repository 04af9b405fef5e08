// GET /metrics: the scheduler's metrics snapshot (and the HTTP layer's own counters) in the
// Prometheus text exposition format, version 0.0.4. Every family gets # HELP and # TYPE lines.
// Names: where the concept is the same as one of vLLM's, the family has vLLM's exact name and type
// (`vllm:num_requests_running`, `vllm:kv_cache_usage_perc`, `vllm:time_to_first_token_seconds`, ...) with
// its `model_name` label, so dashboards and routers built for vLLM (its Grafana dashboard, llm-d's and
// production-stack's routers read these) work unchanged; everything vLLM has no name for is `kvpack_*`.
// Compression families carry a `policy` label (requests choose their policy). A ratio or maximum that is
// undefined before its first event (reclaim efficiency before any eviction, drift before any recall
// check) has no sample until then, rather than a made-up 0.
// KV accounting comes straight from SchedulerMetrics (which the scheduler publishes from the pool at
// the end of each step), so the numbers agree with the pool's own counters.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "engine/scheduler.h"

namespace kvpack::server {

struct HttpStats {
  int64_t active_requests = 0;        // generation requests being served (streams included)
  int64_t max_concurrent = 0;
  int64_t rejected_concurrency = 0;   // 429: too many concurrent requests
  int64_t rejected_queue_full = 0;    // 429: scheduler queue full
  int64_t rejected_shutdown = 0;      // 503
  int64_t client_disconnects = 0;     // requests cancelled because the client went away
  // Connections (the HTTP layer's counters).
  int64_t connections_open = 0, max_connections = 0;
  int64_t connections_accepted = 0;
  int64_t connections_rejected = 0;   // over max_connections: canned 503 and closed
  int64_t timeouts_header = 0, timeouts_body = 0, timeouts_idle = 0, timeouts_write = 0;
  std::map<int, int64_t> responses;   // by HTTP status
};

struct MetricsContext {
  int64_t kv_streams = 0;   // layers x KV heads (evicted slots / streams = evicted tokens)
  std::string model_name;   // the `model_name` label of the vllm: families (the served model id)
  int32_t page_size = 0;    // KV page size in tokens (prefix-cache blocks -> tokens)
};

std::string render_prometheus(const SchedulerMetrics& m, const HttpStats& h, const MetricsContext& ctx);
// A label value escaped for the exposition format (backslash, double quote, newline).
std::string escape_label_value(const std::string& v);

}  // namespace kvpack::server
