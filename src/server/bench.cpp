#include "server/bench.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "util/progress.h"

namespace kvpack::server::bench {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// splitmix64: tiny, portable, and good enough to pick words.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
};

const std::vector<std::string> kNouns = {"girl", "boy", "dog", "cat", "bird", "ball", "tree", "park", "house", "mom",
                                         "dad", "friend", "sun", "cake", "toy", "car", "box", "garden", "fish", "book"};
const std::vector<std::string> kVerbs = {"saw", "found", "liked", "wanted", "played with", "looked at", "made", "gave", "took", "helped"};
const std::vector<std::string> kAdjs = {"little", "big", "red", "happy", "small", "funny", "kind", "blue", "shiny", "old"};
const std::vector<std::string> kNames = {"Lily", "Tom", "Sara", "Ben", "Max", "Anna", "Sam", "Mia"};

std::string sentence(Rng& r) {
  std::string s = kNames[r.below(kNames.size())] + " " + kVerbs[r.below(kVerbs.size())] + " a " + kAdjs[r.below(kAdjs.size())] + " " +
                  kNouns[r.below(kNouns.size())];
  if (r.below(3) == 0) s += " in the " + kNouns[r.below(kNouns.size())];
  return s + ".";
}

std::string passage(Rng& r, int32_t words) {
  std::string s;
  int32_t n = 0;
  while (n < words) {
    const std::string x = sentence(r);
    n += static_cast<int32_t>(std::count(x.begin(), x.end(), ' ') + 1);
    s += (s.empty() ? "" : " ") + x;
  }
  return s;
}

struct Outcome {
  bool ok = false;
  std::string error;
  std::string text;
  double ttft = -1;
  int64_t prompt = 0, cached = 0, completion = 0;
  int retries = 0;
  json kvpack;  // usage.kvpack: the server's per-request KV figures
  std::string replica;  // X-Kvpack-Replica response header ("" without a router)
};

// One streamed request; retried on 429 and on connection failures before any data arrived.
Outcome request(const std::string& host, int port, const std::string& path, json body, const ReplayOptions& o,
                const std::string& api_key, const std::string& session_id, Clock::time_point deadline) {
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  const std::string payload = body.dump();
  Outcome out;
  for (int attempt = 0; attempt <= o.max_retries && Clock::now() < deadline; ++attempt) {
    httplib::Client cli(host, port);
    cli.set_read_timeout(600, 0);
    cli.set_write_timeout(30, 0);
    std::string buf, text;
    bool done = false, got_data = false;
    std::string sse_error;
    double ttft = -1;
    json usage;
    const auto t0 = Clock::now();
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.headers = {{"Content-Type", "application/json"}};
    if (!api_key.empty()) req.headers.emplace("Authorization", "Bearer " + api_key);
    if (!session_id.empty()) req.headers.emplace("X-Session-Id", session_id);
    req.body = payload;
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      got_data = true;
      buf.append(d, n);
      for (size_t end; (end = buf.find("\n\n")) != std::string::npos;) {
        const std::string ev = buf.substr(0, end);
        buf.erase(0, end + 2);
        if (ev.rfind("data: ", 0) != 0) continue;
        const std::string data = ev.substr(6);
        if (data == "[DONE]") {
          done = true;
          continue;
        }
        const json j = json::parse(data, nullptr, false);
        if (!j.is_object()) continue;
        if (j.contains("error")) {
          sse_error = j["error"].value("message", "error event");
          continue;
        }
        if (j.contains("usage") && j["usage"].is_object()) usage = j["usage"];
        if (!j.contains("choices") || j["choices"].empty()) continue;
        const json& c = j["choices"][0];
        std::string delta;
        if (c.contains("text") && c["text"].is_string()) delta = c["text"];
        if (c.contains("delta") && c["delta"].contains("content") && c["delta"]["content"].is_string()) delta = c["delta"]["content"];
        if (!delta.empty() && ttft < 0) ttft = std::chrono::duration<double>(Clock::now() - t0).count();
        text += delta;
      }
      return true;
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    const bool sent = cli.send(req, res, err);
    if (sent && res.status == 200 && done && sse_error.empty()) {
      out.ok = true;
      out.text = std::move(text);
      out.ttft = ttft;
      out.replica = res.get_header_value("X-Kvpack-Replica");
      if (usage.is_object()) {
        out.prompt = usage.value("prompt_tokens", 0);
        out.completion = usage.value("completion_tokens", 0);
        if (usage.contains("prompt_tokens_details")) out.cached = usage["prompt_tokens_details"].value("cached_tokens", 0);
        if (usage.contains("kvpack")) out.kvpack = usage["kvpack"];
      }
      return out;
    }
    const bool retryable = (sent && (res.status == 429 || res.status == 503)) || (!sent && !got_data);
    if (!sent) out.error = "transport error: " + httplib::to_string(err);
    else if (res.status != 200) out.error = "HTTP " + std::to_string(res.status) + ": " + buf.substr(0, 300);  // the body went to the receiver
    else if (!sse_error.empty()) out.error = "error event: " + sse_error;
    else out.error = "stream ended without [DONE]";
    if (!retryable) return out;
    ++out.retries;
    std::this_thread::sleep_for(std::chrono::duration<double>(o.retry_wait_s));
  }
  return out;
}

