// `kvpack bench cold`: the cold KV tier, measured side by side in one run.
//
//  1. Swap-in throughput: a sequence of --tokens tokens of synthetic K/V in the model's shape (swap
//     cost does not depend on K/V values) is swapped out and back through the real KV manager, from host
//     memory and from a directory, and checked bit-identical. The host figure is set against memcpy
//     bandwidth of the same bytes; the directory figure (page cache dropped, so the device is read)
//     against a sequential read of a file of the same size in the same directory.
//  2. A returning chat: a --chat-tokens history is served (its blocks registered), other traffic then
//     takes every page (the history's blocks are reused: spilled to the tier when there is one), and the
//     second turn arrives. Time to first token (queue + prefill, engine side) with the cold tier vs
//     recomputing the history, and the hot case (nothing evicted) for reference.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>

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

struct SwapResult {
  double out_gbps = 0, in_gbps = 0;
  bool identical = false;
  size_t bytes = 0;
};

// Best of `repeats` swap-out / swap-in cycles of one sequence; `before_in` runs between them (untimed).
SwapResult swap_cycle(Engine& engine, int32_t tokens, int repeats, const std::function<void()>& before_in) {
  kv::KvManager& m = engine.kv();
  auto kv = m.new_sequence(tokens);
  fill_random(*kv, tokens, 7);
  const std::vector<uint8_t> want = snapshot(*kv);
  SwapResult r;
  r.bytes = want.size();
  r.identical = true;
  for (int i = 0; i < repeats; ++i) {
    kv::SwappedKv sw;
    double t0 = now_s();
    if (!m.swap_out(*kv, 1000 + static_cast<uint64_t>(i), sw)) throw std::runtime_error("bench cold: the tier refused the swap-out");
    m.cold_tier()->flush();
    const double t_out = now_s() - t0;
    kv.reset();
    if (before_in) before_in();
    t0 = now_s();
    kv = m.swap_in(sw, tokens);
    const double t_in = now_s() - t0;
    if (!kv) throw std::runtime_error("bench cold: swap-in lost a record");
    r.identical &= snapshot(*kv) == want;
    r.out_gbps = std::max(r.out_gbps, static_cast<double>(r.bytes) / t_out / 1e9);
    r.in_gbps = std::max(r.in_gbps, static_cast<double>(r.bytes) / t_in / 1e9);
  }
  return r;
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
  auto repeats = std::make_shared<int>(3);
  auto dir = std::make_shared<std::string>();
  cmd->add_option("--tokens", *tokens, "Tokens of the swapped sequence")->check(CLI::Range(16, 1 << 20));
  cmd->add_option("--chat-tokens", *chat, "History of the returning chat")->check(CLI::Range(16, 1 << 20));
  cmd->add_option("--repeats", *repeats, "Swap cycles (best is reported)")->check(CLI::Range(1, 100));
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

    std::printf("# kvpack bench cold\n\nmodel %s: %d layers x %d KV heads, head_dim %d, KV %s; sequence %d tokens; file tier in %s\n\n",
                c.name.c_str(), c.n_layer, c.n_head_kv, c.head_dim, kernels::kv_type_name(eo.kv_type), *tokens, path.c_str());
    EngineOptions host_eo = eo;
    host_eo.kv_cold = "host:" + std::to_string(cap);
    Engine host_engine(*model, host_eo);
    const SwapResult host = swap_cycle(host_engine, *tokens, *repeats, nullptr);
    const int io_threads = host_engine.runner().threads().size();
    const double memcpy_gbps = kv::measure_memcpy_gbps(host.bytes, io_threads);

    EngineOptions dir_eo = eo;
    dir_eo.kv_cold = "dir:" + path + ":" + std::to_string(cap);
    SwapResult file, file_nohint;
    double disk_gbps = 0, disk_resident = 0;
    {
      Engine dir_engine(*model, dir_eo);
      auto* tier = dynamic_cast<kv::FileColdTier*>(dir_engine.kv().cold_tier());
      file = swap_cycle(dir_engine, *tokens, *repeats, [tier] { tier->drop_page_cache(); });
      const auto seq = kv::measure_sequential_read(path, file.bytes);
      disk_gbps = seq.gbps;
      disk_resident = seq.resident_fraction;
      // The same without the read-ahead hint (FileTierOptions::readahead_hint), side by side.
      dir_engine.kv().set_cold_tier(nullptr);  // releases the directory before the next tier locks it
      kv::FileTierOptions plain;
      plain.read_threads = std::max(plain.read_threads, io_threads);
      plain.readahead_hint = false;
      auto nohint = std::make_unique<kv::FileColdTier>(path, cap, record, plain);
      auto* raw = nohint.get();
      dir_engine.kv().set_cold_tier(std::move(nohint));
      file_nohint = swap_cycle(dir_engine, *tokens, *repeats, [raw] { raw->drop_page_cache(); });
    }
    std::printf("| swap of %.1f MiB | swap-out GB/s | swap-in GB/s | reference GB/s | swap-in / reference | bit-identical |\n"
                "|---|---:|---:|---:|---:|---|\n"
                "| host memory | %.2f | %.2f | %.2f (memcpy, %d threads) | %.0f%% | %s |\n"
                "| file tier (page cache dropped) | %.2f | %.2f | %.2f (sequential read, %.0f%% cached) | %.0f%% | %s |\n"
                "| file tier, no read-ahead hint | %.2f | %.2f | same | %.0f%% | %s |\n\n",
                static_cast<double>(host.bytes) / (1 << 20), host.out_gbps, host.in_gbps, memcpy_gbps, io_threads, 100 * host.in_gbps / memcpy_gbps,
                host.identical ? "yes" : "NO", file.out_gbps, file.in_gbps, disk_gbps, 100 * disk_resident,
                100 * file.in_gbps / disk_gbps, file.identical ? "yes" : "NO", file_nohint.out_gbps, file_nohint.in_gbps,
                100 * file_nohint.in_gbps / disk_gbps, file_nohint.identical ? "yes" : "NO");
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
