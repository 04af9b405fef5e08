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
      if (in.is_frozen(s)) {
        out.clear();
        continue;
      }
      out.resize(static_cast<size_t>(in.kv.n_slots(s)));
      score_stream(in, s, out);
    }
  }

 protected:
  virtual void score_stream(const ScoringInputs& in, int32_t stream, std::span<float> out) = 0;
};

// TriAttention's score of every slot of stream (layer, h) at the position whose offset tables are C, S:
// z-normalised per query head, max over the GQA group (scorer_triattention.cpp; TriSpan uses it too).
void tri_stream_scores(const QueryStats& qs, const ModelConfig& mc, const kv::SequenceKv& kv, int32_t layer, int32_t h,
                       std::span<const float> C, std::span<const float> S, std::vector<float>& out);

std::unique_ptr<Scorer> make_streaming_scorer();
std::unique_ptr<Scorer> make_knorm_scorer();
std::unique_ptr<Scorer> make_triattention_scorer(const CompressConfig& cfg, const ModelConfig& model);
std::unique_ptr<Scorer> make_window_scorer(const CompressConfig& cfg, const ModelConfig& model);  // snapkv, rkv, tova
std::unique_ptr<Scorer> make_h2o_scorer();
std::unique_ptr<Scorer> make_trispan_scorer(const CompressConfig& cfg, const ModelConfig& model);

}  // namespace kvpack::compress::scorer_detail
