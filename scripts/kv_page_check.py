#!/usr/bin/env python3
"""The live page map (GET /kv) in a real browser: headless Chromium driven over WebDriver (chromedriver).

Starts `kvpack serve` (host cold tier, API key on), opens /kv#key=KEY, keeps clients sending compressed
and plain completions for a few seconds, and checks that the page loaded, polled, showed running
sequences with their per-(layer, head) page grids, that its step counter moved, and that it logged a
compaction. Writes a screenshot taken while requests ran.

    scripts/kv_page_check.py KVPACK MODEL [--screenshot FILE] [--seconds S]
    scripts/kv_page_check.py --attach http://127.0.0.1:PORT --screenshot FILE [--seconds S]
        (a server someone else drives, e.g. `kvpack bench serve`, which prints its port: waits until the
        page shows at least two sequences with their grids, or S seconds, and takes the screenshot)

Exit 0: every check passed; 1: a check failed; 77: no chromium / chromedriver (ctest: skipped).
Standard library only.
"""
import argparse
import base64
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

KEY = "page-map-test-key"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, headers=None, timeout=60):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


class WebDriver:
    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"
        caps = {"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": shutil.which("chromium") or "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1100"]}}}}
        self.sid = http("POST", self.base + "/session", caps)["value"]["sessionId"]

    def cmd(self, method, path, body=None):
        return http(method, f"{self.base}/session/{self.sid}{path}", body)["value"]

    def js(self, script):
        return self.cmd("POST", "/execute/sync", {"script": script, "args": []})

    def quit(self):
        try:
            http("DELETE", f"{self.base}/session/{self.sid}")
        except Exception:
            pass


