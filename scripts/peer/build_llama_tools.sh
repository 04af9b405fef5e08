#!/usr/bin/env bash
# Builds llama.cpp's own tools from the llama.cpp release bundled in the node-llama-cpp npm package (the
# package the peer benchmark already uses; its llama/gitRelease.bundle is a git bundle of that release, so
# no network beyond the npm registry): llama-quantize (real K-quant / IQ files as users download them),
# llama-tokenize, and scripts/peer/llama_logits.cpp (teacher-forced logits for `kvpack eval parity`).
#   scripts/peer/build_llama_tools.sh [BUILD_DIR]        (default: build-llama; prints the bin directory)
# Idempotent: a second run rebuilds only what changed. Takes ~10 minutes on 2 cores the first time.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
peer="$root/scripts/peer"
out=$(mkdir -p "${1:-$root/build-llama}" && cd "${1:-$root/build-llama}" && pwd)
jobs=${KVPACK_LLAMA_JOBS:-$(nproc)}
log() { echo "[build_llama_tools] $*" >&2; }

bundle="$peer/node_modules/node-llama-cpp/llama/gitRelease.bundle"
if [ ! -f "$bundle" ]; then
  log "installing node-llama-cpp (scripts/peer/package.json) for its llama.cpp source"
  (cd "$peer" && npm install --omit=optional --ignore-scripts --no-audit --no-fund >&2)
fi
[ -f "$bundle" ] || { log "no llama.cpp source bundle at $bundle"; exit 1; }

src="$out/llama.cpp"
if [ ! -f "$src/CMakeLists.txt" ]; then
  log "unpacking the llama.cpp source bundle into $src"
  rm -rf "$src"
  git clone -q "$bundle" "$src" 2>/dev/null
fi

launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
# Static libraries (one self-contained llama_logits binary), this CPU's instruction set (as the peer
# benchmark's source build), nothing that needs the network or a GPU.
cmake -S "$src" -B "$out/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
      -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DGGML_CUDA=OFF "${launcher[@]}" >"$out/cmake.log" 2>&1 ||
  { log "cmake failed (see $out/cmake.log)"; tail -5 "$out/cmake.log" >&2; exit 1; }
cmake --build "$out/build" -j"$jobs" --target llama-quantize llama-tokenize llama >"$out/build.log" 2>&1 ||
  { log "build failed (see $out/build.log)"; tail -20 "$out/build.log" >&2; exit 1; }

bin="$out/build/bin"
libs=("$out/build/src/libllama.a")
for l in ggml ggml-cpu ggml-base; do libs+=("$(find "$out/build/ggml" -name "lib$l.a" | head -1)"); done
omp=()
if grep -q "GGML_OPENMP_ENABLED\|OpenMP_CXX_FOUND:BOOL=TRUE" "$out/build/CMakeCache.txt" 2>/dev/null; then omp=(-fopenmp); fi
if [ ! -x "$bin/llama_logits" ] || [ "$peer/llama_logits.cpp" -nt "$bin/llama_logits" ] || [ "${libs[0]}" -nt "$bin/llama_logits" ]; then
  ${CXX:-g++} -std=c++17 -O2 -I"$src/include" -I"$src/ggml/include" "$peer/llama_logits.cpp" \
      -Wl,--start-group "${libs[@]}" -Wl,--end-group "${omp[@]}" -lpthread -ldl -o "$bin/llama_logits"
fi
for t in llama-quantize llama-tokenize llama_logits; do
  [ -x "$bin/$t" ] || { log "missing $bin/$t"; exit 1; }
done
echo "$bin"
