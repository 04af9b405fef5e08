// Test helpers for reading the reference data in shared/ (KVPACK_SHARED_DIR, set by tests/CMakeLists.txt).
#pragma once
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

namespace kvpack::test {

inline std::string shared_path(const std::string& rel) { return std::string(KVPACK_SHARED_DIR) + "/" + rel; }

// The whole file as bytes; throws std::runtime_error if it cannot be opened.
inline std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace kvpack::test