int64_t scrape(const std::string& metrics, const std::string& prefix, bool sum_labels = false) {
  std::istringstream in(metrics);
  std::string line;
  double total = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const bool match = sum_labels ? line.rfind(prefix + "{", 0) == 0 : line.rfind(prefix + " ", 0) == 0;
    if (match) total += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return static_cast<int64_t>(std::llround(total));
}

}  // namespace

const char* kind_name(Session::Kind k) {
  switch (k) {
    case Session::Kind::Reasoning: return "reasoning";
    case Session::Kind::Chat: return "chat";
    case Session::Kind::Document: return "document";
  }
  return "?";
}

std::vector<Session> generate_mix(const MixOptions& o) {
  Rng r{o.seed};
  std::vector<Session> mix;
  const std::string system = "You are a kind storyteller. " + passage(r, o.system_words);
  for (int32_t i = 0; i < o.reasoning; ++i) {
    Session s;
    s.kind = Session::Kind::Reasoning;
    s.ignore_eos = true;
    s.turns.push_back({"Question: why " + sentence(r) + " Let us think step by step.", o.reasoning_tokens});
    mix.push_back(std::move(s));
  }
  for (int32_t i = 0; i < o.chats; ++i) {
    Session s;
    s.kind = Session::Kind::Chat;
    s.system = system;
    for (int32_t t = 0; t < o.chat_turns; ++t) s.turns.push_back({"Tell me about " + sentence(r), o.chat_tokens});
    mix.push_back(std::move(s));
  }
  for (int32_t i = 0; i < o.documents; ++i) {
    Session s;
    s.kind = Session::Kind::Document;
    s.turns.push_back({passage(r, o.document_words) + "\nIn short,", o.document_tokens});
    mix.push_back(std::move(s));
  }
  // Interleave kinds (seeded shuffle), then give arrival times.
  for (size_t i = mix.size(); i > 1; --i) std::swap(mix[i - 1], mix[r.below(i)]);
  double t = 0;
  for (auto& s : mix) {
    if (o.arrival_rate > 0) t += -std::log(1.0 - r.uniform()) / o.arrival_rate;
    s.arrival_s = t;
  }
  return mix;
}

