#include "engine/text_stream.h"

#include <algorithm>

namespace kvpack {
namespace {

// Length of the longest prefix of s that does not end inside an incomplete UTF-8 sequence.
size_t complete_utf8_prefix(std::string_view s) {
  size_t n = s.size();
  // Look back at most 3 bytes for a lead byte whose sequence runs past the end.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = 1;
    if ((c & 0xE0) == 0xC0) need = 2;
    else if ((c & 0xF0) == 0xE0) need = 3;
    else if ((c & 0xF8) == 0xF0) need = 4;
    return need > back ? n - back : n;
  }
  return n;
}

}  // namespace

std::string TextStream::push(std::string_view piece) {
  if (stopped_) return {};
  pending_.append(piece);
  size_t emit = complete_utf8_prefix(pending_);
  for (const auto& s : stop_) {
    if (s.empty()) continue;
    const size_t at = pending_.find(s);
    if (at != std::string::npos) {
      stopped_ = true;
      std::string out = pending_.substr(0, at);
      pending_.clear();
      return out;
    }
    // Hold back a tail that is a prefix of this stop string.
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > 0; --k)
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        emit = std::min(emit, pending_.size() - k);
        break;
      }
  }
  std::string out = pending_.substr(0, emit);
  pending_.erase(0, emit);
  return out;
}

std::string TextStream::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace kvpack
