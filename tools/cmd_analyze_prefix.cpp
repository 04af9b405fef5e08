// `kvpack analyze-prefix`: what breaks prefix reuse in a request log, per cause, with the hit rate each
// cause costs (src/analyze/analyzer.h), and a generator of test traffic with planted causes and its
// ground truth (src/analyze/traffic_gen.h).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <stdexcept>

#include "analyze/analyzer.h"
#include "analyze/traffic_gen.h"
#include "commands.h"
#include "gguf/gguf.h"

namespace kvpack::cli {
namespace {

namespace an = kvpack::analyze;

struct Opts {
  std::string log, model, tokenizer, chat_format = "auto", plant = "all", output;
  int32_t page_size = 16, generate = 0;
  int64_t cache_tokens = 0, max_line_bytes = int64_t{64} << 20;
  uint64_t seed = 1;
  bool json = false, ground_truth = false;
};

bool is_gguf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

struct Vocab {
  std::unique_ptr<Tokenizer> tok;
  server::ChatFormat format = server::ChatFormat::Plain;
};

// Only the vocabulary and the chat template are needed: no weights are loaded.
Vocab load_vocab(const Opts& o) {
  Vocab v;
  std::string chat_template;
  if (!o.tokenizer.empty() && (o.model.empty() || !is_gguf(o.model))) {
    v.tok = std::make_unique<Tokenizer>(Tokenizer::from_llama2c(o.tokenizer, 0));  // llama2.c: plain chat format
  } else {
    if (!o.tokenizer.empty()) throw std::runtime_error("--tokenizer is only for llama2.c checkpoints; GGUF files carry their vocab");
    const std::string path = o.model.empty() ? default_model_path() : o.model;
    if (!is_gguf(path)) throw std::runtime_error(path + " is not a GGUF file (a llama2.c checkpoint needs --tokenizer FILE)");
    const auto file = gguf::File::open(path);
    v.tok = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*file));
    chat_template = file->get_string("tokenizer.chat_template").value_or("");
  }
  v.format = server::detect_chat_format(chat_template);
  if (o.chat_format == "plain") v.format = server::ChatFormat::Plain;
  else if (o.chat_format == "chatml") v.format = server::ChatFormat::ChatML;
  else if (o.chat_format == "llama3") v.format = server::ChatFormat::Llama3;
  else if (o.chat_format == "gemma") v.format = server::ChatFormat::Gemma;
  return v;
}

an::SimOptions sim_options(const Opts& o) { return {o.page_size, o.cache_tokens}; }

void print_truth_comparison(const an::GroundTruth& g, const an::Report& est, bool json) {
  if (json) {
    an::ordered_json j;
    j["ground_truth"] = {{"hit_rate", g.hit_rate}, {"hit_rate_clean", g.hit_rate_clean}};
    an::ordered_json rows = an::ordered_json::array();
    for (size_t i = 0; i < g.rows.size(); ++i) {
      const auto& t = g.rows[i];
      const auto& e = est.causes[i];
      rows.push_back({{"cause", an::cause_name(t.cause)}, {"planted", t.planted}, {"true_tokens_lost", t.tokens_lost},
                      {"true_points_lost", t.points_lost()}, {"estimated_tokens_lost", e.tokens_lost},
                      {"estimated_points_lost", e.points_lost()}, {"requests_affected", e.requests_affected}});
    }
    j["ground_truth"]["causes"] = std::move(rows);
    j["analyzer"] = an::report_json(est);
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return;
  }
  std::printf("Ground truth: the same traffic generated again without each cause (in the analyzer's order), the same cache\n"
              "simulation, no normaliser. Hit rate as planted %.1f %% (analyzer: %.1f %%), with nothing planted %.1f %%.\n\n",
              100 * g.hit_rate, 100 * est.hit_rate, 100 * g.hit_rate_clean);
  std::printf("| cause      | planted | requests flagged | true tokens lost | estimated | true points lost | estimated | error (points) | relative error |\n");
  std::printf("|------------|---------|-----------------:|-----------------:|----------:|-----------------:|----------:|---------------:|---------------:|\n");
  for (size_t i = 0; i < g.rows.size(); ++i) {
    const auto& t = g.rows[i];
    const auto& e = est.causes[i];
    const double err = e.points_lost() - t.points_lost();
    char rel[32] = "-";
    if (std::fabs(t.points_lost()) > 1e-9) std::snprintf(rel, sizeof rel, "%+.1f %%", 100.0 * err / t.points_lost());
    std::printf("| %-10s | %-7s | %16lld | %16lld | %9lld | %16.2f | %9.2f | %+14.2f | %14s |\n", an::cause_name(t.cause),
                t.planted ? "yes" : "no", static_cast<long long>(e.requests_affected), static_cast<long long>(t.tokens_lost),
                static_cast<long long>(e.tokens_lost), t.points_lost(), e.points_lost(), err, rel);
  }
}

