#!/usr/bin/python3
"""Soak test of `kvpack serve`: many concurrent clients for a long time, every response checked.

Starts the server (API key on, a KV page pool small enough that sequences are preempted, a small host
cold tier so preempted sequences swap out and come back bit-identical, TriAttention calibrated here), records
the solo output of every request spec one at a time on the idle server, then runs N clients until the
duration is over. Each client loops over random requests: completions and chat, streamed and not,
greedy (compared with their solo run), seeded sampling (also reproducible, also compared), unseeded
sampling (checked for shape only), streams the client drops after a few events (mid-stream
disconnects), and requests without or with a wrong API key (must be 401). Per-request kv_policy and
kv_budget are random.

Checked, any failure makes the exit status 1:
  * every response: status 200, well-formed JSON / SSE (one id per stream, [DONE] last, a finish reason),
    completion_tokens within max_tokens (equal with ignore_eos), text equal to the solo run's when
    reproducible (nothing lost, truncated or corrupted);
  * at the end, once idle (/metrics): no KV page in use, nothing running or waiting, no failed request,
    every accepted request counted finished or cancelled, preemptions happened;
  * RSS after the warm-up within +-5 % of its value at the end of the warm-up; the open file
    descriptors and threads of the server the same once idle as before the load (and threads flat
    throughout), read from /proc/PID.

    scripts/soak.py [--binary build/kvpack] [--model ../shared/models/stories260K.gguf]
                    [--clients 64] [--duration 600] [--warmup S] [--seed N] [-- EXTRA SERVE ARGS]

Stdlib only (Debian's /usr/bin/python3).
"""
import argparse
import http.client
import json
import os
import random
import re
import secrets
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
POLICIES = ["full", "streaming", "knorm", "triattention", "trispan", "snapkv", "rkv", "tova", "h2o"]
STARTS = ["Once upon a time", "The little dog", "Lily and Ben went to the park", "One day, a big bird",
          "Tom had a red ball", "The sun was hot and", "Sara wanted a cookie", "In a small house there lived"]
PREFIXES = ["", "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her dog. ",
            "Tom and his friend Sam liked to build big towers with blocks. One day the tower fell down and they laughed. "]


