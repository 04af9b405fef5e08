// `kvpack bench serve`: replays one seeded session mix (src/server/bench.h) against the real server
// over loopback, once with full KV and once with a compressing policy, at the same --kv-pages, and
// prints a Markdown table; or, with --target, replays it once against a running endpoint (a router in
// front of replicas: scripts/cluster_bench.py). Registered under `kvpack bench` by add_bench (tools/cmd_bench_kv.cpp).
#include <cstdio>
#include <fstream>
#include <memory>

#include "commands.h"
#include "options.h"
#include "server/bench.h"
#include "server/server.h"

namespace kvpack::cli {

void add_bench_serve(CLI::App& bench);  // called by add_bench

void add_bench_serve(CLI::App& bench) {
  auto* cmd = bench.add_subcommand("serve", "Serving benchmark: a seeded session mix over HTTP, full KV vs a compressed policy at the same memory");
  auto o = std::make_shared<ModelOptions>();
  auto kvo = std::make_shared<KvOptions>();
  auto mix = std::make_shared<server::bench::MixOptions>();
  auto ro = std::make_shared<server::bench::ReplayOptions>();
  auto max_batch = std::make_shared<int32_t>(16);
  auto admission = std::make_shared<std::string>("reserve");
  auto preempt = std::make_shared<std::string>("lru");
  auto out = std::make_shared<std::string>();
  add_model_options(*cmd, *o);
  add_kv_options(*cmd, *kvo);  // the compressed run's policy (default when none is given: knorm, budget 96, interval 32)
  cmd->add_option("--seed", mix->seed, "Session mix seed");
  cmd->add_option("--reasoning", mix->reasoning, "Reasoning sessions (short prompt, long output)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--reasoning-tokens", mix->reasoning_tokens, "Tokens generated per reasoning session")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--chats", mix->chats, "Multi-turn chat sessions sharing a system prompt")->check(CLI::NonNegativeNumber);
  cmd->add_option("--turns", mix->chat_turns, "Turns per chat")->check(CLI::Range(1, 64));
  cmd->add_option("--chat-tokens", mix->chat_tokens, "max_tokens per chat turn")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--system-words", mix->system_words, "Words in the shared system prompt")->check(CLI::NonNegativeNumber);
  cmd->add_option("--documents", mix->documents, "Long-document sessions")->check(CLI::NonNegativeNumber);
  cmd->add_option("--document-words", mix->document_words, "Words per document")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--rate", mix->arrival_rate, "Session arrivals per second (Poisson; 0: all at once)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--clients", ro->clients, "Sessions in flight at once (client threads)")->check(CLI::Range(1, 1024));
  cmd->add_option("--max-batch", *max_batch, "Server: sequences in the running batch")->check(CLI::Range(1, 4096));
  cmd->add_option("--admission", *admission, "Server admission")->check(CLI::IsMember({"reserve", "watermark"}));
  cmd->add_option("--preempt", *preempt, "Server preemption victim policy")->check(CLI::IsMember({"lru", "lfu", "priority"}));
  cmd->add_option("-o,--out", *out, "Also write the Markdown report to this file");
  auto swap_vs_recompute = std::make_shared<bool>(false);
  cmd->add_flag("--swap-vs-recompute", *swap_vs_recompute,
                "Instead of full vs compressed: the policy with recompute preemption, then with swap preemption to the cold "
                "tier (--kv-cold, default host memory of 4x the pool), at the same hot KV memory; plus a reference run with "
                "a pool large enough for no preemption, to check every output against it");
  auto target = std::make_shared<std::string>();
  auto label = std::make_shared<std::string>("target");
  auto json_out = std::make_shared<std::string>();
  auto api_key = std::make_shared<std::string>();
  cmd->add_option("--target", *target,
                  "Replay the mix once against a running endpoint (HOST:PORT: a kvpack server or a router in front of "
                  "replicas, deploy/haproxy/) instead of starting servers; prints client-side figures only")
      ->check([](const std::string& v) { return v.rfind(':') == std::string::npos ? std::string("expected HOST:PORT") : std::string(); });
  cmd->add_option("--label", *label, "With --target: the run's name in the table / JSON");
  cmd->add_option("--json", *json_out, "With --target: also write the run's figures as one JSON object to this file");
  cmd->add_option("--api-key", *api_key, "With --target: Bearer token for the endpoint");
  cmd->add_option("--temp", ro->temperature, "Sampling temperature of every request (0: greedy)")->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  cmd->callback([=] {
    if (!target->empty()) {  // an external endpoint: one run, no model loaded here
      const size_t colon = target->rfind(':');
      const std::string host = target->substr(0, colon);
      int port = 0;
      try {
        port = std::stoi(target->substr(colon + 1));
      } catch (const std::exception&) {
      }
      if (host.empty() || port <= 0 || port > 65535) throw CLI::ValidationError("--target", "expected HOST:PORT, got " + *target);
      const auto sessions = server::bench::generate_mix(*mix);
      server::bench::ReplayOptions r = *ro;
      r.scrape_metrics = false;
      r.session_id_prefix = "bench-" + std::to_string(mix->seed) + "-";
      r.progress_label = "bench serve: " + *label;
      std::printf("# kvpack bench serve --target %s\n\nclients %d, seed %llu, temperature %g; mix: %d reasoning (%d tokens), %d chats x %d "
                  "turns (%d tokens, shared %d-word system prompt), %d documents (%d words); X-Session-Id per session\n\n",
                  target->c_str(), ro->clients, static_cast<unsigned long long>(mix->seed), ro->temperature, mix->reasoning,
                  mix->reasoning_tokens, mix->chats, mix->chat_turns, mix->chat_tokens, mix->system_words, mix->documents,
                  mix->document_words);
      std::fflush(stdout);
      server::bench::RunStats st = server::bench::replay(host, port, sessions, r, *api_key);
      st.label = *label;
      if (!st.first_error.empty()) std::fprintf(stderr, "[kvpack] bench serve: first failure: %s\n", st.first_error.c_str());
      const std::string table = server::bench::target_table({st});
      std::printf("%s", table.c_str());
      if (!out->empty()) {
        std::ofstream f(*out);
        if (!f) throw std::runtime_error("cannot write " + *out);
        f << table;
      }
      if (!json_out->empty()) {
        std::ofstream f(*json_out);
        if (!f) throw std::runtime_error("cannot write " + *json_out);
        f << server::bench::run_json(st) << "\n";
      }
      if (st.completed == 0 && st.sessions > 0) throw std::runtime_error("no session completed against " + *target);
      return;
    }
    auto model = load_model(*o);
    const ModelConfig& c = model->config();
    EngineOptions eo = engine_options(*o);
    if (eo.kv_pages == 0)  // default: room for two full-context sequences, so the mix has to share
      eo.kv_pages = 2LL * c.n_layer * c.n_head_kv * ((c.n_ctx + eo.page_size - 1) / eo.page_size);
    KvOptions compressed = *kvo;
    if (compressed.resolved_policy() == compress::PolicyKind::Full) {
      compressed.policy = "knorm";
      if (compressed.budget == 0) compressed.budget = 96;
      if (compressed.interval == 128) compressed.interval = 32;
    }
    const auto sessions = server::bench::generate_mix(*mix);
    const std::string arrivals = mix->arrival_rate > 0 ? std::to_string(mix->arrival_rate) + "/s" : "all at t=0";
    std::printf("# kvpack bench serve\n\nmodel %s (ctx %d), kv pages %lld x %d slots, max batch %d, admission %s, clients %d, seed %llu\n"
                "mix: %d reasoning (%d tokens, ignore_eos), %d chats x %d turns (%d tokens, shared %d-word system prompt), "
                "%d documents (%d words), arrivals %s\n\n",
                c.name.c_str(), c.n_ctx, static_cast<long long>(eo.kv_pages), eo.page_size, *max_batch, admission->c_str(), ro->clients,
                static_cast<unsigned long long>(mix->seed), mix->reasoning, mix->reasoning_tokens, mix->chats, mix->chat_turns,
                mix->chat_tokens, mix->system_words, mix->documents, mix->document_words,
                arrivals.c_str());
    std::fflush(stdout);
    struct RunConfig {
      KvOptions kv;
      std::string cold;     // cold tier spec ("" = none: recompute)
      int64_t pages;
      std::string label;
    };
    std::vector<RunConfig> configs;
    server::bench::ReplayOptions replay_opt = *ro;
    if (*swap_vs_recompute) {
      replay_opt.temperature = 0;  // greedy: sampled tokens would amplify last-bit differences between batch shapes
      const size_t page_bytes = kv::PagePool(default_pool_config(c, eo)).record_bytes();
      const std::string cold = !o->kv_cold.empty() ? o->kv_cold : "host:" + std::to_string(4 * eo.kv_pages * static_cast<int64_t>(page_bytes));
      const std::string name = kvo->resolved_policy() == compress::PolicyKind::Full
                                   ? "full"
                                   : kvo->resolved_policy_name() + " b" + std::to_string(kvo->budget);
      configs.push_back({*kvo, "", eo.kv_pages, name + " recompute"});
      configs.push_back({*kvo, cold, eo.kv_pages, name + " swap (" + cold.substr(0, cold.find(':')) + ")"});
      configs.push_back({*kvo, "", 64 * eo.kv_pages, name + " reference (64x pool)"});
    } else {  // the baseline (no compression), then the policy
      configs.push_back({KvOptions{}, o->kv_cold, eo.kv_pages, "full"});
      configs.push_back({compressed, o->kv_cold, eo.kv_pages, compressed.resolved_policy_name() + " b" + std::to_string(compressed.budget)});
    }
    std::vector<server::bench::RunStats> runs;
    for (const RunConfig& rc : configs) {
      EngineOptions run_eo = eo;
      run_eo.kv_cold = rc.cold;
      run_eo.kv_pages = rc.pages;
      Engine engine(*model, run_eo);
      server::ServerOptions so;
      so.host = "127.0.0.1";
      so.port = 0;
      so.default_kv = kv_config(rc.kv, engine);
      so.max_concurrent = ro->clients + 8;
      so.scheduler.max_running = *max_batch;
      so.scheduler.step_tokens = o->batch;
      so.scheduler.reserve_admission = *admission == "reserve";
      so.scheduler.preempt = parse_preempt(*preempt);
      so.scheduler.max_waiting = std::max(256, ro->clients * 2);
      server::Server srv(engine, so);
      const int port = srv.start();
      std::fprintf(stderr, "[kvpack] bench serve: run %s on port %d ...\n", rc.label.c_str(), port);
      server::bench::ReplayOptions run_replay = replay_opt;
      run_replay.progress_label = "bench serve: " + rc.label + " (run " + std::to_string(runs.size() + 1) + "/" +
                                  std::to_string(configs.size()) + ")";
      server::bench::RunStats st = server::bench::replay("127.0.0.1", port, sessions, run_replay);
      srv.stop();
      st.label = rc.label;
      std::fprintf(stderr, "[kvpack] bench serve: %s done in %.1f s (%d/%d sessions)\n", st.label.c_str(), st.wall_s, st.completed,
                   st.sessions);
      if (!st.first_error.empty()) std::fprintf(stderr, "[kvpack] bench serve: first failure: %s\n", st.first_error.c_str());
      runs.push_back(std::move(st));
    }
    std::string extra;
    if (*swap_vs_recompute && runs.size() == 3) {  // every request's text against the no-pressure reference
      const auto& ref = runs[2].outputs;
      for (size_t r = 0; r < 2; ++r) {
        size_t same = 0;
        for (const auto& [key, text] : runs[r].outputs) {
          auto it = ref.find(key);
          same += it != ref.end() && it->second == text;
        }
        char line[256];
        std::snprintf(line, sizeof line, "\noutputs identical to the reference run (%lld preemptions): %s %zu/%zu", static_cast<long long>(runs[2].preemptions),
                      runs[r].label.c_str(), same, ref.size());
        extra += line;
      }
      extra += "\n";
    }
    std::string table = server::bench::markdown_table(runs) + extra;
    if (!*swap_vs_recompute && runs.size() == 2 && runs[0].peak_long_output > 0) {
      char line[256];
      std::snprintf(line, sizeof line, "\nconcurrent long-output sessions at the same KV memory: %s %d vs full %d = %.2fx\n",
                    runs[1].label.c_str(), runs[1].peak_long_output, runs[0].peak_long_output,
                    static_cast<double>(runs[1].peak_long_output) / runs[0].peak_long_output);
      table += line;
    }
    std::printf("%s", table.c_str());
    if (!out->empty()) {
      std::ofstream f(*out);
      if (!f) throw std::runtime_error("cannot write " + *out);
      f << table;
    }
  });
}

}  // namespace kvpack::cli
