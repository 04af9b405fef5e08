// A random-weight tiny-qwen3 GGUF with one KV head (GQA group 4): every layer is a single attention stream,
// so decode at depth can only use more than one core by splitting that stream (split-K, model/forward.h).
// Written into the test's temp dir under `name` (per process: ctest runs test binaries concurrently).
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <unistd.h>

#include "gguf/model_writer.h"

namespace kvpack::test {

inline std::string write_one_kv_head_model(const std::string& name, uint32_t seed = 17) {
  gguf::RandomModelSpec spec = gguf::RandomModelSpec::preset("tiny-qwen3");
  spec.n_head = 4;
  spec.n_head_kv = 1;
  spec.n_ctx = 4096;
  spec.seed = seed;
  const std::string path = ::testing::TempDir() + "/" + name + "_" + std::to_string(::getpid()) + ".gguf";
  gguf::write_random_model(spec, path);
  return path;
}

}  // namespace kvpack::test
