// H2O: the accumulated attention probability mass of each key (KeyMass, filled by the attention
// kernel during the forward passes).
#include <algorithm>

#include "compress/scorer_impl.h"

namespace kvpack::compress::scorer_detail {
namespace {

class H2OScorer final : public StreamwiseScorer {
 public:
  std::unique_ptr<Scorer> clone() const override { return std::make_unique<H2OScorer>(*this); }
  ScorerNeeds needs() const override { return {0, true, false}; }

 protected:
  void score_stream(const ScoringInputs& in, int32_t s, std::span<float> out) override {
    const std::span<const float> m = in.key_mass ? in.key_mass->stream(s) : std::span<const float>{};
    std::fill(out.begin(), out.end(), 0.0f);  // no forward prepared yet: no mass anywhere
    std::copy_n(m.begin(), std::min(out.size(), m.size()), out.begin());
  }
};

}  // namespace

std::unique_ptr<Scorer> make_h2o_scorer() { return std::make_unique<H2OScorer>(); }

}  // namespace kvpack::compress::scorer_detail
