// Paged attention throughput, single thread, every instruction-set path this CPU supports.
//
//   bench_attention [--benchmark_filter=REGEX] [--benchmark_min_time=0.2]
//
// Benchmarks (head_dim 128, page_size 16, GQA group 2 unless named; KVPACK_ISA is not consulted):
//   decode/TYPE/slots:N/ISA         n_new = 1 over N slots                          -> "kv" rate (K+V bytes)
//   decode_hot/TYPE/slots:N/ISA     same, one stream reused (cache-resident upper bound)
//   decode/TYPE/slots:N/group:8/ISA
//   prefill/TYPE/ctx:C/new:T/ISA    T new tokens after C cached slots                -> "flops" rate
//   read_roofline/TYPE/slots:N      a plain sum over the same K/V bytes in the same page order -> "kv" rate:
//                                   the memory roofline of the decode rows above, measured in the same run
//                                   (decode "kv" / read_roofline "kv" = the kernel's fraction of roofline).
//   layer/{decode,read}/TYPE/slots:N/pages:{shuffled,runsR,ordered}/threads:2   one layer of decode at depth as
//                                   the engine runs it: 8 KV-head streams as 8 tasks on a 2-thread pool (wall
//                                   time), the kernel's best ISA, and the plain read of the same bytes beside it;
//                                   pages shuffled, in shuffled runs of R consecutive pages (what the PagePool's
//                                   page runs leave when a context grows token by token), or each stream's pages
//                                   in address order (one long prefill into a fresh pool).
// Rates are SI (G = 1e9). The decode streams rotate over >= 256 MB of pages whose order is shuffled within
// a shared pool (unless "ordered"), so every call reads K/V from DRAM as in real decode.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

// GCC 12's _mm512_reduce_add_epi64 trips -Wuninitialized inside its own header (see attention_avx512.cpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "bench_main.h"
#include "kernels/attention.h"
#include "util/half.h"
#include "util/huge_alloc.h"
#include "util/thread_pool.h"

namespace {

using kvpack::DType;
using namespace kvpack::kernels;

constexpr size_t kRotateBytes = size_t{256} << 20;
constexpr int32_t kHeadDim = 128, kPageSize = 16;

// n_streams streams of n_slots slots; all their pages are shuffled together in one pool.
struct Streams {
  DType type = DType::F32;
  int32_t n_slots = 0, n_streams = 0, n_pages = 0;
  size_t page_bytes = 0;
  std::unique_ptr<uint8_t, decltype(&std::free)> mem{nullptr, &std::free};
  std::vector<const uint8_t*> pages;  // [n_streams][n_pages]

