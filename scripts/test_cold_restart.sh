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

# Every server takes a free port the kernel picks (--port 0) and prints it: a fixed or random port could be
# another test's server under `ctest -j`, which /health would not tell apart.
start() {  # name, extra args...; sets $port once /health answers
  local name=$1; shift
  "$kvpack" serve -q -m "$model" --port 0 --kv-pages 200 --admission watermark "$@" >/dev/null 2>"$work/$name.err" &
  pids+=($!)
  port=""
  for _ in $(seq 200); do
    port=$(sed -n 's@.* on http://[^:]*:\([0-9]*\).*@\1@p' "$work/$name.err" | head -1)
    [ -n "$port" ] && curl -sf "localhost:$port/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server $name did not come up"; cat "$work/$name.err"; exit 1
}
ask() { curl -sf "localhost:$1/v1/completions" -d "{\"prompt\": \"$2\", \"max_tokens\": 150, \"temperature\": 0}" |
        python3 -c 'import sys,json; print(json.load(sys.stdin)["choices"][0]["text"])'; }

start plain
want=$(ask "$port" "Once upon a time")

start killed --kv-cold "dir:$work/cold:16M"
for i in 1 2 3 4 5 6; do ask "$port" "The little dog number $i" >/dev/null 2>&1 & done  # these die with the server
sleep 0.5
kill -9 "${pids[1]}"
wait "${pids[1]}" 2>/dev/null || true
ls "$work/cold" | grep -q . || { echo "no tier file was left behind to recover from"; exit 1; }

start restarted --kv-cold "dir:$work/cold:16M"
got=$(ask "$port" "Once upon a time")
[ "$got" = "$want" ] || { echo "output after restart differs"; printf 'want: %s\ngot:  %s\n' "$want" "$got"; exit 1; }
echo "restart on the killed server's cold directory: clean start, same output (${#got} bytes)"
