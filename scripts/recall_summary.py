#!/usr/bin/python3
"""Summary of scripts/recall_eval.sh: accuracy per task and run, cold-tier figures per request, and the
drift estimate as a detector of answers that differ from full KV (its curve over thresholds)."""
import json
import sys

out, names = sys.argv[1], sys.argv[2:]
runs = {n: json.load(open(f"{out}/{n}.json")) for n in names}
full = runs[names[0]]
tasks = [t["task"] for t in full["tasks"]]

print("| run | " + " | ".join(tasks) + " | pages recalled / req | cold pages read / req | cold KiB read / req | evicted pages to cold / req |")
print("|---|" + "---:|" * (len(tasks) + 4))
for n, r in runs.items():
    cells, rec, read, kib, ev, cnt = [], 0, 0, 0, 0, 0
    for t in r["tasks"]:
        cells.append(f"{100 * t['accuracy']:.0f}% ({t['correct']}/{t['n']})")
        for s in t["samples"]:
            rec += s.get("pages_recalled", 0); read += s.get("cold_pages_read", 0)
            kib += s.get("cold_bytes_read", 0) / 1024; ev += s.get("evicted_cold_pages", 0); cnt += 1
    print(f"| {n} | " + " | ".join(cells) + f" | {rec / cnt:.1f} | {read / cnt:.1f} | {kib / cnt:.0f} | {ev / cnt:.1f} |")

# Drift as a detector: on the drift-only run, flag = drift_first >= threshold; positive = answer differs
# from the full-KV answer on the same sample.
drift_runs = [n for n in names if n.endswith("_drift")]
for dn in drift_runs:
    pairs = []
    for tf, td in zip(full["tasks"], runs[dn]["tasks"]):
        for sf, sd in zip(tf["samples"], td["samples"]):
            pairs.append((sd["generated"] != sf["generated"], sd["drift_first"]))
    pos = sum(1 for d, _ in pairs if d)
    neg = len(pairs) - pos
    print(f"\nDrift estimate as a detector ({dn}: {pos} answers differ from full KV, {neg} match):\n")
    print("| threshold | flagged of differing | flagged of matching |")
    print("|---:|---:|---:|")
    for th in sorted({round(x, 4) for _, x in pairs} | {0.01, 0.05, 0.1, 0.2, 0.3, 0.5}):
        tp = sum(1 for d, x in pairs if d and x >= th)
        fp = sum(1 for d, x in pairs if not d and x >= th)
        if th in (0.01, 0.05, 0.1, 0.2, 0.3, 0.5) or len(pairs) <= 40:
            print(f"| {th:.4f} | {100 * tp / max(1, pos):.0f}% ({tp}/{pos}) | {100 * fp / max(1, neg):.0f}% ({fp}/{neg}) |")
