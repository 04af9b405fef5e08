// `kvpack bench cold`: the cold KV tier, measured side by side in one run.
//
//  1. Swap-in throughput: a sequence of --tokens tokens of synthetic K/V in the model's shape (swap
//     cost does not depend on K/V values) is swapped out and back through the real KV manager, from host
//     memory and from a directory, and checked bit-identical. The host figure is set against memcpy
//     bandwidth of the same bytes; the directory figure (page cache dropped, so the device is read)
//     against a sequential read of a file of the same size in the same directory (the faster of a
//     buffered and an O_DIRECT read, 8 MiB at a time). Each round measures
//     its own reference right after its swap-in (bandwidth drifts within minutes on a VM); medians.
//  2. A returning chat: a --chat-tokens history is served (its blocks registered), other traffic then
//     takes every page (the history's blocks are reused: spilled to the tier when there is one), and the
//     second turn arrives. Time to first token (queue + prefill, engine side) with the cold tier vs
//     recomputing the history, and the hot case (nothing evicted) for reference.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>

#include "bench_peer.h"  // machine_line(), loadavg()
#include "commands.h"
#include "engine/scheduler.h"
#include "kv/cold_tier_file.h"
#include "kv/cold_tier_host.h"
#include "options.h"

namespace kvpack::cli {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Fills `slots` slots of every stream with random bytes (K, V and positions).
void fill_random(kv::SequenceKv& kv, int32_t slots, uint64_t seed) {
  if (!kv.append(slots, 0)) throw std::runtime_error("bench cold: KV pool too small for the sequence");
  std::mt19937_64 rng(seed);
  auto& pool = kv.pool();
  for (int32_t s = 0; s < kv.n_streams(); ++s)
    for (kv::PageId p : kv.page_table(s)) {
      auto* d = reinterpret_cast<uint64_t*>(pool.data(p));
      for (size_t i = 0; i < pool.page_bytes() / 8; ++i) d[i] = rng();
    }
}

std::vector<uint8_t> snapshot(const kv::SequenceKv& kv) {
  std::vector<uint8_t> out;
  const auto& pool = kv.pool();
  for (int32_t s = 0; s < kv.n_streams(); ++s)
    for (kv::PageId p : kv.page_table(s)) out.insert(out.end(), pool.data(p), pool.data(p) + pool.record_bytes());
  return out;
}

struct SwapRounds {
  std::vector<double> out_gbps, in_gbps, ref_gbps, ratio;  // per round; ratio = in / ref of that round
  double in_seconds = 0, ref_seconds = 0;                  // summed over rounds (references: both of each round)
  bool identical = false;
  size_t bytes = 0;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// `repeats` rounds of: swap one sequence out, `reference` (the bandwidth the swap-in is judged against),
// `before_in` (untimed), swap it in, `reference` again. A VM's disk (and, less, its memory) bandwidth moves
// by a third from one second to the next, so each swap-in is set against the mean of the two references
// taken just before and just after it; the table gives medians over rounds and an aggregate (all bytes over
// all seconds, for the swap-ins and for the references).
SwapRounds swap_rounds(const char* name, Engine& engine, int32_t tokens, int repeats, const std::function<void()>& before_in,
                       const std::function<double(size_t bytes)>& reference) {
  kv::KvManager& m = engine.kv();
  auto kv = m.new_sequence(tokens);
  fill_random(*kv, tokens, 7);
  const std::vector<uint8_t> want = snapshot(*kv);
  SwapRounds r;
  r.bytes = want.size();
  r.identical = true;
  const double gb = static_cast<double>(r.bytes) / 1e9;
  for (int i = 0; i < repeats; ++i) {
    kv::SwappedKv sw;
    double t0 = now_s();
    if (!m.swap_out(*kv, 1000 + static_cast<uint64_t>(i), sw)) throw std::runtime_error("bench cold: the tier refused the swap-out");
    m.cold_tier()->flush();
    r.out_gbps.push_back(gb / (now_s() - t0));
    kv.reset();
    const double ref_before = reference(r.bytes);
    if (before_in) before_in();
    t0 = now_s();
    kv = m.swap_in(sw, tokens);
    const double t_in = now_s() - t0;
    r.in_gbps.push_back(gb / t_in);
    if (!kv) throw std::runtime_error("bench cold: swap-in lost a record");
    r.identical &= snapshot(*kv) == want;
    const double ref_after = reference(r.bytes);
    r.ref_gbps.push_back(0.5 * (ref_before + ref_after));
    r.ratio.push_back(r.in_gbps.back() / r.ref_gbps.back());
    r.in_seconds += t_in;
    r.ref_seconds += gb / ref_before + gb / ref_after;
    std::printf("%s round %d: swap-out %.2f, reference %.2f, swap-in %.2f, reference %.2f GB/s (%.0f%% of their mean)\n", name, i + 1,
                r.out_gbps.back(), ref_before, r.in_gbps.back(), ref_after, 100 * r.ratio.back());
  }
  return r;
}

void print_swap_row(const char* name, const SwapRounds& r, const std::string& reference) {
  const auto [lo, hi] = std::minmax_element(r.ratio.begin(), r.ratio.end());
  const double n = static_cast<double>(r.ratio.size());
  const double aggregate = (n * r.bytes / r.in_seconds) / (2 * n * r.bytes / r.ref_seconds);
  std::printf("| %s | %.2f | %.2f | %.2f (%s) | %.0f%% (%.0f-%.0f%%) | %.0f%% | %s |\n", name, median(r.out_gbps), median(r.in_gbps),
              median(r.ref_gbps), reference.c_str(), 100 * median(r.ratio), 100 * *lo, 100 * *hi, 100 * aggregate,
              r.identical ? "yes" : "NO");
}

// Engine-side time to first token of `req` (queue + prefill), run to completion on `sched`.
RequestStats run_one(Scheduler& sched, Request req) {
  RequestStats st;
  bool done = false;
  sched.submit(std::move(req), [&](const RequestEvent& ev) {
    if (ev.kind == RequestEvent::Kind::Finished) {
      st = ev.stats;
      done = true;
    }
  });
  while (!done) sched.step();
  return st;
}

struct ChatResult {
  double ttft_s = 0;
  int32_t cached = 0, cached_cold = 0;
};

ChatResult returning_chat(const Model& model, EngineOptions eo, int32_t history, int32_t pool_tokens) {
  const ModelConfig& c = model.config();
  const int64_t streams = static_cast<int64_t>(c.n_layer) * c.n_head_kv;
  eo.kv_pages = streams * ((pool_tokens + eo.page_size - 1) / eo.page_size);
  Engine engine(model, eo);
  SchedulerOptions so;
  so.max_running = 1;
  Scheduler sched(engine, so);
  std::mt19937 rng(11);
  auto tokens = [&](int32_t n, uint32_t base) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>((base + rng()) % static_cast<uint32_t>(c.n_vocab));
    return t;
  };
  Request first;
  first.prompt = tokens(history, 1);
  first.max_tokens = 1;
  first.sampling.temperature = 0;
  run_one(sched, first);
  // Other traffic: prompts that together take the whole pool, so every cached-free page is reused.
  if (!eo.kv_cold.empty() || pool_tokens < 4 * history) {
    for (int32_t used = 0; used < pool_tokens + history; used += history) {
      Request other;
      other.prompt = tokens(std::min(history, c.n_ctx - 2), 2 + static_cast<uint32_t>(used));
      other.max_tokens = 1;
      other.sampling.temperature = 0;
      run_one(sched, other);
    }
  }
  Request again = first;
  for (int32_t t : tokens(32, 3)) again.prompt.push_back(t);  // the new user turn
  const RequestStats st = run_one(sched, again);
  return ChatResult{st.queue_seconds + st.prefill_seconds, st.cached_tokens, st.cached_tokens_cold};
}

}  // namespace

