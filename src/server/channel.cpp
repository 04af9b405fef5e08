#include "server/channel.h"

namespace kvpack::server {

void RequestChannel::notify_locked(std::function<void()>& f) {
  if (notify_ && !notified_) {
    notified_ = true;
    f = notify_;
  }
}

void RequestChannel::push(const RequestEvent& ev) {
  std::function<void()> f;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(ev);
    notify_locked(f);
  }
  cv_.notify_one();
  if (f) f();
}

void RequestChannel::close() {
  std::function<void()> f;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    notify_locked(f);
  }
  cv_.notify_one();
  if (f) f();
}

RequestChannel::Status RequestChannel::wait(std::vector<RequestEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !queue_.empty() || closed_; });
  if (!queue_.empty()) {
    for (auto& ev : queue_) out.push_back(std::move(ev));
    queue_.clear();
    return Status::Events;
  }
  return closed_ ? Status::Closed : Status::Timeout;
}

RequestChannel::Status RequestChannel::take(std::vector<RequestEvent>& out) {
  std::lock_guard<std::mutex> lock(mu_);
  notified_ = false;
  if (!queue_.empty()) {
    for (auto& ev : queue_) out.push_back(std::move(ev));
    queue_.clear();
    return Status::Events;
  }
  return closed_ ? Status::Closed : Status::Empty;
}

void RequestChannel::set_notify(std::function<void()> f) {
  std::function<void()> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    old.swap(notify_);
    notify_ = std::move(f);
    notified_ = false;
  }
  // (`old` is destroyed here, outside the lock)
}

EventSink RequestChannel::sink(const std::shared_ptr<RequestChannel>& ch) {
  return [ch](const RequestEvent& ev) { ch->push(ev); };
}

}  // namespace kvpack::server
