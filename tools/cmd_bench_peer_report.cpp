// `kvpack bench peer`, the roofline and the report: the memory-bandwidth measurement every roofline
// is computed from, the machine description printed at the top, the number formatting of the printed
// lines and the final Markdown table (bench_peer.h says how the command is split).
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <thread>

#include "bench_peer.h"
#include "util/thread_pool.h"

namespace kvpack::cli::bench_peer {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

namespace {

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

}  // namespace

BandwidthProbe::BandwidthProbe(int threads, size_t bytes)
    : threads_(threads), n_(bytes / sizeof(uint64_t)), buf_(new uint64_t[bytes / sizeof(uint64_t)]) {
  // Touch every page (and give the lanes something to add) from the threads that will read it.
  std::vector<std::thread> ts;
  for (int t = 0; t < threads_; ++t)
    ts.emplace_back([&, t] {
      auto [lo, hi] = split_range(static_cast<int64_t>(n_), threads_, t, 512);
      for (int64_t i = lo; i < hi; ++i) buf_[static_cast<size_t>(i)] = static_cast<uint64_t>(i);
    });
  for (auto& th : ts) th.join();
}

double BandwidthProbe::read(int tries) {
  double best = 0;
  std::atomic<uint64_t> sink{0};
  for (int k = 0; k < tries; ++k) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<double> t_end(static_cast<size_t>(threads_));
    std::vector<std::thread> ts;
    for (int t = 0; t < threads_; ++t)
      ts.emplace_back([&, t] {
        auto [lo, hi] = split_range(static_cast<int64_t>(n_), threads_, t, 512);
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) {
        }
        sink.fetch_add(read_sum(buf_.get() + lo, static_cast<size_t>(hi - lo)), std::memory_order_relaxed);
        t_end[static_cast<size_t>(t)] = now_s();
      });
    while (ready.load() != threads_) std::this_thread::yield();
    const double t0 = now_s();
    go.store(true, std::memory_order_release);
    for (auto& th : ts) th.join();
    const double dt = *std::max_element(t_end.begin(), t_end.end()) - t0;
    best = std::max(best, static_cast<double>(n_ * sizeof(uint64_t)) / dt);
  }
  if (sink.load() == 42) std::fprintf(stderr, " ");  // keep the sums alive
  return best;
}

namespace {

// ---------------------------------------------------------------------------------------------
// Arithmetic peaks of the int8 path that the quantised prefill GEMM runs on, measured on registers only
// (no loads). `raw`: independent vpdpbusd (64 u8 x s8 multiply-adds each). `scaled`: what the GEMM does
// per 64 products of a Q8_0 / Q4_0 block pair (kernels/matmul_avx512.cpp dot_q): vpdpbusd, int32 -> f32,
// weight scale x activation scale, FMA into the float accumulator, so 4 vector instructions per 64 MACs.
// 2 ops per MAC, as the prefill GFLOP/s count them. Returns ops per second of this thread.
constexpr int kPeakChains = 12;

// GCC 12 warns about _mm512_undefined_ps inside its own intrinsics when they are inlined into a function
// with a target attribute (the merge-masking source it leaves undefined on purpose).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
__attribute__((target("avx512f,avx512vnni,avx512bw"))) double int8_peak_thread(bool scaled, double seconds) {
  __m512i acc[kPeakChains];
  __m512 facc[kPeakChains];
  for (int i = 0; i < kPeakChains; ++i) {
    acc[i] = _mm512_set1_epi32(i);
    facc[i] = _mm512_set1_ps(static_cast<float>(i));
  }
  const __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
  __m512 sc = _mm512_set1_ps(1.0f), d = _mm512_set1_ps(0.5f);
  uint64_t iters = 0;
  const double t0 = now_s();
  double t = t0;
  while (t - t0 < seconds) {
    for (int r = 0; r < 256; ++r) {
      if (scaled) {
        for (int i = 0; i < kPeakChains; ++i) {
          const __m512i s = _mm512_dpbusd_epi32(acc[i], w, x);
          facc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(sc, d), facc[i]);
        }
        __asm__ volatile("" : "+v"(sc), "+v"(d));  // the scale product is recomputed every time, as in the GEMM
      } else {
        for (int i = 0; i < kPeakChains; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], w, x);
      }
    }
    iters += 256;
    t = now_s();
  }
  alignas(64) int32_t a[16];
  alignas(64) float f[16];
  _mm512_store_si512(a, acc[0]);
  _mm512_store_ps(f, facc[0]);
  for (int i = 1; i < kPeakChains; ++i) {
    alignas(64) int32_t ai[16];
    alignas(64) float fi[16];
    _mm512_store_si512(ai, acc[i]);
    _mm512_store_ps(fi, facc[i]);
    a[0] += ai[i], f[0] += fi[i];
  }
  if (a[0] == 42 && f[0] == 42.0f) std::fprintf(stderr, " ");  // keep the chains alive
  return static_cast<double>(iters) * kPeakChains * 64 * 2 / (t - t0);
}
#pragma GCC diagnostic pop

}  // namespace

