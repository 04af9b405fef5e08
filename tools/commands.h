// Sub-commands of the `kvpack` CLI; each file tools/cmd_<name>.cpp registers one.
#pragma once
#include <CLI/CLI.hpp>

namespace kvpack::cli {

void add_generate(CLI::App& app);
void add_tokenize(CLI::App& app);
void add_gen_model(CLI::App& app);
void add_calibrate(CLI::App& app);
void add_serve(CLI::App& app);
void add_eval(CLI::App& app);  // `kvpack eval` (kld, tasks, gen-tasks, sweep): the quality harness
void add_eval_parity(CLI::App& eval);  // `kvpack eval parity` (tools/cmd_eval_parity.cpp)
void add_bench(CLI::App& app);  // `kvpack bench` and its sub-commands
void add_analyze_prefix(CLI::App& app);  // `kvpack analyze-prefix`: what breaks prefix reuse in a request log

// Path of the embedded default model (a deterministic random-weight model written on first use).
std::string default_model_path();

}  // namespace kvpack::cli
