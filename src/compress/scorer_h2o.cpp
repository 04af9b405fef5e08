// H2O: the accumulated attention probability mass of each key (KeyMass, filled by the attention
// kernel during the forward passes).
#include <algorithm>

#include "compress/scorer_impl.h"

namespace kvpack::compress::scorer_detail {
namespace {

class H2OScorer final : public Scorer {
 public:
  ScorerNeeds needs() const override { return {0, true, false}; }
  void score(const ScoringInputs& in, std::vector<std::vector<float>>& scores) override {
    for (int32_t s = 0; s < in.kv.n_streams(); ++s) {
      const size_t n = static_cast<size_t>(in.kv.n_slots(s));
      const std::span<const float> m = in.key_mass ? in.key_mass->stream(s) : std::span<const float>{};
      auto& out = scores[static_cast<size_t>(s)];
      out.assign(n, 0.0f);  // no forward prepared yet: no mass anywhere
      std::copy_n(m.begin(), std::min(n, m.size()), out.begin());
    }
  }
};

}  // namespace

std::unique_ptr<Scorer> make_h2o_scorer() { return std::make_unique<H2OScorer>(); }

}  // namespace kvpack::compress::scorer_detail
