// `kvpack generate`: stream generated text to stdout; statistics go to stderr.
#include <cstdio>
#include <memory>
#include <optional>
#include <stdexcept>
#include <utility>

#include "commands.h"
#include "engine/engine.h"
#include "model/model.h"
#include "options.h"

namespace kvpack::cli {

void add_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Generate text from a prompt");
  auto o = std::make_shared<ModelOptions>();
  auto prompt = std::make_shared<std::string>();
  auto prompt_file = std::make_shared<std::string>();
  auto n = std::make_shared<int32_t>(128);
  auto sp = std::make_shared<SamplingParams>();
  auto stop = std::make_shared<std::vector<std::string>>();
  auto ignore_eos = std::make_shared<bool>(false);
  add_model_options(*cmd, *o);
  auto kvo = std::make_shared<KvOptions>();
  add_kv_options(*cmd, *kvo);
  auto* p_opt = cmd->add_option("-p,--prompt", *prompt, "Prompt text (default: none, generation starts from BOS)");
  cmd->add_option("-f,--file", *prompt_file, "Read the prompt from a file")->excludes(p_opt)->check(CLI::ExistingFile);
  cmd->add_option("-n,--n-predict", *n, "Tokens to generate")->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--temp", sp->temperature, "Temperature (0 = greedy)")->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-k", sp->top_k, "Top-k (0 = off)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", sp->top_p, "Top-p (1 = off)")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--min-p", sp->min_p, "Min-p (0 = off)")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--repeat-penalty", sp->repeat_penalty, "Repetition penalty (1 = off)")->check(CLI::Range(0.0, 10.0));
  cmd->add_option("--repeat-last-n", sp->repeat_last_n, "Tokens the penalty looks back over");
  cmd->add_option("--seed", sp->seed, "Sampling seed");
  cmd->add_option("--stop", *stop, "Stop string (repeatable)");
  cmd->add_flag("--ignore-eos", *ignore_eos, "Keep generating past end-of-sequence tokens");
  cmd->callback([=] {
    auto model = load_model(*o);
    const Tokenizer& tok = model->tokenizer();
    std::string text = *prompt;
    if (!prompt_file->empty()) {
      std::optional<std::string> file_text = read_file(*prompt_file);
      if (!file_text) throw std::runtime_error("cannot read prompt file " + *prompt_file);
      text = std::move(*file_text);
    }
    Request req;
    req.prompt = tok.encode(text, tok.bos() >= 0);
    if (req.prompt.empty()) throw std::runtime_error("this model has no BOS token: give a prompt with -p or -f");
    req.max_tokens = *n;
    req.sampling = *sp;
    req.stop = *stop;
    req.ignore_eos = *ignore_eos;
    Engine engine(*model, engine_options(*o));
    req.kv = kv_config(*kvo, engine);
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
