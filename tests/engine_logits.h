// Test helpers shared by the reference, KV-type and Q4_K model tests: prompt tokens from real text,
// and teacher-forced logits of every position through the real engine.
#pragma once
#include <algorithm>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "model/model.h"

namespace kvpack::test {

// The opening of a TinyStories-style story: the models' own tokenisation of real text gives realistic
// attention patterns.
inline constexpr std::string_view kStoryText =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
    "One day, she saw a big, red ball. She wanted to play with it, but it was too high. Lily's mom said, "
    "\"Lily, let's go to the park.\" Lily was sad and didn't know what to do.";

// `text` tokenised by `m` (BOS first when the vocab has one), extended to `n` tokens by appending
// toks[size % period + 1] (a repeating pattern of its own tokens), then cut to exactly `n`.
inline std::vector<int32_t> padded_tokens(const Model& m, std::string_view text, int32_t n, size_t period) {
  std::vector<int32_t> toks = m.tokenizer().encode(text, m.tokenizer().bos() >= 0);
  while (static_cast<int32_t>(toks.size()) < n) toks.push_back(toks[toks.size() % period + 1]);
  toks.resize(static_cast<size_t>(n));
  return toks;
}

// Logits of every position, flat [toks.size()][n_vocab], `chunk` tokens per forward call, 2 threads,
// 16-slot pages. Throws std::runtime_error if a forward call fails.
inline std::vector<float> teacher_forced_logits(const Model& m, const std::vector<int32_t>& toks, DType kv_type, int32_t chunk) {
  const int32_t V = m.config().n_vocab, n = static_cast<int32_t>(toks.size());
  EngineOptions eo;
  eo.threads = 2;
  eo.page_size = 16;
  eo.kv_type = kv_type;
  eo.max_batch_tokens = chunk;
  Engine engine(m, eo);
  auto kv = engine.kv().new_sequence();
  std::vector<float> out(static_cast<size_t>(n) * V);
  for (int32_t t = 0; t < n; t += chunk) {
    BatchItem item;
    item.kv = kv.get();
    item.tokens = std::span<const int32_t>(toks.data() + t, static_cast<size_t>(std::min(chunk, n - t)));
    item.logits = out.data() + static_cast<size_t>(t) * V;
    item.all_logits = true;
    if (!engine.runner().forward().run(std::span<BatchItem>(&item, 1))) throw std::runtime_error("forward failed");
  }
  return out;
}

}  // namespace kvpack::test
