#include "eval/sweep.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "compress/calibration.h"
#include "util/progress.h"

namespace kvpack::eval {
namespace fs = std::filesystem;
namespace {

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string fmt_kl(double v) {
  if (v == 0) return "0";
  return v >= 1e-3 ? fmt("%.4f", v) : fmt("%.2e", v);
}

std::string fmt_bytes(size_t b) {
  if (b >= (size_t{1} << 30)) return fmt("%.2f GiB", static_cast<double>(b) / (1 << 30));
  if (b >= (size_t{1} << 20)) return fmt("%.2f MiB", static_cast<double>(b) / (1 << 20));
  if (b >= 1024) return fmt("%.1f KiB", static_cast<double>(b) / 1024);
  return std::to_string(b) + " B";
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c == '\n' ? ' ' : c);
  return q + "\"";
}

std::string md_cell(std::string s) {
  for (char& c : s)
    if (c == '|' || c == '\n') c = ' ';
  return s;
}

std::string machine_line() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 1);
      model.erase(0, model.find_first_not_of(' '));
      break;
    }
  if (model.empty()) model = "unknown CPU";
  return model + ", " + std::to_string(std::thread::hardware_concurrency()) + " cores";
}

std::string utc_date() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%d %H:%M UTC", &tm);
  return b;
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}


// A row's result for task `kind` (the last one if it ran twice), nullptr if it did not run.
const TaskResult* task_result(const SweepRow& r, TaskKind kind) {
  const TaskResult* t = nullptr;
  for (const auto& x : r.tasks)
    if (x.kind == kind) t = &x;
  return t;
}

// The largest resident KV of the row's task runs among `kinds` (0 if none ran).
size_t task_peak_kv_bytes(const SweepRow& r, const std::vector<TaskKind>& kinds) {
  size_t peak = 0;
  for (TaskKind kind : kinds)
    if (const TaskResult* t = task_result(r, kind)) peak = std::max(peak, t->peak_resident_kv_bytes);
  return peak;
}

}  // namespace

