// The command line as users coming from llama.cpp type it, made into what CLI11 parses — applied to
// argv before parsing (tools/kvpack_main.cpp):
//   * `kvpack -m M -p ...` / `kvpack -cnv` (no sub-command, options first) run `generate`, as llama-cli;
//   * llama.cpp's multi-letter single-dash flags (-cnv, -sys, -ngl, -fa, -ctk, ...) are mapped to kvpack's
//     (CLI11 would read `-ngl 0` as `-n gl`), or dropped with a note when they do not apply here (GPU
//     offload, mmap/mlock, flash-attention switches), or refused when they cannot work (-hf: no downloads);
//   * an unknown flag or sub-command is an error with a "did you mean" suggestion.
// Thread-safety: pure functions.
#pragma once
#include <CLI/CLI.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvpack::cli {

// A command-line mistake: one clear line (main prints "kvpack: error: " + what()) and exit status 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct NormalizedArgs {
  std::vector<std::string> args;   // without the program name
  std::vector<std::string> notes;  // for stderr: what was mapped or ignored, and why
};

// argv[1..] → what CLI11 gets. Throws UsageError for unknown flags / sub-commands (with a suggestion).
NormalizedArgs normalize_args(const CLI::App& app, std::vector<std::string> args);

// The candidate closest to `word` (edit distance, a prefix counts as close), or "" when none is close.
std::string closest(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace kvpack::cli
