#include "server/http_server.h"

#include "server/http_request_parser.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_map>

namespace kvpack::server {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

asio::steady_timer::duration seconds(double s) {
  return std::chrono::duration_cast<asio::steady_timer::duration>(std::chrono::duration<double>(s > 0 ? s : 0));
}

std::string format_head(int status, const HttpResponse& r, const std::string& length_header, bool keep_alive, int version) {
  std::string h = "HTTP/1.1 " + std::to_string(status) + " ";
  const auto reason = http::obsolete_reason(static_cast<http::status>(status));
  h.append(reason.data(), reason.size());
  h += "\r\n";
  if (!r.content_type.empty()) h += "Content-Type: " + r.content_type + "\r\n";
  h += length_header;
  if (!keep_alive) h += "Connection: close\r\n";
  else if (version == 10) h += "Connection: keep-alive\r\n";
  for (const auto& [k, v] : r.headers) h += k + ": " + v + "\r\n";
  h += "\r\n";
  return h;
}

class Connection;

}  // namespace

struct HttpServer::Impl {
  Impl(HttpLimits l, HttpHandlers h, int threads) : limits(std::move(l)), handlers(std::move(h)), n_threads(std::max(1, threads)) {
    ioc = std::make_unique<asio::io_context>(n_threads);
    acceptor.emplace(asio::make_strand(*ioc));
    backoff.emplace(acceptor->get_executor());
  }
  ~Impl() {
    work.reset();
    // Whatever is left (connections referenced by queued handlers) goes with the io_context, while
    // the registry and the counters below are still there.
    backoff.reset();
    acceptor.reset();
    ioc.reset();
  }

  void do_accept();
  void on_accept(error_code ec, tcp::socket s);
  void forget(Connection* c);
  std::vector<std::shared_ptr<Connection>> live();

  HttpLimits limits;
  HttpHandlers handlers;
  int n_threads;
  std::string canned_503;  // the answer to a connection over the cap

  mutable std::mutex mu;  // conns, open
  std::condition_variable cv;
  std::unordered_map<Connection*, std::weak_ptr<Connection>> conns;
  int64_t open = 0;
  std::atomic<int64_t> accepted{0}, rejected{0}, accept_errors{0};
  std::atomic<int64_t> t_header{0}, t_body{0}, t_idle{0}, t_write{0};
  std::atomic<bool> stopping{false};
  bool started = false, stopped = false;

  std::unique_ptr<asio::io_context> ioc;
  std::optional<tcp::acceptor> acceptor;
  std::optional<asio::steady_timer> backoff;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::vector<std::thread> threads;
};

namespace {

class ExchangeImpl;

// One client connection. Every member is touched only on the connection's strand (the socket's
// executor), except through ExchangeImpl::post.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(HttpServer::Impl* srv, tcp::socket s)
      : srv_(srv), lim_(srv->limits), sock_(std::move(s)), deadline_(sock_.get_executor()), ping_(sock_.get_executor()),
        buf_(read_buffer_bytes(srv->limits)) {}
  ~Connection() { srv_->forget(this); }

  asio::any_io_executor executor() { return sock_.get_executor(); }

  void start() {
    if (srv_->stopping) return close();
    error_code ec;
    sock_.set_option(tcp::no_delay(true), ec);  // SSE: many small writes; no Nagle + delayed-ACK stalls
    start_header();
  }

  // Server stopping: connections between requests (or reading one) close now; one being answered
  // finishes its response without keep-alive.
  void begin_shutdown() {
    if (phase_ == Phase::Handling) {
      keep_alive_ = false;
      return;
    }
    close();
  }

  void close() {
    if (phase_ == Phase::Closed) return;
    phase_ = Phase::Closed;
    ++dl_gen_;
    ++ping_gen_;
    error_code ec;
    deadline_.cancel();
    ping_.cancel();
    sock_.shutdown(tcp::socket::shutdown_both, ec);
    sock_.close(ec);
    auto gone = std::move(gone_cb_);
    auto state = std::move(ex_state_);
    const bool active = ex_ != nullptr;
    ex_.reset();
    srv_->forget(this);
    if (active && gone) gone();  // before the state goes, so the handler knows why
  }

