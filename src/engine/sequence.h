// One request inside the scheduler: its KV, compressor, sampler and text stream, and where it stands.
// Owned by the scheduler; used from the scheduling thread only.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "compress/compressor.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/text_stream.h"
#include "kv/kv_manager.h"
#include "kv/sequence_kv.h"

namespace kvpack {

// Called on the scheduler thread; must be quick and must not call back into the scheduler's step().
using EventSink = std::function<void(const RequestEvent&)>;

struct Sequence {
  uint64_t id = 0;
  uint64_t family = 0;          // the submitted request's id (= id for choice 0): cancel() ends all its choices
  int32_t choice = 0;           // Request::n: which choice this sequence is
  bool fork_pending = false;    // choice 0 of n > 1 until its prefill ends and choices 1..n-1 fork from it
  Request req;
  EventSink sink;
  std::unique_ptr<kv::SequenceKv> kv;             // null while waiting
  std::unique_ptr<kv::SwappedKv> swapped;         // preempted to the cold tier (comes back bit-identical)
  bool recompute = false;                         // preempted without the tier: KV recomputed from text
  // Compression's evicted slots in the cold tier (null without compression, a tier, or kv_cold_evicted).
  // Declared before comp, which points at it.
  std::unique_ptr<kv::EvictedKv> evicted;
  std::unique_ptr<compress::SequenceCompressor> comp;  // null without compression
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<TextStream> text;
  std::vector<int32_t> tokens;  // prompt + generated; the last one may not be in the KV yet
  int32_t n_prompt = 0;
  int32_t n_computed = 0;       // tokens of `tokens` whose K/V were computed (or attached)
  int32_t n_generated = 0;
  int32_t prev_token = -1;      // for the tokenizer's piece_after (SPM: no space right after BOS)
  int32_t registered_blocks = 0;
  uint64_t arrival = 0;         // submit order
  uint64_t admitted_step = 0;   // last (re)admission (lru)
  double t_submit = 0, t_admitted = 0, t_first_token = 0, t_last_token = 0;
  bool cancelled = false;
  std::optional<FinishReason> ending;  // set by update() when the last token decided how it ends
  std::vector<float> raw_logits;           // Request::logprobs >= 0: this step's logits before sampling
  std::vector<TokenLogprob> pending_logprobs;  // emitted tokens whose log-probabilities no event carried yet
  RequestStats stats;
  compress::CompressionStats comp_before;  // compression stats of earlier incarnations (preemption)
  // A forked choice (n > 1): its parent's figures at the fork. The child's compressor and comp_before carry
  // the shared history (the child compresses as a solo run would); its counts start at the fork, so a
  // request's choices and the server's totals count the prompt's compaction once (choice 0 holds it).
  compress::CompressionStats fork_base;

  int32_t pending() const { return static_cast<int32_t>(tokens.size()) - n_computed; }
  bool first_token_done() const { return t_first_token > 0; }
  // Compression figures of every incarnation so far (earlier ones + the live compressor), a forked
  // choice's counted from its fork.
  compress::CompressionStats compression_so_far() const {
    compress::CompressionStats c = comp_before;
    if (comp) c.add(comp->stats());
    c.subtract_counts(fork_base);
    return c;
  }
};

}  // namespace kvpack
