// `kvpack eval`: the quality harness (docs/quality.md).
//   eval kld        KL divergence / top-1 agreement / perplexity, compressed vs full KV, on real text
//   eval tasks      long-dependency tasks (needle, vartrack, pointer) scored by exact match
//   eval gen-tasks  the task generator's prompt/answer pairs as JSON lines (for training a testbed model)
//   eval sweep      policies x budgets (x tasks) -> results.csv, results.md, plots
//   eval parity     teacher-forced logits against llama.cpp on the same file and ids (cmd_eval_parity.cpp)
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "commands.h"
#include "eval/kld.h"
#include "eval/sweep.h"
#include "eval/tasks.h"
#include "kernels/attention.h"
#include "options.h"

namespace kvpack::cli {
namespace {

int32_t default_ctx(int32_t requested, const Model& m) {
  return requested > 0 ? requested : std::min<int32_t>(512, m.config().n_ctx);
}

std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string out;
  size_t i = 0;
  bool first = true;
  while (i < all.size()) {
    const size_t j = all.find('\0', i);
    std::string a = all.substr(i, j == std::string::npos ? std::string::npos : j - i);
    if (first) {
      const size_t slash = a.rfind('/');
      if (slash != std::string::npos) a = a.substr(slash + 1);  // "kvpack", not the build path
      first = false;
    }
    if (!out.empty()) out += ' ';
    out += a.find_first_of(" \t'\"") == std::string::npos ? a : "'" + a + "'";
    if (j == std::string::npos) break;
    i = j + 1;
  }
  return out;
}

nlohmann::json stats_json(const compress::CompressionStats& s) {
  return {{"events", s.events},           {"evicted_slots", s.evicted_slots}, {"freed_pages", s.freed_pages},
          {"evicted_bytes", s.evicted_bytes}, {"freed_bytes", s.freed_bytes},  {"reclaim_efficiency", s.reclaim_efficiency()},
          {"seconds", s.seconds}};
}

nlohmann::json kv_json(const compress::CompressConfig& kv) {
  return {{"policy", compress::policy_name(kv.policy)}, {"budget", kv.budget},     {"interval", kv.interval},
          {"sinks", kv.sinks},                          {"window", kv.effective_window()}, {"split", compress::split_name(kv.split)},
          {"protect_prompt", kv.protect_prompt}};
}

std::string kv_line(const compress::CompressConfig& kv) {
  if (!kv.enabled()) return "policy full (no compression)";
  return std::string("policy ") + compress::policy_name(kv.policy) + " budget " + std::to_string(kv.budget) + " (interval " +
         std::to_string(kv.interval) + ", sinks " + std::to_string(kv.sinks) + ", window " + std::to_string(kv.effective_window()) +
         ", split " + compress::split_name(kv.split) + (kv.protect_prompt ? ", prompt protected" : "") + ")";
}

std::vector<std::string> filler_from(const std::string& path) {
  if (path.empty()) return {};
  std::vector<std::string> f = eval::filler_sentences(eval::read_text_file(path));
  if (f.size() < 16) throw std::runtime_error(path + ": too few usable filler sentences (" + std::to_string(f.size()) + ")");
  return f;
}

void add_kld(CLI::App& eval) {
  auto* cmd = eval.add_subcommand("kld", "KL divergence and top-1 agreement of compressed vs full KV on a text");
  auto o = std::make_shared<ModelOptions>();
  auto kvo = std::make_shared<KvOptions>();
  auto text = std::make_shared<std::string>();
  auto ctx = std::make_shared<int32_t>(0);
  auto chunks = std::make_shared<int32_t>(4);
  auto json = std::make_shared<bool>(false);
  add_model_options(*cmd, *o);
  add_kv_options(*cmd, *kvo);
  cmd->add_option("--text", *text, "Plain-text file to evaluate on")->required()->check(CLI::ExistingFile);
  cmd->add_option("--ctx", *ctx, "Tokens per window (default: min(512, model context))")->check(CLI::NonNegativeNumber);
  cmd->add_option("--chunks", *chunks, "Windows to evaluate, at most (as many as the text holds)")->check(CLI::PositiveNumber);
  cmd->add_flag("--json", *json, "Print the results as JSON");
  cmd->callback([=] {
    auto model = load_model(*o);
    const EngineOptions eo = engine_options(*o);
    Engine holder(*model, eo);  // kv_config validates and loads --kv-calib into it
    const compress::CompressConfig kv = kv_config(*kvo, holder);
    eval::KldOptions ko;
    ko.ctx = default_ctx(*ctx, *model);
    ko.max_windows = *chunks;
    ko.engine = eo;
    const int64_t per = ko.ctx - (model->tokenizer().bos() >= 0 ? 1 : 0);
    const std::vector<int32_t> toks = eval::tokenize_head(model->tokenizer(), eval::read_text_file(*text), per * ko.max_windows);
    const eval::KldResult r = eval::kld(*model, toks, kv, holder.calibration(), ko);
    if (*json) {
      nlohmann::json j = {{"model", model->config().name}, {"text", *text}, {"ctx", r.ctx}, {"windows", r.windows},
                          {"kv", kv_json(kv)}, {"kv_type", kernels::kv_type_name(eo.kv_type)}, {"positions", r.positions},
                          {"positions_after_eviction", r.positions_after_eviction},
                          {"mean_kl", r.mean_kl}, {"p99_kl", r.p99_kl}, {"max_kl", r.max_kl},
                          {"mean_kl_after_eviction", r.mean_kl_after_eviction}, {"top1", r.top1}, {"ppl_full", r.ppl_full},
                          {"ppl_compressed", r.ppl_compressed}, {"page_bytes", r.page_bytes},
                          {"peak_resident_kv_bytes", r.peak_bytes()}, {"final_resident_kv_bytes", r.final_bytes()},
                          {"full_peak_resident_kv_bytes", r.full_peak_bytes()}, {"full_final_resident_kv_bytes", r.full_final_bytes()},
                          {"compression", stats_json(r.compression)}, {"seconds", r.seconds}};
      std::printf("%s\n", j.dump(2).c_str());
      return;
    }
    const auto& s = r.compression;
    std::printf("kld: %s, %s, KV %s, %d window(s) x %d tokens of %s\n", model->config().name.c_str(), kv_line(kv).c_str(),
                kernels::kv_type_name(eo.kv_type), r.windows, r.ctx, text->c_str());
    std::printf("positions compared: %lld (after the first eviction: %lld)\n", static_cast<long long>(r.positions),
                static_cast<long long>(r.positions_after_eviction));
    std::printf("mean KL: %.6g\np99 KL: %.6g\nmax KL: %.6g\nmean KL after eviction: %.6g\n", r.mean_kl, r.p99_kl, r.max_kl,
                r.mean_kl_after_eviction);
    std::printf("top-1 agreement: %.2f%%\n", 100.0 * r.top1);
    std::printf("ppl full: %.4f ppl compressed: %.4f\n", r.ppl_full, r.ppl_compressed);
    std::printf("peak resident KV: %zu bytes (%s; full: %zu bytes)\n", r.peak_bytes(), format_bytes(r.peak_bytes()).c_str(),
                r.full_peak_bytes());
    std::printf("final resident KV: %zu bytes (%s; full: %zu bytes)\n", r.final_bytes(), format_bytes(r.final_bytes()).c_str(),
                r.full_final_bytes());
    std::printf("compression: events %lld, evicted slots %lld, freed pages %lld, reclaim efficiency %.3f, %.2f ms\n",
                static_cast<long long>(s.events), static_cast<long long>(s.evicted_slots), static_cast<long long>(s.freed_pages),
                s.reclaim_efficiency(), s.seconds * 1e3);
    std::printf("time: %.2f s\n", r.seconds);
  });
}

void add_tasks(CLI::App& eval) {
  auto* cmd = eval.add_subcommand("tasks", "Long-dependency tasks (needle, vartrack, pointer; walk: the decode regime) scored by exact match");
  auto o = std::make_shared<ModelOptions>();
  auto kvo = std::make_shared<KvOptions>();
  auto ctx = std::make_shared<int32_t>(0);
  auto task = std::make_shared<std::string>("all");
  auto n = std::make_shared<int32_t>(20);
  auto seed = std::make_shared<uint64_t>(42);
  auto filler = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto verbose = std::make_shared<bool>(false);
  add_model_options(*cmd, *o);
  add_kv_options(*cmd, *kvo);
  cmd->add_option("--ctx", *ctx, "Context length of each task (prompt + answer; default: min(512, model context))")->check(CLI::NonNegativeNumber);
  cmd->add_option("--task", *task, "needle, vartrack, pointer, walk (the decode regime), a comma-separated list, or all (= needle,vartrack,pointer)");
  cmd->add_option("--n", *n, "Samples per task")->check(CLI::PositiveNumber);
  auto walk_count = std::make_shared<int32_t>(0);
  cmd->add_option("--walk-count", *walk_count, "walk: where the count down starts (0: the task's fixed 128)")->check(CLI::Range(0, eval::kWalkCountMax));
  cmd->add_option("--seed", *seed, "Generator seed");
  cmd->add_option("--filler", *filler, "Filler text file (sentences are used as haystack lines; default: built-in)")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--json", *json, "Print the results as JSON (with every sample)");
  cmd->add_flag("-v,--verbose", *verbose, "Print every sample's expected answer and generation");
  auto answer_only = std::make_shared<bool>(false);
  cmd->add_flag("--answer-only", *answer_only,
                "Generate only as many tokens as the expected answer has (the same prompts): per-request figures such as "
                "--kv-drift-exact then cover the scored answer alone");
  cmd->callback([=] {
    auto model = load_model(*o);
    Engine engine(*model, engine_options(*o, *kvo));
    const compress::CompressConfig kv = kv_config(*kvo, engine);
    const int32_t c = default_ctx(*ctx, *model);
    eval::TaskOptions topt;
    topt.filler = filler_from(*filler);
    topt.answer_only = *answer_only;
    topt.walk_count = *walk_count;
    nlohmann::json all = nlohmann::json::array();
    if (!*json) std::printf("tasks: %s, %s, ctx %d, seed %llu\n", model->config().name.c_str(), kv_line(kv).c_str(), c,
                            static_cast<unsigned long long>(*seed));
    for (eval::TaskKind k : eval::parse_tasks(*task)) {
      const eval::TaskResult r = eval::run_task(engine, k, c, *n, *seed, kv, topt);
      if (*json) {
        nlohmann::json samples = nlohmann::json::array();
        for (const auto& s : r.samples)
          samples.push_back({{"seed", s.task.seed}, {"depth", s.task.depth}, {"prompt_tokens", s.task.prompt_tokens},
                             {"answer", s.task.answer}, {"generated", s.generated}, {"correct", s.correct},
                             {"drift_max", s.recall.drift_max}, {"drift_first", s.recall.drift_first},
                             {"guard_escalations", s.recall.guard_escalations}, {"guard_fallbacks", s.recall.guard_fallbacks},
                             {"guard_fallbacks_incomplete", s.recall.guard_fallbacks_incomplete},
                             {"guard_fallbacks_refused", s.recall.guard_fallbacks_refused},
                             {"pages_recalled", s.recall.pages_recalled}, {"cold_pages_read", s.recall.pages_read},
                             {"cold_bytes_read", s.recall.bytes_read}, {"evicted_cold_pages", s.evicted.pages_written},
                             {"evicted_cold_bytes", s.evicted.bytes_written}, {"digest_bytes", s.evicted.digest_bytes},
                             {"exact_checks", s.recall.exact_checks}, {"exact_skipped", s.recall.exact_skipped},
                             {"exact_flips", s.recall.exact_flips}, {"exact_tv_max", s.recall.exact_tv_max},
                             {"exact_tv_first", s.recall.exact_tv_first}});
        all.push_back({{"task", eval::task_name(k)}, {"n", r.n}, {"correct", r.correct}, {"accuracy", r.accuracy},
                       {"mean_prompt_tokens", r.mean_prompt_tokens}, {"peak_resident_kv_bytes", r.peak_resident_kv_bytes},
                       {"compression", stats_json(r.compression)}, {"samples", samples}});
        continue;
      }
      if (*verbose)
        for (const auto& s : r.samples) {
          std::printf("  %s seed %llu depth %.2f: expected \"%s\" got \"%s\" %s", eval::task_name(k),
                      static_cast<unsigned long long>(s.task.seed), s.task.depth, s.task.answer.c_str(), s.generated.c_str(),
                      s.correct ? "OK" : "wrong");
          if (s.recall.checks > 0)
            std::printf(" drift %.4f (max %.4f) pages recalled %lld", s.recall.drift_first, s.recall.drift_max,
                        static_cast<long long>(s.recall.pages_recalled));
          if (s.recall.exact_checks > 0)
            std::printf(" exact tv max %.4f flips %lld", s.recall.exact_tv_max, static_cast<long long>(s.recall.exact_flips));
          std::printf("\n");
        }
      std::printf("%s: accuracy %.1f%% (%d/%d), mean prompt tokens %.1f, peak resident KV %zu bytes (%s)", eval::task_name(k),
                  100.0 * r.accuracy, r.correct, r.n, r.mean_prompt_tokens, r.peak_resident_kv_bytes,
                  format_bytes(r.peak_resident_kv_bytes).c_str());
      if (kv.enabled())
        std::printf(", compression events %lld, reclaim efficiency %.3f", static_cast<long long>(r.compression.events),
                    r.compression.reclaim_efficiency());
      if (r.compression.recall.checks > 0)
        std::printf(", recall: %.1f pages recalled / %.1f cold pages read / %.1f KiB read per request",
                    static_cast<double>(r.compression.recall.pages_recalled) / r.n, static_cast<double>(r.compression.recall.pages_read) / r.n,
                    static_cast<double>(r.compression.recall.bytes_read) / 1024.0 / r.n);
      std::printf("\n");
      std::fflush(stdout);
    }
    if (*json)
      std::printf("%s\n", nlohmann::json({{"model", model->config().name}, {"ctx", c}, {"seed", *seed}, {"kv", kv_json(kv)}, {"tasks", all}})
                              .dump(2)
                              .c_str());
  });
}

void add_gen_tasks(CLI::App& eval) {
  auto* cmd = eval.add_subcommand("gen-tasks", "Write generated task prompts and answers as JSON lines");
  auto o = std::make_shared<ModelOptions>();
  auto task = std::make_shared<std::string>("all");
  auto n = std::make_shared<int32_t>(100);
  auto ctx = std::make_shared<int32_t>(0);
  auto seed = std::make_shared<uint64_t>(42);
  auto out = std::make_shared<std::string>();
  auto filler = std::make_shared<std::string>();
  auto chars = std::make_shared<bool>(false);
  auto needles = std::make_shared<int32_t>(4);
  auto chains = std::make_shared<int32_t>(2);
  add_model_options(*cmd, *o);
  cmd->add_option("--task", *task, "needle, vartrack, pointer, walk, a comma-separated list, or all (= needle,vartrack,pointer)");
  cmd->add_option("--n", *n, "Samples per task")->check(CLI::PositiveNumber);
  auto walk_count = std::make_shared<int32_t>(0);
  cmd->add_option("--walk-count", *walk_count, "walk: where the count down starts (0: the task's fixed 128)")
      ->check(CLI::Range(0, eval::kWalkCountMax));
  cmd->add_option("--ctx", *ctx, "Target length of prompt + answer + margin, in tokens of the model's tokenizer (bytes with --chars)")
      ->required()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--seed", *seed, "Generator seed");
  cmd->add_option("--out", *out, "JSON-lines file to write")->required();
  cmd->add_option("--filler", *filler, "Filler text file (default: built-in filler)")->check(CLI::ExistingFile);
  cmd->add_flag("--chars", *chars, "Size by bytes (character-level models) instead of the model's tokenizer");
  cmd->add_option("--needles", *needles, "Needles per needle prompt (training data; `eval tasks` always uses 4)")
      ->check(CLI::Range(eval::kNeedlesMin, eval::kNeedlesMax));
  cmd->add_option("--chains", *chains, "Variable chains per vartrack prompt (training data; `eval tasks` always uses 2)")
      ->check(CLI::Range(eval::kChainsMin, eval::kChainsMax));
  cmd->callback([=] {
    std::unique_ptr<Model> model;
    if (!*chars) model = load_model(*o);
    const Tokenizer* tok = model ? &model->tokenizer() : nullptr;
    eval::TaskOptions topt;
    topt.filler = filler_from(*filler);
    topt.needles = *needles;
    topt.chains = *chains;
    topt.walk_count = *walk_count;
    std::ofstream f(*out);
    if (!f) throw std::runtime_error("cannot write " + *out);
    int64_t lines = 0;
    for (eval::TaskKind k : eval::parse_tasks(*task)) {
      for (int32_t i = 0; i < *n; ++i) {
        // The same seeds and needle depths as `eval tasks` (sample i of n at depth i / (n - 1)).
        topt.depth = k == eval::TaskKind::Needle ? (*n > 1 ? static_cast<double>(i) / (*n - 1) : 0.5) : -1;
        const uint64_t s = eval::sample_seed(*seed, k, i);
        const eval::Task t = eval::make_task(k, *ctx, s, tok, topt);
        nlohmann::json j = {{"task", eval::task_name(k)}, {"index", i},           {"seed", s},
                            {"ctx", *ctx},                {"unit", tok ? "tokens" : "bytes"},
                            {"prompt", t.prompt},         {"answer", t.answer},   {"prompt_len", t.prompt_tokens},
                            {"answer_len", t.answer_tokens}, {"max_tokens", t.max_tokens}, {"depth", t.depth}};
        f << j.dump() << "\n";
        ++lines;
      }
    }
    std::fprintf(stderr, "[kvpack] wrote %lld tasks to %s\n", static_cast<long long>(lines), out->c_str());
  });
}

void add_sweep(CLI::App& eval) {
  auto* cmd = eval.add_subcommand("sweep", "Quality sweep over policies x budgets: results.csv, results.md, plots");
  auto o = std::make_shared<ModelOptions>();
  auto text = std::make_shared<std::string>();
  auto tasks = std::make_shared<bool>(false);
  auto task = std::make_shared<std::string>("all");
  auto n = std::make_shared<int32_t>(10);
  auto seed = std::make_shared<uint64_t>(42);
  auto filler = std::make_shared<std::string>();
  auto policies = std::make_shared<std::vector<std::string>>(
      std::vector<std::string>{"full", "streaming", "knorm", "triattention", "snapkv", "rkv", "tova", "h2o"});
  auto budgets = std::make_shared<std::vector<int32_t>>(std::vector<int32_t>{32, 64, 128, 256});
  auto ctx = std::make_shared<int32_t>(0);
  auto chunks = std::make_shared<int32_t>(2);
  auto out = std::make_shared<std::string>();
  auto quick = std::make_shared<bool>(false);
  auto no_plot = std::make_shared<bool>(false);
  auto plot_script = std::make_shared<std::string>();
  auto kvo = std::make_shared<KvOptions>();
  add_model_options(*cmd, *o);
  cmd->add_option("--text", *text, "Plain-text file for KL / top-1 / ppl (and triattention calibration)")->check(CLI::ExistingFile);
  cmd->add_flag("--tasks", *tasks, "Also run the long-dependency tasks");
  cmd->add_option("--task", *task, "Tasks for --tasks: needle, vartrack, pointer, a list, or all");
  auto* n_opt = cmd->add_option("--n", *n, "Samples per task")->check(CLI::PositiveNumber);
  cmd->add_option("--seed", *seed, "Task generator seed");
  cmd->add_option("--filler", *filler, "Filler text file for the tasks (default: built-in)")->check(CLI::ExistingFile);
  auto* pol_opt = cmd->add_option("--policies", *policies, "Comma-separated policies")->delimiter(',');
  auto* bud_opt = cmd->add_option("--budgets", *budgets, "Comma-separated budgets (slots per layer x KV head)")->delimiter(',');
  auto* ctx_opt = cmd->add_option("--ctx", *ctx, "Context length (default: min(512, model context))")->check(CLI::NonNegativeNumber);
  auto* chunks_opt = cmd->add_option("--chunks", *chunks, "KL windows of ctx tokens")->check(CLI::PositiveNumber);
  cmd->add_option("--out", *out, "Output directory")->required();
  cmd->add_flag("--quick", *quick, "Reduced size for CI: ctx 256 (512 with --tasks), 1 window, budgets 32,64, 2 samples per task, 1 thread");
  cmd->add_flag("--no-plot", *no_plot, "Do not run scripts/plot_sweep.py");
  cmd->add_option("--plot-script", *plot_script, "Path of plot_sweep.py (default: found next to the binary or the sources)");
  cmd->add_option("--kv-interval", kvo->interval, "Compress when the cache reaches budget + interval")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--kv-sinks", kvo->sinks, "First slots never evicted")->check(CLI::NonNegativeNumber);
  cmd->add_option("--kv-window", kvo->window, "Recent slots never evicted (-1 = policy default)")->check(CLI::Range(-1, 1 << 20));
  cmd->add_option("--kv-split", kvo->split, "Budget split across layers/heads")->check(CLI::IsMember({"uniform", "pyramid", "ada"}));
  cmd->add_flag("--kv-protect-prompt", kvo->protect_prompt, "Never evict prompt tokens");
  cmd->add_option("--kv-calib", kvo->calib, "TriAttention calibration (default: computed by the sweep from --text)")
      ->check(CLI::ExistingFile);
  cmd->callback([=] {
    auto model = load_model(*o);
    eval::SweepOptions so;
    so.policies = *policies;
    so.budgets = *budgets;
    so.ctx = default_ctx(*ctx, *model);
    so.windows = *chunks;
    so.task_n = *n;
    if (*quick) {
      // 256 tokens show compression at budgets 32 and 64 (interval 128); tasks need more room with a small vocab.
      if (!ctx_opt->count()) so.ctx = std::min<int32_t>(*tasks ? 512 : 256, model->config().n_ctx);
      if (!chunks_opt->count()) so.windows = 1;
      if (!bud_opt->count()) so.budgets = {32, 64};
      if (!n_opt->count()) so.task_n = 2;
    }
    so.engine = engine_options(*o);
    // A 1-thread engine is the fast one for CI-sized models (and it does not spin against other jobs).
    if (*quick && cmd->get_option("--threads")->count() == 0) so.engine.threads = 1;
    (void)pol_opt;
    so.text_path = *text;
    so.tasks = *tasks;
    so.task_kinds = eval::parse_tasks(*task);
    so.seed = *seed;
    so.filler_path = *filler;
    so.task_options.filler = filler_from(*filler);
    so.base.interval = kvo->interval;
    so.base.sinks = kvo->sinks;
    so.base.window = kvo->window;
    so.base.split = compress::parse_split(kvo->split);
    so.base.protect_prompt = kvo->protect_prompt;
    so.calib_path = kvo->calib;
    so.out_dir = *out;
    so.command = command_line();
    const eval::SweepResult r = eval::run_sweep(*model, so, [&](const std::string& s) {
      if (!o->quiet) std::fprintf(stderr, "[kvpack] sweep: %s\n", s.c_str());
    });
    const std::string csv = *out + "/results.csv", md = *out + "/results.md";
    eval::write_csv(csv, r, so);
    eval::write_markdown(md, r, so);
    std::printf("%s", eval::markdown_table(r, so).c_str());
    std::fprintf(stderr, "[kvpack] sweep: %zu rows in %.1f s -> %s, %s\n", r.rows.size(), r.seconds, csv.c_str(), md.c_str());
    if (!*no_plot) std::fprintf(stderr, "[kvpack] sweep: %s\n", eval::plot_sweep(*out, *plot_script).c_str());
  });
}

}  // namespace

void add_eval(CLI::App& app) {
  auto* eval = app.add_subcommand("eval", "Quality harness: KL vs full KV, long-dependency tasks, sweeps (docs/quality.md)");
  eval->require_subcommand(1);
  add_kld(*eval);
  add_tasks(*eval);
  add_gen_tasks(*eval);
  add_sweep(*eval);
  add_eval_parity(*eval);
}

}  // namespace kvpack::cli
