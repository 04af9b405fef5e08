#!/usr/bin/env python3
"""Slowloris against `kvpack serve`: N sockets that send one header byte every INTERVAL seconds (and
reconnect when the server cuts them), while other clients measure GET /health latency (a fresh
connection per request) and run completions. Standard library only.

    scripts/slowloris.py [--binary build/kvpack] [--model ../shared/models/stories260K.gguf]
                         [--sockets 1000] [--interval 2] [--duration 30] [-- EXTRA SERVE ARGS]
    scripts/slowloris.py --port 8080 ...     # against a server that is already running

Prints one summary line per figure (docs/reliability.md quotes them). Exit status 1 when the /health p99
is above --target-ms or a completion failed.
"""
import argparse
import http.client
import json
import multiprocessing
import os
import re
import resource
import selectors
import socket
import subprocess
import sys
import threading
import time

HEADER = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slowloris\r\n" + b"X-Slow: " + b"s" * 4000


def raise_nofile(need):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, need)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        sys.exit(f"slowloris: open-file limit {soft} < {need} needed (raise the hard limit: ulimit -Hn)")


def attacker(host, port, n, interval, duration, stats):
    """Keeps n slow sockets open for `duration` seconds; one byte per socket every `interval` s."""
    sel = selectors.DefaultSelector()
    socks = {}  # fd -> [socket, bytes sent, next send time]
    opened = cut = 0
    t_end = time.monotonic() + duration

    def connect(i):
        nonlocal opened
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect_ex((host, port))
        except OSError:
            s.close()
            return
        socks[s.fileno()] = [s, 0, time.monotonic() + interval * (i % 1000) / 1000.0]
        sel.register(s, selectors.EVENT_READ)
        opened += 1

    for i in range(n):
        connect(i)
    min_open = n
    samples = []
    while time.monotonic() < t_end:
        now = time.monotonic()
        for key, _ in sel.select(timeout=0.01):  # the server answered (408) or closed: reconnect
            s = key.fileobj
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            if not data:
                sel.unregister(s)
                socks.pop(s.fileno(), None)
                s.close()
                cut += 1
                connect(opened)
        for fd, ent in list(socks.items()):
            s, sent, nxt = ent
            if now >= nxt:
                try:
                    s.send(HEADER[sent % len(HEADER):sent % len(HEADER) + 1])
                    ent[1] += 1
                except OSError:
                    pass
                ent[2] = now + interval
        samples.append(len(socks))
        min_open = min(min_open, len(socks))
    stats.update(opened=opened, cut=cut, min_open=min_open, mean_open=sum(samples) / max(1, len(samples)))
    for ent in socks.values():
        ent[0].close()


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1))))]


def health_prober(host, port, until, out):
    while time.monotonic() < until:
        t0 = time.monotonic()
        try:
            c = http.client.HTTPConnection(host, port, timeout=30)
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            ok = r.status == 200
            c.close()
        except OSError:
            ok = False
        out.append((time.monotonic() - t0, ok))
        time.sleep(0.02)


def completion_prober(host, port, until, out):
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0})
    while time.monotonic() < until:
        t0 = time.monotonic()
        try:
            c = http.client.HTTPConnection(host, port, timeout=60)
            c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            r = c.getresponse()
            j = json.loads(r.read())
            ok = r.status == 200 and j["usage"]["completion_tokens"] > 0
            c.close()
        except (OSError, ValueError, KeyError):
            ok = False
        out.append((time.monotonic() - t0, ok))
        time.sleep(0.1)


def scrape(host, port, names):
    try:
        c = http.client.HTTPConnection(host, port, timeout=10)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
    except OSError:
        return {}
    got = {}
    for line in text.splitlines():
        for n in names:
            if line.startswith(n + " "):
                got[n] = float(line.split()[-1])
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--binary", default=os.path.join(here, "..", "build", "kvpack"))
    ap.add_argument("--model", default=os.path.join(os.environ.get("KVPACK_SHARED_DIR", os.path.join(here, "..", "..", "shared")),
                                                    "models", "stories260K.gguf"))
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="attack a running server instead of starting one")
    ap.add_argument("--sockets", type=int, default=1000)
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between two bytes of one socket")
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--target-ms", type=float, default=100.0, help="/health p99 target")
    ap.add_argument("serve_args", nargs="*", help="extra `kvpack serve` arguments (after --)")
    a = ap.parse_args()
    raise_nofile(a.sockets + 256)

    proc = None
    port = a.port
    if port == 0:
        cmd = [a.binary, "serve", "-m", a.model, "--port", "0", "--threads", "1"] + a.serve_args
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        for line in proc.stderr:
            m = re.search(r"on http://[^:]+:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        if not port:
            sys.exit("slowloris: the server did not start: " + " ".join(cmd))
        threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    print(f"slowloris: {a.sockets} sockets, one byte / {a.interval:g} s each, {a.duration:g} s, server port {port}", flush=True)

    mgr = multiprocessing.Manager()
    stats = mgr.dict()
    atk = multiprocessing.Process(target=attacker, args=(a.host, port, a.sockets, a.interval, a.duration, stats))
    t_start = time.monotonic()
    atk.start()
    time.sleep(min(2.0, a.duration / 4))  # let the sockets connect first
    until = t_start + a.duration
    health, comps = [], []
    probers = [threading.Thread(target=health_prober, args=(a.host, port, until, health)),
               threading.Thread(target=completion_prober, args=(a.host, port, until, comps))]
    for t in probers:
        t.start()
    for t in probers:
        t.join()
    atk.join()
    m = scrape(a.host, port, ['kvpack_http_timeouts_total{phase="header"}', "kvpack_http_connections_rejected_total",
                               "kvpack_http_connections_open"])
    if proc:
        proc.terminate()
        proc.wait(timeout=10)

    lat = [t * 1000 for t, ok in health if ok]
    h_fail = sum(1 for _, ok in health if not ok)
    c_ok = sum(1 for _, ok in comps if ok)
    c_fail = len(comps) - c_ok
    c_lat = [t * 1000 for t, ok in comps if ok]
    print(f"attacker: opened {stats.get('opened', 0)} sockets, cut by the server {stats.get('cut', 0)}, "
          f"open min {stats.get('min_open', 0)} / mean {stats.get('mean_open', 0):.0f}")
    print(f"/health: {len(health)} requests, {h_fail} failed; latency ms p50 {pct(lat, 50):.2f} p90 {pct(lat, 90):.2f} "
          f"p99 {pct(lat, 99):.2f} max {max(lat) if lat else float('nan'):.2f}")
    print(f"completions: {c_ok} ok, {c_fail} failed; latency ms p50 {pct(c_lat, 50):.1f} p99 {pct(c_lat, 99):.1f}")
    if m:
        print("server: header timeouts %d, connections rejected %d" % (m.get('kvpack_http_timeouts_total{phase="header"}', -1),
                                                                     m.get("kvpack_http_connections_rejected_total", -1)))
    bad = h_fail > 0 or c_fail > 0 or c_ok == 0 or not lat or pct(lat, 99) > a.target_ms
    print("result: " + ("FAIL" if bad else "PASS") + f" (target /health p99 <= {a.target_ms:g} ms, every completion ok)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
