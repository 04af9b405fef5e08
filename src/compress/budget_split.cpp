#include "compress/budget_split.h"

namespace kvpack::compress {
namespace {
constexpr float kAdaAlpha = 0.2f;  // each head's guaranteed share of its own budget (Ada-KV)
}  // namespace

BudgetSplitter::BudgetSplitter(const CompressConfig& cfg, int32_t n_layer, int32_t n_head_kv)
    : split_(cfg.split), budget_(cfg.budget), n_layer_(n_layer), n_head_kv_(n_head_kv),
      layer_budgets_(static_cast<size_t>(n_layer), cfg.budget) {
  if (split_ == BudgetSplit::Pyramid)
    layer_budgets_ = pyramid_budgets(cfg.budget, n_layer, cfg.budget + cfg.interval, cfg.effective_window());
}

void BudgetSplitter::select(std::span<const StreamCandidates> streams, std::vector<std::vector<int32_t>>& keeps,
                            ThreadPool* pool) const {
  keeps.resize(streams.size());
  if (split_ != BudgetSplit::Ada) {
    const auto one = [&](size_t s) {
      const StreamCandidates& c = streams[s];
      select_keep(c.scores, static_cast<int32_t>(c.scores.size()), layer_budgets_[s / static_cast<size_t>(n_head_kv_)], c.prot,
                  c.positions, keeps[s]);
    };
    if (pool != nullptr) {
      pool->run(static_cast<int32_t>(streams.size()), [&](int s, int) { one(static_cast<size_t>(s)); });
    } else {
      for (size_t s = 0; s < streams.size(); ++s) one(s);
    }
    return;
  }
  std::vector<std::span<const float>> sc;
  std::vector<Protection> prots;
  std::vector<std::span<const int32_t>> pos;
  std::vector<std::vector<int32_t>> layer_keeps;
  for (int32_t l = 0; l < n_layer_; ++l) {
    sc.clear();
    prots.clear();
    pos.clear();
    for (int32_t h = 0; h < n_head_kv_; ++h) {
      const StreamCandidates& c = streams[static_cast<size_t>(l * n_head_kv_ + h)];
      sc.push_back(c.scores);
      prots.push_back(c.prot);
      pos.push_back(c.positions);
    }
    select_ada(sc, budget_, prots, pos, kAdaAlpha, layer_keeps);
    for (int32_t h = 0; h < n_head_kv_; ++h) keeps[static_cast<size_t>(l * n_head_kv_ + h)] = std::move(layer_keeps[static_cast<size_t>(h)]);
  }
}

}  // namespace kvpack::compress
