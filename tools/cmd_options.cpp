#include <cstdio>
#include <fstream>
#include <sstream>

#include "commands.h"
#include "engine/auto_calibration.h"
#include "kernels/attention.h"
#include "options.h"
#include "util/progress.h"

namespace kvpack::cli {

void add_model_options(CLI::App& cmd, ModelOptions& o) {
#ifdef KVPACK_EMBEDDED_MODEL
  const char* default_model = "the embedded kvpack testbed model, docs/testbed.md";
#else
  const char* default_model = "a random-weight model (this build has no models/testbed.gguf to embed)";
#endif
  cmd.add_option("-m,--model", o.model, std::string("Model file: GGUF, or llama2.c checkpoint with --tokenizer (default: ") + default_model + ")")
      ->default_str("");
  cmd.add_option("-c,--ctx-size", o.ctx, "Context length in tokens (0: the model's trained context)")
      ->check(CLI::Range(0, static_cast<int>(model_limits::kMaxContext)));
  cmd.add_option("--tokenizer", o.tokenizer, "llama2.c tokenizer file (tokenizer.bin) for llama2.c checkpoints")
      ->check(CLI::ExistingFile);
  cmd.add_option("-t,--threads", o.threads, "Threads")->check(CLI::Range(1, 256));
  cmd.add_option("--page-size", o.page_size, "KV page size in token slots")->check(CLI::Range(1, 256));
  cmd.add_option("--kv-type", o.kv_type, "KV element type: f32, f16, bf16, q8_0 (q8_0: 34 bytes per 32 elements, head_dim % 32 == 0)")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}));
  cmd.add_option("--kv-pages", o.kv_pages, "KV page pool limit (0: one full context)")->check(CLI::NonNegativeNumber);
  cmd.add_option("--kv-cold", o.kv_cold,
                 "Cold KV tier for swap preemption and prefix-cache spill: host:BYTES (RAM) or dir:PATH:BYTES (a file; frees RAM); "
                 "BYTES takes K/M/G suffixes (powers of 1024)");
  cmd.add_option("--kv-shared", o.kv_shared,
                 "Shared KV tier for prefix blocks, shared by the replicas of a model (docs/scale.md): "
                 "redis://HOST[:PORT][?ttl=S&timeout_ms=MS&queue=BYTES&failures=N&open_ms=MS&max_blocks=N] "
                 "(defaults: port 6379, ttl 3600, timeout_ms 50, queue 64M, failures 3, open_ms 2000, max_blocks 256). "
                 "Blocks are published when computed and fetched on a local miss; a slow or absent Redis never fails a request");
  cmd.add_option("--kv-cold-evicted", o.kv_cold_evicted,
                 "With --kv-cold and compression: keep the tokens compression evicts in the cold tier, with a key digest per "
                 "page in RAM (what recall reads), instead of discarding them")
      ->default_val(true);
  cmd.add_option("--kv-window-free", o.window_free,
                 "Sliding-window models (gemma3): return the pages of local layers to the pool as they fall out of the "
                 "window (false keeps them: a baseline to measure against; outputs are identical)")
      ->default_val(true);
  cmd.add_option("--kv-page-runs", o.page_runs,
                 "Keep each KV stream's pages in runs of consecutive memory, so decode reads them at the hardware "
                 "prefetchers' rate (false: pages one at a time, most recently freed first; a baseline to measure "
                 "against; outputs are identical)")
      ->default_val(true);
  cmd.add_option("-b,--batch", o.batch, "Tokens per forward call (prefill chunk)")->check(CLI::Range(1, 65536));
  cmd.add_flag("-q,--quiet", o.quiet, "No model summary on stderr");
}

