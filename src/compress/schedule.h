// When a sequence compresses, and what that implies for admission and prefix caching.
//
// The rule: compress when the sequence's streams hold n_streams * (budget + interval) live slots in
// total, and cut back to the budget. When protected slots (a prompt under protect_prompt, a shared
// prefix) keep a sequence above its budget after an event, the next event waits a full interval beyond
// what was left, instead of firing at every step. With compress_prefill, the end of a prompt longer
// than the budget also fires (once: not again while nothing was added since the last event).
//
// The engine's scheduler asks this class, never the config, so the schedule has one definition:
//   fires / tokens_until_event      when the compressor acts (prefill chunks are clipped to it);
//   projected_slots                  the most slots per stream a sequence can hold (admission);
//   may_register / registrable_tokens which blocks may go into the prefix cache (shared pages are
//                                    never evicted, so only a prompt that is never compressed).
// A disabled config (policy full or budget 0) never fires and projects the full length.
// Thread-safety: const members are pure; on_event mutates (one owner, the sequence's thread).
#pragma once
#include <cstdint>

#include "compress/config.h"

namespace kvpack::compress {

class CompressionSchedule {
 public:
  // `n_streams` = n_layer * n_head_kv (every token appends one slot to every stream).
  CompressionSchedule(const CompressConfig& cfg, int32_t n_streams);

  bool enabled() const { return enabled_; }
  // Should the compressor compress now? `live_total` = live slots summed over streams; `prefill_done`
  // marks the forward that completed the prompt.
  bool fires(int64_t live_total, bool prefill_done) const;
  // Tokens that can still be appended before the next event fires (>= 1; INT32_MAX when disabled).
  int32_t tokens_until_event(int64_t live_total) const;
  // The most slots per stream a sequence of final length `full_len` can hold:
  // min(full_len, max(budget, protect_prompt ? n_prompt : 0, cached_tokens) + interval) when enabled,
  // full_len otherwise. `cached_tokens` = prompt tokens attached from the prefix cache (protected).
  int64_t projected_slots(int64_t full_len, int32_t n_prompt, int32_t cached_tokens) const;
  // May the sequence's prompt blocks be registered with the prefix cache now? Always when disabled;
  // otherwise only before the first event and when the prompt is never evicted (protected, or within
  // the budget).
  bool may_register(int32_t n_prompt) const;
  // Tokens whose full blocks may be registered: the prompt only when compressing (generated tokens are
  // evictable), everything computed otherwise.
  int32_t registrable_tokens(int32_t n_computed, int32_t n_prompt) const;

  // Records an event that left `live_total_after` live slots in total.
  void on_event(int64_t live_total_after);
  int64_t events() const { return events_; }

 private:
  int64_t threshold() const;

  bool enabled_;
  bool protect_prompt_;
  bool compress_prefill_;
  int32_t budget_;
  int32_t interval_;
  int32_t n_streams_;
  int64_t events_ = 0;
  int64_t next_trigger_ = 0;       // live total at which the next event fires (0 = none recorded yet)
  int64_t last_total_after_ = -1;  // live total right after the last event
};

}  // namespace kvpack::compress
