// Options shared by the CLI sub-commands that load a model and build an engine.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "model/model.h"

namespace kvpack::cli {

struct ModelOptions {
  std::string model;      // empty: the embedded default model
  std::string tokenizer;  // llama2.c tokenizer.bin
  int32_t threads = 2;
  int32_t page_size = 16;
  std::string kv_type = "f32";
  int64_t kv_pages = 0;
  int32_t batch = 256;
  bool quiet = false;
};

void add_model_options(CLI::App& cmd, ModelOptions& o);
std::unique_ptr<Model> load_model(const ModelOptions& o);  // prints a one-line model summary to stderr
EngineOptions engine_options(const ModelOptions& o);
void print_generate_stats(const GenerateResult& r, const Engine& engine);
std::string format_bytes(size_t b);

}  // namespace kvpack::cli