void run(const Opts& o) {
  if (o.generate > 0) {
    if (!o.log.empty()) throw std::runtime_error("give a LOG to analyze or --generate N, not both");
    if (o.output.empty()) throw std::runtime_error("--generate needs -o FILE");
    an::TrafficSpec spec;
    spec.requests = o.generate;
    spec.seed = o.seed;
    spec.planted = an::parse_cause_list(o.plant);
    const an::Log log = an::generate_traffic(spec);
    {
      std::ofstream out(o.output, std::ios::binary);
      if (!out) throw std::runtime_error("cannot write " + o.output);
      for (const auto& r : log) out << an::to_log_line(r) << '\n';
      if (!out.flush()) throw std::runtime_error("cannot write " + o.output);
    }
    std::fprintf(stderr, "[kvpack] wrote %zu requests to %s (planted: %s)\n", log.size(), o.output.c_str(), o.plant.c_str());
    if (!o.ground_truth) return;
    Vocab v = load_vocab(o);
    an::PromptRenderer renderer(*v.tok, v.format);
    const an::GroundTruth g = an::ground_truth(spec, renderer, sim_options(o));
    // Analyze the file as written (a round trip through the reader), like any other log.
    const an::Report est = an::analyze_prefix_reuse(an::read_request_log_file(o.output), renderer, {sim_options(o)});
    print_truth_comparison(g, est, o.json);
    return;
  }
  if (o.log.empty()) throw std::runtime_error("give a request log (JSON lines) to analyze, or --generate N");
  if (o.ground_truth) throw std::runtime_error("--ground-truth goes with --generate");
  an::ReadOptions ro;
  ro.max_line_bytes = static_cast<size_t>(o.max_line_bytes);
  an::Log log = an::read_request_log_file(o.log, ro);
  if (log.empty()) throw std::runtime_error(o.log + " has no requests");
  an::AnalyzeOptions ao;
  ao.sim = sim_options(o);
  // The server logs a request when it ends; its cache saw them as they arrived.
  if (an::order_by_arrival(log)) ao.order = "arrival order (ts - e2e_s, or timestamp)";
  Vocab v = load_vocab(o);
  an::PromptRenderer renderer(*v.tok, v.format);
  const an::Report rep = an::analyze_prefix_reuse(log, renderer, ao);
  if (o.json) std::printf("%s\n", an::report_json(rep).dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  else std::printf("%s", an::format_report_text(rep).c_str());
}

}  // namespace

void add_analyze_prefix(CLI::App& app) {
  auto* cmd = app.add_subcommand("analyze-prefix",
                                 "What breaks prefix-cache reuse in a request log (JSON lines of OpenAI requests), per cause, "
                                 "with the hit rate each costs and the fix");
  auto o = std::make_shared<Opts>();
  cmd->add_option("log", o->log, "Request log: one OpenAI request body per line, or `kvpack serve --request-log` lines with \"request\"")
      ->check(CLI::ExistingFile);
  cmd->add_option("-m,--model", o->model, "Model whose tokenizer and chat template render the prompts (GGUF; default: the embedded model)");
  cmd->add_option("--tokenizer", o->tokenizer, "llama2.c tokenizer file (plain chat format) instead of a GGUF")->check(CLI::ExistingFile);
  cmd->add_option("--chat-format", o->chat_format, "Chat format: auto (from the model's template), plain, chatml, llama3, gemma")
      ->check(CLI::IsMember({"auto", "plain", "chatml", "llama3", "gemma"}))
      ->capture_default_str();
  cmd->add_option("--page-size", o->page_size, "Prefix-cache block size in tokens (the engine's --page-size)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--cache-tokens", o->cache_tokens, "Prefix-cache capacity in tokens, least recently used out first (0: unbounded)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Report as JSON");
  cmd->add_option("--max-line-bytes", o->max_line_bytes, "Longest log line accepted")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 32))
      ->capture_default_str();
  cmd->add_option("--generate", o->generate, "Write N requests of test traffic (chat, agent and RAG sessions) to -o instead")
      ->check(CLI::Range(1, 1000000));
  cmd->add_option("--plant", o->plant, "With --generate: causes to plant, all, none or a list of volatile,tools,whitespace,truncation,documents")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "With --generate: seed")->capture_default_str();
  cmd->add_option("-o,--output", o->output, "With --generate: the log file to write");
  cmd->add_flag("--ground-truth", o->ground_truth,
                "With --generate: measure each cause's true lost hit rate (traffic regenerated without it) and compare the "
                "analyzer's estimates on the written log");
  cmd->callback([o] { run(*o); });
}

}  // namespace kvpack::cli
