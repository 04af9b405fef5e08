// `kvpack bench peer`: kvpack against llama.cpp on the same GGUF, same threads, same prompt tokens,
// measured phase by phase back to back in one run, each result also as a fraction of the
// memory-bandwidth roofline (bandwidth measured in the same run).
//
// llama.cpp runs through the npm package node-llama-cpp, driven by scripts/peer/llama_bench.mjs in
// --serve mode (JSON lines over a pipe), so both engines stay loaded and each phase alternates:
//   prefill n=P: both engines evaluate P fresh random tokens from an empty cache (logits of the last
//     token only); warm-up runs excluded, median of --reps.
//   decode depth=D: kvpack fills a fresh sequence to D slots with synthetic K/V (decode cost does not
//     depend on K/V values; --kvpack-real-fill prefills instead), llama.cpp really prefills its KV to D
//     tokens (ascending depths extend one sequence, so the fill costs one prefill of the deepest
//     depth); then both time --decode-tokens single-token steps (after 2 warm-up steps; each step is a
//     forward pass plus greedy token choice) and report 1 / median step time.
// Roofline: tok/s = bandwidth / bytes read per token, bytes = weights (each tensor once; the tied
// embedding is the output head) + KV at that depth (f16 K and V of every layer); for prefill the
// weights are read once per forward of --batch tokens, so prefill is compute bound and its fraction
// is small (GFLOP/s are printed too). Bandwidth: a --threads-thread streaming read of a 1 GiB buffer,
// measured before the runs and after; in each decode phase before it and after every round of either engine,
// so each engine's roofline uses the readings right before and after each of its own rounds (TimedRound; on
// a shared machine the bandwidth available moves with other tenants' traffic within seconds: one reading
// right before a phase read 55 GB/s where the readings around it read 35, and a phase-wide median moved a
// fraction by 30 points). The compressed run reads it every --round-steps steps.
//
// This file: the command, its options, the kvpack side and the phase-by-phase runs; the llama.cpp
// driver is in cmd_bench_peer_llama.cpp, the bandwidth measurement and the report in
// cmd_bench_peer_report.cpp (bench_peer.h).
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_peer.h"
#include "commands.h"
#include "compress/compressor.h"
#include "engine/calibrate.h"
#include "options.h"
#include "util/progress.h"
#include "util/half.h"

namespace kvpack::cli {

using namespace bench_peer;  // this command's pieces in the other two files

void add_bench_peer(CLI::App& bench);

namespace {

// ---------------------------------------------------------------------------------------------
// kvpack measurements through the engine API.

std::vector<int32_t> random_tokens(int32_t n, int32_t n_vocab, std::mt19937& rng) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  const uint32_t lo = n_vocab > 1000 ? 300u : 0u;
  for (auto& x : t) x = static_cast<int32_t>(lo + rng() % (static_cast<uint32_t>(n_vocab) - lo));
  return t;
}

// Fills every stream of `seq` with `n` slots of random K/V (unit-variance uniform values).
void fill_kv_synthetic(kv::SequenceKv& seq, int32_t n, uint64_t seed) {
  if (n <= 0) return;
  if (!seq.append(n, 0)) throw std::runtime_error("KV pool exhausted while filling to depth " + std::to_string(n));
  const auto& cfg = seq.pool().config();
  const size_t hd = static_cast<size_t>(cfg.head_dim);
  std::vector<float> row(hd);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull | 1;
  for (int32_t s = 0; s < seq.n_streams(); ++s)
    for (int32_t j = 0; j < n; ++j)
      for (int kind = 0; kind < 2; ++kind) {
        for (float& v : row) {
          x ^= x << 13, x ^= x >> 7, x ^= x << 17;
          v = (static_cast<float>(x >> 40) * (1.0f / 16777216.0f) - 0.5f) * 3.4641f;
        }
        uint8_t* dst = kind == 0 ? seq.k_slot(s, j) : seq.v_slot(s, j);
        kernels::kv_encode_row(row.data(), cfg.kv_type, cfg.head_dim, dst);
      }
}

// Seconds of each of `warmup + n` single-token decode steps (forward + argmax), warm-up dropped. With a
// compressor, it runs on its schedule inside the steps (its events are part of the step times: a
// compressed sequence pays for its compaction).
std::vector<double> kvpack_decode_steps(Engine& engine, kv::SequenceKv& seq, int32_t warmup, int32_t n, std::mt19937& rng,
                                        compress::SequenceCompressor* comp = nullptr) {
  const int32_t V = engine.model().config().n_vocab;
  std::vector<float> logits(static_cast<size_t>(V));
  int32_t tok = random_tokens(1, V, rng)[0];
  std::vector<double> steps;
  for (int32_t i = 0; i < warmup + n; ++i) {
    const double t0 = now_s();
    tok = engine.runner().decode_greedy(seq, tok, logits.data(), comp);
    const double dt = now_s() - t0;
    if (i >= warmup) steps.push_back(dt);
  }
  return steps;
}

// Step times of both engines over `rounds` rounds of up to round_steps steps (decode_tokens in all), the
// engines alternating (order flipping each round), one warm-up step per engine per round (warmup_steps in
// the first), so load changes on a shared machine hit both alike. `kv(warm, n)` and `peer(warm, n)` run one
// engine's round and return its timed step times; peer is skipped without a llama.cpp peer.
//
// `read_bw()` reads the memory bandwidth after every engine round, so each round has a reading right before
// and right after it; their mean is that round's bandwidth. Other tenants' memory traffic moves the host
// between ~30 and ~55 GB/s within seconds, and a llama.cpp round at depth lasts several times a kvpack round:
// a phase-wide median (the earlier method) paired a kvpack round with readings taken seconds away from it.
struct TimedRound {
  std::vector<double> steps;
  double bw = 0;  // mean of the readings right before and right after the round
};
// Rounds in a row with a bandwidth reading between each two: close() takes a round's steps and the reading
// right after it, and pairs them with the one before.
class RoundPairing {
 public:
  explicit RoundPairing(double before) : prev_(before) {}
  TimedRound close(std::vector<double> steps, double after) {
    TimedRound r{std::move(steps), 0.5 * (prev_ + after)};
    prev_ = after;
    return r;
  }

