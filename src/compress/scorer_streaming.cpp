// StreamingLLM: sinks + the most recent slots. The score is the slot index, so the budget keeps the
// newest slots after the protected ones.
#include "compress/scorer_impl.h"

namespace kvpack::compress::scorer_detail {
namespace {

class StreamingScorer final : public StreamwiseScorer {
 public:
  std::unique_ptr<Scorer> clone() const override { return std::make_unique<StreamingScorer>(*this); }
  ScorerNeeds needs() const override { return {}; }

 protected:
  void score_stream(const ScoringInputs&, int32_t, std::span<float> out) override {
    for (size_t j = 0; j < out.size(); ++j) out[j] = static_cast<float>(j);  // most recent first
  }
};

}  // namespace

std::unique_ptr<Scorer> make_streaming_scorer() { return std::make_unique<StreamingScorer>(); }

}  // namespace kvpack::compress::scorer_detail