void add_bench_cold(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("cold", "Cold KV tier: swap-in throughput vs memcpy / disk read, returning-chat TTFT vs recompute");
  auto o = std::make_shared<ModelOptions>();
  add_model_options(*cmd, *o);
  auto tokens = std::make_shared<int32_t>(2048);
  auto chat = std::make_shared<int32_t>(1500);
  auto repeats = std::make_shared<int>(5);
  auto dir = std::make_shared<std::string>();
  cmd->add_option("--tokens", *tokens, "Tokens of the swapped sequence")->check(CLI::Range(16, 1 << 20));
  cmd->add_option("--chat-tokens", *chat, "History of the returning chat")->check(CLI::Range(16, 1 << 20));
  cmd->add_option("--repeats", *repeats, "Rounds of swap + reference (medians are reported)")->check(CLI::Range(1, 100));
  cmd->add_option("--dir", *dir, "Directory for the file tier (default: a new one under the current directory)");
  cmd->callback([=] {
    auto model = load_model(*o);
    const ModelConfig& c = model->config();
    EngineOptions eo = engine_options(*o);
    const int64_t streams = static_cast<int64_t>(c.n_layer) * c.n_head_kv;
    eo.kv_pages = streams * ((*tokens + eo.page_size - 1) / eo.page_size + 1);
    const size_t record = kv::PagePool(default_pool_config(c, eo)).record_bytes();
    const uint64_t cap = 2 * static_cast<uint64_t>(eo.kv_pages) * record + (64 << 20);
    const std::string path = dir->empty() ? (std::filesystem::current_path() / ("kvpack-bench-cold-" + std::to_string(getpid()))).string() : *dir;
    std::filesystem::create_directories(path);

    const std::time_t tt = std::time(nullptr);
    char date[64];
    std::strftime(date, sizeof date, "%Y-%m-%d %H:%M %Z", std::localtime(&tt));
    std::printf("# kvpack bench cold, %s\n# machine: %s; load average %s\n\nmodel %s: %d layers x %d KV heads, head_dim %d, KV %s; sequence %d tokens; file tier in %s\n\n",
                date, bench_peer::machine_line().c_str(), bench_peer::loadavg().c_str(), c.name.c_str(), c.n_layer, c.n_head_kv, c.head_dim,
                kernels::kv_type_name(eo.kv_type), *tokens, path.c_str());
    EngineOptions host_eo = eo;
    host_eo.kv_cold = "host:" + std::to_string(cap);
    Engine host_engine(*model, host_eo);
    const int io_threads = host_engine.runner().threads().size();
    const SwapRounds host = swap_rounds("host", host_engine, *tokens, *repeats, nullptr,
                                        [&](size_t bytes) { return kv::measure_memcpy_gbps(bytes, io_threads); });

    EngineOptions dir_eo = eo;
    dir_eo.kv_cold = "dir:" + path + ":" + std::to_string(cap);
    SwapRounds file;
    double resident = 0;
    std::vector<double> buffered_ref, direct_ref;
    {
      Engine dir_engine(*model, dir_eo);
      auto* tier = dynamic_cast<kv::FileColdTier*>(dir_engine.kv().cold_tier());
      const kv::SequentialReadProbe probe(path, host.bytes);
      file = swap_rounds("file", dir_engine, *tokens, *repeats, [tier] { tier->drop_page_cache(); }, [&](size_t) {
        const auto seq = probe.measure();
        resident = std::max(resident, seq.resident_fraction);
        buffered_ref.push_back(seq.buffered_gbps);
        direct_ref.push_back(seq.direct_gbps);
        return seq.gbps;
      });
    }
    std::printf("\n%d rounds; each round swaps out, measures the reference, swaps in, measures the reference again; medians over\n"
                "rounds; the ratio is each swap-in against the mean of its two references (median and range), and in aggregate\n"
                "(all swap-in bytes / seconds against all reference bytes / seconds)\n\n"
                "| swap of %.1f MiB | swap-out GB/s | swap-in GB/s | reference GB/s | swap-in / reference | aggregate | bit-identical |\n"
                "|---|---:|---:|---:|---:|---:|---|\n",
                *repeats, static_cast<double>(host.bytes) / (1 << 20));
    print_swap_row("host memory", host, "memcpy, " + std::to_string(io_threads) + " threads");
    char ref[160];
    std::snprintf(ref, sizeof ref, "the faster sequential read: buffered %.2f, O_DIRECT %.2f; at most %.0f%% cached",
                  median(buffered_ref), median(direct_ref), 100 * resident);
    print_swap_row("file tier (page cache dropped)", file, ref);
    std::printf("\n");
    std::fflush(stdout);

    // Returning chat: the pool holds the history plus a little; other traffic then takes it all.
    const int32_t hist = std::min(*chat, c.n_ctx - 64);
    const int32_t pool_tokens = hist + 256;
    EngineOptions chat_eo = engine_options(*o);
    const ChatResult hot = returning_chat(*model, chat_eo, hist, 8 * pool_tokens);
    const ChatResult recompute = returning_chat(*model, chat_eo, hist, pool_tokens);
    // Room in the tier for the history and all the other traffic's spilled blocks (LRU would otherwise
    // drop the history's first blocks before the second turn arrives).
    const uint64_t chat_cap = 8 * static_cast<uint64_t>(streams) * ((pool_tokens + hist) / eo.page_size + 1) * record;
    chat_eo.kv_cold = "dir:" + path + ":" + std::to_string(chat_cap);
    const ChatResult cold = returning_chat(*model, chat_eo, hist, pool_tokens);
    std::printf("| returning chat (%d-token history + 32 new) | TTFT ms | prompt tokens from cache | of them from the cold tier |\n"
                "|---|---:|---:|---:|\n"
                "| history still hot | %.1f | %d | %d |\n| evicted, recomputed (no tier) | %.1f | %d | %d |\n"
                "| evicted, spilled to the file tier | %.1f | %d | %d |\n\n"
                "TTFT cold tier vs recompute: %.2fx faster\n",
                hist, 1e3 * hot.ttft_s, hot.cached, hot.cached_cold, 1e3 * recompute.ttft_s, recompute.cached, recompute.cached_cold,
                1e3 * cold.ttft_s, cold.cached, cold.cached_cold, recompute.ttft_s / cold.ttft_s);
    if (dir->empty()) std::filesystem::remove_all(path);
  });
}

}  // namespace kvpack::cli
