#!/usr/bin/env bash
# The quality sweep of docs/quality.md §4 (issue "Compression that keeps what matters", item 5): the testbed
# model at a 2048 context, held-out seed, n samples per task, --answer-only (the scored span alone):
#   every policy x 10 / 25 / 50 % budgets (205 / 512 / 1024 slots per stream), recall off, query-agnostic;
#   the default (trispan) at 10 % with recall off / on and the exact guard off / on, in both schedules:
#     query-agnostic  (the default --kv-interval 128: the prompt is compressed every 128 slots past the budget
#                      while it is prefilled, before the question arrives: what a server does with a long prompt;
#                      peak hot KV = budget + interval),
#     query-aware     (--kv-interval 4096: no event fires during prefill; the whole prompt, question included,
#                      is cut to the budget once at its end: the regime of SnapKV's and most papers' published
#                      numbers; peak hot KV = the whole prompt);
#   SnapKV at 10 % query-aware, for contrast; full KV;
# on the built-in filler and on FILLER (Austen). Two cells run at a time, one thread each.
# Usage: scripts/quality_sweep.sh KVPACK OUT_DIR [N] [SEED] [FILLER_FILE]
# Every cell writes OUT_DIR/<filler>__<name>.json (eval tasks --json) and OUT_DIR/<...>.seconds;
# scripts/quality_sweep_summary.py OUT_DIR prints the tables.
set -euo pipefail
kvpack=$1 out=$2 n=${3:-50} seed=${4:-1000} filler=${5:-../shared/corpora/austen.txt}
cold=(--kv-cold host:512M)
recall=(--kv-recall --kv-recall-every 1)
guard=(--kv-guard-exact --kv-recall-every 1)
cells=()
add() { cells+=("$1|$2"); }  # name|flags
add full "--kv-policy full"
for p in streaming knorm triattention snapkv rkv tova h2o trispan; do
  for b in 205 512 1024; do add "${p}_b${b}" "--kv-policy $p --kv-budget $b"; done
done
for sched in agnostic aware; do
  iv=128; [[ $sched == aware ]] && iv=4096
  [[ $sched == aware ]] && add "trispan_b205_${sched}" "--kv-interval $iv --kv-policy trispan --kv-budget 205"
  add "trispan_b205_${sched}_recall" "--kv-interval $iv --kv-policy trispan --kv-budget 205 ${cold[*]} ${recall[*]}"
  add "trispan_b205_${sched}_guard" "--kv-interval $iv --kv-policy trispan --kv-budget 205 ${cold[*]} ${guard[*]}"
  add "trispan_b205_${sched}_recall_guard" "--kv-interval $iv --kv-policy trispan --kv-budget 205 ${cold[*]} ${recall[*]} --kv-guard-exact"
done
add snapkv_b205_aware "--kv-interval 4096 --kv-policy snapkv --kv-budget 205"

model=models/testbed.gguf task=all
# shellcheck source=scripts/eval_cells.sh
source "$(dirname "$0")/eval_cells.sh"
run_cells sweep
