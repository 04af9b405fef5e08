#!/usr/bin/python3
"""The exact drift check as a detector, and the exact guard (docs/quality.md §4f), from `kvpack eval tasks
--json --answer-only` runs of the same tasks and seed:

    exact_check_summary.py FULL.json EXACT.json [GUARD.json ...]

FULL: full KV. EXACT: compressed with --kv-drift-exact (no guard). A sample "differs" when its generation is
not full KV's; it is "flagged" when a check flipped the most likely token or reached total variation t.
GUARD: runs with --kv-guard-exact: accuracy per task, requests that fell back, cold reads."""
import json
import sys

full, exact = (json.load(open(p)) for p in sys.argv[1:3])
pairs = []  # (differs, tv_max, flipped)
for tf, te in zip(full["tasks"], exact["tasks"]):
    for sf, se in zip(tf["samples"], te["samples"]):
        pairs.append((se["generated"] != sf["generated"], se["exact_tv_max"], se["exact_flips"] > 0))
pos = sum(1 for p in pairs if p[0])
neg = len(pairs) - pos
P = [tv for d, tv, _ in pairs if d]
N = [tv for d, tv, _ in pairs if not d]
auc = sum(1 if x > y else 0.5 if x == y else 0 for x in P for y in N) / max(1, len(P) * len(N))


def flagged(rule):
    tp = sum(1 for d, tv, f in pairs if d and rule(tv, f))
    fp = sum(1 for d, tv, f in pairs if not d and rule(tv, f))
    return f"{100 * tp / max(1, pos):.0f} % ({tp}/{pos}) / {100 * fp / max(1, neg):.1f} % ({fp}/{neg})"


print(f"differ {pos}, match {neg}, AUC of exact_tv_max {auc:.2f}")
print("| rule | flagged of differing / of matching |\n|---|---|")
print(f"| flip only | {flagged(lambda tv, f: f)} |")
for t in (0.05, 0.10, 0.15, 0.20, 0.30):
    print(f"| flip or TV >= {t:.2f} | {flagged(lambda tv, f, t=t: f or tv >= t)} |")


def cells(run):
    return " | ".join(f"{100 * t['accuracy']:.0f} % ({t['correct']}/{t['n']})" for t in run["tasks"])


print("\n| run | " + " | ".join(t["task"] for t in full["tasks"]) + " | fell back | pages recalled / req | cold MiB read / req |")
print("|---|" + "---:|" * (len(full["tasks"]) + 3))
print(f"| full KV | {cells(full)} | – | – | – |")
print(f"| compressed (exact check only) | {cells(exact)} | – | – | – |")
for path in sys.argv[3:]:
    g = json.load(open(path))
    s = [x for t in g["tasks"] for x in t["samples"]]
    fb = sum(1 for x in s if x["guard_fallbacks"] > 0)
    print(f"| {path} | {cells(g)} | {100 * fb / len(s):.0f} % ({fb}/{len(s)}) | {sum(x['pages_recalled'] for x in s) / len(s):.0f} | "
          f"{sum(x['cold_bytes_read'] for x in s) / len(s) / 2**20:.1f} |")
