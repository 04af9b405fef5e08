#!/usr/bin/python3
"""Two logits files of `kvpack eval parity` (eval/parity.h format) against each other: top-1 agreement and
KL(A || B) over every compared position (the last row of each window predicts past it: left out). Used for
llama.cpp against itself (scripts/peer/llama_logits with and without LLAMA_LOGITS_UBATCH=1), the noise
floor in docs/performance.md section 1c.
  scripts/peer/compare_logits.py A.bin B.bin"""
import sys

import numpy as np


def load(path):
    head = np.fromfile(path, dtype=np.int32, count=3)
    x = np.fromfile(path, dtype=np.float32, offset=12)
    if x.size != int(head[0]) * int(head[1]) * int(head[2]):
        sys.exit(f"{path}: {x.size} logits, header says {head[0]} x {head[1]} x {head[2]}")
    return head, x.reshape(head[0], head[1], head[2])[:, :-1, :].reshape(-1, head[2]).astype(np.float64)


def log_softmax(x):
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    ha, a = load(sys.argv[1])
    hb, b = load(sys.argv[2])
    if not np.array_equal(ha, hb):
        sys.exit(f"shapes differ: {ha.tolist()} vs {hb.tolist()}")
    la, lb = log_softmax(a), log_softmax(b)
    kl = (np.exp(la) * (la - lb)).sum(axis=1)
    print(f"positions {len(kl)} top-1 {100 * np.mean(a.argmax(1) == b.argmax(1)):.2f} % mean KL {kl.mean():.3g} "
          f"max KL {kl.max():.3g} max |logit difference| {np.abs(a - b).max():.3g}")


if __name__ == "__main__":
    main()