  KvStreamView view(int64_t i) const {
    KvStreamView kv;
    kv.pages = pages.data() + static_cast<size_t>(i % n_streams) * n_pages;
    kv.n_slots = n_slots;
    kv.page_size = kPageSize;
    kv.head_dim = kHeadDim;
    kv.kv_type = type;
    kv.v_offset = page_bytes / 2;
    return kv;
  }
  size_t stream_bytes() const { return static_cast<size_t>(n_slots) * 2 * kv_row_bytes(type, kHeadDim); }
};

// run: the page layout. 1 = every page shuffled; 0 = each stream's pages in address order (one long prefill);
// R > 1 = runs of R consecutive pages, the runs shuffled (what PagePool::allocate_after leaves when many
// streams grow a page at a time).
const Streams& streams(DType type, int32_t n_slots, bool rotate, int32_t run = 1) {
  static Streams s;  // one set alive at a time
  const int32_t want = rotate ? -1 - run : 1;
  static int32_t built_for = 0;
  if (s.mem && s.type == type && s.n_slots == n_slots && built_for == want) return s;
  built_for = want;
  s.mem.reset();
  s.type = type;
  s.n_slots = n_slots;
  s.n_pages = (n_slots + kPageSize - 1) / kPageSize;
  const size_t row_bytes = kv_row_bytes(type, kHeadDim);
  s.page_bytes = 2 * static_cast<size_t>(kPageSize) * row_bytes;
  const size_t sb = s.page_bytes * s.n_pages;
  s.n_streams = rotate ? static_cast<int32_t>(std::max<size_t>(1, (kRotateBytes + sb - 1) / sb)) : 1;
  const size_t total_pages = static_cast<size_t>(s.n_streams) * s.n_pages;
  // On huge pages, as the engine's PagePool places its chunks.
  s.mem.reset(kvpack::huge_alloc(total_pages * s.page_bytes));
  if (!s.mem) std::abort();
  uint8_t* base = s.mem.get();
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint8_t> page(s.page_bytes);
  std::vector<float> row(kHeadDim);
  for (size_t p = 0; p < total_pages; ++p) {
    for (size_t r = 0; r < 2 * static_cast<size_t>(kPageSize); ++r) {
      for (float& x : row) x = u(rng);
      kv_encode_row(row.data(), type, kHeadDim, page.data() + r * row_bytes);
    }
    std::memcpy(base + p * s.page_bytes, page.data(), s.page_bytes);
  }
  std::vector<size_t> perm(total_pages);
  std::iota(perm.begin(), perm.end(), size_t{0});
  if (run > 0) {  // shuffle runs of `run` pages (the last one may be short)
    const size_t r = static_cast<size_t>(run), n_runs = (total_pages + r - 1) / r;
    std::vector<size_t> runs(n_runs);
    std::iota(runs.begin(), runs.end(), size_t{0});
    std::shuffle(runs.begin(), runs.end(), rng);
    size_t k = 0;
    for (size_t q : runs)
      for (size_t p = q * r; p < std::min(total_pages, (q + 1) * r); ++p) perm[k++] = p;
  }
  s.pages.resize(total_pages);
  for (size_t p = 0; p < total_pages; ++p) s.pages[p] = base + perm[p] * s.page_bytes;
  return s;
}

std::vector<float> random_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = g(rng);
  return v;
}

void bm_decode(benchmark::State& state, const char* isa, DType type, int32_t n_slots, int32_t group, bool rotate) {
  const Streams& s = streams(type, n_slots, rotate);
  const std::vector<float> q = random_vec(static_cast<size_t>(group) * kHeadDim, 7);
  std::vector<float> out(q.size());
  std::vector<float> scratch(attention_scratch_floats(1, group, kHeadDim, kPageSize));
  AttentionArgs a;
  a.q = q.data();
  a.q_stride = group * kHeadDim;
  a.out = out.data();
  a.out_stride = group * kHeadDim;
  a.n_new = 1;
  a.group = group;
  a.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  a.scratch = scratch.data();
  int64_t i = 0;
  for (auto _ : state) {
    paged_attention_on(isa, s.view(i++), a);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.counters["kv"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * static_cast<double>(s.stream_bytes()), benchmark::Counter::kIsRate);
}

// Sum of n bytes as 64-bit words (n % 8 == 0): portable, and with 512-bit loads where the CPU has them, so
// the read is not limited by its own instruction count (the scalar loop tops out below the decode kernel).
uint64_t sum_bytes(const uint8_t* p, size_t n) {
  uint64_t w[8] = {};
  size_t k = 0;
  for (; k + 64 <= n; k += 64)
    for (int j = 0; j < 8; ++j) {
      uint64_t x;
      std::memcpy(&x, p + k + 8 * j, sizeof x);
      w[j] += x;
    }
  for (; k < n; k += 8) {
    uint64_t x;
    std::memcpy(&x, p + k, sizeof x);
    w[0] += x;
  }
  uint64_t acc = 0;
  for (uint64_t x : w) acc += x;
  return acc;
}

__attribute__((target("avx512f"))) uint64_t sum_bytes_avx512(const uint8_t* p, size_t n) {
  __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
  size_t k = 0;
  for (; k + 256 <= n; k += 256) {
    a = _mm512_add_epi64(a, _mm512_loadu_si512(p + k));
    b = _mm512_add_epi64(b, _mm512_loadu_si512(p + k + 64));
    c = _mm512_add_epi64(c, _mm512_loadu_si512(p + k + 128));
    d = _mm512_add_epi64(d, _mm512_loadu_si512(p + k + 192));
  }
  for (; k + 64 <= n; k += 64) a = _mm512_add_epi64(a, _mm512_loadu_si512(p + k));
  return _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d))) +
         sum_bytes(p + k, n - k);
}

