#!/usr/bin/env bash
# Fresh machine -> installs dependencies, builds (Release) and runs the main job: text generation with
# the embedded default model, KV statistics on stderr. Extra arguments go to `kvpack generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DKVPACK_BUILD_TESTS=OFF >/dev/null
cmake --build build -j"$(nproc)" --target kvpack
./build/kvpack generate -p "Once upon a time" -n 64 "$@"
