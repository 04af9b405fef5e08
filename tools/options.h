// Options shared by the CLI sub-commands that load a model and build an engine.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>

#include "engine/engine.h"
#include "model/model.h"

namespace kvpack::cli {

struct ModelOptions {
  std::string model;      // empty: the embedded default model
  std::string tokenizer;  // llama2.c tokenizer.bin
  int32_t threads = 2;
  int32_t page_size = 16;
  std::string kv_type = "f16";  // --kv-type: f32, f16, bf16, q8_0 (kernels::parse_kv_type); f16 as llama.cpp
  int64_t kv_pages = 0;
  std::string kv_cold;  // --kv-cold: "", host:BYTES or dir:PATH:BYTES
  bool kv_cold_evicted = true;  // --kv-cold-evicted
  bool window_free = true;      // --kv-window-free
  bool page_runs = true;        // --kv-page-runs
  std::string kv_shared;  // --kv-shared: "" or redis://HOST:PORT[?options] (kv/shared_tier.h)
  int32_t batch = 256;
  int32_t ctx = 0;  // -c / --ctx-size: context length (0: the model's)
  bool quiet = false;
};

// KV compression flags (--kv-policy ...), shared by generate / eval / serve.
struct KvOptions {
  std::string policy = "full";
  bool policy_given = false;  // --kv-policy on the command line; without it a budget selects compress::kDefaultPolicy
  int32_t budget = 0;
  int32_t interval = 128;
  int32_t sinks = 4;
  int32_t window = -1;
  std::string split = "uniform";
  bool protect_prompt = false;
  bool naive = false;
  std::string calib;
  bool recall = false;
  bool drift = false;
  bool drift_exact = false;
  bool guard_exact = false;
  float guard_exact_tv = compress::kExactGuardTv;
  int32_t recall_every = 16;
  int32_t drift_exact_every = 0;
  int32_t recall_pages = 4;
  int32_t recall_rows = 1;
  float recall_share = 0.02f;
  float recall_pin_override = 0.0f;  // 0: compress::RecallConfig's default
  float guard = 0.0f;
  // The policy these options select: --kv-policy when given, else compress::kDefaultPolicy when
  // --kv-budget > 0, else full. Every command reads the policy through this (labels included).
  compress::PolicyKind resolved_policy() const;
  std::string resolved_policy_name() const { return compress::policy_name(resolved_policy()); }
};

void add_model_options(CLI::App& cmd, ModelOptions& o);
void add_kv_options(CLI::App& cmd, KvOptions& o);
// Validates and converts; loads the calibration into the engine when the policy needs it.
compress::CompressConfig kv_config(const KvOptions& o, Engine& engine);
// Prints a one-line model summary to stderr; applies -c (a context beyond the trained one: a warning).
std::unique_ptr<Model> load_model(const ModelOptions& o);
EngineOptions engine_options(const ModelOptions& o);
// The same, with room in a default-sized pool for what the KV flags need (--kv-drift-exact: a second context).
EngineOptions engine_options(const ModelOptions& o, const KvOptions& kv);
void print_generate_stats(const GenerateResult& r, const Engine& engine, const compress::CompressConfig& kv);
std::string format_bytes(size_t b);
// The whole file as bytes; nullopt if it cannot be opened (commands that took the path through
// CLI::ExistingFile treat that as empty text, `generate -f` as an error).
std::optional<std::string> read_file(const std::string& path);

}  // namespace kvpack::cli
