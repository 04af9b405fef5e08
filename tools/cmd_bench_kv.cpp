// `kvpack bench kv`: what compression does to KV memory and decode speed, measured side by side.
//
//  1. Timeline: the same seeded token stream is fed through the real model three times — full KV,
//     naive eviction (the pages a non-compacting allocator would hold, see compress/naive_layout.h) and compaction — in chunks of --chunk tokens (<= the
//     compression interval, so compression runs on the same schedule as during decode). Resident KV
//     bytes after every chunk go to kv_timeline.csv (and kv_timeline.png via scripts/plot_kv_timeline.py).
//     Reports reclaim efficiency (freed bytes / evicted bytes) and compaction time as a share of the run.
//  2. Decode speed at depth: a sequence is filled to each depth with synthetic K/V (decode cost does not
//     depend on K/V values, and this avoids minutes of prefill per depth), then --decode-tokens tokens are
//     decoded with full KV and with the compressed cache (budget slots, compressor active), in one run.
//  3. With --recall (needs --kv-cold): the cost of recall and the drift estimate at each depth above the
//     budget. The filled sequence is compressed down to the budget once, its evicted slots going to the
//     cold tier with their digests, then --decode-tokens tokens are decoded three ways, back to back:
//     compressed without a cold tier, with evictions going to the tier, and with recall checks
//     (--recall-every, --recall-pages) and the drift estimate, in up to 8 interleaved rounds. Reports
//     tok/s, the ratio, and the share of decode time spent in scoring + compaction + recall + drift.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>

#include "cli_plot.h"
#include "commands.h"
#include "compress/compressor.h"
#include "kv/evicted_kv.h"
#include "engine/calibrate.h"
#include "engine/exact_check.h"
#include "options.h"
#include "util/half.h"
#include "util/progress.h"