  // --- the current exchange (ExchangeImpl forwards here after checking its sequence number) ---
  bool current(uint64_t seq) const { return phase_ == Phase::Handling && ex_ && seq == seq_ && !response_done_; }
  void respond(HttpResponse r) {
    count(r.status);
    std::string out = format_head(r.status, r, "Content-Length: " + std::to_string(r.body.size()) + "\r\n", keep_alive_, version_);
    out += r.body;
    response_done_ = true;
    queue_write(out);
  }
  void begin_stream(HttpResponse head, std::chrono::milliseconds every, std::string ping) {
    count(head.status);
    chunked_ = version_ >= 11;
    if (!chunked_) keep_alive_ = false;  // HTTP/1.0: the end of the body is the end of the connection
    streaming_ = true;
    ping_every_ = every;
    ping_text_ = std::move(ping);
    queue_write(format_head(head.status, head, chunked_ ? "Transfer-Encoding: chunked\r\n" : "", keep_alive_, version_));
  }
  void write_chunk(std::string_view data) {
    if (!streaming_ || data.empty()) return;
    if (chunked_) {
      char size[24];
      std::snprintf(size, sizeof size, "%zx\r\n", data.size());
      out_ += size;
      out_.append(data.data(), data.size());
      out_ += "\r\n";
    } else {
      out_.append(data.data(), data.size());
    }
    if (!writing_) do_write();
  }
  void end_stream() {
    if (!streaming_) return;
    if (chunked_) out_ += "0\r\n\r\n";
    response_done_ = true;
    if (!writing_) do_write();
  }
  void set_gone(std::function<void()> f) { gone_cb_ = std::move(f); }
  void keep(std::shared_ptr<void> s) { ex_state_ = std::move(s); }

 private:
  enum class Phase { Idle, Header, Body, Handling, Linger, Closed };
  enum class Deadline { None, Idle, Header, Body, Write, Linger };

  void count(int status) {
    if (srv_->handlers.on_response) srv_->handlers.on_response(status);
  }

  void arm(double secs, Deadline kind) {
    dl_kind_ = kind;
    const uint64_t gen = ++dl_gen_;
    deadline_.expires_after(seconds(secs));
    deadline_.async_wait([self = shared_from_this(), gen](error_code ec) {
      if (!ec && gen == self->dl_gen_) self->on_deadline();
    });
  }
  void disarm() {
    ++dl_gen_;
    dl_kind_ = Deadline::None;
    deadline_.cancel();
  }

  void on_deadline() {
    switch (dl_kind_) {
      case Deadline::Idle:
        ++srv_->t_idle;
        return close();
      case Deadline::Header:
      case Deadline::Body:
        ++(dl_kind_ == Deadline::Header ? srv_->t_header : srv_->t_body);
        timed_out_ = true;
        dl_kind_ = Deadline::None;
        {
          error_code ec;
          sock_.cancel(ec);  // the pending read completes with operation_aborted and answers 408
        }
        return;
      case Deadline::Write:
        ++srv_->t_write;
        return close();  // the client stopped reading: it counts as gone
      case Deadline::Linger:
        return close();
      case Deadline::None:
        return;
    }
  }

  // --- reading a request ---
  void start_header() {
    phase_ = Phase::Header;
    arm(lim_.header_timeout_s, Deadline::Header);
    parser_.emplace(lim_);
    reading_ = true;
    http::async_read_header(sock_, buf_, *parser_, [self = shared_from_this()](error_code ec, size_t) {
      self->reading_ = false;
      self->on_header(ec);
    });
  }

