// Token sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty, seeded.
// Order (as in llama.cpp's default chain): repetition penalty → top-k → temperature → softmax →
// top-p → min-p → draw. temperature <= 0 means greedy (argmax, first index on ties).
// Thread-safety: a Sampler holds its RNG and scratch; one per sequence, one thread at a time.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace kvpack {

struct SamplingParams {
  float temperature = 0.8f;
  int32_t top_k = 40;        // <= 0: off
  float top_p = 0.95f;       // >= 1: off
  float min_p = 0.05f;       // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off
  int32_t repeat_last_n = 64;
  uint64_t seed = 0;
};

// The seed of choice `index` of a request with n > 1 choices (OpenAI's `n`): choice 0 keeps `seed`, so
// n = 1 and choice 0 of n = 4 give the same text; choice i > 0 takes a splitmix64 mix of (seed, i), so
// every choice is reproducible run to run and equals a solo request sent with choice_seed(seed, i).
uint64_t choice_seed(uint64_t seed, int32_t index);

class Sampler {
 public:
  Sampler(const SamplingParams& p, int32_t n_vocab);
  // `history`: previous tokens (for the repetition penalty). logits are modified in place.
  int32_t sample(float* logits, std::span<const int32_t> history);
  const SamplingParams& params() const { return p_; }

 private:
  double uniform();  // [0, 1)
  SamplingParams p_;
  uint64_t state_;
  struct Cand {
    float logit;
    int32_t id;
  };
  std::vector<Cand> cand_;
};

}  // namespace kvpack
