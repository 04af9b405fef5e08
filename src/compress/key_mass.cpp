#include "compress/key_mass.h"

#include <algorithm>
#include <cstring>

namespace kvpack::compress {

void KeyMass::prepare(const kv::SequenceKv& kv, BatchItem& item) {
  const int32_t need = kv.max_slots() + static_cast<int32_t>(item.tokens.size());
  if (need > cap_) {
    const int32_t cap = std::max(need, std::max(64, cap_ * 2));
    std::vector<float> grown(static_cast<size_t>(n_streams_) * cap, 0.0f);
    for (int32_t s = 0; s < n_streams_ && cap_ > 0; ++s)
      std::memcpy(grown.data() + static_cast<size_t>(s) * cap, mass_.data() + static_cast<size_t>(s) * cap_,
                  sizeof(float) * static_cast<size_t>(cap_));
    mass_.swap(grown);
    cap_ = cap;
  }
  item.key_mass = mass_.data();
  item.key_mass_stride = cap_;
}

std::span<const float> KeyMass::stream(int32_t s) const {
  if (cap_ == 0) return {};
  return {mass_.data() + static_cast<size_t>(s) * cap_, static_cast<size_t>(cap_)};
}

void KeyMass::compact(int32_t s, std::span<const int32_t> keep) {
  if (cap_ == 0) return;
  float* m = mass_.data() + static_cast<size_t>(s) * cap_;
  for (size_t i = 0; i < keep.size(); ++i) m[i] = m[keep[i]];
  std::fill(m + keep.size(), m + cap_, 0.0f);
}

}  // namespace kvpack::compress
