// What a client asks for and what it gets back, for every way in: the CLI's `generate`, the C++
// Session API, `eval` and the HTTP server all submit a Request to a Scheduler and read RequestEvents.
// Plain data; thread-safety: values, copied between threads by the scheduler.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "compress/compressor.h"
#include "compress/config.h"
#include "engine/sampler.h"

namespace kvpack {

// Log-probabilities of one generated token under the model's distribution (log-softmax of the raw
// logits: before repetition penalty, temperature and truncation, as OpenAI and vLLM report them).
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // the most likely tokens, most likely first
};
inline constexpr int32_t kMaxTopLogprobs = 20;

struct Request {
  std::vector<int32_t> prompt;  // non-empty (BOS at least, for models that use it); at most the context
  int32_t max_tokens = 128;
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  compress::CompressConfig kv;  // KV compression (policy "full" = none)
  int32_t priority = 0;         // higher = more important (priority preemption)
  uint64_t cache_salt = 0;      // prefix-cache namespace (tenants never share blocks across salts)
  // -1: no log-probabilities; k in [0, kMaxTopLogprobs]: each emitted token's log-probability and its
  // k most likely alternatives (RequestEvent::logprobs).
  int32_t logprobs = -1;
  // Choices (OpenAI's `n`): the prompt is prefilled once and its KV pages are shared copy-on-write by n
  // sequences, each with its own sampler (choice i seeded with choice_seed(sampling.seed, i)), stop
  // strings and compressor; every event names its choice (RequestEvent::index) and every choice ends with
  // its own Finished. 1 <= n <= SchedulerOptions::max_running.
  int32_t n = 1;
};

// Why a request ended. Precedence when several hold after one token: end-of-generation token (Eos,
// the token is not emitted), then a stop string (Stop), then max_tokens (Length), then the context
// limit (Context).
enum class FinishReason { Length, Eos, Stop, Context, Cancelled, Error };
// "length", "eos", "stop", "context", "cancelled", "error".
const char* finish_reason_name(FinishReason r);

// Per-request figures, complete in the Finished event.
struct RequestStats {
  int32_t prompt_tokens = 0, completion_tokens = 0;
  int32_t cached_tokens = 0;     // prompt tokens served by the prefix cache (first admission)
  int32_t preemptions = 0;
  int32_t swap_outs = 0, swap_ins = 0;  // preemptions that went to the cold tier and came back from it
  int32_t recomputes = 0;        // preemptions (or lost swaps) that recomputed the KV from text
  int32_t cached_tokens_cold = 0;  // of cached_tokens, loaded from the cold tier
  int32_t cached_tokens_shared = 0;  // of cached_tokens, loaded from the shared tier (another replica computed them)
  int32_t decode_steps = 0;      // forward passes after the prompt (tokens/s = decode_steps / decode_seconds)
  double queue_seconds = 0;      // submit → first admission
  double prefill_seconds = 0;    // first admission → first token sampled
  double decode_seconds = 0;     // first token → finish
  int64_t kv_pages_in_use = 0;   // pages held at the end (before they were freed)
  int64_t peak_kv_pages = 0;     // most pages held at once (naive demonstration: as a non-compacting allocator would)
  // n > 1: full prompt pages this choice took by reference from choice 0 when it forked (0 for choice 0);
  // summed over the choices: the pages sharing saved (Request::n).
  int64_t fork_shared_pages = 0;
  // Pages of sliding-window layers released as they fell out of the window (uncompressed requests).
  int64_t window_pages_freed = 0;
  compress::CompressionStats compression;
  kv::EvictedStats evicted;      // evicted slots kept in the cold tier (kv_cold_evicted)
};

struct RequestEvent {
  enum class Kind { Text, Finished } kind = Kind::Text;
  int32_t index = 0;            // the choice this event belongs to (0 .. Request::n - 1)
  std::string text;             // Text: newly printable text
  std::vector<int32_t> tokens;  // Text: token ids produced with it
  // With Request::logprobs >= 0: one entry per emitted token, in order, on the event that first shows
  // text at or after it (a token whose text is held back rides on a later event; what is left at the
  // end comes on the last Text event or on Finished). Every emitted token appears exactly once.
  std::vector<TokenLogprob> logprobs;
  FinishReason finish = FinishReason::Length;  // Finished
  std::string error;            // Finished with FinishReason::Error: what went wrong
  RequestStats stats;           // Finished
};

}  // namespace kvpack