double RunStats::ttft_quantile(double q) const {
  if (ttft_s.empty()) return 0;
  std::vector<double> v = ttft_s;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

RunStats replay(const std::string& host, int port, const std::vector<Session>& mix, const ReplayOptions& o, const std::string& api_key) {
  RunStats st;
  st.sessions = static_cast<int32_t>(mix.size());
  std::unique_ptr<Progress> progress;
  if (!o.progress_label.empty()) progress = std::make_unique<Progress>(o.progress_label, st.sessions, "sessions");
  std::mutex mu;
  size_t next = 0;
  const auto start = Clock::now();
  std::vector<std::pair<double, int>> long_output_events;  // (time s, +1 first token / -1 end)
  auto since_start = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.timeout_s));
  auto worker = [&] {
    for (;;) {
      size_t i;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (next >= mix.size()) return;
        i = next++;
      }
      const Session& s = mix[i];
      std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s.arrival_s)));
      json messages = json::array();
      if (s.kind == Session::Kind::Chat) messages.push_back({{"role", "system"}, {"content", s.system}});
      bool ok = true;
      for (size_t t = 0; t < s.turns.size() && ok; ++t) {
        const Turn& turn = s.turns[t];
        json body = {{"max_tokens", turn.max_tokens}, {"temperature", o.temperature}, {"seed", static_cast<uint64_t>(i * 1000 + t)},
                     {"ignore_eos", s.ignore_eos}};
        std::string path = "/v1/completions";
        if (s.kind == Session::Kind::Chat) {
          messages.push_back({{"role", "user"}, {"content", turn.text}});
          body["messages"] = messages;
          path = "/v1/chat/completions";
        } else {
          body["prompt"] = turn.text;
        }
        const double t0 = since_start();
        const std::string session_id = o.session_id_prefix.empty() ? "" : o.session_id_prefix + std::to_string(i);
        const Outcome r = request(host, port, path, body, o, api_key, session_id, deadline);
        const double t1 = since_start();
        std::lock_guard<std::mutex> lock(mu);
        if (r.ok && r.ttft >= 0 && s.kind == Session::Kind::Reasoning) {
          long_output_events.emplace_back(t0 + r.ttft, +1);
          long_output_events.emplace_back(t1, -1);
        }
        ++st.requests;
        st.retries += r.retries;
        ok = r.ok;
        if (!ok) {
          if (st.first_error.empty()) st.first_error = std::string(kind_name(s.kind)) + " session: " + r.error;
          break;
        }
        st.prompt_tokens += r.prompt;
        st.cached_tokens += r.cached;
        st.completion_tokens += r.completion;
        if (r.kvpack.is_object()) st.shared_tokens += r.kvpack.value("cached_tokens_shared", int64_t{0});
        ++st.replica_requests[r.replica];
        if (r.ttft >= 0) st.ttft_s.push_back(r.ttft);
        st.outputs[static_cast<uint64_t>(i) * 1000 + t] = r.text;
        if (s.kind == Session::Kind::Chat) messages.push_back({{"role", "assistant"}, {"content", r.text}});
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        (ok ? st.completed : st.failed) += 1;
      }
      if (progress) progress->advance();
    }
  };
  std::vector<std::thread> threads;
  for (int32_t c = 0; c < std::max(1, o.clients); ++c) threads.emplace_back(worker);
  for (auto& t : threads) t.join();
  if (progress) progress->finish();
  st.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  std::sort(long_output_events.begin(), long_output_events.end());  // ends before starts at equal times
  for (int32_t cur = 0; const auto& e : long_output_events) st.peak_long_output = std::max(st.peak_long_output, cur += e.second);

  if (!o.scrape_metrics) return st;
  httplib::Client cli(host, port);
  httplib::Headers h;
  if (!api_key.empty()) h.emplace("Authorization", "Bearer " + api_key);
  if (auto res = cli.Get("/metrics", h); res && res->status == 200) {
    const std::string& m = res->body;
    st.peak_running = scrape(m, "kvpack_requests_peak_running");
    st.preemptions = scrape(m, "kvpack_preemptions_total", true);
    st.freed_pages = scrape(m, "kvpack_kv_freed_pages_total", true);  // summed over policies
    st.prefix_hit_tokens = scrape(m, "kvpack_prefix_cache_hit_tokens_total");
    // Over all policies: freed bytes / evicted bytes (the per-policy gauges cannot be averaged).
    const double evicted = static_cast<double>(scrape(m, "kvpack_kv_evicted_bytes_total", true));
    st.reclaim_efficiency = evicted > 0 ? static_cast<double>(scrape(m, "kvpack_kv_freed_bytes_total", true)) / evicted : 0.0;
    st.swap_outs = scrape(m, "kvpack_kv_swap_outs_total");
    st.recomputes = scrape(m, "kvpack_kv_recomputes_total");
  }
  return st;
}

