#include "server/server.h"

#include <chrono>
#include <stdexcept>

#include "server/channel.h"
#include "server/http_connection.h"

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
  const RequestStats& st = ev.stats;
  Usage u{st.prompt_tokens, st.completion_tokens, st.cached_tokens};
  u.preemptions = st.preemptions;
  u.swap_outs = st.swap_outs;
  u.recomputes = st.recomputes;
  u.cached_tokens_cold = st.cached_tokens_cold;
  const int64_t page = static_cast<int64_t>(ctx_page_bytes_);
  u.peak_kv_bytes = st.peak_kv_pages * page;
  u.final_kv_bytes = st.kv_pages_in_use * page;
  u.evicted_tokens = kv_streams_ > 0 ? st.compression.evicted_slots / kv_streams_ : 0;
  u.compactions = st.compression.events;
  u.evicted_cold_pages = st.evicted.pages_written;
  u.evicted_cold_bytes = static_cast<int64_t>(st.evicted.bytes_written);
  u.recalled_pages = st.compression.recall.pages_recalled;
  u.recall_bytes_read = static_cast<int64_t>(st.compression.recall.bytes_read);
  u.drift = st.compression.recall.checks > 0 ? st.compression.recall.drift_max : -1.0;
  return u;
}

namespace {

}  // namespace

// A concurrency slot: held for the whole life of a generation request (for a stream, until its
// response has been written); registers the request's channel so shutdown can wake it.
struct Server::Slot {
  Server* server = nullptr;
  std::shared_ptr<RequestChannel> channel = std::make_shared<RequestChannel>();
  ~Slot() {
    std::lock_guard<std::mutex> lock(server->mu_);
    server->channels_.erase(channel.get());
    --server->stats_.active_requests;
  }
};

// What a streaming response's content provider needs after the handler has returned.
struct Server::StreamState {
  std::shared_ptr<Slot> slot;
  uint64_t id = 0;
  ResponseMeta meta;
  bool include_usage = false;
  bool first_chunk = true;
  bool finished = false;   // the request ended in the scheduler (or was cancelled by shutdown)
  bool abandoned = false;  // the client went away and the request was cancelled
  Clock::time_point last_write = Clock::now();
};

Server::Server(Engine& engine, ServerOptions opt) : engine_(&engine), opt_(std::move(opt)) {
  const Model& model = engine.model();
  if (opt_.model_id.empty()) opt_.model_id = model.config().name.empty() ? "kvpack" : model.config().name;
  if (opt_.max_concurrent < 1) throw std::invalid_argument("max_concurrent must be >= 1");
  ctx_.tokenizer = &model.tokenizer();
  ctx_.model = &model.config();
  ctx_.chat_format = detect_chat_format(model.chat_template());
  ctx_.default_kv = opt_.default_kv;
  ctx_.calibration = engine.calibration();
  ctx_.kv_capacity_pages = engine.kv().pool().capacity();
  ctx_.page_size = engine.kv().pool().config().page_size;
  ctx_page_bytes_ = engine.kv().pool().page_bytes();
  kv_streams_ = engine.kv().n_streams();
  ctx_.limits = opt_.limits;
  stats_.max_concurrent = opt_.max_concurrent;
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
  http_ = std::make_unique<HttpServer>();
  const int threads = opt_.http_threads > 0 ? opt_.http_threads : opt_.max_concurrent + 8;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http_->set_payload_max_length(opt_.limits.max_body_bytes);
  routes();
  const int port = opt_.port == 0 ? http_->bind_to_any_port(opt_.host)
                                  : (http_->bind_to_port(opt_.host, opt_.port) ? opt_.port : -1);
  if (port <= 0) {
    http_.reset();
    throw std::runtime_error("cannot listen on " + opt_.host + ":" + std::to_string(opt_.port));
  }
  http_->set_backlog(256);
  sched_->start();
  listen_thread_ = std::thread([this] { http_->listen_after_bind(); });
  // httplib's stop() only acts once the accept loop runs: wait for it (briefly) so that a stop()
  // right after start() cannot be lost. The socket is already listening, so no client waits on this.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!http_->is_running() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
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
  }
  http_->stop();  // joins the handler threads once they have answered
  if (listen_thread_.joinable()) listen_thread_.join();
  sched_->stop();
  http_.reset();
  started_ = false;
}

HttpStats Server::http_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::string Server::metrics_text() const {
  const ModelConfig& c = engine_->model().config();
  return render_prometheus(sched_->metrics(), http_stats(), static_cast<int64_t>(c.n_layer) * c.n_head_kv);
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

bool Server::authorized(const httplib::Request& req) const {
  return opt_.api_key.empty() || bearer_matches(req.get_header_value("Authorization"), opt_.api_key);
}

void Server::reply_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 429) res.set_header("Retry-After", "1");
  if (e.status == 401) res.set_header("WWW-Authenticate", "Bearer");
  res.set_content(dump_json(error_body(e)), "application/json");
}

