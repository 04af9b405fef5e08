// The request log: one JSON line per generation request that reached the scheduler, written when it
// ends (completed, cancelled — client gone or shutdown — or failed), with its KV figures:
//   {"ts": "2026-12-02T05:01:02.345Z", "id": "cmpl-…", "endpoint": "chat" | "completions", "model": …,
//    "stream": bool, "status": "length" | "eos" | "stop" | "context" | "cancelled" | "error", ["error": …,]
//    "prompt_tokens", "cached_tokens", "cached_tokens_hot", "cached_tokens_cold", "completion_tokens",
//    "policy", "budget", "queue_s", "ttft_s", "e2e_s",
//    "kv": {"peak_hot_bytes", "final_hot_bytes", "cold_evicted_pages", "cold_evicted_bytes", "evicted_tokens",
//           "freed_pages", "compactions", "compaction_s", "recalled_pages", "recall_bytes_read", "drift",
//           "preemptions", "swap_outs", "swap_ins", "recomputes"},
//    ["request": the request body as JSON — only with log_requests (--request-log-prompts)]}
// "drift" is null when no recall check measured it; queue_s and ttft_s are engine-side (submission to
// the scheduler → first admission / first token; ttft_s null when no token came), e2e_s runs from the
// complete request body to the end. Lines are what `kvpack analyze-prefix` reads.
// Thread-safety: write() may be called from any thread; each line is one write(2) on an O_APPEND file
// descriptor, so lines from concurrent writers (or processes) never interleave. A failed write is
// counted (failed_writes) and reported once on stderr; it never fails the request.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/request.h"

namespace kvpack::server {

class RequestLog {
 public:
  // path "-": standard error. Otherwise the file is created (mode 0600: it may hold prompts) or
  // appended to. Throws std::runtime_error naming the path when it cannot be opened.
  explicit RequestLog(const std::string& path);
  ~RequestLog();
  RequestLog(const RequestLog&) = delete;
  RequestLog& operator=(const RequestLog&) = delete;

  void write(const nlohmann::json& line);
  uint64_t lines() const { return lines_.load(); }
  uint64_t failed_writes() const { return failed_.load(); }

 private:
  int fd_ = -1;
  bool owned_ = false;
  std::string path_;
  std::atomic<uint64_t> lines_{0}, failed_{0};
  std::atomic<bool> reported_{false};
};

// What the server knows about a request before it runs (the log line's fixed part).
struct RequestLogContext {
  std::string id, endpoint, model;
  bool stream = false;
  std::string policy;
  int32_t budget = 0;
  int64_t page_bytes = 0, kv_streams = 0;
  std::chrono::steady_clock::time_point received;  // body complete (e2e_s counts from here)
  nlohmann::json request;  // null unless prompts are logged
};

// The log line of a finished request (ts = now, UTC).
nlohmann::json request_log_line(const RequestLogContext& ctx, const RequestEvent& finished);

}  // namespace kvpack::server
