// The main() every kernel benchmark shares: Google Benchmark's own, plus one custom context entry (the
// kernel path this machine dispatches to, so a saved result says what it measured). The benchmarks are
// registered at run time (their names depend on the ISAs the CPU has), hence `register_all`.
#pragma once
#include <benchmark/benchmark.h>

#include <string>

namespace kvpack::bench {

inline int run_benchmarks(int argc, char** argv, const std::string& context_key, const std::string& context_value,
                          void (*register_all)()) {
  benchmark::AddCustomContext(context_key, context_value);
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace kvpack::bench
