#!/usr/bin/env python3
"""The remaining HTTP hardening figures of docs/reliability.md, against a `kvpack serve` binary:

  idle      N idle sockets (connected, nothing sent), then /health latency over fresh connections
  headers   one GET with 25,000 headers of 4 KB (no API key): the answer, and the server's RSS growth
  busyport  a second `kvpack serve` on the port of a running one: exit status and message
  closed    K closed-loop clients at exactly --max-concurrent K, R requests each: how many 429s

    scripts/http_checks.py [--binary build/kvpack] [--model ../shared/models/stories260K.gguf] [CHECK...]
"""
import argparse
import functools
import http.client
import json
import os
import re
import resource
import socket
import subprocess
import sys
import threading
import time


print = functools.partial(print, flush=True)  # noqa: A001 (progress shows while a check runs)


def start(binary, model, *extra):
    cmd = [binary, "serve", "-m", model, "--port", "0", "--threads", "1", *extra]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        m = re.search(r"on http://[^:]+:(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, int(m.group(1))
    sys.exit("http_checks: the server did not start: " + " ".join(cmd))


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return -1


def get(port, path, timeout=60):
    t0 = time.monotonic()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("GET", path)
    r = c.getresponse()
    r.read()
    return r.status, time.monotonic() - t0


def check_idle(a):
    proc, port = start(a.binary, a.model)
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(a.idle)]
    time.sleep(0.5)
    lat = []
    for _ in range(5):
        try:
            st, t = get(port, "/health", timeout=60)
            lat.append(t * 1000)
        except OSError as e:
            lat.append(float("inf"))
    print(f"idle: {a.idle} idle sockets, /health over a fresh connection: " + ", ".join(f"{x:.1f}" for x in lat) + " ms")
    for s in socks:
        s.close()
    proc.terminate()
    proc.wait(timeout=130)


def check_headers(a):
    proc, port = start(a.binary, a.model, "--api-key", "sekrit")
    time.sleep(0.3)
    before = rss_mb(proc.pid)
    s = socket.create_connection(("127.0.0.1", port))
    answer = b""
    sent = 0
    peak = before

    def reader():
        nonlocal answer
        try:
            while True:
                d = s.recv(65536)
                if not d:
                    break
                answer += d
        except OSError:
            pass

    rt = threading.Thread(target=reader)
    rt.start()
    field = b"X-Junk: " + b"j" * 4088 + b"\r\n"
    try:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
        for i in range(25000):
            s.sendall(field)
            sent += len(field)
            if i % 500 == 0:
                peak = max(peak, rss_mb(proc.pid))
        s.sendall(b"\r\n")
    except OSError:
        pass
    s.settimeout(30)
    rt.join(30)
    time.sleep(0.3)
    peak = max(peak, rss_mb(proc.pid))
    status = answer.split(b"\r\n", 1)[0].decode(errors="replace")
    print(f"headers: sent {sent / 1e6:.1f} MB of headers before the server stopped reading; answer '{status}'; "
          f"server RSS {before:.1f} MB -> peak {peak:.1f} MB (+{peak - before:.1f} MB)")
    s.close()
    proc.terminate()
    proc.wait(timeout=130)


def check_busyport(a):
    proc, port = start(a.binary, a.model)
    t0 = time.monotonic()
    try:
        r = subprocess.run([a.binary, "serve", "-m", a.model, "--port", str(port)], capture_output=True, text=True, timeout=10)
        dt = time.monotonic() - t0
        msg = [l for l in r.stderr.splitlines() if "error" in l or "listen" in l]
        print(f"busyport: second server on port {port}: exit status {r.returncode} after {dt:.2f} s; "
              f"stderr: {msg[-1] if msg else '(nothing)'}", flush=True)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        serving = [l for l in err.splitlines() if "serving" in l]
        print(f"busyport: second server on port {port} still running after 10 s (killed); stderr: "
              f"{serving[-1] if serving else '(nothing)'}", flush=True)
    proc.terminate()
    proc.wait(timeout=130)


def check_closed(a):
    k = a.concurrent
    proc, port = start(a.binary, a.model, "--max-concurrent", str(k))
    counts = {}
    lock = threading.Lock()

    def client(i):
        body = {"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
        for j in range(a.requests):
            stream = (i + j) % 2 == 0
            b = dict(body, stream=stream)
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                c.request("POST", "/v1/completions", json.dumps(b), {"Content-Type": "application/json"})
                r = c.getresponse()
                r.read()  # a stream: read to the end ([DONE]) before the next request
                st = r.status
                c.close()
            except OSError:
                st = 0
            with lock:
                counts[st] = counts.get(st, 0) + 1

    ts = [threading.Thread(target=client, args=(i,)) for i in range(k)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print(f"closed: {k} closed-loop clients at --max-concurrent {k}, {a.requests} requests each (streamed and not): "
          + ", ".join(f"{n} x {st}" for st, n in sorted(counts.items())))
    proc.terminate()
    proc.wait(timeout=130)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(here, "..", "build", "kvpack"))
    ap.add_argument("--model", default=os.path.join(os.environ.get("KVPACK_SHARED_DIR", os.path.join(here, "..", "..", "shared")),
                                                    "models", "stories260K.gguf"))
    ap.add_argument("--idle", type=int, default=200)
    ap.add_argument("--concurrent", type=int, default=4)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("checks", nargs="*", default=["idle", "headers", "busyport", "closed"])
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    for c in a.checks:
        globals()["check_" + c](a)


if __name__ == "__main__":
    main()