 private:
  double prev_;
};
struct AlternatedSteps {
  std::vector<double> kvpack, llama;  // every timed step
  std::vector<TimedRound> kvpack_rounds, llama_rounds;
};
template <class KvRound, class PeerRound, class ReadBw>
AlternatedSteps alternate_rounds(const PeerOptions& b, int32_t rounds, bool has_peer, double bw_before, KvRound&& kv,
                                 PeerRound&& peer, ReadBw&& read_bw) {
  AlternatedSteps out;
  RoundPairing pairing(bw_before);
  auto record = [&](std::vector<double> v, std::vector<double>& all, std::vector<TimedRound>& rr) {
    all.insert(all.end(), v.begin(), v.end());
    rr.push_back(pairing.close(std::move(v), read_bw()));
  };
  for (int32_t r = 0; r < rounds; ++r) {
    const int32_t n = std::min(b.round_steps, b.decode_tokens - r * b.round_steps);
    const int32_t warm = r == 0 ? b.warmup_steps : 1;
    for (int k = 0; k < 2; ++k) {
      if ((r + k) % 2 == 0)
        record(kv(warm, n), out.kvpack, out.kvpack_rounds);
      else if (has_peer)
        record(peer(warm, n), out.llama, out.llama_rounds);
    }
  }
  return out;
}

// The bandwidth an engine's rounds ran at: each round's bandwidth weighted by its time at the roofline
// (steps x bytes / bw), i.e. total bytes over the total roofline time; 0 without rounds.
double rounds_bandwidth(const std::vector<TimedRound>& rr) {
  double steps = 0, roof_time = 0;  // bytes per step cancel
  for (const TimedRound& r : rr) {
    steps += static_cast<double>(r.steps.size());
    roof_time += static_cast<double>(r.steps.size()) / r.bw;
  }
  return roof_time > 0 ? steps / roof_time : 0.0;
}

// The bandwidth readings of one phase (before it, after each round); printed as their median and range,
// the rooflines use them round by round (rounds_bandwidth). Not thread-safe (the bench's one thread).
class PhaseBandwidth {
 public:
  PhaseBandwidth(BandwidthProbe& probe, double* best) : probe_(&probe), best_(best) {}
  double read(int tries) {
    v_.push_back(probe_->read(tries));
    *best_ = std::max(*best_, v_.back());
    return v_.back();
  }
  double latest() const { return v_.back(); }
  double median() const { return kvpack::cli::median(v_); }
  std::string describe() const {
    char s[160];
    std::snprintf(s, sizeof s, "median %.1f GB/s of %zu readings (%.1f-%.1f)", median() / 1e9, v_.size(),
                  *std::min_element(v_.begin(), v_.end()) / 1e9, *std::max_element(v_.begin(), v_.end()) / 1e9);
    return s;
  }

 private:
  BandwidthProbe* probe_;
  double* best_;
  std::vector<double> v_;
};

}  // namespace

