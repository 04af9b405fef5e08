#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "kernels/ops.h"

namespace kvpack {

uint64_t choice_seed(uint64_t seed, int32_t index) {
  if (index <= 0) return seed;
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (static_cast<uint64_t>(index) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

Sampler::Sampler(const SamplingParams& p, int32_t n_vocab) : p_(p), state_(p.seed ^ 0x9e3779b97f4a7c15ull) {
  cand_.reserve(static_cast<size_t>(n_vocab));
  cand_.resize(static_cast<size_t>(n_vocab));
}

double Sampler::uniform() {
  // splitmix64: tiny, fast and identical on every platform (std distributions are not).
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * (1.0 / 9007199254740992.0);
}

int32_t Sampler::sample(float* logits, std::span<const int32_t> history) {
  const auto n = static_cast<int32_t>(cand_.size());
  if (p_.repeat_penalty != 1.0f && p_.repeat_last_n != 0) {
    const size_t from = p_.repeat_last_n < 0 || history.size() < static_cast<size_t>(p_.repeat_last_n)
                            ? 0
                            : history.size() - static_cast<size_t>(p_.repeat_last_n);
    // Penalise each distinct token once (as llama.cpp does), so mark what was done.
    for (size_t i = from; i < history.size(); ++i) {
      const int32_t t = history[i];
      if (t < 0 || t >= n) continue;
      bool seen = false;
      for (size_t j = from; j < i; ++j) seen |= history[j] == t;
      if (seen) continue;
      logits[t] = logits[t] > 0 ? logits[t] / p_.repeat_penalty : logits[t] * p_.repeat_penalty;
    }
  }
  if (p_.temperature <= 0.0f) return static_cast<int32_t>(kernels::argmax(logits, n));

  for (int32_t i = 0; i < n; ++i) cand_[static_cast<size_t>(i)] = {logits[i], i};
  size_t m = cand_.size();
  auto by_logit = [](const Cand& a, const Cand& b) { return a.logit > b.logit || (a.logit == b.logit && a.id < b.id); };
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < m) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    m = static_cast<size_t>(p_.top_k);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // softmax with temperature over the m best (sorted descending)
  const float maxl = cand_[0].logit;
  double sum = 0;
  for (size_t i = 0; i < m; ++i) {
    cand_[i].logit = static_cast<float>(std::exp((cand_[i].logit - maxl) / p_.temperature));
    sum += cand_[i].logit;
  }
  for (size_t i = 0; i < m; ++i) cand_[i].logit = static_cast<float>(cand_[i].logit / sum);
  if (p_.top_p < 1.0f) {
    double cum = 0;
    size_t keep = m;
    for (size_t i = 0; i < m; ++i) {
      cum += cand_[i].logit;
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    m = keep;
  }
  if (p_.min_p > 0.0f) {
    const float floor = cand_[0].logit * p_.min_p;
    size_t keep = 1;
    while (keep < m && cand_[keep].logit >= floor) ++keep;
    m = keep;
  }
  double total = 0;
  for (size_t i = 0; i < m; ++i) total += cand_[i].logit;
  double r = uniform() * total;
  for (size_t i = 0; i < m; ++i) {
    r -= cand_[i].logit;
    if (r < 0) return cand_[i].id;
  }
  return cand_[m - 1].id;
}

}  // namespace kvpack