void Server::count_disconnect() {
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.client_disconnects;
}

void Server::routes() {
  HttpServer& h = *http_;
  h.set_logger([this](const httplib::Request&, const httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.responses[res.status];
  });
  // Fills in an OpenAI-style body for errors httplib produces itself (404 unknown route, 400
  // malformed HTTP, 413 from its own length check); leaves our own error bodies alone.
  h.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    e.status = res.status;
    if (res.status == 404) e.message = "unknown route: " + req.method + " " + req.path;
    else if (res.status == 413) e.message = "request body too large", e.code = "request_too_large";
    else e.message = "HTTP error " + std::to_string(res.status);
    if (res.status >= 500) e.type = "server_error";
    res.set_content(dump_json(error_body(e)), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  h.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    res.status = 500;
    res.set_content(dump_json(error_body(make_error(500, what, "server_error", ""))), "application/json");
  });

  h.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    bool stopping;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping = stopping_;
    }
    res.status = stopping ? 503 : 200;
    res.set_content(dump_json(json{{"status", stopping ? "shutting_down" : "ok"}}), "application/json");
  });
  h.Get("/metrics", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req)) return reply_error(res, make_error(401, "missing or invalid API key", "invalid_request_error", "invalid_api_key"));
    res.set_content(metrics_text(), "text/plain; version=0.0.4; charset=utf-8");
  });
  h.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req)) return reply_error(res, make_error(401, "missing or invalid API key", "invalid_request_error", "invalid_api_key"));
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
    res.set_content(dump_json(json{{"object", "list"}, {"data", json::array({model})}}), "application/json");
  });
  h.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& rd) {
    handle_generate(req, res, rd, false);
  });
  h.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& rd) {
    handle_generate(req, res, rd, true);
  });
}

void Server::handle_generate(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader, bool chat) {
  if (!authorized(req)) {
    HttpServer::close_after_response();  // the body is left unread
    return reply_error(res, make_error(401, "missing or invalid API key (expected Authorization: Bearer KEY)",
                                       "invalid_request_error", "invalid_api_key"));
  }
  // The body, with the size limit enforced here too: httplib only checks it for Content-Length
  // bodies, not chunked ones.
  std::string body;
  bool too_large = false;
  const size_t max_body = opt_.limits.max_body_bytes;
  const bool read_ok = reader([&](const char* data, size_t n) {
    if (body.size() + n > max_body) {
      too_large = true;
      return false;
    }
    body.append(data, n);
    return true;
  });
  if (!read_ok || too_large) {
    HttpServer::close_after_response();
    if (too_large || res.status == 413)
      return reply_error(res, make_error(413, "request body exceeds " + std::to_string(max_body) + " bytes",
                                         "invalid_request_error", "request_too_large"));
    return reply_error(res, bad_request("could not read the request body"));
  }
  ParseResult parsed = parse_request_body(body, chat, ctx_);
  if (auto* e = std::get_if<ApiError>(&parsed)) return reply_error(res, *e);
  ParsedRequest& r = std::get<ParsedRequest>(parsed);

  ApiError err;
  std::shared_ptr<Slot> slot = acquire_slot(err);
  if (!slot) return reply_error(res, err);
  uint64_t id = 0;
  try {
    id = sched_->submit(std::move(r.spec), RequestChannel::sink(slot->channel));
  } catch (const std::invalid_argument& e) {  // e.g. a KV budget the policy cannot honour
    return reply_error(res, bad_request(e.what(), "", "invalid_request"));
  }
  if (id == 0) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.rejected_queue_full;
    }
    return reply_error(res, make_error(429, "the request queue is full; retry later", "rate_limit_error", "queue_full"));
  }
  const ResponseMeta meta = new_response_meta(chat, opt_.model_id);
  if (r.stream) serve_stream(res, slot, id, meta, r.include_usage);
  else serve_blocking(res, slot, id, meta);
}