void add_kv_options(CLI::App& cmd, KvOptions& o) {
  cmd.add_option("--kv-policy", o.policy,
                 "KV compression policy: full, streaming, knorm, triattention, snapkv, rkv, tova, h2o, trispan "
                 "(default: trispan when --kv-budget > 0, else full)")
      ->each([&o](const std::string&) { o.policy_given = true; });
  cmd.add_option("--kv-budget", o.budget, "Slots kept per (layer, KV head) after compression (0 = no compression)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--kv-interval", o.interval, "Compress when the cache reaches budget + interval")->check(CLI::Range(1, 1 << 20));
  cmd.add_option("--kv-sinks", o.sinks, "First slots never evicted")->check(CLI::NonNegativeNumber);
  cmd.add_option("--kv-window", o.window, "Recent slots never evicted (-1 = policy default)")->check(CLI::Range(-1, 1 << 20));
  cmd.add_option("--kv-split", o.split, "Budget split across layers/heads")->check(CLI::IsMember({"uniform", "pyramid", "ada"}));
  cmd.add_flag("--kv-protect-prompt", o.protect_prompt, "Never evict prompt tokens");
  cmd.add_flag("--kv-naive", o.naive, "Demonstration: report the pages eviction without compaction would hold (it frees almost nothing)");
  cmd.add_flag("--kv-recall", o.recall,
               "Recall evicted pages from the cold tier (needs --kv-cold) when the latest queries may need them: after "
               "prefill and every --kv-recall-every decode steps");
  cmd.add_flag("--kv-drift", o.drift,
               "Measure the drift estimate (attention share evicted keys could hold) at the recall checks without recalling "
               "(needs --kv-cold)");
  cmd.add_option("--kv-guard", o.guard,
                 "Drift guard (with --kv-recall): above this drift estimate a check reads every cold page, and if the estimate "
                 "stays above, the request falls back to full KV (0 = off)")
      ->check(CLI::Range(0.0, 1.0));
  cmd.add_flag("--kv-drift-exact", o.drift_exact,
               "At every recall check also compute the newest token over all of the request's KV (hot and cold) and report "
               "how far its next-token distribution is from the compressed one (total variation; one full-context step "
               "per check; needs --kv-cold)");
  cmd.add_flag("--kv-guard-exact", o.guard_exact,
               "Exact guard (implies --kv-drift-exact): when a check's next-token distribution with every KV is "
               "--kv-guard-exact-tv away (total variation) from the compressed one, or its most likely token differs, the "
               "request falls back to full KV at once");
  cmd.add_option("--kv-drift-exact-every", o.drift_exact_every,
                 "Decode steps between exact checks (one always runs right after prefill); 0 = at every recall check")
      ->check(CLI::Range(0, 1 << 20));
  cmd.add_option("--kv-guard-exact-tv", o.guard_exact_tv, "The exact guard's total-variation threshold")
      ->check(CLI::Range(1e-6, 1.0));
  cmd.add_option("--kv-recall-every", o.recall_every, "Decode steps between recall checks")->check(CLI::Range(1, 1 << 20));
  cmd.add_option("--kv-recall-rows", o.recall_rows,
                 "Newest query rows scored at a decode-time recall check (those tokens are computed again when pages come back)")
      ->check(CLI::Range(1, 64));
  cmd.add_option("--kv-recall-pages", o.recall_pages, "Cold pages read per (layer, KV head) per recall check")
      ->check(CLI::Range(1, 1 << 16));
  cmd.add_option("--kv-recall-share", o.recall_share,
                 "A cold page is read and recalled when it could hold this share of the hot attention mass")
      ->check(CLI::Range(1e-6, 1.0));
  cmd.add_option("--kv-recall-pin-override", o.recall_pin_override,
                 "With --kv-recall-every 1: a recalled page whose attention share reaches this (1: as much as the whole hot set) "
                 "may displace the slots the policy pinned (trispan's spans); 0: the default (1)")
      ->check(CLI::Range(0.0, 1e6));
  cmd.add_option("--kv-calib", o.calib, "TriAttention calibration file (from `kvpack calibrate`; used by trispan when given; triattention without it: "
                 "computed once on built-in text and cached in $XDG_CACHE_HOME/kvpack or ~/.cache/kvpack)")
      ->check(CLI::ExistingFile);
}

compress::PolicyKind KvOptions::resolved_policy() const {
  // No --kv-policy (and no caller that set one): the budget alone selects the default policy.
  return policy_given || policy != "full" ? compress::parse_policy(policy) : compress::resolve_policy("", budget);
}