namespace kvpack::cli {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct BenchKvOptions {
  int32_t tokens = 8192, chunk = 64, budget = 2048, interval = 128, decode_tokens = 32;
  std::string policy = "triattention", calib, out = "bench-kv";
  std::vector<int32_t> depths = {2048, 8192, 16384};
  uint64_t seed = 1;
  bool recall = false;
  int32_t recall_every = 16, recall_pages = 4;
  int32_t fill_step = 0;    // tokens per append when filling to depth (0: all at once)
  int32_t exact_every = 0;  // with --recall: a fourth variant with the exact drift check every N steps (0: none)
};

struct Timeline {
  std::vector<int64_t> bytes;  // resident KV after each chunk
  compress::CompressionStats stats;
  double seconds = 0;
};

Timeline run_timeline(Engine& engine, const std::vector<int32_t>& stream, int32_t chunk, const compress::CompressConfig* kv,
                      const std::string& label) {
  Progress progress("bench kv: timeline " + label, static_cast<int64_t>(stream.size()), "tokens");
  Timeline tl;
  auto seq = engine.kv().new_sequence();
  std::unique_ptr<compress::SequenceCompressor> comp;
  if (kv) comp = std::make_unique<compress::SequenceCompressor>(*kv, engine.model().config(), engine.calibration(), 1, &engine.runner().threads());
  const double t0 = now_s();
  for (size_t i = 0; i < stream.size(); i += static_cast<size_t>(chunk)) {
    const size_t n = std::min(stream.size() - i, static_cast<size_t>(chunk));
    BatchItem item;
    item.kv = seq.get();
    item.tokens = std::span<const int32_t>(stream.data() + i, n);
    if (comp) comp->prepare(*seq, item);
    if (!engine.runner().forward().run(std::span<BatchItem>(&item, 1), comp.get())) throw std::runtime_error("KV pool exhausted");
    if (comp) comp->after_forward(*seq, false);
    // Naive mode: the pages a non-compacting allocator would hold (the cache itself is compacted).
    tl.bytes.push_back((comp ? comp->accounted_pages(*seq) : seq->pages_held()) * static_cast<int64_t>(engine.kv().pool().page_bytes()));
    progress.set(static_cast<int64_t>(i + n));
  }
  progress.finish();
  tl.seconds = now_s() - t0;
  if (comp) tl.stats = comp->stats();
  return tl;
}

// Fills every stream of `seq` with `n` synthetic slots (random K/V of a plausible scale), appended `step`
// slots at a time (0: all at once, as one long prefill; 1: token by token, as decode grows a context, which
// is where the pool's page runs matter).
void fill_synthetic(kv::SequenceKv& seq, int32_t n, std::mt19937& rng, int32_t step = 0) {
  if (step <= 0) step = std::max(n, 1);
  for (int32_t done = 0; done < n; done += step)
    if (!seq.append(std::min(step, n - done), done))
      throw std::runtime_error("KV pool exhausted while filling to depth " + std::to_string(n));
  const auto& cfg = seq.pool().config();
  // Cheap uniform values in [-1.7, 1.7) (unit variance): millions of rows, so no std distributions.
  uint64_t x = rng() | 1;
  std::vector<float> row(static_cast<size_t>(cfg.head_dim));
  for (int32_t s = 0; s < seq.n_streams(); ++s)
    for (int32_t j = 0; j < n; ++j)
      for (int kind = 0; kind < 2; ++kind) {
        for (float& v : row) {
          x ^= x << 13, x ^= x >> 7, x ^= x << 17;
          v = (static_cast<float>(x >> 40) / 16777216.0f - 0.5f) * 3.4641f;
        }
        uint8_t* dst = kind == 0 ? seq.k_slot(s, j) : seq.v_slot(s, j);
        kernels::kv_encode_row(row.data(), cfg.kv_type, cfg.head_dim, dst);
      }
}

double decode_tok_s(Engine& engine, kv::SequenceKv& seq, int32_t n_tokens, compress::SequenceCompressor* comp, std::mt19937& rng) {
  const int32_t V = engine.model().config().n_vocab;
  std::vector<float> logits(static_cast<size_t>(V));
  int32_t tok = static_cast<int32_t>(rng() % static_cast<uint32_t>(V));
  const double t0 = now_s();
  for (int32_t i = 0; i < n_tokens; ++i) tok = engine.runner().decode_greedy(seq, tok, logits.data(), comp);
  return n_tokens / (now_s() - t0);
}

// Share of a sequence's pages (after each stream's first) that break address order, i.e. that decode
// attention prefetches in software instead of leaving to the hardware (kernels::kv_page_needs_prefetch).
double scattered_page_share(const kv::SequenceKv& seq) {
  int64_t broken = 0, total = 0;
  for (int32_t s = 0; s < seq.n_streams(); ++s) {
    const kernels::KvStreamView v = seq.view(s);
    const size_t span = kernels::kv_page_span(v);
    const int32_t n_pages = (v.n_slots + v.page_size - 1) / v.page_size;
    for (int32_t i = 1; i < n_pages; ++i, ++total) broken += kernels::kv_page_needs_prefetch(v.pages, i, span) ? 1 : 0;
  }
  return total > 0 ? static_cast<double>(broken) / static_cast<double>(total) : 0.0;
}

// Decode from `depth` synthetic slots compressed to the budget once (not timed): greedy, each token
// sampled after SequenceCompressor::before_sample as the scheduler does (a recall that brings keys back
// has the newest tokens computed again, as decode steps). `cold`: evicted slots go to the engine's cold
// tier (and recall can use them when kv.recall is on). Several of these decode in interleaved rounds
// (run_rounds), so that a VM's slow minutes fall on every variant alike.
class ColdDecode {
 public:
  ColdDecode(Engine& engine, int32_t depth, const compress::CompressConfig& kv, bool cold, uint32_t seed)
      : engine_(engine), rng_(seed), seq_(engine.kv().new_sequence()),
        cs_(kv, engine.model().config(), engine.calibration(), 1, &engine.runner().threads()),
        logits_(static_cast<size_t>(engine.model().config().n_vocab)) {
    fill_synthetic(*seq_, depth, rng_);
    if (cold) {
      evicted_ = std::make_unique<kv::EvictedKv>(*engine.kv().cold_tier(), engine.kv().pool(),
                                                 0xbe4c0000ull + (seed & 0xffff) * 4 + (kv.recall.enabled ? 1 : 0) + (kv.recall.exact ? 2 : 0),
                                                 seq_->n_streams());  // distinct per variant: one recalling a page erases its record
      cs_.set_evicted_sink(evicted_.get());
    }
    cs_.compress(*seq_);
    const auto V = static_cast<uint32_t>(logits_.size());
    // Token ids for the synthetic positions too: the check after the first token (the end of
    // "prefill") may have the newest prefill_rows positions computed again.
    history_.resize(static_cast<size_t>(depth));
    for (auto& t : history_) t = static_cast<int32_t>(rng_() % V);
    tok_ = static_cast<int32_t>(rng_() % V);
    // The first token (its check is the end-of-prefill one) is not timed: a per-request cost.
    const compress::CompressionStats at0 = cs_.stats();
    const double t0 = now_s();
    step();
    first_s = now_s() - t0;
    first_recall_s = cs_.stats().recall.seconds - at0.recall.seconds;
    before = cs_.stats();
    recomputed_before = recomputed;
    timed_ = true;
  }
  void decode(int32_t n) {
    const double t0 = now_s();
    for (int32_t i = 0; i < n; ++i) step();
    seconds += now_s() - t0;
    tokens += n;
  }
  const compress::CompressionStats& stats() const { return cs_.stats(); }
  const kv::EvictedStats* evicted() const { return evicted_ ? &evicted_->stats() : nullptr; }
  double tok_s() const { return tokens / seconds; }
  // Compression events (scoring + compaction) + recall checks during the timed decode.
  double overhead_s() const {
    return (stats().seconds - before.seconds) + (stats().recall.seconds - before.recall.seconds) + exact_seconds;
  }