def start_server(cmd):
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    port = 0
    for line in proc.stderr:
        m = re.search(r"on http://[^:]+:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if not port:
        sys.exit("soak: the server did not start: " + " ".join(cmd))
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    return proc, port


def proc_figures(pid):
    """(RSS bytes, threads, open fds) of a process, from /proc."""
    rss = threads = 0
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss, threads, len(os.listdir("/proc/%d/fd" % pid))


class Api:
    def __init__(self, port, key):
        self.port, self.key = port, key

    def conn(self, timeout=300):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def headers(self, key=True):
        h = {"Content-Type": "application/json"}
        if key is True:
            h["Authorization"] = "Bearer " + self.key
        elif key:
            h["Authorization"] = "Bearer " + key
        return h

    def get(self, path):
        c = self.conn(30)
        try:
            c.request("GET", path, headers=self.headers())
            r = c.getresponse()
            return r.status, r.read().decode()
        finally:
            c.close()

    def metrics(self):
        status, text = self.get("/metrics")
        if status != 200:
            raise RuntimeError("/metrics: status %d" % status)
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or " " not in line:
                continue
            name, value = line.rsplit(" ", 1)
            base = name.split("{", 1)[0]
            out[name] = float(value)
            if "{" in name:  # labelled series are also summed under the bare name
                out[base + "{*}"] = out.get(base + "{*}", 0.0) + float(value)
        # The request counters have vLLM's names (with a model_name label); the checks below use these.
        out["kvpack_requests_running"] = out.get("vllm:num_requests_running{*}", 0.0)
        out["kvpack_requests_waiting"] = out.get("vllm:num_requests_waiting{*}", 0.0)
        out["kvpack_generated_tokens_total"] = out.get("vllm:generation_tokens_total{*}", 0.0)
        aborted = sum(v for k, v in out.items() if k.startswith("vllm:request_success_total{") and 'finished_reason="abort"' in k)
        out["kvpack_requests_cancelled_total"] = aborted
        out["kvpack_requests_finished_total"] = out.get("vllm:request_success_total{*}", 0.0) - aborted
        return out


def make_specs(rng, n):
    """Request specs: (path, body) pairs whose output is reproducible (greedy or seeded)."""
    specs = []
    for i in range(n):
        prompt = rng.choice(PREFIXES) + rng.choice(STARTS)
        policy = rng.choice(POLICIES)
        body = {"max_tokens": rng.randint(16, 120), "ignore_eos": rng.random() < 0.7, "kv_policy": policy}
        if policy != "full":
            body["kv_budget"] = rng.choice([32, 48, 64])
        if i % 4 == 3:
            body.update(temperature=0.8, top_p=0.95, seed=rng.randint(1, 1 << 30))  # seeded: reproducible too
        else:
            body["temperature"] = 0
        if i % 3 == 2:
            path = "/v1/chat/completions"
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            path = "/v1/completions"
            body["prompt"] = prompt
        specs.append((path, body))
    return specs


def text_of(choice, chat, streamed):
    if not chat:
        return choice.get("text", "")
    part = choice.get("delta" if streamed else "message") or {}
    return part.get("content") or ""


def run_request(api, path, body, stream, drop_after=None):
    """Sends one request. Returns a dict: status, text, finish, usage, events, error (a malformed
    response), dropped (the client hung up on purpose)."""
    chat = path.endswith("chat/completions")
    body = dict(body)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    c = api.conn()
    res = {"status": 0, "text": "", "finish": None, "usage": None, "events": 0, "error": None, "dropped": False}
    try:
        c.request("POST", path, body=json.dumps(body), headers=api.headers())
        r = c.getresponse()
        res["status"] = r.status
        if not stream or r.status != 200:
            raw = r.read()
            try:
                j = json.loads(raw)
            except ValueError:
                res["error"] = "unparsable body: %r" % raw[:200]
                return res
            if r.status != 200:
                res["error"] = "status %d: %s" % (r.status, raw[:300])
                return res
            ch = j["choices"][0]
            res.update(text=text_of(ch, chat, False), finish=ch.get("finish_reason"), usage=j.get("usage"))
            if j.get("object") != ("chat.completion" if chat else "text_completion"):
                res["error"] = "object %r" % j.get("object")
            return res
        ids, done, after_done = set(), False, False
        while True:
            line = r.readline()
            if not line:
                break
            line = line.decode("utf-8", "strict").rstrip("\n")
            if not line.startswith("data: "):
                continue  # blank separators and keep-alive comments
            data = line[6:]
            if done:
                after_done = True
            if data == "[DONE]":
                done = True
                continue
            j = json.loads(data)
            res["events"] += 1
            if "error" in j:
                res["error"] = "stream error event: %s" % data[:300]
                continue
            ids.add(j.get("id"))
            if j.get("usage"):
                res["usage"] = j["usage"]
            for ch in j.get("choices") or []:
                res["text"] += text_of(ch, chat, True)
                if ch.get("finish_reason"):
                    res["finish"] = ch["finish_reason"]
            if drop_after is not None and res["events"] >= drop_after:
                res["dropped"] = True
                c.sock.close()  # mid-stream disconnect: the server must cancel and free the pages
                return res
        if not done or after_done:
            res["error"] = "stream ended without [DONE]" if not done else "data after [DONE]"
        elif len(ids) != 1:
            res["error"] = "stream with %d ids" % len(ids)
        return res
    except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError) as e:
        res["error"] = "%s: %s" % (type(e).__name__, e)
        return res
    finally:
        c.close()


