#include "engine/calibrate.h"

#include <stdexcept>
#include <vector>

namespace kvpack {

compress::QueryStats calibrate(const Model& model, std::span<const int32_t> tokens, const EngineOptions& eo,
                               const std::function<void(int64_t done)>& on_tokens) {
  const ModelConfig& c = model.config();
  if (tokens.empty()) throw std::invalid_argument("calibration needs text (no tokens)");
  Engine engine(model, eo);
  compress::Calibrator cal(c);
  const int32_t bos = model.tokenizer().bos();
  const size_t win = static_cast<size_t>(c.n_ctx) - (bos >= 0 ? 1 : 0);
  const size_t chunk = static_cast<size_t>(eo.max_batch_tokens);
  int64_t done = 0;
  for (size_t i = 0; i < tokens.size(); i += win) {
    std::vector<int32_t> w;
    if (bos >= 0) w.push_back(bos);
    w.insert(w.end(), tokens.begin() + static_cast<long>(i), tokens.begin() + static_cast<long>(std::min(tokens.size(), i + win)));
    auto kv = engine.kv().new_sequence();
    for (size_t j = 0; j < w.size(); j += chunk) {
      BatchItem item;
      item.kv = kv.get();
      item.tokens = std::span<const int32_t>(w.data() + j, std::min(w.size() - j, chunk));
      if (!engine.runner().forward().run(std::span<BatchItem>(&item, 1), &cal)) throw std::runtime_error("KV cache exhausted during calibration");
      done += static_cast<int64_t>(item.tokens.size()) - (j == 0 && bos >= 0 ? 1 : 0);  // text tokens (BOS not counted)
      if (on_tokens) on_tokens(done);
    }
  }
  return cal.finish();
}

}  // namespace kvpack
