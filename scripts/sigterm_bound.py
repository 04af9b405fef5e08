#!/usr/bin/env python3
"""SIGTERM with trickling clients: how long `kvpack serve` takes to exit, and what in-flight streams see.

Per run: start the server (--max-batch 1, so all but one stream wait in the queue: they are in flight,
their SSE head sent, when the signal comes), open trickling clients (request headers, and a request
body, one byte every 100 ms, for as long as the server keeps them), start the streams, and once the
first stream has produced tokens send SIGTERM; measure until the process has exited.

    scripts/sigterm_bound.py [--binary build/kvpack] [--model ../shared/models/stories260K.gguf]
                             [--runs 5] [--streams 6] [--tricklers 50] [--stalled 0] [-- EXTRA SERVE ARGS]

--stalled N adds clients that pipeline requests and never read: the server cannot finish writing to
them, so shutdown waits --shutdown-grace (1 s) for them, then closes them (the worst case).

A stream passes if it ends with [DONE] after either its normal finish or the `shutting_down` error
event. Exit status 1 when a run took more than --target-ms, a stream was cut without [DONE], or no
stream saw the shutting_down event.
"""
import argparse
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time


def start_server(cmd):
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    port = 0
    for line in proc.stderr:
        m = re.search(r"on http://[^:]+:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if not port:
        sys.exit("sigterm_bound: the server did not start: " + " ".join(cmd))
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    return proc, port


def trickle(port, body, stop):
    """One trickling client: a request header (or a body) sent a byte every 100 ms until cut."""
    s = socket.create_connection(("127.0.0.1", port))
    if body:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
        data = b" " * 100000
    else:
        data = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"s" * 100000
    s.settimeout(0.1)
    for i in range(len(data)):
        if stop.is_set():
            break
        try:
            s.send(data[i:i + 1])
            if s.recv(4096) == b"":
                break  # the server closed it
        except socket.timeout:
            continue
        except OSError:
            break
    s.close()


def stalled(port, holder):
    """A client that never reads: 1500 pipelined GET /metrics (~15 MB of answers) fill the socket
    buffers, so the server's write to it can never complete."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 1500)
    holder.append(s)


def stream(port, out, first_token):
    res = {"done": False, "shutting_down": False, "finish": None, "tokens": 0, "status": 0}
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 480, "temperature": 0, "ignore_eos": True, "stream": True})
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        res["status"] = r.status
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                res["done"] = True
                continue
            j = json.loads(data)
            if "error" in j:
                res["shutting_down"] = j["error"].get("code") == "shutting_down"
            elif j.get("choices"):
                if j["choices"][0].get("finish_reason"):
                    res["finish"] = j["choices"][0]["finish_reason"]
                else:
                    res["tokens"] += 1
                    first_token.set()
    except (OSError, ValueError, http.client.HTTPException) as e:
        res["error"] = repr(e)
    out.append(res)


def one_run(a):
    cmd = [a.binary, "serve", "-m", a.model, "--port", "0", "--threads", "1", "--max-batch", "1"] + a.serve_args
    proc, port = start_server(cmd)
    stop = threading.Event()
    ts = [threading.Thread(target=trickle, args=(port, i % 5 == 4, stop), daemon=True) for i in range(a.tricklers)]
    for t in ts:
        t.start()
    time.sleep(0.3)
    held = []
    for _ in range(a.stalled):
        stalled(port, held)
    results, first = [], threading.Event()
    ss = [threading.Thread(target=stream, args=(port, results, first)) for _ in range(a.streams)]
    for t in ss:
        t.start()
    first.wait(30)
    time.sleep(0.05)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait()
    exit_ms = (time.monotonic() - t0) * 1000
    for t in ss:
        t.join(60)
    stop.set()
    for h in held:
        h.close()
    return exit_ms, rc, results


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(here, "..", "build", "kvpack"))
    ap.add_argument("--model", default=os.path.join(os.environ.get("KVPACK_SHARED_DIR", os.path.join(here, "..", "..", "shared")),
                                                    "models", "stories260K.gguf"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--streams", type=int, default=6)
    ap.add_argument("--tricklers", type=int, default=50)
    ap.add_argument("--stalled", type=int, default=0, help="clients that never read their answers (they use up the grace)")
    ap.add_argument("--target-ms", type=float, default=2000)
    ap.add_argument("serve_args", nargs="*")
    a = ap.parse_args()
    worst, bad = 0.0, False
    for i in range(a.runs):
        exit_ms, rc, res = one_run(a)
        worst = max(worst, exit_ms)
        sd = sum(1 for r in res if r["shutting_down"] and r["done"])
        fin = sum(1 for r in res if r["finish"] and r["done"] and not r["shutting_down"])
        cut = [r for r in res if not r["done"]]
        print(f"run {i + 1}: exit after {exit_ms:.0f} ms (status {rc}); streams: {sd} got shutting_down + [DONE], "
              f"{fin} finished normally, {len(cut)} cut without [DONE]", flush=True)
        for r in cut:
            print("   cut:", r)
        bad |= exit_ms > a.target_ms or bool(cut) or sd == 0 or rc != 0
    print(f"worst exit: {worst:.0f} ms over {a.runs} runs ({a.tricklers} trickling clients, {a.streams} streams, "
          f"{a.stalled} stalled readers)")
    print("result: " + ("FAIL" if bad else "PASS") + f" (target <= {a.target_ms:g} ms, every stream ends with [DONE])")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
