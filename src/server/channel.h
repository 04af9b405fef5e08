// The bridge between the scheduler thread and the connection serving one request: the request's
// EventSink pushes events here (quick: a lock, and at most one notification per batch, as the sink
// contract requires) and the consumer drains them. Two ways to consume:
//   * event-driven (the HTTP server): set_notify(f) — f runs on the pushing thread, outside the lock,
//     when the queue goes from "taken" to non-empty or the channel closes; it must only schedule work
//     (the server posts a drain to the connection's strand). take() then moves the events out and
//     re-arms the notification;
//   * blocking: wait(), which sleeps on a condition variable (no busy waiting).
// Thread-safety: push / close / set_notify from any thread; take / wait from one consumer at a time.
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/scheduler.h"

namespace kvpack::server {

class RequestChannel {
 public:
  // Events: some were moved out. Timeout / Empty: none queued (wait timed out / take found none).
  // Closed: none queued and the channel was closed (server shutdown).
  enum class Status { Events, Timeout, Empty, Closed };

  void push(const RequestEvent& ev);
  // Server shutdown: the consumer's next wait / take returns Closed once the queue is drained.
  void close();
  // Moves every queued event into `out` (appending); when none are queued, waits up to `timeout`.
  Status wait(std::vector<RequestEvent>& out, std::chrono::milliseconds timeout);
  // Moves every queued event into `out` (appending), without waiting; re-arms the notification.
  Status take(std::vector<RequestEvent>& out);
  // The notification (nullptr: none). Pending events do not notify; take() them after setting it.
  void set_notify(std::function<void()> f);

  // A sink that keeps the channel alive for as long as the scheduler holds the request, so a handler
  // that has already returned (client gone) never leaves the scheduler writing into freed memory.
  static EventSink sink(const std::shared_ptr<RequestChannel>& ch);

 private:
  void notify_locked(std::function<void()>& f);  // picks the notification to run after unlocking

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestEvent> queue_;
  bool closed_ = false;
  std::function<void()> notify_;
  bool notified_ = false;  // a notification ran since the last take()
};

}  // namespace kvpack::server
