// TriAttention calibration run: the model over `tokens` in context-sized windows (each a fresh sequence,
// starting with BOS where the vocabulary has one), collecting pre-RoPE query statistics.
// Used by `kvpack calibrate`, the quality sweep and `kvpack bench kv`.
#pragma once
#include <cstdint>
#include <functional>
#include <span>

#include "compress/calibration.h"
#include "engine/engine.h"

namespace kvpack {

// on_tokens (optional) is called after each forward chunk with the tokens of `tokens` processed so far
// (progress; the BOS of each window is not counted).
compress::QueryStats calibrate(const Model& model, std::span<const int32_t> tokens, const EngineOptions& eo,
                               const std::function<void(int64_t done)>& on_tokens = {});

}  // namespace kvpack
