#include "server/server.h"

#include <cctype>
#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <deque>
#include <functional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "server/channel.h"
#include "server/kv_page.h"

namespace kvpack::server {
namespace {

using Clock = std::chrono::steady_clock;

ApiError make_error(int status, std::string message, std::string type, std::string code) {
  ApiError e;
  e.status = status;
  e.message = std::move(message);
  e.type = std::move(type);
  e.code = std::move(code);
  return e;
}

}  // namespace

Usage Server::usage_of(const RequestEvent& ev) const {
  return usage_from_stats(ev.stats, static_cast<int64_t>(ctx_page_bytes_), kv_streams_);
}

// A concurrency slot: held from admission until the request's last event has been handled (the
// response or its last SSE bytes are then handed to the HTTP layer); registers the request's channel
// so shutdown can wake it.
struct Server::Slot {
  Server* server = nullptr;
  std::shared_ptr<RequestChannel> channel = std::make_shared<RequestChannel>();
  ~Slot() {
    std::lock_guard<std::mutex> lock(server->mu_);
    server->channels_.erase(channel.get());
    --server->stats_.active_requests;
  }
};

// A few threads that parse and tokenize request bodies (and submit them), so the I/O threads never do
// work proportional to a body. Only complete bodies reach it. stop() runs what is queued, then joins.
class WorkerPool {
 public:
  explicit WorkerPool(int n) {
    for (int i = 0; i < std::max(1, n); ++i) threads_.emplace_back([this] { run(); });
  }
  ~WorkerPool() { stop(); }
  void post(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(f));
    }
    cv_.notify_one();
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        f = std::move(queue_.front());
        queue_.pop_front();
      }
      f();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

namespace {

HttpResponse json_response(int status, const json& j) {
  HttpResponse r;
  r.status = status;
  r.body = dump_json(j);
  return r;
}

HttpResponse error_response(const ApiError& e) {
  HttpResponse r = json_response(e.status, error_body(e));
  if (e.status == 429 || e.status == 503) r.headers.emplace_back("Retry-After", "1");
  if (e.status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
  return r;
}

const ApiError kUnauthorized = make_error(401, "missing or invalid API key (expected Authorization: Bearer KEY)",
                                          "invalid_request_error", "invalid_api_key");

}  // namespace

// One generation request from submission to its last byte. Owned by its exchange (Exchange::keep), so
// it lives exactly as long as the connection is answering it; everything but the constructor runs on
// the connection's strand. The channel's notification posts drain() there.
// n > 1: the events of all choices come through one channel, each naming its choice (RequestEvent::index);
// the response (or the stream's end) waits for every choice's Finished, and the first failure ends all.
struct Server::Generation : std::enable_shared_from_this<Generation> {
  Server* srv = nullptr;
  std::weak_ptr<Exchange> ex;
  std::shared_ptr<Slot> slot;
  std::shared_ptr<RequestChannel> channel;
  uint64_t id = 0;
  ResponseMeta meta;
  bool stream = false, include_usage = false;
  bool done = false;  // answered, cancelled, or its client went away
  bool logprobs = false;  // the request asked for log-probabilities
  std::string echo;       // completions with echo: the prompt text, sent first (in every choice)
  struct Choice {
    bool first_chunk = true;
    bool finished = false;
    std::string text;               // non-streamed: the completion so far
    std::vector<TokenLogprob> lps;  // non-streamed: all of them so far
    int64_t text_offset = 0;        // completions' text_offset of the next token (echoed prompt included)
    std::string finish_reason;
    Usage usage;
  };
  std::vector<Choice> choices;  // Request::n of them
  int32_t n_finished = 0;

  // A chunk's logprobs object (null when not asked for), advancing the choice's text_offset.
  json chunk_logprobs(Choice& c, const std::vector<TokenLogprob>& v) {
    if (!logprobs) return nullptr;
    json j = logprobs_json(meta.chat, v, *srv->ctx_.tokenizer, c.text_offset);
    for (const TokenLogprob& lp : v) c.text_offset += static_cast<int64_t>(srv->ctx_.tokenizer->piece(lp.token).size());
    return j;
  }