std::string markdown_table(const std::vector<RunStats>& runs) {
  std::string s =
      "| run | sessions completed | peak concurrent long-output sessions | peak concurrent seqs | output tok/s | TTFT p50 ms | TTFT p99 ms | preemptions | swap-outs | recomputes | prefix hit rate | "
      "freed pages | reclaim eff. | requests | retries | wall s |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  char buf[512];
  for (const auto& r : runs) {
    std::snprintf(buf, sizeof buf, "| %s | %d/%d | %d | %lld | %.1f | %.1f | %.1f | %lld | %lld | %lld | %.1f%% | %lld | %.2f | %lld | %lld | %.1f |\n",
                  r.label.c_str(), r.completed, r.sessions, r.peak_long_output, static_cast<long long>(r.peak_running), r.output_tok_s(),
                  1e3 * r.ttft_quantile(0.5), 1e3 * r.ttft_quantile(0.99), static_cast<long long>(r.preemptions),
                  static_cast<long long>(r.swap_outs), static_cast<long long>(r.recomputes),
                  100.0 * r.prefix_hit_rate(), static_cast<long long>(r.freed_pages), r.reclaim_efficiency,
                  static_cast<long long>(r.requests), static_cast<long long>(r.retries), r.wall_s);
    s += buf;
  }
  return s;
}

std::string target_table(const std::vector<RunStats>& runs) {
  std::string s =
      "| run | sessions completed | requests | retries | prompt tokens | prefix hit rate | from the shared tier (tokens) | "
      "recomputed (tokens) | TTFT p50 ms | TTFT p99 ms | output tok/s | replicas answering | wall s |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  char buf[512];
  for (const auto& r : runs) {
    std::string replicas;
    for (const auto& [name, n] : r.replica_requests)
      replicas += (replicas.empty() ? "" : " ") + (name.empty() ? std::string("(no header)") : name) + ":" + std::to_string(n);
    std::snprintf(buf, sizeof buf, "| %s | %d/%d | %lld | %lld | %lld | %.1f%% | %lld | %lld | %.1f | %.1f | %.1f | %s | %.1f |\n",
                  r.label.c_str(), r.completed, r.sessions, static_cast<long long>(r.requests), static_cast<long long>(r.retries),
                  static_cast<long long>(r.prompt_tokens), 100.0 * r.prefix_hit_rate(), static_cast<long long>(r.shared_tokens),
                  static_cast<long long>(r.prompt_tokens - r.cached_tokens), 1e3 * r.ttft_quantile(0.5), 1e3 * r.ttft_quantile(0.99),
                  r.output_tok_s(), replicas.c_str(), r.wall_s);
    s += buf;
  }
  return s;
}

std::string run_json(const RunStats& r) {
  json j = {{"label", r.label},
            {"sessions", r.sessions},
            {"completed", r.completed},
            {"failed", r.failed},
            {"requests", r.requests},
            {"retries", r.retries},
            {"prompt_tokens", r.prompt_tokens},
            {"cached_tokens", r.cached_tokens},
            {"shared_tokens", r.shared_tokens},
            {"recomputed_tokens", r.prompt_tokens - r.cached_tokens},
            {"completion_tokens", r.completion_tokens},
            {"prefix_hit_rate", r.prefix_hit_rate()},
            {"ttft_p50_ms", 1e3 * r.ttft_quantile(0.5)},
            {"ttft_p99_ms", 1e3 * r.ttft_quantile(0.99)},
            {"output_tok_s", r.output_tok_s()},
            {"wall_s", r.wall_s},
            {"replica_requests", r.replica_requests},
            {"first_error", r.first_error}};
  return j.dump();
}

}  // namespace kvpack::server::bench
