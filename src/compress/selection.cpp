#include "compress/selection.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kvpack::compress {
namespace {

bool is_protected(int32_t j, int32_t n, const Protection& p, std::span<const int32_t> positions) {
  if (j < p.sinks || j >= n - p.window) return true;
  return p.prompt_end > 0 && !positions.empty() && positions[static_cast<size_t>(j)] < p.prompt_end;
}

// Orders candidate slots best-first: higher score, then more recent.
void sort_best_first(std::vector<int32_t>& idx, std::span<const float> scores) {
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    const float sa = scores[static_cast<size_t>(a)], sb = scores[static_cast<size_t>(b)];
    if (sa != sb) return sa > sb;
    return a > b;
  });
}

}  // namespace

void select_keep(std::span<const float> scores, int32_t n, int32_t budget, const Protection& prot,
                 std::span<const int32_t> positions, std::vector<int32_t>& keep) {
  keep.clear();
  std::vector<int32_t> cand;
  for (int32_t j = 0; j < n; ++j) (is_protected(j, n, prot, positions) ? keep : cand).push_back(j);
  const int32_t room = std::max<int32_t>(0, budget - static_cast<int32_t>(keep.size()));
  if (room < static_cast<int32_t>(cand.size())) {
    std::nth_element(cand.begin(), cand.begin() + room, cand.end(), [&](int32_t a, int32_t b) {
      const float sa = scores[static_cast<size_t>(a)], sb = scores[static_cast<size_t>(b)];
      return sa != sb ? sa > sb : a > b;
    });
    cand.resize(static_cast<size_t>(room));
  }
  keep.insert(keep.end(), cand.begin(), cand.end());
  std::sort(keep.begin(), keep.end());
}

std::vector<int32_t> pyramid_budgets(int32_t budget, int32_t n_layers, int32_t n, int32_t window) {
  std::vector<int32_t> out(static_cast<size_t>(n_layers), budget);
  if (n_layers < 2) return out;
  constexpr double kBeta = 20.0;
  const double base = budget;
  double min_num = base / kBeta, max_num = 2 * base - min_num;
  if (max_num >= n - window) {
    max_num = n - window;
    min_num = 2 * base - max_num;
  }
  if (!(n >= max_num && max_num >= min_num && min_num >= window)) return out;
  for (int32_t l = 0; l < n_layers; ++l)
    out[static_cast<size_t>(l)] = static_cast<int32_t>(std::lround(max_num - l * (max_num - min_num) / (n_layers - 1)));
  return out;
}

void select_ada(std::span<const std::span<const float>> scores, int32_t budget, std::span<const Protection> prot,
                std::span<const std::span<const int32_t>> positions, float alpha, std::vector<std::vector<int32_t>>& keeps) {
  const auto H = static_cast<int32_t>(scores.size());
  keeps.assign(static_cast<size_t>(H), {});
  const int32_t n_safe = std::max(1, static_cast<int32_t>(alpha * static_cast<float>(budget)));
  int64_t total_left = static_cast<int64_t>(H) * budget;
  struct Entry {
    float score;
    int32_t head, slot;
  };
  std::vector<Entry> rest;
  for (int32_t h = 0; h < H; ++h) {
    auto& keep = keeps[static_cast<size_t>(h)];
    std::vector<int32_t> cand;
    const auto n = static_cast<int32_t>(scores[static_cast<size_t>(h)].size());
    for (int32_t j = 0; j < n; ++j)
      (is_protected(j, n, prot[static_cast<size_t>(h)], positions[static_cast<size_t>(h)]) ? keep : cand).push_back(j);
    sort_best_first(cand, scores[static_cast<size_t>(h)]);
    const size_t safe = std::min(cand.size(), static_cast<size_t>(std::max(0, n_safe)));
    keep.insert(keep.end(), cand.begin(), cand.begin() + static_cast<long>(safe));
    for (size_t i = safe; i < cand.size(); ++i) rest.push_back({scores[static_cast<size_t>(h)][static_cast<size_t>(cand[i])], h, cand[i]});
    total_left -= static_cast<int64_t>(keep.size());
  }
  if (total_left > 0) {
    const size_t take = std::min(rest.size(), static_cast<size_t>(total_left));
    std::nth_element(rest.begin(), rest.begin() + static_cast<long>(take), rest.end(), [](const Entry& a, const Entry& b) {
      return a.score != b.score ? a.score > b.score : a.slot > b.slot;
    });
    for (size_t i = 0; i < take; ++i) keeps[static_cast<size_t>(rest[i].head)].push_back(rest[i].slot);
  }
  for (auto& k : keeps) std::sort(k.begin(), k.end());
}

void z_normalize(std::span<float> x) {
  if (x.empty()) return;
  double mean = 0;
  for (float v : x) mean += v;
  mean /= static_cast<double>(x.size());
  double var = 0;
  for (float v : x) var += (v - mean) * (v - mean);
  const double sd = std::max(std::sqrt(var / static_cast<double>(x.size())), 1e-6);
  for (float& v : x) v = static_cast<float>((v - mean) / sd);
}

}  // namespace kvpack::compress
