#!/usr/bin/env python3
"""Where walk answers go wrong: for each `kvpack eval tasks --task walk --json` file, counts the samples by the
part of the answer holding the first differing character (whitespace ignored): the walk's links, the stop after
the fourth link (the walk goes on instead of ". Then count down"), the count, or the repeated answer line.
Usage: scripts/walk_where.py CELL.json [...]   (e.g. the cells of scripts/walk_eval.sh)"""
import json
import sys


def where(answer, generated):
    e, g = answer.replace(" ", ""), generated.replace(" ", "")
    i = next((k for k in range(min(len(e), len(g))) if e[k] != g[k]), min(len(e), len(g)))
    stop, repeat = e.index(".Thencount"), e.index("Answer:")
    return "walk" if i < stop else "stop" if i == stop else "count" if i < repeat else "repeat"


def main(paths):
    for path in paths:
        with open(path) as f:
            d = json.load(f)
        n = {"ok": 0, "walk": 0, "stop": 0, "count": 0, "repeat": 0}
        for t in d["tasks"]:
            if t["task"] != "walk":
                continue
            for s in t["samples"]:
                n["ok" if s["correct"] else where(s["answer"], s["generated"])] += 1
        print(path, " ".join(f"{k} {v}" for k, v in n.items()))


if __name__ == "__main__":
    main(sys.argv[1:])
