#include "compress/schedule.h"

#include <algorithm>
#include <limits>

namespace kvpack::compress {

CompressionSchedule::CompressionSchedule(const CompressConfig& cfg, int32_t n_streams)
    : enabled_(cfg.enabled()),
      protect_prompt_(cfg.protect_prompt),
      compress_prefill_(cfg.compress_prefill),
      budget_(cfg.budget),
      interval_(cfg.interval),
      n_streams_(n_streams) {}

int64_t CompressionSchedule::threshold() const {
  return std::max(static_cast<int64_t>(n_streams_) * (budget_ + interval_), next_trigger_);
}

bool CompressionSchedule::fires(int64_t live_total, bool prefill_done) const {
  if (!enabled_) return false;
  const int64_t target = static_cast<int64_t>(n_streams_) * budget_;
  return live_total >= threshold() ||
         (prefill_done && compress_prefill_ && live_total > target && live_total > last_total_after_);
}

int32_t CompressionSchedule::tokens_until_event(int64_t live_total) const {
  if (!enabled_) return std::numeric_limits<int32_t>::max();
  // Every token appends one slot to every stream.
  const int64_t left = (threshold() - live_total + n_streams_ - 1) / n_streams_;
  return static_cast<int32_t>(std::clamp<int64_t>(left, 1, std::numeric_limits<int32_t>::max()));
}

int64_t CompressionSchedule::projected_slots(int64_t full_len, int32_t n_prompt, int32_t cached_tokens) const {
  if (!enabled_) return full_len;
  // Prefill chunks stop where the next event fires, so a sequence holds at most budget + interval;
  // protected slots can hold it above the budget, and then the next event waits a full interval beyond.
  int64_t floor = budget_;
  if (protect_prompt_) floor = std::max<int64_t>(floor, n_prompt);
  floor = std::max<int64_t>(floor, cached_tokens);
  return std::min<int64_t>(full_len, floor + interval_);
}

bool CompressionSchedule::may_register(int32_t n_prompt) const {
  if (!enabled_) return true;
  return events_ == 0 && (protect_prompt_ || n_prompt <= budget_);
}

int32_t CompressionSchedule::registrable_tokens(int32_t n_computed, int32_t n_prompt) const {
  return enabled_ ? std::min(n_computed, n_prompt) : n_computed;
}

void CompressionSchedule::on_event(int64_t live_total_after) {
  ++events_;
  last_total_after_ = live_total_after;
  next_trigger_ = live_total_after + static_cast<int64_t>(n_streams_) * interval_;
}

}  // namespace kvpack::compress
