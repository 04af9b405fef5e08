#!/usr/bin/python3
"""Cluster benchmark (first cut; docs/scale.md): one seeded session mix through HAProxy over 3 replicas,
run twice in one invocation: (A) consistent-hash affinity on X-Session-Id + the Redis shared tier, (B)
round-robin without a shared tier. Chats share one system prompt and return for several turns (each
turn resends the history). Prints prefix hit rate, shared-tier (Redis) hit tokens vs recomputed prompt
tokens, TTFT p50/p99 and throughput side by side. Greedy; client threads run sessions concurrently.
Usage: cluster_bench.py KVPACK_BINARY MODEL [--sessions 24] [--turns 3] [--clients 6]
(Not yet `kvpack bench serve --target`: see docs/scale.md, "Not done".)"""
import argparse, os, sys, threading, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster
from cluster_check import complete, WORDS

def words(seed, n):
    return " ".join(WORDS[(seed * 13 + k * 7) % len(WORDS)] for k in range(n))

def run(binary, model, routing, shared, a):
    c = cluster.Cluster(cluster.Config(binary=binary, model=model, replicas=3, routing=routing, shared=shared,
                                       dir=f"/tmp/kvpack-cluster-bench-{routing}", serve_args=["-q"])).start()
    system = words(1, a.system_words)
    ttft, lock, stats = [], threading.Lock(), {"prompt": 0, "cached": 0, "shared": 0, "completion": 0, "failed": 0}
    nxt = [0]
    def worker():
        while True:
            with lock:
                s = nxt[0]; nxt[0] += 1
            if s >= a.sessions:
                return
            history = system
            for t in range(a.turns):
                history += " " + words(100 + s * 10 + t, 12)
                t0 = time.time()
                r = complete(c.cfg.proxy_port, {"prompt": history, "max_tokens": a.tokens}, session=f"bench-{s}", stream=True)
                with lock:
                    if not r.ok:
                        stats["failed"] += 1; break
                    u = r.usage
                    stats["prompt"] += u.get("prompt_tokens", 0)
                    stats["cached"] += u.get("prompt_tokens_details", {}).get("cached_tokens", 0)
                    stats["shared"] += u.get("kvpack", {}).get("cached_tokens_shared", 0)
                    stats["completion"] += u.get("completion_tokens", 0)
                    ttft.append(r.ttft)
                history += r.text
    t0 = time.time()
    th = [threading.Thread(target=worker) for _ in range(a.clients)]
    [t.start() for t in th]; [t.join() for t in th]
    wall = time.time() - t0
    c.stop()
    ttft.sort()
    q = lambda p: 1e3 * ttft[min(len(ttft) - 1, max(0, int(p * len(ttft) + 0.5) - 1))] if ttft else 0
    return dict(label=f"{routing}{' + redis' if shared else ', no shared tier'}", wall=wall, p50=q(0.5), p99=q(0.99),
                hit=stats["cached"] / max(1, stats["prompt"]), **stats)

ap = argparse.ArgumentParser(); ap.add_argument("binary"); ap.add_argument("model")
ap.add_argument("--sessions", type=int, default=24); ap.add_argument("--turns", type=int, default=3)
ap.add_argument("--clients", type=int, default=6); ap.add_argument("--tokens", type=int, default=32)
ap.add_argument("--system-words", type=int, default=80)
a = ap.parse_args()
rows = [run(a.binary, a.model, "affinity", True, a), run(a.binary, a.model, "roundrobin", False, a)]
print("| run | requests failed | prompt tokens | prefix hit rate | from Redis (tokens) | recomputed (tokens) | TTFT p50 ms | TTFT p99 ms | output tok/s | wall s |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['label']} | {r['failed']} | {r['prompt']} | {100*r['hit']:.1f}% | {r['shared']} | {r['prompt']-r['cached']} | "
          f"{r['p50']:.1f} | {r['p99']:.1f} | {r['completion']/r['wall']:.0f} | {r['wall']:.1f} |")