SweepResult run_sweep(const Model& model, const SweepOptions& opt, const std::function<void(const std::string&)>& log) {
  auto say = [&](const std::string& s) {
    if (log) log(s);
  };
  const ModelConfig& c = model.config();
  const Tokenizer& tok = model.tokenizer();
  const auto wall0 = std::chrono::steady_clock::now();
  if (opt.policies.empty()) throw std::invalid_argument("no policies to sweep");
  if (opt.budgets.empty()) throw std::invalid_argument("no budgets to sweep");
  for (const auto& p : opt.policies) compress::parse_policy(p);  // unknown names are an error, not a row
  for (int32_t b : opt.budgets)
    if (b < 1) throw std::invalid_argument("budgets must be >= 1 (got " + std::to_string(b) + ")");
  if (opt.ctx < 2 || opt.ctx > c.n_ctx)
    throw std::invalid_argument("--ctx " + std::to_string(opt.ctx) + " must be in [2, " + std::to_string(c.n_ctx) + "] (the model's context)");
  if (opt.text_path.empty() && !opt.tasks) throw std::invalid_argument("nothing to measure: give --text FILE (KL) and/or --tasks");
  if (opt.tasks)  // fails here, once, when ctx cannot hold a task (rather than on every row)
    for (TaskKind k : opt.task_kinds) make_task(k, opt.ctx, sample_seed(opt.seed, k, 0), &tok, opt.task_options);
  if (!opt.out_dir.empty()) fs::create_directories(opt.out_dir);

  SweepResult res;
  res.model_name = c.name;
  // Statistics are computed when a listed policy cannot run without them (triattention); a policy that
  // only uses them when given (trispan) gets them only from --kv-calib, so its rows measure what
  // `--kv-budget N` alone runs on the command line.
  bool requires_calib = false;
  for (const auto& p : opt.policies) requires_calib |= compress::policy_requires_calibration(compress::parse_policy(p));
  const bool need_calib = requires_calib || !opt.calib_path.empty();
  auto row_calib = [&](compress::PolicyKind k) {
    return compress::policy_requires_calibration(k) || !opt.calib_path.empty();
  };

  // Text: KL windows from the start, calibration text right after them (disjoint).
  std::vector<int32_t> text_tokens;
  std::vector<std::vector<int32_t>> windows;
  size_t window_tokens = 0;
  if (!opt.text_path.empty()) {
    const std::string text = read_text_file(opt.text_path);
    const int64_t per = opt.ctx - (tok.bos() >= 0 ? 1 : 0);
    text_tokens = tokenize_head(tok, text, per * opt.windows + (need_calib && opt.calib_path.empty() ? opt.calib_tokens : 0));
    windows = make_windows(model, text_tokens, opt.ctx, opt.windows);
    window_tokens = windows.size() * static_cast<size_t>(per);
    res.text_tokens_used = static_cast<int64_t>(window_tokens);
  }

  // TriAttention statistics.
  std::unique_ptr<compress::QueryStats> stats;
  if (need_calib) {
    if (!opt.calib_path.empty()) {
      stats = std::make_unique<compress::QueryStats>(compress::QueryStats::load(opt.calib_path, c));
      res.calib_note = "triattention calibration: " + opt.calib_path;
    } else {
      std::vector<int32_t> ct;
      std::string from;
      if (text_tokens.size() >= window_tokens + 64) {
        ct.assign(text_tokens.begin() + static_cast<long>(window_tokens), text_tokens.end());
        from = opt.text_path + " (the text after the KL windows)";
      } else if (!text_tokens.empty()) {
        ct = text_tokens;
        from = opt.text_path + " (the same text as the KL windows: the file is short)";
      } else {  // no text: the tasks' filler (--filler sentences, else the built-in lines)
        std::string filler;
        const auto& f = opt.task_options.filler;
        for (int64_t j = 0; static_cast<int64_t>(filler.size()) < opt.calib_tokens * 4; ++j)
          filler += (f.empty() ? builtin_filler(opt.seed, j) : f[static_cast<size_t>(j) % f.size()]) + "\n";
        ct = tokenize_head(tok, filler, opt.calib_tokens);
        from = f.empty() ? std::string("the built-in task filler text") : "the filler text " + opt.filler_path;
      }
      Progress cp("eval sweep: calibrating triattention", static_cast<int64_t>(ct.size()), "tokens");
      stats = std::make_unique<compress::QueryStats>(kvpack::calibrate(model, ct, opt.engine, [&](int64_t d) { cp.set(d); }));
      cp.finish();
      res.calib_note = "triattention calibration: computed by the sweep (no --kv-calib) from " + std::to_string(ct.size()) +
                       " tokens of " + from;
      if (!opt.out_dir.empty()) {
        const std::string p = (fs::path(opt.out_dir) / "triattention_calib.gguf").string();
        stats->save(p);
        res.calib_note += ", saved to " + p;
      }
    }
    say(res.calib_note);
  }

  std::unique_ptr<FullReference> ref;
  if (!windows.empty() &&
      FullReference::bytes_needed(windows.size(), opt.ctx, c.n_vocab) <= opt.max_reference_bytes) {
    ref = std::make_unique<FullReference>(full_reference(model, windows, opt.engine));
  }
  Engine task_engine(model, opt.engine);  // with the statistics (rows whose policy gets them)
  Engine plain_engine(model, opt.engine);  // without
  if (stats) task_engine.set_calibration(*stats);

  // Progress inside a row: KL positions, then task samples (a row can take minutes).
  const int64_t row_work = static_cast<int64_t>(windows.size()) * opt.ctx +
                           (opt.tasks ? static_cast<int64_t>(opt.task_kinds.size()) * opt.task_n : 0);
  auto measure = [&](const compress::CompressConfig& cfg, SweepRow& row) {
    const bool with_stats = stats && row_calib(cfg.policy);
    Progress progress("eval sweep: " + row.policy + (cfg.enabled() ? " budget " + std::to_string(cfg.budget) : ""), row_work,
                      "positions + samples");
    int64_t base = 0;
    if (!windows.empty()) {
      row.kld = kld(model, windows, cfg, with_stats ? stats.get() : nullptr, opt.engine, ref.get(), [&](int64_t d) { progress.set(d); });
      row.has_kld = true;
      base = static_cast<int64_t>(windows.size()) * opt.ctx;
    }
    if (opt.tasks)
      for (TaskKind k : opt.task_kinds) {
        progress.note(std::string("(") + task_name(k) + ")");
        TaskOptions to = opt.task_options;
        to.on_sample = [&](int32_t d) { progress.set(base + d); };
        TaskResult tr = run_task(with_stats ? task_engine : plain_engine, k, opt.ctx, opt.task_n, opt.seed, cfg, to);
        base += opt.task_n;
        tr.samples.clear();
        row.tasks.push_back(std::move(tr));
      }
    progress.finish();
  };
  auto describe = [&](const SweepRow& row) {
    std::string s = row.policy + " budget " + std::to_string(row.budget) + ": ";
    if (!row.ok) return s + "FAILED: " + row.error;
    if (row.has_kld)
      s += "mean KL " + fmt_kl(row.kld.mean_kl) + ", p99 KL " + fmt_kl(row.kld.p99_kl) + ", top-1 " + fmt("%.1f%%", 100 * row.kld.top1) +
           ", ppl " + fmt("%.3f", row.kld.ppl_compressed) + ", peak KV " + fmt_bytes(row.kld.peak_bytes()) + " (full " +
           fmt_bytes(row.kld.full_peak_bytes()) + ")";
    for (const auto& t : row.tasks)
      s += std::string(", ") + task_name(t.kind) + " " + std::to_string(t.correct) + "/" + std::to_string(t.n);
    return s;
  };

  compress::CompressConfig full_cfg = opt.base;
  full_cfg.policy = compress::PolicyKind::Full;
  full_cfg.budget = 0;
  SweepRow full_row;
  full_row.policy = "full";
  measure(full_cfg, full_row);

  for (const auto& p : opt.policies) {
    for (int32_t b : opt.budgets) {
      SweepRow row;
      if (p == "full") {
        row = full_row;
        row.budget = b;
      } else {
        row.policy = p;
        row.budget = b;
        compress::CompressConfig cfg = opt.base;
        cfg.policy = compress::parse_policy(p);
        cfg.budget = b;
        try {
          measure(cfg, row);
        } catch (const std::exception& e) {
          row.ok = false;
          row.error = e.what();
          row.has_kld = false;
          row.tasks.clear();
        }
      }
      say(describe(row));
      res.rows.push_back(std::move(row));
    }
  }
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return res;
}