void Server::serve_blocking(httplib::Response& res, const std::shared_ptr<Slot>& slot, uint64_t id, const ResponseMeta& meta) {
  std::string text;
  std::vector<RequestEvent> events;
  const auto poll = std::chrono::milliseconds(opt_.poll_ms);
  auto last_check = Clock::now();
  for (;;) {
    events.clear();
    const auto st = slot->channel->wait(events, poll);
    for (const RequestEvent& ev : events) {
      if (ev.kind == RequestEvent::Kind::Text) {
        text += ev.text;
        continue;
      }
      if (ev.finish == FinishReason::Error)
        return reply_error(res, make_error(500, ev.error, "server_error", "generation_failed"));
      if (ev.finish == FinishReason::Cancelled)
        return reply_error(res, make_error(503, "the request was cancelled (server shutting down)", "server_error", "cancelled"));
      res.set_content(dump_json(completion_response(meta, text, openai_finish_reason(ev.finish), usage_of(ev))), "application/json");
      return;
    }
    if (st == RequestChannel::Status::Closed) {
      sched_->cancel(id);
      return reply_error(res, make_error(503, "the server is shutting down", "server_error", "shutting_down"));
    }
    // A client that hung up gets its request cancelled, so its pages are freed now, not after
    // max_tokens more steps. Checked at most every poll interval, even while tokens flow.
    if (Clock::now() - last_check >= poll) {
      last_check = Clock::now();
      if (HttpServer::client_gone()) {
        count_disconnect();  // before the cancel, so the counter is up once the scheduler shows it
        sched_->cancel(id);
        res.status = 499;  // nginx's "client closed request"; nobody reads it, the logs do
        return;
      }
    }
  }
}

void Server::abandon(StreamState& st) {
  if (st.finished || st.abandoned) return;
  st.abandoned = true;
  count_disconnect();  // before the cancel, so the counter is up once the scheduler shows the cancel
  sched_->cancel(st.id);
}

void Server::serve_stream(httplib::Response& res, const std::shared_ptr<Slot>& slot, uint64_t id, const ResponseMeta& meta,
                          bool include_usage) {
  auto state = std::make_shared<StreamState>();
  state->slot = slot;
  state->id = id;
  state->meta = meta;
  state->include_usage = include_usage;
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  // httplib calls the provider until it calls sink.done() or returns false; each call blocks on the
  // channel until there is something to send (never returns without writing, which would spin).
  auto provider = [this, state](size_t, httplib::DataSink& sink) -> bool {
    std::vector<RequestEvent> events;
    const auto poll = std::chrono::milliseconds(opt_.poll_ms);
    for (;;) {
      const auto st = state->slot->channel->wait(events, poll);
      if (st == RequestChannel::Status::Events) break;
      if (st == RequestChannel::Status::Closed) {  // shutdown: tell the client, end the stream
        sched_->cancel(state->id);
        const std::string out =
            sse_event(error_body(make_error(503, "the server is shutting down", "server_error", "shutting_down"))) + "data: [DONE]\n\n";
        sink.write(out.data(), out.size());
        state->finished = true;
        sink.done();
        return true;
      }
      if (!sink.is_writable()) {  // the client went away between tokens
        abandon(*state);
        return false;
      }
      if (Clock::now() - state->last_write >= std::chrono::seconds(opt_.keepalive_comment_s)) {
        static const std::string ping = ": keep-alive\n\n";
        if (!sink.write(ping.data(), ping.size())) {
          abandon(*state);
          return false;
        }
        state->last_write = Clock::now();
      }
    }
    std::string out;
    bool done = false;
    for (const RequestEvent& ev : events) {
      if (ev.kind == RequestEvent::Kind::Text) {
        out += sse_event(stream_chunk(state->meta, ev.text, "", state->first_chunk));
        state->first_chunk = false;
        continue;
      }
      done = true;
      if (ev.finish == FinishReason::Error) {
        out += sse_event(error_body(make_error(500, ev.error, "server_error", "generation_failed")));
      } else if (ev.finish != FinishReason::Cancelled) {
        out += sse_event(stream_chunk(state->meta, "", openai_finish_reason(ev.finish), state->first_chunk));
        if (state->include_usage) out += sse_event(usage_chunk(state->meta, usage_of(ev)));
      }
      out += "data: [DONE]\n\n";
      break;
    }
    // (An empty write would end httplib's loop without done(); `out` is never empty here.)
    if (!sink.write(out.data(), out.size())) {
      if (done) state->finished = true;  // it ended anyway; the client just missed the last chunk
      else abandon(*state);
      return false;
    }
    state->last_write = Clock::now();
    if (done) {
      state->finished = true;
      sink.done();
    }
    return true;
  };
  // Runs when the response is destroyed: if the stream did not finish (e.g. writing the headers
  // failed, so the provider never ran), make sure the request does not keep running.
  auto releaser = [this, state](bool) {
    abandon(*state);
    state->slot.reset();  // frees the concurrency slot now, not when httplib drops the lambdas
  };
  res.set_chunked_content_provider("text/event-stream", provider, releaser);
}

}  // namespace kvpack::server
