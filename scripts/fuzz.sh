#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/fuzz_*.cpp; clang++ with ASan + UBSan, every layer instrumented) and
# runs each one for SECONDS (default 60) starting from its committed seeds (fuzz/corpus/<target>/, which
# include the regression inputs of every crash found so far). Fails on any crash, sanitizer report,
# leak, timeout (> 10 s per input) or out-of-memory (one allocation > 1 GiB, or RSS > 2 GiB).
# New inputs the fuzzer finds go to build-fuzz/runs/<target>/corpus, crash reproducers to
# build-fuzz/runs/<target>/crash-*; the repository's corpus is only read.
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]      (docs/reliability.md: the long run)
# KVPACK_FUZZ_RUNS=N also stops each target after N executions (whichever limit comes first).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
shared=${KVPACK_SHARED_DIR:-$(cd .. && pwd)/shared}
build=${KVPACK_FUZZ_BUILD:-build-fuzz}
jobs=${KVPACK_FUZZ_JOBS:-$(nproc)}
# -O1: the usual fuzzing trade-off (fast to build, still fast to run, readable stack traces)
cmake -S . -B "$build" -DKVPACK_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" -DKVPACK_BUILD_TESTS=OFF -DKVPACK_BUILD_BENCH=OFF \
      -DKVPACK_SHARED_DIR="$shared" ${KVPACK_FUZZ_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j"$jobs" --target fuzzers >/dev/null
export KVPACK_SHARED_DIR="$shared"
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in fuzz/fuzz_*.cpp; do targets+=("$(basename "$f" .cpp)"); done
fi
failed=()
printf '%-26s %12s %10s %s\n' target executions exec/s result
for t in "${targets[@]}"; do
  run="$build/runs/$t"
  mkdir -p "$run/corpus"
  log="$run/log.txt"
  rc=0
  "$build/fuzz/$t" -max_total_time="$secs" ${KVPACK_FUZZ_RUNS:+-runs=$KVPACK_FUZZ_RUNS} -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
      -print_final_stats=1 -artifact_prefix="$run/" "$run/corpus" "fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  result=ok
  if [ "$rc" -ne 0 ]; then
    result="FAILED (exit $rc; see $log)"
    failed+=("$t")
    grep -m3 -E "ERROR: |runtime error|SUMMARY" "$log" | sed 's/^/    /' || true
  fi
  printf '%-26s %12s %10s %s\n' "$t" "${execs:-?}" "${rate:-?}" "$result"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: ${#failed[@]} target(s) failed: ${failed[*]}" >&2
  exit 1
fi