void write_csv(const std::string& path, const SweepResult& res, const SweepOptions& opt) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path);
  out << "policy,budget,budget_pct_ctx,ctx,status,mean_kl,p99_kl,max_kl,top1,ppl_full,ppl,mean_kl_after_eviction,"
         "positions,positions_after_eviction,peak_kv_bytes,final_kv_bytes,full_peak_kv_bytes,reclaim_efficiency,"
         "compression_events,evicted_slots,freed_pages";
  if (opt.tasks)
    for (TaskKind k : opt.task_kinds) out << ",acc_" << task_name(k) << ",n_" << task_name(k);
  if (opt.tasks) out << ",task_peak_kv_bytes";
  out << "\n";
  for (const auto& r : res.rows) {
    out << r.policy << "," << r.budget << "," << fmt("%.2f", 100.0 * r.budget / opt.ctx) << "," << opt.ctx << ","
        << csv_field(r.ok ? "ok" : "failed: " + r.error);
    if (r.has_kld) {
      const KldResult& k = r.kld;
      out << "," << fmt("%.6g", k.mean_kl) << "," << fmt("%.6g", k.p99_kl) << "," << fmt("%.6g", k.max_kl) << "," << fmt("%.6g", k.top1)
          << "," << fmt("%.6g", k.ppl_full) << "," << fmt("%.6g", k.ppl_compressed) << "," << fmt("%.6g", k.mean_kl_after_eviction) << ","
          << k.positions << "," << k.positions_after_eviction << "," << k.peak_bytes() << "," << k.final_bytes() << ","
          << k.full_peak_bytes() << "," << fmt("%.4f", k.compression.reclaim_efficiency()) << "," << k.compression.events << ","
          << k.compression.evicted_slots << "," << k.compression.freed_pages;
    } else {
      out << std::string(16, ',');
    }
    if (opt.tasks) {
      for (TaskKind kind : opt.task_kinds) {
        if (const TaskResult* t = task_result(r, kind))
          out << "," << fmt("%.4f", t->accuracy) << "," << t->n;
        else
          out << ",,";
      }
      out << ",";
      if (!r.tasks.empty()) out << task_peak_kv_bytes(r, opt.task_kinds);
    }
    out << "\n";
  }
}