// Every K then V byte of the stream's visible slots, page by page through its page table, with the kernel's
// own prefetch (K then V of the page kAttentionPrefetchPages ahead, into L2, where kv_page_needs_prefetch
// says): a ceiling, not a handicap.
uint64_t read_stream(const KvStreamView& kv, int32_t n_slots, size_t row_bytes, bool avx512) {
  const int32_t n_pages = (n_slots + kPageSize - 1) / kPageSize;
  const size_t page_span = kv.v_offset + static_cast<size_t>(kPageSize) * row_bytes + 4096;
  uint64_t acc = 0;
  for (int32_t p = 0, left = n_slots; left > 0; ++p, left -= kPageSize) {
    const size_t bytes = static_cast<size_t>(std::min(left, kPageSize)) * row_bytes;
    const int32_t ahead = p + kAttentionPrefetchPages;
    const bool pf = ahead < n_pages && kv_page_needs_prefetch(kv.pages, ahead, page_span);
    for (const size_t off : {size_t{0}, kv.v_offset}) {
      if (pf)
        for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(kv.pages[ahead] + off + o, 0, 1);
      acc += avx512 ? sum_bytes_avx512(kv.pages[p] + off, bytes) : sum_bytes(kv.pages[p] + off, bytes);
    }
  }
  return acc;
}

// Reads exactly the bytes decode reads (K rows then V rows of every visible slot, page by page, through the
// same shuffled page table) and does nothing with them but a running sum: what one thread can pull from DRAM
// over this access pattern, the ceiling for bm_decode on the same streams.
void bm_read_roofline(benchmark::State& state, DType type, int32_t n_slots) {
  const Streams& s = streams(type, n_slots, true);
  const size_t row_bytes = kv_row_bytes(type, kHeadDim);
  const bool avx512 = __builtin_cpu_supports("avx512f");
  int64_t i = 0;
  uint64_t acc = 0;
  for (auto _ : state) {
    acc += read_stream(s.view(i++), n_slots, row_bytes, avx512);
    benchmark::DoNotOptimize(acc);
  }
  state.counters["kv"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * static_cast<double>(s.stream_bytes()), benchmark::Counter::kIsRate);
}

// One layer of decode at depth on a 2-thread pool: kKvHeads streams (Qwen3-0.6B: 8 KV heads, group 2) as
// kKvHeads tasks, as the forward splits attention; `read` = the plain sum of the same bytes instead.
constexpr int kKvHeads = 8;

void bm_layer(benchmark::State& state, const char* isa, DType type, int32_t n_slots, int32_t run, bool read) {
  const Streams& s = streams(type, n_slots, true, run);
  static kvpack::ThreadPool pool(2);
  const int32_t group = 2;
  const std::vector<float> q = random_vec(static_cast<size_t>(group) * kHeadDim, 7);
  std::vector<std::vector<float>> out(kKvHeads, std::vector<float>(q.size()));
  std::vector<std::vector<float>> scratch(kKvHeads, std::vector<float>(attention_scratch_floats(1, group, kHeadDim, kPageSize)));
  const size_t row_bytes = kv_row_bytes(type, kHeadDim);
  const bool avx512 = __builtin_cpu_supports("avx512f");
  uint64_t sums[kKvHeads * 8] = {};
  int64_t i = 0;
  for (auto _ : state) {
    pool.run(kKvHeads, [&](int t, int) {
      const KvStreamView kv = s.view(i * kKvHeads + t);
      if (read) {
        sums[t * 8] += read_stream(kv, n_slots, row_bytes, avx512);
        return;
      }
      AttentionArgs a;
      a.q = q.data();
      a.q_stride = group * kHeadDim;
      a.out = out[static_cast<size_t>(t)].data();
      a.out_stride = group * kHeadDim;
      a.n_new = 1;
      a.group = group;
      a.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
      a.scratch = scratch[static_cast<size_t>(t)].data();
      paged_attention_on(isa, kv, a);
    });
    ++i;
    benchmark::DoNotOptimize(sums);
    benchmark::ClobberMemory();
  }
  state.counters["kv"] = benchmark::Counter(static_cast<double>(state.iterations()) * kKvHeads * static_cast<double>(s.stream_bytes()),
                                            benchmark::Counter::kIsRate);
}

