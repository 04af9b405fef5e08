#!/usr/bin/env bash
# The cold tier after a crash: `kvpack serve --kv-cold dir:...` is killed with SIGKILL while requests are in
# flight (records in its file), restarted on the same directory, and must start cleanly (the leftover file
# is discarded) and answer with the same greedy text as a server that never had a tier.
#   scripts/test_cold_restart.sh KVPACK SHARED_DIR
set -euo pipefail
kvpack=$1 shared=$2
model="$shared/models/stories260K.gguf"
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

start() {  # port, extra args...; waits for /health
  local port=$1; shift
  "$kvpack" serve -q -m "$model" --port "$port" --kv-pages 200 --admission watermark "$@" >/dev/null 2>>"$work/serve.err" &
  pids+=($!)
  for _ in $(seq 100); do curl -sf "localhost:$port/health" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "server on $port did not come up"; cat "$work/serve.err"; exit 1
}
ask() { curl -sf "localhost:$1/v1/completions" -d "{\"prompt\": \"$2\", \"max_tokens\": 150, \"temperature\": 0}" |
        python3 -c 'import sys,json; print(json.load(sys.stdin)["choices"][0]["text"])'; }

base=$((30000 + RANDOM % 20000))
start "$base"
want=$(ask "$base" "Once upon a time")

start $((base + 1)) --kv-cold "dir:$work/cold:16M"
for i in 1 2 3 4 5 6; do ask $((base + 1)) "The little dog number $i" >/dev/null & done
sleep 0.5
kill -9 "${pids[1]}"
wait "${pids[1]}" 2>/dev/null || true
ls "$work/cold" | grep -q . || { echo "no tier file was left behind to recover from"; exit 1; }

start $((base + 2)) --kv-cold "dir:$work/cold:16M"
got=$(ask $((base + 2)) "Once upon a time")
[ "$got" = "$want" ] || { echo "output after restart differs"; exit 1; }
echo "restart on the killed server's cold directory: clean start, same output (${#got} bytes)"
