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
// measured before the runs, before each depth (each phase's roofline uses the measurement taken right
// before it: on a shared machine the bandwidth available moves with other tenants' traffic) and after.
#include <fcntl.h>
#include <immintrin.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "compress/compressor.h"
#include "engine/calibrate.h"
#include "options.h"
#include "util/half.h"

namespace kvpack::cli {

void add_bench_peer(CLI::App& bench);

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct PeerOptions {
  bool quick = false;
  std::vector<int32_t> depths = {0, 2048, 8192, 16384};
  int32_t prompt_tokens = 512, decode_tokens = 32, reps = 3, warmup_steps = 2, round_steps = 8;
  std::string variant = "auto";  // auto | prebuilt | source | none
  std::string flash_attn = "off";
  bool build_source = false, kvpack_real_fill = false;
  std::string peer_dir, node = "node";
  int64_t bw_mib = 1024;
  uint64_t seed = 1;
};

// ---------------------------------------------------------------------------------------------
// Memory bandwidth: `threads` threads each stream-read their share of one buffer, as 8 interleaved
// sequential streams per thread (one stream per thread leaves bandwidth unused on this VM: ~26 vs
// ~34 GB/s; the engines' matmuls read many rows at once), best of `tries`.
constexpr int kStreams = 8;

__attribute__((target("avx512f"))) uint64_t read_sum_avx512(const uint64_t* p, size_t per) {
  __m512i a[kStreams];
  for (auto& v : a) v = _mm512_setzero_si512();
  for (size_t i = 0; i + 32 <= per; i += 32)
    for (int s = 0; s < kStreams; ++s) {
      const uint64_t* q = p + s * per + i;
      const __m512i x = _mm512_add_epi64(_mm512_loadu_si512(q), _mm512_loadu_si512(q + 8));
      const __m512i y = _mm512_add_epi64(_mm512_loadu_si512(q + 16), _mm512_loadu_si512(q + 24));
      a[s] = _mm512_add_epi64(a[s], _mm512_add_epi64(x, y));
    }
  __m512i t = a[0];
  for (int s = 1; s < kStreams; ++s) t = _mm512_add_epi64(t, a[s]);
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, t);
  uint64_t sum = 0;
  for (uint64_t v : lanes) sum += v;
  return sum;
}

uint64_t read_sum_generic(const uint64_t* p, size_t per) {
  uint64_t a[kStreams][4] = {};
  for (size_t i = 0; i + 4 <= per; i += 4)
    for (int s = 0; s < kStreams; ++s)
      for (int j = 0; j < 4; ++j) a[s][j] += p[s * per + i + j];
  uint64_t t = 0;
  for (auto& r : a)
    for (uint64_t v : r) t += v;
  return t;
}

uint64_t read_sum(const uint64_t* p, size_t n) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  const size_t per = n / kStreams / 32 * 32;
  return avx512 ? read_sum_avx512(p, per) : read_sum_generic(p, per);
}

double measure_bandwidth(int threads, size_t bytes, int tries) {
  const size_t n = bytes / sizeof(uint64_t);
  std::unique_ptr<uint64_t[]> buf(new uint64_t[n]);
  // Touch every page (and give the lanes something to add) from the threads that will read it.
  {
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        auto [lo, hi] = split_range(static_cast<int64_t>(n), threads, t, 512);
        for (int64_t i = lo; i < hi; ++i) buf[static_cast<size_t>(i)] = static_cast<uint64_t>(i);
      });
    for (auto& th : ts) th.join();
  }
  double best = 0;
  std::atomic<uint64_t> sink{0};
  for (int k = 0; k < tries; ++k) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<double> t_end(static_cast<size_t>(threads));
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        auto [lo, hi] = split_range(static_cast<int64_t>(n), threads, t, 512);
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) {
        }
        sink.fetch_add(read_sum(buf.get() + lo, static_cast<size_t>(hi - lo)), std::memory_order_relaxed);
        t_end[static_cast<size_t>(t)] = now_s();
      });
    while (ready.load() != threads) std::this_thread::yield();
    const double t0 = now_s();
    go.store(true, std::memory_order_release);
    for (auto& th : ts) th.join();
    const double dt = *std::max_element(t_end.begin(), t_end.end()) - t0;
    best = std::max(best, static_cast<double>(n * sizeof(uint64_t)) / dt);
  }
  if (sink.load() == 42) std::fprintf(stderr, " ");  // keep the sums alive
  return best;
}

