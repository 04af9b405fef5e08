// `kvpack generate`: stream generated text to stdout; statistics go to stderr. With -cnv, an interactive
// chat (llama-cli's conversation mode): lines from stdin are user turns, rendered with the model's chat
// template (server/chat_template.h) and answered in turn.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <utility>

#include "commands.h"
#include "engine/engine.h"
#include "model/model.h"
#include "options.h"
#include "server/chat_template.h"

namespace kvpack::cli {
namespace {

struct ChatOptions {
  bool conversation = false;
  std::string system;
};

// The chat loop: every turn re-renders the whole conversation (the template decides the markers) and
// generates the reply; the oldest turns are dropped when the conversation outgrows the context.
void run_conversation(const Model& model, Engine& engine, const Request& base, const ChatOptions& co, bool quiet) {
  const Tokenizer& tok = model.tokenizer();
  const server::ChatFormat fmt = server::detect_chat_format(model.chat_template());
  const int32_t n_ctx = model.config().n_ctx;
  std::vector<server::ChatMessage> msgs;
  if (!co.system.empty()) msgs.push_back({"system", co.system});
  const bool tty_in = isatty(STDIN_FILENO) != 0;
  if (!quiet)
    std::fprintf(stderr, "[kvpack] conversation (chat format %s): type a message and press Enter; Ctrl-D or /exit ends it\n",
                 server::chat_format_name(fmt));
  std::string line;
  for (;;) {
    std::fputs("\n> ", stdout);
    std::fflush(stdout);
    if (!std::getline(std::cin, line)) break;
    if (!tty_in) std::printf("%s\n", line.c_str());  // piped input: show the turn, as a terminal would
    if (line == "/exit" || line == "/quit") break;
    if (line.empty()) continue;
    msgs.push_back({"user", line});
    Request req = base;
    for (;;) {
      req.prompt = server::render_chat_tokens(fmt, msgs, tok);
      const size_t first_turn = !msgs.empty() && msgs[0].role == "system" ? 1 : 0;
      if (static_cast<int64_t>(req.prompt.size()) + req.max_tokens < n_ctx || msgs.size() <= first_turn + 1) break;
      msgs.erase(msgs.begin() + static_cast<long>(first_turn));  // the oldest turn goes
      if (!quiet) std::fprintf(stderr, "[kvpack] the conversation outgrew the context (%d): the oldest turn was dropped\n", n_ctx);
    }
    if (static_cast<int64_t>(req.prompt.size()) >= n_ctx) {
      std::fprintf(stderr, "[kvpack] that message alone is %zu tokens, beyond the context (%d); say less\n", req.prompt.size(), n_ctx);
      msgs.pop_back();
      continue;
    }
    req.stop = base.stop;
    for (auto& st : server::chat_default_stops(fmt)) req.stop.push_back(st);
    req.sampling.seed = base.sampling.seed + msgs.size();  // a different draw each turn, reproducible with -s
    const GenerateResult r = engine.generate(req, [](std::string_view s) {
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
      return true;
    });
    std::fputc('\n', stdout);
    msgs.push_back({"assistant", r.text});
  }
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

}  // namespace

void add_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Generate text from a prompt (or chat with -cnv)");
  auto o = std::make_shared<ModelOptions>();
  auto prompt = std::make_shared<std::string>();
  auto prompt_file = std::make_shared<std::string>();
  auto n = std::make_shared<int32_t>(128);
  auto sp = std::make_shared<SamplingParams>();
  auto stop = std::make_shared<std::vector<std::string>>();
  auto ignore_eos = std::make_shared<bool>(false);
  auto co = std::make_shared<ChatOptions>();
  add_model_options(*cmd, *o);
  auto kvo = std::make_shared<KvOptions>();
  add_kv_options(*cmd, *kvo);
  auto* p_opt = cmd->add_option("-p,--prompt", *prompt, "Prompt text (default: none, generation starts from BOS; with -cnv: the system prompt)");
  cmd->add_option("-f,--file", *prompt_file, "Read the prompt from a file")->excludes(p_opt)->check(CLI::ExistingFile);
  cmd->add_option("-n,--n-predict", *n, "Tokens to generate (per reply with -cnv)")->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--temp", sp->temperature, "Temperature (0 = greedy)")->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-k", sp->top_k, "Top-k (0 = off)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", sp->top_p, "Top-p (1 = off)")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--min-p", sp->min_p, "Min-p (0 = off)")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--repeat-penalty", sp->repeat_penalty, "Repetition penalty (1 = off)")->check(CLI::Range(0.0, 10.0));
  cmd->add_option("--repeat-last-n", sp->repeat_last_n, "Tokens the penalty looks back over");
  auto* seed_opt = cmd->add_option("-s,--seed", sp->seed, "Sampling seed (default: random, printed on stderr so a run can be repeated)")
                       ->default_str("random");
  cmd->add_option("--stop", *stop, "Stop string (repeatable)");
  cmd->add_flag("--ignore-eos", *ignore_eos, "Keep generating past end-of-sequence tokens");
  cmd->add_flag("--conversation", co->conversation,
                "Interactive chat (llama.cpp's -cnv): stdin lines are user turns, rendered with the model's chat template");
  cmd->add_option("--system-prompt", co->system, "System prompt for -cnv (llama.cpp's -sys)");
  cmd->callback([=] {
    const bool random_seed = seed_opt->count() == 0;
    if (random_seed) sp->seed = std::random_device{}() | (static_cast<uint64_t>(std::random_device{}()) << 32);
    // Announced once the request is known to be valid (an error stays one clear line).
    auto announce_seed = [&] {
      if (random_seed && !o->quiet && sp->temperature > 0)
        std::fprintf(stderr, "[kvpack] seed %llu (random; -s %llu repeats this run)\n", static_cast<unsigned long long>(sp->seed),
                     static_cast<unsigned long long>(sp->seed));
    };
    auto model = load_model(*o);
    const Tokenizer& tok = model->tokenizer();
    std::string text = *prompt;
    if (!prompt_file->empty()) {
      std::optional<std::string> file_text = read_file(*prompt_file);
      if (!file_text) throw std::runtime_error("cannot read prompt file " + *prompt_file);
      text = std::move(*file_text);
    }
    Request req;
    req.max_tokens = *n;
    req.sampling = *sp;
    req.stop = *stop;
    req.ignore_eos = *ignore_eos;
    Engine engine(*model, engine_options(*o, *kvo));
    req.kv = kv_config(*kvo, engine);
    if (co->conversation) {
      ChatOptions c = *co;
      if (c.system.empty()) c.system = text;  // llama-cli: -p is the system prompt in conversation mode
      announce_seed();
      run_conversation(*model, engine, req, c, o->quiet);
      return;
    }
    if (!co->system.empty()) throw std::runtime_error("--system-prompt (-sys) is for conversations: add -cnv");
    req.prompt = tok.encode(text, tok.bos() >= 0);
    if (req.prompt.empty()) throw std::runtime_error("this model has no BOS token: give a prompt with -p or -f");
    if (static_cast<int64_t>(req.prompt.size()) > model->config().n_ctx)
      throw std::invalid_argument("prompt has " + std::to_string(req.prompt.size()) + " tokens; the context is " +
                                  std::to_string(model->config().n_ctx));
    announce_seed();
    if (!text.empty()) {
      std::fwrite(text.data(), 1, text.size(), stdout);
    }
    const GenerateResult r = engine.generate(req, [](std::string_view s) {
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
      return true;
    });
    std::fputc('\n', stdout);
    std::fflush(stdout);
    print_generate_stats(r, engine, req.kv);
  });
}

}  // namespace kvpack::cli
