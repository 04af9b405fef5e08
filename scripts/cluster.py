#!/usr/bin/python3
"""A local kvpack cluster on loopback ports: Redis (the shared KV tier), N `kvpack serve` replicas and
HAProxy in front of them (docs/scale.md). Standard library only.

  scripts/cluster.py start  [--replicas 3] [--routing affinity|roundrobin] [--no-shared] ...
  scripts/cluster.py status
  scripts/cluster.py stop
  scripts/cluster.py kill-replica I | start-replica I | stop-redis | start-redis   (fault drills)

Everything lives in one state directory (--dir, default /tmp/kvpack-cluster-$USER): generated configs
(deploy/haproxy/kvpack.cfg.in, deploy/redis/kvpack.conf.in with the ports filled in), logs, pid files
and state.json, which later commands read. Nothing needs root: HAProxy and Redis run as the current
user with their files in that directory.

As a module (the integration test, the benchmark): Cluster(Config(...)).start() / .stop() / ...
"""
import argparse
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, timeout, what, step=0.05):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(step)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


def http_ok(port, path="/health", timeout=1.0):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status == 200
    except Exception:
        return False


def alive(pid):
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    # A zombie child of ours is not alive.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except OSError:
        return False


def stop_pid(pid, timeout=5.0, sig=signal.SIGTERM):
    if not alive(pid):
        return
    try:
        os.kill(pid, sig)
    except OSError:
        return
    end = time.time() + timeout
    while time.time() < end and alive(pid):
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.02)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


@dataclasses.dataclass
class Config:
    binary: str = os.path.join(ROOT, "build", "kvpack")
    model: str = ""
    replicas: int = 3
    routing: str = "affinity"       # affinity: consistent hash on X-Session-Id / body prefix; roundrobin
    shared: bool = True             # replicas use Redis as the shared KV tier
    dir: str = f"/tmp/kvpack-cluster-{os.environ.get('USER', os.getuid())}"
    proxy_port: int = 0             # 0: pick free ports
    redis_port: int = 0
    replica_ports: list = dataclasses.field(default_factory=list)
    redis_maxmemory: str = "256mb"
    shared_options: str = "ttl=600&timeout_ms=50&failures=3&open_ms=1000"
    body_key_bytes: int = 256
    threads: int = 1
    serve_args: list = dataclasses.field(default_factory=list)  # extra `kvpack serve` arguments
    start_timeout: float = 30.0