compress::CompressConfig kv_config(const KvOptions& o, Engine& engine) {
  compress::CompressConfig c;
  c.policy = o.resolved_policy();
  c.budget = o.budget;
  c.interval = o.interval;
  c.sinks = o.sinks;
  c.window = o.window;
  c.split = compress::parse_split(o.split);
  c.protect_prompt = o.protect_prompt;
  c.naive = o.naive;
  c.calib_path = o.calib;
  c.recall.enabled = o.recall || o.drift || o.drift_exact || o.guard_exact;
  c.recall.bring_back = o.recall;
  c.recall.every = o.recall_every;
  c.recall.max_pages = o.recall_pages;
  c.recall.rows = o.recall_rows;
  c.recall.min_share = o.recall_share;
  if (o.recall_pin_override > 0) c.recall.pin_override_share = o.recall_pin_override;
  c.recall.guard = o.guard;
  c.recall.exact = o.drift_exact || o.guard_exact;
  c.recall.exact_every = o.drift_exact_every;
  c.recall.exact_guard = o.guard_exact ? o.guard_exact_tv : 0.0f;
  // Load the statistics first (when given) so that validate() sees them — whatever the default policy:
  // a server's requests may choose triattention / trispan per request (kv_policy) and need them then. A
  // policy that cannot run without them gets them computed once on built-in text and cached
  // (engine/auto_calibration.h).
  if (!o.calib.empty())
    engine.set_calibration(compress::QueryStats::load(o.calib, engine.model().config()));
  if (c.budget > 0) {
    AutoCalibrationInfo info;
    if (ensure_calibration(engine, c.policy, &info)) std::fprintf(stderr, "[kvpack] %s\n", info.describe().c_str());
  }
  c.validate(engine.model().config(), engine.calibration());
  return c;
}

std::unique_ptr<Model> load_model(const ModelOptions& o) {
  const std::string path = o.model.empty() ? default_model_path() : o.model;
  std::unique_ptr<Model> m;
  {
    // A long load (llama2.c weights are read and converted; a GGUF on a slow disk) shows it is alive.
    Progress progress("loading " + path, 0, "");
    ProgressProbe probe(progress, [] { return int64_t{0}; });
    m = Model::load(path, o.tokenizer);
  }
  if (o.ctx > 0 && o.ctx != m->config().n_ctx) {
    if (o.ctx > m->trained_context_length())
      std::fprintf(stderr, "[kvpack] warning: -c %d is beyond the context this model was trained for (%d); quality will suffer\n", o.ctx,
                   m->trained_context_length());
    m->set_context_length(o.ctx);
  }
  const ModelConfig& c = m->config();
  if (!o.quiet) {
    std::fprintf(stderr, "[kvpack] model %s: %s, %d layers, embd %d, heads %d/%d (head_dim %d), ff %d, vocab %d, ctx %d, %s weights\n",
                 c.name.c_str(), c.arch.c_str(), c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_ff, c.n_vocab,
                 c.n_ctx, format_bytes(m->weight_bytes()).c_str());
  }
  if (c.random_weights)
    std::fprintf(stderr, "[kvpack] NOTE: this model has RANDOM weights (generated by kvpack, not trained; name: %s): its text is noise\n",
                 c.name.c_str());
  return m;
}

EngineOptions engine_options(const ModelOptions& o) {
  EngineOptions e;
  e.threads = o.threads;
  e.page_size = o.page_size;
  e.kv_type = kernels::parse_kv_type(o.kv_type);
  e.kv_pages = o.kv_pages;
  e.kv_cold = o.kv_cold;
  e.kv_cold_evicted = o.kv_cold_evicted;
  e.window_free = o.window_free;
  e.page_runs = o.page_runs;
  e.kv_shared = o.kv_shared;
  e.max_batch_tokens = o.batch;
  return e;
}

EngineOptions engine_options(const ModelOptions& o, const KvOptions& kv) {
  EngineOptions e = engine_options(o);
  // The exact drift check of a model with sliding-window layers copies the evicted KV into a fork (a whole
  // context beside the request; other models attend it where it is read). The pool is allocated lazily.
  if (kv.drift_exact || kv.guard_exact) e.contexts = 2;
  return e;
}

std::string format_bytes(size_t b) {
  char buf[64];
  if (b >= (size_t{1} << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1 << 30));
  else if (b >= (size_t{1} << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(b) / (1 << 20));
  else if (b >= 1024) std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(b) / 1024);
  else std::snprintf(buf, sizeof buf, "%zu B", b);
  return buf;
}

