#!/usr/bin/env python3
"""Replays a JSON-lines request log against a running `kvpack serve`, one request at a time in file order.

Each line is an OpenAI request body, or a request-log line with the body under "request" (the shapes
`kvpack analyze-prefix` reads). Chat bodies go to /v1/chat/completions, the others to /v1/completions,
with max_tokens 1 and temperature 0 (only the prompt matters for the prefix cache). The server does not
take "tools" yet: they are dropped (and counted). Used to check the analyzer's simulated hit rate against
the server's own request log on the same traffic (docs/observability.md, "Prefix-stability analyzer").

    scripts/replay_requests.py traffic.jsonl http://127.0.0.1:8080 [--limit N]
"""
import argparse
import json
import sys
import urllib.error
import urllib.request


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("url", help="base URL of the server, e.g. http://127.0.0.1:8080 (loopback only)")
    ap.add_argument("--limit", type=int, default=0, help="send at most this many requests (0: all)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    a = ap.parse_args()
    sent = failed = tools_dropped = 0
    with open(a.log, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            if a.limit and sent >= a.limit:
                break
            j = json.loads(line)
            body = dict(j.get("request", j))
            if body.pop("tools", None):
                tools_dropped += 1
            body.update({"max_tokens": 1, "temperature": 0, "stream": False})
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            req = urllib.request.Request(a.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=a.timeout) as r:
                    r.read()
            except urllib.error.HTTPError as e:
                failed += 1
                print(f"line {n}: HTTP {e.code}: {e.read()[:200]!r}", file=sys.stderr)
            sent += 1
    print(f"sent {sent} requests, {failed} refused, tools dropped from {tools_dropped}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
