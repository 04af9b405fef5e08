#include "server/request_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <stdexcept>

#include "server/api.h"

namespace kvpack::server {

RequestLog::RequestLog(const std::string& path) : path_(path) {
  if (path == "-") {
    fd_ = STDERR_FILENO;
    return;
  }
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd_ < 0) throw std::runtime_error("cannot open the request log " + path + ": " + std::strerror(errno));
  owned_ = true;
}

RequestLog::~RequestLog() {
  if (owned_) ::close(fd_);
}

void RequestLog::write(const nlohmann::json& line) {
  std::string text = dump_json(line);
  text += '\n';
  // One write(2) per line: O_APPEND makes it atomic with respect to other appenders for a regular file.
  // A short write (disk full) is retried for the rest; the line may then be split, which is reported.
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ++failed_;
      if (!reported_.exchange(true))
        std::fprintf(stderr, "[kvpack] request log %s: write failed (%s); later failures are only counted\n", path_.c_str(),
                     std::strerror(errno));
      return;
    }
    done += static_cast<size_t>(n);
  }
  ++lines_;
}

namespace {

std::string utc_now_iso8601() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  return buf;
}

}  // namespace

nlohmann::json request_log_line(const RequestLogContext& ctx, const RequestEvent& ev) {
  const RequestStats& st = ev.stats;
  const Usage u = usage_from_stats(st, ctx.page_bytes, ctx.kv_streams);  // the same figures as the response's usage
  const bool started = st.completion_tokens > 0;
  nlohmann::json kv = {
      {"peak_hot_bytes", u.peak_kv_bytes},
      {"final_hot_bytes", u.final_kv_bytes},
      {"cold_evicted_pages", u.evicted_cold_pages},
      {"cold_evicted_bytes", u.evicted_cold_bytes},
      {"evicted_tokens", u.evicted_tokens},
      {"freed_pages", u.freed_pages},
      {"compactions", u.compactions},
      {"compaction_s", u.compaction_seconds},
      {"recalled_pages", u.recalled_pages},
      {"recall_bytes_read", u.recall_bytes_read},
      {"drift", u.drift < 0 ? nlohmann::json(nullptr) : nlohmann::json(u.drift)},
      {"exact_tv", u.exact_tv < 0 ? nlohmann::json(nullptr) : nlohmann::json(u.exact_tv)},
      {"guard_fallbacks", u.guard_fallbacks},
      {"guard_fallbacks_incomplete", u.guard_fallbacks_incomplete},
      {"guard_fallbacks_refused", u.guard_fallbacks_refused},
      {"preemptions", u.preemptions},
      {"swap_outs", u.swap_outs},
      {"swap_ins", u.swap_ins},
      {"recomputes", u.recomputes},
  };
  nlohmann::json line = {
      {"ts", utc_now_iso8601()},
      {"id", ctx.id},
      {"endpoint", ctx.endpoint},
      {"model", ctx.model},
      {"stream", ctx.stream},
      {"status", finish_reason_name(ev.finish)},
  };
  if (!ev.error.empty()) line["error"] = ev.error;
  line["prompt_tokens"] = st.prompt_tokens;
  line["cached_tokens"] = st.cached_tokens;
  line["cached_tokens_hot"] = st.cached_tokens - st.cached_tokens_cold - st.cached_tokens_shared;
  line["cached_tokens_cold"] = st.cached_tokens_cold;
  line["cached_tokens_shared"] = st.cached_tokens_shared;
  line["completion_tokens"] = st.completion_tokens;
  line["policy"] = ctx.policy;
  line["budget"] = ctx.budget;
  line["queue_s"] = u.queue_seconds;
  line["ttft_s"] = started ? nlohmann::json(u.ttft_seconds) : nlohmann::json(nullptr);
  line["e2e_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - ctx.received).count();
  line["kv"] = std::move(kv);
  if (!ctx.request.is_null()) line["request"] = ctx.request;
  return line;
}

}  // namespace kvpack::server
