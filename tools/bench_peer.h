// `kvpack bench peer` (kvpack against llama.cpp on the same GGUF), split in three files that share
// this header: cmd_bench_peer.cpp (the command: options, the kvpack side, the phase-by-phase runs),
// cmd_bench_peer_llama.cpp (the llama.cpp side: the node-llama-cpp driver process and the choice of
// its binaries), cmd_bench_peer_report.cpp (the memory-bandwidth roofline, the machine description
// and the formatting of the printed lines and the final table).
#pragma once
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvpack::cli::bench_peer {

namespace fs = std::filesystem;
using json = nlohmann::json;

inline double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
double median(std::vector<double> v);

struct PeerOptions {
  bool quick = false;
  std::vector<int32_t> depths = {0, 2048, 8192, 16384};
  std::vector<int32_t> batch_seqs = {8, 32};  // batched decode rows: concurrent sequences (empty: none)
  int32_t batch_depth = 512;                  // tokens each batched sequence holds before its timed steps
  int32_t prompt_tokens = 512, decode_tokens = 32, reps = 3, warmup_steps = 2, round_steps = 8;
  std::string variant = "auto";  // auto | prebuilt | source | none
  std::string flash_attn = "off";
  bool build_source = false, kvpack_real_fill = false;
  std::string peer_dir, node = "node";
  std::string llama_fill_cache;  // directory of llama.cpp's filled KV states (empty: fill every run)
  int64_t bw_mib = 1024;
  uint64_t seed = 1;
};

// ---------------------------------------------------------------------------------------------
// The llama.cpp side (cmd_bench_peer_llama.cpp).

// The llama.cpp peer: `node llama_bench.mjs --serve ...` with stdin/stdout pipes.
class Peer {
 public:
  Peer(const std::string& node, const fs::path& script, const std::vector<std::string>& args);
  ~Peer() { finish(); }
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  json request(const json& req);
  // Next JSON line from the peer; lines that are not JSON objects are passed through to stderr.
  json read();
  // Asks the driver to quit (terminates it after 20 s); its exit status. Idempotent.
  int finish();

 private:
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
  int exit_code_ = 0;
};

// <repo>/scripts/peer, where llama_bench.mjs and its node_modules live.
fs::path default_peer_dir();
// Runs `npm install` in `dir` unless node-llama-cpp and its linux-x64 binaries are already there.
void ensure_node_modules(const fs::path& dir);

struct PeerChoice {
  std::unique_ptr<Peer> peer;
  json ready;
  std::string variant;
};
// Starts the llama.cpp binaries --llama-variant names (auto: probes both, keeps the faster at decode).
PeerChoice choose_peer(const PeerOptions& b, const fs::path& dir, const std::string& model, int threads, int batch, int ctx);

// ---------------------------------------------------------------------------------------------
// Roofline and report (cmd_bench_peer_report.cpp).

// Bytes per second of a `threads`-thread streaming read of a `bytes` buffer, best of `tries`. The buffer is
// allocated and touched once (a fresh 1 GiB per reading cost ~0.3 s of page faults, and the bench reads
// it after every round). Not thread-safe: one reading at a time.
class BandwidthProbe {
 public:
  BandwidthProbe(int threads, size_t bytes);
  double read(int tries);

 private:
  int threads_;
  size_t n_;  // 64-bit words
  std::unique_ptr<uint64_t[]> buf_;
};
// Int8 arithmetic peaks of `threads` threads, ops (2 per multiply-add) per second, 0 without AVX-512 VNNI:
// raw vpdpbusd, and the GEMM's per-block sequence (vpdpbusd + convert + scale product + FMA).
struct Int8Peak {
  double raw = 0, scaled = 0;
};
Int8Peak measure_int8_peak(int threads);
// CPU model, logical CPUs, RAM, AVX-512 / AMX flags.
std::string machine_line();
// "1.23" from /proc/loadavg (1-minute load): on a shared machine, how many other runnable threads there were.
std::string loadavg();
std::string gib(double b);
// "12.34" or "-" when the engine did not run.
std::string tps(double v);
std::string pct(double v, double roof);
std::string ratio(double a, double b);

// One phase's result: a line of the final table.
struct Row {
  std::string phase;
  int32_t n;
  // bw: the bandwidth kvpack's roofline uses (decode rows: read right before and after each of kvpack's own
  // rounds, TimedRound); ll_bw: llama.cpp's, read around its rounds (0: the same as bw).
  double kv_tps, ll_tps, bytes_per_token, bw;
  std::string extra;
  double ll_bw = 0;
};
// The Markdown table (ready for docs/performance.md) and the notes of the compressed rows.
void print_table(const std::vector<Row>& rows);

}  // namespace kvpack::cli::bench_peer