  double seconds = 0, first_s = 0, first_recall_s = 0;
  double exact_seconds = 0;  // exact drift checks in the timed decode
  double exact_read_seconds = 0;  // of which reading the cold pages from the tier
  int64_t exact_checks = 0;
  int64_t tokens = 0;
  int64_t recomputed = 0, recomputed_before = 0;  // tokens decoded again after a check recalled; before the timed decode
  compress::CompressionStats before;  // at the start of the timed decode

 private:
  void step() {
    history_.push_back(tok_);
    engine_.runner().decode_greedy(*seq_, tok_, logits_.data(), &cs_);
    if (const int32_t again = cs_.before_sample(*seq_); again > 0) {
      if (static_cast<size_t>(again) > history_.size()) throw std::logic_error("bench kv: recompute beyond the stream");
      seq_->truncate_tail(again);
      recomputed += again;
      for (size_t j = history_.size() - static_cast<size_t>(again); j < history_.size(); ++j)
        engine_.runner().decode_greedy(*seq_, history_[j], logits_.data(), &cs_);
      cs_.before_sample(*seq_);  // the call after a recompute runs no check
    }
    if (cs_.take_exact_check_due()) {  // as the scheduler does (engine/exact_check.h), timed on its own
      const double t0 = now_s();
      full_.resize(logits_.size());
      if (exact_.over_all_kv(engine_, *seq_, tok_, cs_, full_.data()))
        cs_.record_exact_check(*seq_, logits_.data(), full_.data(), static_cast<int32_t>(logits_.size()));
      else
        cs_.record_exact_skip();
      if (timed_) {
        exact_seconds += now_s() - t0;
        exact_read_seconds += exact_.last_read_seconds();
        ++exact_checks;
      }
    }
    tok_ = static_cast<int32_t>(std::max_element(logits_.begin(), logits_.end()) - logits_.begin());
  }

