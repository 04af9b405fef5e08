// matmul throughput at Qwen3-0.6B shapes next to a plain memory-bandwidth measurement, so the weight
// streaming rate of the decode GEMV can be read against the machine's roofline.
//
//   bench_matmul [--benchmark_filter=REGEX] [--benchmark_min_time=0.2]
//
// Benchmarks (every ISA path the CPU supports is registered separately; KVPACK_ISA is not consulted):
//   stream_sum/threads:T            read bandwidth: sum of a 512 MB buffer           -> "bytes" rate
//   gemv/TYPE/NINxNOUT/ISA/threads:T  n_tokens = 1: y = W x                           -> "weights" rate
//   gemv/Q8_0P|Q4_KP/.../threads:2/interleaved: the packed GEMV on a pool with the old task order
//   prefill/TYPE/NINxNOUT/tok:N/ISA/threads:T                                         -> "flops" rate
// TYPE: F16, Q8_0, BF16, Q4_0, Q4_K, F32, Q6_K, Q5_K, Q3_K, Q2_K, IQ4_XS, Q5_0, Q5_1, IQ4_NL.
// Rates are SI (G = 1e9). threads:1 runs are timed by the calling thread's CPU time (it does all the
// work), so they stay meaningful on a shared machine where the thread gets preempted; threads:2 runs use
// wall time and need an otherwise idle machine. Weights rotate over >= 512 MB of copies, so every call streams them from DRAM
// as in real decode (a Qwen3-0.6B step reads 0.6-1.2 GB of weights, far beyond the L3); the F16 LM head
// (311 MB) is already larger than the rotation target.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_main.h"
#include "kernels/cpu_features.h"
#include "kernels/matmul.h"
#include "kernels/matmul_packed.h"
#include "util/thread_pool.h"

namespace {

using kvpack::DType;
using kvpack::ThreadPool;
using namespace kvpack::kernels;

constexpr size_t kRotateBytes = size_t{512} << 20;

// threads = -2: two threads with the pool's Interleaved task order (one shared counter; ThreadPool::Order),
// the baseline of the default Partitioned order.
ThreadPool* pool_for(int threads) {
  static ThreadPool p1(1), p2(2), p2_interleaved(2, ThreadPool::Order::Interleaved);
  return threads == -2 ? &p2_interleaved : threads <= 1 ? &p1 : &p2;
}

// n_copies back-to-back copies of one weight matrix (64 distinct random rows, tiled).
struct WeightSet {
  DType type = DType::F32;
  int64_t n_out = 0, n_in = 0;
  size_t matrix_bytes = 0;
  int64_t n_copies = 0;
  std::unique_ptr<uint8_t[]> mem;
  const uint8_t* base = nullptr;
  const void* copy(int64_t i) const { return base + static_cast<size_t>(i % n_copies) * matrix_bytes; }
};

const WeightSet& weights(DType type, int64_t n_out, int64_t n_in) {
  static WeightSet ws;  // one set alive at a time (the benchmarks are registered grouped by shape)
  if (ws.mem && ws.type == type && ws.n_out == n_out && ws.n_in == n_in) return ws;
  ws.mem.reset();
  ws.type = type;
  ws.n_out = n_out;
  ws.n_in = n_in;
  const size_t rb = kvpack::row_bytes(type, n_in);
  ws.matrix_bytes = rb * n_out;
  ws.n_copies = std::max<int64_t>(1, (kRotateBytes + ws.matrix_bytes - 1) / ws.matrix_bytes);
  const size_t total = ws.matrix_bytes * ws.n_copies;
  ws.mem.reset(new uint8_t[total + 64]);
  ws.base = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(ws.mem.get()) + 63) & ~uintptr_t{63});
  std::mt19937 rng(42);
  std::normal_distribution<float> g(0.0f, 0.05f);
  constexpr int kPattern = 64;
  std::vector<uint8_t> pattern(rb * kPattern);
  std::vector<float> row(n_in);
  for (int r = 0; r < kPattern; ++r) {
    for (auto& v : row) v = g(rng);
    quantize_row(row.data(), type, n_in, pattern.data() + r * rb);
  }
  uint8_t* dst = const_cast<uint8_t*>(ws.base);
  for (int64_t r = 0; r < n_out * ws.n_copies; ++r) std::memcpy(dst + r * rb, pattern.data() + (r % kPattern) * rb, rb);
  return ws;
}

std::vector<float> activations(int64_t n) {
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = g(rng);
  return x;
}

