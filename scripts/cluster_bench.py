#!/usr/bin/python3
"""Cluster benchmark (docs/scale.md): one seeded session mix through HAProxy over 3 replicas, replayed
by `kvpack bench serve --target` and run twice in one invocation: (A) consistent-hash affinity on
X-Session-Id + the Redis shared tier, (B) round-robin without a shared tier. The mix is bench serve's
own (chats sharing one system prompt that return for several turns, resending the history; a few
reasoning and long-document sessions), greedy. Prints prefix hit rate, prompt tokens served from Redis
vs recomputed, TTFT p50/p99 and throughput side by side, with the machine line.
Usage: cluster_bench.py KVPACK_BINARY MODEL [--chats 24] [--turns 3] [--clients 6] [--seed 42]"""
import argparse, json, os, subprocess, sys, tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster


def machine_line():
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} logical CPUs; replicas, HAProxy and Redis on this one machine"


def run(a, routing, shared, label):
    c = cluster.Cluster(cluster.Config(binary=a.binary, model=a.model, replicas=3, routing=routing, shared=shared,
                                       dir=f"/tmp/kvpack-cluster-bench-{routing}", serve_args=["-q"])).start()
    try:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            cmd = [a.binary, "bench", "serve", "--target", f"127.0.0.1:{c.cfg.proxy_port}", "--label", label,
                   "--json", out.name, "--temp", "0", "--seed", str(a.seed), "--clients", str(a.clients),
                   "--chats", str(a.chats), "--turns", str(a.turns), "--chat-tokens", str(a.tokens),
                   "--system-words", str(a.system_words), "--reasoning", str(a.reasoning),
                   "--reasoning-tokens", "64", "--documents", str(a.documents)]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, KVPACK_PROGRESS="0"))
            with open(out.name) as f:
                return json.load(f)
    finally:
        c.stop()


ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("binary"); ap.add_argument("model")
ap.add_argument("--chats", type=int, default=24); ap.add_argument("--turns", type=int, default=3)
ap.add_argument("--clients", type=int, default=6); ap.add_argument("--tokens", type=int, default=32)
ap.add_argument("--system-words", type=int, default=80)
ap.add_argument("--reasoning", type=int, default=4); ap.add_argument("--documents", type=int, default=2)
ap.add_argument("--seed", type=int, default=42)
a = ap.parse_args()
rows = [run(a, "affinity", True, "affinity + redis"), run(a, "roundrobin", False, "roundrobin, no shared tier")]
print(f"machine: {machine_line()}")
print(f"mix: seed {a.seed}, {a.chats} chats x {a.turns} turns ({a.tokens} tokens, shared {a.system_words}-word system prompt), "
      f"{a.reasoning} reasoning, {a.documents} documents, {a.clients} clients, greedy\n")
print("| run | sessions completed | prompt tokens | prefix hit rate | from Redis (tokens) | recomputed (tokens) | "
      "TTFT p50 ms | TTFT p99 ms | output tok/s | requests per replica | wall s |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    per = " ".join(f"{k or '?'}:{v}" for k, v in sorted(r["replica_requests"].items()))
    print(f"| {r['label']} | {r['completed']}/{r['sessions']} | {r['prompt_tokens']} | {100 * r['prefix_hit_rate']:.1f}% | "
          f"{r['shared_tokens']} | {r['recomputed_tokens']} | {r['ttft_p50_ms']:.1f} | {r['ttft_p99_ms']:.1f} | "
          f"{r['output_tok_s']:.0f} | {per} | {r['wall_s']:.1f} |")
if rows[1]["recomputed_tokens"] > 0:
    print(f"\nrecomputed prompt tokens, affinity + redis / roundrobin: "
          f"{rows[0]['recomputed_tokens'] / rows[1]['recomputed_tokens']:.2f}")
sys.exit(0 if all(r["completed"] == r["sessions"] for r in rows) else 1)
