// The HTTP/1.1 layer of `kvpack serve`: an event-driven server on Boost.Beast (parsing) and Boost.Asio
// (sockets, timers), with no knowledge of the OpenAI API. A few I/O threads run every connection; no
// thread ever blocks on a client, so slow or idle clients cost a socket and a few KB, never a thread.
//
// Per connection, one request at a time (HTTP/1.1 keep-alive; pipelined requests are queued in the
// read buffer and answered in order):
//   * deadlines: the whole request header must arrive within `header_timeout` (from the accept, or from
//     the first byte of a keep-alive request), the body within `body_timeout` after the header, the
//     first byte of the next keep-alive request within `idle_timeout`; a response write (each write of a
//     stream) must complete within `write_timeout`. A header or body deadline answers 408 and closes; the
//     idle deadline closes quietly; a write deadline closes and counts as the client going away.
//   * limits: more than `max_headers` header fields or a header (request line included) over
//     `max_header_bytes` → 431; a body over `max_body_bytes` (Content-Length or chunked) → 413; any other
//     malformed request → 400. Each is an OpenAI-shaped JSON error (`error_response`) and the connection
//     is closed after it (with a short lingering read, so the client sees the answer, not a reset).
//     Memory per connection is bounded by the header limit plus what the body actually sent.
//   * connections beyond `max_connections` are accepted and closed at once with a canned 503 (counted),
//     so the kernel backlog never fills up behind them.
//   * a handler answers on the connection's strand (respond, or begin_stream / write / end_stream), at
//     once or later: work that takes time runs elsewhere and comes back with Exchange::post. While a
//     request is being handled the connection keeps a read open, so a client that hangs up (or half-
//     closes) is noticed at once and the handler's on_gone callback runs.
//   * stop(grace): stops accepting, closes every connection that is not in the middle of a request, lets
//     the others finish their response (no keep-alive) for at most `grace`, then closes what is left and
//     joins the I/O threads.
// The listening socket sets SO_REUSEADDR (restart while old connections are in TIME_WAIT) but never
// SO_REUSEPORT: a port that another process listens on is an error at listen().
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/http_request.h"

namespace kvpack::server {

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  HttpHeaders headers;  // extra ones (Retry-After, ...)
};

// One request and its response. The strand-only methods must be called on the connection's strand:
// inside HttpHandlers::on_request or a function passed to post(). After the connection has closed they
// do nothing.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual const HttpRequest& request() const = 0;
  // Strand only. The whole response; afterwards the connection reads its next request (or closes).
  virtual void respond(HttpResponse r) = 0;
  // Strand only. A streamed response: the head now (chunked transfer encoding), then any number of
  // write()s, then end_stream(). When nothing was written for `ping_every`, `ping` is written.
  virtual void begin_stream(HttpResponse head, std::chrono::milliseconds ping_every, std::string ping) = 0;
  virtual void write(std::string_view data) = 0;
  virtual void end_stream() = 0;
  // Strand only. `f` runs (on the strand, once) if the client goes away, a write fails or times out, or
  // the server closes the connection before the response is complete.
  virtual void on_gone(std::function<void()> f) = 0;
  // Strand only. Keeps `state` alive until the exchange ends (response written or connection closed).
  virtual void keep(std::shared_ptr<void> state) = 0;
  virtual bool gone() const = 0;  // strand only
  // Any thread: runs `f` on the connection's strand (never inline). `f` runs even if the connection
  // has closed meanwhile (the strand-only methods then do nothing), unless the server has stopped.
  virtual void post(std::function<void()> f) = 0;
};

struct HttpHandlers {
  // On the strand, once the header is read: a response to send instead of reading the body (the
  // connection is closed after it), or nullopt to read the body and call on_request.
  std::function<std::optional<HttpResponse>(const HttpRequest& head)> on_head;
  // On the strand with the whole request. Must not block: answer now or later (Exchange::post).
  std::function<void(const std::shared_ptr<Exchange>&)> on_request;
  // The body of an error the HTTP layer produces itself (408, 413, 431, 400, 503).
  std::function<HttpResponse(int status, const std::string& message, const std::string& code)> error_response;
  // Every response status as its head is handed to the socket (for metrics). Any I/O thread.
  std::function<void(int status)> on_response;
};

struct HttpCounters {
  int64_t connections_open = 0;
  int64_t connections_accepted = 0;   // total
  int64_t connections_rejected = 0;   // refused: max_connections reached
  int64_t timeouts_header = 0, timeouts_body = 0, timeouts_idle = 0, timeouts_write = 0;
  int64_t accept_errors = 0;          // e.g. EMFILE (the accept loop backs off)
};

class HttpServer {
 public:
  HttpServer(HttpLimits limits, HttpHandlers handlers, int io_threads);
  ~HttpServer();  // stop(0) if still running
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens (backlog 1024); returns the port (port 0: any free one). Throws
  // std::runtime_error naming host:port and the reason (e.g. "address already in use").
  int listen(const std::string& host, int port);
  void start();  // the I/O threads; call after listen()
  // Bounded shutdown (see the file comment). Idempotent; returns within about grace + 0.2 s.
  void stop(std::chrono::milliseconds grace);

  HttpCounters counters() const;
  const HttpLimits& limits() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvpack::server