def check(res, body, want):
    """Problems with one completed response (not dropped), '' if none."""
    if res["error"]:
        return res["error"]
    if res["status"] != 200:
        return "status %d" % res["status"]
    u = res["usage"]
    if not u:
        return "no usage"
    if res["finish"] not in ("length", "stop"):
        return "finish_reason %r" % res["finish"]
    if u["completion_tokens"] > body["max_tokens"] or (body.get("ignore_eos") and u["completion_tokens"] != body["max_tokens"]):
        return "completion_tokens %d for max_tokens %d" % (u["completion_tokens"], body["max_tokens"])
    if want is not None:
        recomputed = u.get("kvpack", {}).get("recomputes", 0) > 0 and body["kv_policy"] != "full"
        if recomputed:
            return "recomputed (with a cold tier a preempted sequence must swap)"
        if res["text"] != want["text"] or u["completion_tokens"] != want["tokens"]:
            return "output differs from the solo run (%d vs %d tokens): %r vs %r" % (
                u["completion_tokens"], want["tokens"], res["text"][:80], want["text"][:80])
    return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(HERE, "..", "build", "kvpack"))
    ap.add_argument("--shared", default=os.environ.get("KVPACK_SHARED_DIR", os.path.join(HERE, "..", "..", "shared")))
    ap.add_argument("--model", default=None, help="default: SHARED/models/stories260K.gguf")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=600, help="seconds of load")
    ap.add_argument("--warmup", type=float, default=None, help="seconds before RSS must stay flat (default: a quarter of the duration, at most 120)")
    ap.add_argument("--kv-pages", type=int, default=600, help="20 streams x 30 pages: a few full-length sequences")
    ap.add_argument("--specs", type=int, default=48, help="distinct reproducible request specs")
    ap.add_argument("--kv-cold", default="host:4M",
                    help="cold tier; small, so that it fills (its memory is kept at the high-water mark) during the warm-up")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("extra", nargs="*", help="extra `kvpack serve` arguments (after --)")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.randrange(1 << 31)
    warmup = a.warmup if a.warmup is not None else min(120.0, a.duration / 4)
    model = a.model or os.path.join(a.shared, "models", "stories260K.gguf")
    print("soak: seed %d, %d clients, %.0f s (warm-up %.0f s), %d pages" % (seed, a.clients, a.duration, warmup, a.kv_pages), flush=True)

    tmp = tempfile.mkdtemp(prefix="kvpack-soak-")
    calib = os.path.join(tmp, "stories.calib")
    subprocess.run([a.binary, "calibrate", "-q", "-m", model, "--text", os.path.join(a.shared, "corpora", "austen.txt"),
                    "--max-tokens", "4096", "-o", calib, "-t", "1"], check=True, stdout=subprocess.DEVNULL)
    key = secrets.token_hex(16)
    cmd = [a.binary, "serve", "-q", "-m", model, "--port", "0", "--api-key", key, "--kv-calib", calib,
           "--kv-pages", str(a.kv_pages), "--kv-cold", a.kv_cold, "--kv-interval", "16", "--admission", "watermark",
           "--max-batch", "16", "--max-concurrent", str(a.clients + 8), "-t", "1"] + a.extra
    proc, port = start_server(cmd)
    api = Api(port, key)
    failures, lock = [], threading.Lock()

    def fail(msg):
        with lock:
            failures.append(msg)
            if len(failures) <= 20:
                print("soak: FAIL " + msg, flush=True)

    try:
        rng = random.Random(seed)
        specs = make_specs(rng, a.specs)
        # Solo runs, one at a time on the idle server: the reference of every reproducible request.
        solo = []
        for path, body in specs:
            r = run_request(api, path, body, stream=False)
            if r["error"] or r["status"] != 200:
                sys.exit("soak: solo run failed: %s %s: %s" % (path, json.dumps(body), r["error"]))
            solo.append({"text": r["text"], "tokens": r["usage"]["completion_tokens"]})
        time.sleep(0.5)
        m0 = api.metrics()
        rss0, threads0, fds0 = proc_figures(proc.pid)
        print("soak: %d solo runs recorded; server idle: RSS %.1f MB, %d threads, %d fds" % (len(solo), rss0 / 2**20, threads0, fds0), flush=True)

        counts = {k: 0 for k in ("greedy", "seeded", "sampled", "streamed", "dropped", "unauthorized", "accepted")}
        t_start = time.time()
        t_end = t_start + a.duration
        samples = []  # (t, rss, threads, fds, cold tier bytes in use)
        stop = threading.Event()

        def monitor():
            while not stop.wait(2.0):
                try:
                    cold = api.metrics().get("kvpack_kv_cold_used_bytes", 0)
                except (OSError, http.client.HTTPException, RuntimeError):
                    cold = -1
                samples.append((time.time() - t_start,) + proc_figures(proc.pid) + (cold,))

        def client(ci):
            crng = random.Random(seed * 1000 + ci)
            while time.time() < t_end:
                x = crng.random()
                if x < 0.03:  # no key / a wrong key: 401, never served
                    c = api.conn(30)
                    try:
                        c.request("POST", "/v1/completions", body=json.dumps({"prompt": "x", "max_tokens": 4}),
                                  headers=api.headers(crng.choice([None, "wrong-key"])))
                        r = c.getresponse()
                        r.read()
                        if r.status != 401:
                            fail("unauthenticated request got %d" % r.status)
                    except (OSError, http.client.HTTPException) as e:
                        fail("unauthenticated request: %s" % e)
                    finally:
                        c.close()
                    with lock:
                        counts["unauthorized"] += 1
                    continue
                i = crng.randrange(len(specs))
                path, body = specs[i]
                want = solo[i]
                kind = "seeded" if "seed" in body else "greedy"
                if x < 0.13:  # unseeded sampling: shape checks only
                    body = dict(body, temperature=0.9)
                    body.pop("seed", None)
                    want, kind = None, "sampled"
                stream = crng.random() < 0.5
                drop = crng.randint(1, 6) if stream and crng.random() < 0.25 else None
                r = run_request(api, path, body, stream, drop)
                with lock:
                    counts[kind] += 1
                    counts["streamed"] += stream
                    counts["dropped"] += r["dropped"]
                    counts["accepted"] += r["status"] == 200
                if r["dropped"]:
                    if r["error"]:
                        fail("dropped stream: %s" % r["error"])
                    continue
                problem = check(r, body, want)
                if problem:
                    fail("%s %s %s: %s" % (path, "stream" if stream else "json", json.dumps(body), problem))

        mon = threading.Thread(target=monitor, daemon=True)
        mon.start()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        mon.join()
        elapsed = time.time() - t_start

        # Idle again: pages, queues, counters, fds.
        idle_deadline = time.time() + 30
        while True:
            m1 = api.metrics()
            rss1, threads1, fds1 = proc_figures(proc.pid)
            idle = m1["kvpack_requests_running"] == 0 and m1["kvpack_requests_waiting"] == 0 and m1["kvpack_kv_pages_used"] == 0
            if (idle and fds1 == fds0) or time.time() > idle_deadline:
                break
            time.sleep(0.5)
        d = lambda name: m1.get(name, 0) - m0.get(name, 0)
        if not idle:
            fail("not idle 30 s after the load: running %d, waiting %d, pages used %d" % (
                m1["kvpack_requests_running"], m1["kvpack_requests_waiting"], m1["kvpack_kv_pages_used"]))
        if m1["kvpack_kv_pages_free"] != m1["kvpack_kv_pages_total"]:
            fail("pages free %d of %d once idle" % (m1["kvpack_kv_pages_free"], m1["kvpack_kv_pages_total"]))
        if d("kvpack_requests_failed_total") != 0:
            fail("%d requests failed" % d("kvpack_requests_failed_total"))
        ended = d("kvpack_requests_finished_total") + d("kvpack_requests_cancelled_total")
        if ended != counts["accepted"]:
            fail("requests lost: %d accepted, %d finished + cancelled" % (counts["accepted"], ended))
        if counts["dropped"] and d("kvpack_requests_cancelled_total") == 0:
            fail("%d streams dropped mid-way, none cancelled" % counts["dropped"])
        preempted = d("kvpack_preemptions_total{*}")
        if preempted == 0:
            fail("no preemption happened: the pool is not small enough for this load")
        if fds1 != fds0:
            fail("open fds %d once idle, %d before the load" % (fds1, fds0))
        if threads1 != threads0:
            fail("threads %d once idle, %d before the load" % (threads1, threads0))
        after = [s for s in samples if s[0] >= warmup]
        rss_base = after[0][1] if after else None
        rss_dev = max(abs(s[1] - rss_base) / rss_base for s in after) if after else 0.0
        if not after:
            fail("no RSS sample after the warm-up (duration too short?)")
        elif rss_dev > 0.05:
            fail("RSS after the warm-up moved %.1f %% (%.1f -> %.1f..%.1f MB)" % (
                100 * rss_dev, rss_base / 2**20, min(s[1] for s in after) / 2**20, max(s[1] for s in after) / 2**20))
        max_threads = max((s[2] for s in samples), default=threads0)
        if max_threads != threads0:
            fail("threads under load went to %d (idle %d)" % (max_threads, threads0))

        total = counts["greedy"] + counts["seeded"] + counts["sampled"]
        print("soak: %.0f s, %d requests (%.1f/s): %d greedy, %d seeded, %d sampled; %d streamed, %d dropped mid-stream; "
              "%d unauthenticated (401)" % (elapsed, total, total / elapsed, counts["greedy"], counts["seeded"], counts["sampled"],
                                            counts["streamed"], counts["dropped"], counts["unauthorized"]))
        print("soak: server: %d finished, %d cancelled, %d failed; %d preemptions, %d swap-outs, %d recomputes; "
              "%d generated tokens; prefix-cache hits %d" % (
                  d("kvpack_requests_finished_total"), d("kvpack_requests_cancelled_total"), d("kvpack_requests_failed_total"),
                  preempted, d("kvpack_kv_swap_outs_total"), d("kvpack_kv_recomputes_total"), d("kvpack_generated_tokens_total"),
                  d("kvpack_prefix_cache_hits_total")))
        if after:
            print("soak: RSS idle %.1f MB; after warm-up %.1f MB, range %.1f..%.1f MB (max deviation %.2f %%); idle after %.1f MB" % (
                rss0 / 2**20, rss_base / 2**20, min(s[1] for s in after) / 2**20, max(s[1] for s in after) / 2**20,
                100 * rss_dev, rss1 / 2**20))
        if after:  # the RSS curve, for the record: every minute
            print("soak: RSS / cold tier in use (MB) by time: " + ", ".join(
                "%.0fs %.1f/%.1f" % (s[0], s[1] / 2**20, s[4] / 2**20) for s in samples[::30]))
        print("soak: threads idle %d, max under load %d, idle after %d; fds idle %d, max under load %d, idle after %d" % (
            threads0, max_threads, threads1, fds0, max((s[3] for s in samples), default=fds0), fds1))
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        for f in os.listdir(tmp):
            os.unlink(os.path.join(tmp, f))
        os.rmdir(tmp)
    if proc.returncode not in (0, -15):
        failures.append("server exit status %s" % proc.returncode)
    if failures:
        print("soak: FAILED (%d problems)" % len(failures))
        return 1
    print("soak: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
