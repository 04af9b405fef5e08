#!/usr/bin/env bash
# The decode-regime task (eval tasks --task walk, docs/quality.md §2) under compression: full KV, then policies at
# 10 % and 25 % of a 2048 context, and the default (trispan) at 10 % with recall and with the exact guard; every
# cell on the built-in filler and on FILLER. Two cells at a time, one thread each; resumable like quality_sweep.sh.
# Usage: scripts/walk_eval.sh KVPACK MODEL OUT_DIR [N] [SEED] [FILLER_FILE]
# Summary: scripts/quality_sweep_summary.py OUT_DIR
set -euo pipefail
kvpack=$1 model=$2 out=$3 n=${4:-50} seed=${5:-1000} filler=${6:-../shared/corpora/austen.txt}
cold="--kv-cold host:512M --kv-recall-every 1"
cells=("full|--kv-policy full")
for p in streaming triattention snapkv h2o trispan; do
  for b in 205 512; do cells+=("${p}_b${b}|--kv-policy $p --kv-budget $b"); done
done
cells+=("trispan_b205_agnostic_recall|--kv-policy trispan --kv-budget 205 $cold --kv-recall")
cells+=("trispan_b205_agnostic_guard|--kv-policy trispan --kv-budget 205 $cold --kv-guard-exact")
task=walk
# shellcheck source=scripts/eval_cells.sh
source "$(dirname "$0")/eval_cells.sh"
run_cells walk
