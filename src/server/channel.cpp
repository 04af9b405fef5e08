#include "server/channel.h"

namespace kvpack::server {

void RequestChannel::push(const RequestEvent& ev) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(ev);
  }
  cv_.notify_one();
}

void RequestChannel::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_one();
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

EventSink RequestChannel::sink(const std::shared_ptr<RequestChannel>& ch) {
  return [ch](const RequestEvent& ev) { ch->push(ev); };
}

}  // namespace kvpack::server
