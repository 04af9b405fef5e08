// Logit parity with another engine (llama.cpp) on the same file and the same token ids: teacher-forced
// next-token logits of kvpack (full KV, eval::full_reference) against logits the peer computed for the
// same windows, as top-1 agreement and KL(peer || kvpack) per position (softmax in double). The peer side
// is scripts/peer/llama_logits (built by scripts/peer/build_llama_tools.sh); the exchange is two plain
// binary files, so any engine that can write them can be compared.
//   windows file: int32 n_windows, int32 ctx, then n_windows * ctx int32 ids
//   logits file:  int32 n_windows, int32 ctx, int32 n_vocab, then n_windows * ctx * n_vocab float32
// Thread-safety: plain functions on their arguments.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "eval/kld.h"

namespace kvpack::eval {

struct PeerLogits {
  int32_t windows = 0, ctx = 0, n_vocab = 0;
  std::vector<float> logits;  // [windows][ctx][n_vocab]
  const float* row(int32_t w, int32_t t) const {
    return logits.data() + (static_cast<size_t>(w) * ctx + static_cast<size_t>(t)) * static_cast<size_t>(n_vocab);
  }
};

// Throws std::runtime_error naming the path if it cannot be written; std::invalid_argument for ragged windows.
void write_windows_file(const std::string& path, const std::vector<std::vector<int32_t>>& windows);
// Throws std::runtime_error naming the path and what is wrong: unreadable, bad header, a shape other than
// the expected one (windows, ctx, n_vocab), truncated, or non-finite logits.
PeerLogits read_logits_file(const std::string& path, int32_t windows, int32_t ctx, int32_t n_vocab);

struct ParityResult {
  int64_t positions = 0;      // distributions compared: windows * (ctx - 1) (the last row predicts past the window)
  double top1 = 0;            // fraction whose argmax agrees
  double mean_kl = 0, p99_kl = 0, max_kl = 0;  // KL(peer || kvpack), nats
  double max_abs_logit_diff = 0;
};

// ours.logits[w] is [ctx][n_vocab] (full_reference); throws std::invalid_argument on a shape mismatch.
ParityResult compare_logits(const FullReference& ours, const PeerLogits& peer);

}  // namespace kvpack::eval