def start_driver():
    dport = free_port()
    proc = subprocess.Popen(["chromedriver", f"--port={dport}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            if http("GET", f"http://127.0.0.1:{dport}/status", timeout=2)["value"]["ready"]:
                break
        except Exception:
            time.sleep(0.1)
    return proc, WebDriver(dport)


def attach(a):
    proc, driver = start_driver()
    try:
        driver.cmd("POST", "/url", {"url": a.attach.rstrip("/") + "/kv" + (f"#key={a.key}" if a.key else "")})
        t_end, best = time.time() + a.seconds, (-1, None)
        while time.time() < t_end:
            n = driver.js("return document.querySelectorAll('.seq svg').length")
            if n > best[0]:
                best = (n, driver.cmd("GET", "/screenshot"))
            if n >= 2:
                time.sleep(1.5)  # a little history in the chart, events in the log
                best = (n, driver.cmd("GET", "/screenshot"))
                break
            time.sleep(0.25)
        if best[1] is None:
            print("FAIL: no screenshot")
            return 1
        with open(a.screenshot, "wb") as f:
            f.write(base64.b64decode(best[1]))
        print(f"screenshot with {best[0]} sequence grids -> {a.screenshot}")
        return 0
    finally:
        driver.quit()
        proc.terminate()
        proc.wait(10)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvpack", nargs="?")
    ap.add_argument("model", nargs="?")
    ap.add_argument("--attach", default="", help="URL of a running server (no own server or clients)")
    ap.add_argument("--key", default="", help="API key of the --attach server")
    ap.add_argument("--screenshot", default="")
    ap.add_argument("--seconds", type=float, default=8)
    a = ap.parse_args()
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        print("SKIP: chromium / chromedriver not installed (apt-get install chromium chromium-driver)")
        return 77

    if a.attach:
        return attach(a)
    if not (a.kvpack and a.model):
        ap.error("KVPACK and MODEL are required without --attach")
    port = free_port()
    srv = subprocess.Popen([a.kvpack, "serve", "-m", a.model, "--port", str(port), "--api-key", KEY, "--kv-cold", "host:64M",
                            "-t", "1", "-q"], stderr=subprocess.PIPE, text=True)
    seen = []
    for _ in range(50):  # start-up notes (chat template, calibration) come before the "serving" line
        line = srv.stderr.readline()
        seen.append(line)
        if not line or "serving" in line:
            break
    if "serving" not in seen[-1]:
        srv.kill()
        srv.wait()
        print("FAIL: the server did not start:", "".join(seen))
        return 1
    threading.Thread(target=lambda: [None for _ in srv.stderr], daemon=True).start()  # drain
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": "Bearer " + KEY}
    dport = free_port()
    drv_proc = subprocess.Popen(["chromedriver", f"--port={dport}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    failures = []
    driver = None
    try:
        for _ in range(100):
            try:
                if http("GET", f"http://127.0.0.1:{dport}/status", timeout=2)["value"]["ready"]:
                    break
            except Exception:
                time.sleep(0.1)
        driver = WebDriver(dport)
        driver.cmd("POST", "/url", {"url": f"{base}/kv#key={KEY}"})
        t_end = time.time() + 20
        while time.time() < t_end and int(driver.js("return document.body.dataset.polls || 0")) < 1:
            time.sleep(0.1)
        if int(driver.js("return document.body.dataset.polls || 0")) < 1:
            failures.append("the page never polled /kv/state: " + str(driver.js("return document.getElementById('status').textContent")))

        stop = threading.Event()
        errors = []

        def client(i):
            n = 0
            while not stop.is_set():
                body = {"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "ignore_eos": True}
                if i % 2 == 0:
                    body.update({"kv_policy": "knorm", "kv_budget": 48, "kv_recall": i == 0})
                try:
                    http("POST", base + "/v1/completions", body, auth, timeout=120)
                except Exception as e:  # noqa: BLE001 - any failure is a finding
                    errors.append(repr(e))
                    return
                n += 1

        clients = [threading.Thread(target=client, args=(i,)) for i in range(4)]
        for c in clients:
            c.start()
        steps, max_seqs, cells, shot = [], 0, 0, None
        t_end = time.time() + a.seconds
        while time.time() < t_end:
            st = driver.js("return [document.getElementById('step').textContent, document.querySelectorAll('.seq').length,"
                           " document.querySelectorAll('.seq rect').length]")
            if st[0].isdigit():
                steps.append(int(st[0]))
            max_seqs = max(max_seqs, st[1])
            cells = max(cells, st[2])
            if shot is None and st[1] >= 2 and st[2] > 0:
                time.sleep(0.6)  # let a compaction show in the event log
                shot = driver.cmd("GET", "/screenshot")
            time.sleep(0.25)
        stop.set()
        for c in clients:
            c.join()
        events = driver.js("return document.getElementById('events').textContent")
        if errors:
            failures.append("client errors: " + "; ".join(errors[:3]))
        if len(set(steps)) < 3:
            failures.append(f"the step counter did not move while requests ran: {sorted(set(steps))[:10]}")
        if max_seqs < 1:
            failures.append("no running sequence ever appeared on the page")
        if cells < 1:
            failures.append("no per-(layer, head) page grid was drawn")
        if not re.search(r"compacted: \d+ tokens evicted", events):
            failures.append("no compaction was logged in the page's events:\n" + events[:500])
        state = http("GET", base + "/kv/state", headers=auth)
        if state["pool"]["total"] != state["pool"]["active"] + state["pool"]["cached"] + state["pool"]["free"]:
            failures.append("pool states do not add up: " + json.dumps(state["pool"]))
        try:
            http("GET", base + "/kv/state")
            failures.append("/kv/state answered without the API key")
        except urllib.error.HTTPError as e:
            if e.code != 401:
                failures.append(f"/kv/state without the key: HTTP {e.code}, expected 401")
        if a.screenshot:
            if shot is None:
                shot = driver.cmd("GET", "/screenshot")
            with open(a.screenshot, "wb") as f:
                f.write(base64.b64decode(shot))
        print(f"page map: {len(steps)} reads, steps {min(steps) if steps else '-'}..{max(steps) if steps else '-'}, "
              f"up to {max_seqs} sequences, {cells} grid cells, {events.count('compacted')} compactions logged")
    finally:
        if driver:
            driver.quit()
        drv_proc.terminate()
        srv.terminate()
        try:
            srv.wait(10)
        except subprocess.TimeoutExpired:
            srv.kill()
        drv_proc.wait(10)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
