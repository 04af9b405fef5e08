// The bridge between the scheduler thread and one HTTP handler thread: the request's EventSink pushes
// events here (quick: a lock and a notify, as the sink contract requires) and the handler drains them,
// sleeping on the condition variable in between (no busy waiting). The handler wakes at least every
// `timeout` so that it can notice a client that went away or a server shutting down.
// Thread-safety: push / close from any thread; wait from one consumer thread.
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/scheduler.h"

namespace kvpack::server {

class RequestChannel {
 public:
  enum class Status { Events, Timeout, Closed };

  void push(const RequestEvent& ev);
  // Server shutdown: the consumer's next wait returns Closed once the queue is drained.
  void close();
  // Moves every queued event into `out` (appending); when none are queued, waits up to `timeout`.
  Status wait(std::vector<RequestEvent>& out, std::chrono::milliseconds timeout);

  // A sink that keeps the channel alive for as long as the scheduler holds the request, so a handler
  // that has already returned (client gone) never leaves the scheduler writing into freed memory.
  static EventSink sink(const std::shared_ptr<RequestChannel>& ch);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestEvent> queue_;
  bool closed_ = false;
};

}  // namespace kvpack::server