std::string markdown_table(const SweepResult& res, const SweepOptions& opt) {
  std::ostringstream o;
  const bool kl = !opt.text_path.empty();
  o << "| policy | budget | % of ctx |";
  if (kl) o << " mean KL | p99 KL | top-1 | ppl | peak KV (of full) | reclaim eff. |";
  if (opt.tasks)
    for (TaskKind k : opt.task_kinds) o << " " << task_name(k) << " |";
  if (opt.tasks) o << " task peak KV |";
  o << "\n|---|---:|---:|";
  if (kl) o << "---:|---:|---:|---:|---:|---:|";
  if (opt.tasks) {
    for (size_t i = 0; i < opt.task_kinds.size(); ++i) o << "---:|";
    o << "---:|";
  }
  o << "\n";
  std::vector<std::string> failures;
  for (const auto& r : res.rows) {
    o << "| " << r.policy << " | " << r.budget << " | " << fmt("%.1f%%", 100.0 * r.budget / opt.ctx) << " |";
    if (!r.ok) {
      failures.push_back(r.policy + " at budget " + std::to_string(r.budget) + ": " + r.error);
      const size_t cols = (kl ? 6 : 0) + (opt.tasks ? opt.task_kinds.size() + 1 : 0);
      for (size_t i = 0; i < cols; ++i) o << (i == 0 ? " failed [" + std::to_string(failures.size()) + "] |" : " – |");
      o << "\n";
      continue;
    }
    if (kl) {
      const KldResult& k = r.kld;
      const double share = k.full_peak_pages > 0 ? 100.0 * static_cast<double>(k.peak_pages) / static_cast<double>(k.full_peak_pages) : 0;
      o << " " << fmt_kl(k.mean_kl) << " | " << fmt_kl(k.p99_kl) << " | " << fmt("%.1f%%", 100 * k.top1) << " | "
        << fmt("%.3f", k.ppl_compressed) << " | " << fmt_bytes(k.peak_bytes()) << " (" << fmt("%.0f%%", share) << ") | "
        << (k.compression.events > 0 ? fmt("%.3f", k.compression.reclaim_efficiency()) : std::string("–")) << " |";
    }
    if (opt.tasks) {
      for (TaskKind kind : opt.task_kinds) {
        if (const TaskResult* t = task_result(r, kind))
          o << " " << fmt("%.0f%%", 100 * t->accuracy) << " (" << t->correct << "/" << t->n << ") |";
        else
          o << " – |";
      }
      o << " " << fmt_bytes(task_peak_kv_bytes(r, opt.task_kinds)) << " |";
    }
    o << "\n";
  }
  if (!failures.empty()) {
    o << "\n";
    for (size_t i = 0; i < failures.size(); ++i) o << "[" << i + 1 << "] " << md_cell(failures[i]) << "\n";
  }
  return o.str();
}