// Runs `call` (one matmul into y) per iteration and sets the "weights" (bytes of one matrix per call) and,
// for several tokens, "flops" rates.
template <class F>
void time_calls(benchmark::State& state, size_t matrix_bytes, int64_t n_in, int64_t n_out, int64_t n_tok,
                std::vector<float>& y, F&& call) {
  for (auto _ : state) {
    call();
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["weights"] = benchmark::Counter(iters * static_cast<double>(matrix_bytes), benchmark::Counter::kIsRate);
  if (n_tok > 1)
    state.counters["flops"] = benchmark::Counter(iters * 2.0 * n_in * n_out * n_tok, benchmark::Counter::kIsRate);
}

void bm_matmul(benchmark::State& state, Isa isa, DType type, int64_t n_in, int64_t n_out, int64_t n_tok, int threads) {
  const WeightSet& ws = weights(type, n_out, n_in);
  const std::vector<float> x = activations(n_in * n_tok);
  std::vector<float> y(n_out * n_tok);
  ThreadPool* pool = pool_for(threads);
  int64_t i = 0;
  time_calls(state, ws.matrix_bytes, n_in, n_out, n_tok, y, [&] {
    matmul_with_isa(isa, ws.copy(i++), type, n_out, n_in, x.data(), n_tok, y.data(), pool);
  });
}

// The same Q8_0 (Q4_K) matrices in the packed 16-row layout (kernels/matmul_packed.h), one packed copy per
// rotated copy, so the GEMV streams from DRAM as the row-layout one does. "weights" counts the file's bytes
// (the row layout's), so the rates compare with the row-layout rows of the same type.
template <class P, DType kType>
void bm_packed(benchmark::State& state, Isa isa, int64_t n_in, int64_t n_out, int64_t n_tok, int threads) {
  static std::vector<P> packed;
  static int64_t packed_in = 0, packed_out = 0;
  const WeightSet& ws = weights(kType, n_out, n_in);
  if (packed_in != n_in || packed_out != n_out) {
    packed.clear();
    for (int64_t c = 0; c < ws.n_copies; ++c) {
      if constexpr (kType == DType::Q8_0) packed.push_back(pack_q8_0(ws.copy(c), n_out, n_in));
      else packed.push_back(pack_q4_k(ws.copy(c), n_out, n_in));
    }
    packed_in = n_in;
    packed_out = n_out;
  }
  const std::vector<float> x = activations(n_in * n_tok);
  std::vector<float> y(n_out * n_tok);
  ThreadPool* pool = pool_for(threads);
  size_t i = 0;
  time_calls(state, ws.matrix_bytes, n_in, n_out, n_tok, y, [&] {
    matmul_packed(packed[i++ % packed.size()], x.data(), n_tok, y.data(), pool, isa);
  });
}

// Read bandwidth: sum 64-bit words of a 512 MB buffer, split over the pool's threads.
void bm_stream_sum(benchmark::State& state, int threads) {
  static std::vector<uint64_t> buf = [] {
    std::vector<uint64_t> b(kRotateBytes / sizeof(uint64_t));
    for (size_t k = 0; k < b.size(); ++k) b[k] = k * 0x9E3779B97F4A7C15ull;
    return b;
  }();
  ThreadPool* pool = pool_for(threads);
  uint64_t part[64] = {};
  for (auto _ : state) {
    pool->run(threads, [&](int task, int) {
      const auto [lo, hi] = kvpack::split_range(static_cast<int64_t>(buf.size()), threads, task, 8);
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (int64_t k = lo; k < hi; k += 4) {
        s0 += buf[k];
        s1 += buf[k + 1];
        s2 += buf[k + 2];
        s3 += buf[k + 3];
      }
      part[task * 8] = s0 + s1 + s2 + s3;
    });
    benchmark::DoNotOptimize(part);
  }
  state.counters["bytes"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * kRotateBytes, benchmark::Counter::kIsRate);
}

struct Shape {
  const char* what;
  int64_t n_in, n_out;
};
// Qwen3-0.6B: hidden 1024, 16 q heads x 128 = 2048, ffn 3072, vocab 151936.
constexpr Shape kShapes[] = {
    {"q_proj", 1024, 2048}, {"ffn_up", 1024, 3072}, {"ffn_down", 3072, 1024}, {"lm_head", 1024, 151936}};

void register_all() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::Avx512, Isa::Avx2, Isa::Scalar})
    if (cpu_supports(isa)) isas.push_back(isa);
  // threads:1 -> CPU time of the calling thread (robust to preemption), threads:2 -> wall time.
  auto timing = [](benchmark::internal::Benchmark* b, int threads) {
    if (threads > 1) b->UseRealTime();
    return b;
  };
  for (int threads : {1, 2})
    timing(benchmark::RegisterBenchmark(("stream_sum/threads:" + std::to_string(threads)).c_str(), bm_stream_sum,
                                        threads),
           threads)
        ->Unit(benchmark::kMillisecond);
  for (DType type : {DType::F16, DType::Q8_0, DType::BF16, DType::Q4_0, DType::Q4_K, DType::F32, DType::Q6_K, DType::Q5_K,
                     DType::Q3_K, DType::Q2_K, DType::IQ4_XS, DType::Q5_0, DType::Q5_1, DType::IQ4_NL}) {
    for (const Shape& s : kShapes) {
      for (Isa isa : isas) {
        for (int threads : {1, 2}) {
          const std::string name = "gemv/" + std::string(kvpack::dtype_name(type)) + "/" + s.what + "_" +
                                   std::to_string(s.n_in) + "x" + std::to_string(s.n_out) + "/" + isa_name(isa) +
                                   "/threads:" + std::to_string(threads);
          timing(benchmark::RegisterBenchmark(name.c_str(), bm_matmul, isa, type, s.n_in, s.n_out, int64_t{1}, threads),
                 threads)
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
    // Prefill / batched decode: several tokens per weight pass. threads:1 (CPU time of the calling thread,
    // which does all the work) is the number to compare on a shared machine; threads:2 needs an idle one.
    for (int64_t n_tok : {4, 8, 64}) {
      for (Isa isa : isas) {
        for (int threads : {1, 2}) {
          const std::string name = "prefill/" + std::string(kvpack::dtype_name(type)) + "/ffn_up_1024x3072/tok:" +
                                   std::to_string(n_tok) + "/" + isa_name(isa) + "/threads:" + std::to_string(threads);
          timing(benchmark::RegisterBenchmark(name.c_str(), bm_matmul, isa, type, int64_t{1024}, int64_t{3072}, n_tok,
                                              threads),
                 threads)
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
  // Packed Q8_0 ("Q8_0P") and Q4_K ("Q4_KP"), AVX-512 only (the layouts have no AVX2 kernel).
  if (cpu_supports(Isa::Avx512)) {
    // Beside the row-layout shapes: k_proj / v_proj, and Q|K|V and gate|up as one matrix each.
    constexpr Shape kPackedShapes[] = {{"q_proj", 1024, 2048},   {"ffn_up", 1024, 3072}, {"ffn_down", 3072, 1024},
                                       {"lm_head", 1024, 151936}, {"kv_proj", 1024, 1024}, {"qkv_proj", 1024, 4096},
                                       {"gate_up", 1024, 6144}};
    using Fn = void (*)(benchmark::State&, Isa, int64_t, int64_t, int64_t, int);
    const std::pair<const char*, Fn> kinds[] = {{"Q8_0P", bm_packed<PackedQ8, DType::Q8_0>}, {"Q4_KP", bm_packed<PackedQ4K, DType::Q4_K>}};
    for (const auto& [kind, fn] : kinds) {
      // threads:2/interleaved: the same two threads with the pool's old task order, side by side.
      for (const Shape& s : kPackedShapes)
        for (int threads : {1, 2, -2}) {
          const std::string name = "gemv/" + std::string(kind) + "/" + std::string(s.what) + "_" + std::to_string(s.n_in) + "x" +
                                   std::to_string(s.n_out) + "/avx512/threads:" + std::to_string(std::abs(threads)) +
                                   (threads < 0 ? "/interleaved" : "");
          timing(benchmark::RegisterBenchmark(name.c_str(), fn, Isa::Avx512, s.n_in, s.n_out, int64_t{1}, threads),
                 std::abs(threads))
              ->Unit(benchmark::kMicrosecond);
        }
      for (int64_t n_tok : {4, 8, 64})
        for (int threads : {1, 2}) {
          const std::string name = "prefill/" + std::string(kind) + "/ffn_up_1024x3072/tok:" + std::to_string(n_tok) +
                                   "/avx512/threads:" + std::to_string(threads);
          timing(benchmark::RegisterBenchmark(name.c_str(), fn, Isa::Avx512, int64_t{1024}, int64_t{3072}, n_tok, threads),
                 threads)
              ->Unit(benchmark::kMicrosecond);
        }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  return kvpack::bench::run_benchmarks(argc, argv, "kvpack_best_isa", std::string(isa_name(best_isa())), register_all);
}
