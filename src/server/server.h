// The HTTP server: OpenAI-compatible endpoints over a continuous-batching Scheduler.
//   POST /v1/completions, POST /v1/chat/completions   (JSON or SSE with "stream": true)
//   GET  /v1/models, /v1/models/{id} (404 model_not_found for another id), /health, /metrics (Prometheus text),
//        /kv (live page map) and /kv/state (its JSON)
//   POST /tokenize, /detokenize   (llama-server's fields; server/api.h)
// HTTP is served by the event-driven layer in http_server.h (Boost.Beast / Asio: per-connection
// deadlines, header / body limits, a connection cap, bounded shutdown). Nothing that takes time runs on
// its I/O threads: a generation request's body is parsed and tokenized on a small worker pool (it only
// ever sees complete bodies, so slow clients cannot tie it up), then submitted to the scheduler; its
// RequestChannel notifies the connection's strand, which turns events into one JSON response or SSE
// chunks. A request whose client goes away is cancelled at once (its KV pages return to the pool at
// the next step).
// Errors are OpenAI-shaped JSON: 400 invalid request, 401 bad/missing API key, 404 unknown route,
// 405 wrong method, 408 request too slow, 413 body too large, 429 (+ Retry-After) too many concurrent
// requests or queue full, 431 header too large / too many fields, 503 shutting down or too many
// connections.
// With an API key, every route except /health (and /metrics with metrics_no_auth) needs
// "Authorization: Bearer KEY".
// The concurrency slot of a request is released when its last event has been handled, before the last
// bytes go to the socket: a client that sends its next request after reading the end of the previous
// one always finds the slot free (closed-loop clients at exactly max_concurrent never see a 429).
// Thread-safety: start / stop from one controlling thread.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "engine/engine.h"
#include "engine/scheduler.h"
#include "server/api.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/request_log.h"

namespace kvpack::server {

class RequestChannel;
class WorkerPool;

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback unless asked otherwise
  int port = 8080;                 // 0: any free port (see Server::port())
  std::string api_key;             // empty: no authentication
  std::string model_id;            // name in responses and /v1/models (default: the model's name, spaces → '-')
  ApiLimits limits;
  int32_t max_concurrent = 32;     // generation requests served at once (streams included); more: 429
  compress::CompressConfig default_kv;  // validated by the caller (cli::kv_config)
  SchedulerOptions scheduler;
  bool metrics_no_auth = false;    // GET /metrics without the API key (scrapers on a trusted network)
  HttpLimits http;                 // deadlines, header limits, connection cap (max_body_bytes: limits.max_body_bytes)
  int32_t io_threads = 2;          // I/O threads of the HTTP layer (they never block on a client)
  int32_t worker_threads = 2;      // parse + tokenize request bodies off the I/O threads
  int32_t shutdown_grace_ms = 1000;  // stop(): how long in-flight responses get to finish
  int32_t keepalive_comment_s = 15;  // SSE comment sent on an idle stream (keeps proxies from timing out)
  std::string request_log;         // "": none; "-": stderr; else a file appended to (server/request_log.h)
  bool request_log_prompts = false;  // put each request's body in its log line (what analyze-prefix needs)
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
  // New requests get 503, in-flight ones are cancelled and answered (503 / an SSE error event with code
  // shutting_down), idle and half-read connections are closed at once; after shutdown_grace_ms whatever
  // is still open is closed, then the scheduler stops. Returns within about grace + 0.3 s. Idempotent.
  void stop();

  int port() const { return port_; }
  const ServerOptions& options() const { return opt_; }
  Engine& engine() { return *engine_; }
  Scheduler& scheduler() { return *sched_; }
  HttpStats http_stats() const;
  const RequestLog* request_log() const { return log_.get(); }
  std::string metrics_text() const;  // what GET /metrics returns

 private:
  struct Slot;
  struct Generation;
  std::shared_ptr<Slot> acquire_slot(ApiError& err);
  bool authorized(const HttpRequest& req) const;
  std::optional<HttpResponse> on_head(const HttpRequest& req);
  void on_request(const std::shared_ptr<Exchange>& ex);
  void handle_generate(const std::shared_ptr<Exchange>& ex, bool chat);  // on the worker pool
  void count_disconnect(bool blocking);
  bool stopping() const;
  Usage usage_of(const RequestEvent& ev) const;  // the usage block of a finished request

  Engine* engine_;
  ServerOptions opt_;
  std::unique_ptr<ChatRenderer> chat_;  // before ctx_, which points at it
  ApiContext ctx_;
  std::unique_ptr<Scheduler> sched_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<WorkerPool> workers_;
  std::unique_ptr<RequestLog> log_;  // null without ServerOptions::request_log
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
  HttpServer* http_live_ = nullptr;  // http_ while it serves (for its counters); guarded by mu_
  HttpCounters http_final_;          // its counters when it stopped
};

}  // namespace kvpack::server
