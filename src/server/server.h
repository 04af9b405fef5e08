// The HTTP server: OpenAI-compatible endpoints over a continuous-batching Scheduler.
//   POST /v1/completions, POST /v1/chat/completions   (JSON or SSE with "stream": true)
//   GET  /v1/models, /health, /metrics (Prometheus text)
// Each generation request gets a RequestChannel: the scheduler thread pushes its events, the
// handler thread drains them into one JSON response or into SSE chunks. A request whose client goes
// away is cancelled at once (its KV pages return to the pool at the next step).
// Errors are OpenAI-shaped JSON: 400 invalid request, 401 bad/missing API key, 404 unknown route,
// 413 body too large, 429 (+ Retry-After) too many concurrent requests or queue full, 503 shutting down.
// With an API key, every route except /health needs "Authorization: Bearer KEY".
// Thread-safety: start / stop from one controlling thread; handlers run on httplib's pool.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "engine/engine.h"
#include "engine/scheduler.h"
#include "server/api.h"
#include "server/metrics.h"

namespace httplib {
struct Request;
struct Response;
class ContentReader;
}  // namespace httplib

namespace kvpack::server {

class HttpServer;
class RequestChannel;

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback unless asked otherwise
  int port = 8080;                 // 0: any free port (see Server::port())
  std::string api_key;             // empty: no authentication
  std::string model_id;            // name in responses and /v1/models (default: the model's name)
  ApiLimits limits;
  int32_t max_concurrent = 32;     // generation requests served at once (streams included); more: 429
  compress::CompressConfig default_kv;  // validated by the caller (cli::kv_config)
  SchedulerOptions scheduler;
  int32_t http_threads = 0;        // 0: max_concurrent + 8 (room for /metrics, /health and 429s)
  int32_t poll_ms = 100;           // how often a waiting handler checks for a vanished client
  int32_t keepalive_comment_s = 15;  // SSE comment sent on an idle stream (keeps proxies from timing out)
};

class Server {
 public:
  // The engine (and its model) must outlive the server; set its calibration before, if any.
  Server(Engine& engine, ServerOptions opt);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Starts the scheduler, binds and serves on a background thread; returns the bound port.
  // Throws std::runtime_error when the address cannot be bound.
  int start();
  // New requests get 503, in-flight ones are cancelled and answered (503 / an SSE error event), then
  // the HTTP server and the scheduler stop. Idempotent.
  void stop();

  int port() const { return port_; }
  const ServerOptions& options() const { return opt_; }
  Engine& engine() { return *engine_; }
  Scheduler& scheduler() { return *sched_; }
  HttpStats http_stats() const;
  std::string metrics_text() const;  // what GET /metrics returns

 private:
  struct Slot;
  struct StreamState;
  std::shared_ptr<Slot> acquire_slot(ApiError& err);
  bool authorized(const httplib::Request& req) const;
  void reply_error(httplib::Response& res, const ApiError& e);
  void handle_generate(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader, bool chat);
  void serve_blocking(httplib::Response& res, const std::shared_ptr<Slot>& slot, uint64_t id, const ResponseMeta& meta);
  void serve_stream(httplib::Response& res, const std::shared_ptr<Slot>& slot, uint64_t id, const ResponseMeta& meta,
                    bool include_usage);
  void count_disconnect();
  void abandon(StreamState& st);  // the client of a stream went away: count it, cancel the request
  void routes();
  Usage usage_of(const RequestEvent& ev) const;  // the usage block of a finished request

  Engine* engine_;
  ServerOptions opt_;
  ApiContext ctx_;
  std::unique_ptr<Scheduler> sched_;
  std::unique_ptr<HttpServer> http_;
  std::thread listen_thread_;
  int port_ = 0;
  size_t ctx_page_bytes_ = 0;
  int64_t kv_streams_ = 0;
  int64_t created_ = 0;
  std::mutex control_mu_;  // start / stop
  bool started_ = false;

  // Active requests (guarded by mu_): their channels are closed on shutdown.
  mutable std::mutex mu_;
  bool stopping_ = false;
  std::set<RequestChannel*> channels_;
  HttpStats stats_;
};

}  // namespace kvpack::server