void write_markdown(const std::string& path, const SweepResult& res, const SweepOptions& opt) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path);
  out << "# KV compression quality sweep: " << res.model_name << "\n\n";
  if (!opt.command.empty()) out << "Command: `" << opt.command << "`\n\n";
  out << "- date: " << utc_date() << "; machine: " << machine_line() << "; sweep time " << fmt("%.1f s", res.seconds) << "\n";
  out << "- context " << opt.ctx << " tokens; schedule: compress at budget + " << opt.base.interval << " slots back to the budget, sinks "
      << opt.base.sinks << ", window " << (opt.base.window < 0 ? std::string("policy default") : std::to_string(opt.base.window))
      << ", split " << compress::split_name(opt.base.split) << (opt.base.protect_prompt ? ", prompt protected" : "") << "\n";
  if (!opt.text_path.empty()) {
    const KldResult* any = nullptr;
    for (const auto& r : res.rows)
      if (r.has_kld) any = &r.kld;
    out << "- KL / top-1 / ppl: " << (any ? any->windows : 0) << " window(s) of " << opt.ctx << " tokens of " << opt.text_path
        << ", teacher-forced token by token (compression on the decode schedule), " << (any ? any->positions : 0)
        << " next-token distributions compared against the full-KV run";
    if (any) out << "; full-KV perplexity " << fmt("%.3f", any->ppl_full) << ", full peak KV " << fmt_bytes(any->full_peak_bytes());
    out << "\n";
  }
  if (opt.tasks) {
    out << "- tasks: " << opt.task_n << " samples each, seed " << opt.seed << ", greedy, exact match; filler: "
        << (opt.filler_path.empty() ? std::string("built-in") : opt.filler_path) << "\n";
  }
  if (!res.calib_note.empty()) out << "- " << res.calib_note << "\n";
  out << "- `full` does not compress: it is measured once and repeated on every budget as the baseline\n\n";
  out << markdown_table(res, opt);
}

std::string find_plot_script(const std::string& hint) {
  std::vector<fs::path> cands;
  if (!hint.empty()) return fs::exists(hint) ? hint : "";
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    cands.push_back(exe.parent_path() / "../scripts/plot_sweep.py");
    cands.push_back(exe.parent_path() / "../../scripts/plot_sweep.py");
  }
  cands.push_back(fs::path(__FILE__).parent_path() / "../../scripts/plot_sweep.py");
  cands.push_back("scripts/plot_sweep.py");
  for (const auto& p : cands)
    if (fs::exists(p, ec)) return fs::weakly_canonical(p, ec).string();
  return "";
}

std::string plot_sweep(const std::string& out_dir, const std::string& script_hint) {
  const std::string script = find_plot_script(script_hint);
  const std::string csv = (fs::path(out_dir) / "results.csv").string();
  if (script.empty()) return "plots skipped: scripts/plot_sweep.py not found (pass --plot-script)";
  // The first python3 that has matplotlib ($KVPACK_PYTHON, then the one on PATH, then the system one).
  std::vector<std::string> pythons;
  if (const char* env = std::getenv("KVPACK_PYTHON"); env && *env) pythons.push_back(env);
  pythons.push_back("python3");
  pythons.push_back("/usr/bin/python3");
  std::string py;
  for (const auto& p : pythons)
    if (std::system((shell_quote(p) + " -c 'import matplotlib' >/dev/null 2>&1").c_str()) == 0) {
      py = p;
      break;
    }
  if (py.empty())
    return "plots skipped: no python3 with matplotlib (install python3-matplotlib, then run: python3 " + script + " " + csv + " " +
           out_dir + ")";
  const std::string cmd = shell_quote(py) + " " + shell_quote(script) + " " + shell_quote(csv) + " " + shell_quote(out_dir) + " 1>&2";
  if (std::system(cmd.c_str()) != 0) return "plots FAILED: " + cmd;
  return "plots written to " + out_dir;
}

}  // namespace kvpack::eval