  void on_header(error_code ec) {
    if (phase_ == Phase::Closed) return;
    if (ec) return read_failed(ec);
    timed_out_ = false;  // (a deadline that fired as the read completed)
    HttpRequest& head = parser_->req;
    const auto length = parser_->content_length();
    head.has_body = parser_->chunked() || (length && *length > 0);
    keep_alive_ = parser_->keep_alive() && !srv_->stopping;
    version_ = head.version;
    if (auto e = head_error(head)) return fail(e->status, e->message, e->code);
    std::optional<HttpResponse> early;
    try {
      if (srv_->handlers.on_head) early = srv_->handlers.on_head(head);
    } catch (const std::exception& e) {
      return fail(500, e.what(), "internal_error");
    }
    if (early) {
      disarm();
      phase_ = Phase::Handling;
      if (head.has_body && !parser_->is_done()) keep_alive_ = false;  // the body stays unread
      parser_.reset();
      return respond(std::move(*early));
    }
    if (head.has_body && !parser_->is_done() && iequals(head.header("Expect"), "100-continue"))
      queue_write("HTTP/1.1 100 Continue\r\n\r\n");
    phase_ = Phase::Body;
    arm(lim_.body_timeout_s, Deadline::Body);
    if (parser_->is_done()) return on_body({});
    reading_ = true;
    http::async_read(sock_, buf_, *parser_, [self = shared_from_this()](error_code ec, size_t) {
      self->reading_ = false;
      self->on_body(ec);
    });
  }

  void on_body(error_code ec) {
    if (phase_ == Phase::Closed) return;
    if (ec) return read_failed(ec);
    timed_out_ = false;
    disarm();
    phase_ = Phase::Handling;
    ++seq_;
    if (srv_->stopping) keep_alive_ = false;
    ex_ = std::make_shared<ExchangeImpl>(weak_from_this(), seq_, sock_.get_executor(), std::move(parser_->req));
    parser_.reset();
    // Watch the socket while the request is handled: end-of-stream or an error means the client is
    // gone. (Bytes of a pipelined next request end the watch; they wait in the buffer.)
    if (buf_.size() == 0 && !reading_) read_some();
    auto ex = std::static_pointer_cast<Exchange>(ex_);
    try {
      srv_->handlers.on_request(ex);
    } catch (const std::exception& e) {
      if (current(seq_) && !streaming_) {
        HttpResponse r = srv_->handlers.error_response(500, e.what(), "internal_error");
        r.status = 500;
        respond(std::move(r));
      } else {
        close();
      }
    }
  }

  // A header or body read ended with an error: answer what can be answered, close the rest.
  void read_failed(error_code ec) {
    if (timed_out_) {
      timed_out_ = false;
      return fail(408, phase_ == Phase::Header ? "timed out reading the request header" : "timed out reading the request body",
                  "request_timeout");
    }
    if (auto e = read_error_answer(ec, phase_ == Phase::Header, parser_ && parser_->too_many_headers, lim_))
      return fail(e->status, e->message, e->code);
    return close();  // the client closed (or reset) the connection: there is nobody to answer
  }

  // An error response, then the connection closes (lingering).
  void fail(int status, const std::string& message, const std::string& code) {
    disarm();
    phase_ = Phase::Handling;
    keep_alive_ = false;
    parser_.reset();
    HttpResponse r = srv_->handlers.error_response(status, message, code);
    r.status = status;
    respond(std::move(r));
  }

