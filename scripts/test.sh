#!/usr/bin/env bash
# Fresh machine -> installs dependencies, builds and runs every test twice: an optimised build, and a
# Debug build with AddressSanitizer + UndefinedBehaviorSanitizer (debug invariant checks on).
# Reference data is read from ../shared (KVPACK_SHARED_DIR to override).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc)
shared=${KVPACK_SHARED_DIR:-$(cd .. && pwd)/shared}
# KVPACK_BUILD_TESTS=ON explicitly: scripts/quickstart.sh configures the same build/ with tests OFF (cached)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKVPACK_BUILD_TESTS=ON -DKVPACK_SHARED_DIR="$shared" >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure --no-tests=error -j"$jobs")
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVPACK_SANITIZE=ON -DKVPACK_BUILD_TESTS=ON -DKVPACK_SHARED_DIR="$shared" >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure --no-tests=error -j"$jobs" -E "${KVPACK_ASAN_EXCLUDE:-^$}")
# Bounded fuzzing: every libFuzzer target (clang + ASan + UBSan) for a few seconds from its committed seeds,
# which include the regression input of every crash found so far (docs/reliability.md has the long run).
scripts/fuzz.sh "${KVPACK_FUZZ_SECONDS:-8}"