Int8Peak measure_int8_peak(int threads) {
  Int8Peak p;
  if (!__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512bw")) return p;
  for (int scaled = 0; scaled < 2; ++scaled) {
    double best = 0;
    for (int k = 0; k < 3; ++k) {
      std::vector<double> r(static_cast<size_t>(threads));
      std::vector<std::thread> ts;
      for (int i = 0; i < threads; ++i) ts.emplace_back([&, i] { r[static_cast<size_t>(i)] = int8_peak_thread(scaled != 0, 0.1); });
      for (auto& th : ts) th.join();
      double sum = 0;
      for (double v : r) sum += v;
      best = std::max(best, sum);
    }
    (scaled ? p.scaled : p.raw) = best;
  }
  return p;
}

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
  // Per-core L2 and the L3 as cpu0 sees them (sysfs; "?" where the kernel does not say).
  std::string l2 = "?", l3 = "?";
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream lf(dir + "level"), sf(dir + "size");
    int level = 0;
    std::string size;
    if (!(lf >> level) || !(sf >> size)) continue;
    if (level == 2) l2 = size;
    if (level == 3) l3 = size;
  }
  char buf[640];
  std::snprintf(buf, sizeof buf, "%s, %u logical CPUs, L2 %s per core, L3 %s, %.0f GiB RAM, AVX-512 %s (bf16 %s, VNNI %s), AMX %s",
                cpu.c_str(), std::thread::hardware_concurrency(), l2.c_str(), l3.c_str(), mem_kb / 1048576.0,
                avx512 ? "yes" : "no", bf16 ? "yes" : "no", vnni ? "yes" : "no", amx ? "yes" : "no");
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

void print_table(const std::vector<Row>& rows) {
  // Markdown table, ready for docs/performance.md.
  std::printf("\n| phase | kvpack tok/s | llama.cpp tok/s | kvpack / llama.cpp | GB/s | bytes/token | roofline tok/s | kvpack %% of roofline | "
              "llama.cpp %% of roofline |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Row& r : rows) {
    const double roof = r.bw / r.bytes_per_token, ll_roof = (r.ll_bw > 0 ? r.ll_bw : r.bw) / r.bytes_per_token;
    std::printf("| %s %s=%d | %s | %s | %s | %.1f | %s | %.1f | %s | %s |\n", r.phase.c_str(), r.phase == "prefill" ? "n" : "depth", r.n,
                tps(r.kv_tps).c_str(), tps(r.ll_tps).c_str(), ratio(r.kv_tps, r.ll_tps).c_str(), r.bw / 1e9, gib(r.bytes_per_token).c_str(),
                roof, pct(r.kv_tps, roof).c_str(), r.phase.rfind("decode-", 0) == 0 ? "(full KV)" : pct(r.ll_tps, ll_roof).c_str());
  }
  for (const Row& r : rows)
    if (r.phase == "prefill" || r.phase.rfind("decode-", 0) == 0 || r.phase.rfind("batch-", 0) == 0) std::printf("\n%s %s=%d:%s.\n", r.phase.c_str(), r.phase == "prefill" ? "n" : "depth", r.n, r.extra.c_str());
}

}  // namespace kvpack::cli::bench_peer