// ---------------------------------------------------------------------------------------------
// The llama.cpp peer: `node llama_bench.mjs --serve ...` with stdin/stdout pipes.

class Peer {
 public:
  Peer(const std::string& node, const fs::path& script, const std::vector<std::string>& args) {
    // O_CLOEXEC: a peer started later must not inherit this one's pipe ends (its stdin would never
    // see EOF); dup2 in the child clears the flag on fds 0 and 1.
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
    pid_ = fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      close(in[0]), close(in[1]), close(out[0]), close(out[1]);
      std::vector<std::string> all = {node, script.string()};
      all.insert(all.end(), args.begin(), args.end());
      std::vector<char*> av;
      for (auto& s : all) av.push_back(s.data());
      av.push_back(nullptr);
      execvp(av[0], av.data());
      std::fprintf(stderr, "[peer] cannot run %s: %s\n", node.c_str(), std::strerror(errno));
      _exit(127);
    }
    close(in[0]), close(out[1]);
    to_ = fdopen(in[1], "w");
    from_ = fdopen(out[0], "r");
  }
  ~Peer() { finish(); }

  json request(const json& req) {
    std::fprintf(to_, "%s\n", req.dump().c_str());
    std::fflush(to_);
    return read();
  }
  // Next JSON line from the peer; lines that are not JSON objects are passed through to stderr.
  json read() {
    std::string line;
    for (;;) {
      line.clear();
      int c;
      while ((c = std::fgetc(from_)) != EOF && c != '\n') line.push_back(static_cast<char>(c));
      if (line.empty() && c == EOF) {
        const int rc = finish();
        throw std::runtime_error("the llama.cpp driver exited (status " + std::to_string(rc) + ")");
      }
      if (!line.empty() && line[0] == '{') {
        json j = json::parse(line, nullptr, false);
        if (!j.is_discarded()) {
          if (j.value("event", "") == "error") throw std::runtime_error("llama.cpp driver: " + j.value("message", std::string("?")));
          return j;
        }
      }
      std::fprintf(stderr, "[llama.cpp] %s\n", line.c_str());
    }
  }
  int finish() {
    if (pid_ <= 0) return exit_code_;
    if (to_) {
      std::fprintf(to_, "{\"cmd\":\"quit\"}\n");
      std::fclose(to_);
      to_ = nullptr;
    }
    if (from_) std::fclose(from_), from_ = nullptr;
    int st = 0;
    // Give it 20 s to dispose of its context and exit, then terminate it.
    bool done = false;
    for (int i = 0; i < 200 && !done; ++i) {
      done = waitpid(pid_, &st, WNOHANG) == pid_;
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!done) {
      std::fprintf(stderr, "[peer] the llama.cpp driver (pid %d) did not exit after quit: terminating it\n", static_cast<int>(pid_));
      kill(pid_, SIGTERM);
      waitpid(pid_, &st, 0);
    }
    pid_ = -1;
    exit_code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return exit_code_;
  }

 private:
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
  int exit_code_ = 0;
};

fs::path default_peer_dir() {
  // This file lives in <repo>/tools/; the driver in <repo>/scripts/peer/ (absolute __FILE__ under CMake).
  fs::path here = fs::path(__FILE__);
  if (here.is_absolute()) {
    fs::path p = here.parent_path().parent_path() / "scripts" / "peer";
    if (fs::exists(p / "llama_bench.mjs")) return p;
  }
  return fs::path("scripts") / "peer";
}

void ensure_node_modules(const fs::path& dir) {
  if (fs::exists(dir / "node_modules" / "node-llama-cpp" / "package.json") &&
      fs::exists(dir / "node_modules" / "@node-llama-cpp" / "linux-x64" / "package.json"))
    return;
  const std::string cmd = "cd '" + dir.string() + "' && npm install --omit=optional --ignore-scripts --no-audit --no-fund 1>&2";
  std::fprintf(stderr,
               "[peer] node-llama-cpp is not installed in %s/node_modules: installing it (pinned in package.json; the prebuilt\n"
               "[peer] linux-x64 CPU binaries only, no CUDA/Vulkan packages, no install scripts):\n[peer] $ %s\n",
               dir.c_str(), cmd.c_str());
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("npm install failed in " + dir.string());
}

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
    BatchItem item;
    item.kv = &seq;
    item.tokens = std::span<const int32_t>(&tok, 1);
    item.logits = logits.data();
    if (comp) comp->prepare(seq, item);
    if (!engine.runner().forward().run(std::span<BatchItem>(&item, 1), comp)) throw std::runtime_error("KV pool exhausted");
    if (comp) comp->after_forward(seq, false);
    tok = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    const double dt = now_s() - t0;
    if (i >= warmup) steps.push_back(dt);
  }
  return steps;
}

