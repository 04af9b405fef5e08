#!/usr/bin/env bash
# Greedy outputs of every KV policy (and the budget splits, naive eviction, a compressed KV type) on the
# reference model stories260K and the embedded testbed model, through `kvpack generate` and through the
# server path (`kvpack eval tasks`, which drives the batching scheduler). Refactors must leave them
# byte-identical: tests/data/golden_greedy.txt was recorded from the binary before the refactor that
# introduced it ("One request path"), and ctest runs `check` against it.
# The testbed blocks were re-recorded on 2026-12-07 when the embedded model became tbw9 (docs/testbed.md §12);
# the stories260K blocks are the original recording, unchanged.
#
#   scripts/golden_greedy.sh record KVPACK SHARED_DIR > tests/data/golden_greedy.txt
#   scripts/golden_greedy.sh check  KVPACK SHARED_DIR tests/data/golden_greedy.txt
#
# Needs curl (the server blocks). Each block: a "### name" line, then the generated text and the eviction figures of the stats line
# (compactions, evicted slots, freed pages: the same keep sets give the same figures).
set -euo pipefail
mode=$1 kvpack=$2 shared=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The recorded outputs use f32 KV, the default when they were recorded (the default is f16 since
# 2026-12-02): every run pins --kv-type f32 unless it names its own type.
f32=(--kv-type f32)
stories="$shared/models/stories260K.gguf"
austen="$shared/corpora/austen.txt"
# Calibration from the same text for both models (deterministic; f32 KV as recorded).
"$kvpack" calibrate -q --kv-type f32 -m "$stories" --text "$austen" -o "$work/stories.calib" --max-tokens 2048 >/dev/null 2>&1
"$kvpack" calibrate -q --kv-type f32 --text "$austen" -o "$work/testbed.calib" --max-tokens 2048 >/dev/null 2>&1
# A testbed prompt of ~700 tokens of Austen (starting mid-text so it is not the training start).
head -c 200000 "$austen" | tail -c 3000 > "$work/prompt.txt"

run() {  # name, then generate arguments
  local name=$1; shift
  echo "### $name"
  local pin=("${f32[@]}")
  case " $* " in *" --kv-type "*) pin=() ;; esac
  "$kvpack" generate -q --temp 0 "${pin[@]}" "$@" 2>"$work/err" || { echo "FAILED: $(tail -1 "$work/err")"; return; }
  echo
  grep -o 'kv_pages_in_use=[0-9]*\|compactions=[0-9]* evicted_tokens=[0-9]* evicted_slots=[0-9]* freed_pages=[0-9]*\|peak_resident_kv_bytes=[0-9]* final_resident_kv_bytes=[0-9]*' "$work/err" | tr '\n' ' ' || true
  echo
}

out() {
  for pol in full streaming knorm triattention snapkv rkv tova h2o; do
    kv=(--kv-policy "$pol" --kv-budget 48 --kv-interval 16)
    [ "$pol" = full ] && kv=()
    run "stories $pol" -m "$stories" -p "Once upon a time" -n 200 "${kv[@]}" --kv-calib "$work/stories.calib"
    kv=(--kv-policy "$pol" --kv-budget 128 --kv-interval 32)
    [ "$pol" = full ] && kv=()
    run "testbed $pol" -f "$work/prompt.txt" -n 96 "${kv[@]}" --kv-calib "$work/testbed.calib"
  done
  for split in pyramid ada; do
    run "stories knorm $split" -m "$stories" -p "Once upon a time" -n 200 --kv-policy knorm --kv-budget 48 --kv-interval 16 --kv-split "$split"
    run "testbed triattention $split" -f "$work/prompt.txt" -n 96 --kv-policy triattention --kv-budget 128 --kv-interval 32 \
      --kv-split "$split" --kv-calib "$work/testbed.calib"
  done
  run "testbed triattention naive" -f "$work/prompt.txt" -n 96 --kv-policy triattention --kv-budget 128 --kv-interval 32 \
    --kv-naive --kv-calib "$work/testbed.calib"
  run "stories knorm naive" -m "$stories" -p "Once upon a time" -n 200 --kv-policy knorm --kv-budget 48 --kv-interval 16 --kv-naive
  run "testbed snapkv protect-prompt f16" -f "$work/prompt.txt" -n 96 --kv-policy snapkv --kv-budget 128 --kv-interval 32 \
    --kv-protect-prompt --kv-type f16
  run "testbed h2o q8_0" -f "$work/prompt.txt" -n 96 --kv-policy h2o --kv-budget 128 --kv-interval 32 --kv-type q8_0
  run "stories llama2c full" -m "$shared/models/stories260K.bin" --tokenizer "$shared/models/tok512.bin" -n 256
  # The batching scheduler (the server's path): task answers with compression, per-sample outputs.
  for pol in full triattention rkv; do
    kv=(--kv-policy "$pol" --kv-budget 128 --kv-interval 32 --kv-calib "$work/testbed.calib")
    [ "$pol" = full ] && kv=()
    echo "### eval tasks $pol"
    "$kvpack" eval tasks -q "${f32[@]}" --ctx 1024 --task all --n 3 --seed 5 "${kv[@]}" -v 2>/dev/null | grep -v -i 'seconds\|tok/s\|time' || echo "FAILED"
  done
}

# The HTTP server with its prefix cache and compression: a shared system prompt, sequential requests
# (so the outputs do not depend on batching), repeated questions hit the cache.
server() {  # name, then serve arguments
  local name=$1; shift
  local port=$((20000 + RANDOM % 20000))
  "$kvpack" serve -q "${f32[@]}" --port "$port" "$@" >/dev/null 2>"$work/serve.err" &
  local pid=$!
  for _ in $(seq 100); do curl -s "localhost:$port/health" >/dev/null 2>&1 && break; sleep 0.1; done
  echo "### server $name"
  local sys="You are a careful assistant who answers questions about the novels of Jane Austen, quoting the text where it helps."
  for q in "Who is Mr. Elton?" "What does Emma think of Harriet?" "Who is Mr. Elton?" "Describe Hartfield in winter."; do
    curl -s "localhost:$port/v1/completions" -d "{\"prompt\": \"$sys Question: $q Answer:\", \"max_tokens\": 80, \"temperature\": 0}" |
      python3 -c 'import sys,json; d=json.load(sys.stdin); print(json.dumps([d["choices"][0]["text"], d["usage"]["prompt_tokens_details"]["cached_tokens"]]))'
  done
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

all() {
  out
  server "full"
  server "knorm b64" --kv-policy knorm --kv-budget 64 --kv-interval 16
  server "triattention b64" --kv-policy triattention --kv-budget 64 --kv-interval 16 --kv-calib "$work/testbed.calib"
}

case "$mode" in
  record) all ;;
  check)
    all > "$work/now.txt"
    if diff -u "$4" "$work/now.txt" > "$work/diff"; then
      echo "golden greedy outputs: $(grep -c '^### ' "$4") blocks identical"
    else
      head -60 "$work/diff"
      echo "golden greedy outputs differ from $4"
      exit 1
    fi ;;
  *) echo "usage: $0 record|check KVPACK SHARED_DIR [GOLDEN]" >&2; exit 2 ;;
esac
