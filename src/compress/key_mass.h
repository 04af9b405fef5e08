// H2O's statistic: the attention probability mass each cached key has received, per stream. The
// attention kernel adds to it during the forward (BatchItem::key_mass); compaction moves it with the
// surviving slots.
// Thread-safety: not thread-safe; one per sequence.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kv/sequence_kv.h"
#include "model/forward.h"

namespace kvpack::compress {

class KeyMass {
 public:
  KeyMass() = default;
  explicit KeyMass(int32_t n_streams) : n_streams_(n_streams) {}

  // Before a forward: makes room for the stream lengths after it and points the batch item at the
  // buffer. Grows geometrically, so it reallocates O(log n) times per sequence, not per token.
  void prepare(const kv::SequenceKv& kv, BatchItem& item);
  // Stream s's mass, one float per slot (capacity() floats; slots past the stream's end are 0).
  std::span<const float> stream(int32_t s) const;
  int32_t capacity() const { return cap_; }
  // Keeps the mass of the slots in `keep` (strictly increasing), moved to the front in order.
  void compact(int32_t s, std::span<const int32_t> keep);

 private:
  int32_t n_streams_ = 0;
  int32_t cap_ = 0;
  std::vector<float> mass_;  // [stream][cap_]
};

}  // namespace kvpack::compress