  ~Generation() {
    channel->set_notify(nullptr);
    if (!done && id != 0) srv->sched_->cancel(id);
  }

  void attach(const std::shared_ptr<Exchange>& e) {
    if (e->gone()) return gone();  // the client left while the body was parsed
    e->keep(shared_from_this());
    e->on_gone([w = weak_from_this()] {
      if (auto g = w.lock()) g->gone();
    });
    if (stream) {
      HttpResponse head;
      head.content_type = "text/event-stream";
      head.headers = {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}};
      e->begin_stream(std::move(head), std::chrono::seconds(srv->opt_.keepalive_comment_s), ": keep-alive\n\n");
    }
    channel->set_notify([w = weak_from_this(), ex = ex] {
      if (auto e = ex.lock())
        e->post([w] {
          if (auto g = w.lock()) g->drain();
        });
    });
    if (!echo.empty()) {
      std::string out;
      for (size_t i = 0; i < choices.size(); ++i) {
        Choice& c = choices[i];
        if (stream) {
          out += sse_event(stream_chunk(meta, echo, "", c.first_chunk, nullptr, static_cast<int32_t>(i)));
          c.first_chunk = false;
        } else {
          c.text = echo;
        }
      }
      if (!out.empty()) e->write(out);
    }
    drain();  // what arrived before the notification was set
  }

  // The client went away (or the connection was closed under it): cancel (every choice), free the slot.
  void gone() {
    if (done) return;
    done = true;
    srv->count_disconnect(!stream);  // before the cancel, so the counter is up once the scheduler shows it
    srv->sched_->cancel(id);
    slot.reset();
  }

  // A choice failed or was cancelled: the request ends now, its other choices with it.
  void fail(Exchange& e, const RequestEvent& ev, std::string& out) {
    done = true;
    srv->sched_->cancel(id);
    slot.reset();
    if (stream) {
      if (ev.finish == FinishReason::Error) out += sse_event(error_body(make_error(500, ev.error, "server_error", "generation_failed")));
      out += "data: [DONE]\n\n";
      e.write(out);
      e.end_stream();
    } else if (ev.finish == FinishReason::Error) {
      e.respond(error_response(make_error(500, ev.error, "server_error", "generation_failed")));
    } else {
      e.respond(error_response(make_error(503, "the request was cancelled (server shutting down)", "server_error", "cancelled")));
    }
  }

  void drain() {
    auto e = ex.lock();
    if (!e || done) return;
    std::vector<RequestEvent> events;
    while (!done) {
      events.clear();
      const auto st = channel->take(events);
      if (st == RequestChannel::Status::Empty) return;
      if (st == RequestChannel::Status::Closed) return shutting_down(*e);
      std::string out;
      for (const RequestEvent& ev : events) {
        if (ev.index < 0 || static_cast<size_t>(ev.index) >= choices.size()) continue;  // cannot happen
        Choice& c = choices[static_cast<size_t>(ev.index)];
        if (ev.kind == RequestEvent::Kind::Text) {
          if (stream) {
            out += sse_event(stream_chunk(meta, ev.text, "", c.first_chunk, chunk_logprobs(c, ev.logprobs), ev.index));
            c.first_chunk = false;
          } else {
            c.text += ev.text;
            c.lps.insert(c.lps.end(), ev.logprobs.begin(), ev.logprobs.end());
          }
          continue;
        }
        if (ev.finish == FinishReason::Error || ev.finish == FinishReason::Cancelled) return fail(*e, ev, out);
        if (c.finished) continue;
        c.finished = true;
        c.finish_reason = openai_finish_reason(ev.finish);
        c.usage = srv->usage_of(ev);
        if (stream)
          out += sse_event(stream_chunk(meta, "", c.finish_reason, c.first_chunk,
                                        ev.logprobs.empty() ? json(nullptr) : chunk_logprobs(c, ev.logprobs), ev.index));
        else
          c.lps.insert(c.lps.end(), ev.logprobs.begin(), ev.logprobs.end());
        if (++n_finished < static_cast<int32_t>(choices.size())) continue;
        // Every choice finished: the slot goes back first, then the last bytes are handed off.
        done = true;
        slot.reset();
        std::vector<Usage> per;
        for (const Choice& x : choices) per.push_back(x.usage);
        const Usage u = combine_usage(per);
        if (stream) {
          if (include_usage) out += sse_event(usage_chunk(meta, u));
          out += "data: [DONE]\n\n";
          e->write(out);
          e->end_stream();
        } else {
          std::vector<ChoiceOut> outs;
          for (const Choice& x : choices)
            outs.push_back({x.text, x.finish_reason,
                            logprobs ? logprobs_json(meta.chat, x.lps, *srv->ctx_.tokenizer, static_cast<int64_t>(echo.size())) : json(nullptr)});
          e->respond(json_response(200, completion_response(meta, outs, u)));
        }
        return;
      }
      if (!out.empty()) e->write(out);
    }
  }

