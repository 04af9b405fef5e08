// A circuit breaker for a remote dependency (the shared KV tier): after `failures_to_open` consecutive
// failures it opens, and calls are refused without touching the network for `open_for`; then one probe
// is let through (half-open): its success closes the breaker, its failure opens it again for another
// `open_for`. The point is that a dead or slow Redis costs each request nothing once the breaker has
// seen it fail, instead of one timeout per request.
//
// Time is passed in (steady clock) so tests drive it without sleeping.
// Thread-safety: every member may be called from any thread (one small mutex).
#pragma once
#include <chrono>
#include <cstdint>
#include <mutex>

namespace kvpack::kv {

class CircuitBreaker {
 public:
  using Clock = std::chrono::steady_clock;
  enum class State : int { Closed = 0, Open = 1, HalfOpen = 2 };

  CircuitBreaker(int failures_to_open, Clock::duration open_for);

  // True when a call may go ahead. While open, false until open_for has passed; then true for exactly
  // one caller (the probe) until it reports success() or failure().
  bool allow(Clock::time_point now = Clock::now());
  void success();
  void failure(Clock::time_point now = Clock::now());

  State state() const;
  uint64_t opens() const;    // times it went from closed / half-open to open
  uint64_t refused() const;  // allow() calls answered false

 private:
  mutable std::mutex mu_;
  const int failures_to_open_;
  const Clock::duration open_for_;
  State state_ = State::Closed;
  int consecutive_ = 0;
  bool probing_ = false;
  Clock::time_point reopen_at_{};
  uint64_t opens_ = 0, refused_ = 0;
};

const char* breaker_state_name(CircuitBreaker::State s);

}  // namespace kvpack::kv
