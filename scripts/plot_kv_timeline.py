#!/usr/bin/env python3
"""Plots resident KV bytes over generated tokens for full KV, naive eviction and compaction."""
import csv
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main(src, dst):
    rows = list(csv.DictReader(open(src)))
    x = [int(r["tokens"]) for r in rows]
    plt.figure(figsize=(7, 4))
    for key, label in (("full_bytes", "full KV"), ("naive_bytes", "naive eviction (holes)"), ("compaction_bytes", "compaction")):
        plt.plot(x, [int(r[key]) / 2**20 for r in rows], label=label)
    plt.xlabel("tokens")
    plt.ylabel("resident KV (MiB)")
    plt.title("kvpack: resident KV over a long generation")
    plt.grid(alpha=0.3)
    plt.legend()
    plt.tight_layout()
    plt.savefig(dst, dpi=120)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