// ---------------------------------------------------------------------------------------------

std::string machine_line() {
  std::string cpu = "unknown CPU";
  std::ifstream ci("/proc/cpuinfo");
  std::string line;
  bool avx512 = false, bf16 = false, vnni = false, amx = false;
  while (std::getline(ci, line)) {
    if (line.rfind("model name", 0) == 0 && cpu == "unknown CPU") cpu = line.substr(line.find(':') + 2);
    if (line.rfind("flags", 0) == 0) {
      avx512 = line.find(" avx512f") != std::string::npos;
      bf16 = line.find(" avx512_bf16") != std::string::npos;
      vnni = line.find(" avx512_vnni") != std::string::npos;
      amx = line.find(" amx_tile") != std::string::npos;
    }
  }
  long mem_kb = 0;
  std::ifstream mi("/proc/meminfo");
  while (std::getline(mi, line))
    if (line.rfind("MemTotal:", 0) == 0) mem_kb = std::atol(line.c_str() + 9);
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s, %u logical CPUs, %.0f GiB RAM, AVX-512 %s (bf16 %s, VNNI %s), AMX %s", cpu.c_str(),
                std::thread::hardware_concurrency(), mem_kb / 1048576.0, avx512 ? "yes" : "no", bf16 ? "yes" : "no",
                vnni ? "yes" : "no", amx ? "yes" : "no");
  return buf;
}

// "1.23" from /proc/loadavg (1-minute load): on a shared machine, how many other runnable threads there were.
std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string one = "?";
  f >> one;
  return one;
}

std::string gib(double b) {
  char s[32];
  if (b >= 1 << 30)
    std::snprintf(s, sizeof s, "%.2f GiB", b / (1 << 30));
  else if (b >= 1 << 20)
    std::snprintf(s, sizeof s, "%.0f MiB", b / (1 << 20));
  else
    std::snprintf(s, sizeof s, "%.0f KiB", b / 1024);
  return s;
}

// "12.34" or "-" when the engine did not run.
std::string tps(double v) {
  if (v <= 0) return "-";
  char s[32];
  std::snprintf(s, sizeof s, "%.2f", v);
  return s;
}
std::string pct(double v, double roof) {
  if (v <= 0) return "-";
  char s[32];
  std::snprintf(s, sizeof s, "%.1f%%", 100 * v / roof);
  return s;
}
std::string ratio(double a, double b) {
  if (a <= 0 || b <= 0) return "-";
  char s[32];
  std::snprintf(s, sizeof s, "%.2f", a / b);
  return s;
}

struct PeerChoice {
  std::unique_ptr<Peer> peer;
  json ready;
  std::string variant;
};

std::vector<std::string> peer_args(const std::string& model, const PeerOptions& b, int threads, int batch, int ctx,
                                   const std::string& variant) {
  return {"--serve",   "--model",      model,          "--threads", std::to_string(threads), "--batch", std::to_string(batch),
          "--ctx",     std::to_string(ctx), "--variant", variant,   "--flash-attn",          b.flash_attn};
}

std::unique_ptr<Peer> start_peer(const PeerOptions& b, const fs::path& dir, const std::vector<std::string>& args, json& ready) {
  auto p = std::make_unique<Peer>(b.node, dir / "llama_bench.mjs", args);
  try {
    ready = p->read();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[peer] %s\n", e.what());
    return nullptr;
  }
  return p;
}

