#!/usr/bin/env bash
# The official OpenAI Node SDK (npm `openai`, installed here into a cache directory) against a real
# `kvpack serve` on a loopback port: tests/js/openai_client_check.mjs. Exit 77 (ctest: skipped) when
# node/npm are missing or the npm registry cannot be reached, saying so.
#   scripts/openai_client_test.sh KVPACK SHARED_DIR [NODE_DIR]
set -euo pipefail
kvpack=$1 shared=$2
src=$(cd "$(dirname "$0")/.." && pwd)
node_dir=${3:-${XDG_CACHE_HOME:-$HOME/.cache}/kvpack/js-clients}
work=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

command -v node >/dev/null && command -v npm >/dev/null || { echo "SKIP: node and npm are needed"; exit 77; }
mkdir -p "$node_dir"
cp "$src/tests/js/package.json" "$node_dir/package.json"
if [ ! -f "$node_dir/node_modules/openai/package.json" ] ||
   [ "$(node -p "require('$node_dir/node_modules/openai/package.json').version")" != "6.49.0" ]; then
  if ! (cd "$node_dir" && timeout 300 npm install --no-audit --no-fund --silent >"$work/npm.log" 2>&1); then
    tail -5 "$work/npm.log"
    echo "SKIP: npm install openai@6.49.0 failed (no registry access?)"
    exit 77
  fi
fi
cp "$src/tests/js/openai_client_check.mjs" "$node_dir/"

"$kvpack" serve -m "$shared/models/stories260K.gguf" -t 1 --port 0 2>"$work/serve.err" &
pid=$!
port=
for _ in $(seq 200); do
  port=$(sed -n 's/.*on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$work/serve.err" | head -1)
  [ -n "$port" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/serve.err"; echo "kvpack serve exited"; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { cat "$work/serve.err"; echo "kvpack serve did not start"; exit 1; }
node "$node_dir/openai_client_check.mjs" "http://127.0.0.1:$port/v1"
