// StreamingLLM: sinks + the most recent slots. The score is the slot index, so the budget keeps the
// newest slots after the protected ones.
#include "compress/scorer_impl.h"

namespace kvpack::compress::scorer_detail {
namespace {

class StreamingScorer final : public Scorer {
 public:
  ScorerNeeds needs() const override { return {}; }
  void score(const ScoringInputs& in, std::vector<std::vector<float>>& scores) override {
    for (int32_t s = 0; s < in.kv.n_streams(); ++s) {
      auto& out = scores[static_cast<size_t>(s)];
      out.resize(static_cast<size_t>(in.kv.n_slots(s)));
      for (size_t j = 0; j < out.size(); ++j) out[j] = static_cast<float>(j);  // most recent first
    }
  }
};

}  // namespace

std::unique_ptr<Scorer> make_streaming_scorer() { return std::make_unique<StreamingScorer>(); }

}  // namespace kvpack::compress::scorer_detail
