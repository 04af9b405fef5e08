// Internal to src/compress: the per-family scorer constructors behind make_scorer (scorer.cpp).
#pragma once
#include <memory>

#include <span>
#include <vector>

#include "compress/scorer.h"

namespace kvpack::compress::scorer_detail {

// A scorer that scores each stream on its own: score() sizes every stream's vector to its slots and asks
// score_stream for the values.
class StreamwiseScorer : public Scorer {
 public:
  void score(const ScoringInputs& in, std::vector<std::vector<float>>& scores) final {
    for (int32_t s = 0; s < in.kv.n_streams(); ++s) {
      auto& out = scores[static_cast<size_t>(s)];
      out.resize(static_cast<size_t>(in.kv.n_slots(s)));
      score_stream(in, s, out);
    }
  }

 protected:
  virtual void score_stream(const ScoringInputs& in, int32_t stream, std::span<float> out) = 0;
};

std::unique_ptr<Scorer> make_streaming_scorer();
std::unique_ptr<Scorer> make_knorm_scorer();
std::unique_ptr<Scorer> make_triattention_scorer(const CompressConfig& cfg, const ModelConfig& model);
std::unique_ptr<Scorer> make_window_scorer(const CompressConfig& cfg, const ModelConfig& model);  // snapkv, rkv, tova
std::unique_ptr<Scorer> make_h2o_scorer();

}  // namespace kvpack::compress::scorer_detail