void bm_prefill(benchmark::State& state, const char* isa, DType type, int32_t ctx, int32_t n_new, int32_t group) {
  const Streams& s = streams(type, ctx + n_new, false);
  const int64_t row = static_cast<int64_t>(group) * kHeadDim;
  const std::vector<float> q = random_vec(static_cast<size_t>(n_new) * row, 9);
  std::vector<float> out(q.size());
  std::vector<float> scratch(attention_scratch_floats(n_new, group, kHeadDim, kPageSize));
  AttentionArgs a;
  a.q = q.data();
  a.q_stride = row;
  a.out = out.data();
  a.out_stride = row;
  a.n_new = n_new;
  a.group = group;
  a.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  a.scratch = scratch.data();
  for (auto _ : state) {
    paged_attention_on(isa, s.view(0), a);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  // QK and PV: 2 flops per multiply-add, head_dim each, over every visible (query row, slot) pair.
  const double pairs = static_cast<double>(group) * (static_cast<double>(n_new) * ctx + 0.5 * n_new * (n_new + 1));
  state.counters["flops"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * pairs * 4.0 * kHeadDim, benchmark::Counter::kIsRate);
}

void register_all() {
  std::vector<const char*> isas;
  for (const char* isa : {"avx512", "avx2", "scalar"})
    if (attention_isa_available(isa)) isas.push_back(isa);
  for (DType type : {DType::F16, DType::F32, DType::BF16, DType::Q8_0}) {
    const std::string tn = std::string(kvpack::dtype_name(type));
    for (int32_t slots : {2048, 8192, 16384}) {
      benchmark::RegisterBenchmark(("read_roofline/" + tn + "/slots:" + std::to_string(slots)).c_str(),
                                   bm_read_roofline, type, slots)
          ->Unit(benchmark::kMicrosecond);
      for (const char* isa : isas) {
        const std::string sl = "/slots:" + std::to_string(slots) + "/";
        benchmark::RegisterBenchmark(("decode/" + tn + sl + isa).c_str(), bm_decode, isa, type, slots, 2, true)
            ->Unit(benchmark::kMicrosecond);
        benchmark::RegisterBenchmark(("decode_hot/" + tn + sl + isa).c_str(), bm_decode, isa, type, slots, 2, false)
            ->Unit(benchmark::kMicrosecond);
        if (slots == 8192)
          benchmark::RegisterBenchmark(("decode/" + tn + sl + "group:8/" + isa).c_str(), bm_decode, isa, type, slots, 8,
                                       true)
              ->Unit(benchmark::kMicrosecond);
      }
    }
    for (const char* isa : isas)
      benchmark::RegisterBenchmark(("prefill/" + tn + "/ctx:2048/new:128/" + isa).c_str(), bm_prefill, isa, type, 2048,
                                   128, 2)
          ->Unit(benchmark::kMillisecond);
    for (int32_t slots : {8192, 16384})
      for (const int32_t run : {1, 8, 16, 32, 64, 0})
        for (const bool read : {true, false}) {
          const std::string layout = run == 1 ? "shuffled" : run == 0 ? "ordered" : "runs" + std::to_string(run);
          const std::string name = std::string("layer/") + (read ? "read/" : "decode/") + tn + "/slots:" + std::to_string(slots) +
                                   "/pages:" + layout + "/threads:2";
          benchmark::RegisterBenchmark(name.c_str(), bm_layer, isas[0], type, slots, run, read)
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond);
        }
  }
}

}  // namespace

int main(int argc, char** argv) {
  return kvpack::bench::run_benchmarks(argc, argv, "kvpack_attention_isa", std::string(attention_isa()), register_all);
}
