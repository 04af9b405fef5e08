// Internal to src/compress: the per-family scorer constructors behind make_scorer (scorer.cpp).
#pragma once
#include <memory>

#include "compress/scorer.h"

namespace kvpack::compress::scorer_detail {

std::unique_ptr<Scorer> make_streaming_scorer();
std::unique_ptr<Scorer> make_knorm_scorer();
std::unique_ptr<Scorer> make_triattention_scorer(const CompressConfig& cfg, const ModelConfig& model);
std::unique_ptr<Scorer> make_window_scorer(const CompressConfig& cfg, const ModelConfig& model);  // snapkv, rkv, tova
std::unique_ptr<Scorer> make_h2o_scorer();

}  // namespace kvpack::compress::scorer_detail
