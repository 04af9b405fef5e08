#!/usr/bin/env bash
# Fresh machine -> installs dependencies, builds and runs every test twice: an optimised build, and a
# Debug build with AddressSanitizer + UndefinedBehaviorSanitizer (debug invariant checks on); then the
# engine, KV and server tests under ThreadSanitizer, bounded fuzzing and a 60-second soak of `kvpack serve`.
# Reference data is read from ../shared (KVPACK_SHARED_DIR to override).
set -euo pipefail
cd "$(dirname "$0")/.."
# One line per phase with the seconds since the start, so a CI log says where the time went.
phase() { echo "== test.sh [${SECONDS} s] $*"; }
phase "install dependencies"
scripts/install-deps.sh
jobs=$(nproc)
# lld links the ~65 test executables of each build in a third of the time ld.bfd takes (install-deps.sh installs it).
link=()
if command -v ld.lld >/dev/null; then link=(-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld); fi
shared=${KVPACK_SHARED_DIR:-$(cd .. && pwd)/shared}
# KVPACK_BUILD_TESTS=ON explicitly: scripts/quickstart.sh configures the same build/ with tests OFF (cached)
phase "optimised build"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKVPACK_BUILD_TESTS=ON -DKVPACK_SHARED_DIR="$shared" "${link[@]}" >/dev/null
cmake --build build -j"$jobs"
# llama.cpp's own tools (llama-quantize, llama-tokenize, llama_logits) from the llama.cpp release bundled in
# the node-llama-cpp npm package: real quantised files and logit parity (ctest llama_cpp_quantized_files),
# and the tokenizer vectors of its source tree (tokenizer_vocab_test).
phase "llama.cpp tools"
if command -v npm >/dev/null; then
  # A peer tool that fails to build must not hide the engine's own results: the checks that need it skip (77).
  scripts/peer/build_llama_tools.sh build-llama >/dev/null ||
    echo "test.sh: llama.cpp's tools did not build (build-llama/*.log): the llama.cpp file checks will be skipped" >&2
else
  echo "test.sh: npm missing: the llama.cpp file and tokenizer checks will be skipped" >&2
fi
phase "optimised tests"
(cd build && ctest --output-on-failure --no-tests=error -j"$jobs")
# -O0 -g1 (line tables: stack traces keep file:line) for the build time, with the numeric layers at -O1
# (KVPACK_SANITIZE_O1_LAYERS in CMakeLists.txt) for the test time; the debug invariant checks
# (KVPACK_DEBUG_CHECKS, set by KVPACK_SANITIZE) stay on. No benchmarks: nothing tests them.
phase "ASan + UBSan build"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O0 -g1" -DKVPACK_SANITIZE=ON \
      -DKVPACK_BUILD_TESTS=ON -DKVPACK_BUILD_BENCH=OFF -DKVPACK_SHARED_DIR="$shared" "${link[@]}" >/dev/null
cmake --build build-asan -j"$jobs"
phase "ASan + UBSan tests"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure --no-tests=error -j"$jobs" -E "${KVPACK_ASAN_EXCLUDE:-^$}")
# ThreadSanitizer: the scheduler, server and KV tests (the code with threads), built alone so CI pays for
# those targets only (-O1 -g1 throughout: at -O0 the tests' own reference loops ran for minutes under TSan);
# tests/tsan.supp lists documented false positives.
# The single-request numerics tests (reference logits, Q4_K, KV element types) have no threads of their
# own and take minutes under TSan; ASan covers them.
tsan_tests=$(ls tests/*_test.cpp | sed -n -E 's@^.*/((engine|server|kv)_[a-z0-9_]*_test)\.cpp$@\1@p' |
             grep -v -E '^engine_(reference|q4k_model|kv_types)_test$')
cmake -S . -B build-tsan -DKVPACK_SANITIZE=thread -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
      -DKVPACK_BUILD_TESTS=ON -DKVPACK_BUILD_BENCH=OFF -DKVPACK_SHARED_DIR="$shared" "${link[@]}" >/dev/null
phase "TSan build"
# shellcheck disable=SC2086
cmake --build build-tsan -j"$jobs" --target $tsan_tests
supp="$(pwd)/tests/tsan.supp"
phase "TSan tests"
(cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$supp" \
   ctest --output-on-failure --no-tests=error -j"$jobs" -L '^(engine|kv|server)$' -E "${KVPACK_TSAN_EXCLUDE:-^$}")
# Bounded fuzzing: every libFuzzer target (clang + ASan + UBSan) for a few seconds from its committed seeds,
# which include the regression input of every crash found so far (docs/reliability.md has the long run).
phase "fuzzing"
scripts/fuzz.sh "${KVPACK_FUZZ_SECONDS:-8}"
# Soak: 16 concurrent clients for 60 s against `kvpack serve` (every response checked against its solo run,
# pages / counters / RSS / fds / threads at the end; ~75 s in all); the full version is 64 clients for 10
# minutes (docs/reliability.md). A 2 MiB cold tier fills within the 30-s warm-up, so RSS is flat after it.
phase "soak"
/usr/bin/python3 scripts/soak.py --binary build/kvpack --shared "$shared" --clients 16 --duration 60 --warmup 30 --kv-cold host:2M
phase "done"