  // Server shutdown: cancel, and tell the client (a stream: an error event, then [DONE]).
  void shutting_down(Exchange& e) {
    done = true;
    srv->sched_->cancel(id);
    slot.reset();
    const ApiError err = make_error(503, "the server is shutting down", "server_error", "shutting_down");
    if (stream) {
      e.write(sse_event(error_body(err)) + "data: [DONE]\n\n");
      e.end_stream();
    } else {
      e.respond(error_response(err));
    }
  }
};

Server::Server(Engine& engine, ServerOptions opt) : engine_(&engine), opt_(std::move(opt)) {
  const Model& model = engine.model();
  // Ids go into URL paths (/v1/models/{id}): the model's name without spaces when none is given.
  if (opt_.model_id.empty()) opt_.model_id = model_id_slug(model.config().name);
  if (opt_.max_concurrent < 1) throw std::invalid_argument("max_concurrent must be >= 1");
  if (opt_.http.max_connections < 1) throw std::invalid_argument("max_connections must be >= 1");
  ctx_.tokenizer = &model.tokenizer();
  ctx_.model = &model.config();
  ctx_.chat_format = detect_chat_format(model.chat_template());
  std::string chat_log;
  chat_ = std::make_unique<ChatRenderer>(model.chat_template(), model.tokenizer(), &chat_log);
  ctx_.chat = chat_.get();
  std::fprintf(stderr, "kvpack: %s\n", chat_log.c_str());
  ctx_.default_kv = opt_.default_kv;
  ctx_.calibration = engine.calibration();
  ctx_.kv_capacity_pages = engine.kv().pool().capacity();
  ctx_.page_size = engine.kv().pool().config().page_size;
  ctx_page_bytes_ = engine.kv().pool().page_bytes();
  kv_streams_ = engine.kv().n_streams();
  ctx_.limits = opt_.limits;
  if (ctx_.limits.max_choices <= 0) ctx_.limits.max_choices = opt_.scheduler.max_running;
  opt_.http.max_body_bytes = opt_.limits.max_body_bytes;
  stats_.max_concurrent = opt_.max_concurrent;
  stats_.max_connections = opt_.http.max_connections;
  if (!opt_.request_log.empty()) log_ = std::make_unique<RequestLog>(opt_.request_log);  // throws naming the path
  sched_ = std::make_unique<Scheduler>(engine, opt_.scheduler);
  created_ = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Server::~Server() { stop(); }

int Server::start() {
  std::lock_guard<std::mutex> control(control_mu_);
  if (started_) return port_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = false;
  }
  HttpHandlers h;
  h.on_head = [this](const HttpRequest& req) { return on_head(req); };
  h.on_request = [this](const std::shared_ptr<Exchange>& ex) { on_request(ex); };
  h.error_response = [](int status, const std::string& message, const std::string& code) {
    return error_response(make_error(status, message, status >= 500 ? "server_error" : "invalid_request_error", code));
  };
  h.on_response = [this](int status) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.responses[status];
  };
  auto http = std::make_unique<HttpServer>(opt_.http, std::move(h), opt_.io_threads > 0 ? opt_.io_threads : 2);
  const int port = http->listen(opt_.host, opt_.port);  // throws, naming host:port, before anything starts
  http_ = std::move(http);
  workers_ = std::make_unique<WorkerPool>(opt_.worker_threads);
  sched_->start();
  {
    std::lock_guard<std::mutex> lock(mu_);
    http_live_ = http_.get();
  }
  http_->start();
  port_ = port;
  started_ = true;
  return port;
}

