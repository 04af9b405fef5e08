#!/usr/bin/env bash
# Recall and the drift estimate on the testbed tasks, side by side (docs/quality.md §6):
#   full KV; POLICY at BUDGET without recall; with recall (every token, all cold pages scored exactly:
#   --kv-recall-pages 1000; and a bounded read of 16 pages per stream); drift measured without recall.
# Usage: scripts/recall_eval.sh KVPACK OUT_DIR [N] [SEED] [FILLER_FILE] [POLICY] [BUDGET] [CALIB]
# Every run writes OUT_DIR/<name>.json (eval tasks --json); the summary table goes to stdout.
set -euo pipefail
kvpack=$1 out=$2 n=${3:-50} seed=${4:-1000} filler=${5:-} policy=${6:-triattention} budget=${7:-205} calib=${8:-}
mkdir -p "$out"
common=(eval tasks -m models/testbed.gguf --ctx 2048 --task all --n "$n" --seed "$seed" -t 2 --json -q)
[[ -n "$filler" ]] && common+=(--filler "$filler")
kv=(--kv-policy "$policy" --kv-budget "$budget")
[[ -n "$calib" ]] && kv+=(--kv-calib "$calib")
cold=(--kv-cold host:512M)
run() {  # name args...
  local name=$1; shift
  local t0=$SECONDS
  "$kvpack" "${common[@]}" "$@" > "$out/$name.json"
  echo "$name: $((SECONDS - t0)) s" >&2
}
run full
run "${policy}_b${budget}" "${kv[@]}"
run "${policy}_b${budget}_drift" "${kv[@]}" "${cold[@]}" --kv-drift --kv-recall-pages 1000
run "${policy}_b${budget}_recall_all" "${kv[@]}" "${cold[@]}" --kv-recall --kv-recall-every 1 --kv-recall-pages 1000
run "${policy}_b${budget}_recall_16" "${kv[@]}" "${cold[@]}" --kv-recall --kv-recall-every 1 --kv-recall-pages 16
/usr/bin/python3 "$(dirname "$0")/recall_summary.py" "$out" full "${policy}_b${budget}" "${policy}_b${budget}_drift" \
  "${policy}_b${budget}_recall_all" "${policy}_b${budget}_recall_16"