PeerChoice choose_peer(const PeerOptions& b, const fs::path& dir, const std::string& model, int threads, int batch, int ctx) {
  PeerChoice c;
  if (b.build_source) {
    std::fprintf(stderr, "[peer] building llama.cpp from node-llama-cpp's bundled source (GGML_NATIVE=ON; ~25 min on 2 busy cores)\n");
    Peer bp(b.node, dir / "llama_bench.mjs", {"--build-source", "--threads", std::to_string(threads)});
    json r = bp.read();
    std::fprintf(stderr, "[peer] build: %s\n", r.dump().c_str());
  }
  if (b.variant == "prebuilt" || b.variant == "source") {
    c.peer = start_peer(b, dir, peer_args(model, b, threads, batch, ctx, b.variant), c.ready);
    if (!c.peer) throw std::runtime_error("llama.cpp (" + b.variant + ") could not be started; see the messages above");
    c.variant = b.variant;
    return c;
  }
  // auto: start the prebuilt binaries and (when built) the source build side by side, alternate short
  // probes (prefill 128, 8 decode steps at depth 0; round 0 is warm-up), keep the faster at decode.
  json r_pre, r_src;
  auto pre = start_peer(b, dir, peer_args(model, b, threads, batch, ctx, "prebuilt"), r_pre);
  auto src = start_peer(b, dir, peer_args(model, b, threads, batch, ctx, "source"), r_src);
  if (!pre && !src) throw std::runtime_error("neither llama.cpp variant could be started; see the messages above");
  if (!src) std::printf("# llama.cpp source build not available (build it once with --llama-build-source): prebuilt binaries\n");
  if (!pre) std::printf("# llama.cpp prebuilt binaries not usable (see the messages above): source build\n");
  if (pre && src) {
    std::fprintf(stderr, "[peer] probing the prebuilt binaries against the source build (4 alternating rounds)\n");
    std::vector<double> pf[2], st[2];
    Peer* ps[2] = {pre.get(), src.get()};
    for (int round = 0; round < 4; ++round)
      for (int k = 0; k < 2; ++k) {
        const int i = (round + k) % 2;
        const json a = ps[i]->request({{"cmd", "prefill"}, {"n", 128}, {"reps", 1}, {"warmup", 0}});
        const json d = ps[i]->request({{"cmd", "steps"}, {"n", 8}, {"warmup", 1}});
        if (round == 0) continue;
        pf[i].push_back(a["seconds"][0].get<double>());
        for (double x : d["steps"].get<std::vector<double>>()) st[i].push_back(x);
      }
    const double pre_pf = 128 / median(pf[0]), pre_dc = 1 / median(st[0]);
    const double src_pf = 128 / median(pf[1]), src_dc = 1 / median(st[1]);
    std::printf("# llama.cpp probe, prebuilt:     prefill(128) %.2f tok/s, decode(depth 0) %.2f tok/s\n", pre_pf, pre_dc);
    std::printf("# llama.cpp probe, source build: prefill(128) %.2f tok/s, decode(depth 0) %.2f tok/s\n", src_pf, src_dc);
    if ((src_pf > pre_pf) != (src_dc > pre_dc))
      std::printf("# note: one variant is faster at prefill, the other at decode; decode decides\n");
    const bool use_src = src_dc > pre_dc;
    (use_src ? pre : src)->finish();
    c.peer = std::move(use_src ? src : pre);
    c.ready = use_src ? r_src : r_pre;
    c.variant = use_src ? "source" : "prebuilt";
  } else {
    c.peer = std::move(src ? src : pre);
    c.ready = src ? r_src : r_pre;
    c.variant = src ? "source" : "prebuilt";
  }
  std::fflush(stdout);
  return c;
}

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
  cmd->add_option("--prompt-tokens", b->prompt_tokens, "Prefill length (0: no prefill phase)")->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--decode-tokens", b->decode_tokens, "Timed decode steps per depth")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--reps", b->reps, "Timed prefill runs per engine (after one warm-up run)")->check(CLI::Range(1, 100));
  cmd->add_option("--round-steps", b->round_steps, "Decode steps per engine before switching to the other")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--llama-variant", b->variant, "llama.cpp binaries: auto (probe both, keep the faster), prebuilt, source, none")
      ->check(CLI::IsMember({"auto", "prebuilt", "source", "none"}));
  cmd->add_flag("--llama-build-source", b->build_source, "First build llama.cpp from node-llama-cpp's bundled source (-march=native)");
  cmd->add_option("--flash-attn", b->flash_attn, "llama.cpp flash attention")->check(CLI::IsMember({"on", "off"}));
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
    }
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
    eo.kv_pages = streams * ((ctx + o->page_size - 1) / o->page_size + 2) * (kvo->policy != "full" ? 2 : 1);
    Engine engine(*model, eo);
    // Optional compressed runs: kvpack with --kv-policy at each depth beyond the budget, against llama.cpp's
    // full KV at the same depth. Calibration (TriAttention) from --kv-calib, else from 1024 random tokens.
    compress::CompressConfig kvc;
    std::mt19937 rng0(static_cast<uint32_t>(b->seed + 7));
    if (kvo->policy != "full") {
      KvOptions k = *kvo;
      const bool own_calib = k.calib.empty() && compress::policy_needs_calibration(compress::parse_policy(k.policy));
      if (own_calib) {
        const auto toks = random_tokens(std::min<int32_t>(1024, c.n_ctx), c.n_vocab, rng0);
        engine.set_calibration(calibrate(*model, toks, eo));
        k.policy = "full";  // kv_config would look for a file; the statistics are already loaded
      }
      kvc = kv_config(k, engine);
      if (own_calib) kvc.policy = compress::parse_policy(kvo->policy);
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
    const double bw0 = measure_bandwidth(threads, bw_bytes, 5);
    double bw_max = bw0;  // best of all measurements in this run (printed at the end)
    double bw_now = bw0;  // the latest measurement: each phase's roofline uses the one taken right before it
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

    struct Row {
      std::string phase;
      int32_t n;
      double kv_tps, ll_tps, bytes_per_token, bw;  // bw: measured right before the phase
      std::string extra;
    };
    std::vector<Row> rows;
    std::mt19937 rng(static_cast<uint32_t>(b->seed));

    if (b->prompt_tokens > 0) {
      const int32_t P = b->prompt_tokens;
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
      char extra[160];
      std::snprintf(extra, sizeof extra, " compute: kvpack=%.1f llama.cpp=%s GFLOP/s", flops / (P / kv_tps) / 1e9,
                    ll_tps > 0 ? tps(flops / (P / ll_tps) / 1e9).c_str() : "-");
      rows.push_back({"prefill", P, kv_tps, ll_tps, W / chunk + kv_per_token, bw_now, extra});
      std::printf("prefill n=%d kvpack=%s llama.cpp=%s ratio=%s tok/s | roofline %.0f tok/s: kvpack=%s llama.cpp=%s |%s\n", P,
                  tps(kv_tps).c_str(), tps(ll_tps).c_str(), ratio(kv_tps, ll_tps).c_str(), roof, pct(kv_tps, roof).c_str(),
                  pct(ll_tps, roof).c_str(), extra);
      std::fflush(stdout);
    }

    std::unique_ptr<kv::SequenceKv> real_seq;  // --kvpack-real-fill: one growing sequence, like llama.cpp's
    for (int32_t depth : b->depths) {
      {
        bw_now = measure_bandwidth(threads, bw_bytes, 3);
        bw_max = std::max(bw_max, bw_now);
        std::printf("# bandwidth before depth %d: %.1f GB/s; load average %s\n", depth, bw_now / 1e9, loadavg().c_str());
      }
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
        if (fill > 0) {
          char s[160];
          std::snprintf(s, sizeof s, " llama.cpp filled %d tokens in %.1f s (%.1f tok/s)", fill, f.value("fillSeconds", 0.0),
                        fill / f.value("fillSeconds", 1.0));
          extra += s;
        }
      }
      // Rounds of --round-steps steps, the engines alternating (order flipping each round), one warm-up
      // step per engine per round (two in the first), so load changes on a shared machine hit both alike.
      const int32_t rounds = (b->decode_tokens + b->round_steps - 1) / b->round_steps;
      std::fprintf(stderr, "[bench] decode at depth %d: %d rounds of up to %d steps, kvpack and llama.cpp alternating\n", depth, rounds,
                   b->round_steps);
      std::vector<double> ksteps, lsteps;
      for (int32_t r = 0; r < rounds; ++r) {
        const int32_t n = std::min(b->round_steps, b->decode_tokens - r * b->round_steps);
        const int32_t warm = r == 0 ? b->warmup_steps : 1;
        for (int k = 0; k < 2; ++k) {
          if ((r + k) % 2 == 0) {
            const auto v = kvpack_decode_steps(engine, *seq, warm, n, r2);
            ksteps.insert(ksteps.end(), v.begin(), v.end());
          } else if (peer.peer) {
            const json j = peer.peer->request({{"cmd", "steps"}, {"n", n}, {"warmup", warm}});
            for (double x : j["steps"].get<std::vector<double>>()) lsteps.push_back(x);
          }
        }
      }
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
      const double roof = bw_now / bytes;
      rows.push_back({"decode", depth, kv_tps, ll_tps, bytes, bw_now, extra});
      std::printf("decode depth=%d kvpack=%s llama.cpp=%s ratio=%s tok/s | roofline %.1f tok/s (%s/token): kvpack=%s llama.cpp=%s |%s\n",
                  depth, tps(kv_tps).c_str(), tps(ll_tps).c_str(), ratio(kv_tps, ll_tps).c_str(), roof, gib(bytes).c_str(),
                  pct(kv_tps, roof).c_str(), pct(ll_tps, roof).c_str(), extra.c_str());
      std::fflush(stdout);
      if (kvc.enabled() && depth > kvc.budget) {
        // kvpack compressed at this depth vs llama.cpp's full KV at the same depth (measured just above).
        // The sequence is filled to `depth` slots and compressed once (the state right after an event),
        // then decodes a whole interval (one more event inside the timed steps), mean step time.
        auto cs = engine.kv().new_sequence();
        fill_kv_synthetic(*cs, depth, b->seed + static_cast<uint64_t>(depth) + 1);
        compress::SequenceCompressor comp(kvc, c, engine.calibration(), 1, &engine.runner().threads());
        comp.compress(*cs);
        const int32_t n = std::max(b->decode_tokens, kvc.interval + 1);
        const int64_t events0 = comp.stats().events;
        const auto steps = kvpack_decode_steps(engine, *cs, b->warmup_steps, n, r2, &comp);
        const int64_t events = comp.stats().events - events0;
        double step_s = 0;  // mean, not median: the compaction event is one step in `interval`
        for (double x : steps) step_s += x / n;
        const double c_tps = 1.0 / step_s;
        const double c_bytes = W + kv_per_token * (kvc.budget + 0.5 * kvc.interval);
        const double c_roof = bw_now / c_bytes;
        const std::string label = std::string("decode-") + compress::policy_name(kvc.policy) + "-b" + std::to_string(kvc.budget);
        char ex[200];
        std::snprintf(ex, sizeof ex, " kvpack %s budget %d interval %d, mean of %d steps incl. %lld compaction event(s); llama.cpp full KV",
                      compress::policy_name(kvc.policy), kvc.budget, kvc.interval, n, static_cast<long long>(events));
        rows.push_back({label, depth, c_tps, ll_tps, c_bytes, bw_now, ex});
        std::printf("%s depth=%d kvpack=%s llama.cpp(full)=%s ratio=%s tok/s | roofline %.1f tok/s (%s/token): kvpack=%s |%s\n",
                    label.c_str(), depth, tps(c_tps).c_str(), tps(ll_tps).c_str(), ratio(c_tps, ll_tps).c_str(), c_roof,
                    gib(c_bytes).c_str(), pct(c_tps, c_roof).c_str(), ex);
        std::fflush(stdout);
      }
    }
    real_seq.reset();
    if (peer.peer) peer.peer->finish();

    const double bw1 = measure_bandwidth(threads, bw_bytes, 5);
    bw_max = std::max(bw_max, bw1);
    std::printf("# load average %s; bandwidth after the runs: %.1f GB/s; best of the run: %.1f GB/s (each roofline uses the measurement "
                "taken right before its phase; the spread is other tenants' memory traffic)\n",
                loadavg().c_str(), bw1 / 1e9, bw_max / 1e9);
    // Markdown table, ready for docs/performance.md.
    std::printf("\n| phase | kvpack tok/s | llama.cpp tok/s | kvpack / llama.cpp | GB/s | bytes/token | roofline tok/s | kvpack %% of roofline | "
                "llama.cpp %% of roofline |\n");
    std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const Row& r : rows) {
      const double roof = r.bw / r.bytes_per_token;
      std::printf("| %s %s=%d | %s | %s | %s | %.1f | %s | %.1f | %s | %s |\n", r.phase.c_str(), r.phase == "prefill" ? "n" : "depth", r.n,
                  tps(r.kv_tps).c_str(), tps(r.ll_tps).c_str(), ratio(r.kv_tps, r.ll_tps).c_str(), r.bw / 1e9, gib(r.bytes_per_token).c_str(),
                  roof, pct(r.kv_tps, roof).c_str(), r.phase.rfind("decode-", 0) == 0 ? "(full KV)" : pct(r.ll_tps, roof).c_str());
    }
    for (const Row& r : rows)
      if (r.phase.rfind("decode-", 0) == 0) std::printf("\n%s depth=%d:%s.\n", r.phase.c_str(), r.n, r.extra.c_str());
  });
}

}  // namespace kvpack::cli