void Server::stop() {
  std::lock_guard<std::mutex> control(control_mu_);
  if (!started_) return;
  {
    // New requests now get 503; requests in flight wake up, cancel and answer.
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (RequestChannel* ch : channels_) ch->close();
    http_final_ = http_->counters();
    http_live_ = nullptr;
  }
  http_->stop(std::chrono::milliseconds(std::max(0, opt_.shutdown_grace_ms)));
  {
    std::lock_guard<std::mutex> lock(mu_);
    http_final_ = http_->counters();
  }
  workers_->stop();  // what is queued answers 503 into a stopped server (nobody hears it)
  sched_->stop();
  // The connections still referenced by queued handlers go with the HTTP layer; their generations
  // cancel (a no-op on the stopped scheduler) and release their slots.
  http_.reset();
  workers_.reset();
  started_ = false;
}

bool Server::stopping() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stopping_;
}

HttpStats Server::http_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  HttpStats s = stats_;
  const HttpCounters c = http_live_ ? http_live_->counters() : http_final_;
  s.connections_open = c.connections_open;
  s.connections_accepted = c.connections_accepted;
  s.connections_rejected = c.connections_rejected;
  s.timeouts_header = c.timeouts_header;
  s.timeouts_body = c.timeouts_body;
  s.timeouts_idle = c.timeouts_idle;
  s.timeouts_write = c.timeouts_write;
  return s;
}

std::string Server::metrics_text() const {
  const ModelConfig& c = engine_->model().config();
  MetricsContext ctx;
  ctx.kv_streams = static_cast<int64_t>(c.n_layer) * c.n_head_kv;
  ctx.model_name = opt_.model_id;
  ctx.page_size = ctx_.page_size;
  return render_prometheus(sched_->metrics(), http_stats(), ctx);
}

std::shared_ptr<Server::Slot> Server::acquire_slot(ApiError& err) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) {
    ++stats_.rejected_shutdown;
    err = make_error(503, "the server is shutting down", "server_error", "shutting_down");
    return nullptr;
  }
  if (stats_.active_requests >= opt_.max_concurrent) {
    ++stats_.rejected_concurrency;
    err = make_error(429, "too many concurrent requests (" + std::to_string(opt_.max_concurrent) + "); retry later",
                     "rate_limit_error", "too_many_concurrent_requests");
    return nullptr;
  }
  auto slot = std::make_shared<Slot>();
  slot->server = this;
  ++stats_.active_requests;
  channels_.insert(slot->channel.get());
  return slot;
}

bool Server::authorized(const HttpRequest& req) const {
  return opt_.api_key.empty() || bearer_matches(req.header("Authorization"), opt_.api_key);
}

void Server::count_disconnect(bool blocking) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return;  // closed by the shutdown, not by the client
  ++stats_.client_disconnects;
  if (blocking) ++stats_.responses[499];  // nginx's "client closed request"; nobody reads it, the metrics do
}

