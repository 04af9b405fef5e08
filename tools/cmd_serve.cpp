// `kvpack serve`: OpenAI-compatible HTTP server (see src/server/server.h) until SIGINT / SIGTERM.
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "commands.h"
#include "engine/model_identity.h"
#include "kernels/attention.h"
#include "options.h"
#include "server/server.h"

namespace kvpack::cli {

void add_serve(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "Serve an OpenAI-compatible HTTP API (completions, chat, SSE streaming, /metrics)");
  auto o = std::make_shared<ModelOptions>();
  auto kvo = std::make_shared<KvOptions>();
  auto so = std::make_shared<server::ServerOptions>();
  auto preempt = std::make_shared<std::string>("lru");
  auto admission = std::make_shared<std::string>("reserve");
  auto no_prefix_cache = std::make_shared<bool>(false);
  add_model_options(*cmd, *o);
  add_kv_options(*cmd, *kvo);  // the server default; requests may override kv_policy / kv_budget
  cmd->add_option("--host", so->host, "Address to bind (default loopback only)");
  cmd->add_option("--port", so->port, "Port (0: any free port, printed on stderr)")->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", so->api_key, "Require 'Authorization: Bearer KEY' (or set KVPACK_API_KEY)")->envname("KVPACK_API_KEY");
  cmd->add_option("--alias", so->model_id, "Model name in responses and /v1/models (default: the model's name)");
  cmd->add_option("--max-batch", so->scheduler.max_running, "Sequences in the running batch")->check(CLI::Range(1, 4096));
  cmd->add_option("--max-waiting", so->scheduler.max_waiting, "Scheduler queue limit (beyond: 429)")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--preempt", *preempt, "Preemption victim policy")->check(CLI::IsMember({"lru", "lfu", "priority"}));
  cmd->add_option("--admission", *admission, "Admission: reserve pages for prompt + max_tokens (compression-aware), or keep a free watermark")
      ->check(CLI::IsMember({"reserve", "watermark"}));
  cmd->add_flag("--no-prefix-cache", *no_prefix_cache, "Disable the prefix cache");
  cmd->add_option("--max-body", so->limits.max_body_bytes, "Largest request body in bytes (beyond: 413)")->check(CLI::Range(1024, 1 << 30));
  cmd->add_option("--max-prompt-tokens", so->limits.max_prompt_tokens, "Longest prompt accepted (0: context - 1)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-tokens-limit", so->limits.max_tokens_limit, "Largest max_tokens a request may ask for (0: the context)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--default-max-tokens", so->limits.default_max_tokens, "max_tokens when a request gives none")->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--max-concurrent", so->max_concurrent, "Generation requests served at once (beyond: 429)")->check(CLI::Range(1, 4096));
  cmd->add_option("--io-threads,--http-threads", so->io_threads, "HTTP I/O threads (event loops; they never block on a client; 0: 2)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  // HTTP hardening (docs/reliability.md): deadlines, header limits, connection cap, shutdown bound.
  cmd->add_option("--header-timeout", so->http.header_timeout_s, "Seconds a client has to send the request line and headers (beyond: 408, closed)")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  cmd->add_option("--body-timeout", so->http.body_timeout_s, "Seconds a client has to send the body after the headers (beyond: 408, closed)")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  cmd->add_option("--idle-timeout", so->http.idle_timeout_s, "Seconds an idle keep-alive connection stays open")->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  cmd->add_option("--write-timeout", so->http.write_timeout_s, "Seconds a response write (each write of a stream) may take (beyond: client treated as gone)")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  cmd->add_option("--max-header-bytes", so->http.max_header_bytes, "Largest request header, request line included (beyond: 431)")
      ->check(CLI::Range(1024, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--max-headers", so->http.max_headers, "Most request header fields (beyond: 431)")->check(CLI::Range(1, 10000))
      ->capture_default_str();
  cmd->add_option("--max-connections", so->http.max_connections,
                  "Client connections open at once (beyond: 503 and closed; capped by the open-file limit)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--shutdown-grace", so->shutdown_grace_ms, "SIGTERM: milliseconds in-flight responses get to finish before connections are closed")
      ->check(CLI::Range(0, 60000))
      ->capture_default_str();
  cmd->add_flag("--metrics-no-auth", so->metrics_no_auth, "Serve GET /metrics without the API key");
  auto* request_log = cmd->add_option("--request-log", so->request_log,
                  "Write one JSON line per request (tokens, cache hits by tier, KV bytes, evictions, drift, policy, times) to FILE (appended) or - (stderr)");
  cmd->add_flag("--request-log-prompts", so->request_log_prompts,
                "Include each request's body in its request-log line (what `kvpack analyze-prefix` reads; the log then holds prompts)")
      ->needs(request_log);
  cmd->callback([=] {
    // Signals are taken synchronously by this thread (sigwait below): block them before any thread
    // (engine pool, scheduler, HTTP workers) starts, so every thread inherits the mask.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
    signal(SIGPIPE, SIG_IGN);  // belt and braces: the server's own writes already use MSG_NOSIGNAL

    auto model = load_model(*o);
    Engine engine(*model, engine_options(*o, *kvo));
    server::ServerOptions opt = *so;
    // Each connection is a file descriptor: raise the soft open-file limit to the hard one, and keep
    // the connection cap under it (room for the model, the cold tier and the listening socket).
    rlimit nofile{};
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
      if (nofile.rlim_cur < nofile.rlim_max) {
        nofile.rlim_cur = nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
        getrlimit(RLIMIT_NOFILE, &nofile);
      }
      const long long room = static_cast<long long>(nofile.rlim_cur) - 128;
      if (nofile.rlim_cur != RLIM_INFINITY && opt.http.max_connections > room) {
        std::fprintf(stderr, "[kvpack] --max-connections %d lowered to %lld (open-file limit %lld)\n", opt.http.max_connections,
                     std::max(1LL, room), static_cast<long long>(nofile.rlim_cur));
        opt.http.max_connections = static_cast<int32_t>(std::max(1LL, room));
      }
    }
    // The id goes into URLs (/v1/models/{id}): the file stem, spaces and the like as '-'.
    if (opt.model_id.empty() && !o->model.empty()) opt.model_id = server::model_id_slug(std::filesystem::path(o->model).stem().string());
    opt.default_kv = kv_config(*kvo, engine);  // a triattention default calibrates here, once (cached)
    opt.scheduler.preempt = parse_preempt(*preempt);
    opt.scheduler.prefix_cache = !*no_prefix_cache;
    opt.scheduler.reserve_admission = *admission == "reserve";
    opt.scheduler.step_tokens = o->batch;
    server::Server srv(engine, opt);
    const int port = srv.start();
    if (engine.kv().has_shared_tier())  // before the "serving" line: scripts read notes until it
      std::fprintf(stderr, "[kvpack] shared KV tier: %s (model KV identity %s)\n", engine.kv().shared_tier()->describe().c_str(),
                   identity_hex(engine.kv_identity()).c_str());
    const std::string budget = opt.default_kv.enabled() ? " budget " + std::to_string(opt.default_kv.budget) : "";
    std::fprintf(stderr, "[kvpack] serving %s on http://%s:%d (kv pages %lld x %zu B %s, policy %s%s, max batch %d, max concurrent %d%s)\n",
                 srv.options().model_id.c_str(), opt.host.c_str(), port, static_cast<long long>(engine.kv().pool().capacity()),
                 engine.kv().pool().page_bytes(), kernels::kv_type_name(engine.kv().pool().config().kv_type), compress::policy_name(opt.default_kv.policy),
                 budget.c_str(),
                 opt.scheduler.max_running, opt.max_concurrent, opt.api_key.empty() ? "" : ", API key required");
    std::fflush(stderr);
    int sig = 0;
    sigwait(&sigs, &sig);
    std::fprintf(stderr, "[kvpack] %s: shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    std::fflush(stderr);
    srv.stop();  // bounded: --shutdown-grace, then every connection is closed
  });
}

}  // namespace kvpack::cli
