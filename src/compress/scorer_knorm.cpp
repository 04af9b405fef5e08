// KNorm press: keys with a low L2 norm draw more attention, so the score is -||k||.
#include "compress/scorer_impl.h"
#include "kernels/key_scoring.h"

namespace kvpack::compress::scorer_detail {
namespace {

class KNormScorer final : public Scorer {
 public:
  ScorerNeeds needs() const override { return {}; }
  void score(const ScoringInputs& in, std::vector<std::vector<float>>& scores) override {
    for (int32_t s = 0; s < in.kv.n_streams(); ++s) {
      auto& out = scores[static_cast<size_t>(s)];
      out.resize(static_cast<size_t>(in.kv.n_slots(s)));
      kernels::key_neg_norms(in.kv.view(s), out.data());
    }
  }
};

}  // namespace

std::unique_ptr<Scorer> make_knorm_scorer() { return std::make_unique<KNormScorer>(); }

}  // namespace kvpack::compress::scorer_detail
