#include "kv/circuit_breaker.h"

#include <algorithm>

namespace kvpack::kv {

CircuitBreaker::CircuitBreaker(int failures_to_open, Clock::duration open_for)
    : failures_to_open_(std::max(1, failures_to_open)), open_for_(open_for) {}

bool CircuitBreaker::allow(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  switch (state_) {
    case State::Closed:
      return true;
    case State::Open:
      if (now < reopen_at_) break;
      state_ = State::HalfOpen;
      probing_ = true;
      return true;  // this caller is the probe
    case State::HalfOpen:
      if (!probing_) {  // the probe's outcome was lost (cannot happen with paired calls; be safe)
        probing_ = true;
        return true;
      }
      break;
  }
  ++refused_;
  return false;
}

void CircuitBreaker::success() {
  std::lock_guard<std::mutex> lock(mu_);
  consecutive_ = 0;
  probing_ = false;
  state_ = State::Closed;
}

void CircuitBreaker::failure(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  probing_ = false;
  if (state_ == State::Open) return;  // a call that was already in flight when it opened
  if (state_ == State::HalfOpen || ++consecutive_ >= failures_to_open_) {
    state_ = State::Open;
    reopen_at_ = now + open_for_;
    consecutive_ = 0;
    ++opens_;
  }
}

CircuitBreaker::State CircuitBreaker::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

uint64_t CircuitBreaker::opens() const {
  std::lock_guard<std::mutex> lock(mu_);
  return opens_;
}

uint64_t CircuitBreaker::refused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refused_;
}

const char* breaker_state_name(CircuitBreaker::State s) {
  switch (s) {
    case CircuitBreaker::State::Closed: return "closed";
    case CircuitBreaker::State::Open: return "open";
    case CircuitBreaker::State::HalfOpen: return "half-open";
  }
  return "?";
}

}  // namespace kvpack::kv
