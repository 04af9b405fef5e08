// Crafted model files for the loader hardening tests: copies of the reference models in shared/ with
// some header fields or metadata keys replaced, written into the test's temp dir.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <unistd.h>

#include "gguf/gguf.h"
#include "shared_files.h"

namespace kvpack::test {

// Per process: ctest runs test cases (and other checkouts their test suites) concurrently.
inline std::string temp_file(const std::string& name) {
  return ::testing::TempDir() + "/kvpack_" + std::to_string(::getpid()) + "_" + name;
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// stories260K.gguf rewritten with `edit` applied to a Writer that already holds all of its metadata
// and tensors (set_* on an existing key replaces its value). Returns the new file's path.
inline std::string gguf_with(const std::string& name, const std::function<void(gguf::Writer&)>& edit) {
  const auto src = gguf::File::open(shared_path("models/stories260K.gguf"));
  gguf::Writer w;
  for (const auto& kv : src->metadata()) w.set_value(kv.key, kv.value);
  for (const auto& t : src->tensors()) w.add_tensor(t.name, t.shape, t.type, t.data, t.n_bytes);
  edit(w);
  const std::string path = temp_file(name);
  w.write(path);
  return path;
}

// stories260K.bin (llama2.c v0: 7 int32 header fields) with field `index` set to `value`.
inline std::string llama2c_with(const std::string& name, int index, int32_t value) {
  std::string bytes = read_all(shared_path("models/stories260K.bin"));
  std::memcpy(bytes.data() + 4 * index, &value, 4);
  const std::string path = temp_file(name);
  write_bytes(path, bytes);
  return path;
}

}  // namespace kvpack::test
