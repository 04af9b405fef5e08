// `kvpack bench peer`, the llama.cpp side: the node-llama-cpp driver (scripts/peer/llama_bench.mjs
// --serve) as a child process speaking JSON lines over pipes, its npm install, and the choice between
// its prebuilt binaries and a source build (bench_peer.h says how the command is split).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "bench_peer.h"

namespace kvpack::cli::bench_peer {

Peer::Peer(const std::string& node, const fs::path& script, const std::vector<std::string>& args) {
  // O_CLOEXEC: a peer started later must not inherit this one's pipe ends (its stdin would never
  // see EOF); dup2 in the child clears the flag on fds 0 and 1.
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    close(in[0]), close(in[1]), close(out[0]), close(out[1]);
    std::vector<std::string> all = {node, script.string()};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> av;
    for (auto& s : all) av.push_back(s.data());
    av.push_back(nullptr);
    execvp(av[0], av.data());
    std::fprintf(stderr, "[peer] cannot run %s: %s\n", node.c_str(), std::strerror(errno));
    _exit(127);
  }
  close(in[0]), close(out[1]);
  to_ = fdopen(in[1], "w");
  from_ = fdopen(out[0], "r");
}

json Peer::request(const json& req) {
  std::fprintf(to_, "%s\n", req.dump().c_str());
  std::fflush(to_);
  return read();
}

json Peer::read() {
  std::string line;
  for (;;) {
    line.clear();
    int c;
    while ((c = std::fgetc(from_)) != EOF && c != '\n') line.push_back(static_cast<char>(c));
    if (line.empty() && c == EOF) {
      const int rc = finish();
      throw std::runtime_error("the llama.cpp driver exited (status " + std::to_string(rc) + ")");
    }
    if (!line.empty() && line[0] == '{') {
      json j = json::parse(line, nullptr, false);
      if (!j.is_discarded()) {
        if (j.value("event", "") == "error") throw std::runtime_error("llama.cpp driver: " + j.value("message", std::string("?")));
        return j;
      }
    }
    std::fprintf(stderr, "[llama.cpp] %s\n", line.c_str());
  }
}

int Peer::finish() {
  if (pid_ <= 0) return exit_code_;
  if (to_) {
    std::fprintf(to_, "{\"cmd\":\"quit\"}\n");
    std::fclose(to_);
    to_ = nullptr;
  }
  if (from_) std::fclose(from_), from_ = nullptr;
  int st = 0;
  // Give it 20 s to dispose of its context and exit, then terminate it.
  bool done = false;
  for (int i = 0; i < 200 && !done; ++i) {
    done = waitpid(pid_, &st, WNOHANG) == pid_;
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!done) {
    std::fprintf(stderr, "[peer] the llama.cpp driver (pid %d) did not exit after quit: terminating it\n", static_cast<int>(pid_));
    kill(pid_, SIGTERM);
    waitpid(pid_, &st, 0);
  }
  pid_ = -1;
  exit_code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return exit_code_;
}

fs::path default_peer_dir() {
  // This file lives in <repo>/tools/; the driver in <repo>/scripts/peer/ (absolute __FILE__ under CMake).
  fs::path here = fs::path(__FILE__);
  if (here.is_absolute()) {
    fs::path p = here.parent_path().parent_path() / "scripts" / "peer";
    if (fs::exists(p / "llama_bench.mjs")) return p;
  }
  return fs::path("scripts") / "peer";
}

void ensure_node_modules(const fs::path& dir) {
  if (fs::exists(dir / "node_modules" / "node-llama-cpp" / "package.json") &&
      fs::exists(dir / "node_modules" / "@node-llama-cpp" / "linux-x64" / "package.json"))
    return;
  const std::string cmd = "cd '" + dir.string() + "' && npm install --omit=optional --ignore-scripts --no-audit --no-fund 1>&2";
  std::fprintf(stderr,
               "[peer] node-llama-cpp is not installed in %s/node_modules: installing it (pinned in package.json; the prebuilt\n"
               "[peer] linux-x64 CPU binaries only, no CUDA/Vulkan packages, no install scripts):\n[peer] $ %s\n",
               dir.c_str(), cmd.c_str());
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("npm install failed in " + dir.string());
}

