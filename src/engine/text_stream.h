// Turns token pieces into printable text: holds back incomplete UTF-8 sequences (byte-level BPE
// splits characters across tokens) and any tail that could still become a stop string, so neither
// half-characters nor parts of a stop string ever reach the client.
// Thread-safety: one per sequence.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace kvpack {

class TextStream {
 public:
  explicit TextStream(std::vector<std::string> stop = {}) : stop_(std::move(stop)) {}
  // Adds a piece; returns the text that is now safe to emit. Sets stopped() when a stop string
  // appears (the stop string and anything after it are dropped).
  std::string push(std::string_view piece);
  // End of generation: returns whatever is still held back (invalid trailing bytes included).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stop_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace kvpack