  // --- writing ---
  void queue_write(std::string_view data) {
    out_.append(data.data(), data.size());
    if (!writing_) do_write();
  }
  void do_write() {
    if (phase_ == Phase::Closed) return;
    if (out_.empty()) {
      if (response_done_)  // nothing left to send (e.g. an HTTP/1.0 stream's end): finish, but not inline
        asio::post(sock_.get_executor(), [self = shared_from_this()] {
          if (self->phase_ == Phase::Handling && self->response_done_ && !self->writing_) self->after_response();
        });
      return;
    }
    wbuf_.swap(out_);
    out_.clear();
    writing_ = true;
    if (phase_ == Phase::Handling) arm(lim_.write_timeout_s, Deadline::Write);
    asio::async_write(sock_, asio::buffer(wbuf_), [self = shared_from_this()](error_code ec, size_t) { self->on_written(ec); });
  }
  void on_written(error_code ec) {
    writing_ = false;
    wbuf_.clear();
    if (phase_ == Phase::Closed) return;
    if (ec) return close();  // the client is gone
    if (phase_ == Phase::Handling && dl_kind_ == Deadline::Write) disarm();
    if (!out_.empty()) return do_write();
    if (phase_ != Phase::Handling) return;  // e.g. "100 Continue" while the body is read
    if (response_done_) return after_response();
    if (streaming_) arm_ping();
  }

  void arm_ping() {
    if (ping_every_.count() <= 0 || ping_text_.empty()) return;
    const uint64_t gen = ++ping_gen_;
    ping_.expires_after(ping_every_);
    ping_.async_wait([self = shared_from_this(), gen](error_code ec) {
      if (ec || gen != self->ping_gen_ || self->phase_ != Phase::Handling || !self->streaming_ || self->response_done_) return;
      if (!self->writing_ && self->out_.empty()) self->write_chunk(self->ping_text_);
    });
  }

  // The response is on its way (the last byte handed to the socket): the exchange ends; next request.
  void after_response() {
    response_done_ = false;
    streaming_ = false;
    ++ping_gen_;
    ping_.cancel();
    gone_cb_ = nullptr;
    ex_.reset();
    auto state = std::move(ex_state_);
    state.reset();
    if (phase_ == Phase::Closed) return;
    if (!keep_alive_ || srv_->stopping) return linger_close();
    if (buf_.size() > 0) return start_header();  // a pipelined request is already here
    phase_ = Phase::Idle;
    arm(lim_.idle_timeout_s, Deadline::Idle);
    if (!reading_) read_some();  // (else the watch read still pending becomes the idle read)
  }

  // After the last response of a connection: stop sending, and read (dropping it) whatever the client
  // still sends for a moment, so that closing does not reset the connection under an unread answer.
  void linger_close() {
    phase_ = Phase::Linger;
    error_code ec;
    sock_.shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return close();
    buf_.consume(buf_.size());
    arm(lim_.linger_s, Deadline::Linger);
    if (!reading_) read_some();
  }

  void read_some() {
    const size_t room = buf_.max_size() - buf_.size();
    if (room == 0) return;
    reading_ = true;
    sock_.async_read_some(buf_.prepare(std::min<size_t>(room, 4096)), [self = shared_from_this()](error_code ec, size_t n) {
      self->reading_ = false;
      self->on_some(ec, n);
    });
  }

  void on_some(error_code ec, size_t n) {
    if (phase_ == Phase::Closed) return;
    if (!ec) buf_.commit(n);
    switch (phase_) {
      case Phase::Handling:  // the watch read
        if (ec) return close();  // the client hung up (or half-closed, or reset)
        return;                  // a pipelined request: keep it for later
      case Phase::Idle:
        if (ec) return close();  // the client closed its idle connection
        return start_header();
      case Phase::Linger:
        if (ec) return close();
        linger_bytes_ += n;
        buf_.consume(buf_.size());
        if (linger_bytes_ > (256u << 10)) return close();
        return read_some();
      default:
        return;
    }
  }

  HttpServer::Impl* srv_;
  const HttpLimits& lim_;
  tcp::socket sock_;
  asio::steady_timer deadline_, ping_;
  beast::flat_buffer buf_;
  std::optional<RequestParser> parser_;
  Phase phase_ = Phase::Header;
  Deadline dl_kind_ = Deadline::None;
  uint64_t dl_gen_ = 0, ping_gen_ = 0, seq_ = 0;
  bool timed_out_ = false, reading_ = false, writing_ = false;
  bool keep_alive_ = false, response_done_ = false, streaming_ = false, chunked_ = false;
  int version_ = 11;
  size_t linger_bytes_ = 0;
  std::string out_, wbuf_, ping_text_;
  std::chrono::milliseconds ping_every_{0};
  std::shared_ptr<ExchangeImpl> ex_;
  std::shared_ptr<void> ex_state_;
  std::function<void()> gone_cb_;

