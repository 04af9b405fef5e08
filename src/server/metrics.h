// GET /metrics: the scheduler's metrics snapshot (and the HTTP layer's own counters) in the
// Prometheus text exposition format, version 0.0.4. Every family gets # HELP and # TYPE lines.
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

// kv_streams: layers x KV heads (evicted slots / streams = evicted tokens).
std::string render_prometheus(const SchedulerMetrics& m, const HttpStats& h, int64_t kv_streams);

}  // namespace kvpack::server