namespace {

enum class Route { Health, Metrics, Models, ModelById, Completions, Chat, Tokenize, Detokenize, KvPage, KvState, None };

constexpr std::string_view kModelsPrefix = "/v1/models/";

Route route_of(const std::string& path) {
  if (path == "/health") return Route::Health;
  if (path == "/metrics") return Route::Metrics;
  if (path == "/v1/models") return Route::Models;
  if (path.size() > kModelsPrefix.size() && path.compare(0, kModelsPrefix.size(), kModelsPrefix) == 0) return Route::ModelById;
  if (path == "/v1/completions") return Route::Completions;
  if (path == "/v1/chat/completions") return Route::Chat;
  if (path == "/kv") return Route::KvPage;
  if (path == "/kv/state") return Route::KvState;
  if (path == "/tokenize") return Route::Tokenize;
  if (path == "/detokenize") return Route::Detokenize;
  return Route::None;
}

bool is_post(Route r) { return r == Route::Completions || r == Route::Chat || r == Route::Tokenize || r == Route::Detokenize; }

// "%20" and friends in a path segment (the SDK URL-encodes the id it is given).
std::string percent_decode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace

// Before the body is read: the route, the method and the API key. A refused request's body is never
// read (the connection closes after the answer).
std::optional<HttpResponse> Server::on_head(const HttpRequest& req) {
  const Route r = route_of(req.path);
  if (r == Route::None) return error_response(make_error(404, "unknown route: " + req.method + " " + req.path, "invalid_request_error", ""));
  const bool post = is_post(r);
  if (req.method != (post ? "POST" : "GET")) {
    HttpResponse res = error_response(make_error(405, "method " + req.method + " not allowed on " + req.path, "invalid_request_error", ""));
    res.headers.emplace_back("Allow", post ? "POST" : "GET");
    return res;
  }
  // The page map's HTML holds no data (it sends the key from its URL fragment for /kv/state).
  const bool open = r == Route::Health || r == Route::KvPage || (r == Route::Metrics && opt_.metrics_no_auth);
  if (!open && !authorized(req)) return error_response(kUnauthorized);
  return std::nullopt;
}

void Server::on_request(const std::shared_ptr<Exchange>& ex) {
  const HttpRequest& req = ex->request();
  switch (route_of(req.path)) {
    case Route::Health: {
      const bool stop = stopping();
      return ex->respond(json_response(stop ? 503 : 200, json{{"status", stop ? "shutting_down" : "ok"}}));
    }
    case Route::Metrics: {
      HttpResponse res;
      res.content_type = "text/plain; version=0.0.4; charset=utf-8";
      res.body = metrics_text();
      return ex->respond(std::move(res));
    }
    case Route::Models:
    case Route::ModelById: {
      const ModelConfig& c = engine_->model().config();
      json meta = {{"arch", c.arch},
                   {"n_ctx", c.n_ctx},
                   {"n_vocab", c.n_vocab},
                   {"n_layer", c.n_layer},
                   {"chat_format", chat_format_name(ctx_.chat_format)},
                   {"kv_pages", ctx_.kv_capacity_pages},
                   {"kv_page_size", ctx_.page_size},
                   {"kv_policy", compress::policy_name(opt_.default_kv.policy)},
                   {"kv_budget", opt_.default_kv.budget}};
      json model = {{"id", opt_.model_id}, {"object", "model"}, {"created", created_}, {"owned_by", "kvpack"}, {"meta", meta}};
      if (route_of(req.path) == Route::Models) return ex->respond(json_response(200, json{{"object", "list"}, {"data", json::array({model})}}));
      const std::string id = percent_decode(std::string_view(req.path).substr(kModelsPrefix.size()));
      if (id != opt_.model_id) {
        ApiError e = make_error(404, "The model '" + id + "' does not exist (this server serves '" + opt_.model_id + "')",
                                "invalid_request_error", "model_not_found");
        e.param = "model";
        return ex->respond(error_response(e));
      }
      return ex->respond(json_response(200, model));
    }
    case Route::Tokenize:
    case Route::Detokenize: {
      const bool tokenize = route_of(req.path) == Route::Tokenize;
      workers_->post([this, ex, tokenize] {  // tokenizing is proportional to the body: off the I/O threads
        JsonResult r = tokenize ? tokenize_body(ex->request().body, ctx_) : detokenize_body(ex->request().body, ctx_);
        HttpResponse res = std::holds_alternative<json>(r) ? json_response(200, std::get<json>(r)) : error_response(std::get<ApiError>(r));
        ex->post([ex, res = std::move(res)]() mutable { ex->respond(std::move(res)); });
      });
      return;
    }
    case Route::KvPage: {
      HttpResponse res;
      res.content_type = "text/html; charset=utf-8";
      res.body = std::string(kv_page_html());
      res.headers = {{"Cache-Control", "no-cache"}, {"Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'"}};
      return ex->respond(std::move(res));
    }
    case Route::KvState:
      return ex->respond(json_response(200, kv_map_json(sched_->kv_map(), opt_.model_id)));
    case Route::Completions:
    case Route::Chat: {
      const bool chat = route_of(req.path) == Route::Chat;
      workers_->post([this, ex, chat] {
        try {
          handle_generate(ex, chat);
        } catch (const std::exception& e) {  // a bug or bad_alloc: answer 500 rather than end the worker thread
          ex->post([ex, r = error_response(make_error(500, e.what(), "server_error", "internal_error"))]() mutable {
            ex->respond(std::move(r));
          });
        }
      });
      return;
    }
    case Route::None:
      return ex->respond(error_response(make_error(404, "unknown route", "invalid_request_error", "")));
  }
}

// On the worker pool: parse + tokenize, take a slot, submit; then the connection's strand takes over.
void Server::handle_generate(const std::shared_ptr<Exchange>& ex, bool chat) {
  auto reply = [&ex](const ApiError& e) {
    ex->post([ex, r = error_response(e)]() mutable { ex->respond(std::move(r)); });
  };
  if (stopping()) {
    ApiError err;
    acquire_slot(err);  // counts the refusal
    return reply(err);
  }
  const auto received = std::chrono::steady_clock::now();
  ParseResult parsed = parse_request_body(ex->request().body, chat, ctx_);
  if (auto* e = std::get_if<ApiError>(&parsed)) return reply(*e);
  ParsedRequest& r = std::get<ParsedRequest>(parsed);

  ApiError err;
  std::shared_ptr<Slot> slot = acquire_slot(err);
  if (!slot) return reply(err);
  auto gen = std::make_shared<Generation>();
  gen->srv = this;
  gen->ex = ex;
  gen->channel = slot->channel;
  gen->stream = r.stream;
  gen->include_usage = r.include_usage;
  gen->logprobs = r.spec.logprobs >= 0;
  gen->echo = r.echo ? r.echo_text : std::string();
  gen->choices.resize(static_cast<size_t>(std::max(1, r.spec.n)));
  for (auto& c : gen->choices) c.text_offset = static_cast<int64_t>(gen->echo.size());
  gen->meta = new_response_meta(chat, opt_.model_id);
  EventSink sink = RequestChannel::sink(slot->channel);
  if (log_) {
    // The line is written on the scheduler thread when the request ends, however it ends (a client
    // that went away included: its Finished(Cancelled) still comes through this sink).
    RequestLogContext lc;
    lc.id = gen->meta.id;
    lc.endpoint = chat ? "chat" : "completions";
    lc.model = opt_.model_id;
    lc.stream = r.stream;
    lc.policy = compress::policy_name(r.spec.kv.policy);
    lc.budget = r.spec.kv.enabled() ? r.spec.kv.budget : 0;
    lc.page_bytes = static_cast<int64_t>(ctx_page_bytes_);
    lc.kv_streams = kv_streams_;
    lc.received = received;
    if (opt_.request_log_prompts) lc.request = json::parse(ex->request().body, nullptr, false);  // parsed above: valid
    sink = [sink = std::move(sink), lc = std::move(lc), log = log_.get()](const RequestEvent& ev) {
      if (ev.kind == RequestEvent::Kind::Finished) log->write(request_log_line(lc, ev));
      sink(ev);
    };
  }
  uint64_t id = 0;
  try {
    id = sched_->submit(std::move(r.spec), std::move(sink));
  } catch (const std::invalid_argument& e) {  // e.g. a KV budget the policy cannot honour
    gen->done = true;
    slot.reset();  // before the answer: a closed-loop client must find its slot free
    return reply(bad_request(e.what(), "", "invalid_request"));
  }
  if (id == 0) {
    gen->done = true;
    slot.reset();
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.rejected_queue_full;
    }
    return reply(make_error(429, "the request queue is full; retry later", "rate_limit_error", "queue_full"));
  }
  gen->id = id;
  gen->slot = std::move(slot);
  ex->post([gen = std::move(gen), ex] { gen->attach(ex); });
}

}  // namespace kvpack::server
