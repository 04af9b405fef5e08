// KNorm press: keys with a low L2 norm draw more attention, so the score is -||k||.
#include "compress/scorer_impl.h"
#include "kernels/key_scoring.h"

namespace kvpack::compress::scorer_detail {
namespace {

class KNormScorer final : public StreamwiseScorer {
 public:
  std::unique_ptr<Scorer> clone() const override { return std::make_unique<KNormScorer>(*this); }
  ScorerNeeds needs() const override { return {}; }

 protected:
  void score_stream(const ScoringInputs& in, int32_t s, std::span<float> out) override {
    kernels::key_neg_norms(in.kv.view(s), out.data());
  }
};

}  // namespace

std::unique_ptr<Scorer> make_knorm_scorer() { return std::make_unique<KNormScorer>(); }

}  // namespace kvpack::compress::scorer_detail