  Engine& engine_;
  std::mt19937 rng_;
  std::unique_ptr<kv::SequenceKv> seq_;
  std::unique_ptr<kv::EvictedKv> evicted_;  // declared after seq_: destroyed before it
  compress::SequenceCompressor cs_;
  std::vector<float> logits_;
  std::vector<int32_t> history_;
  int32_t tok_ = 0;
  ExactCheck exact_;
  std::vector<float> full_;  // the exact check's logits
  bool timed_ = false;       // past the first (untimed) token
};

}  // namespace

void add_bench_kv(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("kv", "KV memory timeline (full / naive eviction / compaction) and decode speed at depth");
  auto o = std::make_shared<ModelOptions>();
  auto b = std::make_shared<BenchKvOptions>();
  o->kv_type = "f16";
  add_model_options(*cmd, *o);
  cmd->add_option("--tokens", b->tokens, "Tokens in the timeline runs");
  cmd->add_option("--chunk", b->chunk, "Tokens per forward in the timeline runs (<= interval)");
  cmd->add_option("--budget", b->budget, "KV budget (slots per stream)");
  cmd->add_option("--interval", b->interval, "Compression interval");
  cmd->add_option("--policy", b->policy, "Compression policy for the compaction run");
  cmd->add_option("--kv-calib", b->calib, "TriAttention calibration (default: computed on the bench's own first tokens)");
  cmd->add_option("--depths", b->depths, "Depths for the decode-speed comparison")->delimiter(',');
  cmd->add_option("--fill-step", b->fill_step,
                  "Tokens per append when filling a sequence to depth (0: all at once, as one prefill; 1: token by token, "
                  "as decode grows a context: pages then come from the pool's runs)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--decode-tokens", b->decode_tokens, "Tokens decoded per speed measurement");
  cmd->add_option("--out", b->out, "Output directory (CSV, plot)");
  cmd->add_option("--seed", b->seed, "Seed of the token stream");
  cmd->add_flag("--recall", b->recall,
                "Also measure recall + drift estimate at each depth above the budget (needs --kv-cold): decode speed "
                "without and with it, and its share of decode time");
  cmd->add_option("--recall-every", b->recall_every, "With --recall: decode steps between recall checks")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--recall-pages", b->recall_pages, "With --recall: cold pages read per (layer, KV head) per check")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--exact-every", b->exact_every,
                  "With --recall: also a variant with the exact drift check (one step over every KV, hot and cold) every N "
                  "decode steps, and its share of decode time (0: none)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->callback([o, b] {
    if (b->chunk > b->interval) throw std::invalid_argument("--chunk must be <= --interval");
    if (b->recall && o->kv_cold.empty()) throw std::invalid_argument("--recall needs a cold tier (--kv-cold host:BYTES or dir:PATH:BYTES)");
    auto model = load_model(*o);
    const ModelConfig& c = model->config();
    const int32_t ps = o->page_size;
    const int64_t streams = static_cast<int64_t>(c.n_layer) * c.n_head_kv;
    int32_t max_depth = b->tokens;
    for (int32_t d : b->depths) max_depth = std::max(max_depth, d);
    EngineOptions eo = engine_options(*o);
    eo.kv_pages = streams * ((max_depth + 256 + ps - 1) / ps + 2);
    if (b->recall) eo.kv_pages += 4 * streams * ((b->budget + b->interval + 64 + ps - 1) / ps + 2);  // the --recall variants, side by side
    eo.max_batch_tokens = std::max(eo.max_batch_tokens, b->chunk);
    Engine engine(*model, eo);
    std::filesystem::create_directories(b->out);
    std::mt19937 rng(static_cast<uint32_t>(b->seed));
    std::vector<int32_t> stream(static_cast<size_t>(b->tokens));
    for (auto& t : stream) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(c.n_vocab));
    if (model->tokenizer().bos() >= 0) stream[0] = model->tokenizer().bos();

    compress::CompressConfig kv;
    kv.policy = compress::parse_policy(b->policy);
    kv.budget = b->budget;
    kv.interval = b->interval;
    if (compress::policy_needs_calibration(kv.policy)) {
      if (!b->calib.empty()) {
        engine.set_calibration(compress::QueryStats::load(b->calib, c));
      } else {
        const size_t n = std::min<size_t>(stream.size(), 1024);
        Progress cp("bench kv: calibrating " + b->policy, static_cast<int64_t>(n), "tokens");
        engine.set_calibration(calibrate(*model, std::span<const int32_t>(stream.data(), n), eo, [&](int64_t d) { cp.set(d); }));
        cp.finish();
        std::fprintf(stderr, "[kvpack] calibrated %s on the first %zu tokens of the bench stream\n", b->policy.c_str(), n);
      }
    }
    kv.validate(c, engine.calibration());
    std::printf("# kvpack bench kv: model %s (%s%s), %d tokens, chunk %d, budget %d, interval %d, policy %s, KV %s, %d threads\n",
                c.name.c_str(), c.arch.c_str(), c.random_weights ? ", random weights" : "", b->tokens, b->chunk, b->budget,
                b->interval, b->policy.c_str(), o->kv_type.c_str(), o->threads);
    const Timeline full = run_timeline(engine, stream, b->chunk, nullptr, "full KV (1/3)");
    compress::CompressConfig naive = kv;
    naive.naive = true;
    const Timeline hole = run_timeline(engine, stream, b->chunk, &naive, "naive eviction (2/3)");
    const Timeline comp = run_timeline(engine, stream, b->chunk, &kv, "compaction (3/3)");
    {
      std::ofstream csv(b->out + "/kv_timeline.csv");
      csv << "tokens,full_bytes,naive_bytes,compaction_bytes\n";
      for (size_t i = 0; i < full.bytes.size(); ++i)
        csv << std::min<size_t>((i + 1) * static_cast<size_t>(b->chunk), stream.size()) << "," << full.bytes[i] << "," << hole.bytes[i]
            << "," << comp.bytes[i] << "\n";
    }
    auto peak = [](const Timeline& t) { return *std::max_element(t.bytes.begin(), t.bytes.end()); };
    std::printf("timeline full:       peak %lld bytes, final %lld bytes, %.1f s\n", static_cast<long long>(peak(full)),
                static_cast<long long>(full.bytes.back()), full.seconds);
    std::printf("timeline naive:      peak %lld bytes, final %lld bytes, evicted %llu bytes, freed %llu bytes, reclaim efficiency %.3f\n",
                static_cast<long long>(peak(hole)), static_cast<long long>(hole.bytes.back()),
                static_cast<unsigned long long>(hole.stats.evicted_bytes), static_cast<unsigned long long>(hole.stats.freed_bytes),
                hole.stats.reclaim_efficiency());
    std::printf("timeline compaction: peak %lld bytes, final %lld bytes, evicted %llu bytes, freed %llu bytes, reclaim efficiency %.3f\n",
                static_cast<long long>(peak(comp)), static_cast<long long>(comp.bytes.back()),
                static_cast<unsigned long long>(comp.stats.evicted_bytes), static_cast<unsigned long long>(comp.stats.freed_bytes),
                comp.stats.reclaim_efficiency());
    std::printf("compaction: %lld events, %.1f ms per event (scoring %.1f ms), %.2f%% of the compaction run's time\n",
                static_cast<long long>(comp.stats.events), comp.stats.events ? 1e3 * comp.stats.seconds / comp.stats.events : 0.0,
                comp.stats.events ? 1e3 * comp.stats.score_seconds / comp.stats.events : 0.0,
                100.0 * comp.stats.seconds / comp.seconds);
    std::printf("memory ratio full/compaction at the end: %.2fx\n", static_cast<double>(full.bytes.back()) / comp.bytes.back());

    // Decode speed at depth, full vs compressed, measured back to back.
    double step_time_at_budget = 0;
    Progress depth_progress("bench kv: decode speed at depth", static_cast<int64_t>(b->depths.size()), "depths");
    for (int32_t depth : b->depths) {
      depth_progress.note("(depth " + std::to_string(depth) + ")");
      std::mt19937 r2(static_cast<uint32_t>(b->seed + depth));
      auto f = engine.kv().new_sequence();
      fill_synthetic(*f, depth, r2, b->fill_step);
      const double scattered = scattered_page_share(*f);
      const double full_tps = decode_tok_s(engine, *f, b->decode_tokens, nullptr, r2);
      f.reset();
      auto s = engine.kv().new_sequence();
      fill_synthetic(*s, std::min(depth, b->budget), r2, b->fill_step);
      compress::SequenceCompressor cs(kv, c, engine.calibration(), 1, &engine.runner().threads());
      const double comp_tps = decode_tok_s(engine, *s, b->decode_tokens, &cs, r2);
      if (depth == std::min(depth, b->budget)) step_time_at_budget = 1.0 / comp_tps;
      std::printf("decode depth=%d full=%.2f tok/s compressed(budget=%d)=%.2f tok/s ratio=%.2f (filled %s: %.1f %% of the pages "
                  "break address order)\n",
                  depth, full_tps, b->budget, comp_tps, comp_tps / full_tps,
                  b->fill_step > 0 ? (std::to_string(b->fill_step) + " tokens at a time").c_str() : "at once", 100.0 * scattered);
      std::fflush(stdout);
      if (b->recall && depth > b->budget) {
        s.reset();  // the pool holds one sequence at depth
        compress::CompressConfig with = kv;
        with.recall.enabled = true;
        with.recall.bring_back = true;
        with.recall.every = b->recall_every;
        with.recall.max_pages = b->recall_pages;
        const uint32_t sd = static_cast<uint32_t>(b->seed + depth + 1);
        // Set up one after the other (one sequence at depth at a time), then decode in rounds.
        ColdDecode plain(engine, depth, kv, false, sd);
        ColdDecode down(engine, depth, kv, true, sd);
        ColdDecode rec(engine, depth, with, true, sd);
        std::unique_ptr<ColdDecode> exact;
        if (b->exact_every > 0) {
          compress::CompressConfig ex = with;
          ex.recall.exact = true;
          ex.recall.exact_every = b->exact_every;
          exact = std::make_unique<ColdDecode>(engine, depth, ex, true, sd);
        }
        const int32_t rounds = std::max(1, std::min(8, b->decode_tokens / 32));
        for (int32_t r = 0; r < rounds; ++r) {
          const int32_t n = b->decode_tokens / rounds + (r < b->decode_tokens % rounds ? 1 : 0);
          for (ColdDecode* d : {&plain, &down, &rec, exact.get()})
            if (d != nullptr) d->decode(n);
        }
        compress::RecallStats rs = rec.stats().recall;  // the timed decode's checks only
        rs.checks -= rec.before.recall.checks;
        rs.pages_bounded -= rec.before.recall.pages_bounded;
        rs.pages_read -= rec.before.recall.pages_read;
        rs.pages_recalled -= rec.before.recall.pages_recalled;
        rs.bytes_read -= rec.before.recall.bytes_read;
        std::printf("recall depth=%d budget=%d: compressed %.2f tok/s, evictions to cold %.2f tok/s, +recall(every %d, %d pages)+drift %.2f tok/s, "
                    "ratio recall/compressed %.3f; overhead (scoring+compaction+recall+drift) %.2f%% of decode time without recall, "
                    "%.2f%% with; %lld checks, %lld cold pages bounded, %lld read, %lld recalled, %.1f MiB read, drift last %.3f; "
                    "%lld cold pages written at the first event; first token (end-of-prefill check, untimed) %.1f ms, its check %.1f ms; "
                    "in the timed decode: %lld compression events %.1f ms, recall checks %.1f ms\n",
                    depth, b->budget, plain.tok_s(), down.tok_s(), b->recall_every, b->recall_pages, rec.tok_s(), rec.tok_s() / plain.tok_s(),
                    100.0 * plain.overhead_s() / plain.seconds, 100.0 * rec.overhead_s() / rec.seconds, static_cast<long long>(rs.checks),
                    static_cast<long long>(rs.pages_bounded), static_cast<long long>(rs.pages_read), static_cast<long long>(rs.pages_recalled),
                    static_cast<double>(rs.bytes_read) / (1 << 20), rs.drift_last, static_cast<long long>(down.evicted()->pages_written),
                    1e3 * rec.first_s, 1e3 * rec.first_recall_s, static_cast<long long>(rec.stats().events - rec.before.events),
                    1e3 * (rec.stats().seconds - rec.before.seconds), 1e3 * (rec.stats().recall.seconds - rec.before.recall.seconds));
        const compress::CompressionStats& a = rec.stats();
        const compress::CompressionStats& z = rec.before;
        std::printf("recall depth=%d where the time went (timed decode): events %.1f ms = scoring %.1f + cold tier %.1f + selection "
                    "and compaction %.1f; checks %.1f ms = bounds %.1f + reads %.1f + exact %.1f + exchanges %.1f; "
                    "%lld recomputed tokens\n",
                    depth, 1e3 * (a.seconds - z.seconds), 1e3 * (a.score_seconds - z.score_seconds), 1e3 * (a.cold_seconds - z.cold_seconds),
                    1e3 * ((a.seconds - a.score_seconds - a.cold_seconds) - (z.seconds - z.score_seconds - z.cold_seconds)),
                    1e3 * (a.recall.seconds - z.recall.seconds), 1e3 * (a.recall.score_seconds - z.recall.score_seconds),
                    1e3 * (a.recall.read_seconds - z.recall.read_seconds), 1e3 * (a.recall.measure_seconds - z.recall.measure_seconds),
                    1e3 * (a.recall.settle_seconds - z.recall.settle_seconds), static_cast<long long>(rec.recomputed - rec.recomputed_before));
        if (exact) {
          const compress::RecallStats& xs = exact->stats().recall;
          std::printf("exact depth=%d: +recall+drift+exact check(every %d) %.2f tok/s, ratio exact/compressed %.3f; overhead "
                      "(scoring+compaction+recall+drift+exact) %.2f%% of decode time; %lld exact checks in the timed decode, "
                      "%.1f ms each (%.1f ms of it reading the cold pages), the checks alone %.2f%% of decode time; %lld skipped in all; "
                      "largest TV %.3f\n",
                      depth, b->exact_every, exact->tok_s(), exact->tok_s() / plain.tok_s(), 100.0 * exact->overhead_s() / exact->seconds,
                      static_cast<long long>(exact->exact_checks),
                      exact->exact_checks ? 1e3 * exact->exact_seconds / static_cast<double>(exact->exact_checks) : 0.0,
                      exact->exact_checks ? 1e3 * exact->exact_read_seconds / static_cast<double>(exact->exact_checks) : 0.0,
                      100.0 * exact->exact_seconds / exact->seconds, static_cast<long long>(xs.exact_skipped), xs.exact_tv_max);
        }
        std::fflush(stdout);
      }
      depth_progress.advance();
    }
    depth_progress.finish();
    if (comp.stats.events > 0 && step_time_at_budget > 0) {
      const double per_event = comp.stats.seconds / comp.stats.events;
      std::printf("compaction share of decode time (one event per %d decoded tokens at ~budget depth): %.2f%%\n", b->interval,
                  100.0 * per_event / (per_event + b->interval * step_time_at_budget));
    }
    // Next to the CSV whatever the working directory, or a line saying why not.
    std::printf("%s\n", run_plot("plot_kv_timeline.py", b->out + "/kv_timeline.csv", b->out + "/kv_timeline.png").c_str());
  });
}

void add_bench_peer(CLI::App& bench);  // tools/cmd_bench_peer.cpp

void add_bench_serve(CLI::App& bench);  // tools/cmd_bench_serve.cpp
void add_bench_cold(CLI::App& bench);  // tools/cmd_bench_cold.cpp

void add_bench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks (ratios measured side by side in one run)");
  bench->require_subcommand(1);
  add_bench_kv(*bench);
  add_bench_serve(*bench);
  add_bench_peer(*bench);
  add_bench_cold(*bench);
}

}  // namespace kvpack::cli
