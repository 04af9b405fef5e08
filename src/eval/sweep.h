// Quality sweep: policies x budgets (x tasks), each row with its quality numbers next to its memory
// numbers ("no claim about compression counts without quality numbers next to it").
// Writes DIR/results.csv (one row per (policy, budget), failures included with their reason) and
// DIR/results.md (a Markdown table), and plots them with scripts/plot_sweep.py when python3 + matplotlib
// are there. `kvpack eval sweep` is the CLI; tests call run_sweep directly.
// Thread-safety: run_sweep builds its own engines; one sweep per thread.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "compress/config.h"
#include "engine/engine.h"
#include "eval/kld.h"
#include "eval/tasks.h"
#include "model/model.h"

namespace kvpack::eval {

struct SweepOptions {
  std::vector<std::string> policies;  // policy names (full, streaming, ...)
  std::vector<int32_t> budgets;
  int32_t ctx = 512;
  int32_t windows = 2;              // KL windows of ctx tokens
  std::string text_path;            // text for KL (and calibration); empty: no KL columns
  bool tasks = false;
  std::vector<TaskKind> task_kinds = all_tasks();
  int32_t task_n = 10;
  uint64_t seed = 42;
  TaskOptions task_options;         // filler lines for the tasks
  std::string filler_path;          // recorded in results.md
  compress::CompressConfig base;    // schedule (interval, sinks, window, split, protect_prompt); policy/budget are swept
  std::string calib_path;           // triattention statistics; empty: computed by the sweep (and saved in out_dir)
  int64_t calib_tokens = 32768;
  EngineOptions engine;
  std::string out_dir;
  std::string command;              // the command line, recorded in results.md
  size_t max_reference_bytes = size_t{1} << 30;  // full-run logits kept in memory up to this; else recomputed per row
};

struct SweepRow {
  std::string policy;
  int32_t budget = 0;
  bool ok = true;
  std::string error;      // why the row failed (budget too small, ...)
  bool has_kld = false;
  KldResult kld;
  std::vector<TaskResult> tasks;  // in options.task_kinds order (samples dropped)
};

struct SweepResult {
  std::vector<SweepRow> rows;
  std::string calib_note;  // where triattention's statistics came from
  std::string model_name;
  int64_t text_tokens_used = 0;
  double seconds = 0;
};

// Runs every (policy, budget). The "full" policy does not compress, so it is computed once and reported
// on every budget's row as the baseline. `log` receives progress lines (may be empty).
SweepResult run_sweep(const Model& model, const SweepOptions& opt, const std::function<void(const std::string&)>& log = {});

void write_csv(const std::string& path, const SweepResult& res, const SweepOptions& opt);
void write_markdown(const std::string& path, const SweepResult& res, const SweepOptions& opt);
// The Markdown table alone (also printed by the CLI).
std::string markdown_table(const SweepResult& res, const SweepOptions& opt);

// scripts/plot_sweep.py: `hint` if non-empty, else next to the executable (../scripts, ../../scripts), else
// in the source tree this was built from, else ./scripts. Empty if not found.
std::string find_plot_script(const std::string& hint = "");
// Runs the plot script on DIR/results.csv when python3 and matplotlib are available. Returns a line saying
// what happened (plots written, or why not).
std::string plot_sweep(const std::string& out_dir, const std::string& script_hint = "");

}  // namespace kvpack::eval
