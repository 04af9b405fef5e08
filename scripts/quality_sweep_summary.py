#!/usr/bin/python3
"""Tables of scripts/quality_sweep.sh: one per filler, one row per cell (accuracy per task, the worst task's
distance from full KV, peak hot KV, cold-tier bytes and digests per request, pages recalled, guard fallbacks,
the cell's wall time). Usage: quality_sweep_summary.py OUT_DIR"""
import json
import os
import sys

out = sys.argv[1]
cells = {}
for name in sorted(os.listdir(out)):
    if name.endswith(".json"):
        filler, cell = name[:-5].split("__", 1)
        secs_file = os.path.join(out, name[:-5] + ".seconds")
        secs = open(secs_file).read().strip() if os.path.exists(secs_file) else "?"
        cells.setdefault(filler, {})[cell] = (json.load(open(os.path.join(out, name))), secs)


def mib(b):
    return f"{b / 2**20:.2f} MiB"


def label(cell):
    """(configuration, schedule, budget) of a cell name such as trispan_b205_aware_recall_guard."""
    if cell == "full":
        return "full KV", "-", "2048 (100 %)"
    parts = cell.split("_")
    policy, budget = parts[0], int(parts[1][1:])
    rest = parts[2:]
    sched = "query-aware" if "aware" in rest else "query-agnostic"
    extras = [p for p in rest if p not in ("aware", "agnostic")]
    conf = policy + ("" if not extras else " + " + " + ".join("exact guard" if e == "guard" else e for e in extras))
    return conf, sched, f"{budget} ({100 * budget / 2048:.0f} %)"


POLICIES = ["streaming", "knorm", "triattention", "snapkv", "rkv", "tova", "h2o", "trispan"]


def order(cell):
    """full KV; every policy by budget (recall off, query-agnostic); then the default's variants and contrasts."""
    if cell == "full":
        return (0, 0, 0, "")
    conf, sched, budget = label(cell)
    policy = cell.split("_")[0]
    plain = "+" not in conf and sched == "query-agnostic"
    return (1 if plain else 2, POLICIES.index(policy) if plain and policy in POLICIES else 0,
            int(budget.split()[0]), (sched, cell))


for filler in sorted(cells):
    runs = cells[filler]
    full = runs.get("full")
    full_acc = {t["task"]: t["accuracy"] for t in full[0]["tasks"]} if full else {}
    tasks = [t["task"] for t in (full or next(iter(runs.values())))[0]["tasks"]]
    print(f"\n### Filler: {filler}\n")
    print("| configuration | schedule | budget | " + " | ".join(tasks) +
          " | worst task vs full | peak hot KV | cold bytes written / request (max) | digests / request (max) |"
          " pages recalled / request | fell back | seconds |")
    print("|---|---|---|" + "---:|" * (len(tasks) + 7))
    for cell in sorted(runs, key=order):
        d, secs = runs[cell]
        conf, sched, budget = label(cell)
        accs, worst, peak, cold, dig, rec, fb, cnt = [], None, 0, 0, 0, 0, 0, 0
        for t in d["tasks"]:
            accs.append(f"{100 * t['accuracy']:.0f}")
            if t["task"] in full_acc:
                delta = 100 * (t["accuracy"] - full_acc[t["task"]])
                worst = delta if worst is None else min(worst, delta)
            peak = max(peak, t["peak_resident_kv_bytes"])
            for s in t["samples"]:
                cold = max(cold, s.get("evicted_cold_bytes", 0))
                dig = max(dig, s.get("digest_bytes", 0))
                rec += s.get("pages_recalled", 0)
                fb += 1 if s.get("guard_fallbacks", 0) > 0 else 0
                cnt += 1
        has_cold = any("evicted_cold_bytes" in s and s["evicted_cold_bytes"] > 0 for t in d["tasks"] for s in t["samples"])
        print(f"| {conf} | {sched} | {budget} | " + " | ".join(accs) +
              f" | {'-' if worst is None else f'{worst:+.0f}'} | {mib(peak)} | {mib(cold) if has_cold else '-'} |"
              f" {mib(dig) if has_cold else '-'} | {rec / cnt:.1f} | {f'{100 * fb / cnt:.0f} %' if has_cold else '-'} | {secs} |")