  friend class ExchangeImpl;
};

class ExchangeImpl final : public Exchange {
 public:
  ExchangeImpl(std::weak_ptr<Connection> c, uint64_t seq, asio::any_io_executor ex, HttpRequest req)
      : conn_(std::move(c)), seq_(seq), exec_(std::move(ex)), req_(std::move(req)) {}

  const HttpRequest& request() const override { return req_; }
  void respond(HttpResponse r) override {
    if (auto c = live(); c && !c->streaming_) c->respond(std::move(r));
  }
  void begin_stream(HttpResponse head, std::chrono::milliseconds every, std::string ping) override {
    if (auto c = live(); c && !c->streaming_) c->begin_stream(std::move(head), every, std::move(ping));
  }
  void write(std::string_view data) override {
    if (auto c = live()) c->write_chunk(data);
  }
  void end_stream() override {
    if (auto c = live()) c->end_stream();
  }
  void on_gone(std::function<void()> f) override {
    if (auto c = live()) c->set_gone(std::move(f));
    else if (f) f();  // already gone
  }
  void keep(std::shared_ptr<void> state) override {
    if (auto c = live()) c->keep(std::move(state));
  }
  bool gone() const override { return live() == nullptr; }
  void post(std::function<void()> f) override { asio::post(exec_, std::move(f)); }

 private:
  std::shared_ptr<Connection> live() const {
    auto c = conn_.lock();
    return c && c->current(seq_) ? c : nullptr;
  }
  std::weak_ptr<Connection> conn_;
  uint64_t seq_;
  asio::any_io_executor exec_;
  HttpRequest req_;
};

}  // namespace

void HttpServer::Impl::forget(Connection* c) {
  std::lock_guard<std::mutex> lock(mu);
  if (conns.erase(c) > 0) {
    --open;
    cv.notify_all();
  }
}

std::vector<std::shared_ptr<Connection>> HttpServer::Impl::live() {
  std::vector<std::shared_ptr<Connection>> out;
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [p, w] : conns)
    if (auto c = w.lock()) out.push_back(std::move(c));
  return out;
}

void HttpServer::Impl::do_accept() {
  acceptor->async_accept(asio::make_strand(*ioc), [this](error_code ec, tcp::socket s) { on_accept(ec, std::move(s)); });
}

void HttpServer::Impl::on_accept(error_code ec, tcp::socket s) {
  if (stopping || !acceptor->is_open()) return;
  if (ec) {
    // Out of file descriptors (or a transient error): back off instead of spinning on accept.
    ++accept_errors;
    backoff->expires_after(std::chrono::milliseconds(50));
    backoff->async_wait([this](error_code e) {
      if (!e && !stopping) do_accept();
    });
    return;
  }
  std::shared_ptr<Connection> c;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (open < limits.max_connections) {
      c = std::make_shared<Connection>(this, std::move(s));
      conns.emplace(c.get(), c);
      ++open;
    }
  }
  if (c) {
    ++accepted;
    asio::post(c->executor(), [c] { c->start(); });
  } else {
    // Over the cap: a canned 503 into the empty send buffer (never blocks), then close.
    ++rejected;
    if (handlers.on_response) handlers.on_response(503);
    error_code e;
    s.non_blocking(true, e);
    s.write_some(asio::buffer(canned_503), e);
    s.shutdown(tcp::socket::shutdown_both, e);
    s.close(e);
  }
  do_accept();
}