namespace {

std::vector<std::string> peer_args(const std::string& model, const PeerOptions& b, int threads, int batch, int ctx,
                                   const std::string& variant) {
  std::vector<std::string> args = {"--serve", "--model",   model,   "--threads",    std::to_string(threads),
                                   "--batch", std::to_string(batch), "--ctx", std::to_string(ctx), "--variant",
                                   variant,   "--flash-attn", b.flash_attn};
  if (!b.llama_fill_cache.empty()) args.insert(args.end(), {"--fill-cache", b.llama_fill_cache});
  return args;
}

std::unique_ptr<Peer> start_peer(const PeerOptions& b, const fs::path& dir, const std::vector<std::string>& args, json& ready) {
  auto p = std::make_unique<Peer>(b.node, dir / "llama_bench.mjs", args);
  try {
    ready = p->read();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[peer] %s\n", e.what());
    return nullptr;
  }
  return p;
}
}  // namespace

PeerChoice choose_peer(const PeerOptions& b, const fs::path& dir, const std::string& model, int threads, int batch, int ctx) {
  PeerChoice c;
  if (b.build_source) {
    std::fprintf(stderr, "[peer] building llama.cpp from node-llama-cpp's bundled source (GGML_NATIVE=ON; ~25 min on 2 busy cores)\n");
    Peer bp(b.node, dir / "llama_bench.mjs", {"--build-source", "--threads", std::to_string(threads)});
    json r = bp.read();
    std::fprintf(stderr, "[peer] build: %s\n", r.dump().c_str());
  }
  if (b.variant == "prebuilt" || b.variant == "source") {
    c.peer = start_peer(b, dir, peer_args(model, b, threads, batch, ctx, b.variant), c.ready);
    if (!c.peer) throw std::runtime_error("llama.cpp (" + b.variant + ") could not be started; see the messages above");
    c.variant = b.variant;
    return c;
  }
  // auto: start the prebuilt binaries and (when built) the source build side by side, alternate short
  // probes (prefill 128, 8 decode steps at depth 0; round 0 is warm-up), keep the faster at decode.
  json r_pre, r_src;
  auto pre = start_peer(b, dir, peer_args(model, b, threads, batch, ctx, "prebuilt"), r_pre);
  auto src = start_peer(b, dir, peer_args(model, b, threads, batch, ctx, "source"), r_src);
  if (!pre && !src) throw std::runtime_error("neither llama.cpp variant could be started; see the messages above");
  if (!src) std::printf("# llama.cpp source build not available (build it once with --llama-build-source): prebuilt binaries\n");
  if (!pre) std::printf("# llama.cpp prebuilt binaries not usable (see the messages above): source build\n");
  if (pre && src) {
    std::fprintf(stderr, "[peer] probing the prebuilt binaries against the source build (4 alternating rounds)\n");
    std::vector<double> pf[2], st[2];
    Peer* ps[2] = {pre.get(), src.get()};
    for (int round = 0; round < 4; ++round)
      for (int k = 0; k < 2; ++k) {
        const int i = (round + k) % 2;
        const json a = ps[i]->request({{"cmd", "prefill"}, {"n", 128}, {"reps", 1}, {"warmup", 0}});
        const json d = ps[i]->request({{"cmd", "steps"}, {"n", 8}, {"warmup", 1}});
        if (round == 0) continue;
        pf[i].push_back(a["seconds"][0].get<double>());
        for (double x : d["steps"].get<std::vector<double>>()) st[i].push_back(x);
      }
    const double pre_pf = 128 / median(pf[0]), pre_dc = 1 / median(st[0]);
    const double src_pf = 128 / median(pf[1]), src_dc = 1 / median(st[1]);
    std::printf("# llama.cpp probe, prebuilt:     prefill(128) %.2f tok/s, decode(depth 0) %.2f tok/s\n", pre_pf, pre_dc);
    std::printf("# llama.cpp probe, source build: prefill(128) %.2f tok/s, decode(depth 0) %.2f tok/s\n", src_pf, src_dc);
    if ((src_pf > pre_pf) != (src_dc > pre_dc))
      std::printf("# note: one variant is faster at prefill, the other at decode; decode decides\n");
    const bool use_src = src_dc > pre_dc;
    (use_src ? pre : src)->finish();
    c.peer = std::move(use_src ? src : pre);
    c.ready = use_src ? r_src : r_pre;
    c.variant = use_src ? "source" : "prebuilt";
  } else {
    c.peer = std::move(src ? src : pre);
    c.ready = src ? r_src : r_pre;
    c.variant = src ? "source" : "prebuilt";
  }
  std::fflush(stdout);
  return c;
}

}  // namespace kvpack::cli::bench_peer