std::optional<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void print_generate_stats(const GenerateResult& r, const Engine& engine, const compress::CompressConfig& kv) {
  const double pre = r.prefill_seconds > 0 ? r.prompt_tokens / r.prefill_seconds : 0;
  const double dec = r.decode_seconds > 0 ? r.decode_steps / r.decode_seconds : 0;
  std::fprintf(stderr,
               "[kvpack] stats: prompt_tokens=%d generated=%zu stop=%s prefill_tok_s=%.1f decode_tok_s=%.1f "
               "kv_type=%s kv_pages_in_use=%lld kv_page_bytes=%zu resident_kv_bytes=%zu peak_resident_kv_bytes=%zu "
               "pool_reserved_bytes=%zu window_pages_freed=%lld\n",
               r.prompt_tokens, r.tokens.size(), finish_reason_name(r.finish), pre, dec,
               kernels::kv_type_name(engine.kv().pool().config().kv_type), static_cast<long long>(r.kv_pages_in_use),
               engine.kv().pool().page_bytes(), r.resident_kv_bytes, r.peak_resident_kv_bytes,
               r.pool_reserved_bytes, static_cast<long long>(r.window_pages_freed));
  if (kv.enabled()) {
    const auto& c = r.compression;
    const int64_t streams = static_cast<int64_t>(engine.model().config().n_layer) * engine.model().config().n_head_kv;
    const double total_decode = r.decode_seconds + r.prefill_seconds;
    std::fprintf(stderr,
                 "[kvpack] kv: policy=%s budget=%d interval=%d split=%s%s compactions=%lld evicted_tokens=%lld "
                 "evicted_slots=%lld freed_pages=%lld reclaim_efficiency=%.3f compaction_ms=%.2f compaction_share=%.2f%% "
                 "peak_resident_kv_bytes=%zu final_resident_kv_bytes=%zu\n",
                 compress::policy_name(kv.policy), kv.budget, kv.interval, compress::split_name(kv.split), kv.naive ? " naive" : "",
                 static_cast<long long>(c.events), static_cast<long long>(c.evicted_slots / std::max<int64_t>(1, streams)),
                 static_cast<long long>(c.evicted_slots), static_cast<long long>(c.freed_pages), c.reclaim_efficiency(),
                 c.seconds * 1e3, total_decode > 0 ? 100.0 * c.seconds / total_decode : 0.0, r.peak_resident_kv_bytes,
                 r.resident_kv_bytes);
    if (engine.kv().has_cold_tier()) {
      const auto& e = r.evicted;
      std::fprintf(stderr,
                   "[kvpack] kv_cold: evicted_pages_written=%lld evicted_slots_written=%lld evicted_bytes_written=%llu "
                   "evicted_pages_refused=%lld digest_bytes=%llu\n",
                   static_cast<long long>(e.pages_written), static_cast<long long>(e.slots_written),
                   static_cast<unsigned long long>(e.bytes_written), static_cast<long long>(e.pages_refused),
                   static_cast<unsigned long long>(e.digest_bytes));
    }
    const compress::RecallStats& rs = c.recall;
    if (rs.checks > 0 || rs.exact_checks > 0 || rs.exact_skipped > 0) {
      // Recall, the drift estimate and the exact check / guards: whether this answer may differ from full KV's.
      std::fprintf(stderr,
                   "[kvpack] kv_drift: checks=%lld drift_max=%.4f pages_recalled=%lld cold_bytes_read=%llu exact_checks=%lld "
                   "exact_skipped=%lld exact_tv_max=%.4f exact_flips=%lld guard_escalations=%lld guard_fallbacks=%lld "
                   "guard_fallbacks_incomplete=%lld guard_fallbacks_refused=%lld\n",
                   static_cast<long long>(rs.checks), rs.drift_max, static_cast<long long>(rs.pages_recalled),
                   static_cast<unsigned long long>(rs.bytes_read), static_cast<long long>(rs.exact_checks),
                   static_cast<long long>(rs.exact_skipped), rs.exact_tv_max, static_cast<long long>(rs.exact_flips),
                   static_cast<long long>(rs.guard_escalations), static_cast<long long>(rs.guard_fallbacks),
                   static_cast<long long>(rs.guard_fallbacks_incomplete), static_cast<long long>(rs.guard_fallbacks_refused));
    }
  }
}

}  // namespace kvpack::cli