void add_bench_peer(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("peer", "kvpack vs llama.cpp (node-llama-cpp) on the same GGUF: prefill and decode at depth, "
                                           "with the memory-bandwidth roofline measured in the same run");
  auto o = std::make_shared<ModelOptions>();
  auto b = std::make_shared<PeerOptions>();
  auto kvo = std::make_shared<KvOptions>();
  o->kv_type = "f16";  // llama.cpp's default KV type
  o->batch = 512;      // llama.cpp's default (u)batch, for both engines
  add_model_options(*cmd, *o);
  add_kv_options(*cmd, *kvo);  // --kv-policy P --kv-budget B: an extra kvpack row at every depth > B (compressed)
  cmd->add_flag("--quick", b->quick, "Depth 0 only, 128 prompt tokens, 16 decode tokens (a few minutes)");
  cmd->add_option("--depths", b->depths, "Decode depths (tokens already in the KV cache)")->delimiter(',');
  cmd->add_option("--batch-seqs", b->batch_seqs, "Batched decode rows: concurrent sequences per row (0: none; --quick: none)")
      ->delimiter(',');
  cmd->add_option("--batch-depth", b->batch_depth, "Tokens each batched sequence holds before its timed steps")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--prompt-tokens", b->prompt_tokens, "Prefill length (0: no prefill phase)")->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--decode-tokens", b->decode_tokens, "Timed decode steps per depth")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--reps", b->reps, "Timed prefill runs per engine (after one warm-up run)")->check(CLI::Range(1, 100));
  cmd->add_option("--round-steps", b->round_steps, "Decode steps per engine before switching to the other")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--llama-variant", b->variant, "llama.cpp binaries: auto (probe both, keep the faster), prebuilt, source, none")
      ->check(CLI::IsMember({"auto", "prebuilt", "source", "none"}));
  cmd->add_flag("--llama-build-source", b->build_source, "First build llama.cpp from node-llama-cpp's bundled source (-march=native)");
  cmd->add_option("--flash-attn", b->flash_attn, "llama.cpp flash attention")->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--llama-fill-cache", b->llama_fill_cache,
                  "Directory where llama.cpp's filled KV states are kept and reloaded on later runs (llama.cpp's own "
                  "sequence state files, ~112 KiB per token for the Qwen3-0.6B shape: 3.6 GB at 32K; a real 32K fill "
                  "takes most of an hour on 2 cores)");
  cmd->add_flag("--kvpack-real-fill", b->kvpack_real_fill, "Fill kvpack's KV by real prefill (default: synthetic K/V)");
  cmd->add_option("--peer-dir", b->peer_dir, "Directory of llama_bench.mjs and its node_modules (default: <repo>/scripts/peer)");
  cmd->add_option("--node", b->node, "Node.js executable");
  cmd->add_option("--bw-mib", b->bw_mib, "Buffer for the bandwidth measurement (MiB)")->check(CLI::Range(64, 1 << 16));
  cmd->add_option("--seed", b->seed, "Seed of the random tokens");
  cmd->callback([o, b, kvo, cmd] {
    if (b->quick) {
      if (cmd->count("--depths") == 0) b->depths = {0};
      if (cmd->count("--prompt-tokens") == 0) b->prompt_tokens = 128;
      if (cmd->count("--decode-tokens") == 0) b->decode_tokens = 16;
      if (cmd->count("--reps") == 0) b->reps = 2;
      if (cmd->count("--batch-seqs") == 0) b->batch_seqs.clear();
    }
    std::erase_if(b->batch_seqs, [](int32_t n) { return n <= 0; });
    std::sort(b->depths.begin(), b->depths.end());
    b->depths.erase(std::unique(b->depths.begin(), b->depths.end()), b->depths.end());
    if (o->model.empty()) throw std::invalid_argument("bench peer needs -m MODEL.gguf (the same file is given to llama.cpp)");
    const std::string model_path = fs::absolute(o->model).string();
    const int threads = o->threads;

    char date[64];
    const std::time_t tt = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y-%m-%d %H:%M %Z", std::localtime(&tt));
    std::printf("# kvpack bench peer, %s\n# machine: %s\n", date, machine_line().c_str());

    // llama.cpp first (it may need npm install / a probe), then kvpack.
    const int32_t max_depth = b->depths.empty() ? 0 : b->depths.back();
    const int32_t ctx = std::max(max_depth, b->prompt_tokens) + b->warmup_steps + b->decode_tokens +
                        (b->decode_tokens + b->round_steps - 1) / b->round_steps + 64;
    PeerChoice peer;
    if (b->variant != "none") {
      const fs::path dir = b->peer_dir.empty() ? default_peer_dir() : fs::path(b->peer_dir);
      if (!fs::exists(dir / "llama_bench.mjs")) throw std::runtime_error("no llama_bench.mjs in " + dir.string() + " (use --peer-dir)");
      ensure_node_modules(dir);
      peer = choose_peer(*b, dir, model_path, threads, o->batch, ctx);
      const json& r = peer.ready;
      std::printf("# llama.cpp: node-llama-cpp %s, %s binaries (%s), llama.cpp release %s, %d threads, batch %d, ctx %d, "
                  "flash attention %s, KV %s\n# llama.cpp system info: %s\n",
                  r.value("nodeLlamaCpp", std::string("?")).c_str(), peer.variant.c_str(), r.value("buildType", std::string("?")).c_str(),
                  r["llamaCpp"].value("release", std::string("?")).c_str(), r.value("threads", 0), r.value("batchSize", 0),
                  r.value("contextSize", 0), r.value("flashAttention", false) ? "on" : "off", r.value("kvType", std::string("?")).c_str(),
                  r.value("systemInfo", std::string("?")).c_str());
      if (r.value("threads", threads) != threads)
        std::printf("# WARNING: llama.cpp uses %d threads, kvpack %d\n", r.value("threads", 0), threads);
    }

    auto model = load_model(*o);
    const ModelConfig& c = model->config();
    EngineOptions eo = engine_options(*o);
    const int64_t streams = static_cast<int64_t>(c.n_layer) * c.n_head_kv;
    eo.kv_pages = streams * ((ctx + o->page_size - 1) / o->page_size + 2) * (kvo->resolved_policy() != compress::PolicyKind::Full ? 2 : 1);
    const int32_t batch_ctx = b->batch_depth + b->warmup_steps + b->decode_tokens + (b->decode_tokens + b->round_steps - 1) / b->round_steps + 8;
    for (int32_t n : b->batch_seqs)
      eo.kv_pages = std::max<int64_t>(eo.kv_pages, streams * n * ((batch_ctx + o->page_size - 1) / o->page_size + 1));
    if (!b->batch_seqs.empty()) eo.max_batch_tokens = std::max(eo.max_batch_tokens, *std::max_element(b->batch_seqs.begin(), b->batch_seqs.end()));
    Engine engine(*model, eo);
    // Optional compressed runs: kvpack with --kv-policy at each depth beyond the budget, against llama.cpp's
    // full KV at the same depth. Calibration (TriAttention) from --kv-calib, else from 1024 random tokens.
    compress::CompressConfig kvc;
    std::mt19937 rng0(static_cast<uint32_t>(b->seed + 7));
    const compress::PolicyKind peer_policy = kvo->resolved_policy();
    if (peer_policy != compress::PolicyKind::Full) {
      KvOptions k = *kvo;
      const bool own_calib = k.calib.empty() && compress::policy_needs_calibration(peer_policy);
      if (own_calib) {
        const auto toks = random_tokens(std::min<int32_t>(1024, c.n_ctx), c.n_vocab, rng0);
        engine.set_calibration(calibrate(*model, toks, eo));
        k.policy = "full";  // kv_config would look for a file; the statistics are already loaded
      }
      kvc = kv_config(k, engine);
      if (own_calib) kvc.policy = peer_policy;
    }
    const double W = static_cast<double>(model->weight_bytes());
    const double kv_per_token =
        2.0 * c.n_layer * c.n_head_kv * static_cast<double>(kernels::kv_row_bytes(kernels::parse_kv_type(o->kv_type), c.head_dim));
    std::printf("# model: %s (%s, %s%s), %d layers, embd %d, heads %d/%d, ff %d, vocab %d; weights %s; KV %s per token (%s)\n",
                model_path.c_str(), c.name.c_str(), c.arch.c_str(), c.random_weights ? ", random weights" : "", c.n_layer, c.n_embd,
                c.n_head, c.n_head_kv, c.n_ff, c.n_vocab, gib(W).c_str(), gib(kv_per_token).c_str(), o->kv_type.c_str());
    std::printf("# kvpack: %d threads, batch %d, KV %s, page %d; decode depth filled with %s\n", threads, o->batch, o->kv_type.c_str(),
                o->page_size, b->kvpack_real_fill ? "real prefill" : "synthetic K/V");
    std::printf("# timing: prefill = median of %d runs after 1 warm-up; decode = 1 / median of %d steps (rounds of %d, 1 warm-up step per "
                "round, %d in the first); engines alternate run by run / round by round\n",
                b->reps, b->decode_tokens, b->round_steps, b->warmup_steps);

    const size_t bw_bytes = static_cast<size_t>(b->bw_mib) << 20;
    BandwidthProbe probe(threads, bw_bytes);
    const double bw0 = probe.read(5);
    double bw_max = bw0;  // best of all measurements in this run (printed at the end)
    double bw_now = bw0;  // the bandwidth of the phase being reported (prefill: this first reading)
    std::printf("# bandwidth (%d-thread streaming read of %s, best of 5): %.1f GB/s; load average %s\n", threads,
                gib(static_cast<double>(bw_bytes)).c_str(), bw0 / 1e9, loadavg().c_str());
    std::fflush(stdout);

    // Matmul FLOPs per token (2 per weight element of the layer matrices; the output head separately).
    double layer_params = 0;
    for (const auto& l : model->weights().layers)
      for (const Weight* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
        layer_params += static_cast<double>(w->n_in) * static_cast<double>(w->n_out);
    const double head_params = static_cast<double>(c.n_embd) * c.n_vocab;
    const double attn_flops_per_pos = 4.0 * c.n_layer * c.n_head * c.head_dim;  // QK^T and PV per (query, key)

    std::vector<Row> rows;
    std::mt19937 rng(static_cast<uint32_t>(b->seed));

    // One step per phase (prefill, then each depth), with the phase named.
    Progress phases("bench peer",
                    (b->prompt_tokens > 0 ? 1 : 0) + static_cast<int64_t>(b->depths.size()) + static_cast<int64_t>(b->batch_seqs.size()),
                    "phases");
    if (b->prompt_tokens > 0) {
      const int32_t P = b->prompt_tokens;
      phases.note("(prefill " + std::to_string(P) + ")");
      std::fprintf(stderr, "[bench] prefill %d tokens: %d rounds (+1 warm-up), kvpack and llama.cpp alternating\n", P, b->reps);
      std::vector<double> ks, ls;
      std::vector<float> logits(static_cast<size_t>(c.n_vocab));
      for (int r = 0; r < 1 + b->reps; ++r)
        for (int k = 0; k < 2; ++k) {
          if ((r + k) % 2 == 0) {
            auto seq = engine.kv().new_sequence();
            const auto toks = random_tokens(P, c.n_vocab, rng);
            const double t0 = now_s();
            engine.runner().prefill(*seq, toks, logits.data());
            if (r > 0) ks.push_back(now_s() - t0);
          } else if (peer.peer) {
            const json j = peer.peer->request({{"cmd", "prefill"}, {"n", P}, {"reps", 1}, {"warmup", 0}, {"seed", b->seed + r}});
            if (r > 0) ls.push_back(j["seconds"][0].get<double>());
          }
        }
      const double kv_tps = P / median(ks);
      const double ll_tps = ls.empty() ? 0.0 : P / median(ls);
      // Bytes per prompt token: weights once per forward of `batch` tokens, KV written once.
      const double chunk = std::min(P, o->batch);
      const double roof = bw_now / (W / chunk + kv_per_token);
      const double flops = 2.0 * layer_params * P + 2.0 * head_params + attn_flops_per_pos * 0.5 * P * P;
      // The machine's int8 peaks, measured right after the runs (registers only, same threads).
      const Int8Peak peak = measure_int8_peak(threads);
      const double kv_gf = flops / (P / kv_tps) / 1e9;
      char extra[400];
      int len = std::snprintf(extra, sizeof extra, " compute: kvpack=%.1f llama.cpp=%s GFLOP/s", kv_gf,
                              ll_tps > 0 ? tps(flops / (P / ll_tps) / 1e9).c_str() : "-");
      if (peak.raw > 0)
        std::snprintf(extra + len, sizeof extra - static_cast<size_t>(len),
                      "; int8 peak of %d threads: vpdpbusd %.0f G ops/s (kvpack %.1f%%), per-block scaled sequence %.0f (kvpack %.1f%%)",
                      threads, peak.raw / 1e9, 100.0 * kv_gf * 1e9 / peak.raw, peak.scaled / 1e9, 100.0 * kv_gf * 1e9 / peak.scaled);
      rows.push_back({"prefill", P, kv_tps, ll_tps, W / chunk + kv_per_token, bw_now, extra});
      std::printf("prefill n=%d kvpack=%s llama.cpp=%s ratio=%s tok/s | roofline %.0f tok/s: kvpack=%s llama.cpp=%s |%s\n", P,
                  tps(kv_tps).c_str(), tps(ll_tps).c_str(), ratio(kv_tps, ll_tps).c_str(), roof, pct(kv_tps, roof).c_str(),
                  pct(ll_tps, roof).c_str(), extra);
      std::fflush(stdout);
      phases.advance();
    }

    std::unique_ptr<kv::SequenceKv> real_seq;  // --kvpack-real-fill: one growing sequence, like llama.cpp's
    for (int32_t depth : b->depths) {
      phases.note("(decode at depth " + std::to_string(depth) + ")");
      PhaseBandwidth pbw(probe, &bw_max);
      pbw.read(3);
      std::printf("# bandwidth before depth %d: %.1f GB/s; load average %s\n", depth, pbw.latest() / 1e9, loadavg().c_str());
      std::mt19937 r2(static_cast<uint32_t>(b->seed + static_cast<uint64_t>(depth)));
      std::unique_ptr<kv::SequenceKv> synth;
      kv::SequenceKv* seq = nullptr;
      double kv_fill_s = 0;
      int32_t kv_filled = 0;
      if (b->kvpack_real_fill) {
        if (!real_seq || real_seq->next_pos() > depth) real_seq = engine.kv().new_sequence();
        const int32_t need = depth - real_seq->next_pos();
        if (need > 0) {
          std::fprintf(stderr, "[kvpack] filling the KV cache to %d tokens (%d more, real prefill)\n", depth, need);
          const auto toks = random_tokens(need, c.n_vocab, r2);
          const double t0 = now_s();
          engine.runner().prefill(*real_seq, toks, nullptr);
          kv_fill_s = now_s() - t0;
          kv_filled = need;
        }
        seq = real_seq.get();
      } else {
        synth = engine.kv().new_sequence();
        fill_kv_synthetic(*synth, depth, b->seed + static_cast<uint64_t>(depth));
        seq = synth.get();
      }
      std::string extra;
      if (peer.peer) {
        const json f = peer.peer->request({{"cmd", "fill"}, {"depth", depth}, {"seed", b->seed}});
        const int fill = f.value("fillTokens", 0);
        if (f.value("cached", false)) extra += " llama.cpp KV state loaded from --llama-fill-cache";
        if (fill > 0) {
          char s[160];
          std::snprintf(s, sizeof s, " llama.cpp filled %d tokens in %.1f s (%.1f tok/s)", fill, f.value("fillSeconds", 0.0),
                        fill / f.value("fillSeconds", 1.0));
          extra += s;
        }
      }
      const int32_t rounds = (b->decode_tokens + b->round_steps - 1) / b->round_steps;
      std::fprintf(stderr, "[bench] decode at depth %d: %d rounds of up to %d steps, kvpack and llama.cpp alternating\n", depth, rounds,
                   b->round_steps);
      const AlternatedSteps st = alternate_rounds(
          *b, rounds, peer.peer != nullptr, pbw.latest(),
          [&](int32_t warm, int32_t n) { return kvpack_decode_steps(engine, *seq, warm, n, r2); },
          [&](int32_t warm, int32_t n) {
            return peer.peer->request({{"cmd", "steps"}, {"n", n}, {"warmup", warm}})["steps"].get<std::vector<double>>();
          },
          [&] { return pbw.read(2); });
      bw_now = rounds_bandwidth(st.kvpack_rounds);
      const double ll_bw = st.llama_rounds.empty() ? bw_now : rounds_bandwidth(st.llama_rounds);
      std::printf("# bandwidth during depth %d: %s\n", depth, pbw.describe().c_str());
      const std::vector<double>&ksteps = st.kvpack, &lsteps = st.llama;
      const double kv_tps = 1.0 / median(ksteps);
      const double ll_tps = lsteps.empty() ? 0.0 : 1.0 / median(lsteps);
      synth.reset();
      if (kv_filled > 0) {
        char s[128];
        std::snprintf(s, sizeof s, " kvpack filled %d tokens in %.1f s (%.1f tok/s)", kv_filled, kv_fill_s, kv_filled / kv_fill_s);
        extra += s;
      }
      // Mean KV read per step over the timed steps (depth grows by one per step).
      const double mean_depth = depth + b->warmup_steps + 0.5 * (b->decode_tokens + rounds);
      const double bytes = W + kv_per_token * mean_depth;
      const double roof = bw_now / bytes, ll_roof = ll_bw / bytes;
      rows.push_back({"decode", depth, kv_tps, ll_tps, bytes, bw_now, extra, ll_bw});
      std::printf("decode depth=%d kvpack=%s llama.cpp=%s ratio=%s tok/s | roofline %.1f tok/s (%s/token) at %.1f GB/s around kvpack's "
                  "rounds, %.1f around llama.cpp's: kvpack=%s llama.cpp=%s |%s\n",
                  depth, tps(kv_tps).c_str(), tps(ll_tps).c_str(), ratio(kv_tps, ll_tps).c_str(), roof, gib(bytes).c_str(), bw_now / 1e9,
                  ll_bw / 1e9, pct(kv_tps, roof).c_str(), pct(ll_tps, ll_roof).c_str(), extra.c_str());
      std::fflush(stdout);
      if (kvc.enabled() && depth > kvc.budget) {
        // kvpack compressed at this depth vs llama.cpp's full KV at the same depth (measured just above).
        // The sequence is filled to `depth` slots and compressed once (the state right after an event),
        // then decodes a whole interval (one more event inside the timed steps), mean step time.
        auto cs = engine.kv().new_sequence();
        fill_kv_synthetic(*cs, depth, b->seed + static_cast<uint64_t>(depth) + 1);
        compress::SequenceCompressor comp(kvc, c, engine.calibration(), 1, &engine.runner().threads());
        comp.compress(*cs);
        // In chunks of --round-steps with a bandwidth reading after each (TimedRound), no warm-up after the
        // first: every step counts, the compaction event's included.
        const int32_t n = std::max(b->decode_tokens, kvc.interval + 1);
        const int64_t events0 = comp.stats().events;
        std::vector<double> steps;
        std::vector<TimedRound> chunks;
        RoundPairing pairing(pbw.read(2));
        for (int32_t done = 0; done < n;) {
          const int32_t m = std::min(b->round_steps, n - done);
          std::vector<double> v = kvpack_decode_steps(engine, *cs, done == 0 ? b->warmup_steps : 0, m, r2, &comp);
          steps.insert(steps.end(), v.begin(), v.end());
          chunks.push_back(pairing.close(std::move(v), pbw.read(2)));
          done += m;
        }
        const int64_t events = comp.stats().events - events0;
        double step_s = 0;  // mean, not median: the compaction event is one step in `interval`
        for (double x : steps) step_s += x / n;
        const double c_tps = 1.0 / step_s;
        bw_now = rounds_bandwidth(chunks);
        std::printf("# bandwidth during depth %d with the compressed run: %s\n", depth, pbw.describe().c_str());
        const double c_bytes = W + kv_per_token * (kvc.budget + 0.5 * kvc.interval);
        const double c_roof = bw_now / c_bytes;
        const std::string label = std::string("decode-") + compress::policy_name(kvc.policy) + "-b" + std::to_string(kvc.budget);
        // Where the time goes: the median step (no event) and the slowest (the compaction event's step).
        const double med_s = median(steps), max_s = *std::max_element(steps.begin(), steps.end());
        char ex[320];
        std::snprintf(ex, sizeof ex,
                      " kvpack %s budget %d interval %d, mean of %d steps incl. %lld compaction event(s) (median step %.2f ms = %.2f tok/s, "
                      "slowest %.1f ms); llama.cpp full KV",
                      compress::policy_name(kvc.policy), kvc.budget, kvc.interval, n, static_cast<long long>(events), med_s * 1e3,
                      1.0 / med_s, max_s * 1e3);
        rows.push_back({label, depth, c_tps, ll_tps, c_bytes, bw_now, ex});
        std::printf("%s depth=%d kvpack=%s llama.cpp(full)=%s ratio=%s tok/s | roofline %.1f tok/s (%s/token): kvpack=%s |%s\n",
                    label.c_str(), depth, tps(c_tps).c_str(), tps(ll_tps).c_str(), ratio(c_tps, ll_tps).c_str(), c_roof,
                    gib(c_bytes).c_str(), pct(c_tps, c_roof).c_str(), ex);
        std::fflush(stdout);
      }
      phases.advance();
    }
    real_seq.reset();

    // Batched decode: N sequences at --batch-depth, one token each per round, all in one forward pass.
    for (int32_t N : b->batch_seqs) {
      const int32_t D = b->batch_depth;
      phases.note("(batched decode, " + std::to_string(N) + " sequences)");
      PhaseBandwidth pbw(probe, &bw_max);
      pbw.read(3);
      std::printf("# bandwidth before batch %d: %.1f GB/s; load average %s\n", N, pbw.latest() / 1e9, loadavg().c_str());
      std::mt19937 r3(static_cast<uint32_t>(b->seed + 1000003u * static_cast<uint64_t>(N)));
      std::vector<std::unique_ptr<kv::SequenceKv>> seqs;
      double kv_fill_s = 0;
      for (int32_t i = 0; i < N; ++i) {
        seqs.push_back(engine.kv().new_sequence());
        if (b->kvpack_real_fill) {
          const auto toks = random_tokens(D, c.n_vocab, r3);
          const double t0 = now_s();
          engine.runner().prefill(*seqs.back(), toks, nullptr);
          kv_fill_s += now_s() - t0;
        } else {
          fill_kv_synthetic(*seqs.back(), D, b->seed + 7919u * static_cast<uint64_t>(i + 1) + static_cast<uint64_t>(D));
        }
      }
      std::string extra;
      if (peer.peer) {
        std::fprintf(stderr, "[bench] batch %d: llama.cpp prefills %d sequences of %d tokens\n", N, N, D);
        const json f = peer.peer->request({{"cmd", "batchOpen"}, {"sequences", N}, {"depth", D},
                                           {"steps", b->warmup_steps + b->decode_tokens + b->decode_tokens / std::max(1, b->round_steps) + 4},
                                           {"seed", b->seed}});
        char t[160];
        std::snprintf(t, sizeof t, " llama.cpp filled %d x %d tokens in %.1f s", N, D, f.value("fillSeconds", 0.0));
        extra += t;
      }
      if (b->kvpack_real_fill) {
        char t[120];
        std::snprintf(t, sizeof t, " kvpack filled %d x %d tokens in %.1f s", N, D, kv_fill_s);
        extra += t;
      }
      const int32_t V = c.n_vocab;
      std::vector<float> logits(static_cast<size_t>(N) * static_cast<size_t>(V));
      std::vector<int32_t> toks = random_tokens(N, V, r3);
      std::vector<BatchItem> items(static_cast<size_t>(N));
      auto round = [&] {
        for (int32_t i = 0; i < N; ++i) {
          BatchItem& it = items[static_cast<size_t>(i)];
          it = BatchItem{};
          it.kv = seqs[static_cast<size_t>(i)].get();
          it.tokens = std::span<const int32_t>(&toks[static_cast<size_t>(i)], 1);
          it.logits = logits.data() + static_cast<size_t>(i) * V;
        }
        if (!engine.runner().forward().run(items)) throw std::runtime_error("KV pool exhausted in the batched decode");
        for (int32_t i = 0; i < N; ++i) {  // greedy choice per sequence, as llama.cpp samples each
          const float* l = logits.data() + static_cast<size_t>(i) * V;
          toks[static_cast<size_t>(i)] = static_cast<int32_t>(std::max_element(l, l + V) - l);
        }
      };
      const int32_t rounds = (b->decode_tokens + b->round_steps - 1) / b->round_steps;
      std::fprintf(stderr, "[bench] batched decode, %d sequences at %d tokens: %d rounds of up to %d steps, alternating\n", N, D, rounds,
                   b->round_steps);
      const AlternatedSteps st = alternate_rounds(
          *b, rounds, peer.peer != nullptr, pbw.latest(),
          [&](int32_t warm, int32_t n) {
            std::vector<double> v;
            for (int32_t i = 0; i < warm + n; ++i) {
              const double t0 = now_s();
              round();
              if (i >= warm) v.push_back(now_s() - t0);
            }
            return v;
          },
          [&](int32_t warm, int32_t n) {
            return peer.peer->request({{"cmd", "batchSteps"}, {"n", n}, {"warmup", warm}})["rounds"].get<std::vector<double>>();
          },
          [&] { return pbw.read(2); });
      bw_now = rounds_bandwidth(st.kvpack_rounds);
      const double ll_bw = st.llama_rounds.empty() ? bw_now : rounds_bandwidth(st.llama_rounds);
      std::printf("# bandwidth during batch %d: %s\n", N, pbw.describe().c_str());
      const std::vector<double>&ksteps = st.kvpack, &lsteps = st.llama;
      if (peer.peer) peer.peer->request({{"cmd", "batchClose"}});
      seqs.clear();
      const double kv_tps = N / median(ksteps);
      const double ll_tps = lsteps.empty() ? 0.0 : N / median(lsteps);
      // Bytes per round: the weights once, every sequence's KV at its mean depth; per token: / N.
      const double mean_depth = D + b->warmup_steps + 0.5 * (b->decode_tokens + rounds);
      const double bytes = (W + N * kv_per_token * mean_depth) / N;
      const double roof = bw_now / bytes, ll_roof = ll_bw / bytes;
      const std::string label = "batch-" + std::to_string(N);
      char ex[120];
      std::snprintf(ex, sizeof ex, " %d sequences at %d tokens, one token each per forward; tok/s = all sequences", N, D);
      extra = ex + extra;
      rows.push_back({label, D, kv_tps, ll_tps, bytes, bw_now, extra, ll_bw});
      std::printf("%s depth=%d kvpack=%s llama.cpp=%s ratio=%s tok/s | roofline %.1f tok/s (%s/token) at %.1f GB/s around kvpack's rounds, "
                  "%.1f around llama.cpp's: kvpack=%s llama.cpp=%s |%s\n",
                  label.c_str(), D, tps(kv_tps).c_str(), tps(ll_tps).c_str(), ratio(kv_tps, ll_tps).c_str(), roof, gib(bytes).c_str(),
                  bw_now / 1e9, ll_bw / 1e9, pct(kv_tps, roof).c_str(), pct(ll_tps, ll_roof).c_str(), extra.c_str());
      std::fflush(stdout);
      phases.advance();
    }
    phases.finish();
    if (peer.peer) peer.peer->finish();

    const double bw1 = probe.read(5);
    bw_max = std::max(bw_max, bw1);
    std::printf("# load average %s; bandwidth after the runs: %.1f GB/s; best of the run: %.1f GB/s (each engine's decode roofline uses "
                "the readings right before and after each of its own rounds, GB/s column: kvpack's; the spread is other tenants' memory "
                "traffic)\n",
                loadavg().c_str(), bw1 / 1e9, bw_max / 1e9);
    print_table(rows);
  });
}

}  // namespace kvpack::cli