HttpServer::HttpServer(HttpLimits limits, HttpHandlers handlers, int io_threads)
    : impl_(std::make_shared<Impl>(std::move(limits), std::move(handlers), io_threads)) {
  HttpResponse r = impl_->handlers.error_response
                       ? impl_->handlers.error_response(503, "too many connections; retry later", "too_many_connections")
                       : HttpResponse{};
  r.headers.emplace_back("Retry-After", "1");
  impl_->canned_503 = format_head(503, r, "Content-Length: " + std::to_string(r.body.size()) + "\r\n", false, 11) + r.body;
}

HttpServer::~HttpServer() { stop(std::chrono::milliseconds(0)); }

const HttpLimits& HttpServer::limits() const { return impl_->limits; }

int HttpServer::listen(const std::string& host, int port) {
  const std::string where = host + ":" + std::to_string(port);
  error_code ec;
  tcp::resolver resolver(*impl_->ioc);
  const auto results = resolver.resolve(host, std::to_string(port), tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) throw std::runtime_error("cannot listen on " + where + ": cannot resolve the address (" + ec.message() + ")");
  const tcp::endpoint ep = results.begin()->endpoint();
  tcp::acceptor& a = *impl_->acceptor;
  a.open(ep.protocol(), ec);
  // SO_REUSEADDR only: a restart may bind while old connections sit in TIME_WAIT, but a port another
  // socket listens on stays an error (no SO_REUSEPORT, which would let two servers share it silently).
  if (!ec) a.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(1024, ec);
  if (ec) {
    error_code ignored;
    a.close(ignored);
    throw std::runtime_error("cannot listen on " + where + ": " + ec.message() +
                             (ec == asio::error::address_in_use ? " (another process is using the port)" : ""));
  }
  return a.local_endpoint().port();
}

void HttpServer::start() {
  Impl& s = *impl_;
  if (s.started) return;
  s.started = true;
  s.work.emplace(s.ioc->get_executor());
  asio::post(s.acceptor->get_executor(), [p = impl_.get()] { p->do_accept(); });
  for (int i = 0; i < s.n_threads; ++i)
    s.threads.emplace_back([p = impl_.get()] {
      // A handler that throws must not take the server down: log and keep running.
      for (;;) {
        try {
          p->ioc->run();
          return;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "[kvpack] http: unexpected exception in an I/O handler: %s\n", e.what());
        }
      }
    });
}

void HttpServer::stop(std::chrono::milliseconds grace) {
  Impl& s = *impl_;
  if (s.stopped) return;
  s.stopped = true;
  s.stopping = true;
  if (!s.started) {
    error_code ec;
    s.acceptor->close(ec);
    return;
  }
  asio::post(s.acceptor->get_executor(), [p = impl_.get()] {
    error_code ec;
    p->acceptor->close(ec);
    p->backoff->cancel();
  });
  for (auto& c : s.live()) asio::post(c->executor(), [c] { c->begin_shutdown(); });
  auto wait_empty = [&](std::chrono::milliseconds d) {
    std::unique_lock<std::mutex> lock(s.mu);
    s.cv.wait_for(lock, d, [&] { return s.open == 0; });
  };
  wait_empty(grace);
  for (auto& c : s.live()) asio::post(c->executor(), [c] { c->close(); });
  wait_empty(std::chrono::milliseconds(200));
  s.work.reset();
  s.ioc->stop();
  for (auto& t : s.threads) t.join();
  s.threads.clear();
  // No I/O thread runs any more, so this thread may close what is left (a strand that was busy).
  for (auto& c : s.live()) c->close();
}

HttpCounters HttpServer::counters() const {
  const Impl& s = *impl_;
  HttpCounters c;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    c.connections_open = s.open;
  }
  c.connections_accepted = s.accepted;
  c.connections_rejected = s.rejected;
  c.accept_errors = s.accept_errors;
  c.timeouts_header = s.t_header;
  c.timeouts_body = s.t_body;
  c.timeouts_idle = s.t_idle;
  c.timeouts_write = s.t_write;
  return c;
}

}  // namespace kvpack::server
