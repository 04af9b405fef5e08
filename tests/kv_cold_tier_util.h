// Helpers of the cold-tier tests (kv_cold_tier_test.cpp, kv_cold_tier_file_test.cpp).
#pragma once
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvpack::kv::testing_cold {

// A record that names its key and a counter, the rest derived from both: any mix-up shows.
inline std::vector<uint8_t> make_record(uint64_t key, uint64_t counter, size_t bytes) {
  std::vector<uint8_t> r(bytes);
  std::mt19937_64 rng(key * 0x9e3779b97f4a7c15ull ^ counter);
  for (size_t i = 0; i < bytes; ++i) r[i] = static_cast<uint8_t>(rng() >> 29);
  std::memcpy(r.data(), &key, 8);
  std::memcpy(r.data() + 8, &counter, 8);
  return r;
}

// True when `r` is exactly make_record() of the key and counter it names (and it names `key`).
inline bool self_consistent(uint64_t key, const std::vector<uint8_t>& r) {
  uint64_t named_key = 0, counter = 0;
  std::memcpy(&named_key, r.data(), 8);
  std::memcpy(&counter, r.data() + 8, 8);
  return named_key == key && r == make_record(key, counter, r.size());
}

// A fresh directory under /tmp (mkdtemp), removed with everything in it at the end.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kvpack-cold-test-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace kvpack::kv::testing_cold
