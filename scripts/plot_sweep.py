#!/usr/bin/env python3
"""Plots of a `kvpack eval sweep` results.csv (docs/quality.md).

Usage: plot_sweep.py DIR/results.csv OUT_DIR

Writes OUT_DIR/kl_vs_budget.png (mean and p99 KL vs full KV, log scale), OUT_DIR/top1_vs_budget.png
(top-1 agreement) and, when the sweep ran tasks, OUT_DIR/accuracy_vs_budget.png (one panel per task).
One line per policy; `full` (no compression) is the dashed baseline. Rows whose status is not "ok"
(e.g. a budget below sinks + window + 1) are listed on stderr and left out of the lines.
Needs only matplotlib (Agg backend, no display).
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def num(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    csv_path, out_dir = argv[1], argv[2]
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        print(f"{csv_path}: no rows", file=sys.stderr)
        return 1
    ctx = rows[0].get("ctx", "?")
    for r in rows:
        if r["status"] != "ok":
            print(f"plot_sweep: not plotted: {r['policy']} budget {r['budget']}: {r['status']}", file=sys.stderr)
    ok = [r for r in rows if r["status"] == "ok"]
    policies = []
    for r in ok:
        if r["policy"] not in policies:
            policies.append(r["policy"])

    def series(policy, col):
        pts = [(int(r["budget"]), num(r.get(col))) for r in ok if r["policy"] == policy]
        pts = [(b, v) for b, v in pts if v is not None]
        pts.sort()
        return [b for b, _ in pts], [v for _, v in pts]

    budgets = sorted({int(r["budget"]) for r in rows})
    written = []

    def style(ax, ylabel, title):
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets)
        ax.set_xticklabels([f"{b}\n({100.0 * b / float(ctx):.0f}%)" if ctx != "?" else str(b) for b in budgets])
        ax.set_xlabel(f"budget (slots per layer x KV head; % of ctx {ctx})")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)

    def plot_percent(ax, col):
        """One line per policy of 100 * `col` against the budget; `full` is the dashed black baseline."""
        for p in policies:
            x, y = series(p, col)
            if not x:
                continue
            if p == "full":
                ax.plot(x, [100 * v for v in y], linestyle="--", color="black", label="full")
            else:
                ax.plot(x, [100 * v for v in y], marker="o", label=p)

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(f"{out_dir}/{name}", dpi=120)
        plt.close(fig)
        written.append(name)

    # KL: mean (solid) and p99 (dotted), log scale; `full` is 0 everywhere and is not drawn on a log axis.
    if any(num(r.get("mean_kl")) is not None for r in ok):
        fig, ax = plt.subplots(figsize=(8, 5))
        for p in policies:
            if p == "full":
                continue
            x, y = series(p, "mean_kl")
            pts = [(a, b) for a, b in zip(x, y) if b > 0]
            if pts:
                line, = ax.plot([a for a, _ in pts], [b for _, b in pts], marker="o", label=f"{p} mean")
                x2, y2 = series(p, "p99_kl")
                pts2 = [(a, b) for a, b in zip(x2, y2) if b > 0]
                if pts2:
                    ax.plot([a for a, _ in pts2], [b for _, b in pts2], linestyle=":", color=line.get_color(), alpha=0.7)
        ax.set_yscale("log")
        style(ax, "KL(full || compressed), nats", "Mean KL (solid) and p99 KL (dotted) vs budget; full KV = 0")
        ax.legend(fontsize=8, ncol=2)
        save(fig, "kl_vs_budget.png")

        fig, ax = plt.subplots(figsize=(8, 5))
        plot_percent(ax, "top1")
        style(ax, "top-1 agreement with full KV (%)", "Top-1 agreement vs budget")
        ax.legend(fontsize=8, ncol=2)
        save(fig, "top1_vs_budget.png")

    tasks = [c[len("acc_"):] for c in rows[0].keys() if c.startswith("acc_")]
    tasks = [t for t in tasks if any(num(r.get("acc_" + t)) is not None for r in ok)]
    if tasks:
        fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4.5), squeeze=False)
        for ax, t in zip(axes[0], tasks):
            plot_percent(ax, "acc_" + t)
            style(ax, "exact-match accuracy (%)", f"{t}")
            ax.set_ylim(-5, 105)
        axes[0][0].legend(fontsize=8)
        save(fig, "accuracy_vs_budget.png")

    print("plot_sweep: wrote " + ", ".join(f"{out_dir}/{w}" for w in written), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
