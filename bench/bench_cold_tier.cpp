// The cold KV tier (kv/cold_tier.h): put and get throughput of 8 KiB records per backend, next to the
// machine's memcpy and sequential-read bandwidth measured in the same run.
//   build/bench/bench_cold_tier [--benchmark_filter=...]   (KVPACK_COLD_BENCH_DIR: where the dir tier and
//   the read probe put their files; default /tmp)
// The dir tier's file was just written, so its reads come from the page cache unless memory is short:
// compare them with BM_SequentialReadProbe's resident_fraction to know which one you are looking at.
#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kv/cold_tier.h"
#include "kv/cold_tier_file.h"
#include "kv/cold_tier_host.h"

namespace {

using namespace kvpack::kv;

constexpr size_t kRecord = 8192;
constexpr size_t kRecords = 8192;  // 64 MiB of records
constexpr size_t kRun = 64;        // records per batched call (a swapped-out sequence's pages)

std::string bench_dir() {
  const char* base = std::getenv("KVPACK_COLD_BENCH_DIR");
  std::string tmpl = std::string(base ? base : "/tmp") + "/kvpack-cold-bench-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed in " + tmpl);
  return tmpl;
}

struct TierUnderTest {
  std::string dir;
  std::unique_ptr<ColdTier> tier;
  std::vector<uint8_t> records = std::vector<uint8_t>(kRun * kRecord);
  std::vector<const uint8_t*> in;
  std::vector<uint8_t*> out;

  explicit TierUnderTest(bool file) {
    std::mt19937_64 rng(1);
    for (auto& b : records) b = static_cast<uint8_t>(rng());
    for (size_t i = 0; i < kRun; ++i) {
      in.push_back(records.data() + i * kRecord);
      out.push_back(records.data() + i * kRecord);  // reads land on the same bytes: no extra cache footprint
    }
    const uint64_t cap = kRecords * (kRecord + 64);
    if (file) {
      dir = bench_dir();
      tier = make_cold_tier("dir:" + dir + ":" + std::to_string(cap), kRecord);
    } else {
      tier = make_cold_tier("host:" + std::to_string(cap), kRecord);
    }
  }
  ~TierUnderTest() {
    tier.reset();
    if (!dir.empty()) std::filesystem::remove_all(dir);
  }
  void put_run(uint64_t first_key) {
    uint64_t keys[kRun];
    bool ok[kRun];
    for (size_t i = 0; i < kRun; ++i) keys[i] = first_key + i;
    tier->put_many(keys, in, ok);
  }
  void fill() {
    for (uint64_t k = 0; k < kRecords; k += kRun) put_run(k);
    tier->flush();
  }
};

void report(benchmark::State& state, const ColdTier& tier, size_t records_per_iteration) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * records_per_iteration * kRecord));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * records_per_iteration));
  const ColdTierStats st = tier.stats();
  state.counters["evictions"] = static_cast<double>(st.evictions);
  state.counters["misses"] = static_cast<double>(st.misses);
}

// put(): one record at a time, keys cycling over twice the cap (so evictions run too). For "dir" the
// stage fills within the first ~2000 puts and from then on puts run at the writer's pace; the final
// flush is inside the timing.
void BM_ColdTierPut(benchmark::State& state) {
  TierUnderTest t(state.range(0) != 0);
  uint64_t key = 0;
  for (auto _ : state) {
    const uint8_t* record = t.in[key % kRun];
    benchmark::DoNotOptimize(t.tier->put(key % (2 * kRecords), {record, kRecord}));
    ++key;
  }
  t.tier->flush();
  report(state, *t.tier, 1);
}

// put_many() of runs of 64 consecutive keys (a preempted sequence going out).
void BM_ColdTierPutMany(benchmark::State& state) {
  TierUnderTest t(state.range(0) != 0);
  uint64_t key = 0;
  for (auto _ : state) {
    t.put_run(key % (2 * kRecords));
    key += kRun;
  }
  t.tier->flush();
  report(state, *t.tier, kRun);
}

// get(): one record at a time at random keys (all present).
void BM_ColdTierGet(benchmark::State& state) {
  TierUnderTest t(state.range(0) != 0);
  t.fill();
  std::mt19937_64 rng(2);
  for (auto _ : state) {
    benchmark::DoNotOptimize(t.tier->get(rng() % kRecords, {t.out[0], kRecord}));
  }
  report(state, *t.tier, 1);
}

// get_many() of a run of 64 consecutive keys written together (a sequence coming back: one preadv).
void BM_ColdTierGetManyRun(benchmark::State& state) {
  TierUnderTest t(state.range(0) != 0);
  t.fill();
  std::mt19937_64 rng(3);
  uint64_t keys[kRun];
  bool ok[kRun];
  for (auto _ : state) {
    const uint64_t first = rng() % (kRecords / kRun) * kRun;
    for (size_t i = 0; i < kRun; ++i) keys[i] = first + i;
    t.tier->get_many(keys, t.out, ok);
  }
  report(state, *t.tier, kRun);
}

// The same from the device, for runs of state.range(0) records: the data file's pages are dropped from the
// page cache before each call (outside the timing). Compare with BM_SequentialReadProbe (a
// resident_fraction of 0 means it, too, read the device).
void BM_ColdTierGetManyRunCold(benchmark::State& state) {
  TierUnderTest t(true);
  t.fill();
  auto& file = static_cast<FileColdTier&>(*t.tier);
  const size_t run = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> buffer(run * kRecord);
  std::vector<uint8_t*> out;
  for (size_t i = 0; i < run; ++i) out.push_back(buffer.data() + i * kRecord);
  std::vector<uint64_t> keys(run);
  std::unique_ptr<bool[]> ok(new bool[run]);
  std::mt19937_64 rng(4);
  for (auto _ : state) {
    state.PauseTiming();
    file.drop_page_cache();
    state.ResumeTiming();
    const uint64_t first = rng() % (kRecords / run) * run;
    for (size_t i = 0; i < run; ++i) keys[i] = first + i;
    t.tier->get_many(keys, out, {ok.get(), run});
  }
  report(state, *t.tier, run);
}
BENCHMARK(BM_ColdTierGetManyRunCold)->ArgName("run")->Arg(64)->Arg(1024)->UseRealTime();

#define COLD_TIER_BACKENDS ArgName("file")->Arg(0)->Arg(1)->UseRealTime()
BENCHMARK(BM_ColdTierPut)->COLD_TIER_BACKENDS;
BENCHMARK(BM_ColdTierPutMany)->COLD_TIER_BACKENDS;
BENCHMARK(BM_ColdTierGet)->COLD_TIER_BACKENDS;
BENCHMARK(BM_ColdTierGetManyRun)->COLD_TIER_BACKENDS;

// The reference rates (one measurement per run; see their comments in cold_tier_host.h / _file.h).
void BM_MemcpyProbe(benchmark::State& state) {
  for (auto _ : state) state.counters["GB/s"] = measure_memcpy_gbps(size_t{256} << 20);
}
void BM_SequentialReadProbe(benchmark::State& state) {
  const std::string dir = bench_dir();
  for (auto _ : state) {
    const SequentialReadMeasurement m = measure_sequential_read(dir, size_t{512} << 20);
    state.counters["GB/s"] = m.gbps;
    state.counters["resident_fraction"] = m.resident_fraction;
  }
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_MemcpyProbe)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SequentialReadProbe)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
