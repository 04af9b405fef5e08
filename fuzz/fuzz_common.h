// Shared by the fuzz targets: where the reference data lives, and the real tokenizers built from it
// once per process (immutable afterwards, so every input sees the same ones).
#pragma once
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <unistd.h>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace kvpack::fuzz {

// KVPACK_SHARED_DIR from the environment (scripts/fuzz.sh sets it), else the configure-time default.
inline std::string shared_dir() {
  const char* env = std::getenv("KVPACK_SHARED_DIR");
  return env && *env ? env : KVPACK_SHARED_DIR;
}

struct NamedTokenizer {
  std::string name;
  Tokenizer tok;
};

// Every shared/vocab/ggml-vocab-*.gguf (SPM and each BPE pre-tokenizer), sorted by name.
inline const std::vector<NamedTokenizer>& vocab_tokenizers() {
  static const std::vector<NamedTokenizer> all = [] {
    std::vector<std::string> paths;
    for (const auto& e : std::filesystem::directory_iterator(shared_dir() + "/vocab"))
      if (e.path().extension() == ".gguf") paths.push_back(e.path().string());
    std::sort(paths.begin(), paths.end());
    std::vector<NamedTokenizer> v;
    for (const auto& p : paths) v.push_back({std::filesystem::path(p).stem().string(), Tokenizer::from_gguf(*gguf::File::open(p))});
    if (v.empty()) std::abort();  // no vocab files: the target would fuzz nothing
    return v;
  }();
  return all;
}

inline const Tokenizer& vocab_tokenizer(std::string_view name) {
  for (const auto& t : vocab_tokenizers())
    if (t.name.find(name) != std::string::npos) return t.tok;
  std::abort();
}

// Every id a tokenizer produced must be a valid token.
inline void check_ids(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  for (int32_t id : ids)
    if (id < 0 || id >= tok.n_vocab()) std::abort();
}

// A per-process scratch file (for loaders that only take a path).
inline std::string scratch_path(const char* what) {
  const char* dir = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp";
  return std::string(dir) + "/kvpack_fuzz_" + what + "_" + std::to_string(::getpid());
}

}  // namespace kvpack::fuzz
