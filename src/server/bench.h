// `kvpack bench serve`: a seeded mix of serving sessions replayed against the real HTTP server over
// loopback, to compare KV policies at the same page budget. The mix has
//   * reasoning sessions: a short question, a long answer (ignore_eos, many generated tokens);
//   * chat sessions: several turns each, all sharing one long system prompt (prefix-cache traffic;
//     every turn resends the history, as chat clients do);
//   * a few long-document requests: a long passage, a short summary.
// Sessions arrive at t = 0 or as a Poisson process, and are run by a fixed pool of client threads
// (each runs one session's turns in order, streaming, and measures TTFT as the client sees it).
// Text comes from a small built-in vocabulary of story words, so a tiny model (stories260K) gets
// prompts it can tokenize; the generator is portable (no std:: distributions), so a seed gives the
// same mix everywhere.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvpack::server::bench {

struct MixOptions {
  uint64_t seed = 42;
  int32_t reasoning = 16;           // sessions
  int32_t reasoning_tokens = 320;   // generated per reasoning session
  int32_t chats = 16;               // sessions
  int32_t chat_turns = 3;
  int32_t chat_tokens = 40;         // max_tokens per chat turn
  int32_t system_words = 80;        // shared system prompt (~2.3 tokens a word on stories260K)
  int32_t documents = 4;
  int32_t document_words = 150;
  int32_t document_tokens = 48;
  double arrival_rate = 0;          // sessions per second (Poisson); 0: all at t = 0
};

struct Turn {
  std::string text;  // chat: the user's message; otherwise: the completion prompt
  int32_t max_tokens = 0;
};

struct Session {
  enum class Kind { Reasoning, Chat, Document } kind = Kind::Reasoning;
  double arrival_s = 0;
  std::string system;  // chat only
  std::vector<Turn> turns;
  bool ignore_eos = false;
};

const char* kind_name(Session::Kind k);
std::vector<Session> generate_mix(const MixOptions& o);  // sorted by arrival

struct ReplayOptions {
  int32_t clients = 16;         // sessions in flight at once (client threads)
  int32_t max_retries = 100;    // per request, on 429 / connection errors
  double retry_wait_s = 0.05;
  double timeout_s = 900;       // whole replay
  double temperature = 0.8;     // 0: greedy (outputs comparable across runs whatever the batching)
  std::string progress_label;   // non-empty: a progress bar / periodic lines on stderr (sessions done)
  // Every request of session i carries "X-Session-Id: <session_id_prefix><i>" (empty: no header): the key a
  // router hashes to keep a conversation on the replica that holds its KV (deploy/haproxy/).
  std::string session_id_prefix = "bench-";
  bool scrape_metrics = true;   // false against a router: its /metrics would be one replica's, not the run's
};

struct RunStats {
  std::string label;
  int32_t sessions = 0, completed = 0, failed = 0;
  int64_t requests = 0, retries = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  double wall_s = 0;
  std::vector<double> ttft_s;  // per request, client-side
  std::string first_error;     // of the first failed request (HTTP status and message)
  // From the server's /metrics after the run.
  int64_t peak_running = 0, preemptions = 0, freed_pages = 0, prefix_hit_tokens = 0;
  int64_t swap_outs = 0, recomputes = 0;
  // From the responses: prompt tokens the server loaded from a shared tier (usage.kvpack.cached_tokens_shared,
  // part of cached_tokens), and requests per replica (the X-Kvpack-Replica header a router adds; "" = none).
  int64_t shared_tokens = 0;
  std::map<std::string, int64_t> replica_requests;
  // Generated text per request (key: session index * 1000 + turn), to compare runs request by request.
  std::map<uint64_t, std::string> outputs;
  // Client side: most reasoning (long-output) sessions streaming at the same moment, each counted from
  // its first token to its last — the capacity figure the compression target is about.
  int32_t peak_long_output = 0;
  double reclaim_efficiency = 0;

  double output_tok_s() const { return wall_s > 0 ? static_cast<double>(completion_tokens) / wall_s : 0; }
  double ttft_quantile(double q) const;  // seconds; 0 when there are none
  double prefix_hit_rate() const {       // share of prompt tokens served from the prefix cache
    return prompt_tokens > 0 ? static_cast<double>(cached_tokens) / static_cast<double>(prompt_tokens) : 0;
  }
};

// Replays the mix against http://host:port (completions and chat endpoints, streaming) and scrapes
// /metrics at the end. `api_key` may be empty.
RunStats replay(const std::string& host, int port, const std::vector<Session>& mix, const ReplayOptions& o,
                const std::string& api_key = "");

std::string markdown_table(const std::vector<RunStats>& runs);
// Runs against external endpoints (`bench serve --target`): client-side figures only, shared-tier hits and
// recomputed prompt tokens side by side.
std::string target_table(const std::vector<RunStats>& runs);
// One run as a JSON object (the target table's figures plus the per-request outputs' count).
std::string run_json(const RunStats& r);

}  // namespace kvpack::server::bench