class Cluster:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.state = {}

    # ---- state ----
    @property
    def state_file(self):
        return os.path.join(self.cfg.dir, "state.json")

    def save(self):
        with open(self.state_file, "w") as f:
            json.dump({"config": dataclasses.asdict(self.cfg), **self.state}, f, indent=1)

    @classmethod
    def load(cls, dir):
        with open(os.path.join(dir, "state.json")) as f:
            st = json.load(f)
        c = cls(Config(**st.pop("config")))
        c.state = st
        return c

    @property
    def proxy_url(self):
        return f"http://127.0.0.1:{self.cfg.proxy_port}"

    def replica_url(self, i):
        return f"http://127.0.0.1:{self.cfg.replica_ports[i]}"

    # ---- start / stop ----
    def start(self):
        cfg = self.cfg
        if not cfg.model:
            raise ValueError("--model is required")
        if os.path.exists(self.state_file):
            try:
                Cluster.load(cfg.dir).stop()
            except Exception:
                pass
        shutil.rmtree(cfg.dir, ignore_errors=True)
        os.makedirs(cfg.dir)
        cfg.proxy_port = cfg.proxy_port or free_port()
        cfg.redis_port = cfg.redis_port or free_port()
        if len(cfg.replica_ports) != cfg.replicas:
            cfg.replica_ports = [free_port() for _ in range(cfg.replicas)]
        self.state = {"redis": 0, "proxy": 0, "replicas": [0] * cfg.replicas}
        try:
            if cfg.shared:
                self.start_redis()
            for i in range(cfg.replicas):
                self.start_replica(i)
            self.start_proxy()
        except Exception:
            self.stop()
            raise
        self.save()
        return self

    def start_redis(self):
        cfg = self.cfg
        conf = os.path.join(cfg.dir, "redis.conf")
        with open(os.path.join(ROOT, "deploy", "redis", "kvpack.conf.in")) as f:
            text = f.read()
        text = (text.replace("@PORT@", str(cfg.redis_port)).replace("@MAXMEMORY@", cfg.redis_maxmemory)
                .replace("@STATE_DIR@", cfg.dir))
        with open(conf, "w") as f:
            f.write(text)
        p = subprocess.Popen(["redis-server", conf], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        self.state["redis"] = p.pid
        wait_until(lambda: self._redis_ping(), 10, "redis-server")
        self.save()

    def _redis_ping(self):
        try:
            with socket.create_connection(("127.0.0.1", self.cfg.redis_port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def redis_command(self, *args):
        """One command over RESP (status / integer / bulk replies; enough for DBSIZE, INFO, FLUSHALL)."""
        payload = f"*{len(args)}\r\n" + "".join(f"${len(str(a))}\r\n{a}\r\n" for a in args)
        with socket.create_connection(("127.0.0.1", self.cfg.redis_port), timeout=2) as s:
            s.sendall(payload.encode())
            data = b""
            while True:
                data += s.recv(65536)
                if data[:1] in (b"+", b"-", b":") and data.endswith(b"\r\n"):
                    return data[1:-2].decode()
                if data[:1] == b"$":
                    head, _, rest = data.partition(b"\r\n")
                    n = int(head[1:])
                    if n < 0:
                        return None
                    if len(rest) >= n + 2:
                        return rest[:n].decode()

    def stop_redis(self):
        stop_pid(self.state.get("redis", 0))
        self.state["redis"] = 0
        self.save()

    def start_replica(self, i):
        cfg = self.cfg
        log = os.path.join(cfg.dir, f"replica{i}.log")
        cmd = [cfg.binary, "serve", "-m", cfg.model, "--host", "127.0.0.1", "--port", str(cfg.replica_ports[i]),
               "-t", str(cfg.threads)] + list(cfg.serve_args)
        if cfg.shared:
            cmd += ["--kv-shared", f"redis://127.0.0.1:{cfg.redis_port}?{cfg.shared_options}"]
        with open(log, "ab") as out:
            p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
        self.state["replicas"][i] = p.pid

        def serving():
            if p.poll() is not None:
                with open(log) as f:
                    raise RuntimeError(f"replica {i} exited ({p.returncode}) at start-up:\n{f.read()[-2000:]}")
            with open(log) as f:  # start-up prints notes first; "serving" comes when it listens
                return "serving" in f.read()
        wait_until(serving, cfg.start_timeout, f"replica {i} to serve")
        self.save()

    def kill_replica(self, i, sig=signal.SIGKILL):
        stop_pid(self.state["replicas"][i], sig=sig)
        self.state["replicas"][i] = 0
        self.save()

    def start_proxy(self):
        cfg = self.cfg
        with open(os.path.join(ROOT, "deploy", "haproxy", "kvpack.cfg.in")) as f:
            text = f.read()
        if cfg.routing == "affinity":
            balance = "balance hash var(txn.route_key)\n    hash-type consistent"
        elif cfg.routing == "roundrobin":
            balance = "balance roundrobin"
        else:
            raise ValueError(f"routing must be affinity or roundrobin, not {cfg.routing!r}")
        servers = "\n".join(f"    server r{i} 127.0.0.1:{p} check" for i, p in enumerate(cfg.replica_ports))
        text = (text.replace("@STATE_DIR@", cfg.dir).replace("@BIND@", f"127.0.0.1:{cfg.proxy_port}")
                .replace("@BODY_KEY_BYTES@", str(cfg.body_key_bytes)).replace("@BALANCE@", balance)
                .replace("@SERVERS@", servers))
        conf = os.path.join(cfg.dir, "haproxy.cfg")
        with open(conf, "w") as f:
            f.write(text)
        with open(os.path.join(ROOT, "deploy", "haproxy", "503.http")) as f:  # HTTP wants CRLF line ends
            with open(os.path.join(cfg.dir, "503.http"), "w", newline="") as g:
                g.write(f.read().replace("\r\n", "\n").replace("\n", "\r\n"))
        check = subprocess.run(["haproxy", "-c", "-q", "-f", conf], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy -c {conf}:\n{check.stdout}{check.stderr}")
        with open(os.path.join(cfg.dir, "haproxy.log"), "ab") as out:
            p = subprocess.Popen(["haproxy", "-db", "-f", conf], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                 start_new_session=True)
        self.state["proxy"] = p.pid
        self.save()
        self.wait_healthy()

    def wait_healthy(self, timeout=15.0):
        """The proxy answers /health and has every live replica marked up."""
        def ok():
            if not http_ok(self.cfg.proxy_port):
                return False
            live = sum(1 for pid in self.state["replicas"] if alive(pid))
            return self.proxy_servers_up() >= live
        wait_until(ok, timeout, "the proxy and its replicas to be healthy")

    def _show_stat(self):
        sock = os.path.join(self.cfg.dir, "haproxy.sock")
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(1)
                s.connect(sock)
                s.sendall(b"show stat\n")
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
        except OSError:
            return []
        lines = data.decode().splitlines()
        if not lines:
            return []
        names = lines[0].lstrip("# ").split(",")
        return [dict(zip(names, line.split(","))) for line in lines[1:] if line]

    def proxy_backend_stat(self):
        """The backend's row of HAProxy's `show stat` (wretr: retries, wredis: redispatches, ...)."""
        for row in self._show_stat():
            if row.get("pxname") == "replicas" and row.get("svname") == "BACKEND":
                return row
        return {}

    def proxy_servers_up(self):
        return sum(1 for row in self._show_stat()
                   if row.get("pxname") == "replicas" and row.get("svname", "").startswith("r") and row.get("status", "").startswith("UP"))

    def stop(self):
        stop_pid(self.state.get("proxy", 0))
        for pid in self.state.get("replicas", []):
            stop_pid(pid)
        stop_pid(self.state.get("redis", 0))
        self.state = {"redis": 0, "proxy": 0, "replicas": [0] * self.cfg.replicas}
        if os.path.isdir(self.cfg.dir):
            self.save()

    def status(self):
        st = {"proxy": {"url": self.proxy_url, "alive": alive(self.state.get("proxy")), "healthy": http_ok(self.cfg.proxy_port),
                        "replicas_up": self.proxy_servers_up()},
              "redis": {"port": self.cfg.redis_port, "alive": self._redis_ping()} if self.cfg.shared else None,
              "replicas": [{"url": self.replica_url(i), "alive": alive(pid), "healthy": http_ok(self.cfg.replica_ports[i])}
                           for i, pid in enumerate(self.state.get("replicas", []))]}
        return st

    def metrics(self, i):
        """Replica i's /metrics as {name: value} (labelled samples keep their labels in the name)."""
        out = {}
        with urllib.request.urlopen(self.replica_url(i) + "/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line and not line.startswith("#"):
                    name, _, value = line.rpartition(" ")
                    try:
                        out[name] = float(value)
                    except ValueError:
                        pass
        return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["start", "stop", "status", "kill-replica", "start-replica", "stop-redis", "start-redis"])
    ap.add_argument("index", nargs="?", type=int, help="replica index (kill-replica / start-replica)")
    ap.add_argument("--dir", default=Config.dir)
    ap.add_argument("--binary", default=Config.binary)
    ap.add_argument("--model", default="")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--routing", choices=["affinity", "roundrobin"], default="affinity")
    ap.add_argument("--no-shared", action="store_true", help="no Redis: replicas keep their KV to themselves")
    ap.add_argument("--proxy-port", type=int, default=0)
    ap.add_argument("--redis-port", type=int, default=0)
    ap.add_argument("--redis-maxmemory", default=Config.redis_maxmemory)
    ap.add_argument("--shared-options", default=Config.shared_options, help="query string of --kv-shared")
    ap.add_argument("--threads", type=int, default=1, help="threads per replica")
    a, extra = ap.parse_known_args()  # the rest (after --): extra `kvpack serve` arguments
    if extra[:1] == ["--"]:
        extra = extra[1:]
    if a.command == "start":
        c = Cluster(Config(binary=a.binary, model=a.model, replicas=a.replicas, routing=a.routing, shared=not a.no_shared,
                           dir=a.dir, proxy_port=a.proxy_port, redis_port=a.redis_port, redis_maxmemory=a.redis_maxmemory,
                           shared_options=a.shared_options, threads=a.threads, serve_args=extra)).start()
        print(json.dumps(c.status(), indent=1))
        return 0
    c = Cluster.load(a.dir)
    if a.command == "stop":
        c.stop()
    elif a.command == "status":
        st = c.status()
        print(json.dumps(st, indent=1))
        return 0 if st["proxy"]["healthy"] else 1
    elif a.command in ("kill-replica", "start-replica"):
        if a.index is None or not 0 <= a.index < c.cfg.replicas:
            ap.error(f"{a.command} needs a replica index in [0, {c.cfg.replicas})")
        c.kill_replica(a.index) if a.command == "kill-replica" else c.start_replica(a.index)
    elif a.command == "stop-redis":
        c.stop_redis()
    elif a.command == "start-redis":
        c.start_redis()
    return 0


if __name__ == "__main__":
    sys.exit(main())
